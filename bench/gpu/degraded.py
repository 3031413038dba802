"""The operator's own degraded-mode decision for the bench's traffic (issue #38).

The bench has no operator and no Service. `Decider` asks `hpd_operator.builders.fallback.choose` (the pure function
the operator calls on every reconcile) where the endpoint goes, given each role's readiness as the bench observes it
(the runtime's /readyz, as the kubelet's readiness probe sees it), and the bench points its traffic there: the
router while both roles are Ready, prefill's vLLM directly while no decode is Ready (and decode's while no prefill
is). The CR is the sample CR the rendered manifests came from (bench/gpu/sample-crs.yaml), validated by the
operator's own model; the plan is one generation that has served (degraded mode never starts at a generation's start).
Nothing of the decision is copied here: only the pods' shape (labels from the operator's `serving_selector`, a
Ready condition) is built.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
SAMPLE_CRS = Path(__file__).resolve().parent / "sample-crs.yaml"
ROUTER = "router"


def _import_operator() -> Any:
    for p in (REPO / "operator", REPO / "images" / "runtime"):
        if str(p) not in sys.path:
            sys.path.append(str(p))
    from hpd_operator.api.models import HybridPDDeployment
    from hpd_operator.api.names import serving_selector
    from hpd_operator.builders import fallback
    from hpd_operator.generations import Generation, Plan

    return HybridPDDeployment, serving_selector, fallback, Generation, Plan


def sample_cr(name: str, path: Path = SAMPLE_CRS) -> dict[str, Any]:
    """The CR `name` of sample-crs.yaml (or of sample-crs.json beside it, the same list, where PyYAML is missing)."""
    try:
        import yaml

        docs = list(yaml.safe_load_all(path.read_text()))
    except ImportError:
        docs = json.loads(path.with_suffix(".json").read_text())
    for doc in docs:
        if doc and (doc.get("metadata") or {}).get("name") == name:
            return dict(doc)
    raise KeyError(f"no CR named {name} in {path}")


class Decider:
    """decide({'prefill': ready, 'decode': ready}) -> 'router', or the role the endpoint serves colocated on."""

    def __init__(self, cr_name: str, generation_hash: str = "bench") -> None:
        model, self._selector, self._fallback, gen_cls, plan_cls = _import_operator()
        self.cr = model.model_validate(sample_cr(cr_name))
        gen = gen_cls(generation_hash, 1)
        self.plan = plan_cls(desired=gen, route=gen, keep=frozenset({generation_hash}), latest=1,
                             served=frozenset({generation_hash}))  # fmt: skip
        self.name, self.hash = cr_name, generation_hash
        self.source = f"{self._fallback.__name__}.choose ({Path(self._fallback.__file__).relative_to(REPO)})"

    def pods(self, ready: Mapping[str, bool]) -> dict[str, list[dict[str, Any]]]:
        return {
            role: [{"metadata": {"name": f"{self.name}-{role}-0", "labels": self._selector(self.name, role, self.hash, False)},
                    "spec": {},
                    "status": {"conditions": [{"type": "Ready", "status": "True" if ok else "False"}]}}]
            for role, ok in ready.items()
        }  # fmt: skip

    def decide(self, ready: Mapping[str, bool]) -> str:
        fb = self._fallback.choose(self.cr, self.plan, self.pods(ready))
        return ROUTER if fb is None else str(fb.role)
