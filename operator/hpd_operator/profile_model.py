"""What the profile renders (pure data): per-role env entries, `vllm serve` args, the injected settings with their
reasons, and the fabric's pod needs; `Profile.status()` is status.profile. hpd_operator.profile computes it."""

from __future__ import annotations

import copy
from typing import Any

from pydantic import BaseModel, ConfigDict

from hpd_operator.api.models import InjectionStatus, ProfileStatus, VersionRuleStatus
from hpd_runtime import contract


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class EnvEntry(_Frozen):
    """One container env entry: a literal `value`, a downward-API `field_path` (`status.podIP`), or the user's own
    core/v1 EnvVarSource (`value_from`: secretKeyRef, configMapKeyRef, resourceFieldRef, fieldRef) as written."""

    name: str
    value: str | None = None
    field_path: str | None = None
    value_from: dict[str, Any] | None = None

    def to_k8s(self) -> dict[str, object]:
        if self.value_from is not None:
            return {"name": self.name, "valueFrom": copy.deepcopy(self.value_from)}
        if self.field_path is not None:
            return {"name": self.name, "valueFrom": {"fieldRef": {"fieldPath": self.field_path}}}
        return {"name": self.name, "value": self.value or ""}


class Injection(_Frozen):
    """A setting the operator injected, with the reason shown in status.profile."""

    setting: str
    value: str
    reason: str


class RoleProfile(_Frozen):
    role: contract.Role
    tensor_parallel_size: int
    replicas: int
    env: tuple[EnvEntry, ...]
    """In order (HPD_POD_IP precedes the entries that reference it), then the user's spec.env, then where the pod
    belongs (HPD_INSTANCE, HPD_CACHE_DIR, decode's HPD_PREFILL_SERVICE): every HPD_* entry of the container."""
    args: tuple[str, ...]
    """`vllm serve` arguments, without the leading `vllm serve`."""
    injections: tuple[Injection, ...]
    devices: tuple[tuple[str, int], ...] = ()
    """Extended resources the fabric needs per pod (limits = requests), e.g. (("rdma/ib", 1),)."""
    capabilities: tuple[str, ...] = ()
    """Linux capabilities the fabric adds to the vLLM container (everything else stays dropped)."""
    host_pid: bool = False
    """The pod runs in the node's PID namespace (spec.kvTransfer.processNamespace Host: hpd_operator.api.processns)."""
    nodes: int = 1
    """Pods of one replica: 1, or the nodes a replica spans (a LeaderWorkerSet group of this size)."""
    gpus_per_pod: int = 1
    """The GPUs each pod gets (nvidia.com/gpu unless spec.<role>.resources says otherwise)."""
    worker_args: tuple[str, ...] = ()
    """What the workers of a replica that spans nodes add to `args` (`--headless`: vLLM's ranks without an API)."""

    @property
    def multi_node(self) -> bool:
        return self.nodes > 1

    def env_k8s(self) -> list[dict[str, object]]:
        return [e.to_k8s() for e in self.env]


class Profile(_Frozen):
    vllm_version: str
    row: str
    hybrid: bool
    hybrid_reason: str
    model: str
    """The `--model` string (identical on both roles: it is in the NIXL compatibility hash)."""
    served_model_name: str
    ssd_chunk_size: int | None
    prefill: RoleProfile
    decode: RoleProfile
    warnings: tuple[str, ...] = ()
    """Accepted but risky settings: shown in the Ready condition's message and posted once as a Warning Event."""
    rules: tuple[VersionRuleStatus, ...] = ()
    """The version-table rules that applied (hybrid-only rules only for hybrid models)."""

    def role(self, role: contract.Role) -> RoleProfile:
        return self.prefill if role == "prefill" else self.decode

    def status(self) -> dict[str, object]:
        """status.profile (camelCase), the injections of both roles with their reasons."""
        inj = [
            InjectionStatus(role=rp.role, setting=i.setting, value=i.value, reason=i.reason)
            for rp in (self.prefill, self.decode)
            for i in rp.injections
        ]
        ps = ProfileStatus(
            vllm_version=self.vllm_version,
            version_row=self.row,
            hybrid=self.hybrid,
            injections=inj,
            rules=list(self.rules),
            warnings=list(self.warnings),
        )
        return ps.model_dump(by_alias=True, exclude_none=True)


class RoleWriter:
    """One role's settings, each written with the reason status.profile shows for it, in one call: `env(...)` and
    `field(...)` return the env entry, `flag(...)` the argv items, `pod(...)` records a pod-spec setting the builders
    write; every one of the operator's env entries is written here, with its reason (the user's spec.env is passed
    through as written: `user_env`). status.profile lists the injections in the order of these calls."""

    def __init__(self) -> None:
        self.injections: list[Injection] = []

    def env(self, name: str, value: str, why: str, *, shown: str | None = None) -> EnvEntry:
        """A literal env entry; `shown`: the value status.profile names instead (the downward API's field)."""
        self._explain(name, value if shown is None else shown, why)
        return EnvEntry(name=name, value=value)

    def field(self, name: str, field_path: str, why: str) -> EnvEntry:
        """An env entry from the downward API (`status.podIP`, `metadata.uid`)."""
        self._explain(name, field_path, why)
        return EnvEntry(name=name, field_path=field_path)

    @staticmethod
    def user_env(name: str, value: str | None, value_from: dict[str, Any] | None) -> EnvEntry:
        """An entry of the user's spec.env, as written (not an injection: status.profile lists what the operator
        set)."""
        if value_from is not None:
            return EnvEntry(name=name, value_from=dict(value_from))
        return EnvEntry(name=name, value=value or "")

    def flag(self, flag: str, value: str | None = None, why: str | None = None) -> list[str]:
        """`flag` (a switch) or `flag value`."""
        self._explain(flag, value or "", why)
        return [flag] if value is None else [flag, value]

    def pod(self, setting: str, value: str, why: str) -> None:
        """A pod-spec setting the builders write from the role profile (a device, a capability): its reason."""
        self._explain(setting, value, why)

    def _explain(self, setting: str, value: str, why: str | None) -> None:
        if why is not None:
            self.injections.append(Injection(setting=setting, value=value, reason=why))
