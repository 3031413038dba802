"""Every cross-field validation rule, defined ONCE: each row yields the CRD's CEL rule (crdgen, via models.py) and
the operator's Python check (hpd_operator.validation), with the same id and message.

Single-field bounds (minimum, maximum, pattern, enum, maxItems) are not rows here: they are pydantic `Field`
constraints, which already are one definition for both sides (crdgen turns them into the schema's own keywords).

    cel_rules("kvTransfer")                      # [{"rule": ..., "message": ..., "fieldPath": ...}] for the schema
    violations("kvTransfer", spec.kv_transfer, "spec.kvTransfer")   # [SpecViolation] for the operator

What CEL cannot do, and the operator therefore checks alone (hpd_operator.validation): resolve an extraArgs
abbreviation the way vLLM's argparse does (`--tensor-par 2` names --tensor-parallel-size; that needs every
option string of the vLLM version, far over CEL's cost budget as a regex), know which flags a vLLM version has at
all, and compare model config numbers (heads, groups) with TP (validation.py). The recorded cases in
tests/crd/cel_cases.py run against the real apiserver AND through these Python twins.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from decimal import Decimal
from typing import Any, Final, Literal

from hpd_operator.api import constants as c
from hpd_operator.errors import SpecViolation
from hpd_runtime import contract

Scope = Literal["root", "spec", "model", "modelSource", "role", "resources", "kvTransfer", "cache", "podSpec",
                "podMetadata", "container", "volume", "projection", "autoscaling", "autoscalingMetric", "ratio"]  # fmt: skip
Check = Callable[[Any], Iterable[str]]
"""Python twin: yields the relative field path ('' = the node itself, '.x' = a child) of each violation."""


@dataclass(frozen=True)
class Rule:
    id: str
    scope: Scope
    """The schema node the CEL rule sits on (and the typed object the Python twin gets)."""
    cel: str | None
    """None: the operator checks it alone (a comment on the row says why CEL cannot)."""
    message: str
    field: str
    """Relative field path (CEL `fieldPath`), '' = the node."""
    check: Check


def _when(bad: Callable[[Any], bool], field: str = "") -> Check:
    """A twin for a rule that reports one field when `bad(obj)`."""

    def check(obj: Any) -> Iterator[str]:
        if bad(obj):
            yield field

    return check


def _forbid(attr: str, cel_name: str) -> Check:
    return _when(lambda o: getattr(o, attr) is not None, "." + cel_name)


# ---------------------------------------------------------------------------------------------------------------
# Names
# ---------------------------------------------------------------------------------------------------------------
DNS1035: Final = "^[a-z]([-a-z0-9]*[a-z0-9])?$"
CHILD_SUFFIXES: Final = ("prefill", "decode", contract.COMPONENT_ROUTER, "engines")
"""`<cr>-<suffix>` child names; a CR whose name ends in one of them would fight another CR for its children."""
MAX_CR_NAME: Final = 63 - len("-prefill")
"""A CR's own children (`<cr>-router`, `<cr>-engines`) stay DNS-1035 labels without truncation; a generation's
(`<cr>-prefill-<hash>`) are shortened with a hash of the full name beyond 46 characters (api/names.py)."""
GENERATION_SUFFIX: Final = "-(prefill|decode)-[0-9a-f]{8}$"
"""`<cr>-prefill-<hash>`: a generation's children (hpd_operator.generations); a CR named like one would own its
endpoint Service under the same name."""

# ---------------------------------------------------------------------------------------------------------------
# Quantities (the same grammar as k8s.io/apimachinery resource.Quantity, non-negative)
# ---------------------------------------------------------------------------------------------------------------
QUANTITY_PATTERN: Final = (
    r"^(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$"
)
_SUFFIX: Final[dict[str, Decimal]] = {
    **{s: Decimal(2) ** (10 * (i + 1)) for i, s in enumerate(("Ki", "Mi", "Gi", "Ti", "Pi", "Ei"))},
    **{s: Decimal(10) ** e for s, e in (("n", -9), ("u", -6), ("m", -3), ("", 0), ("k", 3), ("M", 6), ("G", 9),
                                        ("T", 12), ("P", 15), ("E", 18))},
}  # fmt: skip
GPU: Final = "nvidia.com/gpu"


def quantity(q: int | str) -> Decimal | None:
    """A Kubernetes quantity's value, None when `q` is not one (QUANTITY_PATTERN decides, as the schema does)."""
    if isinstance(q, int):
        return Decimal(q)
    if re.fullmatch(QUANTITY_PATTERN, q) is None:
        return None
    suffix = next((s for s in sorted(_SUFFIX, key=len, reverse=True) if s and q.endswith(s)), "")
    return Decimal(q[: len(q) - len(suffix)]) * _SUFFIX[suffix]


def _gpu_limit(role: Any) -> Decimal | None:
    limits = role.resources.limits if role.resources is not None and role.resources.limits else {}
    return quantity(limits[GPU]) if GPU in limits else None


def _gpu_below_tp(role: Any) -> bool:
    """A one-pod replica whose GPU limit is below its TP size (a replica that spans nodes: _gpu_below_pod_share)."""
    q = _gpu_limit(role)
    return q is not None and not role.multi_node and q < role.tensor_parallel_size


