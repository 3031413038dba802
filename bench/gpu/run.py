"""GPU proof: real vLLM 0.20 on one H200, started from the operator's rendered Deployments, through our runtime
(launch, warmup, pair check, readiness) and vllm-router.

Command lines: `python -m hpd_operator render -f bench/gpu/sample-crs.yaml -o json > rendered.json` (on any machine
with the operator installed); this script takes each role's container `command`, `args` and `env` from that file
as they are and applies only HOST_SUBSTITUTIONS (what one host forces), listed in the result JSON. It imports
nothing from the operator and edits no module's constants; `hpd_runtime` must be importable (PYTHONPATH).

One invocation runs a plan of steps, e.g. `--plan tiny-eager:cold+shapes+restart,tiny-eager-block128:badpair`:

  cold     both roles from an empty (or the mode's) cache volume; time to /health and /readyz; the decode pair
           check's own verdict (runtime log); vllm-router in front; P->D via the router vs colocated on decode for
           8 prompts (token ids + first-token logprob delta); Triton autotune events after Ready.
  shapes   first request vs the median of 5 more at each of SHAPE_LENGTHS (never sent by the warmup; both sides of
           multiple-of-16 boundaries), P->D via the router and colocated on decode; the same at CONTROL_LENGTHS
           (lengths the warmup ladder sent: their spread is the noise floor the unseen lengths are read against).
  restart  the prefill's vLLM restarts under a running decode (SIGTERM to its launcher, then started again on the
           same cache, as the kubelet would): P->D answers through the router before, during and after, each
           checked against decode's colocated answer; decode /readyz timeline; decode exits (restarted like the
           kubelet does); NIXL errors in the decode log.
  badpair  (for a known-bad CR) decode must never turn Ready: /readyz polled for HOLD_BAD_S after its verdict, the
           reason recorded; P->D vs colocated outputs through the router for the record.
The decode side under a running prefill (issue #31; `decode_lifecycle`, one schedule for the three, in this order):
  canary          "on" phase: P->D through the router at LOAD_CONCURRENCY for LOAD_PHASE_S on the first decode, run
                  with HPD_CANARY_SECONDS=CANARY_ON_SECONDS; user latency percentiles, split by whether a request
                  overlapped one of the decode's canary round trips (its `canary` log events), and
                  hpd_runtime_canary_checks_total before/after. The "off" phase (the same load) comes last, on the
                  replacement decode, which runs with HPD_CANARY_SECONDS=0 (the CR's canarySeconds edited and rolled
                  out); without replace-decode, on the first decode restarted with 0.
  restart-decode  decode's vLLM restarted under a running prefill: SIGTERM to decode's launcher (SIGKILL after the
                  rendered terminationGracePeriodSeconds, as the kubelet), started again at once with the same argv,
                  env and cache. P->D through the router one request at a time before, while down and after, each
                  answer judged against decode's colocated answer (identical ids, or within the runtime's output
                  check: `judge`); /readyz of every pod polled; prefill's KV usage gauges before/while down/after.
  replace-decode  a new decode pod: the decode Deployment's container with HPD_POD_IP=NEW_POD_IP (so a new
                  VLLM_NIXL_SIDE_CHANNEL_HOST) and its own ports, started while the first decode still serves (after
                  that one's restart, if any); once Ready, a second router pointed at it (static URLs), the traffic
                  moved there, the old decode terminated (it departs), P->D checked after.
  Every start waits for the previous one's KV cache allocation (vLLM's memory profiler fails when another process
  frees GPU memory meanwhile, and shrinks the KV cache when one allocates). Prefill's log since the first step is
  scanned for vLLM errors and NIXL/UCX lines (`log_scan`), the decodes' logs likewise.
A plan item `CR@no-block-size:steps` runs CR's rendered argv with `--block-size N` removed from both roles (an
experiment: what vLLM does with its own sizes where the operator asks for spec.blockSize); the JSON records it.
`CR@env+NAME=VALUE:steps` sets one env entry on both roles, `CR@env-NAME:steps` removes one (e.g. the A/B of
`UCX_CUDA_IPC_ENABLE_GET_ZCOPY=y` before the profile renders it, docs/kv-path.md); the JSON records what changed.
Every role has hpd_runtime.gemm_warmup installed as the image has it (the vLLM plugin that warms every GEMM row count
before Ready; the rendered HPD_GEMM_WARMUP_TOKENS, from spec.warmup.everyLength, turns it on);
`CR@no-gemm-warmup:steps` removes that env from both roles (the A/B baseline), `CR@gemm-warmup:steps` sets it;
`gemm_warmup_log` records the plugin's lines.

Every run records vLLM's own KV transfer figures (`kv_transfer`): decode's `KV Transfer metrics` log lines
(transfer-weighted: MB and ms per transfer, descriptors, GB/s) and its `vllm:nixl_*` counters from /metrics, read
before the roles stop. bench/gpu/kv_path.py measures the same path without vLLM; docs/kv-path.md reads the two.

Model directory: `--model-dir`, else bench/gpu/<the CR's served model name> (tiny-nemotron-h, nemotron-h-8b: config
only, `--load-format dummy`). A CR served with a tokenizer (no `--skip-tokenizer-init` in its argv) gets a copy of
that directory with bench/gpu/word_tokenizer.py's files beside config.json (bench/load's prompts are text).

Lanes: `--gpus 1,0 --port-offset 1000` runs a second invocation beside the first on one host (a TP=1 role takes the
first listed GPU, TP=2 the first two; every port shifted). `--vllm-site VERSION=DIR` (repeatable) puts the vLLM
build of the CR's image tag on each role's PYTHONPATH, so one lane can run CRs of different vLLM versions.
Only loopback is used: 127.0.0.1, and 127.0.0.2 as the replacement decode's pod address.

A Pair CR (spec.kvTransfer.processNamespace Pair) renders no prefill and decode Deployments but one pair Deployment
`<cr>-pair-<gen>` whose pod holds the prefill and decode engine containers and an in-pod vllm-router container
(static 127.0.0.1 URLs). For such a CR each role is that pod's container of its name, its ports and env as rendered
(the pod's containers already have distinct ports in one network namespace; `--port-offset` shifts them), and the
router is the pod's router container, its argv as rendered but for PAIR_HOST_SUBSTITUTIONS (the result's
host_substitutions), started behind the topology's wrapper like the roles (`--topology=pair`: in the pod's PID and
IPC namespace, its own mount namespace). The script's own router is not started for it.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import math
import os
import random
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hpd_runtime import contract, paircheck
from hpd_runtime.gemm_warmup import LOG_PREFIX as GEMM_WARMUP_LINE

sys.path.insert(0, str(Path(__file__).resolve().parent))
import isolation  # bench/gpu/isolation.py: the namespace topologies (issue #43)

HERE = Path(__file__).resolve().parent
AUTOTUNE_LINE = "Triton autotuning for function"
JIT_LINE = "Triton kernel JIT compilation during inference"
"""vLLM >= 0.25's jit_monitor: one line per Triton kernel compiled (or loaded) while serving; 0.20 has no monitor."""
KV_ALLOCATED = "GPU KV cache size"
PORTS = {
    "prefill": {"vllm": 8200, "runtime": 8201, "side": 5600},
    "decode": {"vllm": 8300, "runtime": 8301, "side": 5700},
    "decode-new": {"vllm": 8600, "runtime": 8601, "side": 5900},
}
"""decode-new: the replacement decode pod of replace-decode (its own address NEW_POD_IP, its own ports)."""
NEW_POD_IP = "127.0.0.2"
"""The replacement decode's pod IP: VLLM_NIXL_SIDE_CHANNEL_HOST=$(HPD_POD_IP) expands to it (127.0.0.0/8 is all
loopback on Linux, so a second address needs no network setup)."""
ROUTER_PORTS = {"http": 8090, "metrics": 29001, "http2": 8091, "metrics2": 29002}
"""http/metrics: the router; http2/metrics2: the second router of replace-decode (pointed at the new decode)."""
GPUS: list[int] = [0, 1]
"""The lane's GPUs: a role of TP size t runs on the first t (set by --gpus)."""
VLLM_SITES: dict[str, str] = {}
"""vLLM version (the rendered image tag) -> its site-packages directory (--vllm-site)."""
SHAPE_LENGTHS = (815, 816, 817, 1279, 1280, 1281, 2207, 2208, 2209, 3503, 3504, 3505)
CONTROL_LENGTHS = (1023, 1024, 1539, 2047, 2048, 3075)
"""In hpd_runtime.warmup.shape_lengths(4091): p - 1, p and 1.5 p + 3 for p = 1024, 2048 (warmed at Ready)."""
STEADY_SAMPLES = 5
OUTPUT_LENGTHS = (300, 650, 1000, 1400, 1800, 2200, 2600, 3000)
HOLD_BAD_S = 30.0
NO_NVLINK_MULTICAST: dict[str, str] = {
    "NCCL_NVLS_ENABLE": "0",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
    "NVSHMEM_DISABLE_NVLS": "1",
}
"""Kept set in every process we start: NVLink multicast can take a shared host's GPUs out of service."""
HOST_SUBSTITUTIONS = [
    "HPD_POD_IP=127.0.0.1 (the downward API's status.podIP; VLLM_NIXL_SIDE_CHANNEL_HOST=$(HPD_POD_IP) expands to it)",
    "--port, HPD_VLLM_PORT, HPD_RUNTIME_PORT, VLLM_NIXL_SIDE_CHANNEL_PORT: distinct per role (one host)",
    "--model and HPD_MODEL: the local model directory (the CR names the served model); for a CR served with a "
    "tokenizer (no --skip-tokenizer-init), a copy of it with bench/gpu/word_tokenizer.py's files",
    "HPD_CACHE_DIR: a local directory (the pod mounts the cache volume at /cache)",
    "HPD_PREFILL_SERVICE=127.0.0.1, HPD_PREFILL_PORT, HPD_PREFILL_RUNTIME_PORT (the pod resolves the headless Service)",
    "HPD_RUNTIME_HOST=127.0.0.1 (loopback only); TRITON_PRINT_AUTOTUNING=1 (measurement)",
    "CUDA_VISIBLE_DEVICES=the lane's first TP GPUs per role (both roles share the first; on Kubernetes each pod has "
    "its own GPUs)",
    "PYTHONPATH: the vLLM build of the rendered image's tag (--vllm-site), the router wheels and hpd_runtime",
    "replace-decode's new pod: HPD_POD_IP=127.0.0.2 (VLLM_NIXL_SIDE_CHANNEL_HOST expands to it), HPD_RUNTIME_HOST=127.0.0.2, "
    "its own vLLM, runtime and side-channel ports; the router reaches it at 127.0.0.2 (vLLM binds every address)",
    "canary step: HPD_CANARY_SECONDS=5 on the first decode, 0 on the replacement (recorded as canary_step)",
    "VLLM_USE_FLASHINFER_SAMPLER=0: flashinfer is not staged (the image ships it); vLLM 0.25 imports it for its "
    "top-k/top-p sampler unless told not to (0.20 falls back by itself); greedy requests sample the same either way",
]


PAIR_HOST_SUBSTITUTIONS = [
    "HPD_POD_IP=127.0.0.1 (the downward API's status.podIP; VLLM_NIXL_SIDE_CHANNEL_HOST=$(HPD_POD_IP) expands to it)",
    "HPD_POD_NAME, HPD_POD_NAMESPACE, HPD_POD_UID (downward API metadata fields) not set: no apiserver here, so "
    "decode's kv-reporter Lease write does not happen",
    "ports: none; the pair pod's containers have distinct ports in one network namespace, used as rendered (prefill "
    "8000/8081/5600, decode 8100/8181/5650, router 8200/29000 for the sample CR); with --port-offset N every one "
    "shifted by N, decode's HPD_PREFILL_PORT/HPD_PREFILL_RUNTIME_PORT and the router's URLs with them",
    "--model and HPD_MODEL: the local model directory (the CR names the served model); for a CR served with a "
    "tokenizer (no --skip-tokenizer-init), a copy of it with bench/gpu/word_tokenizer.py's files",
    "HPD_CACHE_DIR: a local directory (the pod mounts the cache volume at /cache)",
    "HPD_RUNTIME_HOST=127.0.0.1 (loopback only); TRITON_PRINT_AUTOTUNING=1 (measurement)",
    "CUDA_VISIBLE_DEVICES=the lane's first TP GPUs per role (both roles share the first; on Kubernetes each engine "
    "container has its own GPUs)",
    "PYTHONPATH: the vLLM build of the rendered image's tag (--vllm-site), the router wheels and hpd_runtime",
    "VLLM_USE_FLASHINFER_SAMPLER=0: flashinfer is not staged (the image ships it); greedy requests sample the same",
    "router container: command `vllm-router` run as `python -c ...vllm_router.launch_router.main` (the wheel's "
    "console script; the wheels are installed with pip --target, no script on PATH); --host and --prometheus-host "
    "0.0.0.0 -> 127.0.0.1 (loopback only: in the pod 0.0.0.0 is the pod's own network namespace); every other "
    "argument as rendered",
]
"""What one host forces on a Pair CR's pair pod (recorded as the run's and the report's host_substitutions)."""
PORT_OFFSET = [0]
"""The lane's --port-offset (shift_ports): a Pair CR's rendered ports are shifted by it."""
ROUTER_MAIN = "import sys; from vllm_router.launch_router import main; sys.exit(main())"


def shift_ports(offset: int) -> None:
    """A second lane on the same host: every port this script uses moves by `offset`."""
    PORT_OFFSET[0] += offset
    for ports in (*PORTS.values(), ROUTER_PORTS):
        for k in ports:
            ports[k] += offset


