"""Pure builders: the typed CR + its profile -> every child manifest (plain dicts).

No I/O, no kopf, no client, no clock, no env: `render` prints exactly what the operator applies.
Owner references are added by the handler (they need the live object's uid), never here.
"""

from __future__ import annotations

from collections.abc import Mapping

from hpd_operator.api.models import HybridPDDeployment
from hpd_operator.builders.autoscaling import build_autoscalers
from hpd_operator.builders.common import Manifest
from hpd_operator.builders.engine import build_engine_deployment, build_engine_pdb, build_engine_service
from hpd_operator.builders.monitoring import build_pod_monitors
from hpd_operator.builders.network import build_network_policies
from hpd_operator.builders.router import build_router_deployment, build_router_rbac, build_router_service
from hpd_operator.profile import Profile
from hpd_operator.scaling import Bounds
from hpd_runtime import contract

__all__ = ["Manifest", "build_all"]


def build_all(cr: HybridPDDeployment, profile: Profile, bounds: Mapping[str, Bounds] | None = None) -> list[Manifest]:
    """Every object the operator applies for `cr`, in apply order (RBAC before the router that uses it); `bounds`:
    the autoscalers' min/max (scaling.compute_bounds; default: the user's ranges)."""
    out: list[Manifest] = []
    for role in contract.ROLES:
        out.append(build_engine_service(cr, role))
        out.append(build_engine_deployment(cr, profile, role))
        pdb = build_engine_pdb(cr, role)
        if pdb is not None:
            out.append(pdb)
    out += build_router_rbac(cr)
    out.append(build_router_service(cr))
    out.append(build_router_deployment(cr))
    out += build_pod_monitors(cr)
    out += build_network_policies(cr)
    out += build_autoscalers(cr, bounds)
    return out
