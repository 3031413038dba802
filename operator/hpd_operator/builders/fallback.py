"""Degraded mode (spec.router.degradedMode, on by default): the endpoint serves colocated on the role that is left.

A prefill or a decode engine is a complete vLLM server: a request that carries no `kv_transfer_params` runs on it end
to end, whatever its kv_role: NixlConnector's scheduler acts only on requests whose kv_transfer_params ask for a
remote prefill or decode, and the runtime's warmup already sends such plain requests to both roles. So while the generation the router routes to has Ready pods
of one role and no Ready pod of the other, the `<cr>` Service selects that generation's Ready role directly, and
the router (whose /readiness fails without both roles) is out of the path; once a pod of the missing role is Ready
again (a decode only after its pair check with the prefill pods passed: its readiness gate; a prefill once a decode's
report lists it as pair-checked, see `choose`) and a router pod is Ready, the Service selects the router again. It
never mixes generations (the pods of `plan.route` only) and never starts at a generation's start (a generation that
has not served yet has no Ready decode because its decodes still pair-check: not a loss). The
engines' NetworkPolicy admits only the router on vLLM's port; while degraded, `<cr>-fallback` admits on that port
of the serving pods what the router's policy admits (anyone): they are the endpoint."""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from hpd_operator.api.models import HybridPDDeployment
from hpd_operator.api.names import selector_labels, serving_selector, short_name
from hpd_operator.api.processns import pairs
from hpd_operator.builders.common import Manifest, metadata
from hpd_operator.conditions import Reason
from hpd_operator.generations import Generation, Plan
from hpd_runtime import contract

NETWORK_POLICY_SUFFIX = "fallback"
ROUTER_SERVING = "router"
MISSING_REASON: dict[str, Reason] = {"decode": Reason.DECODE_UNAVAILABLE, "prefill": Reason.PREFILL_UNAVAILABLE}


@dataclass(frozen=True)
class Fallback:
    """The endpoint serves colocated on `role`'s pods of `generation`: no pod of `missing` is Ready."""

    role: str
    missing: str
    generation: Generation
    awaiting_router: bool = False
    """The missing role is Ready again but no router pod is Ready yet: the fallback holds (see `choose`)."""
    awaiting_pair_check: bool = False
    """Prefill pods are Ready again but no decode has passed its pair check with one of them yet: the fallback holds
    (see `choose`)."""

    @property
    def reason(self) -> Reason:
        return MISSING_REASON[self.missing]

    @property
    def serving(self) -> str:
        """status.serving (the `Serving` column of `kubectl get hpd -o wide`)."""
        return f"colocated on {self.role}"

    @property
    def message(self) -> str:
        waits = []
        if self.awaiting_pair_check:
            waits.append(f"a {self.role} has passed its pair check with one of them")
        if self.awaiting_router:
            waits.append("a router pod is Ready")
        if waits:
            return (
                f"serving colocated on {self.role}: {self.missing} pods of generation {self.generation.number} are "
                f"Ready again; the endpoint selects its {self.role} pods directly until {' and '.join(waits)}"
            )
        return (
            f"serving colocated on {self.role}: no Ready {self.missing} pod of generation {self.generation.number}; "
            f"the endpoint selects its {self.role} pods directly until a {self.missing} pod is Ready again"
        )

    def selector(self, cr_name: str) -> dict[str, str]:
        """The pods that serve: the role's API pods of the generation (a group's leaders)."""
        g = self.generation
        return serving_selector(cr_name, self.role, g.hash, self.role in g.groups)


def _ready(pod: Mapping[str, Any], nodes: Collection[str] | None) -> bool:
    """Ready, not being deleted, and not bound to a node that no longer exists (`nodes`: the nodes that exist, None
    unknown), as the status counts a role's Ready pods."""
    if (pod.get("metadata") or {}).get("deletionTimestamp"):
        return False
    node = (pod.get("spec") or {}).get("nodeName")
    if node and nodes is not None and node not in nodes:
        return False
    conds = (pod.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conds)


def ready_api_pod_list(
    cr_name: str, gen: Generation, role: str, pods: Sequence[Mapping[str, Any]], nodes: Collection[str] | None = None
) -> list[Mapping[str, Any]]:
    """The pods of `role` in `gen` that serve vLLM's API and are Ready (not being deleted); a pair pod holds both roles
    (Ready only when both engines and its router are)."""
    wants = (
        serving_selector(cr_name, role, gen.hash, role in gen.groups),
        selector_labels(cr_name, contract.COMPONENT_PAIR, gen.hash),
    )
    out = []
    for p in pods:
        have = (p.get("metadata") or {}).get("labels") or {}
        if any(all(have.get(k) == v for k, v in want.items()) for want in wants) and _ready(p, nodes):
            out.append(p)
    return out


def ready_api_pods(
    cr_name: str, gen: Generation, role: str, pods: Sequence[Mapping[str, Any]], nodes: Collection[str] | None = None
) -> int:
    """How many pods of `role` in `gen` serve vLLM's API and are Ready (not being deleted)."""
    return len(ready_api_pod_list(cr_name, gen, role, pods, nodes))


