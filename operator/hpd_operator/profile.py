"""The hybrid P/D profile: a validated CR -> per-role env and `vllm serve` args, each setting with its reason (pure).

    profile = compute_profile(validate(cr))          # hpd_operator.validation: every check runs there, once
    profile.prefill.args / .env / .injections        # builders put these into the Deployments
    profile.status()                                 # -> status.profile

The profile only renders: what vLLM needs for hybrid P/D over NIXL on spec.vllmVersion (the rules of
hpd_operator.versions), the runtime contract's env (every `HPD_*` entry) and the user's own env and extraArgs.
status.profile.injections lists what the operator set and why, status.profile.rules the version rules that
applied, status.profile.warnings what validation accepted with a warning.

Side-channel host: every role gets `HPD_POD_IP` from the downward API (`status.podIP`) FIRST, then
`VLLM_NIXL_SIDE_CHANNEL_HOST=$(HPD_POD_IP)` (Kubernetes expands `$(VAR)` from earlier entries). One downward-API
entry serves both vLLM and the runtime. Keep the env order when building the container.
"""

from __future__ import annotations

import json
from typing import Final

from hpd_operator.api import constants as c
from hpd_operator.api.models import VersionRuleStatus, WarmupSpec
from hpd_operator.api.names import kv_reporter_name, role_name
from hpd_operator.api.paircheck import PairCheck, pair_check
from hpd_operator.api.processns import PAIR_REASON, engine_ports, pairs, profile_reason, shares_host_pid
from hpd_operator.modelinfo import disk_plan
from hpd_operator.profile_launch import drain_env, parallel_args, shutdown_args, worker_args
from hpd_operator.profile_model import EnvEntry, Profile, RoleProfile, RoleWriter
from hpd_operator.validation import Validated
from hpd_runtime import contract

KV_CONNECTOR: Final = "NixlConnector"
KV_ROLES: Final[dict[contract.Role, str]] = {"prefill": "kv_producer", "decode": "kv_consumer"}


# ---------------------------------------------------------------------------------------------------------------
# compute_profile
# ---------------------------------------------------------------------------------------------------------------


def _role_profile(valid: Validated, role: contract.Role) -> RoleProfile:
    """Each section writes its settings with their reasons; the sections run in the order status.profile lists
    the injections and land in env/args in the order the container gets them (HPD_POD_IP first)."""
    s, rs = RoleWriter(), valid.spec.role(role)
    side_channel = _side_channel_env(s, valid, role) + _host_ip_env(s, valid, role)
    layout = _layout_env(s, valid)
    gemm = _gemm_env(s, valid.spec.warmup)
    args = (
        _core_args(s, valid, role) + shutdown_args(s, valid) + _kv_args(s, valid, role) + _hybrid_args(s, valid, role)
    )
    args += _pair_check_args(s, valid, role) + _user_args(valid, role)
    chunk = _chunk_env(s, valid)
    fabric = _fabric_env(s, valid, role)
    devices, caps = _fabric_pod(s, valid)
    host_pid = _process_namespace_pod(s, valid)
    _disk_pod(s, valid)
    _image_pod(s, valid)
    env = side_channel + layout + _ucx_env(s, valid) + fabric + _runtime_env(s, valid, role) + chunk
    env += _warmup_env(s, valid, role) + drain_env(s, valid) + gemm + _user_env(valid) + _pod_env(s, valid, role)
    workers = worker_args(s, valid, role)
    return RoleProfile(
        role=role,
        tensor_parallel_size=rs.tensor_parallel_size,
        replicas=rs.replicas,
        env=tuple(env),
        args=tuple(args),
        injections=tuple(s.injections),
        devices=devices,
        capabilities=caps,
        host_pid=host_pid,
        nodes=rs.nodes_per_replica,
        gpus_per_pod=rs.gpus_per_pod,
        worker_args=workers,
    )


