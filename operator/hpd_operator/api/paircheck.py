"""The one decision about decode's pair check, and everything that follows from it (pure).

Whether a decode pod proves one real prefill->decode round trip before it reports Ready is asked by the profile (the
`HPD_WARMUP_PAIR_CHECK` / `HPD_CANARY_SECONDS` env, the pod identity, `--enable-prompt-tokens-details`), the
builders (the kv-reporter ServiceAccount, its token and RBAC) and the status (DataPathVerified). They all ask
`pair_check(spec.warmup)`; none of them reads `warmup.pairCheck`, `warmup.enabled` or `warmup.canarySeconds` for
this on its own, so the env, the identity, the token and the status cannot disagree.
"""

from __future__ import annotations

from dataclasses import dataclass

from hpd_operator.api.models import WarmupSpec
from hpd_runtime import contract


@dataclass(frozen=True)
class PairCheck:
    """What the CR's warmup settings mean for the pair check, the canary and the KV path report."""

    on: bool
    """Decode runs the pair check: spec.warmup.enabled and spec.warmup.pairCheck (no warmup, no pair check)."""
    canary_seconds: int
    """The canary's period after Ready (spec.warmup.canarySeconds); 0 when off, and always 0 without the pair check
    (the canary re-proves the pair the check proved)."""

    def runs_on(self, role: contract.Role) -> bool:
        """Whether pods of `role` run the pair check (only decode does)."""
        return self.on and role == "decode"

    def reports_kv_path(self, role: contract.Role, group_role: contract.GroupRole | None = None) -> bool:
        """Whether a pod of `role` measures and reports the KV path, and so gets its identity (downward API), the
        kv-reporter Lease's name and the kv-reporter ServiceAccount's token: a pair-checking decode (a group's
        leader, not its workers)."""
        return self.runs_on(role) and group_role != contract.GROUP_WORKER

    @property
    def canary(self) -> str:
        """The canary in words (status messages)."""
        return f"re-proved every {self.canary_seconds} s (canary)" if self.canary_seconds else "canary off"


def pair_check(warmup: WarmupSpec) -> PairCheck:
    """The pair-check decision of a CR's spec.warmup (see the module doc)."""
    on = warmup.enabled and warmup.pair_check
    return PairCheck(on=on, canary_seconds=warmup.canary_seconds if on else 0)
