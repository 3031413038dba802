"""Per-role autoscaling on the real control plane (#28): the operator's HPAs, the kube-controller-manager's HPA
controller, prometheus-adapter (built from its Go module, serving external.metrics.k8s.io through the apiserver's
aggregator) and a real Prometheus scraping a loopback exporter per engine pod whose values the test drives
(engine_metrics.py).

Every change of a Deployment's replicas is recorded from one watch (so the decode/prefill pairs are in the order the
apiserver stored them), with the field manager that owns `spec.replicas` after it: the ratio must hold at every
step, and no change may be the operator's.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client, watch
from monitoring.prom import Prometheus  # tests/ is on sys.path (rootdir-relative)

from hpd_devcluster import adapter
from hpd_devcluster.testing import wait_for
from hpd_operator.monitoring.__main__ import ADAPTER_RULES_PATH
from hpd_runtime import contract

from .conftest import Operator
from .engine_metrics import EngineMetrics
from .kube import create, get_cr, hold, kubectl, patch_spec

pytestmark = pytest.mark.cluster
HPA_MANAGER = "kube-controller-manager"
"""The HPA controller writes through the scale subresource as the kube-controller-manager."""
SCALE_T = 180.0  # seconds: one scale-up or scale-down of several steps (HPA sync 5 s, adapter relist 2 s, scrape 1 s)


@pytest.fixture(scope="module")
def stack(devcluster: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[EngineMetrics]:
    """Prometheus scraping the engine exporters, and the metrics adapter reading it, for this module."""
    work = tmp_path_factory.mktemp("autoscaling")
    metrics = EngineMetrics(work)
    prom = Prometheus(work, [metrics.scrape_config()])
    try:
        with adapter.running(devcluster, prom.url, ADAPTER_RULES_PATH):
            yield metrics
    finally:
        prom.stop()
        metrics.stop()


def _replicas_owners(obj: Any) -> list[str]:
    """The field managers that own spec.replicas (with the subresource they wrote through)."""
    out = []
    for e in obj.metadata.managed_fields or []:
        if "f:replicas" in ((e.fields_v1 or {}).get("f:spec") or {}):
            out.append(e.manager + (f"/{e.subresource}" if e.subresource else ""))
    return out


@dataclass
class Recorder:
    """Every replica change of the CR's engine Deployments, in the order the apiserver stored them."""

    api: client.ApiClient
    ns: str
    cr: str
    current: dict[str, int] = field(default_factory=dict)
    changes: list[tuple[float, str, int, int, list[str]]] = field(default_factory=list)
    pairs: list[tuple[int, int]] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)

    def start(self) -> Recorder:
        threading.Thread(target=self._run, daemon=True).start()
        return self

    def _run(self) -> None:
        apps = client.AppsV1Api(self.api)
        sel = f"{contract.LABEL_INSTANCE}={self.cr}"
        rv = apps.list_namespaced_deployment(self.ns, label_selector=sel).metadata.resource_version
        while not self.stop.is_set():
            w = watch.Watch()
            for ev in w.stream(apps.list_namespaced_deployment, self.ns, label_selector=sel, resource_version=rv,
                               timeout_seconds=5):  # fmt: skip
                obj = ev["object"]
                rv = obj.metadata.resource_version
                role = (obj.metadata.labels or {}).get(contract.LABEL_COMPONENT)
                if role in contract.ROLES and ev["type"] != "DELETED":
                    self._seen(role, obj)
                if self.stop.is_set():
                    w.stop()

    def _seen(self, role: str, obj: Any) -> None:
        n, old = int(obj.spec.replicas), self.current.get(role)
        if n == old:
            return
        self.current[role] = n
        if old is not None:
            self.changes.append((time.monotonic(), role, old, n, _replicas_owners(obj)))
        if len(self.current) == 2:
            self.pairs.append((self.current["prefill"], self.current["decode"]))

    def at(self, prefill: int, decode: int) -> bool:
        return self.current.get("prefill") == prefill and self.current.get("decode") == decode

    def writes_not_by_the_autoscaler(self) -> list[tuple[float, str, int, int, list[str]]]:
        return [c for c in self.changes if c[4] != [f"{HPA_MANAGER}/scale"]]