def _gpu_below_pod_share(role: Any) -> bool:
    """A GPU limit below the GPUs each pod of a replica runs ranks on (TP x PP, or gpusPerNode when it spans nodes),
    that _gpu_below_tp does not already report."""
    q = _gpu_limit(role)
    return q is not None and not _gpu_below_tp(role) and q < role.gpus_per_pod


def _requests_over_limits(res: Any) -> Iterator[str]:
    for k, v in (res.requests or {}).items():
        lim = (res.limits or {}).get(k)
        rq, lq = quantity(v), quantity(lim) if lim is not None else None
        if rq is not None and lq is not None and rq > lq:
            yield f".requests.{k}"


def _owned_env(spec: Any) -> Iterator[str]:
    for i, e in enumerate(spec.env):
        if e.name.startswith(c.OWNED_ENV_PREFIX) or e.name in c.OWNED_ENV:
            yield f".env[{i}].name"


def _prompt_too_long(spec: Any) -> Iterator[str]:
    mml = spec.model.max_model_len
    for i, n in enumerate(spec.warmup.prompt_lengths):
        if mml is not None and n >= mml:
            yield f".warmup.promptLengths[{i}]"


_OWNED_ENV_LIST = "[" + ", ".join(f"'{n}'" for n in sorted(c.OWNED_ENV)) + "]"
_ENGINE_PORTS = (contract.VLLM_PORT, contract.RUNTIME_PORT)
UCX_AM_TLS: Final = r"(^|,)(all|tcp|sm|shm|posix|sysv|ib|rc[a-z_0-9]*|ud[a-z_0-9]*|dc[a-z_0-9]*)(,|$)"
"""A UCX_TLS list that names a transport with active messages (RE2, CEL `matches`; `^...` excludes instead)."""
UCX_IB_TLS: Final = r"(^|,)(all|ib|rc[a-z_0-9]*|ud[a-z_0-9]*|dc[a-z_0-9]*)(,|$)"
UCX_CUDA_IPC_TLS: Final = r"(^|,)(all|cuda|cuda_ipc)(,|$)"
"""A UCX_TLS list that lets UCX use cuda_ipc (`cuda` names cuda_copy and cuda_ipc)."""


def _tls_lacks(kv: Any, pattern: str) -> bool:
    tls: str | None = kv.ucx.tls if kv.ucx is not None else None
    return tls is not None and tls != "" and not tls.startswith("^") and re.search(pattern, tls) is None


# Pod template fields that would escape the pod's sandbox or take over what the operator owns: declared in the
# schema only so that CEL can reject them by name (an undeclared field would be pruned silently).
FORBIDDEN_POD_FIELDS: Final = {
    "hostNetwork": ("host_network", "host networking exposes the node's network namespace"),
    "hostPID": ("host_pid", "the node's process namespace is not for model servers"),
    "hostIPC": ("host_ipc", "the node's IPC namespace is not for model servers"),
    "hostUsers": ("host_users", "user namespaces are the node administrator's choice"),
    "serviceAccountName": (
        "service_account_name",
        "the operator sets it (none on prefill; on decode one that may only create its KV path Event)",
    ),
    "serviceAccount": ("service_account", "the operator sets it (see serviceAccountName)"),
    "automountServiceAccountToken": (
        "automount_service_account_token",
        "the operator decides (a token only on decode pods that run the pair check, to post their KV path Event)",
    ),
    "securityContext": ("security_context", "the operator sets a restricted pod securityContext"),
    "nodeName": ("node_name", "bypasses the scheduler and GPU accounting; use spec.<role>.nodeSelector"),
    "shareProcessNamespace": ("share_process_namespace", "vLLM's processes stay in their own namespace"),
    "initContainers": ("init_containers", "extra containers are not supported (they would run unchecked)"),
    "ephemeralContainers": ("ephemeral_containers", "extra containers are not supported"),
    "nodeSelector": ("node_selector", "use spec.<role>.nodeSelector"),
    "tolerations": ("tolerations", "use spec.<role>.tolerations"),
    "affinity": ("affinity", "use spec.<role>.affinity"),
}
"""camelCase field -> (python attribute, why it is refused)."""
FORBIDDEN_CONTAINER_FIELDS: Final = {
    "image": ("image", "set spec.image (both roles run the same vLLM image)"),
    "command": ("command", "the operator runs `python3 -m hpd_runtime launch` (warmup + readiness)"),
    "args": ("args", "use spec.extraArgs / spec.<role>.extraArgs (checked against vLLM's parser)"),
    "ports": ("ports", f"vLLM {contract.VLLM_PORT}, runtime {contract.RUNTIME_PORT} and the side channel are fixed"),
    "env": ("env", "use spec.env"),
    "envFrom": ("env_from", "use spec.env (env from a whole ConfigMap/Secret could override the operator's)"),
    "resources": ("resources", "use spec.<role>.resources (GPUs follow tensorParallelSize)"),
    "startupProbe": ("startup_probe", "the operator's probes gate Ready on the warmup"),
    "readinessProbe": ("readiness_probe", "the operator's probes gate Ready on the warmup"),
    "livenessProbe": ("liveness_probe", "the operator's probes gate Ready on the warmup"),
    "securityContext": ("security_context", "the operator sets a restricted container securityContext"),
    "lifecycle": ("lifecycle", "the operator's preStop drains the pod (hpd_runtime drain); another hook would race it"),
    "workingDir": ("working_dir", "the runtime relies on the image's working directory"),
}
FORBIDDEN_VOLUME_FIELDS: Final = {
    "hostPath": ("host_path", "host paths give the pod the node's files"),
}
FORBIDDEN_PROJECTION_FIELDS: Final = {
    "serviceAccountToken": (
        "service_account_token",
        "engine pods get no ServiceAccount token of their own (vLLM never calls the Kubernetes API)",
    ),
}
SECURITY_ANNOTATION_PREFIXES: Final = (
    "container.apparmor.security.beta.kubernetes.io/",
    "seccomp.security.alpha.kubernetes.io/",
    "container.seccomp.security.alpha.kubernetes.io/",
)
"""Pod annotations that choose a security profile (AppArmor, incl. `unconfined`; the deprecated seccomp ones): the
operator sets the pod's profile (seccomp RuntimeDefault, the runtime's default AppArmor profile)."""
SYSTEM_PRIORITY_PREFIX: Final = "system-"
"""Kubernetes reserves PriorityClass names starting `system-` (system-node-critical, system-cluster-critical): pods
that may preempt anything and are the last to be evicted, for the cluster's own components."""


