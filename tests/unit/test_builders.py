"""Pure builders: the typed CR + profile -> manifests (dicts). No cluster."""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from hpd_operator.api.models import HybridPDDeployment
from hpd_operator.api.names import short_name
from hpd_operator.builders import build_all, generation_hash
from hpd_operator.builders.engine import MODEL_LOAD_ALLOWANCE_SECONDS, startup_failure_threshold
from hpd_operator.profile import compute_profile
from hpd_operator.validation import validate
from hpd_runtime import contract

REPO = Path(__file__).resolve().parents[2]
SEED = REPO / "examples" / "nemotron-3-nano.yaml"


def cr_from(doc: dict[str, Any], namespace: str = "ns1") -> HybridPDDeployment:
    doc = json.loads(json.dumps(doc))
    doc["metadata"]["namespace"] = namespace
    return HybridPDDeployment.model_validate(doc)


def seed_doc() -> dict[str, Any]:
    out: dict[str, Any] = yaml.safe_load(SEED.read_text())
    return out


def build(doc: dict[str, Any]) -> list[dict[str, Any]]:
    cr = cr_from(doc)
    return build_all(cr, compute_profile(validate(cr)))


def without_generation(obj: dict[str, Any]) -> str:
    """An object's name without its generation's suffix: `<cr>-prefill` for `<cr>-prefill-<hash>`."""
    name: str = obj["metadata"]["name"]
    gen = obj["metadata"].get("labels", {}).get(contract.LABEL_GENERATION)
    return name.removesuffix(f"-{gen}") if gen else name