def _cr(name: str, **spec: Any) -> dict[str, Any]:
    # A short stabilization window: the exporter re-spreads a role's load as soon as a pod comes or goes, a second
    # before Prometheus scrapes the new pod, and the sum the HPA reads dips for that second (a real pod's signal does
    # not); the window keeps such a dip from scaling a role down.
    fast = {"scaleDownStabilizationSeconds": 8, "scaleDownPeriodSeconds": 1}
    base = {
        "model": {"name": "nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-FP8"},
        "warmup": {"enabled": False},
        "prefill": {"autoscaling": {"minReplicas": 1, "maxReplicas": 3, **fast,
                                    "metrics": [{"signal": "waitingRequests", "target": 4}]}},
        "decode": {"autoscaling": {"minReplicas": 1, "maxReplicas": 4, **fast}},
    }  # fmt: skip
    return {"apiVersion": f"{contract.GROUP}/{contract.VERSION}", "kind": contract.KIND, "metadata": {"name": name},
            "spec": {**base, **spec}}  # fmt: skip


def _syncing(metrics: EngineMetrics, api: client.ApiClient, ns: str, cr: str, stop: threading.Event) -> None:
    while not stop.wait(0.5):
        try:
            metrics.sync(api, ns, cr)
        except client.ApiException:
            pass


def _in_band(pairs: list[tuple[int, int]], lo: float, hi: float) -> list[tuple[int, int]]:
    return [(p, d) for p, d in pairs if not lo * p <= d <= hi * p]


def test_each_role_follows_its_own_signal_within_the_ratio_and_the_operator_never_writes_replicas(
    stack: EngineMetrics, operator: Operator, api_client: client.ApiClient, namespace: str, kubeconfig: Path
) -> None:
    name, ns = "auto", namespace
    create(api_client, ns, _cr(name, ratio={"minDecodePerPrefill": 1, "maxDecodePerPrefill": 2}))
    rec = Recorder(api_client, ns, name).start()
    stop = threading.Event()
    threading.Thread(target=_syncing, args=(stack, api_client, ns, name, stop), daemon=True).start()
    try:
        wait_for(lambda: rec.at(1, 1), 60, what="both roles at 1")
        hpas = client.AutoscalingV2Api(api_client)
        hpa = wait_for(lambda: hpas.read_namespaced_horizontal_pod_autoscaler(f"{name}-prefill", ns), 30, what="HPA")
        assert hpa.spec.metrics[0].external.metric.name == "hpd_vllm_waiting_requests"

        # prefill's queue grows: 10 waiting over a target of 4 -> 3 prefill; the ratio (decode/prefill in [1, 2])
        # makes decode grow first at each step, though decode itself has no load
        t0 = time.monotonic()
        stack.set_load(ns, name, "prefill", waitingRequests=10)
        wait_for(lambda: rec.current.get("prefill") == 3, SCALE_T, what="prefill scaled to 3 on its queue")
        up_prefill = time.monotonic() - t0
        assert rec.current["decode"] >= 3

        # decode's KV cache fills: 2.5 caches in use over a target of 0.7 -> 4 decode. The operator stops right
        # away: the HPA scales on its own within the bounds it has; the restarted operator changes nothing.
        t1 = time.monotonic()
        stack.set_load(ns, name, "decode", kvCacheUsage=2.5)
        operator.stop()
        wait_for(lambda: rec.current.get("decode") == 4, SCALE_T, what="decode scaled to 4 on its KV cache")
        up_decode = time.monotonic() - t1
        operator.start()
        before = len(rec.changes)
        wait_for(lambda: _autoscaler_reported(api_client, ns, name), 60, what="status after the restart")
        hold(lambda: len(rec.changes) == before and rec.at(3, 4), 6, "3 prefill and 4 decode after the restart")

        # load gone: both roles shrink, one pod per period, decode first where the ratio needs it
        t2 = time.monotonic()
        stack.set_load(ns, name, "prefill", waitingRequests=0)
        stack.set_load(ns, name, "decode", kvCacheUsage=0)
        wait_for(lambda: rec.at(1, 1), SCALE_T, what="both roles back at 1")
        down = time.monotonic() - t2
    finally:
        stop.set()
        rec.stop.set()
    print(f"\nscale-up prefill 1->3: {up_prefill:.1f} s; decode 3->4: {up_decode:.1f} s; "
          f"scale-down 3/4 -> 1/1: {down:.1f} s; steps: {[(r, a, b) for _, r, a, b, _ in rec.changes]}")  # fmt: skip
    assert not _in_band(rec.pairs, 1, 2), rec.pairs
    assert not rec.writes_not_by_the_autoscaler(), rec.writes_not_by_the_autoscaler()

    def settled() -> dict[str, Any] | None:
        cr = _autoscaler_reported(api_client, ns, name)
        st = (cr or {}).get("status") or {}
        return st if all(st[r]["autoscaler"]["summary"] == "1->1 AtMin" for r in contract.ROLES) else None

    st = wait_for(settled, 60, what="both autoscalers reported at their minimum in status")
    assert st["prefill"]["autoscaler"]["signals"] == ["waitingRequests 0/4"], st["prefill"]["autoscaler"]
    assert sorted(st["decode"]["autoscaler"]["signals"]) == ["kvCacheUsage 0/0.7", "runningRequests 0/32"]
    out = kubectl(kubeconfig, "get", "hpd", name, "-n", ns, "-o", "wide").stdout
    assert "PREFILL-SCALER" in out and "DECODE-SCALER" in out, out


