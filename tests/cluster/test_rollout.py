"""Rollouts between generations of prefill + decode, against the real control plane (issue #29, docs/rollouts.md).

The engines run on a node whose kubelet is the test (tests/cluster/kubelet.py), so the test decides when each pod
turns Ready, as the runtime's warmup and pair check would; the router pods run on the kwok nodes. A watcher thread
looks at the namespace every few hundred milliseconds and records, for every router pod and the router Deployment,
which engine pods its discovery selectors (`--prefill-selector` / `--decode-selector`, as vllm-router 0.1.17 reads
them) would select; every observed step must hold the rules below. No connection to any pod: the router is never
run here (tests/runtime/test_rollout_traffic.py runs the real one)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from hpd_devcluster.testing import wait_for
from hpd_runtime import contract

from .conftest import Operator
from .kube import (
    T,
    children,
    cond,
    container_of,
    create,
    deployment,
    events,
    expected,
    get_cr,
    hold,
    kubectl,
    patch_spec,
    seed,
    wait_cr,
    wait_ready,
)
from .kubelet import ManualNode, place

pytestmark = pytest.mark.cluster

GEN = contract.LABEL_GENERATION
COMPONENT = contract.LABEL_COMPONENT
PREFILL, DECODE = 1, 2
"""The spec's ratio in these tests: one prefill, two decodes (TP 2 each: 6 GPUs a generation)."""


@pytest.fixture()
def node(api_client: client.ApiClient, devcluster: Any) -> Iterator[ManualNode]:
    n = ManualNode(api_client, gpus=16).start()
    yield n
    n.stop()
    assert not n.errors, n.errors


def selectors(args: list[str]) -> dict[str, dict[str, str]]:
    """`--prefill-selector k=v ... --decode-selector k=v ...` -> role -> labels, as vllm-router parses them."""
    out: dict[str, dict[str, str]] = {}
    role: str | None = None
    for a in args:
        if a.startswith("--"):
            role = {"--prefill-selector": "prefill", "--decode-selector": "decode"}.get(a)
            if role is not None:
                out[role] = {}
        elif role is not None:
            k, _, v = a.partition("=")
            out[role][k] = v
    return out


def ready(pod: client.V1Pod) -> bool:
    return any(c.type == "Ready" and c.status == "True" for c in pod.status.conditions or [])


@dataclass
class Step:
    """One observation: each router (pod or Deployment) with its selectors and what they select."""

    routers: list[tuple[str, bool, dict[str, dict[str, str]]]]
    """(who, serving: a Ready router pod not being deleted, selectors)."""
    engines: list[client.V1Pod]
    deployments: dict[str, set[str]]
    """Generation -> roles whose Deployment exists."""
    ready: str
    """The CR's Ready condition status."""
    why: str = ""
    """Its reason and message, and when the step was seen (what a failure prints)."""