# --- command lines from the rendered Deployments ------------------------------------------------------------------
def expand_k8s_vars(value: str, env: dict[str, str]) -> str:
    """Kubernetes' `$(VAR)` expansion in env values (as the kubelet does it)."""
    return re.sub(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", lambda m: env.get(m.group(1), m.group(0)), value)


def pair_pod(manifests: list[dict[str, Any]], cr: str) -> dict[str, Any] | None:
    """The pod spec of the CR's pair Deployment (component `pair`: a Pair CR), else None."""
    for m in manifests:
        labels = m.get("metadata", {}).get("labels", {})
        if (
            m.get("kind") == "Deployment"
            and labels.get(contract.LABEL_INSTANCE) == cr
            and labels.get(contract.LABEL_COMPONENT) == contract.COMPONENT_PAIR
        ):
            return dict(m["spec"]["template"]["spec"])
    return None


def rendered_container(manifests: list[dict[str, Any]], cr: str, role: str) -> dict[str, Any]:
    """The role's container: the first of its role Deployment, or for a Pair CR the pair pod's container named
    `role` (prefill, decode, router)."""
    for m in manifests:
        labels = m.get("metadata", {}).get("labels", {})
        if (
            m.get("kind") == "Deployment"
            and labels.get(contract.LABEL_INSTANCE) == cr
            and labels.get(contract.LABEL_COMPONENT) == role
        ):
            return dict(m["spec"]["template"]["spec"]["containers"][0])
    if is_pair(manifests, cr):
        return pair_container(manifests, cr, role)
    raise KeyError(f"no {role} Deployment of {cr} in the rendered manifests")


def pair_container(manifests: list[dict[str, Any]], cr: str, name: str) -> dict[str, Any]:
    """The pair pod's container `name` (prefill, decode, router: the in-pod router, not the CR's router Deployment)."""
    for ctr in (pair_pod(manifests, cr) or {}).get("containers", []):
        if ctr.get("name") == name:
            return dict(ctr)
    raise KeyError(f"no {name} container in the pair pod of {cr} in the rendered manifests")


def rendered_ports(ctr: dict[str, Any]) -> dict[str, int]:
    """An engine container's ports as rendered (vLLM's --port, the runtime's and NIXL's side channel's), shifted by
    the lane's --port-offset."""
    env = {e["name"]: e["value"] for e in ctr.get("env", []) if "value" in e}
    args = list(ctr["args"])
    ports = {"vllm": int(args[args.index("--port") + 1]), "runtime": int(env[contract.ENV_RUNTIME_PORT]),
             "side": int(env[contract.ENV_VLLM_NIXL_SIDE_CHANNEL_PORT])}  # fmt: skip
    return {k: v + PORT_OFFSET[0] for k, v in ports.items()}


def is_pair(manifests: list[dict[str, Any]], cr: str) -> bool:
    return pair_pod(manifests, cr) is not None


@contextlib.contextmanager
def pair_ports(manifests: list[dict[str, Any]], cr: str) -> Any:
    """While a Pair CR's run lasts, PORTS of prefill and decode and ROUTER_PORTS' http/metrics are the pair pod's
    rendered ones (what the script's checks reach); restored after. A CR of role Deployments: nothing changes."""
    if not is_pair(manifests, cr):
        yield
        return
    saved = ({n: dict(PORTS[n]) for n in contract.ROLES}, dict(ROUTER_PORTS))
    for n in contract.ROLES:
        PORTS[n] = rendered_ports(rendered_container(manifests, cr, n))
    args = list(pair_container(manifests, cr, "router")["args"])
    ROUTER_PORTS["http"] = int(args[args.index("--port") + 1]) + PORT_OFFSET[0]
    ROUTER_PORTS["metrics"] = int(args[args.index("--prometheus-port") + 1]) + PORT_OFFSET[0]
    try:
        yield
    finally:
        PORTS.update(saved[0])
        ROUTER_PORTS.clear()
        ROUTER_PORTS.update(saved[1])


def pair_router_argv(manifests: list[dict[str, Any]], cr: str) -> list[str]:
    """The pair pod's router container as rendered (static 127.0.0.1 URLs of the pod's prefill and decode), with
    PAIR_HOST_SUBSTITUTIONS only: the console script as `python -c`, loopback binds, the lane's port offset."""
    ctr = pair_container(manifests, cr, "router")
    args = list(ctr["args"])
    for flag in ("--host", "--prometheus-host"):
        if flag in args:
            _set_arg(args, flag, "127.0.0.1")
    if PORT_OFFSET[0]:
        for flag in ("--port", "--prometheus-port"):
            _set_arg(args, flag, str(int(args[args.index(flag) + 1]) + PORT_OFFSET[0]))
        args = [re.sub(r"^(http://127\.0\.0\.1:)([0-9]+)$", lambda m: f"{m.group(1)}{int(m.group(2)) + PORT_OFFSET[0]}", a)
                for a in args]  # fmt: skip
    return [sys.executable, "-c", ROUTER_MAIN, *args]


def _set_arg(args: list[str], flag: str, value: str) -> None:
    i = args.index(flag)
    args[i + 1] = value


@dataclass
class Role:
    name: str
    argv: list[str]
    env: dict[str, str]
    tp: int
    host: str = "127.0.0.1"
    """The pod's address (HPD_POD_IP): what the router and this script reach its vLLM and runtime at."""
    log: Path | None = None
    proc: subprocess.Popen[bytes] | None = None
    t_start: float = 0.0
    t_health: float | None = None
    t_ready: float | None = None
    log_offset_at_ready: int = 0


def role_command(
    manifests: list[dict[str, Any]], cr: str, name: str, model_dir: Path, cache_root: Path, *,
    pod: str | None = None, pod_ip: str = "127.0.0.1",
) -> Role:  # fmt: skip
    """One role's argv/env: the rendered container's command + args and env, with HOST_SUBSTITUTIONS only. `pod`
    (a PORTS key, default the role) and `pod_ip` make another pod of the same Deployment (replace-decode)."""
    pair = pod is None and is_pair(manifests, cr)
    pod = pod or name
    ctr = rendered_container(manifests, cr, name)
    args = list(ctr["args"])
    ports = rendered_ports(ctr) if pair else PORTS[pod]
    _set_arg(args, "--port", str(ports["vllm"]))
    _set_arg(args, "--model", str(model_dir))
    env: dict[str, str] = {}
    for entry in ctr.get("env", []):
        if entry.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath") == "status.podIP":
            env[entry["name"]] = pod_ip
        elif "value" in entry:
            env[entry["name"]] = expand_k8s_vars(str(entry["value"]), env)
    tp = int(env[contract.ENV_TENSOR_PARALLEL_SIZE])
    env.update({
        contract.ENV_MODEL: str(model_dir),
        contract.ENV_VLLM_PORT: str(ports["vllm"]),
        contract.ENV_RUNTIME_PORT: str(ports["runtime"]),
        contract.ENV_RUNTIME_HOST: pod_ip,
        contract.ENV_VLLM_NIXL_SIDE_CHANNEL_PORT: str(ports["side"]),
        contract.ENV_CACHE_DIR: str(cache_root),
        "TRITON_PRINT_AUTOTUNING": "1",
        "VLLM_USE_FLASHINFER_SAMPLER": "0",
        "CUDA_VISIBLE_DEVICES": ",".join(str(g) for g in GPUS[:tp]),
        **NO_NVLINK_MULTICAST,
    })  # fmt: skip
    if name == "decode" and pair:  # the rendered 127.0.0.1 and default ports are the pod's own prefill
        if PORT_OFFSET[0]:
            p = rendered_ports(rendered_container(manifests, cr, "prefill"))
            env[contract.ENV_PREFILL_PORT] = str(p["vllm"])
            env[contract.ENV_PREFILL_RUNTIME_PORT] = str(p["runtime"])
    elif name == "decode":
        env[contract.ENV_PREFILL_SERVICE] = "127.0.0.1"
        env[contract.ENV_PREFILL_PORT] = str(PORTS["prefill"]["vllm"])
        env[contract.ENV_PREFILL_RUNTIME_PORT] = str(PORTS["prefill"]["runtime"])
    version = str(ctr.get("image", "")).rpartition(":")[2]
    if version in VLLM_SITES:
        prepend_pythonpath(env, VLLM_SITES[version])
    return Role(pod, [*ctr["command"], *args], env, tp, host=pod_ip)


def role_commands(manifests: list[dict[str, Any]], cr: str, model_dir: Path, cache_root: Path) -> dict[str, Role]:
    """Each role's argv/env (role_command) for the CR's prefill and decode Deployments (a Pair CR: the pair pod's
    prefill and decode containers)."""
    return {name: role_command(manifests, cr, name, model_dir, cache_root) for name in contract.ROLES}


def served_name(manifests: list[dict[str, Any]], cr: str) -> str:
    args = list(rendered_container(manifests, cr, "decode")["args"])
    return args[args.index("--served-model-name") + 1]


def model_dir_for(manifests: list[dict[str, Any]], cr: str, model_dir: Path | None, work: Path) -> Path:
    """The directory --model points at: `model_dir`, else bench/gpu/<served model name>. A CR whose argv has no
    `--skip-tokenizer-init` is served with a tokenizer: it gets a copy of that directory's config.json with the bench
    word tokenizer beside it (vLLM loads the tokenizer from --model), unless the directory has a tokenizer already."""
    src = model_dir if model_dir is not None else HERE / served_name(manifests, cr)
    if (
        "--skip-tokenizer-init" in rendered_container(manifests, cr, "decode")["args"]
        or (src / "tokenizer.json").exists()
    ):
        return src
    if str(HERE) not in sys.path:  # run.py imported from elsewhere (bench/load, the tests)
        sys.path.insert(0, str(HERE))
    import word_tokenizer

    dst = work / f"model-{src.name}"
    dst.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(src / "config.json", dst / "config.json")
    return word_tokenizer.write(dst)


def prepend_pythonpath(env: dict[str, str], entry: str) -> None:
    """Put `entry` first on the role's PYTHONPATH (its own, else this process's)."""
    rest = [x for x in env.get("PYTHONPATH", os.environ.get("PYTHONPATH", "")).split(os.pathsep) if x]
    env["PYTHONPATH"] = os.pathsep.join([entry, *rest])


def install_gemm_warmup_plugin(role: Role, work: Path) -> None:
    """What the image's hpd_runtime wheel declares (pyproject.toml): the vLLM general-plugin entry point of
    hpd_runtime.gemm_warmup. vLLM finds plugins only through installed entry points; here a dist-info directory on the
    role's PYTHONPATH declares the same one. The rendered env (HPD_GEMM_WARMUP_TOKENS) decides whether it runs."""
    dist = work / "gemm-warmup-plugin" / "hpd_gemm_warmup_bench-0.dist-info"
    dist.mkdir(parents=True, exist_ok=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: hpd-gemm-warmup-bench\nVersion: 0\n")
    (dist / "entry_points.txt").write_text(
        "[vllm.general_plugins]\nhpd_gemm_warmup = hpd_runtime.gemm_warmup:register\n"
    )
    prepend_pythonpath(role.env, str(dist.parent))


def enable_gemm_warmup(role: Role) -> str:
    """The @gemm-warmup variant: the GEMM row sweep on whatever the rendered env says (for CRs with everyLength off)."""
    role.env[contract.ENV_GEMM_WARMUP_TOKENS] = "auto"
    return f"{contract.ENV_GEMM_WARMUP_TOKENS}=auto"


def disable_gemm_warmup(role: Role) -> str:
    """The @no-gemm-warmup variant (the A/B baseline): the rendered HPD_GEMM_WARMUP_* env removed."""
    gone = [n for n in (contract.ENV_GEMM_WARMUP_TOKENS, contract.ENV_GEMM_WARMUP_SECONDS) if role.env.pop(n, None)]
    return f"removed {', '.join(gone) or 'nothing (the CR had it off)'}"


def set_env(role: Role, name: str, value: str) -> str:
    """The @env+NAME=VALUE variant: one env entry set (or replaced) on the role."""
    old = role.env.get(name)
    role.env[name] = value
    return f"{name}={value}" + ("" if old is None else f" (was {old!r})")


def unset_env(role: Role, name: str) -> str:
    """The @env-NAME variant: one env entry removed from the role (the A/B baseline of an env fix)."""
    return f"removed {name}" if role.env.pop(name, None) is not None else f"removed nothing ({name} was not set)"


VARIANTS = "@no-block-size, @gemm-warmup, @no-gemm-warmup, @env+NAME=VALUE, @env-NAME, @kvx+KEY=VALUE (joined by @)"


def apply_variant(roles: dict[str, Role], variant: str) -> dict[str, str]:
    """A plan item's `@variant` applied to every role; returns what it did per role (recorded as `experiment`)."""
    if not variant:
        return {}
    if "@" in variant:  # several variants, applied in order: CR@env+A=1@kvx+num_threads=0
        done: dict[str, str] = {}
        for v in variant.split("@"):
            for n, what in apply_variant(roles, v).items():
                done[n] = f"{done[n]}; {what}" if n in done else what
        return done
    m = re.fullmatch(r"kvx\+([A-Za-z_][A-Za-z0-9_]*)=(.*)", variant)
    if m:
        return {n: set_extra_config(r, m.group(1), m.group(2)) for n, r in roles.items()}
    if variant == "no-block-size":
        return {n: f"--block-size removed: {drop_flag(r, '--block-size')}" for n, r in roles.items()}
    if variant == "gemm-warmup":
        return {n: enable_gemm_warmup(r) for n, r in roles.items()}
    if variant == "no-gemm-warmup":
        return {n: disable_gemm_warmup(r) for n, r in roles.items()}
    m = re.fullmatch(r"env\+([A-Za-z_][A-Za-z0-9_]*)=(.*)", variant)
    if m:
        return {n: set_env(r, m.group(1), m.group(2)) for n, r in roles.items()}
    m = re.fullmatch(r"env-([A-Za-z_][A-Za-z0-9_]*)", variant)
    if m:
        return {n: unset_env(r, m.group(1)) for n, r in roles.items()}
    raise SystemExit(f"unknown plan variant @{variant} (known: {VARIANTS})")


def set_extra_config(role: Role, key: str, value: str) -> str:
    """`kv_connector_extra_config[key] = value` in the role's --kv-transfer-config (an int where it reads as one):
    what vLLM passes NIXL, e.g. num_threads (nixl/worker.py get_from_extra_config("num_threads", 4))."""
    i = role.argv.index("--kv-transfer-config") + 1
    cfg = json.loads(role.argv[i])
    val: Any = int(value) if re.fullmatch(r"-?[0-9]+", value) else value
    cfg.setdefault("kv_connector_extra_config", {})[key] = val
    role.argv[i] = json.dumps(cfg, separators=(",", ":"))
    return f"--kv-transfer-config {role.argv[i]}"


def drop_flag(role: Role, flag: str) -> bool:
    """Remove `flag VALUE` from the role's argv (the @no-block-size experiment); True if it was there."""
    if flag not in role.argv:
        return False
    i = role.argv.index(flag)
    del role.argv[i : i + 2]
    return True


# --- HTTP ---------------------------------------------------------------------------------------------------------
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def get(url: str, timeout: float = 2.0) -> tuple[int, str]:
    try:
        with _OPENER.open(url, timeout=timeout) as r:
            return int(r.status), r.read().decode(errors="replace")
    except urllib.error.HTTPError as e:
        return int(e.code), e.read().decode(errors="replace")
    except (urllib.error.URLError, OSError):
        return 0, ""


def post(url: str, body: dict[str, Any], timeout: float = 600, request_id: str | None = None) -> tuple[float, Any]:
    rid = request_id or str(uuid.uuid4())
    req = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json", "X-Request-Id": rid})  # fmt: skip
    t = time.perf_counter()
    with _OPENER.open(req, timeout=timeout) as r:
        out = json.loads(r.read())
    return time.perf_counter() - t, out


def completion(model: str, ids: list[int], max_tokens: int) -> dict[str, Any]:
    return {"model": model, "prompt": ids, "max_tokens": max_tokens, "temperature": 0, "return_token_ids": True,
            "ignore_eos": True, "logprobs": 1, "return_tokens_as_token_ids": True}  # fmt: skip


def answer(resp: dict[str, Any]) -> tuple[list[int] | None, list[float]]:
    choice = resp["choices"][0]
    ids = choice.get("token_ids")
    lps = (choice.get("logprobs") or {}).get("token_logprobs") or []
    return (list(ids) if ids is not None else None), [float(x) if x is not None else math.nan for x in lps]


def prompt(rng: random.Random, n: int) -> list[int]:
    return [rng.randint(3, 2000) for _ in range(n)]


# --- processes ------------------------------------------------------------------------------------------------------
TOPOLOGY: dict[str, Any] = {"name": "host", "holder": None, "holder_pid": None}
"""How each role is isolated (bench/gpu/isolation.py; --topology): `host` (every role a process of this host, as
before issue #43), `pods` (each its own PID, IPC and mount namespace) or `pair` (one PID and IPC namespace for all,
each its own mount namespace). The roles keep this script's uid here (their caches are this script's directories);
kv_path.py measures the uids' part (none: cuda_ipc works across uids 1000 and 1001 in one PID namespace)."""


def isolated_argv(role: Role) -> list[str]:
    """The role's argv behind the topology's namespace wrapper (the pair's namespace holder started once)."""
    name = TOPOLOGY["name"]
    if name == "pair" and TOPOLOGY["holder"] is None:
        TOPOLOGY["holder"], TOPOLOGY["holder_pid"] = isolation.start_holder()
    which = "p" if role.name.startswith("prefill") else "d"
    return [*isolation.role_prefix(name, which, TOPOLOGY["holder_pid"], as_root=True), *role.argv]


def pod_container_prefix() -> list[str]:
    """The topology's wrapper for a further container of the pod (the pair pod's router): under `pair`, in the pod's
    PID and IPC namespace and its own mount namespace, as the roles (this script's uid, as the roles here)."""
    name = TOPOLOGY["name"]
    if name == "pair" and TOPOLOGY["holder"] is None:
        TOPOLOGY["holder"], TOPOLOGY["holder_pid"] = isolation.start_holder()
    return isolation.role_prefix(name, "p", TOPOLOGY["holder_pid"], as_root=True)  # as_root: the role picks no uid


def start_role(role: Role, out: Path, tag: str, base_env: dict[str, str]) -> None:
    role.log = out / f"{tag}-{role.name}.log"
    role.t_start, role.t_health, role.t_ready = time.perf_counter(), None, None
    with role.log.open("ab") as fh:
        role.proc = subprocess.Popen(isolated_argv(role), env={**base_env, **role.env}, stdout=fh,
                                     stderr=subprocess.STDOUT, start_new_session=True)  # fmt: skip


def wait_kv_allocated(role: Role, deadline: float) -> None:
    assert role.proc is not None and role.log is not None
    while time.perf_counter() < deadline:
        if role.proc.poll() is not None:
            raise RuntimeError(f"{role.name} exited with {role.proc.returncode}; see {role.log.name}")
        if KV_ALLOCATED in role.log.read_text(errors="replace"):
            return
        if get(f"http://{role.host}:{PORTS[role.name]['vllm']}/health", 0.5)[0] == 200:
            return
        time.sleep(0.5)
    raise TimeoutError(f"{role.name}: no '{KV_ALLOCATED}' line in time")


def use_free_ports() -> None:
    """Every port of PORTS and ROUTER_PORTS from the OS (tests and benches on a shared machine, not the GPU host)."""
    socks = []
    for ports in (*PORTS.values(), ROUTER_PORTS):
        for k in ports:
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
            ports[k] = s.getsockname()[1]
    for s in socks:
        s.close()


def readyz_url(role: Role) -> str:
    return f"http://{role.host}:{PORTS[role.name]['runtime']}{contract.PATH_READYZ}"


def record_readyz(hist: list[tuple[float, int, str]], now: Callable[[], float], role: Role) -> None:
    """Poll one pod's /readyz and append (now(), status, body) to `hist` when it differs from the last entry."""
    status, body = get(readyz_url(role), 1.5)
    if not hist or hist[-1][1] != status or hist[-1][2] != body.strip()[:200]:
        hist.append((now(), status, body.strip()[:200]))


def poll_times(role: Role) -> bool:
    """Update t_health/t_ready; True once /readyz is 200."""
    now = time.perf_counter()
    if role.t_health is None and get(f"http://{role.host}:{PORTS[role.name]['vllm']}/health")[0] == 200:
        role.t_health = now - role.t_start
    if get(readyz_url(role))[0] == 200:
        if role.t_ready is None:
            role.t_ready = now - role.t_start
            assert role.log is not None
            role.log_offset_at_ready = role.log.stat().st_size
        return True
    return False


def wait_ready(roles: dict[str, Role], deadline: float) -> None:
    pending = dict(roles)
    while pending:
        for name, role in list(pending.items()):
            assert role.proc is not None
            if role.proc.poll() is not None:
                raise RuntimeError(f"{name} exited with {role.proc.returncode}; see {role.log}")
            if poll_times(role):
                del pending[name]
        if time.perf_counter() > deadline:
            reasons = {n: get(readyz_url(r))[1] for n, r in pending.items()}
            raise TimeoutError(f"not ready in time: {reasons}")
        time.sleep(0.25)


def descendants(pid: int) -> list[int]:
    """Every process below `pid` (Linux /proc), children first. vLLM runs in a session of its own under the launcher
    (start_new_session), so a signal to the role's process group misses it and everything vLLM started."""
    out: list[int] = []
    todo = [pid]
    while todo:
        p = todo.pop()
        for task in Path(f"/proc/{p}/task").glob("*"):
            with contextlib.suppress(OSError, ValueError):
                kids = [int(c) for c in (task / "children").read_text().split()]
                out += kids
                todo += kids
    return out


def role_tree(role: Role) -> list[int]:
    """The role's process and every process below it now."""
    if role.proc is None or role.proc.poll() is not None:
        return []
    return [role.proc.pid, *descendants(role.proc.pid)]


def alive(role: Role, pid: int) -> bool:
    """`pid` of the role's tree still running (a zombie another process has not reaped yet counts as gone)."""
    if role.proc is not None and pid == role.proc.pid:
        return role.proc.poll() is None
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def kill_tree(role: Role, tree: list[int]) -> None:
    """SIGKILL the role's process group, `tree` (read before: a process whose parent died is reparented to its PID
    namespace's init, so the pair topology's launcher is no longer found below nsenter once nsenter exited) and
    whatever is below the role's process now."""
    if role.proc is None:
        return
    pids = [*tree, *descendants(role.proc.pid)]
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(role.proc.pid, signal.SIGKILL)
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        role.proc.wait(10)


def port_open(host: str, port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex((host, port)) == 0


def wait_ports_closed(roles: list[Role], timeout: float) -> list[str]:
    """Until no role's vLLM or runtime port accepts a connection (the next role started on them must bind them);
    the ports still open at the timeout."""
    deadline = time.monotonic() + timeout
    while True:
        left = [f"{r.name}:{k}={PORTS[r.name][k]}" for r in roles for k in ("vllm", "runtime")
                if port_open(r.host, PORTS[r.name][k])]  # fmt: skip
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.2)


def stop_role(role: Role, grace: float = 60) -> int | None:
    """SIGTERM to the role's process group, then up to `grace` for every process of its tree (read before the
    signal) to end, SIGKILL to what is left; then until its vLLM and runtime ports are closed (the engine core is
    its own process, and its GPU memory must be free; the next role binds the same ports). Waiting on the role's
    own process alone is not enough: under `pair` it is nsenter, which SIGTERM ends at once while the launcher below
    still forwards the signal to vLLM and holds its runtime port."""
    if role.proc is None:
        return None
    tree = role_tree(role)
    if tree:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(role.proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline and any(alive(role, p) for p in tree):
            time.sleep(0.2)
        if any(alive(role, p) for p in tree):
            kill_tree(role, tree)
        with contextlib.suppress(subprocess.TimeoutExpired):
            role.proc.wait(10)
    wait_ports_closed([role], 60)
    return role.proc.returncode


class Router:
    """vllm-router 0.1.17 on loopback: P/D (`--vllm-pd-disaggregation`, prefill and decode of PORTS), or with
    `workers` its regular mode over those vLLM ports (round robin, as bench/load's colocated side). `decode` points
    a P/D router at another decode pod (its host and PORTS entry; static URLs, as the bench's router has), on the
    ROUTER_PORTS pair `ports` (a second router beside the first). `argv`: a rendered router instead (the pair pod's,
    pair_router_argv), listening on its own --port, behind the topology's wrapper as a container of the pod."""

    def __init__(
        self, out: Path, tag: str, env: dict[str, str], workers: list[str] | None = None, *,
        decode: Role | None = None, ports: tuple[str, str] = ("http", "metrics"), argv: list[str] | None = None,
    ) -> None:  # fmt: skip
        self.log = out / f"{tag}-router.log"
        if argv is not None:
            self.port = int(argv[argv.index("--port") + 1])
            self.argv = [*pod_container_prefix(), *argv]
            self._start(env)
            return
        d_url = (
            f"http://{decode.host}:{PORTS[decode.name]['vllm']}"
            if decode
            else f"http://127.0.0.1:{PORTS['decode']['vllm']}"
        )
        if workers is None:
            mode = ["--vllm-pd-disaggregation", "--prefill", f"http://127.0.0.1:{PORTS['prefill']['vllm']}",
                    "--decode", d_url]  # fmt: skip
        else:
            mode = ["--worker-urls", *(f"http://127.0.0.1:{PORTS[w]['vllm']}" for w in workers)]
        self.port = ROUTER_PORTS[ports[0]]
        argv = [
            sys.executable, "-c", "import sys; from vllm_router.launch_router import main; sys.exit(main())", *mode,
            "--policy", "round_robin", "--host", "127.0.0.1", "--port", str(self.port),
            "--prometheus-host", "127.0.0.1", "--prometheus-port", str(ROUTER_PORTS[ports[1]]),
        ]  # fmt: skip
        self.argv = argv
        self._start(env)

    def _start(self, env: dict[str, str]) -> None:
        with self.log.open("wb") as fh:
            self.proc = subprocess.Popen(
                self.argv, env=env, stdout=fh, stderr=subprocess.STDOUT, start_new_session=True
            )
        deadline = time.monotonic() + 120
        while get(f"http://127.0.0.1:{self.port}/health")[0] != 200:
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"router did not come up; see {self.log.name}")
            time.sleep(0.25)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1/completions"

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)


# --- measurements -----------------------------------------------------------------------------------------------------
def router_url() -> str:
    return f"http://127.0.0.1:{ROUTER_PORTS['http']}/v1/completions"


def decode_url() -> str:
    return f"http://127.0.0.1:{PORTS['decode']['vllm']}/v1/completions"


def pair_verdict(pd: dict[str, Any], co: dict[str, Any], n: int) -> dict[str, Any]:
    """The runtime's own output check (hpd_runtime.paircheck.compare, its default bound) on one prompt."""
    try:
        a, b = paircheck.parse_completion(pd, n), paircheck.parse_completion(co, n)
    except ValueError as e:
        return {"ok": False, "reason": str(e), "max_delta": None, "cached_tokens": None}
    v = paircheck.compare(a, b)
    # the logprob gap even where the transfer proof failed (e.g. a router that drops usage details)
    gap = paircheck.compare(dataclasses.replace(a, cached_tokens=max(a.cached_tokens or 0, 1)), b).max_delta
    return {"ok": v.ok, "reason": v.reason, "cached_tokens": a.cached_tokens,
            "max_delta": None if math.isnan(gap) else round(gap, 5)}  # fmt: skip


def compare_outputs(model: str, lengths: tuple[int, ...], seed: int) -> dict[str, Any]:
    rows = []
    for i, n in enumerate(lengths):
        ids = prompt(random.Random(seed + i), n)
        _, pd = post(router_url(), completion(model, ids, 16))
        _, co = post(decode_url(), completion(model, ids, 16))
        (a, la), (b, lb) = answer(pd), answer(co)
        delta = abs(la[0] - lb[0]) if la and lb else math.nan
        first_diff = next((j for j, (x, y) in enumerate(zip(a or [], b or [], strict=False)) if x != y), None)
        rows.append({"prompt_tokens": n, "pd_token_ids": a, "colocated_token_ids": b, "identical": a is not None and a == b,
                     "first_logprob_pd": la[:1], "first_logprob_colocated": lb[:1],
                     "first_token_abs_logprob_delta": None if math.isnan(delta) else round(delta, 5),
                     "pd_nonfinite_logprobs": sum(1 for x in la if not math.isfinite(x) or x <= -9999),
                     "first_divergent_token": first_diff, "output_check": pair_verdict(pd, co, n)})  # fmt: skip
    gaps = [r["output_check"]["max_delta"] for r in rows if r["output_check"]["max_delta"] is not None]
    return {"prompts": len(rows), "identical": sum(r["identical"] for r in rows),
            "within_output_check": sum(r["output_check"]["ok"] for r in rows),
            # the gap alone (finite, within the bound): vllm-router drops usage details, so the router path can never
            # prove the transfer that within_output_check also asks for
            "within_bound": sum(r["output_check"]["max_delta"] is not None and not r["pd_nonfinite_logprobs"]
                                and r["output_check"]["max_delta"] <= paircheck.MAX_LOGPROB_DELTA_DEFAULT for r in rows),
            "output_check_bound_nats": paircheck.MAX_LOGPROB_DELTA_DEFAULT,
            "largest_gap_nats": max(gaps) if gaps else None, "rows": rows}  # fmt: skip


FIRST_LENGTH = 1000
"""The one length of the first-request-after-Ready measurement (as in the project's earlier runs)."""


def first_request(model: str, only_router: bool = False) -> dict[str, Any]:
    """Right after both roles are Ready, before anything else: the first request vs the median of 3 more, fresh
    prompts of one length, P->D through the router, then colocated on decode. With warmup off this is the baseline."""
    rng = random.Random(98 if only_router else 99)  # fresh prompts for the second router
    out: dict[str, Any] = {}
    targets = [("pd_via_router", router_url()), ("colocated_on_decode", decode_url())][: 1 if only_router else 2]
    for name, url in targets:
        times = [post(url, completion(model, prompt(rng, FIRST_LENGTH), 8))[0] for _ in range(4)]
        steady = statistics.median(times[1:])
        out[name] = {"first_s": round(times[0], 4), "steady_median_s": round(steady, 4),
                     "first_over_steady": round(times[0] / steady, 3), "all_s": [round(t, 4) for t in times]}  # fmt: skip
    return out


def shapes(model: str) -> dict[str, Any]:
    rng = random.Random(4242)
    out: dict[str, Any] = {}
    for name, url in (("pd_via_router", router_url()), ("colocated_on_decode", decode_url())):
        rows = []
        for n in (*SHAPE_LENGTHS, *CONTROL_LENGTHS):
            times = [post(url, completion(model, prompt(rng, n), 8))[0] for _ in range(1 + STEADY_SAMPLES)]
            steady = statistics.median(times[1:])
            rows.append({"prompt_tokens": n, "warmed_by_ladder": n in CONTROL_LENGTHS, "first_s": round(times[0], 4),
                         "steady_median_s": round(steady, 4), "first_over_steady": round(times[0] / steady, 3),
                         "first_minus_steady_ms": round(1000 * (times[0] - steady), 1),
                         "all_s": [round(t, 4) for t in times]})  # fmt: skip
        unseen = [r for r in rows if not r["warmed_by_ladder"]]
        control = [r for r in rows if r["warmed_by_ladder"]]
        out[name] = {"rows": rows, "max_first_over_steady": max(r["first_over_steady"] for r in unseen),
                     "control_max_first_over_steady": max(r["first_over_steady"] for r in control),
                     "max_first_minus_steady_ms": max(r["first_minus_steady_ms"] for r in unseen),
                     "control_max_first_minus_steady_ms": max(r["first_minus_steady_ms"] for r in control)}  # fmt: skip
    return out


def log_text(role: Role, since: int = 0) -> str:
    assert role.log is not None
    with role.log.open("rb") as fh:
        fh.seek(since)
        return fh.read().decode(errors="replace")


def runtime_events(role: Role, event: str) -> list[dict[str, Any]]:
    out = []
    for line in log_text(role).splitlines():
        if f'"event": "{event}"' in line:
            try:
                out.append(json.loads(line[line.index("{") :]))
            except ValueError:
                pass
    return out


def block_sizes(roles: dict[str, Role]) -> dict[str, dict[str, int | None]]:
    out: dict[str, dict[str, int | None]] = {}
    for name, role in roles.items():
        text = log_text(role) if role.log and role.log.exists() else ""
        attn = re.search(r"Setting attention block size to (\d+) tokens", text)
        kernel = re.search(r"physical kernel block size \((\d+)\)", text)
        out[name] = {
            "attention": int(attn.group(1)) if attn else None,
            "kernel": int(kernel.group(1)) if kernel else None,
        }
    return out


# --- vLLM's own KV transfer figures (decode side) -------------------------------------------------------------------
KV_XFER_LINE = "KV Transfer metrics:"
"""vLLM 0.20's periodic stats line on decode: `KV Transfer metrics: Num successful transfers=N, Avg xfer time (ms)=X,
P90 xfer time (ms)=X, Avg post time (ms)=X, P90 post time (ms)=X, Avg MB per transfer=X, Throughput (MB/s)=X,
Avg number of descriptors=X` (kv_connector/v1/metrics.py:103 joins NixlKVConnectorStats.reduce(), nixl/stats.py:84-123,
as `k=v` with ", "). Its "MB" are MiB (bytes / 2**20), per interval since the previous line."""
KV_XFER_KEYS = {
    "Num successful transfers": "transfers",
    "Avg xfer time (ms)": "avg_xfer_ms",
    "P90 xfer time (ms)": "p90_xfer_ms",
    "Avg post time (ms)": "avg_post_ms",
    "P90 post time (ms)": "p90_post_ms",
    "Avg MB per transfer": "avg_mib_per_transfer",
    "Throughput (MB/s)": "throughput_mib_s",
    "Avg number of descriptors": "avg_descriptors",
}
NIXL_METRICS = ("vllm:nixl_xfer_time_seconds", "vllm:nixl_post_time_seconds", "vllm:nixl_bytes_transferred",
                "vllm:nixl_num_descriptors")  # fmt: skip
"""Histograms recorded on decode per successful transfer (nixl/stats.py:130-264): `_sum` and `_count` are enough for
the means; `vllm:nixl_num_failed_transfers_total` counts the failures."""


def parse_kv_transfer_line(line: str) -> dict[str, float] | None:
    """One `KV Transfer metrics:` line -> its figures under KV_XFER_KEYS' names, plus `gbps` (1e9 bytes/s, the unit
    bench/gpu/kv_path.py reports); None for any other line."""
    i = line.find(KV_XFER_LINE)
    if i < 0:
        return None
    out: dict[str, float] = {}
    for item in line[i + len(KV_XFER_LINE) :].strip().split(", "):
        key, sep, value = item.partition("=")
        name = KV_XFER_KEYS.get(key.strip())
        if not sep or name is None:
            continue
        try:
            out[name] = float(value.strip())
        except ValueError:
            continue
    if "transfers" not in out:
        return None
    out["transfers"] = int(out["transfers"])
    mib_s = out.get("throughput_mib_s")
    out["gbps"] = round(mib_s * 2**20 / 1e9, 4) if mib_s is not None else float("nan")
    return out


def kv_transfer_log(text: str) -> dict[str, Any]:
    """Every `KV Transfer metrics` line of a decode log, and their transfer-weighted aggregate."""
    lines = [x for x in (parse_kv_transfer_line(ln) for ln in text.splitlines()) if x and x["transfers"] > 0]
    n = sum(int(x["transfers"]) for x in lines)
    if not n:
        return {"lines": lines, "transfers": 0}
    xfer_s = sum(x["transfers"] * x.get("avg_xfer_ms", 0.0) / 1e3 for x in lines)
    mib = sum(x["transfers"] * x.get("avg_mib_per_transfer", 0.0) for x in lines)
    descs = sum(x["transfers"] * x.get("avg_descriptors", 0.0) for x in lines)
    return {"lines": lines, "transfers": n, "mb_per_transfer": round(mib * 2**20 / n / 1e6, 3),
            "ms_per_transfer": round(xfer_s / n * 1e3, 3), "descriptors_per_transfer": round(descs / n, 1),
            "gbps": round(mib * 2**20 / xfer_s / 1e9, 4) if xfer_s > 0 else None}  # fmt: skip


def nixl_metric_sums(text: str) -> dict[str, float]:
    """decode's /metrics -> every `vllm:nixl_*` sample summed over its label sets (engines, TP ranks)."""
    sums: dict[str, float] = {}
    for ln in text.splitlines():
        if not ln.startswith("vllm:nixl_"):
            continue
        m = re.match(r"([A-Za-z_:][A-Za-z0-9_:]*)(\{[^}]*\})?\s+([^\s]+)", ln)
        if not m:
            continue
        try:
            sums[m.group(1)] = sums.get(m.group(1), 0.0) + float(m.group(3))
        except ValueError:
            continue
    return sums


def parse_nixl_metrics(text: str) -> dict[str, Any]:
    """decode's /metrics -> the NIXL transfer figures since start: transfers, bytes and time per transfer, GB/s
    (bytes_sum / xfer_time_sum), descriptors per transfer, failures. Sums over label sets (engines, TP ranks)."""
    return nixl_figures(nixl_metric_sums(text))


def nixl_figures(sums: dict[str, float]) -> dict[str, Any]:
    """The figures of parse_nixl_metrics from summed samples: pass the difference of two scrapes' sums for the
    transfers between them (nixl_delta)."""
    n = sums.get("vllm:nixl_xfer_time_seconds_count", 0.0)
    out: dict[str, Any] = {"transfers": int(n),
                           "failed_transfers": int(sums.get("vllm:nixl_num_failed_transfers_total", 0.0)),
                           "present": any(k.startswith(NIXL_METRICS) for k in sums)}  # fmt: skip
    if n:
        t = sums.get("vllm:nixl_xfer_time_seconds_sum", 0.0)
        b = sums.get("vllm:nixl_bytes_transferred_sum", 0.0)
        out.update({"mb_per_transfer": round(b / n / 1e6, 3), "ms_per_transfer": round(t / n * 1e3, 3),
                    "post_ms_per_transfer": round(sums.get("vllm:nixl_post_time_seconds_sum", 0.0) / n * 1e3, 3),
                    "descriptors_per_transfer": round(sums.get("vllm:nixl_num_descriptors_sum", 0.0) / n, 1),
                    "gbps": round(b / t / 1e9, 4) if t > 0 else None})  # fmt: skip
    return out


def nixl_delta(before: dict[str, float], after: dict[str, float]) -> dict[str, Any]:
    """The NIXL figures of the transfers between two scrapes of decode's /metrics (their nixl_metric_sums)."""
    return nixl_figures({k: v - before.get(k, 0.0) for k, v in after.items()})


def kv_transfer_figures(decode: Role) -> dict[str, Any]:
    """How the KV moved in this run, in vLLM's own figures: decode's `KV Transfer metrics` lines and its /metrics."""
    out: dict[str, Any] = {}
    have_log = decode.log is not None and decode.log.exists()
    out["log"] = kv_transfer_log(log_text(decode)) if have_log else {"transfers": 0}
    # the pair check moves KV before Ready; what the measured requests moved is in the lines after it
    if have_log and decode.t_ready is not None:
        out["log_after_ready"] = kv_transfer_log(log_text(decode, decode.log_offset_at_ready))
    status, body = get(f"http://{decode.host}:{PORTS[decode.name]['vllm']}/metrics", 5.0)
    out["metrics"] = parse_nixl_metrics(body) if status == 200 else {"error": f"/metrics answered {status}"}
    return out


ERROR_PATTERN = re.compile(r"ERROR|Traceback|Segmentation|NIXL_ERR|Remote I/O|core dumped", re.I)


def error_lines(role: Role, since: int) -> list[str]:
    return [ln[:300] for ln in log_text(role, since).splitlines() if ERROR_PATTERN.search(ln)][:30]


class Timeline:
    """Background P->D traffic through the router, checked against colocated answers, plus /readyz polling."""

    def __init__(self, model: str, refs: list[tuple[list[int], list[int]]], roles: dict[str, Role]) -> None:
        self.model, self.refs, self.roles = model, refs, roles
        self.t0 = time.perf_counter()
        self.requests: list[dict[str, Any]] = []
        self.readyz: dict[str, list[tuple[float, int, str]]] = {n: [] for n in roles}
        self.stop = threading.Event()
        self.threads = [
            threading.Thread(target=self._send, daemon=True),
            threading.Thread(target=self._poll, daemon=True),
        ]

    def now(self) -> float:
        return round(time.perf_counter() - self.t0, 2)

    def _send(self) -> None:
        i = 0
        while not self.stop.is_set():
            ids, ref = self.refs[i % len(self.refs)]
            t = self.now()
            try:
                dt, resp = post(router_url(), completion(self.model, ids, 8), timeout=30)
                got, lps = answer(resp)
                ok = got == ref
                bad_lp = any(not math.isfinite(x) or x <= -9999 for x in lps)
                self.requests.append({"t": t, "s": round(dt, 3), "outcome": "identical" if ok else "DIFFERENT",
                                      "nonfinite": bad_lp, **({} if ok else {"got": got, "want": ref})})  # fmt: skip
            except (urllib.error.URLError, OSError, ValueError, KeyError) as e:
                self.requests.append({"t": t, "outcome": "error", "error": str(e)[:200]})
                self.stop.wait(0.5)
            i += 1

    def _poll(self) -> None:
        while not self.stop.wait(0.5):
            for n in self.roles:
                record_readyz(self.readyz[n], self.now, self.roles[n])

    def start(self) -> None:
        for t in self.threads:
            t.start()

    def finish(self) -> dict[str, Any]:
        self.stop.set()
        for t in self.threads:
            t.join(35)
        counts: dict[str, int] = {}
        for r in self.requests:
            counts[r["outcome"]] = counts.get(r["outcome"], 0) + 1
        return {"counts": counts, "requests": self.requests, "readyz": self.readyz}


def restart_prefill(
    roles: dict[str, Role], model: str, out: Path, tag: str, base_env: dict[str, str]
) -> dict[str, Any]:
    rng = random.Random(777)
    refs = []
    for n in (500, 1200, 2100, 3000):
        ids = prompt(rng, n)
        refs.append((ids, answer(post(decode_url(), completion(model, ids, 8))[1])[0] or []))
    p, d = roles["prefill"], roles["decode"]
    assert d.log is not None
    d_offset = d.log.stat().st_size
    tl = Timeline(model, refs, roles)
    tl.start()
    time.sleep(10)
    res: dict[str, Any] = {"t_sigterm_prefill": tl.now()}
    res["prefill_exit_code"] = stop_role(p)
    res["t_prefill_gone"] = tl.now()
    start_role(p, out, f"{tag}-restarted", base_env)
    res["t_prefill_started"] = tl.now()
    decode_exits: list[dict[str, Any]] = []
    deadline = time.perf_counter() + 240
    settled_since: float | None = None
    while time.perf_counter() < deadline:
        if d.proc is not None and d.proc.poll() is not None:  # restartPolicy: Always, as the kubelet would
            decode_exits.append({"t": tl.now(), "exit_code": d.proc.returncode})
            stop_role(d, 5)
            start_role(d, out, f"{tag}-decode-restart{len(decode_exits)}", base_env)
        p_ready, d_ready = poll_times(p), poll_times(d)
        if p_ready and "t_prefill_ready" not in res:
            res["t_prefill_ready"] = tl.now()
        if p_ready and d_ready:
            settled_since = settled_since or time.perf_counter()
            if time.perf_counter() - settled_since > 30:
                break
        else:
            settled_since = None
        time.sleep(0.5)
    res["decode_exits"] = decode_exits
    res["timeline"] = tl.finish()
    res["prefill_restart_times"] = {"to_health_s": round(p.t_health or -1, 1), "to_readyz_s": round(p.t_ready or -1, 1)}
    res["decode_error_lines"] = error_lines(d, d_offset) if not decode_exits else ["(decode restarted: see logs)"]
    res["decode_pair_checks"] = [
        {k: e.get(k) for k in ("ts", "ok", "summary", "prefill", "seconds")} for e in runtime_events(d, "pair_check")
    ]
    res["decode_pair_rechecks"] = [e.get("ts") for e in runtime_events(d, "pair_recheck")]
    return res


# --- the decode side's lifecycle under a running prefill (issue #31) -----------------------------------------------
DECODE_STEPS = ("restart-decode", "replace-decode", "canary")
TRAFFIC_LENGTHS = (500, 1200, 2100, 3000)
TRAFFIC_TOKENS = 8
LOAD_CONCURRENCY = 4
"""Concurrent senders in the canary step's load phases (the steady concurrency the user latency is read at)."""
LOAD_PHASE_S = 12.0
BEFORE_S = 5.0
AFTER_S = 8.0
BOOT_TIMEOUT_S = 300.0
CANARY_ON_SECONDS = "5"
"""HPD_CANARY_SECONDS of the decode the canary step's "on" phase runs on (the replacement pod gets 0: "off")."""
PRE_RESTART_GRACE_S = 60.0
"""terminationGracePeriodSeconds when the rendered pod spec has none (the kubelet SIGKILLs after it)."""
TEARDOWN_GRACE_S = 10.0
NIXL_PATTERN = re.compile(r"nixl|ucx|ucp_|uct_|handshake|KV blocks|remote agent|xfer", re.I)
EXPIRED_KV = "Releasing expired KV blocks"
"""vLLM 0.20 prefill (nixl/worker.py get_finished): blocks of a request no decode read within
VLLM_NIXL_ABORT_REQUEST_TIMEOUT (480 s) are freed with this warning."""
PREFILL_GAUGES = ("vllm:kv_cache_usage_perc", "vllm:num_requests_running", "vllm:num_requests_waiting")


@dataclass
class Bench:
    """What the decode steps need of one run_step: the CR's rendered manifests, its roles and the run's places."""

    manifests: list[dict[str, Any]]
    cr: str
    variant: str
    model_dir: Path
    cache_root: Path
    work: Path
    out: Path
    served: str
    base_env: dict[str, str]
    roles: dict[str, Role]
    deadline: float = math.inf
    """perf_counter() by which the whole plan must be done (--deadline-s)."""
    load_s: float = 0.0
    """Each canary load phase (LOAD_PHASE_S unless --load-phase-s)."""
    after_s: float = 0.0
    """The checked traffic after a restart or a swap (AFTER_S unless --after-s)."""
    routers: list[Router] = dataclasses.field(default_factory=list)
    parts_levels: tuple[int, ...] = (1, 4, 16)
    """`ttft-parts`: requests in flight (run_step: PARTS_LEVELS unless --parts-levels)."""
    parts_lengths: tuple[int, ...] = (2000, 4000, 8000)
    """`ttft-parts`: prompt lengths (run_step: PARTS_LENGTHS unless --parts-lengths)."""

    def until(self, seconds: float) -> float:
        return min(time.perf_counter() + seconds, self.deadline)

    def grace(self) -> float:
        """The decode pod's terminationGracePeriodSeconds, as rendered (what the kubelet waits before SIGKILL)."""
        for m in self.manifests:
            labels = m.get("metadata", {}).get("labels", {})
            if m.get("kind") == "Deployment" and labels.get(contract.LABEL_INSTANCE) == self.cr \
                    and labels.get(contract.LABEL_COMPONENT) == "decode":  # fmt: skip
                return float(m["spec"]["template"]["spec"].get("terminationGracePeriodSeconds", PRE_RESTART_GRACE_S))
        return PRE_RESTART_GRACE_S

    def new_decode(self, canary_seconds: str | None) -> Role:
        """The decode Deployment's container as a new pod: pod IP NEW_POD_IP (so a new NIXL side-channel address),
        its own ports, the run's @variant and the GEMM warmup plugin as the first decode has them."""
        role = role_command(self.manifests, self.cr, "decode", self.model_dir, self.cache_root, pod="decode-new",
                            pod_ip=NEW_POD_IP)  # fmt: skip
        if self.variant:
            apply_variant({role.name: role}, self.variant)
        install_gemm_warmup_plugin(role, self.work)
        if canary_seconds is not None:
            role.env[contract.ENV_CANARY_SECONDS] = canary_seconds
        return role


def vllm_url(role: Role, path: str = "/v1/completions") -> str:
    return f"http://{role.host}:{PORTS[role.name]['vllm']}{path}"


def references(model: str, decode: Role) -> list[tuple[list[int], dict[str, Any]]]:
    """TRAFFIC_LENGTHS prompts and their colocated answers on `decode` (greedy, logprobs): what P->D must match."""
    rng = random.Random(777)
    out = []
    for n in TRAFFIC_LENGTHS:
        ids = prompt(rng, n)
        out.append((ids, post(vllm_url(decode), completion(model, ids, TRAFFIC_TOKENS))[1]))
    return out


def judge(resp: dict[str, Any], ref: dict[str, Any], n: int) -> dict[str, Any]:
    """One P->D answer against its colocated reference: identical ids; else `close` (the runtime's output check:
    the logprob gap at the first divergent token within its bound, all finite) or DIFFERENT."""
    (got, lps), (want, _) = answer(resp), answer(ref)
    nonfinite = any(not math.isfinite(x) or x <= -9999 for x in lps)
    if got == want and got is not None and not nonfinite:
        return {"outcome": "identical"}
    gap = pair_verdict(resp, ref, n)["max_delta"]
    close = gap is not None and not nonfinite and gap <= paircheck.MAX_LOGPROB_DELTA_DEFAULT
    return {"outcome": "close" if close else "DIFFERENT", "gap": gap, "nonfinite": nonfinite, "got": got, "want": want}


def percentile(xs: list[float], q: float) -> float:
    """Nearest-rank percentile of sorted `xs`."""
    return xs[min(len(xs) - 1, max(0, math.ceil(q / 100 * len(xs)) - 1))]


def summarize(reqs: list[dict[str, Any]]) -> dict[str, Any]:
    """Outcome counts and the latency percentiles (s) of the answered requests."""
    counts: dict[str, int] = {}
    for r in reqs:
        counts[r["outcome"]] = counts.get(r["outcome"], 0) + 1
    out: dict[str, Any] = {"requests": len(reqs), "outcomes": counts}
    lat = sorted(r["s"] for r in reqs if r["outcome"] != "error" and "s" in r)
    if lat:
        out["latency_s"] = {"p50": percentile(lat, 50), "p90": percentile(lat, 90), "p99": percentile(lat, 99),
                            "max": lat[-1], "mean": round(statistics.fmean(lat), 4)}  # fmt: skip
    return out


class Traffic:
    """P->D traffic through a router (switchable: `route`), every answer judged against its colocated reference, by
    `width` concurrent senders (1 = one request at a time; the load phases set more), each request tagged with the
    phase it started in; /readyz of every watched pod polled, changes recorded."""

    def __init__(self, model: str, workers: int = LOAD_CONCURRENCY) -> None:
        self.model = model
        self.lock = threading.Lock()
        self.route_name, self.url = "", ""
        self.refs: list[tuple[list[int], dict[str, Any]]] = []
        self.phase, self.width = "idle", 0
        self.marks: list[tuple[float, str, int]] = []
        self.watched: dict[str, Role] = {}
        self.requests: list[dict[str, Any]] = []
        self.in_flight: dict[str, int] = {}
        self.readyz: dict[str, list[tuple[float, int, str]]] = {}
        self.t0 = time.perf_counter()
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self._send, args=(i,), daemon=True) for i in range(workers)]
        self.threads.append(threading.Thread(target=self._poll, daemon=True))

    def now(self) -> float:
        return round(time.perf_counter() - self.t0, 2)

    def route(self, name: str, url: str, refs: list[tuple[list[int], dict[str, Any]]]) -> None:
        with self.lock:
            self.route_name, self.url, self.refs = name, url, refs
            self.marks.append((self.now(), f"route {name}", self.width))

    def set_phase(self, phase: str, width: int = 1) -> None:
        with self.lock:
            self.phase, self.width = phase, width
            self.marks.append((self.now(), phase, width))

    def watch(self, role: Role) -> None:
        with self.lock:
            self.watched[role.name] = role
            self.readyz.setdefault(role.name, [])

    def drain(self, route: str, timeout: float = 10.0) -> float:
        """Wait until no request is in flight on `route` (after a switch away from it); returns the seconds waited."""
        t = time.perf_counter()
        while time.perf_counter() - t < timeout:
            with self.lock:
                if not self.in_flight.get(route):
                    break
            time.sleep(0.02)
        return round(time.perf_counter() - t, 2)

    def snapshot(self, phase: str | None = None) -> list[dict[str, Any]]:
        with self.lock:
            return [r for r in self.requests if phase is None or r["phase"] == phase]

    def _send(self, i: int) -> None:
        k = i
        while not self.stop.is_set():
            with self.lock:
                active = i < self.width and bool(self.url)
                url, refs, phase, route = self.url, self.refs, self.phase, self.route_name
                if active:
                    self.in_flight[route] = self.in_flight.get(route, 0) + 1
            if not active:
                self.stop.wait(0.05)
                continue
            ids, ref = refs[k % len(refs)]
            k += 1
            rec: dict[str, Any] = {"t": self.now(), "wall": round(time.time(), 3), "phase": phase, "router": route}
            try:
                dt, resp = post(url, completion(self.model, ids, TRAFFIC_TOKENS), timeout=30)
                rec.update({"s": round(dt, 4), **judge(resp, ref, len(ids))})
            except (urllib.error.URLError, OSError, ValueError, KeyError, IndexError, TypeError) as e:
                rec.update({"outcome": "error", "error": str(e)[:200]})
                self.stop.wait(0.5)
            with self.lock:
                self.requests.append(rec)
                self.in_flight[route] -= 1

    def _poll(self) -> None:
        while not self.stop.wait(0.5):
            with self.lock:
                watched = list(self.watched.items())
            for n, role in watched:
                record_readyz(self.readyz[n], self.now, role)

    def start(self) -> None:
        for t in self.threads:
            t.start()

    def finish(self) -> dict[str, Any]:
        self.stop.set()
        for t in self.threads:
            t.join(35)
        phases: dict[str, list[dict[str, Any]]] = {}
        for r in self.requests:
            phases.setdefault(r["phase"], []).append(r)
        # identical answers are counted, not kept one by one (the file stays small); the rest are kept whole
        kept = [r if r["outcome"] != "identical" else {k: r[k] for k in ("t", "phase", "router", "outcome", "s")}
                for r in self.requests]  # fmt: skip
        return {"by_phase": {p: summarize(rs) for p, rs in phases.items()}, "marks": self.marks,
                "readyz": self.readyz, "requests": kept}  # fmt: skip