def _security_annotations(md: Any) -> Iterator[str]:
    for key in sorted(md.annotations or {}):
        if key.startswith(SECURITY_ANNOTATION_PREFIXES):
            yield f".annotations[{key}]"


_SECURITY_ANNOTATIONS_CEL = " || ".join(f"k.startsWith('{p}')" for p in SECURITY_ANNOTATION_PREFIXES)


def _forbidden_rows(scope: Scope, table: dict[str, tuple[str, str]], where: str) -> list[Rule]:
    return [
        Rule(
            id=f"{where}-{name}-not-allowed",
            scope=scope,
            cel=f"!has(self.{name})",
            message=f"{where}.{name} may not be set: {why}",
            field=f".{name}",
            check=_forbid(attr, name),
        )
        for name, (attr, why) in table.items()
    ]


# ---------------------------------------------------------------------------------------------------------------
# Autoscaling (docs/autoscaling.md)
# ---------------------------------------------------------------------------------------------------------------
def _ratio_bounds(spec: Any) -> tuple[float, float] | None:
    """(min, max) decode per prefill of a spec with a ratio (unset ends: 0 and infinity)."""
    r = spec.ratio
    if r is None:
        return None
    lo = r.min_decode_per_prefill if r.min_decode_per_prefill is not None else 0.0
    hi = r.max_decode_per_prefill if r.max_decode_per_prefill is not None else float("inf")
    return lo, hi


def _ratio_without_autoscaling(spec: Any) -> bool:
    return spec.ratio is not None and (spec.prefill.autoscaling is None or spec.decode.autoscaling is None)


def _ratio_unreachable(spec: Any) -> bool:
    """No prefill count in its autoscaling range has a decode count in decode's range within the ratio (real-valued:
    some P in [pmin, pmax] with rmin*P <= dmax and rmax*P >= dmin)."""
    b, p, d = _ratio_bounds(spec), spec.prefill.autoscaling, spec.decode.autoscaling
    if b is None or p is None or d is None:
        return False
    return bool(b[0] * p.min_replicas > d.max_replicas or b[1] * p.max_replicas < d.min_replicas)


def _ratio_too_narrow(spec: Any) -> bool:
    """The band leaves no room for one role to grow by one replica while the other holds (independent scalers move
    one role at a time): at the smallest sizes, rmin*(pmin+1) <= rmax*pmin and rmin*(dmin+1) <= rmax*dmin."""
    b, p, d = _ratio_bounds(spec), spec.prefill.autoscaling, spec.decode.autoscaling
    if b is None or p is None or d is None or b[0] == 0 or b[1] == float("inf"):
        return False
    grow_p = p.max_replicas > p.min_replicas and b[0] * (p.min_replicas + 1) > b[1] * p.min_replicas
    grow_d = d.max_replicas > d.min_replicas and b[0] * (d.min_replicas + 1) > b[1] * d.min_replicas
    return bool(grow_p or grow_d)


