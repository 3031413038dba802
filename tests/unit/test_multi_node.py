"""Replicas larger than a node (#30): the API's numbers, the LeaderWorkerSet a role becomes, who serves and who is
selected, the refusals that name the field, and the status that counts groups. Pure: no cluster."""

from __future__ import annotations

from typing import Any

import pytest

from hpd_operator.api.models import HybridPDDeployment, HybridPDDeploymentSpec, RoleSpec
from hpd_operator.api.names import MAX_GROUP_NAME, group_name
from hpd_operator.builders import build_all, generation_hash, group_roles
from hpd_operator.builders.network import engines_selector
from hpd_operator.cache import trim_child
from hpd_operator.conditions import Failure, Reason
from hpd_operator.errors import SpecError
from hpd_operator.generations import Plan, RolloutView, kept, observe, plan_rollout
from hpd_operator.profile import compute_profile
from hpd_operator.report import observe_deployments
from hpd_operator.rolestate import role_state
from hpd_operator.rollout import generation_desired, generation_ready
from hpd_operator.status import Observation, compute_status
from hpd_operator.validation import validate
from hpd_runtime import contract as c

NAME, NS = "big", "ns1"
ATTENTION = {"name": "x/y", "hybrid": "none"}


def cr(**spec: Any) -> HybridPDDeployment:
    body = {"model": ATTENTION, "prefill": {"tensorParallelSize": 8}, "decode": {"tensorParallelSize": 16}, **spec}
    return HybridPDDeployment.model_validate({"metadata": {"name": NAME, "namespace": NS}, "spec": body})


def build(x: HybridPDDeployment) -> list[dict[str, Any]]:
    return build_all(x, compute_profile(validate(x)))


def one(objs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    [o] = [o for o in objs if o["kind"] == kind and o["metadata"]["name"] == name]
    return o


def engine(objs: list[dict[str, Any]], kind: str, role: str) -> dict[str, Any]:
    """The role's `kind` (Deployment, LeaderWorkerSet, Service) of the one generation `build` renders."""
    [o] = [o for o in objs if o["kind"] == kind and o["metadata"]["labels"].get(c.LABEL_COMPONENT) == role]
    assert o["metadata"]["name"] == f"{NAME}-{role}-{o['metadata']['labels'][c.LABEL_GENERATION]}"
    return o


def router_of(objs: list[dict[str, Any]]) -> list[str]:
    args: list[str] = one(objs, "Deployment", f"{NAME}-router")["spec"]["template"]["spec"]["containers"][0]["args"]
    return args


def problems(x: HybridPDDeployment) -> set[tuple[str, str]]:
    with pytest.raises(SpecError) as ei:
        validate(x)
    return {(v.field, v.rule) for v in ei.value.violations}


def args_value(args: list[str], flag: str) -> str:
    return args[args.index(flag) + 1]


# --- the numbers -----------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("tp", "pp", "per_node", "nodes", "per_pod"),
    [(8, 1, 8, 1, 8), (16, 1, 8, 2, 8), (8, 2, 8, 2, 8), (4, 2, 8, 1, 8), (32, 1, 8, 4, 8), (2, 1, 8, 1, 2)],
)
def test_a_replica_fills_whole_nodes_or_fits_one(tp: int, pp: int, per_node: int, nodes: int, per_pod: int) -> None:
    rs = RoleSpec(tensor_parallel_size=tp, pipeline_parallel_size=pp, gpus_per_node=per_node)
    assert (rs.nodes_per_replica, rs.gpus_per_pod, rs.multi_node) == (nodes, per_pod, nodes > 1)