def metric_sums(text: str, names: tuple[str, ...]) -> dict[str, float]:
    """Prometheus text -> `name{labels}` -> value for the series whose name starts with one of `names`."""
    out: dict[str, float] = {}
    for ln in text.splitlines():
        if ln.startswith(names):
            key, _, value = ln.rpartition(" ")
            try:
                out[key] = float(value)
            except ValueError:
                continue
    return out


def prefill_state(p: Role) -> dict[str, float]:
    """Prefill's KV usage and request gauges (vLLM /metrics): blocks held for a decode that never reads them stay
    counted until VLLM_NIXL_ABORT_REQUEST_TIMEOUT."""
    status, body = get(vllm_url(p, "/metrics"), 3.0)
    return metric_sums(body, PREFILL_GAUGES) if status == 200 else {"error": float(status)}


def canary_counts(d: Role) -> dict[str, float]:
    """decode's runtime metrics: hpd_runtime_canary_checks_total by result, the last success per peer."""
    status, body = get(f"http://{d.host}:{PORTS[d.name]['runtime']}{contract.PATH_METRICS}", 3.0)
    names = ("hpd_runtime_canary_checks_total", "hpd_runtime_canary_last_success_timestamp_seconds")
    return metric_sums(body, names) if status == 200 else {}


def log_scan(role: Role, since: int) -> dict[str, Any]:
    """vLLM's own error and NIXL/UCX lines in a role's log since `since` (the runtime's JSON lines and the access
    log left out), and the count of prefill's expired-KV-block warnings."""
    lines = [ln for ln in log_text(role, since).splitlines()
             if '"logger": "hpd_runtime"' not in ln and "POST /v1/completions" not in ln]  # fmt: skip
    errors = [ln[:300] for ln in lines if ERROR_PATTERN.search(ln)]
    nixl = [ln[:300] for ln in lines if NIXL_PATTERN.search(ln) and KV_XFER_LINE not in ln]
    return {"errors": len(errors), "nixl_lines": len(nixl), "expired_kv_block_warnings": sum(EXPIRED_KV in ln for ln in lines),
            "autotune_events": sum(AUTOTUNE_LINE in ln for ln in lines), "jit_monitor_lines": sum(JIT_LINE in ln for ln in lines),
            "error_lines": errors[:30], "nixl_line_samples": nixl[:30]}  # fmt: skip


