"""spec.kvTransfer.processNamespace Pair (pure): one Deployment of pair pods (a prefill and a decode engine container
and an in-pod router, shareProcessNamespace), the CR's router in regular mode over the pods' in-pod routers, the
refusals that name their field, and status reading the pair pods under both roles (docs/kv-topologies.md).
tests/cluster/test_pair_pods.py applies the same against the real apiserver."""

from __future__ import annotations

import json
from typing import Any

import pytest

from hpd_operator import generations, podevents
from hpd_operator.api.models import HybridPDDeployment
from hpd_operator.api.rules import RULES
from hpd_operator.builders import build_all, engine_templates, generation_hash
from hpd_operator.builders.fallback import choose, ready_api_pod_list, verified_ready_prefills
from hpd_operator.errors import SpecError
from hpd_operator.generations import Generation, Plan
from hpd_operator.profile import compute_profile
from hpd_operator.rollout import generation_desired, generation_states
from hpd_operator.status import Observation, compute_status
from hpd_operator.validation import validate
from hpd_runtime import contract as c

MODEL = {"name": "nvidia/NVIDIA-Nemotron-Nano-9B-v2"}
PAIR = {"kvTransfer": {"processNamespace": "Pair"}}


def cr(**spec: Any) -> HybridPDDeployment:
    body = {"model": MODEL, **PAIR, **spec}
    return HybridPDDeployment.model_validate({"metadata": {"name": "p", "namespace": "ns"}, "spec": body})


def render(x: HybridPDDeployment) -> list[dict[str, Any]]:
    return build_all(x, compute_profile(validate(x)))


def by_kind(objs: list[dict[str, Any]], kind: str) -> dict[str, dict[str, Any]]:
    return {o["metadata"]["name"]: o for o in objs if o["kind"] == kind}


def pair_deployment(x: HybridPDDeployment) -> dict[str, Any]:
    deps = by_kind(render(x), "Deployment")
    (name,) = [n for n in deps if n != "p-router"]
    return deps[name]