@dataclass
class Watcher:
    """Records the namespace's router view on a thread; `problems` collects every broken rule with its step."""

    api: client.ApiClient
    ns: str
    name: str
    steps: list[Step] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)

    def __post_init__(self) -> None:
        self.thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Watcher:
        self.thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stop.set()
        self.thread.join(30)

    def _run(self) -> None:
        while not self.stop.wait(0.25):
            try:
                step = self.observe()
            except client.ApiException as e:
                self.problems.append(f"observe failed: {e.status}")
                continue
            self.steps.append(step)
            self.problems += [f"step {len(self.steps)}: {p}" for p in check(step)]

    def observe(self) -> Step:
        core, apps = client.CoreV1Api(self.api), client.AppsV1Api(self.api)
        sel = f"{contract.LABEL_INSTANCE}={self.name}"
        # Deployments first, then pods: the router Deployment's selectors change only after the operator saw the new
        # generation Ready, so pods listed afterwards are at least as Ready as what it saw. Listed the other way
        # round, a switch between the two calls pairs new selectors with older pods (a false "ratio not held").
        deps = apps.list_namespaced_deployment(self.ns, label_selector=sel).items
        pods = core.list_namespaced_pod(self.ns, label_selector=sel).items
        routers = [
            (f"pod {p.metadata.name}", ready(p) and not p.metadata.deletion_timestamp, selectors(p.spec.containers[0].args))
            for p in pods
            if p.metadata.labels.get(COMPONENT) == contract.COMPONENT_ROUTER
        ]  # fmt: skip
        gens: dict[str, set[str]] = {}
        for d in deps:
            if d.metadata.labels.get(COMPONENT) == contract.COMPONENT_ROUTER:
                routers.append((f"deployment {d.metadata.name}", False, selectors(container_of(d).args)))
            elif not d.metadata.deletion_timestamp:
                gens.setdefault(d.metadata.labels[GEN], set()).add(d.metadata.labels[COMPONENT])
        engines = [p for p in pods if p.metadata.labels.get(COMPONENT) in contract.ROLES]
        cr = get_cr(self.api, self.ns, self.name)
        rd = cond(cr, "Ready")
        why = f"{time.strftime('%H:%M:%S')} {rd.get('reason')}: {rd.get('message')}; rollout {cr['status'].get('rollout')}"
        return Step(routers, engines, gens, str(rd.get("status")), why)


def check(step: Step) -> list[str]:
    """The rules every observed step must hold (see the module doc)."""
    out = []
    for who, serving, sel in step.routers:
        gens = {role: s.get(GEN) for role, s in sel.items()}
        if set(gens) != {"prefill", "decode"} or None in gens.values() or len(set(gens.values())) != 1:
            out.append(f"{who} selects {sel}: not one generation for both roles")
            continue
        (gen,) = set(gens.values())
        for role, s in sel.items():
            picked = [p for p in step.engines if all((p.metadata.labels or {}).get(k) == v for k, v in s.items())]
            spans = {p.metadata.labels.get(GEN) for p in picked} - {gen}
            if spans:
                out.append(f"{who}'s {role} selector spans generations {spans | {gen}}")
            want = PREFILL if role == "prefill" else DECODE
            live = [p for p in picked if ready(p) and not p.metadata.deletion_timestamp]
            if (serving or who.startswith("deployment")) and len(live) < want:
                out.append(f"{who} routes to generation {gen} with {len(live)}/{want} {role} Ready (ratio not held)")
        if step.deployments.get(gen) != {"prefill", "decode"}:
            out.append(f"{who} still selects generation {gen}, whose Deployments are {step.deployments.get(gen)}")
    return out


def serves(steps: list[Step]) -> list[set[str | None]]:
    """Per step: the generations the Ready router pods (not being deleted) route to."""
    return [{s.get(GEN) for _, serving, sel in st.routers if serving for s in sel.values()} for st in steps]


def engine_pods(node: ManualNode, gen: str, role: str) -> list[client.V1Pod]:
    return node.pods(**{GEN: gen, COMPONENT: role})


def make_ready(node: ManualNode, gen: str, role: str, count: int) -> None:
    pods = wait_for(lambda: (p := engine_pods(node, gen, role)) and len(p) == count and p, T, what=f"{gen} {role}s")
    for p in pods:
        node.set_ready(p.metadata.name)


def router_generation(api: client.ApiClient, ns: str, name: str) -> str:
    return str(deployment(api, ns, f"{name}-router").metadata.labels[GEN])


def rollout(api: client.ApiClient, ns: str, name: str) -> dict[str, Any]:
    return dict(get_cr(api, ns, name).get("status", {}).get("rollout") or {})


def new_generation(api: client.ApiClient, ns: str, name: str, old: str) -> str:
    cr = wait_cr(api, ns, name, lambda c: (c.get("status", {}).get("rollout") or {}).get("targetHash") not in
                 (None, old), "a new target generation")  # fmt: skip
    return str(cr["status"]["rollout"]["targetHash"])