# --- env ----------------------------------------------------------------------------------------------------------
def _side_channel_env(s: RoleWriter, valid: Validated, role: contract.Role) -> list[EnvEntry]:
    kv, row = valid.spec.kv_transfer, valid.row
    port = str(engine_ports(kv, role).side_channel)
    port_reason = "NIXL side-channel base port from spec.kvTransfer"
    if pairs(kv) and role == "decode":
        port_reason += f" + {contract.PAIR_DECODE_SIDE_CHANNEL_OFFSET}: in a pair pod prefill listens on the base at the same pod IP"
    host_reason = "NIXL side channel binds and advertises this address: the pod IP (not 0.0.0.0, not localhost)"
    if row.side_channel_host_in_compile_key:
        host_reason += (
            f"; vLLM {row.minor} hashes it into the compile-cache key, so a new pod IP recompiles "
            f"[{row.cite('side-channel-host-in-compile-key')}]"
        )
    return [
        s.field(contract.ENV_POD_IP, "status.podIP", "the pod's IP, for the env entries that reference it"),
        s.env(contract.ENV_VLLM_NIXL_SIDE_CHANNEL_HOST, f"$({contract.ENV_POD_IP})", host_reason, shown="status.podIP"),
        s.env(contract.ENV_VLLM_NIXL_SIDE_CHANNEL_PORT, port, port_reason),
    ]


def _host_ip_env(s: RoleWriter, valid: Validated, role: contract.Role) -> list[EnvEntry]:
    """A replica that spans nodes: the address vLLM's ranks advertise to each other is the pod IP, unless spec.env
    names another (a second network for the ranks' traffic)."""
    if not valid.spec.role(role).multi_node or any(e.name == contract.ENV_VLLM_HOST_IP for e in valid.spec.env):
        return []
    why = (
        "the address vLLM's processes advertise to the ranks on other nodes (the leader's message queue, "
        "v1/executor/multiproc_executor.py mq_connect_ip = get_ip()): the pod IP, not a guess from the default route"
    )
    return [s.env(contract.ENV_VLLM_HOST_IP, f"$({contract.ENV_POD_IP})", why, shown="status.podIP")]


def _layout_env(s: RoleWriter, valid: Validated) -> list[EnvEntry]:
    if not valid.model.hybrid:
        return []
    why = f"NIXL asserts the DS conv-state layout for Mamba models [{valid.row.cite('ds-conv-state-layout')}]"
    return [s.env(contract.ENV_VLLM_SSM_CONV_STATE_LAYOUT, "DS", why)]


def _ucx_env(s: RoleWriter, valid: Validated) -> list[EnvEntry]:
    ucx = valid.spec.kv_transfer.ucx
    if ucx is None:
        return []
    pairs = (("UCX_TLS", ucx.tls, "tls"), ("UCX_NET_DEVICES", ucx.net_devices, "netDevices"))
    return [
        s.env(n, v, f"spec.kvTransfer.ucx.{f}: the transports and devices UCX moves KV over") for n, v, f in pairs if v
    ]


def _fabric_env(s: RoleWriter, valid: Validated, role: contract.Role) -> list[EnvEntry]:
    """The KV path: UCX's GET zero-copy over CUDA IPC, and what decode's runtime reports the measured rate against."""
    kv = valid.spec.kv_transfer
    env = [
        s.env(contract.ENV_KV_FABRIC, kv.fabric, "spec.kvTransfer.fabric: the path the measured KV rate is named for")
    ]
    if not any(e.name == c.UCX_GET_ZCOPY_ENV for e in valid.spec.env):  # spec.env may say otherwise
        why = (
            "decode READs the KV; UCX offers CUDA IPC no GET zero-copy without NVLink that NVML reports and emulated "
            "the reads over TCP (0.5 GB/s on an H200; with this, 21.8 GB/s: docs/kv-path.md); used where P and D "
            "share a host and PID namespace, harmless elsewhere"
        )
        env.insert(0, s.env(c.UCX_GET_ZCOPY_ENV, "y", why))
    floor = kv.floor_gbps if kv.floor_gbps is not None else c.FABRIC_FLOOR_GBPS[kv.fabric]
    if role == "decode" and floor > 0:
        why = f"decode reports its measured KV rate against {floor:g} GB/s (spec.kvTransfer.floorGbps or the fabric's)"
        env.append(s.env(contract.ENV_KV_FLOOR_BYTES_PER_SECOND, str(round(floor * 1e9)), why))
    return env


