"""Hostile and careless input against the operator on the local control plane (issue #13's sweep).

Creates one healthy `sentinel` CR, then every crafted CR below in the same namespace, with the operator running
(default resync interval). For each CR the apiserver accepts, it records how long until the CR either reaches its
children (its three Deployments exist and are owned by it) or shows a failure condition (Ready=False with a
failure reason at the current generation); then it holds for a while and counts Events per CR (an Event storm =
more than one Warning Event object, or a Warning count above 1, for one CR that did not change), checks that no
child is owned by two CRs or taken from its owner, and that the sentinel stayed Ready and still gets its drift
corrected. Writes JSON with the command line.

    python bench/containment/sweep.py [--cluster NAME] [--out bench/results/<date>-containment-sweep.json]

Without --cluster it starts its own local control plane (16 fake GPU nodes) and stops it at the end.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import datetime
import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client, config

from hpd_devcluster import cluster, lifecycle
from hpd_operator.conditions import FAILURE_REASONS
from hpd_runtime import contract

REPO = Path(__file__).resolve().parents[2]
CRD = REPO / "crds" / "hybridpddeployments.hybridpd.io.yaml"
SEED = REPO / "examples" / "nemotron-3-nano.yaml"
G, V, P = contract.GROUP, contract.VERSION, contract.PLURAL
DEADLINE = 15.0
"""The issue's target: every accepted spec settled within this many seconds of its creation."""
GIVE_UP = 240.0
"""Waited this long for the outcome of a slower one (so 'slow' and 'never' are told apart)."""
HOLD = 30.0
FAILURES = {str(r) for r in FAILURE_REASONS}

Case = tuple[str, Callable[[dict[str, Any]], None]]


def _set(path: str, value: Any) -> Callable[[dict[str, Any]], None]:
    def mutate(doc: dict[str, Any]) -> None:
        node = doc["spec"]
        keys = path.split(".")
        for k in keys[:-1]:
            node = node.setdefault(k, {})
        node[keys[-1]] = value

    return mutate


def _none(doc: dict[str, Any]) -> None:
    return None


