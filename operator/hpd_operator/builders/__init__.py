"""Pure builders: the typed CR + its profile -> every child manifest (plain dicts).

No I/O, no kopf, no client, no clock, no env: `render` prints exactly what the operator applies.
Owner references are added by the handler (they need the live object's uid), never here.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from hpd_operator.api.models import HybridPDDeployment
from hpd_operator.api.processns import pairs
from hpd_operator.builders.autoscaling import build_autoscalers
from hpd_operator.builders.common import Manifest
from hpd_operator.builders.engine import (
    build_engine_deployment,
    build_engine_pdb,
    build_engine_service,
    build_kv_reporter_rbac,
    engine_replicas,
    role_templates,
)
from hpd_operator.builders.fallback import Fallback, build_fallback_network_policy
from hpd_operator.builders.lws import build_engine_group
from hpd_operator.builders.monitoring import build_pod_monitors
from hpd_operator.builders.network import build_network_policies
from hpd_operator.builders.pair import build_pair_pdb, pair_pod_template
from hpd_operator.builders.router import (
    build_router_deployment,
    build_router_pdb,
    build_router_rbac,
    build_router_service,
)
from hpd_operator.generations import Generation, Plan, fresh_plan, hash_templates
from hpd_operator.profile_model import Profile
from hpd_operator.scaling import Bounds
from hpd_runtime import contract

__all__ = ["Manifest", "build_all", "engine_templates", "generation_hash", "group_roles"]


def group_roles(cr: HybridPDDeployment) -> frozenset[str]:
    """The roles the spec runs as LeaderWorkerSet groups (a replica that spans nodes)."""
    return frozenset(r for r in contract.ROLES if cr.spec.role(r).multi_node)


def engine_templates(cr: HybridPDDeployment, profile: Profile) -> dict[str, Any]:
    """What the spec's generation is made of, built once per reconcile: each role's templates
    (builders.engine.role_templates), or with pair pods (spec.kvTransfer.processNamespace Pair) the one pair pod
    template under `pair` (builders.pair). The generation's hash is taken over exactly these (generation_hash), and
    its workloads are built from them."""
    if pairs(cr.spec.kv_transfer):
        return {contract.COMPONENT_PAIR: pair_pod_template(cr, profile)}
    return role_templates(cr, profile)


def generation_hash(cr: HybridPDDeployment, profile: Profile, templates: Mapping[str, Any] | None = None) -> str:
    """The id of the generation the spec asks for: a hash of its engine templates (engine_templates; replicas, the
    router, monitoring and network policy are not in them), so a one-pod role hashes as it did before multi-node
    roles, and a shape change (Pod to Pair too) is a new generation. `templates`: the ones already built for this
    reconcile."""
    return hash_templates(templates if templates is not None else engine_templates(cr, profile))


def _pair_workloads(
    cr: HybridPDDeployment, template: Mapping[str, Any], gen: Generation, serving: bool, start: int | None
) -> list[Manifest]:
    """Pair pods: one Deployment `<cr>-pair-<gen>` at decode's replicas (decode's autoscaling scales it; prefill's
    equal them, validation says so) and its PodDisruptionBudget; no headless Services (decode's pair check asks the
    pod's own prefill, the router discovers the pods)."""
    replicas = engine_replicas(cr, "decode", serving, start)
    out = [build_engine_deployment(cr, template, contract.COMPONENT_PAIR, gen, replicas)]
    pdb = build_pair_pdb(cr, gen)
    return out + ([pdb] if pdb is not None else [])


def _role_workloads(
    cr: HybridPDDeployment,
    templates: Mapping[str, Any],
    gen: Generation,
    serving: bool,
    start: Mapping[str, int] | None,
) -> list[Manifest]:
    """Each role in pods of its own: its headless Service, its Deployment (or LeaderWorkerSet), its PDB."""
    out: list[Manifest] = []
    for role in contract.ROLES:
        out.append(build_engine_service(cr, role, gen))
        if cr.spec.role(role).multi_node:
            out.append(build_engine_group(cr, templates[role], role, gen))
        else:
            replicas = engine_replicas(cr, role, serving, (start or {}).get(role))
            out.append(build_engine_deployment(cr, templates[role], role, gen, replicas))
        pdb = build_engine_pdb(cr, role, gen)
        if pdb is not None:
            out.append(pdb)
    return out


def build_all(  # noqa: PLR0913 - the CR, its profile, and what this reconcile decided (optional; render passes none)
    cr: HybridPDDeployment,
    profile: Profile,
    plan: Plan | None = None,
    bounds: Mapping[str, Bounds] | None = None,
    start: Mapping[str, int] | None = None,
    *,
    fallback: Fallback | None = None,
    templates: Mapping[str, Any] | None = None,
) -> list[Manifest]:
    """Every object the operator applies for `cr`, in apply order (RBAC before the router that uses it): the engines
    of the generation the spec asks for, and the router routing to `plan.route` (hpd_operator.generations). Without
    a plan (nothing runs yet; `render`): generation 1, routed at once. Other generations the plan keeps are not
    built: they stay as they are.

    Autoscaling roles: the HPAs scale the generation the router routes to (`bounds`: their min/max from
    scaling.compute_bounds; default: the user's ranges). While the spec's generation does not serve yet, its
    autoscaling roles run at `start` (scaling.start_replicas: what the serving generation runs). A multi-node role
    (a LeaderWorkerSet) never autoscales (validation refuses it), so its replicas are always the spec's.

    `fallback`: degraded mode (hpd_operator.builders.fallback): the endpoint Service selects the role that is left
    of `plan.route`, and `<cr>-fallback` opens vLLM's port of those pods as the router's is.

    `templates`: the engine templates of the spec's generation (engine_templates), when the caller already built them
    to hash them (the reconcile's plan): the workloads are built from the very templates the hash was taken over."""
    templates = templates if templates is not None else engine_templates(cr, profile)
    plan = plan or fresh_plan(generation_hash(cr, profile, templates), group_roles(cr))
    serving = not plan.rolling
    # ServiceAccounts and RBAC first: apply walks this list in order, and a workload created before its
    # ServiceAccount fails its first pods ("serviceaccount not found") until the ReplicaSet controller retries.
    out: list[Manifest] = [*build_router_rbac(cr), *build_kv_reporter_rbac(cr)]
    if pairs(cr.spec.kv_transfer):
        template = templates[contract.COMPONENT_PAIR]
        out += _pair_workloads(cr, template, plan.desired, serving, (start or {}).get("decode"))
    else:
        out += _role_workloads(cr, templates, plan.desired, serving, start)
    out.append(build_router_service(cr, fallback))
    out.append(build_router_deployment(cr, plan.route))
    router_pdb = build_router_pdb(cr)
    if router_pdb is not None:
        out.append(router_pdb)
    out += build_pod_monitors(cr)
    out += build_network_policies(cr)
    if fallback is not None and cr.spec.network_policy.enabled:
        out.append(build_fallback_network_policy(cr, fallback))
    out += build_autoscalers(cr, plan.route, bounds)
    return out
