"""The event-driven reconcile on the local control plane (issue #15 item 1): what an idle operator costs the
apiserver, and how fast a child's status change reaches its CR's status.

1. Adds kwok GPU nodes until every CR fits (removed at the end), creates N CRs (the seed example, 1 replica per
   role) in a fresh namespace with the operator running (its own
   subprocess, `--namespace NS`, default safety resync 300 s), waits until all are Ready and the operator's work
   queue is empty, then holds IDLE seconds and reports the delta of the apiserver's `apiserver_request_total` by
   verb (all clients: the cluster is otherwise quiet) and of the operator's own `hpd_operator_api_requests_total`
   (its reconcile client; kopf's watch streams are not in it), plus the operator's RSS.
2. Latency samples: a CR whose decode pod waits for a node labelled with a fresh value; the script adds that kwok
   node, and measures, from two watch streams on this machine, the time from the decode pod's Ready=True to the
   CR's DecodeReady=True (both as seen by the watch, monotonic clock).

    python bench/reconcile/idle_and_latency.py --cluster NAME [--crs 50] [--idle 300] [--samples 5]
        [--out bench/results/<date>-reconcile-idle-latency.json]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import queue
import subprocess
import sys
import threading
import time
import urllib.request
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client, config, watch
from prometheus_client.parser import text_string_to_metric_families

from hpd_devcluster import cluster
from hpd_devcluster.build import binaries
from hpd_runtime import contract

REPO = Path(__file__).resolve().parents[2]
CRD = REPO / "crds" / "hybridpddeployments.hybridpd.io.yaml"
SEED = REPO / "examples" / "nemotron-3-nano.yaml"
G, V, P = contract.GROUP, contract.VERSION, contract.PLURAL


def wait(check: Callable[[], Any], timeout: float, what: str, interval: float = 0.5) -> Any:
    end = time.monotonic() + timeout
    while True:
        try:
            value = check()
            if value:
                return value
        except Exception:  # not yet
            pass
        if time.monotonic() > end:
            raise TimeoutError(what)
        time.sleep(interval)


def seed(name: str) -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load(SEED.read_text())
    doc["metadata"]["name"] = name
    return doc


def ready(cr: dict[str, Any], ctype: str = "Ready") -> bool:
    return any(c["type"] == ctype and c["status"] == "True" for c in (cr.get("status") or {}).get("conditions") or [])


def samples(text: str, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    out: dict[tuple[tuple[str, str], ...], float] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name == name:
                out[tuple(sorted(s.labels.items()))] = s.value
    return out


def by(label: str, before: dict[Any, float], after: dict[Any, float]) -> dict[str, float]:
    out: dict[str, float] = {}
    for k, v in after.items():
        d = v - before.get(k, 0.0)
        if d:
            key = dict(k).get(label, "")
            out[key] = out.get(key, 0.0) + d
    return dict(sorted(out.items()))


def by_verb_resource(before: dict[Any, float], after: dict[Any, float]) -> dict[str, float]:
    """`VERB resource[/subresource]` -> delta (who did it shows from the resource: leases are kwok's and the
    controllers' heartbeats, the operator's kinds are the operator's)."""
    out: dict[str, float] = {}
    for k, v in after.items():
        d = v - before.get(k, 0.0)
        if d:
            lab = dict(k)
            sub = lab.get("subresource", "")
            key = f"{lab.get('verb', '')} {lab.get('resource', '')}{'/' + sub if sub else ''}"
            out[key] = out.get(key, 0.0) + d
    return dict(sorted(out.items()))


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def latency(
    state: cluster.ClusterState,
    core: client.CoreV1Api,
    co: client.CustomObjectsApi,
    ns: str,
    name: str,
    *,
    nodes: list[str],
) -> float:
    """One sample: a CR whose decode pod waits for a node; add the node; decode pod Ready -> CR DecodeReady."""
    label = f"lat-{uuid.uuid4().hex[:6]}"
    doc = seed(name)
    doc["spec"]["decode"]["nodeSelector"] = {"hybridpd.test/node": label}
    co.create_namespaced_custom_object(G, V, ns, P, doc)
    wait(lambda: ready(co.get_namespaced_custom_object(G, V, ns, P, name), "PrefillReady"), 120, "prefill")
    seen: queue.Queue[tuple[str, float]] = queue.Queue()

    def pods() -> None:
        sel = f"{contract.LABEL_INSTANCE}={name},{contract.LABEL_COMPONENT}=decode"
        w = watch.Watch()
        for ev in w.stream(core.list_namespaced_pod, ns, label_selector=sel, timeout_seconds=120):
            if any(c.type == "Ready" and c.status == "True" for c in ev["object"].status.conditions or []):
                seen.put(("pod", time.monotonic()))
                w.stop()

    def crs() -> None:
        w = watch.Watch()
        for ev in w.stream(co.list_namespaced_custom_object, G, V, ns, P,
                           field_selector=f"metadata.name={name}", timeout_seconds=120):  # fmt: skip
            if ready(ev["object"], "DecodeReady"):
                seen.put(("cr", time.monotonic()))
                w.stop()

    threads = [threading.Thread(target=pods, daemon=True), threading.Thread(target=crs, daemon=True)]
    for t in threads:
        t.start()
    time.sleep(1.0)  # both watches established before the node appears
    node = f"lat-{uuid.uuid4().hex[:6]}"
    manifest = cluster._node_manifest(node, cluster.NodePool())
    manifest["metadata"]["labels"]["hybridpd.test/node"] = label
    cluster.api(state, "POST", "/api/v1/nodes", manifest)
    nodes.append(node)
    got = dict(seen.get(timeout=120) for _ in range(2))
    return round(got["cr"] - got["pod"], 3)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cluster", required=True)
    ap.add_argument("--crs", type=int, default=50)
    ap.add_argument("--idle", type=float, default=300.0)
    ap.add_argument("--samples", type=int, default=5)
    ap.add_argument("--out", default="")
    args = ap.parse_args()

    state = cluster.ClusterState.load(args.cluster)
    kubeconfig = str(state.kubeconfig)
    cfg = client.Configuration()
    config.load_kube_config(config_file=kubeconfig, client_configuration=cfg)
    api = client.ApiClient(cfg)
    core, co = client.CoreV1Api(api), client.CustomObjectsApi(api)
    kubectl = str(binaries().kubectl)
    env = {**os.environ, "KUBECONFIG": kubeconfig}
    subprocess.run([kubectl, "apply", "--server-side", "--force-conflicts", "-f", str(CRD)], env=env, check=True)
    ns = f"idle-{uuid.uuid4().hex[:6]}"
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=ns)))
    port = 19300 + os.getpid() % 500
    log = Path(f"/tmp/reconcile-bench-{ns}.log")
    argv = [sys.executable, "-m", "hpd_operator", "run", "--namespace", ns, "--liveness-port", "0",
            "--metrics-port", str(port)]  # fmt: skip
    op = subprocess.Popen(argv, env=env, stdout=log.open("wb"), stderr=subprocess.STDOUT, cwd=REPO)

    def op_metrics() -> str:
        return urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()

    def apiserver_metrics() -> str:
        return subprocess.run(
            [kubectl, "get", "--raw", "/metrics"], env=env, capture_output=True, text=True, check=True
        ).stdout

    result: dict[str, Any] = {"command": " ".join(["python", *sys.argv]), "crs": args.crs, "namespace": ns}
    nodes: list[str] = []
    try:
        # room for every CR (the seed asks 2 + 2 GPUs; a kwok node has 8): add kwok nodes, removed at the end
        pool = cluster.NodePool()
        have = len(core.list_node().items)
        for _ in range(max(0, -(-args.crs * 4 // pool.gpus_per_node) + 2 - have)):
            node = f"bench-{uuid.uuid4().hex[:6]}"
            cluster.api(state, "POST", "/api/v1/nodes", cluster._node_manifest(node, pool))
            nodes.append(node)
        result["kwok_nodes"] = have + len(nodes)
        wait(op_metrics, 60, "operator metrics")
        t0 = time.monotonic()
        for i in range(args.crs):
            co.create_namespaced_custom_object(G, V, ns, P, seed(f"m{i}"))

        def all_ready() -> bool:
            items = co.list_namespaced_custom_object(G, V, ns, P)["items"]
            return len(items) == args.crs and all(ready(c) for c in items)

        wait(all_ready, 900, "all CRs Ready", interval=1.0)
        result["seconds_to_all_ready"] = round(time.monotonic() - t0, 1)

        def drained() -> bool:
            text = op_metrics()
            depth = sum(samples(text, "workqueue_depth").values())
            active = sum(samples(text, "controller_runtime_active_workers").values())
            return depth == 0 and active == 0

        wait(drained, 120, "queue drained")
        a0, o0 = (
            samples(apiserver_metrics(), "apiserver_request_total"),
            samples(op_metrics(), "hpd_operator_api_requests_total"),
        )
        time.sleep(args.idle)  # the measurement itself: nothing may happen
        a1, o1 = (
            samples(apiserver_metrics(), "apiserver_request_total"),
            samples(op_metrics(), "hpd_operator_api_requests_total"),
        )
        result["idle_seconds"] = args.idle
        result["idle_apiserver_requests_by_verb"] = by("verb", a0, a1)
        result["idle_apiserver_requests_by_verb_resource"] = by_verb_resource(a0, a1)
        result["idle_operator_requests_by_method"] = by("method", o0, o1)
        result["operator_rss_mib"] = round(rss_mib(op.pid), 1)

        # latency: decode pod Ready -> CR DecodeReady, both from watches
        lat = [latency(state, core, co, ns, f"lat{i}", nodes=nodes) for i in range(args.samples)]
        result["pod_ready_to_cr_status_seconds"] = lat
        result["operator_rss_mib_end"] = round(rss_mib(op.pid), 1)
    finally:
        op.terminate()
        op.wait(30)
        for n in nodes:
            core.delete_node(n)
        core.delete_namespace(ns)
    result["date"] = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