def by(objs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    """One object by kind and name; `<cr>-prefill` / `<cr>-decode` name the engines of the one generation built."""
    [o] = [o for o in objs if o["kind"] == kind and name in (o["metadata"]["name"], without_generation(o))]
    return o


def container(dep: dict[str, Any]) -> dict[str, Any]:
    c: dict[str, Any] = dep["spec"]["template"]["spec"]["containers"][0]
    return c


def env(c: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in c["env"]}


def test_seed_builds_the_full_child_set() -> None:
    objs = build(seed_doc())
    n = "nemotron-3-nano"
    cr = cr_from(seed_doc())
    g = generation_hash(cr, compute_profile(validate(cr)))  # the engines are generation g's (docs/rollouts.md)
    assert sorted((o["kind"], o["metadata"]["name"]) for o in objs) == sorted(
        [
            ("Service", f"{n}-prefill-{g}"),
            ("Deployment", f"{n}-prefill-{g}"),
            ("Service", f"{n}-decode-{g}"),
            ("Deployment", f"{n}-decode-{g}"),
            ("ServiceAccount", f"{n}-router"),
            ("Role", f"{n}-router"),
            ("RoleBinding", f"{n}-router"),
            ("ServiceAccount", f"{n}-kv-reporter"),
            ("Role", f"{n}-kv-reporter"),
            ("RoleBinding", f"{n}-kv-reporter"),
            ("Lease", f"{n}-kv-reporter"),
            ("Service", n),
            ("Deployment", f"{n}-router"),
            ("NetworkPolicy", f"{n}-engines"),
            ("NetworkPolicy", f"{n}-router"),
        ]
    )
    for o in objs:
        assert o["metadata"]["namespace"] == "ns1"
        assert o["metadata"]["labels"][contract.LABEL_MANAGED_BY] == contract.MANAGED_BY
        assert len(o["metadata"]["name"]) <= 63


def test_decode_gets_kv_consumer_role_and_no_async_scheduling() -> None:
    objs = build(seed_doc())
    d = container(by(objs, "Deployment", "nemotron-3-nano-decode"))
    p = container(by(objs, "Deployment", "nemotron-3-nano-prefill"))
    kv = lambda c: json.loads(c["args"][c["args"].index("--kv-transfer-config") + 1])  # noqa: E731
    assert kv(d)["kv_role"] == "kv_consumer" and kv(p)["kv_role"] == "kv_producer"
    # vLLM 0.20: decode always; the seed's prefill too, since its TP is 2 (#36687; rule no-async-scheduling)
    assert "--no-async-scheduling" in d["args"] and "--no-async-scheduling" in p["args"]
    gen = by(objs, "Deployment", "nemotron-3-nano-decode")["metadata"]["labels"][contract.LABEL_GENERATION]
    assert env(d)[contract.ENV_PREFILL_SERVICE] == f"nemotron-3-nano-prefill-{gen}.ns1.svc"  # its own generation's
    assert contract.ENV_PREFILL_SERVICE not in env(p)


def test_engine_pod_contract() -> None:
    dep = by(build(seed_doc()), "Deployment", "nemotron-3-nano-prefill")
    c = container(dep)
    assert c["command"] == ["python3", "-m", "hpd_runtime", "launch", "--"]
    assert c["args"][:2] == ["--model", "nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-FP8"]
    assert c["resources"]["limits"]["nvidia.com/gpu"] == 2
    e = env(c)
    assert e[contract.ENV_POD_IP] == {"fieldRef": {"fieldPath": "status.podIP"}}
    assert e[contract.ENV_VLLM_NIXL_SIDE_CHANNEL_HOST] == "$(HPD_POD_IP)"
    assert e[contract.ENV_VLLM_SSM_CONV_STATE_LAYOUT] == "DS"
    assert e[contract.ENV_CACHE_DIR] == contract.CACHE_MOUNT
    # exec probes: their output (the runtime's reason) lands in the pod's Unhealthy Event (hpd_operator.podevents)
    assert c["readinessProbe"]["exec"] == {"command": ["python3", "-m", "hpd_runtime", "probe"]}
    assert c["startupProbe"]["exec"] == c["readinessProbe"]["exec"]
    assert c["livenessProbe"]["httpGet"]["path"] == "/livez"
    sp = c["startupProbe"]
    assert sp["failureThreshold"] * sp["periodSeconds"] >= 900 + MODEL_LOAD_ALLOWANCE_SECONDS
    assert {p["name"]: p["containerPort"] for p in c["ports"]} == {"http": 8000, "runtime": 8081, "nixl-side": 5600}
    assert c["securityContext"] == {
        "privileged": False,
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"], "add": []},
        "runAsNonRoot": True,
        "runAsUser": contract.IMAGE_UID,
        "runAsGroup": contract.IMAGE_UID,
        "seccompProfile": {"type": "RuntimeDefault"},
        "readOnlyRootFilesystem": True,
    }
    assert contract.IMAGE_UID >= 10000  # above any account of the node (checkov CKV_K8S_40)
    pod = dep["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True and pod["securityContext"]["runAsUser"] == contract.IMAGE_UID
    vols = {v["name"]: v for v in pod["volumes"]}
    assert vols["dshm"] == {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "16Gi"}}
    assert pod["automountServiceAccountToken"] is False
    # the seed's 31.6 B FP8 weights (32.4 GiB) + 10% while downloading + 10 GiB compile caches; + /tmp and HOME
    assert vols["cache"] == {"name": "cache", "emptyDir": {"sizeLimit": "46Gi"}}
    assert c["resources"]["requests"] == {"cpu": "4", "memory": "32Gi", "ephemeral-storage": "51Gi"}
    assert dep["spec"]["strategy"]["rollingUpdate"] == {"maxSurge": 0, "maxUnavailable": 1}
    assert dep["spec"]["selector"]["matchLabels"] == {
        contract.LABEL_INSTANCE: "nemotron-3-nano",
        contract.LABEL_COMPONENT: "prefill",
        contract.LABEL_GENERATION: dep["metadata"]["labels"][contract.LABEL_GENERATION],
    }
    assert dep["metadata"]["labels"][contract.LABEL_GENERATION_NUMBER] == "1"
    assert dep["spec"]["template"]["metadata"]["labels"][contract.LABEL_ROLE] == "prefill"


def test_startup_probe_covers_load_and_warmup() -> None:
    assert startup_failure_threshold(900) * 10 >= 900 + MODEL_LOAD_ALLOWANCE_SECONDS
    assert startup_failure_threshold(1) >= 1
    assert startup_failure_threshold(900, 300) * 10 >= 900 + 300 + MODEL_LOAD_ALLOWANCE_SECONDS


def test_startup_probe_allows_for_the_gemm_sweep_only_when_it_runs() -> None:
    def threshold(warmup: dict[str, Any]) -> int:
        doc = seed_doc()
        doc["spec"]["warmup"] = {**doc["spec"].get("warmup", {}), **warmup}
        dep = by(build(doc), "Deployment", short_name("nemotron-3-nano", "prefill"))
        return int(container(dep)["startupProbe"]["failureThreshold"])

    assert threshold({"timeoutSeconds": 900}) == startup_failure_threshold(900, 300)
    assert threshold({"timeoutSeconds": 900, "everyLength": False}) == startup_failure_threshold(900)
    assert threshold({"timeoutSeconds": 60}) == startup_failure_threshold(60, 60)


def test_pvc_model_hf_token_pvc_cache_and_user_pod_settings() -> None:
    doc = seed_doc()
    doc["spec"]["model"]["source"] = {"pvc": {"claimName": "weights", "path": "nano"}}
    doc["spec"]["cache"] = {"type": "pvc", "claimName": "cc"}
    doc["spec"]["decode"]["nodeSelector"] = {"pool": "gpu"}
    doc["spec"]["decode"]["tolerations"] = [{"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}]
    doc["spec"]["decode"]["resources"] = {"limits": {"memory": "64Gi"}}
    doc["spec"]["decode"]["podTemplate"] = {
        "metadata": {"annotations": {"a": "b"}, "labels": {contract.LABEL_INSTANCE: "hijack", "x": "y"}},
        "spec": {"priorityClassName": "high", "containers": [{"name": "vllm", "imagePullPolicy": "Always"}]},
    }
    dep = by(build(doc), "Deployment", "nemotron-3-nano-decode")
    pod = dep["spec"]["template"]["spec"]
    c = pod["containers"][0]
    vols = {v["name"]: v for v in pod["volumes"]}
    assert vols["model"]["persistentVolumeClaim"] == {"claimName": "weights", "readOnly": True}
    assert {"name": "model", "mountPath": "/models", "readOnly": True} in c["volumeMounts"]
    assert vols["cache"]["persistentVolumeClaim"] == {"claimName": "cc"}
    assert c["args"][1] == "/models/nano"
    assert pod["nodeSelector"] == {"pool": "gpu"} and pod["tolerations"][0]["key"] == "gpu"
    assert c["resources"]["limits"] == {"memory": "64Gi", "nvidia.com/gpu": 2}
    # a memory limit implies its request: no default on top; the cache is a PVC: only /tmp and HOME on the node
    assert c["resources"]["requests"] == {"cpu": "4", "ephemeral-storage": "5Gi"}
    assert pod["priorityClassName"] == "high" and c["imagePullPolicy"] == "Always"
    assert c["args"] and c["env"]  # merge by name kept our container
    md = dep["spec"]["template"]["metadata"]
    assert md["annotations"] == {"a": "b"}
    assert md["labels"][contract.LABEL_INSTANCE] == "nemotron-3-nano" and md["labels"]["x"] == "y"

    doc = seed_doc()
    doc["spec"]["model"]["source"] = {"huggingface": {"tokenSecretRef": {"name": "hf"}}}
    c = container(by(build(doc), "Deployment", "nemotron-3-nano-prefill"))
    assert env(c)["HF_TOKEN"] == {"secretKeyRef": {"name": "hf", "key": "token"}}


def test_router_runs_nixl_pd_with_kubernetes_discovery() -> None:
    objs = build(seed_doc())
    dep = by(objs, "Deployment", "nemotron-3-nano-router")
    c = container(dep)
    a = c["args"]
    assert c["command"] == ["vllm-router"]
    assert "--vllm-pd-disaggregation" in a and "--service-discovery" in a
    assert a[a.index("--kv-connector") + 1] == "nixl"
    assert a[a.index("--service-discovery-port") + 1] == "8000"
    assert a[a.index("--service-discovery-namespace") + 1] == "ns1"
    gen = dep["metadata"]["labels"][contract.LABEL_GENERATION]
    i = a.index("--decode-selector")
    assert a[i + 1 : i + 4] == [
        "app.kubernetes.io/instance=nemotron-3-nano",
        "app.kubernetes.io/component=decode",
        f"hybridpd.io/generation={gen}",
    ]
    assert a[a.index("--prometheus-host") + 1] == "0.0.0.0"
    assert a[a.index("--host") + 1] == "0.0.0.0"
    assert dep["spec"]["template"]["spec"]["serviceAccountName"] == "nemotron-3-nano-router"
    role = by(objs, "Role", "nemotron-3-nano-router")
    assert role["rules"] == [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]}]
    rb = by(objs, "RoleBinding", "nemotron-3-nano-router")
    assert rb["subjects"] == [{"kind": "ServiceAccount", "name": "nemotron-3-nano-router", "namespace": "ns1"}]
    svc = by(objs, "Service", "nemotron-3-nano")
    assert svc["spec"]["type"] == "ClusterIP" and svc["spec"]["ports"][0]["port"] == 8000


def containers(dep: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["name"]: c for c in dep["spec"]["template"]["spec"]["containers"]}


def ports(c: dict[str, Any]) -> dict[str, int]:
    return {p["name"]: p["containerPort"] for p in c["ports"]}


def test_the_router_pod_in_pd_mode_has_the_retry_proxy_on_the_endpoint_port_and_the_router_behind_it() -> None:
    dep = by(build(seed_doc()), "Deployment", "nemotron-3-nano-router")
    cs = containers(dep)
    assert list(cs) == ["router", "retry"]  # the router first: the rollout reads its discovery args
    router, retry = cs["router"], cs["retry"]
    assert router["args"][router["args"].index("--port") + 1] == str(contract.ROUTER_BACKEND_PORT)
    assert ports(router) == {"router-http": contract.ROUTER_BACKEND_PORT, "metrics": contract.ROUTER_METRICS_PORT}
    assert router["readinessProbe"]["httpGet"] == {"path": "/readiness", "port": "router-http"}
    assert router["livenessProbe"]["httpGet"] == {"path": "/liveness", "port": "router-http"}
    # the Service's targetPort `http` is the proxy's; HAProxy under dumb-init (SIGTERM -> SIGUSR1: graceful stop)
    assert ports(retry) == {"http": contract.ROUTER_PORT}
    assert by(build(seed_doc()), "Service", "nemotron-3-nano")["spec"]["ports"][0]["targetPort"] == "http"
    assert retry["command"] == ["dumb-init", "--rewrite", "15:10", "haproxy", "-db", "-f", "/etc/hpd/retry.cfg"]
    assert retry["image"] == router["image"]
    assert env(retry) == {
        "HPD_RETRY_PORT": "8090", "HPD_ROUTER_PORT": "8091", "HPD_RETRY_HOLD_PORT": "8092", "HPD_RETRIES": "3"
    }  # fmt: skip
    assert retry["readinessProbe"]["httpGet"] == {"path": contract.PATH_RETRY_HEALTH, "port": "http"}
    assert retry["securityContext"]["readOnlyRootFilesystem"] is True
    assert retry["lifecycle"] == router["lifecycle"]  # both leave the endpoints before they stop listening
    assert retry["resources"] == {"requests": {"cpu": "100m", "memory": "64Mi"}, "limits": {"memory": "1Gi"}}

    doc = seed_doc()
    doc["spec"]["router"]["retries"] = 5
    assert env(containers(by(build(doc), "Deployment", "nemotron-3-nano-router"))["retry"])["HPD_RETRIES"] == "5"


@pytest.mark.parametrize(
    "spec",
    [{"router": {"retries": 0}}, {"kvTransfer": {"processNamespace": "Pair"}}],
    ids=["retries 0", "pair pods"],
)
def test_without_the_retry_proxy_the_router_serves_the_endpoint_port_itself(spec: dict[str, Any]) -> None:
    doc = seed_doc()
    for key, value in spec.items():
        doc["spec"].setdefault(key, {}).update(value)
    cs = containers(by(build(doc), "Deployment", "nemotron-3-nano-router"))
    assert list(cs) == ["router"]
    router = cs["router"]
    assert router["args"][router["args"].index("--port") + 1] == str(contract.ROUTER_PORT)
    assert ports(router)["http"] == contract.ROUTER_PORT
    assert router["readinessProbe"]["httpGet"] == {"path": "/readiness", "port": "http"}


def test_the_retry_proxys_config_reads_exactly_the_environment_the_operator_renders() -> None:
    cfg = (REPO / "images/router/retry.cfg").read_text()
    used = set(re.findall(r"\$\{(\w+)\}", cfg))
    rendered = set(env(containers(by(build(seed_doc()), "Deployment", "nemotron-3-nano-router"))["retry"]))
    assert used == rendered == {
        contract.ENV_RETRY_PORT, contract.ENV_RETRY_ROUTER_PORT, contract.ENV_RETRY_HOLD_PORT, contract.ENV_RETRIES
    }  # fmt: skip
    assert f"monitor-uri {contract.PATH_RETRY_HEALTH}" in cfg
    assert 'bind 127.0.0.1:"${HPD_RETRY_HOLD_PORT}"' in cfg  # the hold is the pod's own, never a client's
    # the router's failures are retried; a 503 (no worker of a role: degraded mode's switch serves the client's next
    # request elsewhere) and a 504 (the router's own request timeout) never are
    [retry_on] = [line.split()[1:] for line in cfg.splitlines() if line.strip().startswith("retry-on")]
    assert "500" in retry_on and "conn-failure" in retry_on
    assert "503" not in retry_on and "504" not in retry_on


def test_engines_run_read_only_with_emptydirs_where_they_write() -> None:
    pod = by(build(seed_doc()), "Deployment", "nemotron-3-nano-decode")["spec"]["template"]["spec"]
    c = pod["containers"][0]
    assert c["securityContext"]["readOnlyRootFilesystem"] is True
    mounts = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}
    assert mounts == {"/dev/shm": "dshm", "/cache": "cache", "/tmp": "tmp", "/home/hpd": "home"}
    vols = {v["name"]: v for v in pod["volumes"]}
    assert vols["tmp"]["emptyDir"] == {"sizeLimit": "4Gi"} and vols["home"]["emptyDir"] == {"sizeLimit": "1Gi"}
    # every emptyDir on the node's disk is bounded (the memory-backed /dev/shm too)
    assert all("sizeLimit" in v["emptyDir"] for v in pod["volumes"] if "emptyDir" in v)


