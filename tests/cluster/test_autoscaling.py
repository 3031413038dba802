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
from .kube import create, engine_deployment, get_cr, hold, kubectl, patch_spec, serving

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
    """Every replica change of the CR's engine Deployments, in the order the apiserver stored them, per generation
    (docs/rollouts.md: each generation has its own Deployments)."""

    api: client.ApiClient
    ns: str
    cr: str
    gens: dict[str, dict[str, int]] = field(default_factory=dict)
    """generation hash -> role -> its Deployment's replicas."""
    first: dict[tuple[str, str], int] = field(default_factory=dict)
    """(generation, role) -> the replicas its Deployment was first seen with (created with, when the watch saw it)."""
    numbers: dict[str, int] = field(default_factory=dict)
    changes: list[tuple[float, str, int, int, list[str], str]] = field(default_factory=list)
    """(time, role, old, new, owners of spec.replicas after it, generation)."""
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
                labels = obj.metadata.labels or {}
                role, gen = labels.get(contract.LABEL_COMPONENT), labels.get(contract.LABEL_GENERATION)
                if role in contract.ROLES and gen and ev["type"] != "DELETED":
                    self._seen(gen, int(labels.get(contract.LABEL_GENERATION_NUMBER) or 0), role, obj)
                if self.stop.is_set():
                    w.stop()

    def _seen(self, gen: str, number: int, role: str, obj: Any) -> None:
        self.numbers[gen] = number
        current = self.gens.setdefault(gen, {})
        n, old = int(obj.spec.replicas), current.get(role)
        self.first.setdefault((gen, role), n)
        if n == old:
            return
        current[role] = n
        if old is not None:
            self.changes.append((time.monotonic(), role, old, n, _replicas_owners(obj), gen))
        if len(current) == 2:
            self.pairs.append((current["prefill"], current["decode"]))

    @property
    def current(self) -> dict[str, int]:
        """Role -> replicas of the newest generation seen."""
        if not self.numbers:
            return {}
        return self.gens[max(self.numbers, key=lambda g: self.numbers[g])]

    def at(self, prefill: int, decode: int) -> bool:
        return self.current.get("prefill") == prefill and self.current.get("decode") == decode

    def writes_not_by_the_autoscaler(self) -> list[tuple[float, str, int, int, list[str], str]]:
        return [c for c in self.changes if c[4] != [f"{HPA_MANAGER}/scale"]]


def _engine(api: client.ApiClient, ns: str, cr: str, role: str) -> Any:
    """The role's Deployment of the generation CR `cr` serves (waits for the router that says which one)."""

    def found() -> Any:
        try:
            return engine_deployment(api, ns, cr, role)
        except client.ApiException as e:
            if e.status != 404:
                raise
            return None

    return wait_for(found, 30, what=f"{cr}'s serving {role} Deployment")


def _hpas(api: client.ApiClient, ns: str, cr: str) -> dict[str, Any]:
    """HPA name -> HPA, of CR `cr`."""
    items = (
        client.AutoscalingV2Api(api)
        .list_namespaced_horizontal_pod_autoscaler(ns, label_selector=f"{contract.LABEL_INSTANCE}={cr}")
        .items
    )
    return {h.metadata.name: h for h in items}


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
        prefill = _engine(api_client, ns, name, "prefill").metadata.name  # <cr>-prefill-<hash>
        hpa = wait_for(
            lambda: _hpas(api_client, ns, name).get(prefill), 30, what="prefill's HPA, named like its Deployment"
        )
        assert hpa.spec.scale_target_ref.name == prefill
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
        # The operator's last bounds before it stops must let decode grow: computed from a moment when prefill's
        # HPA read a one-scrape dip (the stand-in re-spreads a role's load as a pod joins) they say "both roles may
        # only shrink now" and stay so while the operator is down (a recorded limit: docs/autoscaling.md)
        decode = _engine(api_client, ns, name, "decode").metadata.name
        wait_for(lambda: (h := _hpas(api_client, ns, name).get(decode)) is not None and h.spec.max_replicas >= 4,
                 SCALE_T, what="decode's HPA allowed to reach 4 at 3 prefill")  # fmt: skip
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
          f"scale-down 3/4 -> 1/1: {down:.1f} s; steps: {[(r, a, b) for _, r, a, b, *_ in rec.changes]}")  # fmt: skip
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

        def handed_off() -> bool:
            owners = _replicas_owners(_engine(api_client, ns, name, "decode"))
            return contract.FIELD_MANAGER not in owners

        wait_for(handed_off, 60, what="decode replicas no longer owned by the operator")
        wait_for(lambda: _autoscaler_reported(api_client, ns, name, ("decode",)), 60, what="decode's HPA evaluated")
        assert [c for c in rec.changes if c[1] == "decode"] == [], rec.changes
        assert rec.current["decode"] == 2

        patch_spec(api_client, ns, name, {"decode": {"autoscaling": None, "replicas": 3}})
        wait_for(lambda: rec.current.get("decode") == 3, 60, what="decode pinned at 3 again")

        def scaled_roles() -> set[str]:
            return {h.metadata.labels[contract.LABEL_COMPONENT] for h in _hpas(api_client, ns, name).values()}

        wait_for(lambda: scaled_roles() == {"prefill"}, 60, what="decode's HPA pruned")
        assert len(rec.gens) == 1, rec.gens  # starting and stopping to autoscale never started a generation
    finally:
        stop.set()
        rec.stop.set()