def reasons(api: client.ApiClient, ns: str, name: str) -> list[str]:
    return [e.reason for e in events(api, ns, name) for _ in range(e.count or 1)]


def start(api: client.ApiClient, ns: str, name: str, node: ManualNode, **spec: Any) -> str:
    """A CR with 1 prefill and 2 decodes on the manual node, every pod made Ready: generation 1's hash."""
    doc = seed(name)
    doc["spec"]["decode"]["replicas"] = DECODE
    doc["spec"].update(spec)
    place(doc["spec"], node.pool)
    create(api, ns, doc)
    gen = wait_cr(api, ns, name, lambda c: bool((c.get("status", {}).get("rollout") or {}).get("targetHash")), "gen")
    g1 = str(gen["status"]["rollout"]["targetHash"])
    make_ready(node, g1, "prefill", PREFILL)
    make_ready(node, g1, "decode", DECODE)
    wait_ready(api, ns, name)
    return g1


def test_an_image_change_rolls_a_whole_new_generation_that_takes_traffic_only_once_ready(
    operator: Operator, api_client: client.ApiClient, namespace: str, node: ManualNode, kubeconfig: Path
) -> None:
    ns, name, api = namespace, "roll", api_client
    g1 = start(api, ns, name, node)
    assert rollout(api, ns, name)["state"] == "Complete" and router_generation(api, ns, name) == g1
    with Watcher(api, ns, name) as watcher:
        patch_spec(api, ns, name, {"image": "ghcr.io/hybridpd/vllm-runtime:0.20.0-patched"})
        g2 = new_generation(api, ns, name, g1)
        wait_for(lambda: len(node.pods(**{GEN: g2})) == PREFILL + DECODE, T, what="generation 2's pods")
        ro = rollout(api, ns, name)
        assert (ro["state"], ro["servingGeneration"], ro["targetGeneration"]) == ("Starting", 1, 2), ro
        cols = kubectl(kubeconfig, "get", "hpd", name, "-n", ns, "--no-headers").stdout.split()
        assert cols[4:8] == ["1", "gen", "2:", "0/3"], cols  # GEN, ROLLOUT
        hold(lambda: router_generation(api, ns, name) == g1, 2.0, "router stays on generation 1")

        make_ready(node, g2, "prefill", PREFILL)
        pods = engine_pods(node, g2, "decode")
        node.set_ready(pods[0].metadata.name)  # prefill and one decode: not the spec's ratio yet
        wait_cr(api, ns, name, lambda c: c["status"]["rollout"]["summary"] == "gen 2: 2/3 ready", "2/3 ready")
        hold(lambda: router_generation(api, ns, name) == g1, 2.0, "router stays on generation 1 at 1:1")
        assert cond(get_cr(api, ns, name), "Ready")["status"] == "True"  # generation 1 serves all along

        node.set_ready(pods[1].metadata.name)  # the second decode passed its pair check: generation 2 is Ready
        wait_for(lambda: router_generation(api, ns, name) == g2, T, what="router on generation 2")
        cr = wait_cr(api, ns, name, lambda c: c["status"]["rollout"]["state"] == "Complete", "rollout complete")
        wait_for(lambda: not node.pods(**{GEN: g1}), T, what="generation 1's pods gone")
        wait_for(lambda: {g2} in serves(watcher.steps[-3:]), T, what="the watcher sees generation 2 serve")
    assert not watcher.problems, "\n".join(watcher.problems[:20])
    not_ready = [f"step {i}: Ready={st.ready} {st.why}" for i, st in enumerate(watcher.steps) if st.ready != "True"]
    assert not not_ready, "Ready=True all along: a generation served throughout\n" + "\n".join(not_ready[:10])
    assert {g1} in serves(watcher.steps) and {g2} in serves(watcher.steps), "the watcher saw both generations serve"
    first_g2 = next(i for i, st in enumerate(watcher.steps) if any(
        sel["decode"].get(GEN) == g2 for _, _, sel in st.routers))  # fmt: skip
    assert all(st.deployments.get(g1) == {"prefill", "decode"} for st in watcher.steps[:first_g2])

    ro = cr["status"]["rollout"]
    assert (ro["servingGeneration"], ro["servingHash"], ro["latestGeneration"]) == (2, g2, 2)
    assert [g["number"] for g in ro["generations"]] == [2] and cond(cr, "Ready")["status"] == "True"
    assert children(api, ns, name) == expected(name, g2, PodDisruptionBudget=["{n}-decode-{g}"])
    want = {"GenerationStarted": 1, "TrafficSwitched": 1, "GenerationRemoved": 1}
    wait_for(lambda: {r: reasons(api, ns, name).count(r) for r in want} == want, T, what=f"Events {want}")