def load_phase(traffic: Traffic, name: str, decode: Role, seconds: float, then: str) -> dict[str, Any]:
    """User P->D traffic at LOAD_CONCURRENCY for `seconds` on `decode` (through the current route): latency
    percentiles, and the same split by whether a request overlapped one of the decode's canary round trips (its
    `canary` log events: end time and duration); the canary's counter before and after."""
    before = canary_counts(decode)
    assert decode.log is not None
    offset = decode.log.stat().st_size
    w0 = time.time()
    traffic.set_phase(name, LOAD_CONCURRENCY)
    time.sleep(seconds)
    traffic.set_phase(then)
    w1 = time.time()
    time.sleep(1.0)  # the last requests of the phase finish
    after = canary_counts(decode)
    phase_log = log_text(decode, offset)
    events = [{k: e.get(k) for k in ("ts", "ok", "seconds", "summary")} for e in runtime_events(decode, "canary")]
    windows = [(e["ts"] - e["seconds"], e["ts"]) for e in events if e["ts"] and e["seconds"] is not None]
    reqs = [r for r in traffic.snapshot(name) if "s" in r]
    hit = [any(r["wall"] < b and r["wall"] + r["s"] > a for a, b in windows) for r in reqs]
    return {"decode": decode.name, "canary_seconds": decode.env.get(contract.ENV_CANARY_SECONDS),
            "seconds": seconds, "concurrency": LOAD_CONCURRENCY, "all": summarize(traffic.snapshot(name)),
            "overlapping_a_canary": summarize([r for r, h in zip(reqs, hit, strict=True) if h]),
            "not_overlapping": summarize([r for r, h in zip(reqs, hit, strict=True) if not h]),
            "canary_checks_before": before, "canary_checks_after": after,
            "canary_events_in_phase": [e for e in events if e["ts"] and w0 <= e["ts"] <= w1 + 1],
            "canary_events_total": len(events),
            "jit_lines_in_phase": [ln[:300] for ln in phase_log.splitlines() if JIT_LINE in ln][:20],
            "autotune_lines_in_phase": phase_log.count(AUTOTUNE_LINE)}  # fmt: skip