def containers(dep: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {ct["name"]: ct for ct in dep["spec"]["template"]["spec"]["containers"]}


def env(ct: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value") for e in ct["env"]}


def test_pair_renders_one_pair_deployment_and_no_role_workloads_or_services() -> None:
    x = cr(prefill={"replicas": 2}, decode={"replicas": 2})
    objs = render(x)
    deps = by_kind(objs, "Deployment")
    gen = generation_hash(x, compute_profile(validate(x)))
    assert set(deps) == {f"p-pair-{gen}", "p-router"}
    dep = deps[f"p-pair-{gen}"]
    assert dep["spec"]["replicas"] == 2
    assert dep["metadata"]["labels"][c.LABEL_COMPONENT] == c.COMPONENT_PAIR
    assert dep["spec"]["selector"]["matchLabels"] == {
        c.LABEL_INSTANCE: "p", c.LABEL_COMPONENT: c.COMPONENT_PAIR, c.LABEL_GENERATION: gen}  # fmt: skip
    assert set(by_kind(objs, "Service")) == {"p"}  # no headless role Services: the pair check asks 127.0.0.1
    assert set(by_kind(objs, "PodDisruptionBudget")) == {f"p-pair-{gen}"}


def test_the_pair_pod_shares_one_pid_namespace_of_its_own_and_no_host_namespace() -> None:
    pod = pair_deployment(cr())["spec"]["template"]["spec"]
    assert pod["shareProcessNamespace"] is True
    assert (pod["hostPID"], pod["hostIPC"], pod["hostNetwork"]) == (False, False, False)
    assert list(containers(pair_deployment(cr()))) == ["prefill", "decode", "router"]
    for ct in pod["containers"]:
        sc = ct["securityContext"]
        assert sc["runAsNonRoot"] and not sc["allowPrivilegeEscalation"] and sc["capabilities"]["drop"] == ["ALL"]


def test_each_engine_keeps_its_roles_resources_args_and_env() -> None:
    x = cr(prefill={"tensorParallelSize": 2, "extraArgs": ["--enforce-eager"]},
           decode={"resources": {"limits": {"memory": "64Gi"}}})  # fmt: skip
    ct = containers(pair_deployment(x))
    assert ct["prefill"]["resources"]["limits"]["nvidia.com/gpu"] == 2
    assert ct["decode"]["resources"]["limits"] == {"nvidia.com/gpu": 1, "memory": "64Gi"}
    assert "--enforce-eager" in ct["prefill"]["args"] and "--enforce-eager" not in ct["decode"]["args"]
    assert '{"kv_connector":"NixlConnector","kv_role":"kv_producer"}' in ct["prefill"]["args"]
    assert '{"kv_connector":"NixlConnector","kv_role":"kv_consumer"}' in ct["decode"]["args"]
    assert (env(ct["prefill"])[c.ENV_ROLE], env(ct["decode"])[c.ENV_ROLE]) == ("prefill", "decode")
    # the pod's emptyDirs are shared: only prefill's container asks the node for their disk
    assert "ephemeral-storage" in ct["prefill"]["resources"]["requests"]
    assert "ephemeral-storage" not in ct["decode"]["resources"]["requests"]


def test_decode_listens_on_its_own_ports_and_pair_checks_the_pods_own_prefill() -> None:
    ct = containers(pair_deployment(cr(kvTransfer={"processNamespace": "Pair", "sideChannelPort": 6000})))
    p, d = env(ct["prefill"]), env(ct["decode"])
    assert (p[c.ENV_VLLM_PORT], p[c.ENV_RUNTIME_PORT], p[c.ENV_VLLM_NIXL_SIDE_CHANNEL_PORT]) == ("8000", "8081", "6000")
    assert (d[c.ENV_VLLM_PORT], d[c.ENV_RUNTIME_PORT], d[c.ENV_VLLM_NIXL_SIDE_CHANNEL_PORT]) == ("8100", "8181", "6050")
    assert ct["decode"]["args"][ct["decode"]["args"].index("--port") + 1] == "8100"
    assert d[c.ENV_PREFILL_SERVICE] == c.PAIR_LOOPBACK and d[c.ENV_WARMUP_PAIR_CHECK] == "true"
    ports = [(p["name"], p["containerPort"]) for x in ct.values() for p in x["ports"]]
    assert len({n for n, _ in ports}) == len(ports) and len({n for _, n in ports}) == len(ports), ports
    assert ct["decode"]["livenessProbe"]["httpGet"]["port"] == c.PORT_NAME_DECODE_RUNTIME
    for role in ("prefill", "decode"):  # each engine keeps its own warmup gate
        assert ct[role]["readinessProbe"]["exec"]["command"] == list(c.PROBE_COMMAND)


def test_only_decode_gets_the_kv_reporter_token() -> None:
    dep = pair_deployment(cr())
    pod, ct = dep["spec"]["template"]["spec"], containers(dep)
    assert pod["automountServiceAccountToken"] is False and pod["serviceAccountName"] == "p-kv-reporter"
    mounted = {n for n, x in ct.items() for m in x.get("volumeMounts", []) if m["name"] == "kv-reporter-token"}
    assert mounted == {"decode"}


def test_the_in_pod_router_pairs_the_pods_own_engines() -> None:
    router = containers(pair_deployment(cr()))["router"]
    a = router["args"]
    assert "--vllm-pd-disaggregation" in a and a[a.index("--kv-connector") + 1] == "nixl"
    assert (
        a[a.index("--prefill") + 1] == "http://127.0.0.1:8000" and a[a.index("--decode") + 1] == "http://127.0.0.1:8100"
    )
    assert a[a.index("--port") + 1] == str(c.PAIR_ROUTER_PORT)
    assert "--service-discovery" not in a
    assert router["readinessProbe"]["httpGet"]["path"] == "/readiness"
    assert router["startupProbe"]["failureThreshold"] * router["startupProbe"]["periodSeconds"] >= int(
        a[a.index("--worker-startup-timeout-secs") + 1])  # fmt: skip


def test_the_crs_router_runs_in_regular_mode_over_the_pair_pods() -> None:
    x = cr()
    gen = generation_hash(x, compute_profile(validate(x)))
    a = containers(by_kind(render(x), "Deployment")["p-router"])["router"]["args"]
    assert "--vllm-pd-disaggregation" not in a and "--prefill-selector" not in a and "--decode-selector" not in a
    assert a[a.index("--service-discovery-port") + 1] == str(c.PAIR_ROUTER_PORT)
    i = a.index("--selector")
    assert set(a[i + 1 : i + 4]) == {"app.kubernetes.io/instance=p", "app.kubernetes.io/component=pair",
                                      f"hybridpd.io/generation={gen}"}  # fmt: skip
    assert a[a.index("--service-discovery-namespace") + 1] == "ns"


def test_pod_placement_is_the_default_and_its_render_has_no_pair() -> None:
    x = HybridPDDeployment.model_validate({"metadata": {"name": "p", "namespace": "ns"}, "spec": {"model": MODEL}})
    objs = render(x)
    assert x.spec.kv_transfer.process_namespace == "Pod"
    assert not [o for o in objs if o["metadata"]["labels"].get(c.LABEL_COMPONENT) == c.COMPONENT_PAIR]
    assert "--vllm-pd-disaggregation" in containers(by_kind(objs, "Deployment")["p-router"])["router"]["args"]


def test_pod_to_pair_is_a_new_generation() -> None:
    pod = HybridPDDeployment.model_validate({"metadata": {"name": "p", "namespace": "ns"}, "spec": {"model": MODEL}})
    pair = cr()
    assert generation_hash(pod, compute_profile(validate(pod))) != generation_hash(
        pair, compute_profile(validate(pair))
    )
    assert set(engine_templates(pair, compute_profile(validate(pair)))) == {c.COMPONENT_PAIR}


def test_decode_autoscaling_scales_the_pair_deployment() -> None:
    x = cr(prefill={"replicas": 2}, decode={"replicas": 2, "autoscaling": {"minReplicas": 2, "maxReplicas": 6}})
    objs = render(x)
    (hpa,) = by_kind(objs, "HorizontalPodAutoscaler").values()
    dep = pair_deployment(x)
    assert hpa["spec"]["scaleTargetRef"]["name"] == dep["metadata"]["name"]
    assert "replicas" not in dep["spec"]  # the HPA owns it
    assert hpa["spec"]["metrics"][0]["external"]["metric"]["selector"]["matchLabels"]["role"] == "decode"


def test_monitoring_and_network_policy_cover_both_engines_and_the_in_pod_router() -> None:
    objs = render(cr(monitoring={"podMonitor": True}, networkPolicy={"enabled": True}))
    mon = by_kind(objs, "PodMonitor")["p-engines"]["spec"]
    assert mon["selector"]["matchExpressions"][0]["values"] == [c.COMPONENT_PAIR]
    got = {(e["port"], e["path"], e["relabelings"][2]["replacement"]) for e in mon["podMetricsEndpoints"]}
    assert got == {
        ("runtime", "/vllm/metrics", "prefill"), ("runtime", "/metrics", "prefill"),
        ("decode-runtime", "/vllm/metrics", "decode"), ("decode-runtime", "/metrics", "decode"),
        ("metrics", "/metrics", "pair-router"),
    }  # fmt: skip
    pol = by_kind(objs, "NetworkPolicy")["p-engines"]["spec"]
    assert pol["podSelector"]["matchExpressions"][0]["values"] == [c.COMPONENT_PAIR]
    assert [p["port"] for p in pol["ingress"][0]["ports"]] == [c.PORT_NAME_PAIR_ROUTER]
    assert {p["port"] for p in pol["ingress"][2]["ports"]} == {"runtime", "decode-runtime", "metrics"}


def _refusals(spec: dict[str, Any]) -> dict[str, str]:
    with pytest.raises(SpecError) as e:
        validate(cr(**spec))
    return {v.field: v.rule for v in e.value.violations}


@pytest.mark.parametrize(
    ("spec", "field", "rule"),
    [
        ({"prefill": {"replicas": 1}, "decode": {"replicas": 2}}, "spec.decode.replicas", "pair-replicas-equal"),
        ({"prefill": {"autoscaling": {"maxReplicas": 3}}}, "spec.prefill.autoscaling", "pair-prefill-not-autoscaling"),
        ({"prefill": {"tensorParallelSize": 16, "gpusPerNode": 8}, "decode": {"tensorParallelSize": 8}},
         "spec.prefill.tensorParallelSize", "pair-prefill-one-node"),
        ({"prefill": {"tensorParallelSize": 16}, "decode": {"tensorParallelSize": 16, "gpusPerNode": 8}},
         "spec.decode.tensorParallelSize", "pair-decode-one-node"),
        ({"prefill": {"nodeSelector": {"a": "1"}}, "decode": {"nodeSelector": {"a": "2"}}}, "spec.decode.nodeSelector",
         "pair-placement-agrees"),
        ({"kvTransfer": {"processNamespace": "Pair", "sideChannelPort": 8150}}, "spec.kvTransfer.sideChannelPort",
         "pair-ports-free"),
        ({"kvTransfer": {"processNamespace": "Pair", "ucx": {"tls": "tcp,cuda_copy"}}},
         "spec.kvTransfer.processNamespace", "pair-pod-needs-cuda-ipc"),
    ],
)  # fmt: skip
def test_invalid_pair_specs_are_refused_naming_the_field(spec: dict[str, Any], field: str, rule: str) -> None:
    assert _refusals(spec).get(field) == rule


def test_every_pair_rule_but_the_placement_one_is_cel_too() -> None:
    pair_rules = {r.id: r for r in RULES if r.id.startswith("pair-")}
    assert {i for i, r in pair_rules.items() if r.cel is None} == {"pair-placement-agrees"}


GEN = Generation("g1", 1)
LABELS = {c.LABEL_INSTANCE: "p", c.LABEL_COMPONENT: c.COMPONENT_PAIR, c.LABEL_GENERATION: GEN.hash}


def _pod(name: str, ready: bool, ip: str) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "uid": f"uid-{name}", "labels": dict(LABELS),
                     "creationTimestamp": "2026-12-04T10:00:00Z"},
        "status": {"podIP": ip, "conditions": [{"type": "Ready", "status": str(ready)}]},
    }  # fmt: skip