def _fabric_pod(s: RoleWriter, valid: Validated) -> tuple[tuple[tuple[str, int], ...], tuple[str, ...]]:
    """Devices and capabilities of the declared fabric (rdma: the device plugin's resource, IPC_LOCK)."""
    rdma = valid.spec.kv_transfer.rdma
    if valid.spec.kv_transfer.fabric != "rdma" or rdma is None:
        return (), ()
    s.pod(
        f"resources.limits[{rdma.resource_name}]",
        str(rdma.count),
        "spec.kvTransfer.fabric rdma: the NICs KV moves over",
    )
    s.pod(
        "securityContext.capabilities.add",
        c.RDMA_CAPABILITY,
        "UCX pins GPU and host memory for the NIC; with it the pod is outside Pod Security baseline and restricted "
        "(the namespace must allow privileged pods)",
    )
    return ((rdma.resource_name, rdma.count),), (c.RDMA_CAPABILITY,)


def _process_namespace_pod(s: RoleWriter, valid: Validated) -> bool:
    """spec.kvTransfer.processNamespace Host: the node's PID namespace (hostPID), recorded with its security trade;
    Pair: the pair pod's own shared PID namespace (shareProcessNamespace, builders.pair), recorded with its reason;
    the default (each pod its own) is written by the builders and not listed."""
    if pairs(valid.spec.kv_transfer):
        s.pod("shareProcessNamespace", "true", PAIR_REASON)
        return False
    if not shares_host_pid(valid.spec.kv_transfer):
        return False
    s.pod("hostPID", "true", profile_reason())
    return True


def _disk_pod(s: RoleWriter, valid: Validated) -> None:
    """Where the weights go and the node disk the pod may use (modelinfo.disk_plan; the builders write it)."""
    disk, src = disk_plan(valid.spec), valid.spec.model.source
    from_pvc = src is not None and src.pvc is not None
    s.pod(
        "weights", valid.model.path if from_pvc else f"{contract.CACHE_MOUNT}/{contract.HF_HOME_SUBDIR}", disk.weights
    )
    if disk.cache_size_limit is not None:
        s.pod("volumes[cache].emptyDir.sizeLimit", disk.cache_size_limit, disk.reason)
    s.pod("resources.requests[ephemeral-storage]", disk.ephemeral_storage,
          "the emptyDirs on the node's disk (cache, /tmp, HOME): the scheduler picks a node with room for them")  # fmt: skip


def _image_pod(s: RoleWriter, valid: Validated) -> None:
    """Whether the engine and router images are pinned by digest: a tag can move under a running CR, so the next pod
    (a reschedule, a new replica) may run other code than its peers. Unpinned is allowed, and named here."""
    spec = valid.spec
    for setting, image in (("image", spec.image), ("router.image", spec.router.image)):
        if image is None:
            continue
        pinned = "@sha256:" in image
        s.pod(setting, image, "pinned by digest" if pinned else (
            "NOT pinned by digest: a tag can move, so a new pod may run other code than its peers; pin it with "
            "`<image>@sha256:...` (spec or the chart's images.*)"))  # fmt: skip