CASES: list[Case] = [
    ("baseline", _none),
    ("dot.name", _none),
    ("1digit", _none),
    ("x" * 63, _none),
    ("y" * 120, _none),
    ("side-8000", _set("kvTransfer.sideChannelPort", 8000)),
    ("side-8081", _set("kvTransfer.sideChannelPort", 8081)),
    ("cpu-abc", _set("decode.resources", {"requests": {"cpu": "abc"}})),
    ("mem-negative", _set("decode.resources", {"limits": {"memory": "-1Gi"}})),
    ("gpu-9999", _set("decode.resources", {"limits": {"nvidia.com/gpu": 9999}})),
    ("gpu1-tp4", lambda d: (_set("prefill.tensorParallelSize", 4)(d), _set("prefill.resources", {"limits": {"nvidia.com/gpu": 1}})(d))),
    ("affinity-str", _set("decode.affinity", {"nodeAffinity": "oops"})),
    ("affinity-deep", _set("decode.affinity", {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": "x"}})),
    ("tpl-labels-str", _set("decode.podTemplate", {"metadata": {"labels": "oops"}})),
    ("tpl-containers-str", _set("decode.podTemplate", {"spec": {"containers": "x"}})),
    ("tpl-sidecar-noimage", _set("decode.podTemplate", {"spec": {"containers": [{"name": "side"}]}})),
    ("tpl-args", _set("decode.podTemplate", {"spec": {"containers": [{"name": "vllm", "args": ["--tensor-parallel", "2"]}]}})),
    ("tpl-hostnetwork", _set("decode.podTemplate", {"spec": {"hostNetwork": True}})),
    ("tpl-privileged", _set("decode.podTemplate", {"spec": {"containers": [{"name": "vllm", "securityContext": {"privileged": True}}]}})),
    # issue #32 item 3: a token, a security profile or a node-critical priority chosen through podTemplate (refused),
    # and Secret-bearing volumes (accepted here, where the sweep creates CRs as an admin: the chart's
    # admission.checkSecretReferences policy refuses them to an author who may not read the Secret,
    # tests/chart/test_admission_policies.py)
    ("tpl-projected-token", _set("decode.podTemplate", {"spec": {"volumes": [{"name": "t", "projected": {"sources": [{"serviceAccountToken": {"path": "token"}}]}}]}})),
    ("tpl-apparmor-unconfined", _set("decode.podTemplate", {"metadata": {"annotations": {"container.apparmor.security.beta.kubernetes.io/vllm": "unconfined"}}})),
    ("tpl-seccomp-annotation", _set("decode.podTemplate", {"metadata": {"annotations": {"seccomp.security.alpha.kubernetes.io/pod": "unconfined"}}})),
    ("tpl-priority-node-critical", _set("decode.podTemplate", {"spec": {"priorityClassName": "system-node-critical"}})),
    ("tpl-priority-cluster-critical", _set("prefill.podTemplate", {"spec": {"priorityClassName": "system-cluster-critical"}})),
    ("tpl-secret-volume", _set("decode.podTemplate", {"spec": {"volumes": [{"name": "s", "secret": {"secretName": "other-team", "optional": True}}]}})),
    ("tpl-projected-secret", _set("decode.podTemplate", {"spec": {"volumes": [{"name": "s", "projected": {"sources": [{"secret": {"name": "other-team", "optional": True}}]}}]}})),
    ("tpl-csi-secret", _set("decode.podTemplate", {"spec": {"volumes": [{"name": "s", "csi": {"driver": "secrets-store.csi.k8s.io", "nodePublishSecretRef": {"name": "other-team"}}}]}})),
    ("tolerations-bad-op", _set("decode.tolerations", [{"key": "a", "operator": "Bogus"}])),
    ("nodeselector-bad-key", _set("decode.nodeSelector", {"bad key!": "x"})),
    ("nodeselector-nowhere", _set("decode.nodeSelector", {"example.com/none": "x"})),
    ("env-secret-nokey", _set("env", [{"name": "S", "valueFrom": {"secretKeyRef": {"name": "s"}}}])),
    ("env-bogus-ref", _set("env", [{"name": "S", "valueFrom": {"bogusRef": {}}}])),
    ("env-secret-ok", _set("env", [{"name": "S", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k", "optional": True}}}])),
    ("env-emoji", _set("env", [{"name": "E", "value": "\U0001f680 \U0001d518"}])),
    ("env-bad-name", _set("env", [{"name": "1 bad"}])),
    ("maxlen-huge", _set("model.maxModelLen", 16777216)),
    ("gmu-tiny", _set("gpuMemoryUtilization", 0.0001)),
    ("args-abbrev-tp", _set("extraArgs", ["--tensor-parallel", "2"])),
    ("args-unknown", _set("extraArgs", ["--no-such-flag"])),
    ("args-abbrev-port", _set("extraArgs", ["--por", "9000"])),
    # issue #32 item 5 and #26: typed values vLLM's parser would refuse, the multi-node launch flags, a spec too
    # large to store a status beside it, impossible fabric / UCX combinations
    ("args-typed-emoji", _set("extraArgs", ["--max-num-seqs", "\U0001f680"])),
    ("args-choice", _set("decode.extraArgs", ["--kv-cache-dtype=fp9"])),
    ("args-headless", _set("extraArgs", ["--headless"])),
    ("args-nnodes", _set("prefill.extraArgs", ["--nnodes", "2"])),
    ("env-1.5mb", _set("env", [{"name": f"E{i}", "value": "x" * 24_000} for i in range(64)])),
    ("rdma-no-devices", _set("kvTransfer", {"fabric": "rdma"})),
    ("rdma-devices-tcp", _set("kvTransfer", {"rdma": {"resourceName": "rdma/ib"}})),
    ("ucx-no-am", _set("kvTransfer", {"ucx": {"tls": "cuda_copy,cuda_ipc"}})),
    ("rdma-tcp-only-tls", _set("kvTransfer", {"fabric": "rdma", "rdma": {"resourceName": "rdma/ib"}, "ucx": {"tls": "tcp,cuda_copy"}})),
    ("rdma-ok", _set("kvTransfer", {"fabric": "rdma", "rdma": {"resourceName": "rdma/ib"}})),
    ("image-space", _set("image", " bad image")),
    ("cache-pvc-missing", _set("cache", {"type": "pvc", "claimName": "nope"})),
    ("cache-size-lots", _set("cache", {"sizeLimit": "lots"})),
    ("router-zero", _set("router.replicas", 0)),
    ("decode-zero", _set("decode.replicas", 0)),
    ("router-nodeport", _set("router.service", {"type": "NodePort", "port": 8000})),
    ("podmonitor", _set("monitoring", {"podMonitor": True})),
    ("np-bad-selector", _set("networkPolicy", {"prometheus": {"podSelector": {"matchLabels": {"bad key!": "x"}}}})),
    ("np-bad-operator", _set("networkPolicy", {"prometheus": {"podSelector": {"matchExpressions": [{"key": "a", "operator": "Bogus"}]}}})),
    ("col", _none),
    ("col-prefill", _none),
]  # fmt: skip


def base(name: str) -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load(SEED.read_text())
    doc["metadata"] = {"name": name}
    doc["spec"]["prefill"]["tensorParallelSize"] = 1
    doc["spec"]["decode"]["tensorParallelSize"] = 1
    return doc


@contextlib.contextmanager
def control_plane(name: str | None) -> Iterator[cluster.ClusterState]:
    if name:
        state = cluster.ClusterState.load(name)
        if state is None or not cluster.healthy(state):
            sys.exit(f"cluster {name!r} is not running: python -m hpd_devcluster --name {name} up --nodes 16")
        yield state
        return
    with lifecycle.running(f"sweep-{os.getpid()}", cluster.NodePool(count=16)) as state:
        yield state


def cond(cr: dict[str, Any], ctype: str) -> dict[str, Any]:
    return next((c for c in (cr.get("status") or {}).get("conditions") or [] if c["type"] == ctype), {})


def outcome(cr: dict[str, Any], deps: list[str]) -> str | None:
    ready = cond(cr, "Ready")
    current = (cr.get("status") or {}).get("observedGeneration") == cr["metadata"]["generation"]
    if current and ready.get("reason") in FAILURES:
        return "reported"
    if len(deps) == 3 and current and ready:
        return "deployed-degraded" if cond(cr, "Degraded").get("status") == "True" else "deployed"
    return None


def run(args: argparse.Namespace) -> dict[str, Any]:
    with control_plane(args.cluster) as state:
        cfg = client.Configuration()
        config.load_kube_config(config_file=str(state.kubeconfig), client_configuration=cfg)
        api = client.ApiClient(cfg)
        kubectl = str(cluster.build.binaries().kubectl)
        env = {**os.environ, "KUBECONFIG": str(state.kubeconfig)}
        subprocess.run([kubectl, "apply", "--server-side", "--force-conflicts", "-f", str(CRD)], env=env, check=True)
        subprocess.run([kubectl, "wait", "--for=condition=Established", "--timeout=60s",
                        f"crd/{P}.{G}"], env=env, check=True)  # fmt: skip
        core, apps, co = client.CoreV1Api(api), client.AppsV1Api(api), client.CustomObjectsApi(api)
        ns = f"sweep-{uuid.uuid4().hex[:6]}"
        core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=ns)))
        log = Path(args.log)
        with log.open("wb") as f:
            op = subprocess.Popen([sys.executable, "-m", "hpd_operator", "run", "-n", ns, "--liveness-port", "0",
                                   "--metrics-port", "0"], env=env, stdout=f, stderr=subprocess.STDOUT)  # fmt: skip
        try:
            return sweep(api, core, apps, co, ns)
        finally:
            op.terminate()
            op.wait(timeout=30)
            core.delete_namespace(ns)


def sweep(api: client.ApiClient, core: Any, apps: Any, co: Any, ns: str) -> dict[str, Any]:
    def get(name: str) -> dict[str, Any]:
        out: dict[str, Any] = co.get_namespaced_custom_object(G, V, ns, P, name)
        return out

    co.create_namespaced_custom_object(G, V, ns, P, base("sentinel"))
    t0 = time.monotonic()
    while cond(get("sentinel"), "Ready").get("status") != "True":
        if time.monotonic() - t0 > 60:
            raise SystemExit("sentinel not Ready in 60 s")
        time.sleep(0.2)
    sentinel_uid = get("sentinel")["metadata"]["uid"]

    results: dict[str, dict[str, Any]] = {}
    for name, mutate in CASES:
        doc = base(name)
        mutate(doc)
        try:
            co.create_namespaced_custom_object(G, V, ns, P, doc)
            results[name] = {"accepted": True, "created": time.monotonic()}
        except client.ApiException as e:
            results[name] = {"accepted": False, "rejected": json.loads(e.body).get("message", "")[:300]}
    sentinel_not_ready = 0
    pending = {n for n, r in results.items() if r["accepted"]}
    while pending:
        crs = {c["metadata"]["name"]: c for c in co.list_namespaced_custom_object(G, V, ns, P)["items"]}
        owned: dict[str, list[str]] = {}
        for d in apps.list_namespaced_deployment(ns).items:
            for ref in d.metadata.owner_references or []:
                owned.setdefault(ref.uid, []).append(d.metadata.name)
        if cond(crs["sentinel"], "Ready").get("status") != "True":
            sentinel_not_ready += 1
        for name in sorted(pending):
            r = results[name]
            cr = crs[name]
            o = outcome(cr, owned.get(cr["metadata"]["uid"], []))
            late = time.monotonic() - r["created"] > GIVE_UP
            if o is not None or late:
                r.update(outcome=o or "none", seconds=round(time.monotonic() - r["created"], 2))
                r["ready"] = {k: cond(cr, "Ready").get(k) for k in ("status", "reason", "message")}
                r["names_field"] = o != "reported" or "spec." in str(r["ready"]["message"])
                pending.discard(name)
        time.sleep(0.2)

    t_hold = time.monotonic()
    while time.monotonic() - t_hold < HOLD:
        if cond(get("sentinel"), "Ready").get("status") != "True":
            sentinel_not_ready += 1
        time.sleep(0.5)

    # Events per CR: Warning objects and their counts
    events: dict[str, list[tuple[str, int]]] = {}
    for e in core.list_namespaced_event(ns).items:
        if e.involved_object.kind == contract.KIND and e.type == "Warning":
            events.setdefault(e.involved_object.name, []).append((e.reason, e.count or 1))
    for name, r in results.items():
        if r["accepted"]:
            r["warning_events"] = events.get(name, [])
            r.pop("created", None)
    storms = [n for n, evs in events.items() if len(evs) > 1 or any(c > 1 for _, c in evs)]

    # ownership: every child owned by exactly one CR, the one its instance label names
    crs = {c["metadata"]["uid"]: c["metadata"]["name"] for c in co.list_namespaced_custom_object(G, V, ns, P)["items"]}
    double, wrong = [], []
    for lst in (apps.list_namespaced_deployment, core.list_namespaced_service):
        for o in lst(ns).items:
            owners = [r.uid for r in o.metadata.owner_references or [] if r.uid in crs]
            if len(owners) > 1:
                double.append(o.metadata.name)
            inst = (o.metadata.labels or {}).get(contract.LABEL_INSTANCE)
            if owners and inst and not crs[owners[0]].startswith(inst[:40]):
                wrong.append(o.metadata.name)

    # the sentinel's drift is still corrected (its decode Deployment: `sentinel-decode-<generation>`)
    sel = f"{contract.LABEL_INSTANCE}=sentinel,{contract.LABEL_COMPONENT}=decode"
    (dep,) = apps.list_namespaced_deployment(ns, label_selector=sel).items
    name = dep.metadata.name
    body = copy.deepcopy(dep)
    body.spec.replicas = 3
    apps.replace_namespaced_deployment(name, ns, body)
    t = time.monotonic()
    while apps.read_namespaced_deployment(name, ns).spec.replicas != 1:
        if time.monotonic() - t > 60:
            break
        time.sleep(0.2)
    drift_s = round(time.monotonic() - t, 2)

    accepted = [r for r in results.values() if r["accepted"]]
    summary = {
        "cases": len(results),
        "rejected_by_apiserver": len(results) - len(accepted),
        "accepted": len(accepted),
        "accepted_settled_within_deadline": sum(r["outcome"] != "none" and r["seconds"] <= DEADLINE for r in accepted),
        "accepted_settled_eventually": sum(r["outcome"] != "none" for r in accepted),
        "median_seconds_to_settle": sorted(r["seconds"] for r in accepted)[len(accepted) // 2] if accepted else 0,
        "reported_with_a_field_path": sum(r["outcome"] == "reported" and r["names_field"] for r in accepted),
        "reported": sum(r["outcome"] == "reported" for r in accepted),
        "deployed": sum(r["outcome"].startswith("deployed") for r in accepted),
        "max_seconds_to_settle": max((r["seconds"] for r in accepted), default=0),
        "event_storms": storms,
        "children_owned_twice": double,
        "children_owned_by_another_instance": wrong,
        "sentinel_uid_unchanged": get("sentinel")["metadata"]["uid"] == sentinel_uid,
        "sentinel_not_ready_samples": sentinel_not_ready,
        "sentinel_drift_corrected_seconds": drift_s,
        "deadline_seconds": DEADLINE,
        "give_up_seconds": GIVE_UP,
        "load_average_1m_at_end": os.getloadavg()[0],
        "cpus": os.cpu_count(),
        "hold_seconds": HOLD,
    }
    return {"summary": summary, "cases": results}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cluster", help="use this running devcluster (python -m hpd_devcluster --name N up --nodes 16)")
    day = datetime.date.today().isoformat()
    p.add_argument("--out", default=str(REPO / "bench" / "results" / f"{day}-containment-sweep.json"))
    p.add_argument("--log", default="/tmp/containment-sweep-operator.log")
    args = p.parse_args()
    result = run(args)
    result["command"] = " ".join([Path(sys.executable).name, *sys.argv])
    Path(args.out).write_text(json.dumps(result, indent=2, ensure_ascii=False) + "\n")
    print(json.dumps(result["summary"], indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