@dataclass(frozen=True)
class PrefillsChecked:
    """How many Ready prefill API pods of a generation the Ready decodes' reports list as pair-checked."""

    ready: int
    by_one: int
    """Listed by at least one decode."""
    by_every: int
    """Listed by every decode whose report lists its peers."""


def verified_ready_prefills(
    cr_name: str,
    gen: Generation,
    prefill_pods: Sequence[Mapping[str, Any]],
    verified: Sequence[Collection[str]] | None,
    nodes: Collection[str] | None = None,
) -> PrefillsChecked | None:
    """The Ready prefill API pods of `gen` against the decodes' verified peers (`verified`: per decode, the prefill
    pod uids, podevents.verified_prefills); None when no report lists its peers."""
    if verified is None:
        return None
    uids = [str((p.get("metadata") or {}).get("uid")) for p in ready_api_pod_list(cr_name, gen, "prefill",
                                                                                  prefill_pods, nodes)]  # fmt: skip
    checked = [sum(uid in peers for peers in verified) for uid in uids]
    return PrefillsChecked(len(uids), sum(n > 0 for n in checked), sum(n == len(verified) for n in checked))


def choose(  # noqa: PLR0913 - the plan and its pods, plus keyword-only observations (each optional)
    cr: HybridPDDeployment,
    plan: Plan,
    pods: Mapping[str, Sequence[Mapping[str, Any]]],
    nodes: Collection[str] | None = None,
    *,
    router_pods: Sequence[Mapping[str, Any]] | None = None,
    serving: str | None = None,
    verified_prefills: Sequence[Collection[str]] | None = None,
) -> Fallback | None:
    """Degraded mode for `plan.route` from its pods (by role; `nodes`: the nodes that exist, None unknown), or None:
    off in the spec, the generation never served, both roles have a Ready pod, or neither has (nothing serves).

    Back to the router only once a router pod is Ready: while a role is missing the router's /readiness fails, and
    the kubelet sees it pass again only at a readiness probe after the role's return (up to its period later). A
    Service that selected the router pods before then would have no Ready endpoint, and kube-proxy refuses every
    connection to it (measured on the real node: 140 of 144 requests refused in the 0.2 s between a replacement
    prefill turning Ready and the first answer through the router). So a fallback in force (`serving`, the status's
    `colocated on <role>`) holds while its role still has a Ready pod and no router pod (`router_pods`) is Ready.

    And back to P/D only once a decode has passed its pair check again: a returning decode turns Ready only after it
    (its readiness gate), but a decode that stayed Ready checks a replacement prefill only at its monitor's next poll
    (HPD_PAIR_RECHECK_SECONDS; on the real node P/D through the new prefill resumed 8.6 s before that check passed).
    So a fallback in force on decode also holds while no Ready decode's report lists one of the Ready prefill pods
    among its verified peers (`verified_prefills`: podevents.verified_prefills); None (no report lists its peers:
    none yet, or an older runtime) holds nothing, as before."""
    if not cr.spec.router.degraded_mode or plan.route.hash not in plan.served or pairs(cr.spec.kv_transfer):
        return None  # pair pods: a pair with a dead container is NotReady and leaves the router's pool, no fallback
    name, gen = cr.metadata.name, plan.route
    ready: dict[str, int] = {r: ready_api_pods(name, gen, r, pods.get(r) or [], nodes) for r in contract.ROLES}
    for role, missing in (("prefill", "decode"), ("decode", "prefill")):
        if ready[role] > 0 and ready[missing] == 0:
            return Fallback(role, missing, gen)
    held = next((r for r in contract.ROLES if serving == f"colocated on {r}"), None)
    if held is None or ready[held] == 0:
        return None
    router = router_pods is not None and not any(_ready(p, nodes) for p in router_pods)
    checked = verified_ready_prefills(name, gen, pods.get("prefill") or [], verified_prefills, nodes)
    pair = held == "decode" and checked is not None and checked.by_one == 0
    if not (router or pair):
        return None
    missing = next(r for r in contract.ROLES if r != held)
    return Fallback(held, missing, gen, awaiting_router=router, awaiting_pair_check=pair)


def build_fallback_network_policy(cr: HybridPDDeployment, fallback: Fallback) -> Manifest:
    """`<cr>-fallback`: the serving pods admit anyone on vLLM's port, as the router admits anyone on its port (they
    are the endpoint now). NetworkPolicies add up: the engines' own policy still holds for every other port."""
    name, ns = cr.metadata.name, cr.metadata.namespace
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": metadata(name, ns, short_name(name, NETWORK_POLICY_SUFFIX), "engines"),
        "spec": {
            "podSelector": {"matchLabels": fallback.selector(name)},
            "policyTypes": ["Ingress"],
            "ingress": [{"ports": [{"protocol": "TCP", "port": contract.PORT_NAME_HTTP}]}],
        },
    }