def test_a_rollout_starts_the_new_generation_at_the_autoscaled_counts_and_hands_the_autoscalers_over(
    stack: EngineMetrics, operator: Operator, api_client: client.ApiClient, namespace: str
) -> None:
    """docs/autoscaling.md "Rollouts": the HPAs scale the serving generation; a bounds change scales it in place; an
    engine change starts generation 2 at the counts generation 1's HPA chose (not spec.replicas), and at the switch
    generation 2 gets its own HPAs (its replicas handed off, never written by the operator afterwards) while
    generation 1's HPAs go with the switch and its engines once drained."""
    name, ns = "roll", namespace
    create(api_client, ns, _cr(name))
    rec = Recorder(api_client, ns, name).start()
    stop = threading.Event()
    threading.Thread(target=_syncing, args=(stack, api_client, ns, name, stop), daemon=True).start()
    try:
        wait_for(lambda: len(rec.gens) == 1 and rec.at(1, 1), 60, what="generation 1 at 1/1")
        (g1,) = rec.gens
        # decode's KV cache: 2.0 caches over 0.7 -> 3 decode; prefill's queue: 6 over 4 -> 2 prefill
        stack.set_load(ns, name, "decode", kvCacheUsage=2.0)
        stack.set_load(ns, name, "prefill", waitingRequests=6)
        wait_for(lambda: rec.at(2, 3), SCALE_T, what="generation 1 scaled to 2 prefill, 3 decode")

        # a bounds change is no engine change: the serving generation's HPA is updated in place, no generation starts
        patch_spec(api_client, ns, name, {"decode": {"autoscaling": {"maxReplicas": 5}}})
        wait_for(lambda: _hpas(api_client, ns, name)[f"{name}-decode-{g1}"].spec.max_replicas == 5, 60,
                 what="decode's HPA at maxReplicas 5")  # fmt: skip
        hold(lambda: list(rec.gens) == [g1] and serving(api_client, ns, name) == g1, 5, "one generation only")

        # an engine change: generation 2 starts beside generation 1 at what generation 1 runs now
        patch_spec(api_client, ns, name, {"env": [{"name": "ROLLOUT", "value": "2"}]})

        def second() -> str | None:
            new = [g for g in rec.gens if g != g1]
            return new[0] if new and all((new[0], r) in rec.first for r in contract.ROLES) else None

        g2 = wait_for(second, 60, what="generation 2's Deployments created")
        assert (rec.first[(g2, "prefill")], rec.first[(g2, "decode")]) == (2, 3), rec.first  # not spec's 1/1

        def switched() -> bool:
            hpas = _hpas(api_client, ns, name)
            return (
                serving(api_client, ns, name) == g2
                and set(hpas) == {f"{name}-prefill-{g2}", f"{name}-decode-{g2}"}
                and all(h.spec.scale_target_ref.name == n for n, h in hpas.items())
            )

        wait_for(switched, 120, what="traffic on generation 2, its own HPAs, generation 1's pruned")
        apps = client.AppsV1Api(api_client)

        def g1_gone() -> bool:
            sel = f"{contract.LABEL_INSTANCE}={name},{contract.LABEL_GENERATION}={g1}"
            return not apps.list_namespaced_deployment(ns, label_selector=sel).items

        wait_for(g1_gone, 120, what="generation 1 drained and removed")
        for role in contract.ROLES:
            wait_for(lambda r=role: contract.FIELD_MANAGER not in _replicas_owners(_engine(api_client, ns, name, r)),
                     60, what=f"generation 2's {role} replicas handed to its HPA")  # fmt: skip
        wait_for(lambda: _autoscaler_reported(api_client, ns, name), 60, what="generation 2's HPAs evaluated")
        # the same load on the new generation: its HPAs keep 2/3 (capacity never dropped at the switch)
        hold(lambda: rec.gens[g2] == {"prefill": 2, "decode": 3}, 6, "generation 2 at 2 prefill, 3 decode")
    finally:
        stop.set()
        rec.stop.set()
    # generation 2's counts were the operator's until the switch (it started them at generation 1's); every change
    # of generation 1's replicas, and every change of generation 2's, was the HPA controller's
    assert not rec.writes_not_by_the_autoscaler(), rec.writes_not_by_the_autoscaler()