def _dep(replicas: int, ready: int) -> dict[str, Any]:
    md = {"name": "p-pair-g1", "labels": {**LABELS, c.LABEL_GENERATION_NUMBER: "1"}, "generation": 1,
          "ownerReferences": [{"uid": "cr-uid"}]}  # fmt: skip
    st = {"observedGeneration": 1, "replicas": replicas, "readyReplicas": ready, "updatedReplicas": replicas}
    return {"kind": "Deployment", "metadata": md, "spec": {"replicas": replicas}, "status": st}


def test_status_counts_ready_prefill_and_decode_from_the_pair_pods() -> None:
    pods = [_pod("a", True, "10.0.0.1"), _pod("b", False, "10.0.0.2")]
    live = generations.observe([_dep(2, 1)], pods, "cr-uid")
    g = live.generations[GEN.hash]
    assert g.deployments["prefill"] is not None and g.deployments["decode"]["metadata"]["name"] == "p-pair-g1"
    assert [p["metadata"]["name"] for p in g.pods["prefill"]] == ["a", "b"] == [
        p["metadata"]["name"] for p in g.pods["decode"]]  # fmt: skip
    x = cr(prefill={"replicas": 2}, decode={"replicas": 2})
    states = generation_states(g, generation_desired(x.spec, g, GEN.hash), None, None)
    assert (states["prefill"].ready, states["decode"].ready, states["decode"].desired) == (1, 1, 2)
    assert not states["prefill"].ready_all  # a pair pod with a dead container is NotReady: neither half counts
    assert [p["metadata"]["name"] for p in ready_api_pod_list("p", GEN, "prefill", pods)] == ["a"]