@pytest.mark.parametrize(
    ("model", "cache", "size_limit", "ephemeral"),
    [
        ("nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-BF16", {}, "75Gi", "80Gi"),  # 59 GiB x 1.1 + 10
        ("nvidia/Nemotron-H-8B-Base-8K", {}, "27Gi", "32Gi"),  # 15 GiB x 1.1 + 10
        ("someone/unknown-model", {}, "110Gi", "115Gi"),  # size unknown: 100 GiB + 10
        ("nvidia/Nemotron-H-8B-Base-8K", {"sizeLimit": "300Gi"}, "300Gi", "305Gi"),  # the user's bound wins
    ],
)
def test_cache_size_limit_and_ephemeral_storage_follow_the_models_size(
    model: str, cache: dict[str, Any], size_limit: str, ephemeral: str
) -> None:
    doc = seed_doc()
    doc["spec"]["model"] = {"name": model, "hybrid": "mamba2"}
    doc["spec"]["cache"] = cache
    c_pod = by(build(doc), "Deployment", "nemotron-3-nano-prefill")["spec"]["template"]["spec"]
    vols = {v["name"]: v for v in c_pod["volumes"]}
    assert vols["cache"]["emptyDir"] == {"sizeLimit": size_limit}
    assert c_pod["containers"][0]["resources"]["requests"]["ephemeral-storage"] == ephemeral