# --- the LeaderWorkerSet ---------------------------------------------------------------------------------------
def test_decode_of_16_gpus_on_8_gpu_nodes_is_one_leaderworkerset_of_size_2_per_replica() -> None:
    objs = build(cr(decode={"tensorParallelSize": 16, "replicas": 3}))
    lws = engine(objs, "LeaderWorkerSet", "decode")
    assert lws["apiVersion"] == "leaderworkerset.x-k8s.io/v1"
    assert lws["spec"]["replicas"] == 3 and lws["spec"]["leaderWorkerTemplate"]["size"] == 2
    assert lws["spec"]["leaderWorkerTemplate"]["restartPolicy"] == "RecreateGroupOnPodRestart"
    assert lws["spec"]["startupPolicy"] == "LeaderCreated"
    assert lws["spec"]["networkConfig"] == {"subdomainPolicy": "UniquePerReplica"}
    assert lws["spec"]["rolloutStrategy"]["rollingUpdateConfiguration"] == {"maxUnavailable": 1, "maxSurge": 0}
    assert not [o for o in objs if o["kind"] == "Deployment" and o["metadata"]["labels"][c.LABEL_COMPONENT] == "decode"]
    engine(objs, "Deployment", "prefill")  # TP 8 fits a node: a Deployment as before


def _templates(objs: list[dict[str, Any]]) -> tuple[dict[str, Any], dict[str, Any]]:
    t = engine(objs, "LeaderWorkerSet", "decode")["spec"]["leaderWorkerTemplate"]
    return t["leaderTemplate"], t["workerTemplate"]


def test_every_pod_of_a_group_runs_vllms_own_multi_node_launch_and_only_workers_are_headless() -> None:
    leader, worker = _templates(build(cr()))
    la, wa = (t["spec"]["containers"][0]["args"] for t in (leader, worker))
    for args in (la, wa):
        assert args_value(args, "--tensor-parallel-size") == "16"
        assert args_value(args, "--nnodes") == "2"
        assert args_value(args, "--node-rank") == "$(LWS_WORKER_INDEX)"  # 0 on the leader: LWS's webhook env
        assert args_value(args, "--master-addr") == "$(LWS_LEADER_ADDRESS)"
        assert args_value(args, "--master-port") == str(c.MASTER_PORT)
        assert args_value(args, "--distributed-executor-backend") == "mp"
        assert "--pipeline-parallel-size" not in args
    assert "--headless" not in la and wa == [*la, "--headless"]


def test_each_pod_gets_its_nodes_gpus_its_group_role_and_the_pod_ip_as_vllm_host_ip() -> None:
    for template, role in zip(_templates(build(cr())), (c.GROUP_LEADER, c.GROUP_WORKER), strict=True):
        ct = template["spec"]["containers"][0]
        assert ct["resources"]["limits"]["nvidia.com/gpu"] == 8
        env = {e["name"]: e.get("value", e.get("valueFrom")) for e in ct["env"]}
        assert env[c.ENV_GROUP_ROLE] == role
        assert env[c.ENV_VLLM_HOST_IP] == f"$({c.ENV_POD_IP})"
        assert env[c.ENV_VLLM_NIXL_SIDE_CHANNEL_HOST] == f"$({c.ENV_POD_IP})"  # each pod its own side-channel host
        assert template["metadata"]["labels"][c.LABEL_GROUP_ROLE] == role
        assert ct["readinessProbe"] and ct["startupProbe"] and ct["livenessProbe"]


def test_only_the_leaders_serve_the_router_and_the_roles_headless_service() -> None:
    objs = build(cr())
    args = router_of(objs)
    decode = args[args.index("--decode-selector") + 1 : args.index("--service-discovery-namespace")]
    prefill = args[args.index("--prefill-selector") + 1 : args.index("--decode-selector")]
    assert f"{c.LABEL_GROUP_ROLE}={c.GROUP_LEADER}" in decode
    assert not any(a.startswith(c.LABEL_GROUP_ROLE) for a in prefill)  # a one-pod role: every pod serves
    svc = engine(objs, "Service", "decode")
    assert svc["spec"]["selector"][c.LABEL_GROUP_ROLE] == c.GROUP_LEADER
    assert c.LABEL_GROUP_ROLE not in engine(objs, "Service", "prefill")["spec"]["selector"]