def _runtime_env(s: RoleWriter, valid: Validated, role: contract.Role) -> list[EnvEntry]:
    """What the runtime (hpd_runtime.config) reads to launch vLLM and serve its probes."""
    spec, launch = valid.spec, "the runtime launches vLLM with it"
    ports = engine_ports(spec.kv_transfer, role)
    env = [
        s.env(contract.ENV_ROLE, role, "the runtime's role: which warmup runs and which KV role vLLM takes"),
        s.env(contract.ENV_MODEL, valid.model.path, "the model the runtime warms up and checks (--model)"),
        s.env(contract.ENV_VLLM_VERSION, spec.vllm_version, "spec.vllmVersion: the runtime's version rules"),
        s.env(contract.ENV_TENSOR_PARALLEL_SIZE, str(spec.role(role).tensor_parallel_size),
              f"spec.{role}.tensorParallelSize: {launch}"),
        s.env(contract.ENV_VLLM_PORT, str(ports.vllm), f"vLLM's API port: {launch}, the probes ask it"),
        s.env(contract.ENV_RUNTIME_PORT, str(ports.runtime), "the runtime's /readyz, /livez and /metrics"),
    ]  # fmt: skip
    if spec.model.max_model_len is not None:
        why = "spec.model.maxModelLen: the longest warmup prompt fits it"
        env.append(s.env(contract.ENV_MAX_MODEL_LEN, str(spec.model.max_model_len), why))
    return env


def _chunk_env(s: RoleWriter, valid: Validated) -> list[EnvEntry]:
    chunk, row = valid.model.ssd_chunk_size, valid.row
    if chunk is None:
        return []
    if row.ssd_warmup_builtin:
        version = f" (vLLM {row.minor} autotunes seqlen = chunk_size only [{row.cite('builtin-ssd-warmup')}])"
    else:
        version = f" (vLLM {row.minor} does not autotune SSD kernels at startup [{row.cite('no-builtin-ssd-warmup')}])"
    why = "warmup covers prompts shorter and longer than the SSD chunk" + version
    return [s.env(contract.ENV_SSD_CHUNK_SIZE, str(chunk), why)]


def _warmup_env(s: RoleWriter, valid: Validated, role: contract.Role) -> list[EnvEntry]:
    w, check = valid.spec.warmup, pair_check(valid.spec.warmup)
    env = [
        s.env(contract.ENV_WARMUP_ENABLED, str(w.enabled).lower(),
              "spec.warmup.enabled: the pod turns Ready only after its kernels are warm"),
        s.env(contract.ENV_WARMUP_PROMPT_LENGTHS, ",".join(map(str, w.prompt_lengths)),
              "spec.warmup.promptLengths (empty: derived from the SSD chunk size and max model len)"),
        s.env(contract.ENV_WARMUP_CONCURRENCY, str(w.concurrency), "spec.warmup.concurrency"),
        s.env(contract.ENV_WARMUP_TIMEOUT_SECONDS, str(w.timeout_seconds), "spec.warmup.timeoutSeconds"),
        s.env(contract.ENV_WARMUP_PAIR_CHECK, str(check.runs_on(role)).lower(), _pair_check_reason(check, role)),
    ]  # fmt: skip
    if role == "decode":
        why = "spec.warmup.canarySeconds: " + check.canary + ("" if check.on else " (no pair check to re-prove)")
        env.append(s.env(contract.ENV_CANARY_SECONDS, str(check.canary_seconds), why))
    if check.reports_kv_path(role):  # the pod the KV path report is about, and where it goes (hpd_runtime)
        about = "the pod the KV path report is about"
        env += [
            s.field(contract.ENV_POD_NAME, "metadata.name", about),
            s.field(contract.ENV_POD_NAMESPACE, "metadata.namespace", about),
            s.field(contract.ENV_POD_UID, "metadata.uid", about + " (its Lease annotation's key)"),
            s.env(contract.ENV_KV_REPORT_LEASE, kv_reporter_name(valid.cr.metadata.name),
                  "the Lease decode reports its measured KV path on (status.kvPath)"),
        ]  # fmt: skip
    return env