def test_a_pvc_model_source_leaves_only_compile_caches_on_the_node_and_status_says_where_weights_are() -> None:
    doc = seed_doc()
    doc["spec"]["model"]["source"] = {"pvc": {"claimName": "weights", "path": "nano"}}
    cr = cr_from(doc)
    profile = compute_profile(validate(cr))
    pod = by(build_all(cr, profile), "Deployment", "nemotron-3-nano-prefill")["spec"]["template"]["spec"]
    vols = {v["name"]: v for v in pod["volumes"]}
    assert vols["cache"]["emptyDir"] == {"sizeLimit": "10Gi"}
    assert pod["containers"][0]["resources"]["requests"]["ephemeral-storage"] == "15Gi"
    injected = {i["setting"]: i for i in profile.status()["injections"] if i["role"] == "prefill"}
    assert injected["weights"]["value"] == "/models/nano" and "PVC weights" in injected["weights"]["reason"]
    seed = {i["setting"]: i for i in compute_profile(validate(cr_from(seed_doc()))).status()["injections"]}
    assert seed["weights"]["value"] == "/cache/huggingface" and "emptyDir" in seed["weights"]["reason"]
    assert seed["volumes[cache].emptyDir.sizeLimit"]["value"] == "46Gi"


def test_a_user_ephemeral_storage_wins_over_the_default() -> None:
    doc = seed_doc()
    doc["spec"]["prefill"]["resources"] = {"requests": {"ephemeral-storage": "500Gi"}}
    c = container(by(build(doc), "Deployment", "nemotron-3-nano-prefill"))
    assert c["resources"]["requests"]["ephemeral-storage"] == "500Gi"
    doc["spec"]["prefill"]["resources"] = {"limits": {"ephemeral-storage": "80Gi"}}
    c = container(by(build(doc), "Deployment", "nemotron-3-nano-prefill"))
    assert "ephemeral-storage" not in c["resources"]["requests"]  # a limit alone implies the same request