def test_decodes_pair_check_on_loopback_verifies_its_own_pods_prefill() -> None:
    pods = [_pod("a", True, "10.0.0.1"), _pod("b", True, "10.0.0.2")]
    peer = [{"ip": c.PAIR_LOOPBACK, "verifiedTime": "2026-12-04T10:01:00Z"}]
    reports = {f"uid-{n}": json.dumps({"uid": f"uid-{n}", "prefills": peer}) for n in ("a", "b")}
    verified = podevents.verified_prefills(pods, pods, reports)
    assert verified == [frozenset({"uid-a"}), frozenset({"uid-b"})]
    # each decode checked its own pod's prefill: both prefills are checked by one decode, by every decode none
    checked = verified_ready_prefills("p", GEN, pods, verified)
    assert checked is not None and (checked.ready, checked.by_one, checked.by_every) == (2, 2, 0)


def test_degraded_mode_never_applies_to_pair_pods() -> None:
    plan = Plan(desired=GEN, route=GEN, keep=frozenset({GEN.hash}), latest=1, served=frozenset({GEN.hash}))
    # decode's half of the only pair pod died: NotReady, and the endpoint does not select prefill pods directly
    pods = [_pod("a", False, "10.0.0.1")]
    assert choose(cr(), plan, {"prefill": pods, "decode": pods}) is None
    role_pods = {"prefill": [{**_pod("a", True, "10.0.0.1")}], "decode": []}
    assert choose(cr(), plan, role_pods) is None


def test_status_names_the_pair_pods_and_the_shared_pid_namespace() -> None:
    """The scale subresource's selector (status.decode.selector) selects the pair pods; DataPathVerified says the
    PID namespace is the pair pod's own; no host-PID trade is named."""
    x = cr()
    ready = {"metadata": {"generation": 1}, "spec": {"replicas": 1},
             "status": {"observedGeneration": 1, "replicas": 1, "readyReplicas": 1, "updatedReplicas": 1}}  # fmt: skip
    kv = {"pod": "p-pair-0", "message": "cuda_ipc: 20 GB/s", "transport": "cuda_ipc"}
    obs = Observation(
        name="p", namespace="ns", spec=x.spec, observed={"prefill": ready, "decode": ready, "router": ready},
        generation=1, profile=compute_profile(validate(x)), kv_path=kv, prefills_checked=(1, 1),
    )  # fmt: skip
    status = compute_status(obs)
    pair_selector = f"{c.LABEL_INSTANCE}=p,{c.LABEL_COMPONENT}={c.COMPONENT_PAIR}"
    assert status["decode"]["selector"] == status["prefill"]["selector"] == pair_selector
    [path] = [cond for cond in status["conditions"] if cond["type"] == "DataPathVerified"]
    assert "inside each pair pod" in path["message"] and "security trade" not in path["message"]
    assert "verified P->D with the prefill of its own pair pod" in path["message"], path["message"]
    assert "shareProcessNamespace" in str(status["profile"]) and "hostPID" not in str(status["profile"])