def _matches(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    ok = all(labels.get(k) == v for k, v in selector.get("matchLabels", {}).items())
    for e in selector.get("matchExpressions", []):
        present = labels.get(e["key"])
        ok = ok and ((present in e["values"]) if e["operator"] == "In" else (present not in e["values"]))
    return ok


def test_the_engines_network_policy_covers_leaders_and_workers_and_pod_monitors_skip_workers() -> None:
    objs = build(cr(monitoring={"podMonitor": True}))
    leader, worker = _templates(objs)
    policy = one(objs, "NetworkPolicy", f"{NAME}-engines")["spec"]
    assert policy["podSelector"] == engines_selector(NAME)
    peers = policy["ingress"][1]["from"][0]["podSelector"]  # engines accept each other on any port
    for t in (leader, worker):
        assert _matches(policy["podSelector"], t["metadata"]["labels"])
        assert _matches(peers, t["metadata"]["labels"])
    monitor = one(objs, "PodMonitor", f"{NAME}-engines")["spec"]["selector"]
    assert _matches(monitor, leader["metadata"]["labels"]) and not _matches(monitor, worker["metadata"]["labels"])


def test_a_pipeline_parallel_prefill_over_two_nodes_on_027_for_an_attention_only_model() -> None:
    x = cr(vllmVersion="0.27.1", prefill={"tensorParallelSize": 8, "pipelineParallelSize": 2})
    objs = build(x)
    lws = engine(objs, "LeaderWorkerSet", "prefill")
    args = lws["spec"]["leaderWorkerTemplate"]["leaderTemplate"]["spec"]["containers"][0]["args"]
    assert args_value(args, "--pipeline-parallel-size") == "2" and args_value(args, "--nnodes") == "2"
    rules = [r.rule for r in compute_profile(validate(x)).rules]
    assert "multi-node-mp" in rules and "nixl-pipeline-parallel-prefill" in rules


def test_version_rules_of_multi_node_and_pipelines_are_listed_only_where_they_apply() -> None:
    one_pod = HybridPDDeployment.model_validate({"metadata": {"name": "a"}, "spec": {"model": ATTENTION}})
    rules = {r.rule for r in compute_profile(validate(one_pod)).rules}
    assert not rules & {"multi-node-mp", "nixl-no-pipeline-parallel", "nixl-pipeline-parallel-prefill"}


def test_a_long_cr_name_keeps_the_leaderworkerset_name_short_enough_for_its_statefulsets() -> None:
    long = "a" * 55
    name = group_name(long, "prefill")
    assert len(name) <= MAX_GROUP_NAME and name.endswith("-prefill")
    # LWS names a group's worker StatefulSet <name>-<group>; its pods' controller-revision-hash <sts>-<10 chars>
    assert len(f"{name}-1023-{'x' * 10}") <= 63
    assert group_name("short", "decode") == "short-decode"


# --- refusals that name the field ------------------------------------------------------------------------------
def test_gpus_that_do_not_fill_whole_nodes_are_refused_naming_the_field() -> None:
    assert ("spec.decode.tensorParallelSize", "replica-fills-whole-nodes") in problems(
        cr(decode={"tensorParallelSize": 12, "gpusPerNode": 8})
    )
    validate(cr(prefill={"tensorParallelSize": 4}, decode={"tensorParallelSize": 12, "gpusPerNode": 4}))  # 3 nodes


def test_a_pipeline_parallel_decode_is_refused_in_every_version() -> None:
    for version in ("0.20.0", "0.27.1", "0.33.0"):
        got = problems(cr(vllmVersion=version, decode={"tensorParallelSize": 8, "pipelineParallelSize": 2}))
        assert ("spec.decode.pipelineParallelSize", "decode-not-pipeline-parallel") in got


def test_a_pipeline_parallel_prefill_needs_vllm_027_and_an_attention_only_model() -> None:
    pp = {"tensorParallelSize": 8, "pipelineParallelSize": 2}
    assert ("spec.prefill.pipelineParallelSize", "pipeline-parallel-prefill-version") in problems(
        cr(vllmVersion="0.25.1", prefill=pp)
    )
    hybrid = cr(vllmVersion="0.33.0", prefill=pp, model={"name": "x/y", "hybrid": "mamba2"})
    assert ("spec.prefill.pipelineParallelSize", "pipeline-parallel-hybrid") in problems(hybrid)
    validate(cr(vllmVersion="0.33.0", prefill=pp))


def test_a_gpu_limit_below_a_pods_share_is_refused_and_a_nodes_share_is_enough() -> None:
    low = cr(decode={"tensorParallelSize": 16, "resources": {"limits": {"nvidia.com/gpu": 4}}})
    assert ("spec.decode.resources.limits", "gpus-cover-pod-share") in problems(low)
    validate(cr(decode={"tensorParallelSize": 16, "resources": {"limits": {"nvidia.com/gpu": 8}}}))
    pp_one_node = cr(
        vllmVersion="0.27.1", prefill={"tensorParallelSize": 2, "pipelineParallelSize": 2, "resources": {"limits": {"nvidia.com/gpu": 2}}}
    )  # fmt: skip
    assert ("spec.prefill.resources.limits", "gpus-cover-pod-share") in problems(pp_one_node)


@pytest.mark.parametrize("flag", ["--nnodes", "--node-rank", "--master-addr", "--headless", "-pp", "--distributed-executor-backend"])  # fmt: skip
def test_the_multi_node_flags_are_the_operators_in_extra_args(flag: str) -> None:
    x = cr(decode={"tensorParallelSize": 16, "extraArgs": [flag, "1"] if flag != "--headless" else [flag]})
    assert ("spec.decode.extraArgs[0]", "operator-owned-flag") in problems(x)


# --- status: groups, not pods -------------------------------------------------------------------------------------
def lws_obj(replicas: int, ready: int, size: int = 2, gen: int = 1) -> dict[str, Any]:
    return {
        "apiVersion": "leaderworkerset.x-k8s.io/v1",
        "kind": "LeaderWorkerSet",
        "metadata": {"name": f"{NAME}-decode", "generation": gen, "ownerReferences": [{"uid": "u1"}]},
        "spec": {"replicas": replicas, "leaderWorkerTemplate": {"size": size}},
        "status": {
            "observedGeneration": gen,
            "replicas": replicas,
            "readyReplicas": ready,
            "updatedReplicas": replicas,
        },
    }


def pod(name: str, group_role: str, ready: bool) -> dict[str, Any]:
    labels = {c.LABEL_COMPONENT: "decode", c.LABEL_GROUP_ROLE: group_role}
    return {
        "metadata": {"name": name, "labels": labels},
        "status": {"conditions": [{"type": "Ready", "status": "True" if ready else "False"}]},
    }


def test_status_counts_groups_and_says_so() -> None:
    pods = [pod("big-decode-0", "leader", True), pod("big-decode-0-1", "worker", True),
            pod("big-decode-1", "leader", True), pod("big-decode-1-1", "worker", True)]  # fmt: skip
    s = role_state(2, lws_obj(2, 2), pods)
    assert (s.ready, s.desired, s.ready_all, s.group_size) == (2, 2, True, 2)
    spec = HybridPDDeploymentSpec.model_validate(
        {"model": ATTENTION, "decode": {"tensorParallelSize": 16, "replicas": 2}}
    )
    status = compute_status(Observation(name=NAME, namespace=NS, spec=spec, observed={"decode": lws_obj(2, 2)},
                            pods={"decode": pods}, generation=1))  # fmt: skip
    assert status["decode"]["readyReplicas"] == 2 and status["decode"]["summary"] == "2/2"
    cond = next(x for x in status["conditions"] if x["type"] == "DecodeReady")
    assert cond["status"] == "True" and "2/2 decode replicas (groups of 2 pods) ready" in cond["message"]


def test_a_group_counts_ready_only_while_its_leader_pod_is() -> None:
    # LWS still says 2 ready groups, but one leader's pod is not Ready any more (its delete event came first)
    pods = [pod("big-decode-0", "leader", True), pod("big-decode-1", "leader", False), pod("big-decode-1-1", "worker", True)]  # fmt: skip
    assert role_state(2, lws_obj(2, 2), pods).ready == 1


def test_a_missing_leaderworkerset_is_named_as_such() -> None:
    spec = HybridPDDeploymentSpec.model_validate({"model": ATTENTION, "decode": {"tensorParallelSize": 16}})
    status = compute_status(Observation(name=NAME, namespace=NS, spec=spec, observed={}, generation=1))
    cond = next(x for x in status["conditions"] if x["type"] == "DecodeReady")
    assert cond["message"] == "the decode LeaderWorkerSet does not exist yet"


def test_leaderworkerset_missing_is_a_failure_with_the_install_hint() -> None:
    from hpd_operator.leaderworkerset import MISSING

    spec = HybridPDDeploymentSpec.model_validate({"model": ATTENTION, "decode": {"tensorParallelSize": 16}})
    failure = Failure(Reason.LWS_MISSING, MISSING.format(every=10))
    status = compute_status(Observation(name=NAME, namespace=NS, spec=spec, observed={}, generation=1, failure=failure))
    ready = next(x for x in status["conditions"] if x["type"] == "Ready")
    assert (ready["status"], ready["reason"]) == ("False", "LeaderWorkerSetMissing") and status["phase"] == "Failed"
    assert ready["message"].startswith("LeaderWorkerSet is not installed; install lws v0.9.0")


def test_observe_takes_the_leaderworkerset_of_the_generation_whose_role_spans_nodes() -> None:
    group = trim_child(lws_obj(1, 1))
    assert group["spec"] == {"replicas": 1, "leaderWorkerTemplate": {"size": 2}}
    assert group["status"]["readyReplicas"] == 1
    group["metadata"]["name"] = f"{NAME}-decode-bbbb0002"
    dep = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": f"{NAME}-decode-aaaa0001", "ownerReferences": [{"uid": "u1"}]}}  # fmt: skip
    got = observe_deployments([dep, group], NAME, "u1", "bbbb0002")
    assert got["decode"] is not None and got["decode"]["kind"] == "LeaderWorkerSet"
    assert observe_deployments([dep, group], NAME, "u1", "aaaa0001")["decode"]["kind"] == "Deployment"  # type: ignore[index]  # fmt: skip


# --- generations: a LeaderWorkerSet per generation, gated and pruned like a Deployment -----------------------------
UID = "u1"


def profile_of(x: HybridPDDeployment) -> Any:
    return compute_profile(validate(x))


def want(x: HybridPDDeployment) -> str:
    return generation_hash(x, profile_of(x))


def running(objs: list[dict[str, Any]], ready_groups: int | None = None) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:  # fmt: skip
    """The engines of `objs` as the cache would hold them once their controllers ran: owned, observed, every
    replica Ready (a LeaderWorkerSet: `ready_groups` of its groups, default all; its leaders' and workers' pods)."""
    children, pods = [], []
    for built in objs:
        if built["kind"] not in ("Deployment", "LeaderWorkerSet"):
            continue
        o = {**built, "metadata": {**built["metadata"], "generation": 1, "ownerReferences": [{"uid": UID}]}}
        n = o["spec"]["replicas"]
        ready = n if ready_groups is None or o["kind"] == "Deployment" else ready_groups
        o["status"] = {"observedGeneration": 1, "replicas": n, "readyReplicas": ready, "updatedReplicas": n,
                       "availableReplicas": ready}  # fmt: skip
        children.append(trim_child(o))
        if o["metadata"]["labels"][c.LABEL_COMPONENT] == c.COMPONENT_ROUTER:
            continue
        if o["kind"] == "Deployment":
            templates = [o["spec"]["template"]]
        else:
            t = o["spec"]["leaderWorkerTemplate"]
            templates = [t["leaderTemplate"]] + [t["workerTemplate"]] * (t["size"] - 1)
        for i in range(n):
            for j, t in enumerate(templates):
                up = i < ready
                pods.append({"metadata": {"name": f"{o['metadata']['name']}-{i}-{j}", "labels": t["metadata"]["labels"]},
                             "status": {"conditions": [{"type": "Ready", "status": "True" if up else "False"}]}})  # fmt: skip
    return children, pods


def engines(objs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The engine workloads of the generation `objs` were built for (not the router)."""
    return [o for o in objs if o["kind"] in ("Deployment", "LeaderWorkerSet") and
            o["metadata"]["labels"][c.LABEL_COMPONENT] in c.ROLES]  # fmt: skip


def plan_for(x: HybridPDDeployment, children: list[dict[str, Any]], pods: list[dict[str, Any]]) -> Plan:
    """What handlers.plan decides from what runs (the same calls)."""
    live = observe(children, pods, UID)
    h = want(x)
    ready = {g.hash: generation_ready(g, generation_desired(x.spec, g, h)) for g in live.generations.values()}
    return plan_rollout(h, live, ready, groups=group_roles(x))


def selectors(args: list[str]) -> tuple[list[str], list[str]]:
    p, d = args.index("--prefill-selector"), args.index("--decode-selector")
    return args[p + 1 : d], args[d + 1 : args.index("--service-discovery-namespace")]


def test_a_role_that_spans_nodes_is_one_leaderworkerset_per_generation_named_labelled_and_selected_like_a_deployment() -> None:  # fmt: skip
    x = cr(decode={"tensorParallelSize": 16})
    h = want(x)
    objs = build(x)
    group = engine(objs, "LeaderWorkerSet", "decode")
    assert group["metadata"]["name"] == f"{NAME}-decode-{h}"
    assert group["metadata"]["labels"][c.LABEL_GENERATION] == h
    assert group["metadata"]["labels"][c.LABEL_GENERATION_NUMBER] == "1"
    leader, worker = _templates(objs)
    for t in (leader, worker):
        assert t["metadata"]["labels"][c.LABEL_GENERATION] == h
        env = {e["name"]: e.get("value") for e in t["spec"]["containers"][0]["env"]}
        assert env[c.ENV_PREFILL_SERVICE] == f"{NAME}-prefill-{h}.{NS}.svc"  # its own generation's prefill
    svc = engine(objs, "Service", "decode")["spec"]["selector"]
    assert svc == {c.LABEL_INSTANCE: NAME, c.LABEL_COMPONENT: "decode", c.LABEL_GENERATION: h,
                   c.LABEL_GROUP_ROLE: c.GROUP_LEADER}  # fmt: skip
    _, decode = selectors(router_of(objs))
    assert decode == [f"{k}={v}" for k, v in svc.items()]
    # the shape is in the generation's id: the same model on one node, or over 4 nodes, is another generation
    assert len({h, want(cr(decode={"tensorParallelSize": 8})), want(cr(decode={"tensorParallelSize": 16, "gpusPerNode": 4}))}) == 3  # fmt: skip
    # ... and a one-pod role hashes as before multi-node roles existed (no group template in it)
    assert want(cr(decode={"tensorParallelSize": 8})) == generation_hash_of_templates(cr(decode={"tensorParallelSize": 8}))  # fmt: skip


def generation_hash_of_templates(x: HybridPDDeployment) -> str:
    from hpd_operator.builders.engine import engine_pod_template
    from hpd_operator.generations import hash_templates

    prof = profile_of(x)
    return hash_templates({r: engine_pod_template(x, prof, r) for r in c.ROLES})


def test_the_router_moves_to_a_new_multi_node_generation_only_once_its_groups_are_ready_then_the_old_one_goes() -> None:
    one_pod, spans = cr(decode={"tensorParallelSize": 8}), cr(decode={"tensorParallelSize": 16})
    old_h, new_h = want(one_pod), want(spans)
    old_children, old_pods = running(build(one_pod))  # generation 1 serves: a decode Deployment

    # generation 2's LeaderWorkerSet exists, its group is not Ready yet (its leader waits for its pair check)
    first = plan_for(spans, old_children, old_pods)
    assert (first.desired.hash, first.route.hash, first.desired.groups) == (new_h, old_h, frozenset({"decode"}))
    objs = build_all(spans, profile_of(spans), first)
    new_children, new_pods = running(engines(objs), ready_groups=0)  # its prefill Deployment is Ready
    children, pods = old_children + new_children, old_pods + new_pods
    waiting = plan_for(spans, children, pods)
    assert waiting.route.hash == old_h and waiting.rolling
    _, decode = selectors(router_of(build_all(spans, profile_of(spans), waiting)))
    assert decode == [f"{c.LABEL_INSTANCE}={NAME}", f"{c.LABEL_COMPONENT}=decode", f"{c.LABEL_GENERATION}={old_h}"]
    old_dep = next(o for o in children if o["kind"] == "Deployment" and o["metadata"]["labels"][c.LABEL_COMPONENT] == "decode")  # fmt: skip
    assert kept(old_dep, waiting)  # the serving generation is neither applied nor pruned

    # a Ready worker is not a Ready group: LWS counts the group Ready, but its leader's pod is not (yet)
    lws = next(o for o in new_children if o["kind"] == "LeaderWorkerSet")
    lws["status"]["readyReplicas"] = 1
    for p in new_pods:
        if p["metadata"]["labels"].get(c.LABEL_GROUP_ROLE) == c.GROUP_WORKER:
            p["status"]["conditions"][0]["status"] = "True"
    assert plan_for(spans, children, pods).route.hash == old_h

    # the leader is Ready too: traffic moves, the router selects the new generation's leaders only
    for p in new_pods:
        p["status"]["conditions"][0]["status"] = "True"
    assert len(new_pods) == 3  # the new prefill pod, the decode group's leader and worker
    switched = plan_for(spans, children, pods)
    assert switched.route.hash == new_h and not switched.rolling
    _, decode = selectors(router_of(build_all(spans, profile_of(spans), switched)))
    assert decode == [f"{c.LABEL_INSTANCE}={NAME}", f"{c.LABEL_COMPONENT}=decode", f"{c.LABEL_GENERATION}={new_h}",
                      f"{c.LABEL_GROUP_ROLE}={c.GROUP_LEADER}"]  # fmt: skip
    assert not kept(old_dep, switched)  # drained (no router pod selects it): pruned with generation 1's Services


def test_a_serving_multi_node_generation_keeps_its_leaders_only_selector_while_a_one_pod_one_comes_up() -> None:
    spans, one_pod = cr(decode={"tensorParallelSize": 16}), cr(decode={"tensorParallelSize": 8})
    old_children, old_pods = running(build(spans))
    plan = plan_for(one_pod, old_children, old_pods)
    assert plan.route.hash == want(spans) and plan.route.groups == {"decode"} and plan.desired.groups == frozenset()
    objs = build_all(one_pod, profile_of(one_pod), plan)
    _, decode = selectors(router_of(objs))
    assert f"{c.LABEL_GROUP_ROLE}={c.GROUP_LEADER}" in decode and f"{c.LABEL_GENERATION}={want(spans)}" in decode
    old_group = next(o for o in old_children if o["kind"] == "LeaderWorkerSet")
    assert kept(old_group, plan)  # never re-applied, never pruned while it serves
    assert not [o for o in objs if o["kind"] == "LeaderWorkerSet"]  # the new generation's decode is a Deployment
    assert engine(objs, "Deployment", "decode")["metadata"]["name"] == f"{NAME}-decode-{want(one_pod)}"


def test_status_rollout_counts_the_new_generations_groups() -> None:
    one_pod, spans = cr(decode={"tensorParallelSize": 8, "replicas": 2}), cr(decode={"tensorParallelSize": 16, "replicas": 2})  # fmt: skip
    old_children, old_pods = running(build(one_pod))
    plan = plan_for(spans, old_children, old_pods)
    new_children, new_pods = running(engines(build_all(spans, profile_of(spans), plan)), ready_groups=1)
    children, pods = old_children + new_children, old_pods + new_pods
    plan = plan_for(spans, children, pods)
    view = RolloutView(observe(children, pods, UID), plan)
    st = compute_status(Observation(name=NAME, namespace=NS, spec=spans.spec, observed={}, generation=2, rollout=view))
    [new] = [g for g in st["rollout"]["generations"] if g["hash"] == want(spans)]
    assert (new["state"], new["decode"]) == ("Starting", "1/2")  # groups: 4 of its 8 pods are Ready
    msg = next(x for x in st["conditions"] if x["type"] == "DecodeReady")["message"]
    assert msg.startswith("2/2 decode replicas ready; ")  # the serving generation: 2 one-pod replicas
    assert "(not serving yet): 1/2 decode replicas (groups of 2 pods) ready" in msg
    assert st["rollout"]["state"] == "Starting" and "decode 1/2 Ready" in st["rollout"]["message"]