def test_router_is_burstable_by_default_and_the_users_resources_replace_a_default_per_resource() -> None:
    c = container(by(build(seed_doc()), "Deployment", "nemotron-3-nano-router"))
    assert c["resources"] == {"requests": {"cpu": "250m", "memory": "128Mi"}, "limits": {"memory": "512Mi"}}
    doc = seed_doc()
    doc["spec"]["router"]["resources"] = {"requests": {"memory": "1Gi"}}
    c = container(by(build(doc), "Deployment", "nemotron-3-nano-router"))
    # the user's memory request: no default memory limit below it; the cpu default stays
    assert c["resources"] == {"requests": {"memory": "1Gi", "cpu": "250m"}, "limits": {}}


def test_router_pdb_only_with_two_or_more_router_replicas() -> None:
    assert not [
        o for o in build(seed_doc()) if o["kind"] == "PodDisruptionBudget" and "router" in o["metadata"]["name"]
    ]
    doc = seed_doc()
    doc["spec"]["router"]["replicas"] = 2
    pdb = by(build(doc), "PodDisruptionBudget", "nemotron-3-nano-router")
    dep = by(build(doc), "Deployment", "nemotron-3-nano-router")
    assert pdb["spec"] == {"maxUnavailable": 1, "selector": dep["spec"]["selector"]}
    assert pdb["metadata"]["namespace"] == "ns1"


def test_headless_services_list_only_ready_pods() -> None:
    svc = by(build(seed_doc()), "Service", "nemotron-3-nano-decode")
    assert svc["spec"]["clusterIP"] == "None" and svc["spec"]["publishNotReadyAddresses"] is False


def test_pdb_only_with_two_or_more_replicas_and_podmonitors_when_asked() -> None:
    doc = seed_doc()
    assert not [o for o in build(doc) if o["kind"] in ("PodDisruptionBudget", "PodMonitor")]
    doc["spec"]["decode"]["replicas"] = 2
    doc["spec"]["monitoring"] = {"podMonitor": True}
    objs = build(doc)
    assert by(objs, "PodDisruptionBudget", "nemotron-3-nano-decode")["spec"]["maxUnavailable"] == 1
    assert {o["metadata"]["name"] for o in objs if o["kind"] == "PodMonitor"} == {
        "nemotron-3-nano-engines",
        "nemotron-3-nano-router",
    }