def role_times(role: Role) -> dict[str, float]:
    return {"to_health_s": round(role.t_health or -1, 1), "to_readyz_s": round(role.t_ready or -1, 1)}


def pair_checks(role: Role) -> list[dict[str, Any]]:
    return [
        {k: e.get(k) for k in ("ts", "ok", "summary", "prefill", "seconds")} for e in runtime_events(role, "pair_check")
    ]


def restart_decode(b: Bench, traffic: Traffic, d: Role) -> dict[str, Any]:
    """restart-decode: SIGTERM to decode's launcher (SIGKILL after the pod's grace, as the kubelet), started again
    at once with the same argv, env and cache; P->D through the router before (caller), while down and after."""
    p = b.roles["prefill"]
    res: dict[str, Any] = {"t_sigterm": traffic.now(), "prefill_before": prefill_state(p), "grace_s": b.grace()}
    traffic.set_phase("restart-down")
    res["t_ready"] = bounce_decode(b, traffic, d, res)
    traffic.set_phase("restart-after")
    time.sleep(b.after_s)
    return res | decode_after(b, d)


def bounce_decode(b: Bench, traffic: Traffic, d: Role, res: dict[str, Any]) -> float:
    """SIGTERM to decode's launcher (SIGKILL after the pod's grace, as the kubelet), started again at once with the
    same argv, env and cache, waited for Ready; records exit and prefill's state in `res`, returns the Ready time."""
    t = time.perf_counter()
    res["exit_code"] = stop_role(d, b.grace())
    res["exit_s"], res["t_gone"] = round(time.perf_counter() - t, 1), traffic.now()
    res["prefill_while_down"] = prefill_state(b.roles["prefill"])
    start_role(d, b.out, f"{b.cr}-decode-restarted", b.base_env)
    wait_ready({d.name: d}, b.until(BOOT_TIMEOUT_S))
    res["times"] = role_times(d)
    return traffic.now()


def decode_after(b: Bench, d: Role) -> dict[str, Any]:
    """What a decode restart leaves: prefill's state, the restarted decode's pair checks and its log."""
    return {"prefill_after": prefill_state(b.roles["prefill"]), "pair_checks": pair_checks(d),
            "decode_log": log_scan(d, 0)}  # fmt: skip


def replace_decode(b: Bench, traffic: Traffic, old: Role, new: Role, router: Router) -> dict[str, Any]:
    """replace-decode: the new pod (started by the caller) Ready, a new router pointed at it (the bench's routers
    have static URLs), the traffic moved to it, then the old decode pod terminated (it departs); P->D after."""
    p = b.roles["prefill"]
    side = f"{new.env.get(contract.ENV_VLLM_NIXL_SIDE_CHANNEL_HOST)}:{new.env.get(contract.ENV_VLLM_NIXL_SIDE_CHANNEL_PORT)}"
    res: dict[str, Any] = {"new_pod_ip": new.host, "new_side_channel": side, "new_ports": PORTS[new.name]}
    wait_ready({new.name: new}, b.until(BOOT_TIMEOUT_S))
    res["t_new_ready"], res["new_times"] = traffic.now(), role_times(new)
    refs = references(b.served, new)
    res["new_colocated_equals_old"] = [answer(r)[0] for _, r in refs] == [answer(r)[0] for _, r in traffic.refs]
    router2 = Router(b.out, f"{b.cr}-new-decode", b.base_env, decode=new, ports=("http2", "metrics2"))
    b.routers.append(router2)
    traffic.route("router-2", router2.url, refs)
    traffic.set_phase("replace-switched")
    res["t_switched"] = traffic.now()
    res["drained_old_route_s"] = traffic.drain("router-1")  # the requests already sent to the old pod finish first
    t = time.perf_counter()
    res["old_exit_code"] = stop_role(old, b.grace())
    res["old_exit_s"], res["t_old_gone"] = round(time.perf_counter() - t, 1), traffic.now()
    router.stop()
    traffic.set_phase("replace-after")
    time.sleep(b.after_s)
    res["prefill_after"] = prefill_state(p)
    res["pair_checks"] = pair_checks(new)
    res["new_decode_log"] = log_scan(new, 0)
    return res


def restart_with_canary_off(b: Bench, traffic: Traffic, d: Role) -> None:
    """The canary step without a replacement pod: the same decode restarted with HPD_CANARY_SECONDS=0."""
    d.env[contract.ENV_CANARY_SECONDS] = "0"
    traffic.set_phase("canary-restart")
    stop_role(d, b.grace())
    start_role(d, b.out, f"{b.cr}-decode-canary-off", b.base_env)
    wait_ready({d.name: d}, b.until(BOOT_TIMEOUT_S))


def decode_lifecycle(b: Bench, steps: list[str], router: Router) -> dict[str, Any]:
    """restart-decode, replace-decode and canary on one running pair (see the module doc for the order)."""
    p, a = b.roles["prefill"], b.roles["decode"]
    assert p.log is not None
    p_offset = p.log.stat().st_size
    traffic = Traffic(b.served)
    traffic.watch(p)
    traffic.watch(a)
    traffic.route("router-1", router.url, references(b.served, a))
    traffic.start()
    res: dict[str, Any] = {"prefill_at_start": prefill_state(p)}
    try:
        if "canary" in steps:
            res["canary_on"] = load_phase(traffic, "canary-on", a, b.load_s, then="before")
        new = None
        if "replace-decode" in steps:
            new = b.new_decode("0" if "canary" in steps else None)
            b.roles[new.name] = new
            res["new_decode_argv"], res["new_decode_env"] = new.argv, new.env
            start_role(new, b.out, b.cr, b.base_env)
            traffic.watch(new)
        traffic.set_phase("restart-before" if "restart-decode" in steps else "before")
        if "restart-decode" in steps:
            t = time.perf_counter()
            if new is not None:  # vLLM's memory profiler fails if another process frees GPU memory meanwhile
                wait_kv_allocated(new, b.until(BOOT_TIMEOUT_S))
            time.sleep(max(0.0, BEFORE_S - (time.perf_counter() - t)))
            res["restart_decode"] = restart_decode(b, traffic, a)
        if new is not None:
            res["replace_decode"] = replace_decode(b, traffic, a, new, router)
        elif "canary" in steps:
            restart_with_canary_off(b, traffic, a)
        if "canary" in steps:
            off = new if new is not None else a
            res["canary_off"] = load_phase(traffic, "canary-off", off, b.load_s, then="end")
    finally:
        res["traffic"] = traffic.finish()
        res["prefill_log"] = log_scan(p, p_offset)
        res["prefill_at_end"] = prefill_state(p)
        res["summary"] = decode_summary(res)
    return res


def decode_summary(res: dict[str, Any]) -> dict[str, Any]:
    """The few figures of decode_lifecycle's result a reader needs first (printed by main and gpu-burst.sh)."""
    out: dict[str, Any] = {"by_phase": {p: {"outcomes": s["outcomes"], "p50_s": (s.get("latency_s") or {}).get("p50")}
                                        for p, s in res["traffic"]["by_phase"].items()}}  # fmt: skip
    out["prefill_log"] = {k: res["prefill_log"][k] for k in ("errors", "nixl_lines", "expired_kv_block_warnings",
                                                             "autotune_events", "jit_monitor_lines")}  # fmt: skip
    for key in ("restart_decode", "replace_decode"):
        r = res.get(key) or {}
        out[key] = {k: r.get(k) for k in ("exit_code", "exit_s", "t_sigterm", "t_gone", "t_ready", "times",
                                          "t_new_ready", "new_times", "old_exit_code", "old_exit_s",
                                          "new_colocated_equals_old") if k in r}  # fmt: skip
        out[key]["pair_checks_ok"] = [c.get("ok") for c in r.get("pair_checks", [])]
    for key in ("canary_on", "canary_off"):
        c = res.get(key)
        if c:
            out[key] = {"canary_seconds": c["canary_seconds"], "latency_s": c["all"].get("latency_s"),
                        "outcomes": c["all"]["outcomes"], "canaries_in_phase": len(c["canary_events_in_phase"]),
                        "overlapping_p50": (c["overlapping_a_canary"].get("latency_s") or {}).get("p50"),
                        "not_overlapping_p50": (c["not_overlapping"].get("latency_s") or {}).get("p50"),
                        "checks_after": c["canary_checks_after"]}  # fmt: skip
    return out


# --- issue #38: the decode restart with the operator's degraded mode; prefill's orphaned KV -------------------------
FALLBACK_STEPS = ("fallback", "orphans")
FALLBACK_CONCURRENCY = 2
"""Senders in the fallback step (one request at a time each; two so a request is nearly always in flight)."""
FOLLOW_PERIOD_S = 0.25
"""How often the bench re-evaluates the operator's decision from each pod's /readyz (the kubelet probes every
periodSeconds, the operator reconciles on the pod's change: the bench's switch is the decision's own latency)."""
ORPHANS = 16
ORPHAN_TOKENS = 3000
ORPHAN_OBSERVE_S = 75.0
"""How long the orphans step waits, at most, for prefill to release the blocks of requests no decode reads."""


def gauge(sums: dict[str, float], name: str) -> float | None:
    vals = [v for k, v in sums.items() if k.startswith(name)]
    return round(sum(vals), 7) if vals else None


class KvSampler:
    """Prefill's KV usage and request gauges every second (vLLM 0.20: vllm:kv_cache_usage_perc, a fraction)."""

    def __init__(self, prefill: Role, t0: float) -> None:
        self.prefill, self.t0 = prefill, t0
        self.samples: list[tuple[float, float | None, float | None, float | None]] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.stop.is_set():
            t = time.perf_counter()
            s = prefill_state(self.prefill)

            self.samples.append((round(t - self.t0, 2), gauge(s, "vllm:kv_cache_usage_perc"),
                                 gauge(s, "vllm:num_requests_running"), gauge(s, "vllm:num_requests_waiting")))  # fmt: skip
            self.stop.wait(max(0.0, 1.0 - (time.perf_counter() - t)))

    def finish(self) -> list[tuple[float, float | None, float | None, float | None]]:
        self.stop.set()
        self.thread.join(5)
        return self.samples


def mirror_decide(ready: dict[str, bool]) -> str:
    """Only if the operator cannot be imported on the device (recorded): fallback.choose's rule for one generation."""
    for role, missing in (("prefill", "decode"), ("decode", "prefill")):
        if ready.get(role) and not ready.get(missing):
            return role
    return "router"


def make_decider(cr: str) -> tuple[Callable[[dict[str, bool]], str], str]:
    try:
        import degraded  # bench/gpu/degraded.py: the operator's own hpd_operator.builders.fallback.choose

        d = degraded.Decider(cr)
        return d.decide, d.source
    except Exception as exc:
        return mirror_decide, f"MIRROR (operator import failed: {type(exc).__name__}: {exc})"


def released_at(samples: list[tuple[float, Any, Any, Any]], t_from: float, level: float) -> float | None:
    """The first sample time after `t_from` at which prefill's KV usage is back at or below `level`."""
    for t, usage, *_ in samples:
        if t > t_from and usage is not None and usage <= level:
            return t
    return None


def expired_lines(role: Role, since: int = 0) -> list[str]:
    return [ln[:200] for ln in log_text(role, since).splitlines() if EXPIRED_KV in ln]