def _pair_check_reason(check: PairCheck, role: contract.Role) -> str:
    if check.runs_on(role):
        return "spec.warmup.pairCheck: decode turns Ready only after one real P->D round trip matches a local run"
    if role == "decode":
        return "spec.warmup.pairCheck or spec.warmup.enabled is off: P->D is not verified before traffic"
    return "only decode runs the pair check"


def _gemm_env(s: RoleWriter, warmup: WarmupSpec) -> list[EnvEntry]:
    seconds = gemm_warmup_seconds(warmup)
    if not seconds:
        return []
    return [
        s.env(
            contract.ENV_GEMM_WARMUP_TOKENS,
            "auto",
            "spec.warmup.everyLength: vLLM's worker runs each distinct GEMM at every row count up to "
            "max_num_batched_tokens before Ready (cuBLAS picks an algorithm per row count on first use: "
            "+4 to +11 ms on the first request of each new prompt length otherwise)",
        ),
        s.env(
            contract.ENV_GEMM_WARMUP_SECONDS,
            str(seconds),
            f"the sweep's bound: spec.warmup.timeoutSeconds, at most {contract.GEMM_WARMUP_SECONDS_DEFAULT}",
        ),
    ]


def _user_env(valid: Validated) -> list[EnvEntry]:
    return [RoleWriter.user_env(e.name, e.value, e.value_from) for e in valid.spec.env]


def _pod_env(s: RoleWriter, valid: Validated, role: contract.Role) -> list[EnvEntry]:
    """Where the pod belongs: its CR, its cache mount and (decode) the prefill Service the pair check asks."""
    name, ns = valid.cr.metadata.name, valid.cr.metadata.namespace
    env = [
        s.env(contract.ENV_INSTANCE, name, "the CR the pod belongs to"),
        s.env(contract.ENV_CACHE_DIR, contract.CACHE_MOUNT, "the compile and Triton caches, kept across restarts"),
    ]
    if role == "decode" and pairs(valid.spec.kv_transfer):
        why = "the pair pod's own prefill (one PID namespace: cuda_ipc): the only prefill the pair check and canary ask"
        env.append(s.env(contract.ENV_PREFILL_SERVICE, contract.PAIR_LOOPBACK, why))
    elif role == "decode":
        service = role_name(name, "prefill") + (f".{ns}.svc" if ns else "")
        env.append(s.env(contract.ENV_PREFILL_SERVICE, service, "the prefill pods the pair check and canary ask"))
    return env


# --- args ---------------------------------------------------------------------------------------------------------
def _core_args(s: RoleWriter, valid: Validated, role: contract.Role) -> list[str]:
    spec, rs = valid.spec, valid.spec.role(role)
    port = engine_ports(spec.kv_transfer, role).vllm
    args = ["--model", valid.model.path, "--served-model-name", spec.model.name, "--port", str(port)]
    args += ["--tensor-parallel-size", str(rs.tensor_parallel_size)]
    args += parallel_args(s, valid, role)
    if spec.block_size is not None:
        args += s.flag(
            "--block-size",
            str(spec.block_size),
            "spec.blockSize, the same on prefill and decode (NIXL compares it); vLLM raises it if the Mamba page "
            "needs more",
        )
    if spec.model.max_model_len is not None:
        args += ["--max-model-len", str(spec.model.max_model_len)]
    args += ["--dtype", spec.model.dtype]
    gmu = rs.gpu_memory_utilization if rs.gpu_memory_utilization is not None else spec.gpu_memory_utilization
    if gmu is not None:
        args += ["--gpu-memory-utilization", _num(gmu)]
    return args


def _kv_args(s: RoleWriter, valid: Validated, role: contract.Role) -> list[str]:
    row, policy = valid.row, valid.spec.kv_transfer.load_failure_policy
    kv: dict[str, str] = {"kv_connector": KV_CONNECTOR, "kv_role": KV_ROLES[role]}
    if policy != "fail":
        kv["kv_load_failure_policy"] = policy
    why = f"NIXL P/D: {role} is {KV_ROLES[role]} (never kv_both"
    why += f", deprecated in vLLM {row.minor} [{row.cite('kv-both-deprecated')}])" if row.kv_both_deprecated else ")"
    return s.flag("--kv-transfer-config", json.dumps(kv, separators=(",", ":")), why)