def test_long_names_are_truncated_with_a_hash() -> None:
    long = "x" * 80
    a, b = short_name(long, "prefill"), short_name(long + "y", "prefill")
    assert len(a) <= 63 and a.endswith("-prefill") and a != b
    assert short_name("short", "decode") == "short-decode"
    doc = seed_doc()
    doc["metadata"]["name"] = "n" * 100
    for o in build(doc):
        assert len(o["metadata"]["name"]) <= 63
        assert all(len(v) <= 63 for v in o["metadata"]["labels"].values())


def test_builders_are_pure() -> None:
    """No kopf, no kubernetes client, no clock, no env reads under builders/."""
    for path in (REPO / "operator" / "hpd_operator" / "builders").glob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Import | ast.ImportFrom):
                mods = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
                for m in mods:
                    assert m.split(".")[0] not in {"kopf", "kubernetes", "os", "time", "datetime"}, (path, m)


def test_user_env_value_from_is_passed_through_as_written() -> None:
    doc = seed_doc()
    sources = {
        "S": {"secretKeyRef": {"name": "creds", "key": "token", "optional": True}},
        "C": {"configMapKeyRef": {"name": "cfg", "key": "k"}},
        "R": {"resourceFieldRef": {"containerName": "vllm", "resource": "limits.memory", "divisor": "1Mi"}},
        "F": {"fieldRef": {"fieldPath": "metadata.name"}},
    }
    doc["spec"]["env"] = [{"name": k, "valueFrom": v} for k, v in sources.items()] + [
        {"name": "E", "value": "\U0001f680"}
    ]
    e = env(container(by(build(doc), "Deployment", "nemotron-3-nano-decode")))
    assert {k: e[k] for k in sources} == sources
    assert e["E"] == "\U0001f680"


def test_every_generated_pod_is_pss_restricted_and_only_router_and_decode_get_a_token() -> None:
    objs = build(seed_doc())
    for d in (o for o in objs if o["kind"] == "Deployment"):
        pod = d["spec"]["template"]["spec"]
        assert pod["securityContext"]["runAsNonRoot"] is True
        assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
        for c in pod["containers"]:
            assert c["securityContext"]["allowPrivilegeEscalation"] is False
            assert c["securityContext"]["capabilities"] == {"drop": ["ALL"], "add": []}
            assert c["securityContext"]["privileged"] is False
        assert all(set(v) - {"name"} <= {"emptyDir", "persistentVolumeClaim"} for v in pod.get("volumes", []))
        # written out (not left to the defaults) so the operator owns them and reverts a hand edit (drift.py)
        assert (pod["hostNetwork"], pod["hostPID"], pod["hostIPC"]) == (False, False, False)
        comp = d["metadata"]["labels"][contract.LABEL_COMPONENT]
        assert pod["automountServiceAccountToken"] is (comp in ("router", "decode")), comp
        if comp == "decode":  # the pair check's KV path report: a ServiceAccount that may only create Events
            assert pod["serviceAccountName"] == "nemotron-3-nano-kv-reporter"
        elif comp == "prefill":
            assert "serviceAccountName" not in pod