def orphan_requests(b: Bench, n: int = ORPHANS) -> dict[str, Any]:
    """What vllm-router sends prefill for a P->D request (kv_transfer_params do_remote_decode), with no decode ever
    reading the blocks: the requests of a decode that died after the router chose it. Returns what prefill answered."""
    p = b.roles["prefill"]
    rng = random.Random(3838)
    params = {"do_remote_decode": True, "do_remote_prefill": False, "remote_engine_id": None,
              "remote_block_ids": None, "remote_host": None, "remote_port": None}  # fmt: skip
    answered, errors, blocks = 0, [], 0
    for _ in range(n):
        body = {**completion(b.served, prompt(rng, ORPHAN_TOKENS), 1), "kv_transfer_params": params}
        try:
            _, resp = post(vllm_url(p), body, timeout=60)
            answered += 1
            blocks += len(((resp.get("kv_transfer_params") or {}).get("remote_block_ids") or [[]])[0] or [])
        except Exception as exc:
            errors.append(f"{type(exc).__name__}: {exc}"[:200])
    return {"sent": n, "tokens_each": ORPHAN_TOKENS, "answered": answered, "errors": errors,
            "blocks_in_first_group": blocks}  # fmt: skip


def orphans_step(b: Bench, sampler: KvSampler) -> dict[str, Any]:
    """Prefill holds the KV of requests no decode reads (VLLM_NIXL_ABORT_REQUEST_TIMEOUT on 0.20): ORPHANS such
    requests, then prefill's KV usage every second until it is back at its level before them (or ORPHAN_OBSERVE_S;
    with the default 480 s the rest of the run keeps sampling: `held_at_least_s`)."""
    p = b.roles["prefill"]
    assert p.log is not None
    offset = p.log.stat().st_size
    time.sleep(1.5)
    base = [u for t, u, *_ in sampler.samples[-2:] if u is not None]
    level = max(base) if base else 0.0
    t_sent = round(time.perf_counter() - sampler.t0, 2)
    res: dict[str, Any] = {"abort_timeout_env": p.env.get("VLLM_NIXL_ABORT_REQUEST_TIMEOUT", "unset (480 s)"),
                           "usage_before": level, "t_sent": t_sent, **orphan_requests(b)}  # fmt: skip
    res["t_answered"] = round(time.perf_counter() - sampler.t0, 2)
    time.sleep(1.5)
    res["usage_after"] = sampler.samples[-1][1] if sampler.samples else None
    timeout = float(p.env.get("VLLM_NIXL_ABORT_REQUEST_TIMEOUT", "480"))
    # a timeout past the window: no wait here, the sampler runs on through the next steps up to the teardown
    until = b.until(ORPHAN_OBSERVE_S) if timeout + 15 <= ORPHAN_OBSERVE_S else time.perf_counter()
    while time.perf_counter() < until:
        if released_at(sampler.samples, res["t_answered"], level + 1e-6) is not None:
            break
        time.sleep(1.0)
    res["level"] = level
    res["expired_lines"] = expired_lines(p, offset)[:5]
    res["expired_count"] = len(expired_lines(p, offset))
    return res


def orphans_summary(res: dict[str, Any], samples: list[tuple[float, Any, Any, Any]]) -> dict[str, Any]:
    t = released_at(samples, res["t_answered"], res["level"] + 1e-6)
    last = samples[-1][0] if samples else res["t_answered"]
    return {"usage_before": res["level"], "usage_after": res.get("usage_after"),
            "released_s_after_answered": round(t - res["t_answered"], 1) if t is not None else None,
            "held_at_least_s": None if t is not None else round(last - res["t_answered"], 1),
            "expired_count": res.get("expired_count"), "abort_timeout_env": res["abort_timeout_env"]}  # fmt: skip


def fallback_step(b: Bench, router: Router, sampler: KvSampler) -> dict[str, Any]:
    """restart-decode (SIGTERM to decode's launcher, started again at once) with the traffic following the
    operator's degraded-mode decision (make_decider): the router while both roles are Ready, prefill's vLLM directly
    while decode is not Ready, the router again once decode is Ready (its pair check passed). Requests are tagged
    with the phase they started in: before, down (SIGTERM until the switch), degraded (on prefill), after (the
    router again). Decode's /readyz is what decides: a container restart leaves the pod in place (no
    deletionTimestamp), so the kubelet's readiness probe is what the operator sees."""
    p, d = b.roles["prefill"], b.roles["decode"]
    decide, source = make_decider(b.cr)
    refs_d, refs_p = references(b.served, d), references(b.served, p)
    res: dict[str, Any] = {"decision": source, "concurrency": FALLBACK_CONCURRENCY,
                           "prefill_colocated_equals_decode_colocated":
                               [answer(r)[0] for _, r in refs_p] == [answer(r)[0] for _, r in refs_d]}  # fmt: skip
    traffic = Traffic(b.served, workers=FALLBACK_CONCURRENCY)
    traffic.t0 = sampler.t0
    traffic.watch(p)
    traffic.watch(d)
    targets = {"router": (router.url, refs_d), "prefill": (vllm_url(p), refs_p), "decode": (vllm_url(d), refs_d)}
    traffic.route("router", *targets["router"])
    switches: list[dict[str, Any]] = []
    state = {"current": "router", "down": False}
    stop = threading.Event()

    def follow() -> None:
        while not stop.is_set():
            ready = {"prefill": get(readyz_url(p), 1.0)[0] == 200, "decode": get(readyz_url(d), 1.0)[0] == 200}
            want = decide(ready)
            if want != state["current"]:
                traffic.route(want, *targets[want])
                if want == "router" and state["down"]:
                    traffic.set_phase("after", FALLBACK_CONCURRENCY)
                elif want != "router":
                    traffic.set_phase("degraded", FALLBACK_CONCURRENCY)
                switches.append({"t": traffic.now(), "to": want, "ready": ready})
                state["current"] = want
            stop.wait(FOLLOW_PERIOD_S)

    follower = threading.Thread(target=follow, daemon=True)
    traffic.start()
    traffic.set_phase("before", FALLBACK_CONCURRENCY)
    follower.start()
    try:
        time.sleep(BEFORE_S * 2)
        res["prefill_before"] = prefill_state(p)
        traffic.set_phase("down", FALLBACK_CONCURRENCY)
        state["down"] = True
        res["t_sigterm"] = traffic.now()
        res["t_decode_ready"] = bounce_decode(b, traffic, d, res)
        t_back = time.perf_counter()
        while state["current"] != "router" and time.perf_counter() - t_back < 10:
            time.sleep(0.05)
        time.sleep(b.after_s)
    except Exception as exc:  # e.g. the decode back after the deadline: the phases measured so far are kept
        res["error"] = f"{type(exc).__name__}: {exc}"
    finally:
        stop.set()
        follower.join(5)
        res["traffic"] = traffic.finish()
    res["switches"] = switches
    return res if "error" in res else res | decode_after(b, d)


def fallback_summary(res: dict[str, Any]) -> dict[str, Any]:
    by = res["traffic"]["by_phase"]
    first_readyz_fail = next((t for t, s, _ in res["traffic"]["readyz"].get("decode", [])
                              if s != 200 and t >= res.get("t_sigterm", 0)), None)  # fmt: skip
    sw = res.get("switches", [])
    to_p = next((s["t"] for s in sw if s["to"] != "router"), None)
    back = next((s["t"] for s in sw if s["to"] == "router" and to_p is not None and s["t"] > to_p), None)
    failed = {ph: (s["outcomes"].get("error", 0), s["requests"]) for ph, s in by.items()}
    return {"decision": res["decision"], "failed_of_requests_by_phase": failed,
            "outcomes_by_phase": {ph: s["outcomes"] for ph, s in by.items()},
            "t_sigterm": res.get("t_sigterm"), "t_decode_readyz_failed": first_readyz_fail,
            "t_switch_to_prefill": to_p, "switch_after_sigterm_s": round(to_p - res["t_sigterm"], 2) if to_p else None,
            "t_decode_gone": res.get("t_gone"), "exit_s": res.get("exit_s"), "t_decode_ready": res.get("t_decode_ready"),
            "t_switch_back": back,
            "switch_back_after_decode_ready_s": round(back - res["t_decode_ready"], 2) if back and res.get("t_decode_ready") else None,
            "pair_checks_ok": [c.get("ok") for c in res.get("pair_checks", [])]}  # fmt: skip


# --- issue #43: the rate under load, time to first token, the random-length sweep (8B geometry) ---------------------
EXTRA_STEPS = ("load", "ttft", "ttft-parts", "sweep")
LOAD_LEVELS = (1, 4)
LOAD_STEP_S = 15.0
LOAD_PROMPT_TOKENS = 4000
LOAD_OUT_TOKENS = 2
TTFT_LENGTHS = (2000, 4000, 8000)
TTFT_STEADY = 3
SWEEP_N = 40
SWEEP_SEED = 4343
SWEEP_STEADY = 2


def decode_nixl(d: Role) -> dict[str, float]:
    status, body = get(vllm_url(d, "/metrics"), 5.0)
    return nixl_metric_sums(body) if status == 200 else {}


def load_sender(
    b: Bench, router: Router, seed: int, *, stop: threading.Event, lock: threading.Lock, lat: list[float],
    errors: list[str],
) -> None:  # fmt: skip
    rng = random.Random(seed)
    while not stop.is_set():
        try:
            dt, _ = post(router.url, completion(b.served, prompt(rng, LOAD_PROMPT_TOKENS), LOAD_OUT_TOKENS), 60)
            with lock:
                lat.append(dt)
        except Exception as exc:
            with lock:
                errors.append(f"{type(exc).__name__}: {exc}"[:160])
            stop.wait(0.2)


def load_step(b: Bench, router: Router) -> dict[str, Any]:
    """P->D through the router at each of LOAD_LEVELS concurrent senders for LOAD_STEP_S, LOAD_PROMPT_TOKENS-token
    prompts (distinct, no prefix caching), LOAD_OUT_TOKENS out: decode's own NIXL figures over each level (the
    transfers between two scrapes of its /metrics) and the requests' latency."""
    d = b.roles["decode"]
    out: dict[str, Any] = {"prompt_tokens": LOAD_PROMPT_TOKENS, "max_tokens": LOAD_OUT_TOKENS, "seconds": LOAD_STEP_S}
    for c in LOAD_LEVELS:
        if time.perf_counter() + LOAD_STEP_S + 20 > b.deadline:
            out[f"c{c}"] = {"skipped": "deadline"}
            continue
        lat: list[float] = []
        errors: list[str] = []
        stop = threading.Event()
        lock = threading.Lock()
        before = decode_nixl(d)
        t = time.perf_counter()
        threads = [threading.Thread(target=load_sender, args=(b, router, 1000 * c + i),
                                    kwargs={"stop": stop, "lock": lock, "lat": lat, "errors": errors}, daemon=True) for i in range(c)]  # fmt: skip
        for th in threads:
            th.start()
        time.sleep(LOAD_STEP_S)
        stop.set()
        for th in threads:
            th.join(60)
        wall = time.perf_counter() - t
        after = decode_nixl(d)
        fig = nixl_delta(before, after)
        moved = after.get("vllm:nixl_bytes_transferred_sum", 0.0) - before.get("vllm:nixl_bytes_transferred_sum", 0.0)
        lat.sort()
        out[f"c{c}"] = {"nixl": fig, "aggregate_gbps_over_wall": round(moved / wall / 1e9, 4), "wall_s": round(wall, 2),
                        "requests": len(lat), "errors": len(errors), "error_samples": errors[:3],
                        "latency_s": {"p50": percentile(lat, 50), "p90": percentile(lat, 90), "p99": percentile(lat, 99),
                                      "max": lat[-1]} if lat else None}  # fmt: skip
    c1, c4 = (out.get("c1") or {}).get("nixl", {}), (out.get("c4") or {}).get("nixl", {})
    if c1.get("gbps") and c4.get("gbps"):
        out["c4_of_c1"] = round(c4["gbps"] / c1["gbps"], 3)
    return out


def timed(url: str, model: str, ids: list[int]) -> float:
    return round(post(url, completion(model, ids, 1), timeout=120)[0], 4)


def ttft_step(b: Bench, router: Router) -> dict[str, Any]:
    """Time to first token (a 1-token request: prefill, the transfer and decode's first step) P->D through the router
    against colocated on decode, at TTFT_LENGTHS: the first request at the length and the median of TTFT_STEADY more
    (fresh prompts: prefix caching is off in P/D)."""
    rng = random.Random(2468)
    out: dict[str, Any] = {"steady_samples": TTFT_STEADY}
    for n in TTFT_LENGTHS:
        row: dict[str, Any] = {}
        for path, url in (("pd", router.url), ("colocated", vllm_url(b.roles["decode"]))):
            xs = [timed(url, b.served, prompt(rng, n)) for _ in range(1 + TTFT_STEADY)]
            row[path] = {"first_s": xs[0], "steady_median_s": statistics.median(xs[1:]), "all_s": xs}
        row["pd_over_colocated_steady"] = round(row["pd"]["steady_median_s"] / row["colocated"]["steady_median_s"], 3)
        row["pd_over_colocated_first"] = round(row["pd"]["first_s"] / row["colocated"]["first_s"], 3)
        out[str(n)] = row
    return out


PARTS_LENGTHS = (2000, 4000, 8000)
PARTS_SAMPLES = 5
PARTS_LEVELS = (1, 4, 16)
"""Requests in flight at which `ttft-parts` measures (--parts-levels): 1 is the step as first written (one request at
a time, results at the top level keyed by length), every other level goes under `under_load` (version 2)."""
PARTS_LOAD_SAMPLES = 4
"""Measured requests per path and length at a level above 1: one round each, medians over the rounds."""
PARTS_PATHS = ("router", "split", "colocated_decode", "colocated_prefill")
PARTS_LOAD_PATHS = ("router", "colocated_decode", "split", "colocated_prefill")
"""Under load the paths run one after another (each with its own background), the excess over colocated first."""
PARTS_STACK = ("prefill_queue", "prefill_compute", "descriptor_post", "transfer", "decode_wait", "decode_step",
               "engine_handoff", "router_http")  # fmt: skip
"""P->D's time to first token through the router as stacked components (`parts_of`, key `stack`), from the router
path's own figures: its HTTP time and both engines' histograms over it."""
SERVER_HISTOGRAMS = ("vllm:time_to_first_token_seconds", "vllm:e2e_request_latency_seconds",
                     "vllm:request_queue_time_seconds", "vllm:request_prefill_time_seconds",
                     "vllm:nixl_xfer_time_seconds", "vllm:nixl_post_time_seconds")  # fmt: skip
"""vLLM's per-request histograms (0.20 names): their `_sum`/`_count` deltas over one request are that request's
server-side times (TTFT, arrival to finish, waiting, scheduled to first token) and decode's transfer and post time."""


def histogram_sums(role: Role) -> dict[str, float]:
    """`name_sum` and `name_count` of SERVER_HISTOGRAMS on one engine's /metrics, summed over label sets."""
    status, body = get(vllm_url(role, "/metrics"), 5.0)
    out: dict[str, float] = {}
    if status != 200:
        return out
    for ln in body.splitlines():
        if not ln.startswith(SERVER_HISTOGRAMS):
            continue
        m = re.match(r"([A-Za-z_:][A-Za-z0-9_:]*)(\{[^}]*\})?\s+([^\s]+)", ln)
        if m and m.group(1).endswith(("_sum", "_count")):
            out[m.group(1)] = out.get(m.group(1), 0.0) + float(m.group(3))
    return out