_PMIN, _PMAX = "double(self.prefill.autoscaling.minReplicas)", "double(self.prefill.autoscaling.maxReplicas)"
_DMIN, _DMAX = "double(self.decode.autoscaling.minReplicas)", "double(self.decode.autoscaling.maxReplicas)"
_RMIN, _RMAX = "self.ratio.minDecodePerPrefill", "self.ratio.maxDecodePerPrefill"
_BOTH_AS = "has(self.prefill.autoscaling) && has(self.decode.autoscaling)"
_RATIO_ROWS: Final = (
    Rule(
        id="ratio-needs-autoscaling",
        scope="spec",
        cel=f"!has(self.ratio) || ({_BOTH_AS})",
        message="spec.ratio bounds decode replicas per prefill replica while both roles autoscale: set "
        "spec.prefill.autoscaling and spec.decode.autoscaling, or remove spec.ratio",
        field=".ratio",
        check=_when(_ratio_without_autoscaling, ".ratio"),
    ),
    Rule(
        id="ratio-reachable",
        scope="spec",
        cel=f"!has(self.ratio) || !({_BOTH_AS}) || ("
        f"(!has({_RMIN}) || {_RMIN} * {_PMIN} <= {_DMAX}) && (!has({_RMAX}) || {_RMAX} * {_PMAX} >= {_DMIN}))",
        message="spec.ratio cannot be met within the autoscaling ranges: minDecodePerPrefill x "
        "spec.prefill.autoscaling.minReplicas must be <= spec.decode.autoscaling.maxReplicas, and "
        "maxDecodePerPrefill x spec.prefill.autoscaling.maxReplicas >= spec.decode.autoscaling.minReplicas",
        field=".ratio",
        check=_when(_ratio_unreachable, ".ratio"),
    ),
    Rule(
        id="ratio-room-to-grow",
        scope="spec",
        cel=f"!has(self.ratio) || !({_BOTH_AS}) || !has({_RMIN}) || !has({_RMAX}) || ("
        f"({_PMAX} <= {_PMIN} || {_RMIN} * ({_PMIN} + 1.0) <= {_RMAX} * {_PMIN}) && "
        f"({_DMAX} <= {_DMIN} || {_RMIN} * ({_DMIN} + 1.0) <= {_RMAX} * {_DMIN}))",
        message="spec.ratio.maxDecodePerPrefill is too close to minDecodePerPrefill: each role scales on its own, "
        "one replica at a time, so the band must hold both sizes after one role grows by one from its minReplicas "
        "(min x (minReplicas + 1) <= max x minReplicas, for prefill and for decode); e.g. 1 and 2, or 1 and 4",
        field=".ratio.maxDecodePerPrefill",
        check=_when(_ratio_too_narrow, ".ratio.maxDecodePerPrefill"),
    ),
)

_PAIR: Final = (
    "has(self.kvTransfer) && has(self.kvTransfer.processNamespace) && self.kvTransfer.processNamespace == 'Pair'"
)
_PAIR_KV: Final = "has(self.processNamespace) && self.processNamespace == 'Pair'"
_PAIR_WHY: Final = "kvTransfer.processNamespace Pair runs one prefill and one decode in each pair pod"
_PAIR_PORTS: Final = (contract.VLLM_PORT, contract.RUNTIME_PORT, *contract.PAIR_PORTS)
_PAIR_SIDE_MAX: Final = 65535 - contract.PAIR_DECODE_SIDE_CHANNEL_OFFSET


def _pairs(spec: Any) -> bool:
    return bool(spec.kv_transfer.process_namespace == "Pair")


def _pair_ports_taken(kv: Any) -> bool:
    base = kv.side_channel_port
    decode = base + contract.PAIR_DECODE_SIDE_CHANNEL_OFFSET
    return kv.process_namespace == "Pair" and (base > _PAIR_SIDE_MAX or base in _PAIR_PORTS or decode in _PAIR_PORTS)


def _role_spans_nodes(role: str) -> Callable[[Any], bool]:
    """Pair pods, and `role`'s replica spans nodes."""
    return lambda spec: _pairs(spec) and bool(spec.role(role).multi_node)


def _pair_placement_conflicts(spec: Any) -> Iterator[str]:
    """A pair pod has one nodeSelector and one affinity: the roles' may add to each other, not contradict."""
    if not _pairs(spec):
        return
    p, d = spec.prefill, spec.decode
    if any(k in (d.node_selector or {}) and d.node_selector[k] != v for k, v in (p.node_selector or {}).items()):
        yield ".decode.nodeSelector"
    if p.affinity is not None and d.affinity is not None and p.affinity != d.affinity:
        yield ".decode.affinity"


_PAIR_ROWS: Final = (
    Rule(
        id="pair-replicas-equal",
        scope="spec",
        cel=f"!({_PAIR}) || self.prefill.replicas == self.decode.replicas",
        message=f"spec.decode.replicas must equal spec.prefill.replicas: {_PAIR_WHY} (the replicas are the pair pods)",
        field=".decode.replicas",
        check=_when(lambda sp: _pairs(sp) and sp.prefill.replicas != sp.decode.replicas, ".decode.replicas"),
    ),
    Rule(
        id="pair-prefill-not-autoscaling",
        scope="spec",
        cel=f"!({_PAIR}) || !has(self.prefill.autoscaling)",
        message=f"spec.prefill.autoscaling is not allowed: {_PAIR_WHY}, so pairs scale together (set "
        "spec.decode.autoscaling: it scales the pair pods)",
        field=".prefill.autoscaling",
        check=_when(lambda sp: _pairs(sp) and sp.prefill.autoscaling is not None, ".prefill.autoscaling"),
    ),
    *(
        Rule(
            id=f"pair-{role}-one-node",
            scope="spec",
            cel=f"!({_PAIR}) || self.{role}.tensorParallelSize * self.{role}.pipelineParallelSize "
            f"<= self.{role}.gpusPerNode",
            message=f"spec.{role}.tensorParallelSize x pipelineParallelSize must fit one node (at most "
            f"spec.{role}.gpusPerNode): {_PAIR_WHY} on one node; a replica that spans nodes (LeaderWorkerSet) cannot "
            "pair",
            field=f".{role}.tensorParallelSize",
            check=_when(_role_spans_nodes(role), f".{role}.tensorParallelSize"),
        )
        for role in contract.ROLES
    ),
    Rule(
        id="pair-placement-agrees",
        scope="spec",
        cel=None,  # operator only: comparing two free-form affinities is over CEL's cost budget
        message=f"spec.prefill and spec.decode place the pair pod differently: {_PAIR_WHY}, and a pod has one "
        "nodeSelector and one affinity (nodeSelector keys may not have two values; set affinity on one role or the "
        "same on both)",
        field=".decode",
        check=_pair_placement_conflicts,
    ),
)