def _hybrid_args(s: RoleWriter, valid: Validated, role: contract.Role) -> list[str]:
    if not valid.model.hybrid:
        return []
    row, tp = valid.row, valid.spec.role(role).tensor_parallel_size
    args = s.flag(
        "--no-enable-prefix-caching",
        why="prefix caching with hybrid P/D crashes decode on Mamba state (SSM can only have one local block); "
        "vLLM may turn it on for hybrid models by itself (0.20: NemotronH mamba_cache_mode='all'; 0.33: on)",
    )
    if row.needs_no_disable_hybrid_kv_cache_manager:
        args += s.flag(
            "--no-disable-hybrid-kv-cache-manager",
            why=f"vLLM {row.minor} turns the hybrid KV cache manager off when --kv-transfer-config is set; "
            f"NIXL with Mamba requires it [{row.cite('hybrid-kv-cache-manager-flag')}]",
        )
    if row.needs_no_async_scheduling and (role == "decode" or tp > 1):
        where = "decode" if role == "decode" else f"prefill at TP {tp}"
        args += s.flag(
            "--no-async-scheduling",
            why=f"vLLM {row.minor} on {where}: async scheduling races RDMA-loaded Mamba/KV state "
            f"[{row.cite('no-async-scheduling')}]",
        )
    return args


def _pair_check_args(s: RoleWriter, valid: Validated, role: contract.Role) -> list[str]:
    if not pair_check(valid.spec.warmup).runs_on(role):
        return []
    return s.flag(
        "--enable-prompt-tokens-details",
        why="the decode pair check proves a KV transfer happened: usage.prompt_tokens_details.cached_tokens "
        "counts the tokens loaded from prefill",
    )


def _user_args(valid: Validated, role: contract.Role) -> list[str]:
    """The Hugging Face revision, then spec.extraArgs, then the role's (validation checked them)."""
    spec, args = valid.spec, []
    hf = spec.model.source.huggingface if spec.model.source is not None else None
    if hf is not None and hf.revision:
        args += ["--revision", hf.revision]
    return args + spec.extra_args + spec.role(role).extra_args


def gemm_warmup_seconds(warmup: WarmupSpec) -> int:
    """The bound on hpd_runtime.gemm_warmup's sweep inside vLLM's startup (the startup probe allows for it too);
    0 when it does not run (spec.warmup.everyLength or spec.warmup.enabled off)."""
    if not (warmup.enabled and warmup.every_length):
        return 0
    return min(contract.GEMM_WARMUP_SECONDS_DEFAULT, warmup.timeout_seconds)


def _num(x: float) -> str:
    return f"{x:g}"


def compute_profile(valid: Validated) -> Profile:
    """Pure: the per-role env/args for a validated CR (hpd_operator.validation.validate)."""
    spec, row, info = valid.spec, valid.row, valid.model
    return Profile(
        warnings=valid.warnings,
        vllm_version=spec.vllm_version,
        row=row.minor,
        hybrid=info.hybrid,
        hybrid_reason=info.hybrid_reason,
        model=info.path,
        served_model_name=spec.model.name,
        ssd_chunk_size=info.ssd_chunk_size,
        prefill=_role_profile(valid, "prefill"),
        decode=_role_profile(valid, "decode"),
        rules=tuple(
            VersionRuleStatus(rule=r.key, versions=r.versions, upstream=r.upstream, note=r.note)
            for r in row.rules
            if r.applies(
                hybrid=info.hybrid,
                multi_node=any(spec.role(ro).multi_node for ro in contract.ROLES),
                pipeline_parallel=any(spec.role(ro).pipeline_parallel_size > 1 for ro in contract.ROLES),
            )
        ),
    )