def per_request_ms(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """The mean of each histogram over the requests between two scrapes, in ms (histograms with no new sample left
    out)."""
    out: dict[str, float] = {}
    for name in SERVER_HISTOGRAMS:
        n = after.get(name + "_count", 0.0) - before.get(name + "_count", 0.0)
        if n > 0:
            short = name.removeprefix("vllm:").removesuffix("_seconds")
            out[short] = round((after.get(name + "_sum", 0.0) - before.get(name + "_sum", 0.0)) / n * 1e3, 3)
    return out


def window_requests(before: dict[str, float], after: dict[str, float]) -> int:
    """How many requests an engine finished between two scrapes (its TTFT count; 1-token requests): under load the
    histograms' means over a measured request's window average over these, all of the measured request's kind."""
    name = "vllm:time_to_first_token_seconds_count"
    return int(after.get(name, 0.0) - before.get(name, 0.0))


def split_pd(b: Bench, ids: list[int], *, scrape: bool = True, window: bool = False) -> dict[str, Any]:
    """One P->D request sent as vllm-router sends it, without the router: prefill with `do_remote_decode`, then decode
    with the kv_transfer_params prefill answered (one request id for both), each HTTP call timed, and each engine's
    histograms over it (`scrape`; off for a background request; `window`: also how many requests each engine
    finished meanwhile)."""
    p, d = b.roles["prefill"], b.roles["decode"]
    rid = str(uuid.uuid4())
    params = {"do_remote_decode": True, "do_remote_prefill": False, "remote_engine_id": None,
              "remote_block_ids": None, "remote_host": None, "remote_port": None}  # fmt: skip
    hp0, hd0 = (histogram_sums(p), histogram_sums(d)) if scrape else ({}, {})
    t_p, resp_p = post(vllm_url(p), {**completion(b.served, ids, 1), "kv_transfer_params": params}, 120, rid)
    hp1 = histogram_sums(p) if scrape else {}
    kv = resp_p.get("kv_transfer_params")
    t_d, _ = post(vllm_url(d), {**completion(b.served, ids, 1), "kv_transfer_params": kv}, 120, rid)
    hd1 = histogram_sums(d) if scrape else {}
    out = {"prefill_http_ms": round(t_p * 1e3, 3), "decode_http_ms": round(t_d * 1e3, 3),
           "sum_http_ms": round((t_p + t_d) * 1e3, 3), "prefill_server": per_request_ms(hp0, hp1),
           "decode_server": per_request_ms(hd0, hd1), "kv_params_returned": kv is not None}  # fmt: skip
    if window:
        out["window_requests"] = {"prefill": window_requests(hp0, hp1), "decode": window_requests(hd0, hd1)}
    return out


def timed_with_server(b: Bench, url: str, ids: list[int], *, window: bool = False) -> dict[str, Any]:
    """One 1-token request to `url`, timed, with both engines' histograms over it (`window`: and how many requests
    each engine finished meanwhile)."""
    p, d = b.roles["prefill"], b.roles["decode"]
    hp0, hd0 = histogram_sums(p), histogram_sums(d)
    t, _ = post(url, completion(b.served, ids, 1), 120)
    hp1, hd1 = histogram_sums(p), histogram_sums(d)
    out = {"http_ms": round(t * 1e3, 3), "prefill_server": per_request_ms(hp0, hp1),
           "decode_server": per_request_ms(hd0, hd1)}  # fmt: skip
    if window:
        out["window_requests"] = {"prefill": window_requests(hp0, hp1), "decode": window_requests(hd0, hd1)}
    return out


def _median_tree(xs: list[dict[str, Any]]) -> dict[str, Any]:
    """The per-key median of a list of (nested) dicts of numbers (a key missing from some dicts: over those that
    have it)."""
    out: dict[str, Any] = {}
    for k in dict.fromkeys(k for x in xs for k in x):
        vals = [x[k] for x in xs if k in x]
        if isinstance(vals[0], dict):
            out[k] = _median_tree(vals)
        elif isinstance(vals[0], (int, float)) and not isinstance(vals[0], bool):
            out[k] = round(statistics.median(vals), 3)
    return out


def _sub(a: float | None, *bs: float | None) -> float | None:
    return None if a is None or any(b is None for b in bs) else round(a - sum(b for b in bs if b is not None), 3)


def _add(*xs: float | None) -> float | None:
    return None if any(x is None for x in xs) else round(sum(x for x in xs if x is not None), 3)


def parts_of(med: dict[str, Any]) -> dict[str, Any]:
    """What the medians of each path say, in ms. The keys of the first version (router total, colocated on decode,
    the excess, the bench's own two hops, decode's NIXL transfer and post, the router's own cost as router total minus
    the two hops) and, from the split path's engine histograms, each engine's queue and its own step (decode's queue
    holds the wait for the KV: vLLM 0.20 schedules a request whose KV loads asynchronously only once the load is
    done). `stack`: the router path's own time to first token as PARTS_STACK, from its HTTP time and both engines'
    histograms over it: prefill's queue and compute (scheduled to first token), decode's NIXL post and the rest of
    its transfer (NIXL's xferDuration counts from the post to the status check that saw it done), decode's wait
    outside the transfer (its queue minus the transfer), decode's own step, both engines' handoff (each engine's
    arrival-to-finish minus its queue and scheduled-to-first-token: from the API server's arrival stamp to the
    scheduler's queue, which an engine core enters only between two steps, and the token's way back), and what is
    left of the HTTP time (the router, both HTTP hops and the API servers' parsing before the arrival stamp). A path
    that did not run leaves its figures None."""
    r, s = med.get("router") or {}, med.get("split") or {}
    cd, cp = med.get("colocated_decode") or {}, med.get("colocated_prefill") or {}
    sp, sd = s.get("prefill_server") or {}, s.get("decode_server") or {}
    rp, rd = r.get("prefill_server") or {}, r.get("decode_server") or {}
    xfer = sd.get("nixl_xfer_time")
    parts: dict[str, Any] = {
        "router_total_ms": r.get("http_ms"), "colocated_decode_ms": cd.get("http_ms"),
        "pd_minus_colocated_ms": _sub(r.get("http_ms"), cd.get("http_ms")),
        "prefill_hop_ms": s.get("prefill_http_ms"), "decode_hop_ms": s.get("decode_http_ms"),
        "nixl_xfer_ms": xfer, "nixl_post_ms": sd.get("nixl_post_time"),
        "decode_hop_minus_xfer_ms": _sub(s.get("decode_http_ms"), xfer),
        "router_overhead_ms": _sub(r.get("http_ms"), s.get("sum_http_ms")),
        "colocated_prefill_ms": cp.get("http_ms"),
        "prefill_queue_ms": sp.get("request_queue_time"), "prefill_compute_ms": sp.get("request_prefill_time"),
        "decode_queue_ms": sd.get("request_queue_time"), "decode_step_ms": sd.get("request_prefill_time"),
        "colocated_decode_queue_ms": (cd.get("decode_server") or {}).get("request_queue_time"),
        "colocated_decode_compute_ms": (cd.get("decode_server") or {}).get("request_prefill_time"),
    }  # fmt: skip
    stack = {
        "prefill_queue": rp.get("request_queue_time"), "prefill_compute": rp.get("request_prefill_time"),
        "descriptor_post": rd.get("nixl_post_time"), "transfer": _sub(rd.get("nixl_xfer_time"), rd.get("nixl_post_time")),
        "decode_wait": _sub(rd.get("request_queue_time"), rd.get("nixl_xfer_time")),
        "decode_step": rd.get("request_prefill_time"),
        "engine_handoff": _sub(
            _add(rp.get("e2e_request_latency"), rd.get("e2e_request_latency")),
            rp.get("request_queue_time"), rp.get("request_prefill_time"),
            rd.get("request_queue_time"), rd.get("request_prefill_time"),
        ),
        "router_http": _sub(r.get("http_ms"), rp.get("e2e_request_latency"), rd.get("e2e_request_latency")),
    }  # fmt: skip
    parts["stack"] = stack
    return parts


def parts_estimate_s(b: Bench, n: int, c: int, c1: dict[str, Any]) -> float:
    """A generous guess of one path's time at `c` in flight and `n` tokens under load (warm-in, the rounds, the
    drain): the one-at-a-time router time at `n` (measured at level 1, else 30 ms + 28 us a token) times `c`."""
    one = ((c1.get(str(n)) or {}).get("parts") or {}).get("router_total_ms")
    t1 = one / 1e3 if one else 0.03 + 28e-6 * n
    return (PARTS_LOAD_SAMPLES + 2) * c * t1 + 5


class PartsBackground:
    """`c - 1` senders of one path (one request of the same kind each, a new one as soon as the last is answered), so
    that the measured request is one of `c` in flight; each sender its own seeded prompts."""

    def __init__(self, send: Callable[[list[int]], Any], n: int, c: int, seed: int) -> None:
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.done = 0
        self.errors: list[str] = []
        self.threads = [threading.Thread(target=self._run, args=(send, n, random.Random(seed + i)), daemon=True)
                        for i in range(c - 1)]  # fmt: skip
        for t in self.threads:
            t.start()

    def _run(self, send: Callable[[list[int]], Any], n: int, rng: random.Random) -> None:
        while not self.stop.is_set():
            ids = prompt(rng, n)
            try:
                send(ids)
                with self.lock:
                    self.done += 1
            except Exception as exc:
                with self.lock:
                    self.errors.append(f"{type(exc).__name__}: {exc}"[:160])
                self.stop.wait(0.2)

    def wait_done(self, k: int, until: float) -> None:
        while time.perf_counter() < until and not self.stop.is_set():
            with self.lock:
                if self.done >= k:
                    return
            time.sleep(0.02)

    def close(self, timeout: float = 130.0) -> dict[str, Any]:
        self.stop.set()
        for t in self.threads:
            t.join(timeout)
        return {"senders": len(self.threads), "requests": self.done + len(self.errors), "errors": len(self.errors),
                "error_samples": self.errors[:3]}  # fmt: skip


def parts_under_load(
    b: Bench, router: Router, n: int, c: int, rng: random.Random, c1: dict[str, Any]
) -> dict[str, Any]:
    """The PARTS_LOAD_PATHS at `n` tokens with `c` requests in flight: per path, c - 1 background senders of that path
    (PartsBackground), a warm-in until they have answered c - 1 requests, then PARTS_LOAD_SAMPLES measured requests
    one after another (each with both engines' histograms over it: their means over every request finished meanwhile,
    all of the measured request's kind, and how many: `window_requests`), then the background drained before the next
    path. A path whose guessed time (parts_estimate_s) no longer fits before the deadline is skipped."""
    p, d = b.roles["prefill"], b.roles["decode"]
    urls = {"router": router.url, "colocated_decode": vllm_url(d), "colocated_prefill": vllm_url(p)}
    rows: dict[str, list[dict[str, Any]]] = {}
    background: dict[str, Any] = {}
    errors: dict[str, list[str]] = {}
    skipped: list[str] = []
    for k, path in enumerate(PARTS_LOAD_PATHS):
        if time.perf_counter() + parts_estimate_s(b, n, c, c1) > b.deadline:
            skipped.append(path)
            continue

        def send(ids: list[int], path: str = path) -> Any:
            return (
                split_pd(b, ids, scrape=False)
                if path == "split"
                else post(urls[path], completion(b.served, ids, 1), 120)
            )

        t0 = time.perf_counter()
        bg = PartsBackground(send, n, c, seed=100_000 * c + 10_000 * k + n)
        bg.wait_done(c - 1, min(time.perf_counter() + 120, b.deadline))
        warm_s = time.perf_counter() - t0
        got: list[dict[str, Any]] = []
        errs: list[str] = []
        for _ in range(PARTS_LOAD_SAMPLES):
            if time.perf_counter() + 5 > b.deadline:
                break
            ids = prompt(rng, n)
            try:
                got.append(split_pd(b, ids, window=True) if path == "split"
                           else timed_with_server(b, urls[path], ids, window=True))  # fmt: skip
            except Exception as exc:
                errs.append(f"{type(exc).__name__}: {exc}"[:160])
        background[path] = {**bg.close(), "warm_in_s": round(warm_s, 2),
                            "path_s": round(time.perf_counter() - t0, 2)}  # fmt: skip
        rows[path] = got
        if errs:
            errors[path] = errs
    med = {k: _median_tree(v) for k, v in rows.items() if v}
    out: dict[str, Any] = {"in_flight": c, "samples": PARTS_LOAD_SAMPLES, "median": med, "parts": parts_of(med),
                           "all": rows, "background": background}  # fmt: skip
    if errors:
        out["errors"] = errors
    if skipped:
        out["skipped_paths"] = {"deadline": skipped}
    return out


def parts_load_order(lengths: Sequence[int]) -> list[int]:
    """The lengths under load, the shortest and the longest first (what the deadline leaves out comes last)."""
    ls = sorted(lengths)
    return list(dict.fromkeys([ls[0], ls[-1], *ls[1:-1]])) if ls else []


def ttft_parts_step(b: Bench, router: Router, out: dict[str, Any] | None = None) -> dict[str, Any]:
    """Where P->D's time to first token goes, at b.parts_lengths and b.parts_levels requests in flight.

    Level 1 (version 1's step, its keys at the top level by length): one request at a time, through the router; the
    same two hops sent by the bench (split_pd: prefill's HTTP time, decode's HTTP time); colocated on decode and on
    prefill; each with both engines' server-side histograms (SERVER_HISTOGRAMS) over it. One untimed round, then
    PARTS_SAMPLES rounds (fresh prompts, paths interleaved); medians per path. Levels above 1 (`under_load`, level ->
    length -> row, the shortest and longest length first): parts_under_load. `parts` reads the medians (parts_of):
    prefill's own time (split, prefill hop), decode's hop (of which the NIXL transfer and its post, from decode's own
    histograms, and what is left: decode's step on the transferred prompt plus its HTTP), the router's own cost
    (router total minus the two hops), each engine's queue and step, and `stack` (PARTS_STACK). `out`: filled in
    place (what finished survives an interrupt)."""
    p, d = b.roles["prefill"], b.roles["decode"]
    rng = random.Random(8642)
    out = {} if out is None else out
    out.update({"version": 2, "samples": PARTS_SAMPLES, "histograms": list(SERVER_HISTOGRAMS),
                "levels": list(b.parts_levels), "lengths": list(b.parts_lengths), "stack": list(PARTS_STACK)})  # fmt: skip
    for n in b.parts_lengths if 1 in b.parts_levels else ():
        if time.perf_counter() + 20 > b.deadline:
            out[str(n)] = {"skipped": "deadline"}
            continue
        rows: dict[str, list[dict[str, Any]]] = {k: [] for k in PARTS_PATHS}
        for i in range(1 + PARTS_SAMPLES):
            got = {"router": timed_with_server(b, router.url, prompt(rng, n)),
                   "split": split_pd(b, prompt(rng, n)),
                   "colocated_decode": timed_with_server(b, vllm_url(d), prompt(rng, n)),
                   "colocated_prefill": timed_with_server(b, vllm_url(p), prompt(rng, n))}  # fmt: skip
            if i:
                for k, v in got.items():
                    rows[k].append(v)
        med = {k: _median_tree(v) for k, v in rows.items()}
        out[str(n)] = {"median": med, "parts": parts_of(med), "all": rows}
    loaded = out.setdefault("under_load", {})
    load_rng = random.Random(9753)
    for n in parts_load_order(b.parts_lengths):
        for c in (c for c in b.parts_levels if c > 1):
            level = loaded.setdefault(str(c), {})
            if time.perf_counter() + parts_estimate_s(b, n, c, out) > b.deadline:
                level[str(n)] = {"skipped": "deadline"}
                continue
            level[str(n)] = parts_under_load(b, router, n, c, load_rng, out)
    return out


def sweep_step(b: Bench, router: Router, max_len: int) -> dict[str, Any]:
    """SWEEP_N prompt lengths drawn at random (seed SWEEP_SEED) over 16..max_len, each the first request of its
    length through the router and colocated on decode, then SWEEP_STEADY more each: first / median steady."""
    rng = random.Random(SWEEP_SEED)
    lengths = sorted(rng.sample(range(16, max_len + 1), SWEEP_N))
    order = lengths[:]
    rng.shuffle(order)
    rows: list[dict[str, Any]] = []
    for n in order:
        if time.perf_counter() + 15 > b.deadline:
            break
        row: dict[str, Any] = {"tokens": n}
        for path, url in (("pd", router.url), ("colocated", vllm_url(b.roles["decode"]))):
            try:
                xs = [timed(url, b.served, prompt(rng, n)) for _ in range(1 + SWEEP_STEADY)]
                row[path] = {"first_s": xs[0], "steady_s": xs[1:],
                             "first_over_steady": round(xs[0] / statistics.median(xs[1:]), 3)}  # fmt: skip
            except Exception as exc:
                row[path] = {"error": f"{type(exc).__name__}: {exc}"[:160]}
        rows.append(row)
    flagged = [{"tokens": r["tokens"], "path": k, "first_over_steady": r[k]["first_over_steady"],
                "first_s": r[k]["first_s"]}
               for r in rows for k in ("pd", "colocated") if r.get(k, {}).get("first_over_steady", 0) > 1.2]  # fmt: skip
    return {"seed": SWEEP_SEED, "range": [16, max_len], "lengths": lengths, "done": len(rows), "rows": rows,
            "over_1_2x": flagged,
            "max_first_over_steady": {k: max((r[k]["first_over_steady"] for r in rows if "first_over_steady" in r.get(k, {})),
                                             default=None) for k in ("pd", "colocated")}}  # fmt: skip


def stop_roles(roles: dict[str, Role], grace: float) -> dict[str, int | None]:
    """Every role at once (stop_role each, in threads): the teardown waits for the slowest, not their sum.
    Interrupted (SIGINT from gpu-burst.sh's time limit, which SIGKILLs this script 30 s later, while vLLM may still
    drain for longer): no grace left, every role's process tree is killed at once and its ports waited for before
    the interrupt goes on, so no role outlives this script holding a port the next run needs."""
    codes: dict[str, int | None] = {}
    threads = [
        threading.Thread(target=lambda n=n, r=r: codes.__setitem__(n, stop_role(r, grace)), daemon=True)
        for n, r in roles.items()
    ]
    trees = {n: role_tree(r) for n, r in roles.items()}
    try:
        for t in threads:
            t.start()
        for t in threads:
            while t.is_alive():
                # bounded: the kernel may deliver the SIGINT to a stop thread, and an unbounded join() then blocks
                # the main thread (where Python raises KeyboardInterrupt) until the role's whole grace has passed
                t.join(0.2)
    except BaseException:
        for n, r in roles.items():
            kill_tree(r, trees[n])
        wait_ports_closed(list(roles.values()), 15)
        raise
    return {n: codes.get(n) for n in roles}


def badpair(roles: dict[str, Role], model: str) -> dict[str, Any]:
    d = roles["decode"]
    url = f"http://127.0.0.1:{PORTS['decode']['runtime']}{contract.PATH_READYZ}"
    deadline = time.perf_counter() + 420
    verdict_at = None
    history: list[tuple[float, int, str]] = []
    t0 = time.perf_counter()
    while time.perf_counter() < deadline:
        assert d.proc is not None
        if d.proc.poll() is not None:
            history.append((round(time.perf_counter() - t0, 1), -1, f"decode exited {d.proc.returncode}"))
            break
        status, body = get(url)
        if not history or history[-1][1:] != (status, body.strip()[:300]):
            history.append((round(time.perf_counter() - t0, 1), status, body.strip()[:300]))
        if verdict_at is None and (status == 200 or "differs" in body or "KV transfer" in body or "failed" in body):
            verdict_at = time.perf_counter()
        if verdict_at is not None and time.perf_counter() - verdict_at > HOLD_BAD_S:
            break
        time.sleep(1)
    ever_ready = any(h[1] == 200 for h in history)
    return {"decode_ever_ready": ever_ready, "readyz_history": history, "held_s_after_verdict": HOLD_BAD_S,
            "pair_checks": [{k: e.get(k) for k in ("ok", "summary", "deltas")} for e in runtime_events(d, "pair_check")]}  # fmt: skip


# --- driver -----------------------------------------------------------------------------------------------------------
def gpu_name() -> str:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                             text=True, check=False)  # fmt: skip
    except FileNotFoundError:
        return "none (nvidia-smi not found)"
    return out.stdout.strip()