def test_a_stuck_generation_leaves_the_old_one_serving_says_why_and_a_revert_cancels_it(
    operator: Operator, api_client: client.ApiClient, namespace: str, node: ManualNode
) -> None:
    ns, name, api = namespace, "stuck", api_client
    g1 = start(api, ns, name, node)
    router = deployment(api, ns, f"{name}-router").metadata

    # 1. No room for a second generation: it waits, blocked, and generation 1 keeps serving.
    patch_spec(api, ns, name, {"decode": {"resources": {"limits": {"nvidia.com/gpu": 8}}}})
    g2 = new_generation(api, ns, name, g1)
    cr = wait_cr(api, ns, name, lambda c: c["status"]["rollout"]["state"] == "Blocked", "blocked", timeout=2 * T)
    progressing = cond(cr, "Progressing")
    assert (progressing["status"], progressing["reason"]) == ("False", "GenerationBlocked")
    assert "Insufficient nvidia.com/gpu" in progressing["message"] and "more GPUs" in progressing["message"]
    assert cond(cr, "Ready")["status"] == "True" and router_generation(api, ns, name) == g1

    # 2. A known-bad block size instead: its decode never passes its pair check; the runtime's reason is the status.
    patch_spec(api, ns, name, {"decode": {"resources": None}, "blockSize": 128})
    g3 = new_generation(api, ns, name, g2)
    make_ready(node, g3, "prefill", PREFILL)
    (bad, _) = wait_for(lambda: (p := engine_pods(node, g3, "decode")) and len(p) == DECODE and p, T, what="decodes")
    reason = ("P->D output differs from local on 4/16 prompts via prefill 10.250.0.9:8000: 650-token prompt: P->D "
              "logprob at token 0 is nan; if spec.blockSize is set, remove it")  # fmt: skip
    probe_event(api, ns, bad, f"Readiness probe failed: {reason}")
    cr = wait_cr(api, ns, name, lambda c: reason in cond(c, "DecodeReady").get("message", ""), "reason in DecodeReady")
    assert "generation 3" in cond(cr, "DecodeReady")["message"] and cond(cr, "DecodeReady")["status"] == "True"
    ro = cr["status"]["rollout"]
    assert (ro["state"], ro["servingGeneration"], ro["targetGeneration"]) == ("Starting", 1, 3)
    stuck = next(g for g in ro["generations"] if g["hash"] == g3)
    assert stuck["state"] == "Starting" and reason in stuck["message"] and stuck["decode"] == "0/2"
    assert g2 not in {g["hash"] for g in ro["generations"]}  # superseded: cancelled before it served
    hold(lambda: router_generation(api, ns, name) == g1 and cond(get_cr(api, ns, name), "Ready")["status"] == "True",
         3.0, "generation 1 serves")  # fmt: skip

    # 3. Revert: the spec is generation 1's again; generation 3 goes, the router was never touched.
    patch_spec(api, ns, name, {"blockSize": None})
    cr = wait_cr(api, ns, name, lambda c: c["status"]["rollout"]["state"] == "Complete", "complete")
    assert cr["status"]["rollout"]["servingHash"] == g1 and cr["status"]["rollout"]["latestGeneration"] == 3
    wait_for(lambda: not node.pods(**{GEN: g3}), T, what="generation 3's pods gone")
    after = deployment(api, ns, f"{name}-router").metadata
    assert (after.uid, after.generation) == (router.uid, router.generation)
    assert children(api, ns, name) == expected(name, g1, PodDisruptionBudget=["{n}-decode-{g}"])
    want = {"GenerationStarted": 2, "GenerationCancelled": 2}
    wait_for(lambda: {r: reasons(api, ns, name).count(r) for r in want} == want, T, what=f"Events {want}")
    assert "TrafficSwitched" not in reasons(api, ns, name)


