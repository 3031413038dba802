"""Generations and the rollout plan (pure): which spec changes start a generation, which generation the router
selects, what stays, what the status says and which Events a change deserves (docs/rollouts.md)."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from hpd_operator.api.models import HybridPDDeploymentStatus
from hpd_operator.builders import build_all, generation_hash
from hpd_operator.conditions import Failure, Reason
from hpd_operator.generations import (
    Generation,
    Live,
    LiveGeneration,
    Plan,
    RolloutView,
    fresh_plan,
    hold_plan,
    kept,
    observe,
    plan_rollout,
    rollout_transitions,
)
from hpd_runtime import contract

from .test_builders import build, by, container, cr_from, env, seed_doc
from .test_status import conds, dep, pod, spec, status

UID = "cr-uid"


def gen_hash(doc: dict[str, Any]) -> str:
    from hpd_operator.profile import compute_profile
    from hpd_operator.validation import validate

    cr = cr_from(doc)
    return generation_hash(cr, compute_profile(validate(cr)))


def changed(path: str, value: Any) -> dict[str, Any]:
    doc = seed_doc()
    node = doc["spec"]
    *parents, last = path.split(".")
    for p in parents:
        node = node.setdefault(p, {})
    node[last] = value
    return doc


# --- what starts a generation ------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("path", "value"),
    [
        ("image", "example.com/vllm:other"),
        ("vllmVersion", "0.25.1"),
        ("model.maxModelLen", 4096),
        ("prefill.tensorParallelSize", 1),
        ("blockSize", 128),
        ("extraArgs", ["--max-num-seqs", "64"]),
        ("env", [{"name": "X", "value": "1"}]),
        ("kvTransfer.sideChannelPort", 5700),
        ("decode.resources", {"limits": {"nvidia.com/gpu": 4}}),
        ("warmup.canarySeconds", 60),
        ("decode.nodeSelector", {"pool": "b"}),
        ("drainTimeoutSeconds", 30),  # the engines' preStop and --shutdown-timeout (docs/autoscaling.md)
    ],
)
def test_an_engine_affecting_change_is_a_new_generation(path: str, value: Any) -> None:
    assert gen_hash(changed(path, value)) != gen_hash(seed_doc())


@pytest.mark.parametrize(
    ("path", "value"),
    [
        ("prefill.replicas", 3),
        ("decode.replicas", 4),
        ("router.replicas", 2),
        ("router.policy", "random"),
        ("router.image", "example.com/router:2"),
        ("router.drainSeconds", 30),
        ("monitoring.podMonitor", True),
        ("networkPolicy.enabled", False),
        ("decode.autoscaling", {"minReplicas": 1, "maxReplicas": 8}),
        (
            "prefill.autoscaling",
            {
                "maxReplicas": 3,
                "metrics": [{"signal": "promptTokensPerSecond", "target": 500}],
                "scaleDownStabilizationSeconds": 30,
            },
        ),
    ],
)
def test_replicas_router_monitoring_and_policy_changes_keep_the_generation(path: str, value: Any) -> None:
    assert gen_hash(changed(path, value)) == gen_hash(seed_doc())


def test_each_generation_has_its_own_names_selectors_and_prefill_service_for_the_pair_check() -> None:
    doc = seed_doc()
    g = gen_hash(doc)
    objs = build(doc)
    d = by(objs, "Deployment", "nemotron-3-nano-decode")
    assert d["metadata"]["name"] == f"nemotron-3-nano-decode-{g}"
    assert d["spec"]["selector"]["matchLabels"][contract.LABEL_GENERATION] == g
    assert d["spec"]["template"]["metadata"]["labels"][contract.LABEL_GENERATION] == g
    assert env(container(d))[contract.ENV_PREFILL_SERVICE] == f"nemotron-3-nano-prefill-{g}.ns1.svc"
    svc = by(objs, "Service", "nemotron-3-nano-prefill")
    assert svc["metadata"]["name"] == f"nemotron-3-nano-prefill-{g}"
    assert svc["spec"]["selector"][contract.LABEL_GENERATION] == g
    # the router's Deployment selector stays instance + component (immutable); its pods and discovery carry g
    r = by(objs, "Deployment", "nemotron-3-nano-router")
    assert contract.LABEL_GENERATION not in r["spec"]["selector"]["matchLabels"]
    assert r["spec"]["template"]["metadata"]["labels"][contract.LABEL_GENERATION] == g


def test_the_router_drains_before_its_old_pods_go() -> None:
    doc = changed("router.drainSeconds", 120)
    r = by(build(doc), "Deployment", "nemotron-3-nano-router")
    pod_spec = r["spec"]["template"]["spec"]
    assert container(r)["lifecycle"]["preStop"] == {"sleep": {"seconds": 5}}
    assert pod_spec["terminationGracePeriodSeconds"] == 125
    assert r["spec"]["strategy"]["rollingUpdate"] == {"maxSurge": 1, "maxUnavailable": 0}


def test_a_plan_builds_the_desired_generation_and_routes_to_another() -> None:
    cr = cr_from(seed_doc())
    from hpd_operator.profile import compute_profile
    from hpd_operator.validation import validate

    prof = compute_profile(validate(cr))
    want = Generation(generation_hash(cr, prof), 2)
    old = Generation("0ld0ld00", 1)
    objs = build_all(cr, prof, Plan(desired=want, route=old, keep=frozenset({want.hash, old.hash}), latest=2))
    engines = [o for o in objs if o["kind"] == "Deployment" and "router" not in o["metadata"]["name"]]
    assert {o["metadata"]["labels"][contract.LABEL_GENERATION_NUMBER] for o in engines} == {"2"}
    router = by(objs, "Deployment", "nemotron-3-nano-router")
    args = container(router)["args"]
    assert f"{contract.LABEL_GENERATION}=0ld0ld00" in args and f"{contract.LABEL_GENERATION}={want.hash}" not in args


# --- the plan ------------------------------------------------------------------------------------------------------
def deployment(role: str, gen: str, number: int, replicas: int = 1, ready: int = 1) -> dict[str, Any]:
    d = dep(replicas, ready)
    d.update(apiVersion="apps/v1", kind="Deployment")
    d["metadata"].update(
        name=f"x-{role}-{gen}",
        ownerReferences=[{"uid": UID}],
        labels={
            contract.LABEL_COMPONENT: role,
            contract.LABEL_GENERATION: gen,
            contract.LABEL_GENERATION_NUMBER: str(number),
        },
    )
    return d


def router(gen: str | None) -> dict[str, Any]:
    d = dep(1, 1)
    labels = {contract.LABEL_COMPONENT: contract.COMPONENT_ROUTER}
    if gen:
        labels[contract.LABEL_GENERATION] = gen
    d.update(apiVersion="apps/v1", kind="Deployment")
    d["metadata"].update(name="x-router", ownerReferences=[{"uid": UID}], labels=labels)
    return d


def router_pod(gen: str) -> dict[str, Any]:
    return {
        "metadata": {"name": f"r-{gen}", "labels": {contract.LABEL_COMPONENT: "router", contract.LABEL_GENERATION: gen}}
    }


def live(*gens: tuple[str, int], route: str | None = None, router_pods: tuple[str, ...] = ()) -> Live:
    children = [deployment(r, g, n) for g, n in gens for r in contract.ROLES]
    children.append(router(route))
    return observe(children, [router_pod(g) for g in router_pods], UID)


def test_a_new_generation_waits_until_ready_then_takes_the_traffic() -> None:
    now = live(("aaaa0001", 1), ("bbbb0002", 2), route="aaaa0001", router_pods=("aaaa0001",))
    waiting = plan_rollout("bbbb0002", now, {"aaaa0001": True, "bbbb0002": False})
    assert waiting.served == {"aaaa0001"}  # routed and Ready: it serves
    assert (waiting.desired, waiting.route) == (Generation("bbbb0002", 2), Generation("aaaa0001", 1))
    assert waiting.keep == {"aaaa0001", "bbbb0002"} and waiting.rolling
    switched = plan_rollout("bbbb0002", now, {"aaaa0001": True, "bbbb0002": True})
    assert switched.route == Generation("bbbb0002", 2) and not switched.rolling
    assert switched.keep == {"aaaa0001", "bbbb0002"}  # an old router pod still selects aaaa0001: it drains
    drained = plan_rollout("bbbb0002", live(("aaaa0001", 1), ("bbbb0002", 2), route="bbbb0002"), {"bbbb0002": True})
    assert drained.keep == {"bbbb0002"}


def test_a_generation_that_served_is_protected_even_while_it_is_down_for_a_moment() -> None:
    now = live(("aaaa0001", 1), ("bbbb0002", 2), route="aaaa0001", router_pods=("aaaa0001",))
    blip = plan_rollout("bbbb0002", now, {}, served=["aaaa0001"])  # its decode restarts; the new one is not Ready
    assert blip.route.hash == "aaaa0001" and blip.keep == {"aaaa0001", "bbbb0002"}
    partly = plan_rollout("bbbb0002", now, {}, answering={"aaaa0001": True})  # never all Ready, but it answers
    assert partly.route.hash == "aaaa0001" and "aaaa0001" in partly.keep


def test_a_generation_that_never_served_and_cannot_answer_is_replaced_at_once() -> None:
    """A first deploy with bad flags: its decode never passed; a fixed spec must not wait for room beside it."""
    now = live(("aaaa0001", 1), ("bbbb0002", 2), route="aaaa0001", router_pods=("aaaa0001",))
    fix = plan_rollout("bbbb0002", now, {"aaaa0001": False, "bbbb0002": False}, answering={"aaaa0001": False})
    assert fix.route == fix.desired == Generation("bbbb0002", 2) and fix.keep == {"bbbb0002"}
    assert fix.served == frozenset()


def test_a_new_generation_gets_the_next_number_and_numbers_are_never_reused() -> None:
    now = live(("aaaa0001", 4), route="aaaa0001")
    assert plan_rollout("cccc0003", now, {}).desired.number == 5
    assert plan_rollout("cccc0003", now, {}, latest=7).desired.number == 8  # the status remembers 7
    assert plan_rollout("aaaa0001", now, {"aaaa0001": True}).desired.number == 4


def test_a_generation_the_apiserver_refuses_keeps_one_number_however_often_it_is_reconciled() -> None:
    """The write loop: a desired generation whose workloads the apiserver refuses took a new number on every
    reconcile (fed back through status.rollout.latestGeneration), so the router's and the Services' labels and the
    status changed each time, and each write triggered the next reconcile. Its number is now stable until a
    workload of it exists, for a first deploy and for a serving CR alike."""
    for now, want in ((live(), 1), (live(("aaaa0001", 4), route="aaaa0001"), 5)):
        latest = 0
        for _ in range(5):  # each reconcile reads back the latestGeneration the one before wrote
            p = plan_rollout("cccc0003", now, {"aaaa0001": True}, latest)
            assert p.desired.number == want and p.latest == want - 1, p
            latest = p.latest
    # once a workload of it exists the number is taken: the next new generation gets the one after
    taken = live(("aaaa0001", 4), ("cccc0003", 5), route="aaaa0001")
    assert plan_rollout("cccc0003", taken, {"aaaa0001": True}, 4).latest == 5
    assert plan_rollout("dddd0004", taken, {"aaaa0001": True}, 5).desired.number == 6


def test_a_revert_routes_back_and_drops_the_generation_that_never_served() -> None:
    now = live(("aaaa0001", 1), ("bbbb0002", 2), route="aaaa0001", router_pods=("aaaa0001",))
    back = plan_rollout("aaaa0001", now, {"aaaa0001": True, "bbbb0002": False})
    assert back.desired == back.route == Generation("aaaa0001", 1) and back.keep == {"aaaa0001"}
    superseded = plan_rollout("cccc0003", now, {"aaaa0001": True})
    assert superseded.route.hash == "aaaa0001" and superseded.keep == {"aaaa0001", "cccc0003"}


def test_without_a_router_or_with_one_on_a_gone_generation_the_newest_ready_one_serves() -> None:
    now = live(("aaaa0001", 1), ("bbbb0002", 2), route="gone0000")
    assert plan_rollout("cccc0003", now, {"aaaa0001": True, "bbbb0002": True}).route.hash == "bbbb0002"
    assert plan_rollout("cccc0003", live(), {}).route.hash == "cccc0003"
    assert fresh_plan("dddd0004") == Plan(
        Generation("dddd0004", 1), Generation("dddd0004", 1), frozenset({"dddd0004"}), 1
    )


def test_kept_generations_are_left_alone_and_the_desired_ones_stale_children_pruned() -> None:
    plan = Plan(Generation("bbbb0002", 2), Generation("aaaa0001", 1), frozenset({"aaaa0001", "bbbb0002"}), 2)
    old_pdb = {"metadata": {"labels": {contract.LABEL_COMPONENT: "decode", contract.LABEL_GENERATION: "aaaa0001"}}}
    new_pdb = {"metadata": {"labels": {contract.LABEL_COMPONENT: "decode", contract.LABEL_GENERATION: "bbbb0002"}}}
    gone = {"metadata": {"labels": {contract.LABEL_COMPONENT: "decode", contract.LABEL_GENERATION: "cccc0003"}}}
    legacy = {"metadata": {"labels": {contract.LABEL_COMPONENT: "decode"}}}
    assert kept(old_pdb, plan) and not kept(new_pdb, plan) and not kept(gone, plan) and not kept(legacy, plan)


def test_an_invalid_spec_holds_every_generation_where_it_is() -> None:
    plan = hold_plan(live(("aaaa0001", 1), ("bbbb0002", 2), route="aaaa0001"))
    assert plan is not None and (plan.route, plan.desired) == (Generation("aaaa0001", 1), Generation("bbbb0002", 2))
    assert plan.keep == {"aaaa0001", "bbbb0002"} and hold_plan(Live()) is None
    alone = hold_plan(live(("aaaa0001", 1), route="aaaa0001"))
    assert alone is not None and alone.desired == alone.route == Generation("aaaa0001", 1)


# --- status and Events ---------------------------------------------------------------------------------------------
def view(gens: dict[str, tuple[int, dict[str, Any], list[dict[str, Any]]]], plan: Plan, **details: str) -> RolloutView:
    """gens: hash -> (number, role -> Deployment, extra not-Ready decode pods); each Deployment's Ready replicas
    come with as many Ready pods (what the watch cache holds)."""
    out = Live()
    for h, (n, deps, extra) in gens.items():
        pods: dict[str, list[dict[str, Any]]] = {
            r: [pod(f"{h}-{r}-{i}") for i in range(int(deps[r]["status"]["readyReplicas"]))] for r in deps
        }
        pods["decode"] = pods.get("decode", []) + extra
        out.generations[h] = LiveGeneration(h, n, dict(deps), pods)
    return RolloutView(out, plan, {(h, "decode"): d for h, d in details.items()})


A, B = "aaaa0001", "bbbb0002"
READY = {"prefill": dep(1, 1), "decode": dep(1, 1)}
STARTING = {"prefill": dep(1, 1), "decode": dep(1, 0)}
ROUTER = {"router": dep(1, 1)}
ROLLING = Plan(Generation(B, 2), Generation(A, 1), frozenset({A, B}), 2, frozenset({A}))


def test_while_the_new_generation_starts_the_old_one_is_what_is_ready_and_the_reason_is_shown() -> None:
    why = "pod x-decode-b-1: P->D output differs from local on 3/16 prompts"
    v = view({A: (1, READY, []), B: (2, STARTING, [pod("x-decode-b-1", ready=False)])}, ROLLING, **{B: why})
    st = status(spec(), ROUTER, rollout=v)
    c = conds(st)
    assert c["Ready"]["status"] == "True" and c["DecodeReady"]["status"] == "True"
    assert "generation 2 (bbbb0002) (not serving yet): 0/1 decode replicas ready" in c["DecodeReady"]["message"]
    assert why in c["DecodeReady"]["message"]
    assert (c["Progressing"]["status"], c["Progressing"]["reason"]) == ("True", "GenerationStarting")
    ro = st["rollout"]
    assert (ro["state"], ro["summary"], ro["servingGeneration"], ro["targetGeneration"]) == (
        "Starting", "gen 2: 1/2 ready", 1, 2)  # fmt: skip
    assert [(g["number"], g["state"]) for g in ro["generations"]] == [(1, "Serving"), (2, "Starting")]
    assert why in ro["generations"][1]["message"]
    assert st["decode"]["replicas"] == 2 and st["decode"]["updatedReplicas"] == 1 and st["decode"]["summary"] == "1/1"
    HybridPDDeploymentStatus.model_validate(st)


def test_a_new_generation_without_room_is_blocked_and_says_how_many_gpus_it_needs() -> None:
    unsched = [pod("x-decode-b-1", ready=False, unschedulable="0/4 nodes are available: Insufficient nvidia.com/gpu")]
    v = view({A: (1, READY, []), B: (2, {"prefill": dep(1, 0), "decode": dep(1, 0)}, unsched)}, ROLLING)
    st = status(spec(), ROUTER, rollout=v)
    c = conds(st)
    assert c["Ready"]["status"] == "True"
    assert (c["Progressing"]["status"], c["Progressing"]["reason"]) == ("False", "GenerationBlocked")
    assert "Insufficient nvidia.com/gpu" in c["Progressing"]["message"]
    assert "room for 4 more GPUs" in c["Progressing"]["message"]  # the seed: 1 + 1 replicas at TP 2
    assert (c["Degraded"]["status"], c["Degraded"]["reason"]) == ("True", "Unschedulable")
    assert "generation 2 (bbbb0002) decode" in c["Degraded"]["message"]
    assert st["rollout"]["state"] == "Blocked" and st["rollout"]["summary"] == "gen 2: blocked"
    HybridPDDeploymentStatus.model_validate(st)


def test_a_generation_the_apiserver_refused_is_blocked_with_its_refusal_not_serving() -> None:
    """Status says what is true: a desired generation without workloads because the apiserver refused them is
    Blocked with the refusal (a first deploy: nothing serves; a serving CR: the old generation keeps serving), never
    "generation N serves" / Complete."""
    refusal = Failure(Reason.APPLY_FAILED, "the apiserver refused Deployment x-prefill-bbbb0002: 422 duplicate env A")
    first = Plan(Generation(B, 1), Generation(B, 1), frozenset({B}), 0)
    st = status(spec(), {}, rollout=view({}, first), failure=refusal)
    ro, c = st["rollout"], conds(st)
    assert (ro["state"], ro["summary"]) == ("Blocked", "gen 1: blocked"), ro
    assert "generation 1 (bbbb0002) cannot be created: the apiserver refused" in ro["message"], ro["message"]
    assert "nothing serves yet" in ro["message"] and "serves" not in ro["message"].replace("nothing serves yet", "")
    assert [(g["number"], g["state"]) for g in ro["generations"]] == [(1, "Blocked")]
    assert (c["Progressing"]["reason"], c["Ready"]["reason"]) == ("ApplyFailed", "ApplyFailed")
    assert "cannot be created" in c["Progressing"]["message"]
    serving = status(spec(), ROUTER, rollout=view({A: (1, READY, [])}, ROLLING), failure=refusal)
    ro = serving["rollout"]
    assert ro["state"] == "Blocked" and "generation 1 (aaaa0001) keeps serving" in ro["message"], ro["message"]
    assert [(g["number"], g["state"]) for g in ro["generations"]] == [(1, "Serving"), (2, "Blocked")]
    HybridPDDeploymentStatus.model_validate(serving)


def test_after_the_switch_the_old_generation_drains_then_the_rollout_is_complete() -> None:
    switched = Plan(Generation(B, 2), Generation(B, 2), frozenset({A, B}), 2, frozenset({A, B}))
    st = status(spec(), ROUTER, rollout=view({A: (1, READY, []), B: (2, READY, [])}, switched))
    assert st["rollout"]["state"] == "Switching" and st["rollout"]["summary"] == "draining gen 1"
    assert conds(st)["Progressing"]["reason"] == "TrafficSwitching"
    assert [(g["number"], g["state"]) for g in st["rollout"]["generations"]] == [(1, "Draining"), (2, "Serving")]
    done = status(spec(), ROUTER, rollout=view({B: (2, READY, [])}, Plan(switched.desired, switched.route,
                                                                           frozenset({B}), 2)))  # fmt: skip
    assert done["rollout"]["state"] == "Complete" and done["rollout"]["summary"] == "complete"
    assert conds(done)["Progressing"]["reason"] == "Stable" and conds(done)["Ready"]["status"] == "True"
    for s in (st, done):
        HybridPDDeploymentStatus.model_validate(s)


def test_one_event_per_rollout_transition() -> None:
    base = status(spec(), ROUTER, rollout=view({A: (1, READY, [])}, Plan(Generation(A, 1), Generation(A, 1),
                                                                        frozenset({A}), 1, frozenset({A}))))["rollout"]  # fmt: skip
    starting = status(spec(), ROUTER, rollout=view({A: (1, READY, []), B: (2, STARTING, [])}, ROLLING))["rollout"]
    switched_plan = Plan(Generation(B, 2), Generation(B, 2), frozenset({A, B}), 2, frozenset({A, B}))
    switching = status(spec(), ROUTER, rollout=view({A: (1, READY, []), B: (2, READY, [])}, switched_plan))["rollout"]
    done = status(spec(), ROUTER, rollout=view({B: (2, READY, [])}, switched_plan))["rollout"]
    reverted = copy.deepcopy(base)
    reverted["latestGeneration"] = 2
    assert rollout_transitions(None, base) == [] and rollout_transitions(base, base) == []
    assert [r for _, r, _ in rollout_transitions(base, starting)] == ["GenerationStarted"]
    assert rollout_transitions(starting, starting) == []
    assert [r for _, r, _ in rollout_transitions(starting, switching)] == ["TrafficSwitched"]
    assert [r for _, r, m in rollout_transitions(switching, done)] == ["GenerationRemoved"]
    ((_, reason, message),) = rollout_transitions(starting, reverted)
    assert reason == "GenerationCancelled" and "generation 2 (bbbb0002)" in message and "went back" in message


# --- autoscaling meets generations (docs/autoscaling.md "Rollouts") --------------------------------------------------
def autoscaling_doc(**bounds: Any) -> dict[str, Any]:
    doc = seed_doc()
    doc["spec"]["prefill"]["autoscaling"] = {"minReplicas": 1, "maxReplicas": 4, **bounds}
    doc["spec"]["decode"]["autoscaling"] = {"minReplicas": 1, "maxReplicas": 6}
    doc["spec"]["ratio"] = {"minDecodePerPrefill": 1, "maxDecodePerPrefill": 3}
    return doc


def test_autoscaling_bounds_and_the_ratio_never_start_a_generation() -> None:
    base = gen_hash(autoscaling_doc())
    assert gen_hash(autoscaling_doc(maxReplicas=8)) == base == gen_hash(seed_doc())
    doc = autoscaling_doc()
    doc["spec"]["ratio"] = {"minDecodePerPrefill": 1, "maxDecodePerPrefill": 5}
    doc["spec"]["decode"]["autoscaling"]["metrics"] = [{"signal": "runningRequests", "target": 16}]
    assert gen_hash(doc) == base


def planned(doc: dict[str, Any], rolling: bool, start: dict[str, int] | None = None) -> list[dict[str, Any]]:
    from hpd_operator.profile import compute_profile
    from hpd_operator.validation import validate

    cr = cr_from(doc)
    prof = compute_profile(validate(cr))
    want = Generation(generation_hash(cr, prof), 2)
    old = Generation("0ld0ld00", 1)
    route = old if rolling else want
    return build_all(cr, prof, Plan(desired=want, route=route, keep=frozenset({want.hash, route.hash}), latest=2),
                     start=start)  # fmt: skip


def test_a_new_generation_starts_at_the_serving_counts_and_the_serving_generation_keeps_the_autoscalers() -> None:
    doc = autoscaling_doc()
    doc["spec"]["router"]["replicas"] = 1
    objs = planned(doc, rolling=True, start={"prefill": 2, "decode": 5})
    deps = {o["metadata"]["labels"][contract.LABEL_COMPONENT]: o for o in objs if o["kind"] == "Deployment"}
    # the generation that does not serve yet runs what the serving one runs (the operator writes it until the switch)
    assert (deps["prefill"]["spec"]["replicas"], deps["decode"]["spec"]["replicas"]) == (2, 5)
    hpas = [o for o in objs if o["kind"] == "HorizontalPodAutoscaler"]
    # the HPAs scale the serving generation's Deployments (named after it), not the new one's
    assert sorted(h["spec"]["scaleTargetRef"]["name"] for h in hpas) == ["nemotron-3-nano-decode-0ld0ld00",
                                                                        "nemotron-3-nano-prefill-0ld0ld00"]  # fmt: skip
    assert {h["metadata"]["labels"][contract.LABEL_GENERATION] for h in hpas} == {"0ld0ld00"}


def test_after_the_switch_the_new_generation_has_its_own_autoscalers_and_no_replicas_of_the_operator() -> None:
    objs = planned(autoscaling_doc(), rolling=False, start={"prefill": 2, "decode": 5})
    deps = {o["metadata"]["labels"][contract.LABEL_COMPONENT]: o for o in objs if o["kind"] == "Deployment"}
    assert "replicas" not in deps["prefill"]["spec"] and "replicas" not in deps["decode"]["spec"]
    hpas = {h["spec"]["scaleTargetRef"]["name"] for h in objs if h["kind"] == "HorizontalPodAutoscaler"}
    assert hpas == {deps["prefill"]["metadata"]["name"], deps["decode"]["metadata"]["name"]}


def test_a_role_that_does_not_autoscale_keeps_its_spec_replicas_in_every_generation() -> None:
    doc = autoscaling_doc()
    del doc["spec"]["decode"]["autoscaling"], doc["spec"]["ratio"]
    doc["spec"]["decode"]["replicas"] = 3
    for rolling in (True, False):
        objs = planned(doc, rolling=rolling, start={"prefill": 2})
        (d,) = [o for o in objs if o["kind"] == "Deployment" and o["metadata"]["labels"][contract.LABEL_COMPONENT]
                == "decode"]  # fmt: skip
        assert d["spec"]["replicas"] == 3
        assert [h["metadata"]["labels"][contract.LABEL_COMPONENT] for h in objs
                if h["kind"] == "HorizontalPodAutoscaler"] == ["prefill"]  # fmt: skip


def test_the_start_count_is_the_serving_generations_within_the_bounds() -> None:
    from hpd_operator.scaling import Bounds, start_replicas

    s = cr_from(autoscaling_doc()).spec
    bounds = {"prefill": Bounds(1, 4), "decode": Bounds(2, 6)}
    assert start_replicas(s, {"prefill": 3, "decode": 5}, bounds) == {"prefill": 3, "decode": 5}
    assert start_replicas(s, {"prefill": 9, "decode": 1}, bounds) == {"prefill": 4, "decode": 2}  # clipped
    assert start_replicas(s, {"prefill": None, "decode": None}, bounds) == {"prefill": 1, "decode": 2}  # spec's


def test_a_draining_generations_autoscaler_is_pruned_at_the_switch_while_its_engines_stay() -> None:
    new, old = Generation("n3wn3w00", 2), Generation("0ld0ld00", 1)
    plan = Plan(desired=new, route=new, keep=frozenset({new.hash, old.hash}), latest=2)  # old: router pods drain
    labels = {contract.LABEL_COMPONENT: "prefill", **old.labels()}
    engine = {"kind": "Deployment", "metadata": {"name": "x-prefill-0ld0ld00", "labels": labels}}
    hpa = {"kind": "HorizontalPodAutoscaler", "metadata": {"name": "x-prefill-0ld0ld00", "labels": labels}}
    assert kept(engine, plan) and not kept(hpa, plan)


def test_an_autoscaling_roles_desired_count_is_what_its_deployment_runs() -> None:
    from hpd_operator.rollout import generation_desired

    s = cr_from(autoscaling_doc()).spec
    g = LiveGeneration("n3wn3w00", 2, deployments={"prefill": deployment("prefill", "n3wn3w00", 2, replicas=3),
                                                   "decode": deployment("decode", "n3wn3w00", 2, replicas=4)})  # fmt: skip
    assert generation_desired(s, g, "n3wn3w00") == {"prefill": 3, "decode": 4}  # not spec.<role>.replicas (1)
    assert generation_desired(s, None, "n3wn3w00") == {"prefill": 1, "decode": 1}


def test_the_generation_hash_is_taken_over_the_templates_that_are_applied() -> None:
    """One reconcile builds the engine templates once: the plan hashes them and build_all builds the workloads from
    those very objects (no second build that could differ from what was hashed)."""
    from hpd_operator.builders import engine_templates
    from hpd_operator.generations import hash_templates
    from hpd_operator.profile import compute_profile
    from hpd_operator.validation import validate

    cr = cr_from(seed_doc())
    prof = compute_profile(validate(cr))
    templates = engine_templates(cr, prof)
    marked = copy.deepcopy(templates)
    marked["decode"]["metadata"]["annotations"] = {"test.hybridpd.io/marker": "hashed"}
    assert generation_hash(cr, prof, marked) == hash_templates(marked) != generation_hash(cr, prof)
    objs = build_all(cr, prof, templates=marked)
    decode = next(
        o for o in objs if o["kind"] == "Deployment" and o["metadata"]["labels"].get(contract.LABEL_ROLE) == "decode"
    )
    assert decode["spec"]["template"]["metadata"]["annotations"] == {"test.hybridpd.io/marker": "hashed"}
    assert decode["metadata"]["labels"][contract.LABEL_GENERATION] == hash_templates(marked)