def run_step(
    cr: str, steps: list[str], manifests: list[dict[str, Any]], args: argparse.Namespace, report: dict[str, Any]
) -> None:
    with pair_ports(manifests, cr.partition("@")[0]):
        _run_step(cr, steps, manifests, args, report)


def _run_step(
    cr: str, steps: list[str], manifests: list[dict[str, Any]], args: argparse.Namespace, report: dict[str, Any]
) -> None:
    out: Path = args.out
    key, cr, variant = cr, *cr.partition("@")[::2]
    if cr.endswith("-fixed"):
        import make_checkpoint  # bench/gpu is the script's directory, so it is on sys.path already

        config = "tiny-nemotron-h-rep" if "-rep" in cr else "tiny-nemotron-h"
        model_dir = args.work / f"{config}-fixed"
        make_checkpoint.write_checkpoint(model_dir, HERE / config / "config.json")
    else:
        model_dir = model_dir_for(manifests, cr, Path(args.model_dir) if args.model_dir else None, args.work)
    cache_root = args.work / f"cache-{'eager' if 'eager' in cr else 'compile'}"
    roles = role_commands(manifests, cr, model_dir, cache_root)
    res: dict[str, Any] = {}
    router_argv = pair_router_argv(manifests, cr) if is_pair(manifests, cr) else None
    if router_argv is not None:
        res["pair_pod"] = {"router_argv": router_argv, "host_substitutions": PAIR_HOST_SUBSTITUTIONS,
                           "ports": {n: PORTS[n] for n in contract.ROLES} | {"router": ROUTER_PORTS["http"]}}  # fmt: skip
    if variant:
        res["experiment"] = apply_variant(roles, variant)
    if "canary" in steps:  # the "on" phase's decode; the replacement pod gets 0 (bench/gpu/README.md, issue #31)
        res["canary_step"] = f"decode: {set_env(roles['decode'], contract.ENV_CANARY_SECONDS, CANARY_ON_SECONDS)}"
    for r in roles.values():
        install_gemm_warmup_plugin(r, args.work)
    served = roles["decode"].argv[roles["decode"].argv.index("--served-model-name") + 1]
    decode_steps = [s for s in steps if s in DECODE_STEPS]
    base_env = {**os.environ, **NO_NVLINK_MULTICAST, "PYTHONUNBUFFERED": "1"}
    bench = Bench(manifests, cr, variant, model_dir, cache_root, args.work, out, served, base_env, roles,
                  deadline=getattr(args, "t_end", math.inf),
                  load_s=getattr(args, "load_phase_s", None) or LOAD_PHASE_S,
                  after_s=getattr(args, "after_s", None) or AFTER_S,
                  parts_levels=tuple(getattr(args, "parts_levels", None) or PARTS_LEVELS),
                  parts_lengths=tuple(getattr(args, "parts_lengths", None) or PARTS_LENGTHS))  # fmt: skip
    res.update({"argv": {n: r.argv for n, r in roles.items()}, "env": {n: r.env for n, r in roles.items()}})
    while key in report["runs"]:  # the same CR again in one plan (e.g. cold, then warm on the same cache)
        key += "+again"
    report["runs"][key] = res
    router: Router | None = None
    sampler: KvSampler | None = None
    t_begin = time.monotonic()
    try:
        start_role(roles["prefill"], out, cr, base_env)
        wait_kv_allocated(roles["prefill"], time.perf_counter() + 300)
        start_role(roles["decode"], out, cr, base_env)
        if "badpair" in steps:
            wait_ready({"prefill": roles["prefill"]}, time.perf_counter() + 420)
            router = Router(out, cr, base_env, argv=router_argv)
            res["badpair"] = badpair(roles, served)
            try:
                res["pd_vs_colocated"] = compare_outputs(served, OUTPUT_LENGTHS, 1000)
            except (urllib.error.URLError, OSError, ValueError, KeyError) as e:
                res["pd_vs_colocated"] = {"error": str(e)}
        else:
            wait_ready(roles, time.perf_counter() + 420)
            res["times"] = {n: {"to_health_s": round(r.t_health or -1, 1), "to_readyz_s": round(r.t_ready or -1, 1)}
                            for n, r in roles.items()}  # fmt: skip
            res["warmup"] = {n: [{k: e.get(k) for k in ("seconds", "pair_fault")} for e in runtime_events(r, "warmup_finished")]
                             for n, r in roles.items()}  # fmt: skip
            res["pair_check_at_ready"] = [{k: e.get(k) for k in ("ok", "summary", "deltas", "seconds")}
                                          for e in runtime_events(roles["decode"], "pair_check")]  # fmt: skip
            # what decode reports of its KV path (issue #43): the transport UCX chose and the measured rate
            res["kv_path_reports"] = {ev: [{k: e.get(k) for k in ("report", "transport", "protocol", "config")}
                                           for e in runtime_events(roles["decode"], ev)]
                                      for ev in ("kv_transport", "kv_path")}  # fmt: skip
            router = Router(out, cr, base_env, argv=router_argv)
            res["first_request"] = first_request(served)
            res["pd_vs_colocated"] = compare_outputs(served, OUTPUT_LENGTHS, 1000)
            if "shapes" in steps:
                res["shapes"] = shapes(served)
            whole = {n: log_text(r) for n, r in roles.items()}
            after = {n: log_text(r, r.log_offset_at_ready) for n, r in roles.items()}
            res["autotune_events_after_ready"] = {n: t.count(AUTOTUNE_LINE) for n, t in after.items()}
            res["jit_monitor_lines_after_ready"] = {n: t.count(JIT_LINE) for n, t in after.items()}
            res["jit_monitor_lines_before_ready"] = {n: whole[n].count(JIT_LINE) - t.count(JIT_LINE)
                                                     for n, t in after.items()}  # fmt: skip
            res["jit_monitor_samples_after_ready"] = {n: [ln[:300] for ln in t.splitlines() if JIT_LINE in ln][:10]
                                                      for n, t in after.items()}  # fmt: skip
            res["gemm_warmup_log"] = {n: [ln.strip() for ln in t.splitlines() if GEMM_WARMUP_LINE in ln][-4:]
                                      for n, t in whole.items()}  # fmt: skip
            if "load" in steps:
                res["load"] = load_step(bench, router)
            if "ttft" in steps:
                res["ttft"] = ttft_step(bench, router)
            if "ttft-parts" in steps:
                ttft_parts_step(bench, router, res.setdefault("ttft_parts", {}))
            if "sweep" in steps:
                mml = int(roles["decode"].argv[roles["decode"].argv.index("--max-model-len") + 1])
                res["sweep"] = sweep_step(bench, router, mml - 8)
            if "orphans" in steps or "fallback" in steps:
                sampler = KvSampler(roles["prefill"], time.perf_counter())
                if "orphans" in steps:
                    res["orphans"] = orphans_step(bench, sampler)
                if "fallback" in steps:
                    res["fallback"] = fallback_step(bench, router, sampler)
                    res["fallback_summary"] = fallback_summary(res["fallback"])
                    if "error" in res["fallback"]:  # its phases kept above; the later steps need the decode back
                        raise RuntimeError(f"fallback: {res['fallback']['error']}")
            if decode_steps:  # no fresh-router measurement: the decode steps' traffic starts on this router
                res["decode_steps"] = decode_lifecycle(bench, decode_steps, router)
            else:
                # the first P->D request through a *fresh* router, once vLLM has served the router: tells the router's
                # own first-request cost (again slow) from a one-time cost in vLLM (now fast); 0.5-0.7 s on 2026-11-29
                router.stop()
                router = Router(out, cr + "-2", base_env, argv=router_argv)
                res["first_request_fresh_router"] = first_request(served, only_router=True)
            if "restart" in steps:
                res["restart"] = restart_prefill(roles, served, out, cr, base_env)
        res["block_sizes"] = block_sizes(roles)
    except Exception as exc:  # a failed step is reported; the next one still runs
        res["error"] = f"{type(exc).__name__}: {exc}"
    finally:
        if sampler is not None:  # prefill's KV usage sampled every second up to the teardown
            res["prefill_kv_samples"] = {"columns": ["t_s", "kv_cache_usage", "running", "waiting"],
                                         "samples": sampler.finish()}  # fmt: skip
            if "orphans" in res:
                res["orphans_summary"] = orphans_summary(res["orphans"], sampler.samples)
            res["prefill_expired_kv_lines"] = expired_lines(roles["prefill"])[:20]
        try:  # before the roles stop: decode's /metrics is still up (the replacement's, after replace-decode)
            res["kv_transfer"] = kv_transfer_figures(roles.get("decode-new") or roles["decode"])
        except Exception as exc:
            res["kv_transfer"] = {"error": f"{type(exc).__name__}: {exc}"}
        for rt in [router, *bench.routers]:
            if rt is not None:
                rt.stop()
        # interrupted (the burst's time limit): no grace, the SIGKILL that follows the SIGINT would cut it short
        interrupted = isinstance(sys.exc_info()[1], KeyboardInterrupt)
        res["exit_codes_after_sigterm"] = stop_roles(
            roles, 0.0 if interrupted else TEARDOWN_GRACE_S if decode_steps else 60.0
        )
        res["seconds"] = round(time.monotonic() - t_begin, 1)


def host_substitutions(manifests: list[dict[str, Any]], plan: str) -> list[str]:
    """The report's host_substitutions: HOST_SUBSTITUTIONS for CRs of role Deployments, PAIR_HOST_SUBSTITUTIONS for
    Pair CRs (both, each marked, when a plan holds both kinds)."""
    crs = [item.partition(":")[0].partition("@")[0] for item in plan.split(",")]
    pairs = {is_pair(manifests, cr) for cr in crs}
    if pairs == {False}:
        return HOST_SUBSTITUTIONS
    if pairs == {True}:
        return PAIR_HOST_SUBSTITUTIONS
    return [
        *(f"role Deployments: {s}" for s in HOST_SUBSTITUTIONS),
        *(f"pair pod: {s}" for s in PAIR_HOST_SUBSTITUTIONS),
    ]


def brief_run(r: dict[str, Any]) -> dict[str, Any]:
    """A run's result without its command lines, and of the decode steps only their summary (the requests are many)."""
    out = {k: v for k, v in r.items() if k not in ("argv", "env")}
    if "decode_steps" in out:
        out["decode_steps"] = out["decode_steps"].get("summary")
    return out


def ints(text: str) -> tuple[int, ...]:
    """'1,4,16' -> (1, 4, 16)."""
    return tuple(int(x) for x in text.split(",") if x.strip())


def ints_text(xs: Sequence[int]) -> str:
    return ",".join(map(str, xs))


def interruptible() -> None:
    """SIGINT raises KeyboardInterrupt here whatever this process inherited: a shell starts a background job with
    SIGINT ignored, and Python keeps an inherited SIG_IGN, so gpu-burst.sh's `timeout --signal=INT` would go unheard
    and the teardown (stop_roles, the result file) would never run before the SIGKILL. Found by the test of that
    teardown under a CI run started in the background."""
    signal.signal(signal.SIGINT, signal.default_int_handler)


def main() -> int:
    interruptible()
    ap = argparse.ArgumentParser()
    ap.add_argument("--rendered", type=Path, required=True, help="`python -m hpd_operator render -o json` output")
    ap.add_argument("--plan", required=True,
                    help="CR:step+step,...  steps: cold shapes restart badpair restart-decode replace-decode canary")  # fmt: skip
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--work", type=Path, default=Path("/tmp/hpd-bench"))
    ap.add_argument("--model-dir", default=None, help="default: bench/gpu/<the CR's served model name>")
    ap.add_argument("--fresh-cache", action="store_true", help="empty the cache volumes first (cold)")
    ap.add_argument("--gpus", default="0,1", help="this lane's GPUs, in order (a TP=t role takes the first t)")
    ap.add_argument("--port-offset", type=int, default=0, help="shift every port (a second lane on one host)")
    ap.add_argument(
        "--load-phase-s", type=float, default=None, help=f"each canary load phase (default {LOAD_PHASE_S} s)"
    )
    ap.add_argument("--after-s", type=float, default=None,
                    help=f"checked traffic after a decode restart or swap (default {AFTER_S} s)")  # fmt: skip
    ap.add_argument("--deadline-s", type=float, default=None,
                    help="the whole plan's time: the decode steps' waits end by then (leave the teardown outside)")  # fmt: skip
    ap.add_argument("--parts-levels", type=ints, default=None,
                    help=f"ttft-parts: requests in flight, e.g. 1,4,16 (default {ints_text(PARTS_LEVELS)})")  # fmt: skip
    ap.add_argument("--parts-lengths", type=ints, default=None,
                    help=f"ttft-parts: prompt tokens, e.g. 2000,8000 (default {ints_text(PARTS_LENGTHS)})")  # fmt: skip
    ap.add_argument("--topology", choices=tuple(isolation.TOPOLOGIES), default="host",
                    help="how each role is isolated (bench/gpu/isolation.py): host, pods, pair")  # fmt: skip
    ap.add_argument("--vllm-site", action="append", default=[], metavar="VERSION=DIR",
                    help="the vLLM build for CRs whose image tag is VERSION (repeatable)")  # fmt: skip
    args = ap.parse_args()
    args.t_end = time.perf_counter() + args.deadline_s if args.deadline_s else math.inf
    TOPOLOGY["name"] = args.topology
    GPUS[:] = [int(g) for g in args.gpus.split(",")]
    shift_ports(args.port_offset)
    VLLM_SITES.update(dict(x.split("=", 1) for x in args.vllm_site))
    args.out.mkdir(parents=True, exist_ok=True)
    if args.fresh_cache:
        for d in args.work.glob("cache-*"):
            shutil.rmtree(d, ignore_errors=True)
    manifests = json.loads(args.rendered.read_text())["items"]
    report: dict[str, Any] = {"date": time.strftime("%Y-%m-%d"), "command": " ".join(sys.argv), "gpu": gpu_name(),
                              "lane": {"gpus": GPUS, "port_offset": args.port_offset, "vllm_sites": VLLM_SITES},
                              "host_substitutions": host_substitutions(manifests, args.plan), "runs": {},
                              "topology": {"name": args.topology, "why": isolation.TOPOLOGIES[args.topology].why,
                                           "roles_share_pid_namespace":
                                               isolation.TOPOLOGIES[args.topology].roles_share_pid_namespace,
                                           "uids": "this script's (root)"}}  # fmt: skip
    result = args.out / "result.json"
    try:
        for item in args.plan.split(","):
            cr, _, steps = item.partition(":")
            run_step(cr, steps.split("+"), manifests, args, report)
            result.write_text(json.dumps(report, indent=1))
    finally:  # also on SIGINT from an outer time limit: what ran so far is kept
        result.write_text(json.dumps(report, indent=1))
        if TOPOLOGY["holder"] is not None:
            isolation.stop_holder(TOPOLOGY["holder"])
    brief = {cr: brief_run(r) for cr, r in report["runs"].items()}
    print(json.dumps(brief)[:8000])
    return 0


if __name__ == "__main__":
    sys.exit(main())