def test_the_decode_reporter_may_only_patch_its_lease_and_create_events_and_exists_only_with_the_pair_check() -> None:
    objs = {(o["kind"], o["metadata"]["name"]): o for o in build(seed_doc())}
    role = objs[("Role", "nemotron-3-nano-kv-reporter")]
    assert role["rules"] == [
        {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "resourceNames": ["nemotron-3-nano-kv-reporter"],
         "verbs": ["get", "patch"]},
        {"apiGroups": [""], "resources": ["events"], "verbs": ["create"]},
    ]  # fmt: skip
    lease = objs[("Lease", "nemotron-3-nano-kv-reporter")]  # the decode pods' annotations stay theirs
    assert "spec" not in lease and set(lease["metadata"].get("annotations") or {}) <= {contract.ANNOTATION_DESIRED_HASH}
    decode = next(o for o in objs.values() if o["kind"] == "Deployment" and "-decode-" in o["metadata"]["name"])
    env = {e["name"]: e.get("value") for e in decode["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env[contract.ENV_KV_REPORT_LEASE] == "nemotron-3-nano-kv-reporter"
    kinds = [o["kind"] for o in build(seed_doc())]  # ServiceAccounts and RBAC are applied before the workloads
    assert max(kinds.index(k) for k in ("ServiceAccount", "Role", "RoleBinding", "Lease")) < kinds.index("Deployment")
    binding = objs[("RoleBinding", "nemotron-3-nano-kv-reporter")]
    assert binding["subjects"][0]["name"] == "nemotron-3-nano-kv-reporter"
    assert ("ServiceAccount", "nemotron-3-nano-kv-reporter") in objs
    decode = next(o for o in objs.values() if o["kind"] == "Deployment" and "-decode-" in o["metadata"]["name"])
    env = {e["name"]: e for e in decode["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env[contract.ENV_POD_NAME]["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    assert env[contract.ENV_POD_UID]["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.uid"}}

    doc = seed_doc()
    doc["spec"]["warmup"] = {"pairCheck": False}
    objs = {(o["kind"], o["metadata"]["name"]): o for o in build(doc)}
    assert not [k for k in objs if k[1].endswith("-kv-reporter")]
    decode = next(o for o in objs.values() if o["kind"] == "Deployment" and "-decode-" in o["metadata"]["name"])
    assert decode["spec"]["template"]["spec"]["automountServiceAccountToken"] is False


@pytest.mark.parametrize("enabled", [True, False])
@pytest.mark.parametrize("pair_check", [True, False])
@pytest.mark.parametrize("canary", [0, 120])
def test_every_warmup_combination_renders_one_pair_check_decision(enabled: bool, pair_check: bool, canary: int) -> None:
    """The pair check runs only with warmup on and pairCheck on (api.paircheck.pair_check); the decode's env, its
    identity and token, its --enable-prompt-tokens-details, the kv-reporter objects and status' DataPathVerified all
    follow that one decision, and prefill never runs it (a CR with warmup off used to render
    HPD_WARMUP_PAIR_CHECK=true and the canary without the token)."""
    from hpd_operator.status import Observation, compute_status

    doc = seed_doc()
    doc["spec"]["warmup"] = {"enabled": enabled, "pairCheck": pair_check, "canarySeconds": canary}
    on = enabled and pair_check
    objs = build(doc)
    decode = next(o for o in objs if o["kind"] == "Deployment" and "-decode-" in o["metadata"]["name"])
    pod = decode["spec"]["template"]["spec"]
    e = env(pod["containers"][0])
    assert e[contract.ENV_WARMUP_PAIR_CHECK] == str(on).lower()
    assert e[contract.ENV_CANARY_SECONDS] == str(canary if on else 0)
    assert (contract.ENV_POD_NAME in e, contract.ENV_KV_REPORT_LEASE in e) == (on, on)
    assert pod["automountServiceAccountToken"] is on and ("serviceAccountName" in pod) is on
    assert bool([o for o in objs if o["metadata"]["name"].endswith("-kv-reporter")]) is on
    assert ("--enable-prompt-tokens-details" in pod["containers"][0]["args"]) is on
    prefill = next(o for o in objs if o["kind"] == "Deployment" and "-prefill-" in o["metadata"]["name"])
    pe = env(prefill["spec"]["template"]["spec"]["containers"][0])
    assert pe[contract.ENV_WARMUP_PAIR_CHECK] == "false" and contract.ENV_CANARY_SECONDS not in pe
    assert prefill["spec"]["template"]["spec"]["automountServiceAccountToken"] is False
    cr = cr_from(doc)
    st = compute_status(Observation(name="x", namespace="ns1", spec=cr.spec, observed={}, generation=1))
    path = next(c for c in st["conditions"] if c["type"] == "DataPathVerified")
    assert (path["reason"] == "PairCheckDisabled") is not on, path
    shown = {
        i["setting"]: i["value"] for i in compute_profile(validate(cr)).status()["injections"] if i["role"] == "decode"
    }
    assert shown[contract.ENV_WARMUP_PAIR_CHECK] == str(on).lower()  # status.profile says what the env says
    assert shown[contract.ENV_CANARY_SECONDS] == str(canary if on else 0)
    assert (contract.ENV_POD_UID in shown) is on


def test_network_policies_admit_only_router_peers_and_prometheus() -> None:
    n = "nemotron-3-nano"
    objs = build(seed_doc())
    eng = by(objs, "NetworkPolicy", f"{n}-engines")["spec"]
    assert eng["podSelector"]["matchLabels"] == {contract.LABEL_INSTANCE: n}
    assert eng["podSelector"]["matchExpressions"][0]["values"] == ["prefill", "decode"]
    assert eng["policyTypes"] == ["Ingress"]
    router_rule, peer_rule, prom_rule = eng["ingress"]
    assert router_rule["from"] == [
        {"podSelector": {"matchLabels": {contract.LABEL_INSTANCE: n, contract.LABEL_COMPONENT: "router"}}}
    ]
    assert router_rule["ports"] == [{"protocol": "TCP", "port": "http"}]
    assert peer_rule == {"from": [{"podSelector": eng["podSelector"]}]} and "ports" not in peer_rule  # UCX: any port
    assert prom_rule["from"] == [
        {"namespaceSelector": {}, "podSelector": {"matchLabels": {"app.kubernetes.io/name": "prometheus"}}}
    ]
    assert [p["port"] for p in prom_rule["ports"]] == ["runtime"]  # never vLLM's API port (it serves completions)
    rt = by(objs, "NetworkPolicy", f"{n}-router")["spec"]
    assert rt["ingress"][0] == {"ports": [{"protocol": "TCP", "port": "http"}]}
    assert rt["ingress"][1]["ports"] == [{"protocol": "TCP", "port": "metrics"}]

    doc = seed_doc()
    doc["spec"]["networkPolicy"] = {
        "restrictEgress": True,
        "prometheus": {"namespaceSelector": {"matchLabels": {"team": "mon"}}, "podSelector": {}},
    }
    eng = by(build(doc), "NetworkPolicy", f"{n}-engines")["spec"]
    assert eng["policyTypes"] == ["Ingress", "Egress"]
    dns, peers, https = eng["egress"]
    assert {(p["protocol"], p["port"]) for p in dns["ports"]} == {("UDP", 53), ("TCP", 53)}
    assert peers == {"to": [{"podSelector": eng["podSelector"]}]}
    assert https == {"ports": [{"protocol": "TCP", "port": 443}]}
    assert eng["ingress"][2]["from"] == [{"namespaceSelector": {"matchLabels": {"team": "mon"}}, "podSelector": {}}]

    doc["spec"]["networkPolicy"] = {"enabled": False}
    assert not [o for o in build(doc) if o["kind"] == "NetworkPolicy"]


def test_the_rdma_fabric_gives_each_engine_its_devices_ipc_lock_and_decode_its_floor() -> None:
    doc = seed_doc()
    doc["spec"]["kvTransfer"] = {"fabric": "rdma", "rdma": {"resourceName": "rdma/ib", "count": 2}}
    for role in ("prefill", "decode"):
        ct = container(by(build(doc), "Deployment", f"nemotron-3-nano-{role}"))
        assert ct["resources"]["limits"]["rdma/ib"] == 2
        assert ct["securityContext"]["capabilities"] == {"drop": ["ALL"], "add": ["IPC_LOCK"]}
        e = env(ct)
        assert e["HPD_KV_FABRIC"] == "rdma" and e["UCX_CUDA_IPC_ENABLE_GET_ZCOPY"] == "y"
        assert ("HPD_KV_FLOOR_BYTES_PER_SECOND" in e) == (role == "decode")
    assert env(container(by(build(doc), "Deployment", "nemotron-3-nano-decode")))["HPD_KV_FLOOR_BYTES_PER_SECOND"] == (
        "5000000000"
    )
    tcp = container(by(build(seed_doc()), "Deployment", "nemotron-3-nano-decode"))
    assert "rdma/ib" not in tcp["resources"]["limits"] and tcp["securityContext"]["capabilities"]["add"] == []
    assert "HPD_KV_FLOOR_BYTES_PER_SECOND" not in env(tcp) and env(tcp)["HPD_CANARY_SECONDS"] == "300"


def test_status_names_an_image_that_is_not_pinned_by_digest() -> None:
    def injected(doc: dict[str, Any]) -> dict[str, dict[str, Any]]:
        return {i["setting"]: i for i in compute_profile(validate(cr_from(doc))).status()["injections"]}

    seed = injected(seed_doc())  # tags: allowed, and named
    assert "NOT pinned" in seed["image"]["reason"] and "NOT pinned" in seed["router.image"]["reason"]
    doc = seed_doc()
    digest = "sha256:" + "0" * 64
    doc["spec"]["image"] = f"registry.example.com/vllm-runtime@{digest}"
    doc["spec"]["router"]["image"] = f"registry.example.com/vllm-router:0.1.17@{digest}"
    pinned = injected(doc)
    assert pinned["image"]["reason"] == pinned["router.image"]["reason"] == "pinned by digest"


def test_a_digest_for_the_crs_version_pins_the_operators_default_vllm_image() -> None:
    from hpd_operator.__main__ import _digest
    from hpd_operator.api.parse import parse_cr

    digest = "sha256:" + "ab" * 32
    doc = seed_doc()
    doc["spec"].pop("image", None)  # the operator's default image, ghcr.io/hybridpd/vllm-runtime:{version}
    pinned = parse_cr(doc, vllm_digests={doc["spec"]["vllmVersion"]: digest})
    assert pinned.spec.image == f"ghcr.io/hybridpd/vllm-runtime:{doc['spec']['vllmVersion']}@{digest}"
    reasons = {i["setting"]: i["reason"] for i in compute_profile(validate(pinned)).status()["injections"]}
    assert reasons["image"] == "pinned by digest"
    other = parse_cr(doc, vllm_digests={"0.99.0": digest})  # no digest for this version: the tag, named unpinned
    assert "@" not in other.spec.image
    doc["spec"]["image"] = "registry.example.com/mine:1"  # the CR's own image is never changed
    assert parse_cr(doc, vllm_digests={doc["spec"]["vllmVersion"]: digest}).spec.image == "registry.example.com/mine:1"
    assert _digest(f"0.20.0={digest}") == ("0.20.0", digest)
    with pytest.raises(Exception, match="expected VERSION=sha256"):
        _digest("0.20.0=sha256:abc")