def probe_event(api: client.ApiClient, ns: str, pod: client.V1Pod, message: str) -> None:
    """The kubelet's Event for a failing exec readiness probe (its output is the runtime's reason)."""
    import datetime

    now = datetime.datetime.now(datetime.UTC)
    client.CoreV1Api(api).create_namespaced_event(
        ns,
        client.CoreV1Event(
            metadata=client.V1ObjectMeta(generate_name=f"{pod.metadata.name}."),
            involved_object=client.V1ObjectReference(api_version="v1", kind="Pod", name=pod.metadata.name,
                                                     namespace=ns, uid=pod.metadata.uid),
            reason="Unhealthy", type="Warning", message=message,
            source=client.V1EventSource(component="kubelet", host=pod.spec.node_name),
            first_timestamp=now, last_timestamp=now, count=1,
        ),
    )  # fmt: skip


def test_a_first_generation_that_never_served_is_replaced_at_once_when_there_is_no_room_for_two(
    operator: Operator, api_client: client.ApiClient, namespace: str
) -> None:
    """A first deploy whose decode never passes its pair check holds GPUs for nothing: the fixed spec's generation
    replaces it at once (on a node with room for one generation only), instead of waiting for room beside it."""
    ns, name, api = namespace, "fix", api_client
    node = ManualNode(api, gpus=8).start()  # one generation takes 6 GPUs
    try:
        doc = seed(name)
        doc["spec"]["decode"]["replicas"] = DECODE
        doc["spec"]["blockSize"] = 128
        place(doc["spec"], node.pool)
        create(api, ns, doc)
        cr = wait_cr(api, ns, name, lambda c: bool((c.get("status", {}).get("rollout") or {}).get("targetHash")), "g")
        g1 = str(cr["status"]["rollout"]["targetHash"])
        make_ready(node, g1, "prefill", PREFILL)  # its decodes never pass their pair check
        wait_for(lambda: len(engine_pods(node, g1, "decode")) == DECODE, T, what="generation 1's decodes")
        cr = wait_cr(api, ns, name, lambda c: c["status"]["rollout"]["generations"][0]["decode"] == "0/2", "0/2")
        assert cond(cr, "Ready")["status"] == "False" and not cr["status"]["rollout"]["generations"][0]["served"]

        patch_spec(api, ns, name, {"blockSize": None})
        g2 = new_generation(api, ns, name, g1)
        wait_for(lambda: router_generation(api, ns, name) == g2, T, what="the router on generation 2 at once")
        wait_for(lambda: not node.pods(**{GEN: g1}), T, what="generation 1 gone, its GPUs free")
        make_ready(node, g2, "prefill", PREFILL)
        make_ready(node, g2, "decode", DECODE)
        cr = wait_ready(api, ns, name)
        ro = cr["status"]["rollout"]
        assert (ro["state"], ro["servingGeneration"], ro["servingHash"]) == ("Complete", 2, g2)
        assert [g["served"] for g in ro["generations"]] == [True]
        wait_for(lambda: reasons(api, ns, name).count("GenerationCancelled") == 1, T, what="GenerationCancelled")
        assert "GenerationRemoved" not in reasons(api, ns, name)
    finally:
        node.stop()
    assert not node.errors, node.errors