def _autoscaler_reported(
    api: client.ApiClient, ns: str, name: str, roles: tuple[str, ...] = contract.ROLES
) -> dict[str, Any] | None:
    """The CR once each role's status.<role>.autoscaler reports an evaluation with its signals' values."""
    cr = get_cr(api, ns, name)
    st = cr.get("status") or {}
    scalers = [(st.get(r) or {}).get("autoscaler") or {} for r in roles]
    return cr if all(a.get("decision") not in (None, "Pending") and a.get("signals") for a in scalers) else None


def test_a_role_that_starts_to_autoscale_keeps_its_replicas_and_gets_them_back_when_it_stops(
    stack: EngineMetrics, operator: Operator, api_client: client.ApiClient, namespace: str
) -> None:
    """Server-side apply would delete a field its only owner stops applying (and the Deployment default would put
    1 back): the operator hands the live value to the autoscaler first. Removing autoscaling takes it back."""
    name, ns = "switch", namespace
    doc = _cr(name)
    doc["spec"]["decode"] = {"replicas": 2}
    create(api_client, ns, doc)
    rec = Recorder(api_client, ns, name).start()
    stop = threading.Event()
    threading.Thread(target=_syncing, args=(stack, api_client, ns, name, stop), daemon=True).start()
    try:
        stack.set_load(ns, name, "decode", kvCacheUsage=1.0)  # ceil(1.0 / 0.7) = 2: the autoscaler keeps 2
        wait_for(lambda: rec.current.get("decode") == 2, 60, what="decode at 2 (pinned)")
        patch_spec(api_client, ns, name, {"decode": {"autoscaling": {"minReplicas": 1, "maxReplicas": 4}}})
        apps = client.AppsV1Api(api_client)

        def handed_off() -> bool:
            owners = _replicas_owners(apps.read_namespaced_deployment(f"{name}-decode", ns))
            return contract.FIELD_MANAGER not in owners

        wait_for(handed_off, 60, what="decode replicas no longer owned by the operator")
        wait_for(lambda: _autoscaler_reported(api_client, ns, name, ("decode",)), 60, what="decode's HPA evaluated")
        assert [c for c in rec.changes if c[1] == "decode"] == [], rec.changes
        assert rec.current["decode"] == 2

        patch_spec(api_client, ns, name, {"decode": {"autoscaling": None, "replicas": 3}})
        wait_for(lambda: rec.current.get("decode") == 3, 60, what="decode pinned at 3 again")
        autoscaling = client.AutoscalingV2Api(api_client)
        wait_for(lambda: not [h for h in autoscaling.list_namespaced_horizontal_pod_autoscaler(ns).items
                              if h.metadata.name == f"{name}-decode"], 60, what="decode's HPA pruned")  # fmt: skip
    finally:
        stop.set()
        rec.stop.set()