RULES: Final[tuple[Rule, ...]] = (
    Rule(
        id="name-dns-1035",
        scope="root",
        cel=f"self.metadata.name.matches('{DNS1035}') && size(self.metadata.name) <= {MAX_CR_NAME}",
        message=f"metadata.name must be a DNS-1035 label of at most {MAX_CR_NAME} characters (lowercase letters, "
        "digits and '-', starting with a letter): it names Services, which allow no dots or leading digits",
        field=".metadata.name",
        check=_when(lambda cr: not _dns1035(cr.metadata.name) or len(cr.metadata.name) > MAX_CR_NAME, ".metadata.name"),
    ),
    Rule(
        id="name-no-child-suffix",
        scope="root",
        cel="!(" + " || ".join(f"self.metadata.name.endsWith('-{s}')" for s in CHILD_SUFFIXES) + ")",
        message="metadata.name may not end in "
        + ", ".join(f"-{s}" for s in CHILD_SUFFIXES)
        + ": CR `a-prefill` would own the same objects as CR `a`'s prefill role",
        field=".metadata.name",
        check=_when(lambda cr: cr.metadata.name.endswith(tuple(f"-{s}" for s in CHILD_SUFFIXES)), ".metadata.name"),
    ),
    Rule(
        id="name-no-generation-suffix",
        scope="root",
        cel=f"!self.metadata.name.matches('{GENERATION_SUFFIX}')",
        message="metadata.name may not end in -prefill-<8 hex digits> or -decode-<8 hex digits>: CR "
        "`a-prefill-1a2b3c4d` would own the same objects as the prefill generation 1a2b3c4d of CR `a`",
        field=".metadata.name",
        check=_when(lambda cr: re.search(GENERATION_SUFFIX, cr.metadata.name) is not None, ".metadata.name"),
    ),
    Rule(
        id="tp-divides",
        scope="spec",
        cel="self.prefill.tensorParallelSize % self.decode.tensorParallelSize == 0"
        " || self.decode.tensorParallelSize % self.prefill.tensorParallelSize == 0",
        message="spec.prefill.tensorParallelSize and spec.decode.tensorParallelSize must divide one another"
        " (e.g. 4 and 2, or 2 and 2)",
        field=".decode.tensorParallelSize",
        check=_when(
            lambda s: (
                bool(s.prefill.tensor_parallel_size % s.decode.tensor_parallel_size)
                and bool(s.decode.tensor_parallel_size % s.prefill.tensor_parallel_size)
            ),
            ".decode.tensorParallelSize",
        ),
    ),
    Rule(
        id="decode-not-pipeline-parallel",
        scope="spec",
        cel="!has(self.decode.pipelineParallelSize) || self.decode.pipelineParallelSize == 1",
        message="spec.decode.pipelineParallelSize must be 1: no vLLM release from 0.20 to 0.33 moves KV into a "
        "pipeline-parallel decode over NIXL (0.20 keys the NIXL handshake by TP rank only, 0.25 refuses pp_rank > 0 "
        "handshake metadata, 0.27+ refuses a pipeline-parallel consumer); spread a decode replica over nodes with "
        "spec.decode.tensorParallelSize instead",
        field=".decode.pipelineParallelSize",
        check=_when(lambda s: s.decode.pipeline_parallel_size != 1, ".decode.pipelineParallelSize"),
    ),
    Rule(
        id="block-size-multiple-of-16",
        scope="spec",
        cel="!has(self.blockSize) || self.blockSize % 16 == 0",
        message="spec.blockSize must be a multiple of 16 (e.g. 1024)",
        field=".blockSize",
        check=_when(lambda s: s.block_size is not None and s.block_size % 16 != 0, ".blockSize"),
    ),
    Rule(
        id="operator-owned-env",
        scope="spec",
        cel=f"!has(self.env) || !self.env.exists(e, e.name.startsWith('{c.OWNED_ENV_PREFIX}') || e.name in "
        f"{_OWNED_ENV_LIST})",
        message="spec.env may not set env the operator owns: HPD_*, " + ", ".join(sorted(c.OWNED_ENV)),
        field=".env",
        check=_owned_env,
    ),
    Rule(
        id="env-size",
        scope="spec",
        cel=f"!has(self.env) || self.env.map(e, has(e.value) ? size(e.value) : 0).sum() <= {c.MAX_ENV_BYTES}",
        message=f"spec.env values may total at most {c.MAX_ENV_BYTES // 1024} KiB (as Kubernetes bounds an object's "
        "annotations): a larger CR leaves etcd no room to store its status",
        field=".env",
        check=_when(lambda s: sum(len(e.value or "") for e in s.env) > c.MAX_ENV_BYTES, ".env"),
    ),
    Rule(
        id="warmup-prompt-shorter-than-max-model-len",
        scope="spec",
        cel="!has(self.model.maxModelLen) || !has(self.warmup) || !has(self.warmup.promptLengths)"
        " || self.warmup.promptLengths.all(n, n < self.model.maxModelLen)",
        message="spec.warmup.promptLengths must be shorter than spec.model.maxModelLen (vLLM rejects a longer "
        "prompt, so the warmup, and Ready, would never finish)",
        field=".warmup.promptLengths",
        check=_prompt_too_long,
    ),
    Rule(
        id="model-name-non-empty",
        scope="model",
        cel="!self.name.matches('^\\\\s*$')",
        message="spec.model.name must be a non-empty model id, e.g. nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-FP8",
        field=".name",
        check=_when(lambda m: not m.name.strip(), ".name"),
    ),
    Rule(
        id="one-model-source",
        scope="modelSource",
        cel="!(has(self.pvc) && has(self.huggingface))",
        message="set only one of model.source.pvc and huggingface",
        field="",
        check=_when(lambda s: s.pvc is not None and s.huggingface is not None),
    ),
    Rule(
        id="replicas-non-negative",
        scope="role",
        cel="!has(self.replicas) || self.replicas >= 0",
        message="replicas must be >= 0",
        field=".replicas",
        check=_when(lambda r: r.replicas < 0, ".replicas"),
    ),
    Rule(
        id="autoscaling-replicas-in-range",
        scope="role",
        cel="!has(self.autoscaling) || (self.replicas >= self.autoscaling.minReplicas"
        " && self.replicas <= self.autoscaling.maxReplicas)",
        message="replicas must lie within autoscaling.minReplicas..maxReplicas: with autoscaling the autoscaler owns "
        "the replica count and replicas is only the size the role starts at",
        field=".replicas",
        check=_when(
            lambda r: (
                r.autoscaling is not None and not r.autoscaling.min_replicas <= r.replicas <= r.autoscaling.max_replicas
            ),
            ".replicas",
        ),
    ),
    Rule(
        id="autoscaling-replicas-not-pinned",
        scope="role",
        # A transition rule: the operator sees no old object (it never writes replicas of an autoscaled role
        # either), so its twin finds nothing; `kubectl scale hpd` on an autoscaling decode is refused here.
        cel="!has(self.autoscaling) || !has(oldSelf.autoscaling) || self.replicas == oldSelf.replicas",
        message="replicas cannot be changed while autoscaling is set: the autoscaler owns the replica count (change "
        "autoscaling.minReplicas/maxReplicas, or remove autoscaling to pin replicas)",
        field=".replicas",
        check=_when(lambda r: False, ".replicas"),
    ),
    Rule(
        id="autoscaling-single-node-only",
        scope="role",
        cel="!has(self.autoscaling) || self.tensorParallelSize * self.pipelineParallelSize <= self.gpusPerNode",
        message="autoscaling is not supported on a role whose replica spans nodes (tensorParallelSize x "
        "pipelineParallelSize above gpusPerNode: a LeaderWorkerSet): remove autoscaling and set replicas",
        field=".autoscaling",
        check=_when(lambda r: r.autoscaling is not None and r.multi_node, ".autoscaling"),
    ),
    Rule(
        id="gpus-cover-tensor-parallel-size",
        scope="role",
        # Operator only: the apiserver's CEL cost estimate treats an int-or-string value as a string of unbounded
        # size, so any quantity() over resources exceeds the CRD's whole cost budget (measured on 1.35).
        cel=None,
        message=f"resources.limits['{GPU}'] must be at least tensorParallelSize (vLLM starts one worker per GPU; "
        "leave the GPU limit out and the operator sets it to tensorParallelSize)",
        field=".resources.limits",
        check=_when(_gpu_below_tp, ".resources.limits"),
    ),
    Rule(
        id="gpus-cover-pod-share",
        scope="role",
        cel=None,  # operator only, as gpus-cover-tensor-parallel-size
        message=f"resources.limits['{GPU}'] must be at least the GPUs each pod runs vLLM ranks on: "
        "tensorParallelSize x pipelineParallelSize, or gpusPerNode when a replica spans nodes (leave the GPU limit "
        "out and the operator sets it)",
        field=".resources.limits",
        check=_when(_gpu_below_pod_share, ".resources.limits"),
    ),
    Rule(
        id="replica-fills-whole-nodes",
        scope="role",
        cel="self.tensorParallelSize * self.pipelineParallelSize <= self.gpusPerNode"
        " || (self.tensorParallelSize * self.pipelineParallelSize) % self.gpusPerNode == 0",
        message="tensorParallelSize x pipelineParallelSize (the GPUs of one replica) must fit one node (at most "
        "gpusPerNode) or fill whole nodes (a multiple of gpusPerNode): vLLM gives every node of a replica the same "
        "number of ranks (e.g. tensorParallelSize 16 with gpusPerNode 8: two nodes)",
        field=".tensorParallelSize",
        check=_when(
            lambda r: r.gpus_per_replica > r.gpus_per_node and r.gpus_per_replica % r.gpus_per_node != 0,
            ".tensorParallelSize",
        ),
    ),
    Rule(
        id="requests-within-limits",
        scope="resources",
        cel=None,  # operator only, as gpus-cover-tensor-parallel-size
        message="resources.requests may not exceed resources.limits (Kubernetes would refuse every pod)",
        field=".requests",
        check=_requests_over_limits,
    ),
    Rule(
        id="side-channel-port-free",
        scope="kvTransfer",
        cel="!has(self.sideChannelPort) || !(self.sideChannelPort in [" + ", ".join(map(str, _ENGINE_PORTS)) + "])",
        message=f"kvTransfer.sideChannelPort may not be {contract.VLLM_PORT} (vLLM's API) or {contract.RUNTIME_PORT} "
        "(the runtime's probes and metrics): the engine pod already listens there",
        field=".sideChannelPort",
        check=_when(lambda k: k.side_channel_port in _ENGINE_PORTS, ".sideChannelPort"),
    ),
    Rule(
        id="rdma-fabric-needs-devices",
        scope="kvTransfer",
        cel="!(has(self.fabric) && self.fabric == 'rdma') || has(self.rdma)",
        message="kvTransfer.rdma (the RDMA device plugin's resourceName) is required with kvTransfer.fabric rdma",
        field=".rdma",
        check=_when(lambda k: k.fabric == "rdma" and k.rdma is None, ".rdma"),
    ),
    Rule(
        id="rdma-devices-need-rdma-fabric",
        scope="kvTransfer",
        cel="!has(self.rdma) || (has(self.fabric) && self.fabric == 'rdma')",
        message="kvTransfer.rdma is set but kvTransfer.fabric is not rdma: set fabric: rdma, or remove rdma",
        field=".fabric",
        check=_when(lambda k: k.rdma is not None and k.fabric != "rdma", ".fabric"),
    ),
    Rule(
        id="ucx-tls-active-messages",
        scope="kvTransfer",
        cel=f"!has(self.ucx) || !has(self.ucx.tls) || self.ucx.tls.startsWith('^') "
        f"|| self.ucx.tls.matches('{UCX_AM_TLS}')",
        message="kvTransfer.ucx.tls needs a transport UCX can send active messages on (tcp, sm, or an InfiniBand "
        "transport rc/ud/dc): with only cuda_copy/cuda_ipc NIXL's UCX agent does not start",
        field=".ucx.tls",
        check=_when(lambda k: _tls_lacks(k, UCX_AM_TLS), ".ucx.tls"),
    ),
    Rule(
        id="ucx-tls-rdma-transport",
        scope="kvTransfer",
        cel=f"!(has(self.fabric) && self.fabric == 'rdma') || !has(self.ucx) || !has(self.ucx.tls) "
        f"|| self.ucx.tls.startsWith('^') || self.ucx.tls.matches('{UCX_IB_TLS}')",
        message="kvTransfer.ucx.tls leaves out every InfiniBand/RoCE transport (rc, ud, dc, ib) while kvTransfer.fabric "
        "is rdma: KV would move over TCP",
        field=".ucx.tls",
        check=_when(lambda k: k.fabric == "rdma" and _tls_lacks(k, UCX_IB_TLS), ".ucx.tls"),
    ),
    Rule(
        id="host-pid-namespace-needs-cuda-ipc",
        scope="kvTransfer",
        cel=f"!has(self.processNamespace) || self.processNamespace != 'Host' || !has(self.ucx) || !has(self.ucx.tls) "
        f"|| self.ucx.tls.startsWith('^') || self.ucx.tls.matches('{UCX_CUDA_IPC_TLS}')",
        message="kvTransfer.processNamespace Host shares the node's PID namespace only so that UCX can use cuda_ipc, "
        "and kvTransfer.ucx.tls leaves cuda_ipc out (add cuda_ipc, or keep processNamespace Pod)",
        field=".processNamespace",
        check=_when(lambda k: k.process_namespace == "Host" and _tls_lacks(k, UCX_CUDA_IPC_TLS), ".processNamespace"),
    ),
    Rule(
        id="pair-pod-needs-cuda-ipc",
        scope="kvTransfer",
        cel=f"!({_PAIR_KV}) || !has(self.ucx) || !has(self.ucx.tls) || self.ucx.tls.startsWith('^') "
        f"|| self.ucx.tls.matches('{UCX_CUDA_IPC_TLS}')",
        message="kvTransfer.processNamespace Pair shares one PID namespace between prefill and decode only so that UCX "
        "can use cuda_ipc, and kvTransfer.ucx.tls leaves cuda_ipc out (add cuda_ipc, or keep processNamespace Pod)",
        field=".processNamespace",
        check=_when(lambda k: k.process_namespace == "Pair" and _tls_lacks(k, UCX_CUDA_IPC_TLS), ".processNamespace"),
    ),
    Rule(
        id="pair-ports-free",
        scope="kvTransfer",
        cel=f"!({_PAIR_KV}) || !has(self.sideChannelPort) || (self.sideChannelPort <= {_PAIR_SIDE_MAX} "
        f"&& !(self.sideChannelPort in {list(_PAIR_PORTS)}) "
        f"&& !(self.sideChannelPort + {contract.PAIR_DECODE_SIDE_CHANNEL_OFFSET} in {list(_PAIR_PORTS)}))",
        message=f"kvTransfer.sideChannelPort collides in a pair pod: prefill listens on it, decode on it + "
        f"{contract.PAIR_DECODE_SIDE_CHANNEL_OFFSET} (at most 65535), and neither may be one of "
        f"{', '.join(map(str, _PAIR_PORTS))} (the engines' APIs and runtimes, the in-pod router and its metrics)",
        field=".sideChannelPort",
        check=_when(_pair_ports_taken, ".sideChannelPort"),
    ),
    Rule(
        id="autoscaling-min-not-above-max",
        scope="autoscaling",
        cel="self.minReplicas <= self.maxReplicas",
        message="autoscaling.minReplicas must be <= autoscaling.maxReplicas",
        field=".minReplicas",
        check=_when(lambda a: a.min_replicas > a.max_replicas, ".minReplicas"),
    ),
    Rule(
        id="autoscaling-signals-unique",
        scope="autoscaling",
        cel="!has(self.metrics) || self.metrics.all(m, self.metrics.filter(n, n.signal == m.signal).size() == 1)",
        message="autoscaling.metrics may name each signal once",
        field=".metrics",
        check=_when(lambda a: len({m.signal for m in a.metrics}) != len(a.metrics), ".metrics"),
    ),
    Rule(
        id="kv-cache-usage-target-fraction",
        scope="autoscalingMetric",
        cel="self.signal != 'kvCacheUsage' || self.target <= 1.0",
        message="the kvCacheUsage target is a fraction of the KV cache (e.g. 0.7), at most 1",
        field=".target",
        check=_when(lambda m: m.signal == "kvCacheUsage" and m.target > 1, ".target"),
    ),
    Rule(
        id="ratio-min-not-above-max",
        scope="ratio",
        cel="!has(self.minDecodePerPrefill) || !has(self.maxDecodePerPrefill)"
        " || self.minDecodePerPrefill <= self.maxDecodePerPrefill",
        message="ratio.minDecodePerPrefill must be <= ratio.maxDecodePerPrefill",
        field=".minDecodePerPrefill",
        check=_when(
            lambda r: (
                r.min_decode_per_prefill is not None
                and r.max_decode_per_prefill is not None
                and r.min_decode_per_prefill > r.max_decode_per_prefill
            ),
            ".minDecodePerPrefill",
        ),
    ),
    Rule(
        id="ratio-has-a-bound",
        scope="ratio",
        cel="has(self.minDecodePerPrefill) || has(self.maxDecodePerPrefill)",
        message="ratio needs minDecodePerPrefill, maxDecodePerPrefill or both",
        field="",
        check=_when(lambda r: r.min_decode_per_prefill is None and r.max_decode_per_prefill is None),
    ),
    *_RATIO_ROWS,
    *_PAIR_ROWS,
    Rule(
        id="cache-pvc-needs-claim",
        scope="cache",
        cel="!has(self.type) || self.type != 'pvc' || has(self.claimName)",
        message="cache.claimName is required when cache.type is pvc",
        field="",
        check=_when(lambda s: s.type == "pvc" and s.claim_name is None),
    ),
    Rule(
        id="pod-template-container-is-vllm",
        scope="container",
        cel="self.name == 'vllm'",
        message="podTemplate.spec.containers may only name the `vllm` container (sidecars are not supported)",
        field=".name",
        check=_when(lambda ct: ct.name != "vllm", ".name"),
    ),
    Rule(
        id="pod-template-no-security-annotations",
        scope="podMetadata",
        cel=f"!has(self.annotations) || !self.annotations.exists(k, {_SECURITY_ANNOTATIONS_CEL})",
        message="podTemplate.metadata.annotations may not choose a security profile ("
        + ", ".join(p + "*" for p in SECURITY_ANNOTATION_PREFIXES)
        + "): the operator sets the pod's seccomp profile and the runtime's default AppArmor profile applies",
        field=".annotations",
        check=_security_annotations,
    ),
    Rule(
        id="pod-template-no-system-priority",
        scope="podSpec",
        cel=f"!has(self.priorityClassName) || !self.priorityClassName.startsWith('{SYSTEM_PRIORITY_PREFIX}')",
        message=f"podTemplate.spec.priorityClassName may not name a `{SYSTEM_PRIORITY_PREFIX}*` PriorityClass "
        "(system-node-critical, system-cluster-critical: they are for the cluster's own components, which a model "
        "server would preempt)",
        field=".priorityClassName",
        check=_when(lambda ps: (ps.priority_class_name or "").startswith(SYSTEM_PRIORITY_PREFIX), ".priorityClassName"),
    ),
    *_forbidden_rows("podSpec", FORBIDDEN_POD_FIELDS, "podTemplate.spec"),
    *_forbidden_rows("container", FORBIDDEN_CONTAINER_FIELDS, "podTemplate.spec.containers[]"),
    *_forbidden_rows("volume", FORBIDDEN_VOLUME_FIELDS, "podTemplate.spec.volumes[]"),
    *_forbidden_rows("projection", FORBIDDEN_PROJECTION_FIELDS, "podTemplate.spec.volumes[].projected.sources[]"),
)


def _dns1035(name: str) -> bool:
    return re.fullmatch(DNS1035, name) is not None


def cel_rules(scope: Scope) -> list[Any]:
    """The `x-kubernetes-validations` of a schema node."""
    out = []
    for r in RULES:
        if r.scope == scope and r.cel is not None:
            rule = {"rule": r.cel, "message": r.message}
            if r.field and scope != "root":  # fieldPath cannot point into metadata
                rule["fieldPath"] = r.field
            out.append(rule)
    return out


def violations(scope: Scope, obj: Any, path: str) -> list[SpecViolation]:
    """The Python twins of the scope's rules on the typed `obj` found at field path `path`."""
    out = []
    for r in RULES:
        if r.scope == scope:
            for sub in r.check(obj):
                field = (path + sub) if path else sub.lstrip(".")
                out.append(SpecViolation(field, r.id, r.message))
    return out
