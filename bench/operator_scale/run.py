"""The operator at N = 10, 100, 1,000 CRs on the local control plane, beside a bare client (issue #15, item 2).

For each size N it starts its own control plane (etcd + kube-apiserver + controller-manager + scheduler + kwok, with
enough fake GPU nodes for every pod, an apiserver audit log and a controller-manager client rate of 500 QPS so the
Deployment/ReplicaSet controllers do not throttle pod creation at 20 QPS), then, in this order:

1. bare: a kubernetes Python client (its own user, `hpd-bench-bare`) server-side applies exactly the children the
   operator makes for N CRs (`hpd_operator.render`: examples/minimal.yaml renamed scale-0 .. scale-N-1) into
   namespace `scale-bare`, with `--concurrency` threads (one CR's children per task, in order, as the operator
   does), as fast as it can; then it waits until the controllers have made and kwok has started all those pods, so
   the operator's phase starts on a quiet cluster.
2. operator: `python -m hpd_operator run -n scale-op` (default flags, its own user `hpd-operator`) starts; once its
   CR watch is open, the N CRs are created with the same concurrency. Watches (this bench's user, `hpd-admin`) time
   the first sight of every child and every CR's first Ready=True.
3. idle: `--idle-seconds` with nothing but watches from this bench open (started before; they make no requests).
4. latency: `--latency-samples` times, one decode pod's Ready condition is set False through pods/status (kwok only
   readies Pending pods, so it stays False), then True again; the CR watch times until the CR's DecodeReady follows.
5. correctness: every CR Ready, each one owns exactly the children render says (no more, no fewer), and the bare
   namespace holds exactly N times as many.

API requests come from two places: the apiserver's own `apiserver_request_total` (all clients; delta over each
window, by verb; a WATCH counts when it ends) and its audit log (Metadata level, every request, split by user and
verb, counted at its first audit stage, i.e. when it started). The operator's figures are its audit user's. Operator
CPU seconds come from /proc/<pid>/stat, its peak RSS from VmHWM in /proc/<pid>/status.

    python bench/operator_scale/run.py --sizes 10,100,1000 --idle-seconds 300 [--label after]

Writes bench/results/<date>-operator-scale-N<largest>[-<label>].json (after every size, so a run cut short keeps
what it measured) and stops every cluster it started.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import math
import os
import platform
import re
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import urllib3
import yaml
from kubernetes import client, config
from prometheus_client.parser import text_string_to_metric_families

from hpd_devcluster import build, cluster, lifecycle, pki, versions
from hpd_operator import apply as k8s
from hpd_operator.render import render
from hpd_runtime import contract

REPO = Path(__file__).resolve().parents[2]
CRD = REPO / "crds" / "hybridpddeployments.hybridpd.io.yaml"
SEED = REPO / "examples" / "minimal.yaml"
G, V, P = contract.GROUP, contract.VERSION, contract.PLURAL
OP_NS, BARE_NS = "scale-op", "scale-bare"
OPERATOR = pki.ClientCert("operator", "hpd-operator", "system:masters")
BARE = pki.ClientCert("bare", "hpd-bench-bare", "system:masters")
ADMIN_USER = "hpd-admin"
"""This bench's own user (the devcluster's admin): CR creation, watches, pod status flips."""
PODS_PER_NODE = 250
SERVICE_CIDR = "10.0.0.0/16"
"""2 N CRs' ClusterIP Services (the devcluster's /24 holds 253: full at N = 127)."""
KCM_QPS = ("--kube-api-qps=500", "--kube-api-burst=1000")
WRITE_VERBS = frozenset({"create", "update", "patch", "delete", "deletecollection"})
READ_VERBS = frozenset({"get", "list", "watch"})
META_LIST = "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1"
META_ONE = "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1"
AUDIT_POLICY = {
    "apiVersion": "audit.k8s.io/v1",
    "kind": "Policy",
    "omitStages": ["RequestReceived"],
    "rules": [{"level": "Metadata"}],
}
TARGETS = {
    "converge_ready_at_1000": "1,000 CRs converge to Ready",
    "throughput_ratio": "operator/bare throughput >= 0.5",
    "idle_writes": "0 write requests in the idle window",
    "idle_reads_per_cr_minute": "< 1 read request per CR per minute when idle",
    "rss_at_1000": "RSS < 200 MiB at 1,000 CRs",
    "status_latency": "a child's status change reaches the CR's status in < 2 s",
}


# --- plain HTTP to the apiserver (cheap for watches and metrics: no model objects) -------------------------------
class Http:
    """urllib3 with one client cert of the devcluster's CA; JSON in, JSON out."""

    def __init__(self, state: cluster.ClusterState, cert: str, maxsize: int = 16) -> None:
        self.server = state.server
        self.pool = urllib3.PoolManager(
            maxsize=maxsize,
            ca_certs=str(state.pki / "ca.crt"),
            cert_file=str(state.pki / f"{cert}.crt"),
            key_file=str(state.pki / f"{cert}.key"),
        )

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        ctype: str = "application/json",
        accept: str = "application/json",
    ) -> Any:
        data = json.dumps(body).encode() if body is not None else None
        resp = self.pool.request(
            method, self.server + path, body=data, headers={"Content-Type": ctype, "Accept": accept}, timeout=60
        )
        if resp.status >= 300:
            raise RuntimeError(f"{method} {path}: {resp.status} {resp.data[:300]!r}")
        return json.loads(resp.data) if resp.data and accept.startswith("application/json") else resp.data

    def text(self, path: str) -> str:
        resp = self.pool.request("GET", self.server + path, timeout=60)
        if resp.status != 200:
            raise RuntimeError(f"GET {path}: {resp.status}")
        return resp.data.decode()


class Watch(threading.Thread):
    """List then watch one collection; `on_event(type, obj)` for every item and event. Resumes from the last
    resourceVersion if the server ends the watch; relists on 410 Gone."""

    def __init__(self, http: Http, path: str, on_event: Callable[[str, dict[str, Any]], None], meta: bool) -> None:
        super().__init__(daemon=True, name=f"watch {path}")
        self.http, self.path, self.on_event, self.meta = http, path, on_event, meta
        self.stopped = threading.Event()
        self.listed = threading.Event()
        self.resp: urllib3.BaseHTTPResponse | None = None
        self.restarts = 0

    def _list(self) -> str:
        data = self.http.request("GET", self.path, accept=META_LIST if self.meta else "application/json")
        for item in data.get("items") or []:
            self.on_event("ADDED", item)
        self.listed.set()
        return str(data["metadata"]["resourceVersion"])

    def run(self) -> None:
        rv = self._list()
        while not self.stopped.is_set():
            sep = "&" if "?" in self.path else "?"
            url = f"{self.http.server}{self.path}{sep}watch=1&resourceVersion={rv}&timeoutSeconds=3600"
            accept = META_ONE if self.meta else "application/json"
            try:
                self.resp = self.http.pool.request(
                    "GET", url, headers={"Accept": accept}, preload_content=False, timeout=urllib3.Timeout(connect=30)
                )
                gone = False
                for line in _lines(self.resp):
                    ev = json.loads(line)
                    if ev["type"] == "ERROR":
                        gone = ev["object"].get("code") == 410
                        break
                    if ev["type"] != "BOOKMARK":
                        self.on_event(ev["type"], ev["object"])
                    rv = ev["object"]["metadata"]["resourceVersion"]
                if gone:
                    rv = self._list()
            except (urllib3.exceptions.HTTPError, OSError, ValueError):
                if self.stopped.is_set():
                    return
                time.sleep(0.5)
            self.restarts += 0 if self.stopped.is_set() else 1

    def stop(self) -> None:
        self.stopped.set()
        if self.resp is not None:
            with contextlib.suppress(Exception):
                self.resp.shutdown()
                self.resp.release_conn()


def _lines(resp: urllib3.BaseHTTPResponse) -> Iterator[bytes]:
    buf = b""
    for chunk in resp.stream(65536, decode_content=True):
        buf += chunk
        while b"\n" in buf:
            line, buf = buf.split(b"\n", 1)
            if line.strip():
                yield line


# --- what the operator should make ---------------------------------------------------------------------------------
def cr_doc(i: int, namespace: str) -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load(SEED.read_text())
    doc["metadata"] = {"name": f"scale-{i}", "namespace": namespace}
    return doc


def children_of(doc: dict[str, Any]) -> list[dict[str, Any]]:
    return [m for m in render([doc]) if (m["apiVersion"], m["kind"]) != ("monitoring.coreos.com/v1", "PodMonitor")]


@dataclass(frozen=True)
class PerCR:
    """What one CR costs the cluster (from the rendered children)."""

    children: int
    kinds: tuple[k8s.Kind, ...]
    pods: int
    gpus: int

    @classmethod
    def of(cls, manifests: list[dict[str, Any]]) -> PerCR:
        pods = gpus = 0
        for m in manifests:
            if m["kind"] == "Deployment":
                replicas = int(m["spec"].get("replicas", 1))
                pods += replicas
                for c in m["spec"]["template"]["spec"]["containers"]:
                    gpus += replicas * int(
                        ((c.get("resources") or {}).get("limits") or {}).get(cluster.GPU_RESOURCE, 0)
                    )
        kinds = tuple(k for k in k8s.KINDS if any(k8s.kind_of(m) == k for m in manifests))
        return cls(children=len(manifests), kinds=kinds, pods=pods, gpus=gpus)


def node_pool(n: int, per: PerCR) -> cluster.NodePool:
    """Room for the operator's and the bare client's pods (2 N CRs' worth) with 20 % to spare."""
    pods = 2 * n * per.pods
    count = max(2, math.ceil(pods * 1.2 / PODS_PER_NODE))
    gpus = math.ceil(2 * n * per.gpus * 1.2 / count) + 8
    return cluster.NodePool(count=count, gpus_per_node=gpus, pods_per_node=PODS_PER_NODE, cpu="4000", memory="64Ti")


# --- measurements ---------------------------------------------------------------------------------------------------
def requests_by_verb(http: Http) -> dict[str, float]:
    """The apiserver's own apiserver_request_total, summed by verb (all clients)."""
    out: dict[str, float] = defaultdict(float)
    for fam in text_string_to_metric_families(http.text("/metrics")):
        if fam.name != "apiserver_request":
            continue
        for s in fam.samples:
            if s.name == "apiserver_request_total":
                out[s.labels.get("verb", "")] += s.value
    return dict(out)


def delta(after: Mapping[str, float], before: Mapping[str, float]) -> dict[str, int]:
    return {k: int(after.get(k, 0) - before.get(k, 0)) for k in sorted(after) if after.get(k, 0) - before.get(k, 0)}


class Proc:
    """CPU seconds and RSS of one process from /proc; a sampler thread keeps the largest VmRSS seen."""

    TICK = os.sysconf("SC_CLK_TCK")

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.peak_rss_kib = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()

    def cpu_seconds(self) -> float:
        fields = Path(f"/proc/{self.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / self.TICK  # utime + stime

    def status_kib(self, key: str) -> int:
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1])
        return 0

    def _sample(self) -> None:
        while not self._stop.wait(0.5):
            with contextlib.suppress(OSError):
                self.peak_rss_kib = max(self.peak_rss_kib, self.status_kib("VmRSS"))

    def stop(self) -> None:
        self._stop.set()


@dataclass
class Window:
    name: str
    start: float
    end: float = 0.0
    metrics_before: dict[str, float] = field(default_factory=dict)
    metrics_after: dict[str, float] = field(default_factory=dict)

    @property
    def seconds(self) -> float:
        return self.end - self.start


class Audit:
    """The apiserver's audit log (JSON lines, Metadata level): every request counted once, at its first stage."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._offset = 0

    def events(self) -> list[tuple[float, str, str, str]]:
        """(request received, user, verb, resource[/subresource]) per request."""
        seen: set[str] = set()
        out = []
        for line in self._lines():
            if line:
                ev = json.loads(line)
                if ev["auditID"] in seen:
                    continue
                seen.add(ev["auditID"])
                ref = ev.get("objectRef") or {}
                res = ref.get("resource", ev.get("requestURI", "").split("?")[0])
                if ref.get("subresource"):
                    res += "/" + ref["subresource"]
                t = datetime.datetime.fromisoformat(ev["requestReceivedTimestamp"]).timestamp()
                out.append((t, ev["user"]["username"], ev["verb"], res))
        return out

    def files(self) -> list[Path]:
        """The log and its rotated parts (the apiserver rotates at 100 MB: <stem>-<time>.log), oldest first."""
        return [*sorted(self.path.parent.glob(f"{self.path.stem}-*{self.path.suffix}")), self.path]

    def _lines(self) -> Iterator[str]:
        for path in self.files():
            with path.open() as f:
                yield from f

    def operator_watches(self, resource: str) -> bool:
        """The operator's user has opened a watch on `resource` (reads only what was appended since last time)."""
        if not self.path.exists():
            return False
        if self.path.stat().st_size < self._offset:  # rotated: a new file
            self._offset = 0
        with self.path.open("rb") as f:
            f.seek(self._offset)
            data = f.read()
        whole = data[: data.rfind(b"\n") + 1]
        self._offset += len(whole)
        for line in whole.splitlines():
            if b'"hpd-operator"' in line and b'"watch"' in line:
                ev = json.loads(line)
                if (
                    ev["user"]["username"] == OPERATOR.common_name
                    and (ev.get("objectRef") or {}).get("resource") == resource
                ):
                    return True
        return False


def window_counts(events: list[tuple[float, str, str, str]], w: Window) -> dict[str, Any]:
    inside = [e for e in events if w.start <= e[0] < w.end]
    by_user: dict[str, Counter[str]] = defaultdict(Counter)
    op_res: Counter[str] = Counter()
    for _, user, verb, res in inside:
        by_user[user][verb] += 1
        if user == OPERATOR.common_name:
            op_res[f"{verb} {res}"] += 1
    op = by_user.get(OPERATOR.common_name, Counter())
    return {
        "seconds": round(w.seconds, 2),
        "start_epoch": round(w.start, 3),
        "end_epoch": round(w.end, 3),
        "apiserver_request_total_by_verb_all_clients": delta(w.metrics_after, w.metrics_before),
        "audit_by_user_and_verb": {u: dict(sorted(c.items())) for u, c in sorted(by_user.items())},
        "operator_by_verb_and_resource": dict(sorted(op_res.items())),
        "operator_writes": sum(v for k, v in op.items() if k in WRITE_VERBS),
        "operator_reads": sum(v for k, v in op.items() if k in READ_VERBS),
    }


# --- the phases -----------------------------------------------------------------------------------------------------
def api_client(state: cluster.ClusterState, cert: str, concurrency: int, agent: str) -> client.ApiClient:
    path = state.root / f"{cert}.kubeconfig"
    path.write_text(pki.kubeconfig(state.server, state.pki, cert))
    cfg = client.Configuration()
    config.load_kube_config(config_file=str(path), client_configuration=cfg)
    cfg.connection_pool_maxsize = concurrency
    api = client.ApiClient(cfg)
    api.user_agent = agent
    return api


def bare_apply(api: client.ApiClient, manifests: list[dict[str, Any]]) -> None:
    """Server-side apply with the kubernetes Python client, one object after the other (fieldManager of its own)."""
    for obj in manifests:
        kind, md = k8s.kind_of(obj), obj["metadata"]
        method, url, headers, body, _ = api.param_serialize(
            "PATCH",
            f"{kind.base(md['namespace'])}/{md['name']}",
            query_params=[("fieldManager", "hpd-bench-bare"), ("force", "true")],
            header_params={"Content-Type": "application/apply-patch+yaml", "Accept": "application/json"},
            body=json.dumps(obj).encode(),
            auth_settings=["BearerToken"],
        )
        resp = api.call_api(method, url, header_params=headers, body=body)
        data = resp.read()
        if resp.status >= 300:
            raise RuntimeError(f"bare apply {obj['kind']} {md['name']}: {resp.status} {data[:500]!r}")


def wait(check: Callable[[], bool], timeout: float, what: str, interval: float = 1.0) -> float:
    """Poll until `check()`; returns the seconds it took; raises naming `what` after `timeout`."""
    t0 = time.monotonic()
    while not check():
        if time.monotonic() - t0 > timeout:
            raise TimeoutError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(interval)
    return time.monotonic() - t0


def running_pods(http: Http, ns: str) -> int:
    data = http.request("GET", f"/api/v1/namespaces/{ns}/pods?fieldSelector=status.phase%3DRunning", accept=META_LIST)
    return len(data["items"] or [])


def cond(cr: Mapping[str, Any], ctype: str) -> str | None:
    for c in (cr.get("status") or {}).get("conditions") or []:
        if c.get("type") == ctype:
            return str(c.get("status"))
    return None


class CRWatch:
    """The latest version of every CR, first-Ready times, and waits on a predicate without polling."""

    def __init__(self) -> None:
        self.latest: dict[str, dict[str, Any]] = {}
        self.first_ready: dict[str, float] = {}
        self.cv = threading.Condition()

    def on_event(self, kind: str, obj: dict[str, Any]) -> None:
        name = obj["metadata"]["name"]
        with self.cv:
            if kind == "DELETED":
                self.latest.pop(name, None)
            else:
                self.latest[name] = obj
                if cond(obj, "Ready") == "True":
                    self.first_ready.setdefault(name, time.time())
            self.cv.notify_all()

    def wait(self, pred: Callable[[], bool], timeout: float) -> bool:
        with self.cv:
            return self.cv.wait_for(pred, timeout)


class ChildWatch:
    """First sight of every child (kind, name)."""

    def __init__(self) -> None:
        self.first_seen: dict[tuple[str, str], float] = {}
        self.lock = threading.Lock()
        self.cv = threading.Condition(self.lock)

    def handler(self, kind: str) -> Callable[[str, dict[str, Any]], None]:
        def on_event(etype: str, obj: dict[str, Any]) -> None:
            if etype == "DELETED" or (kind, obj["metadata"]["name"]) == ("ServiceAccount", "default"):
                return
            with self.cv:
                self.first_seen.setdefault((kind, obj["metadata"]["name"]), time.time())
                self.cv.notify_all()

        return on_event


def children_by_owner(http: Http, ns: str, kinds: tuple[k8s.Kind, ...]) -> dict[str, set[tuple[str, str]]]:
    """Owner uid -> {(kind, name)} of every object of our kinds in `ns` ('' = no owner)."""
    out: dict[str, set[tuple[str, str]]] = defaultdict(set)
    for k in kinds:
        for item in http.request("GET", k.base(ns), accept=META_LIST)["items"] or []:
            md = item["metadata"]
            if k.kind == "ServiceAccount" and md["name"] == "default":
                continue
            owners = [r["uid"] for r in md.get("ownerReferences") or []] or [""]
            for uid in owners:
                out[uid].add((k.kind, md["name"]))
    return out


def set_pod_ready(http: Http, ns: str, pod: str, ready: bool) -> None:
    status = "True" if ready else "False"
    body = {
        "status": {"conditions": [{"type": "Ready", "status": status}, {"type": "ContainersReady", "status": status}]}
    }
    http.request(
        "PATCH", f"/api/v1/namespaces/{ns}/pods/{pod}/status", body, ctype="application/strategic-merge-patch+json"
    )


def measure(n: int, args: argparse.Namespace, log_dir: Path) -> dict[str, Any]:
    docs = [cr_doc(i, OP_NS) for i in range(n)]
    expected = {d["metadata"]["name"]: {(m["kind"], m["metadata"]["name"]) for m in children_of(d)} for d in docs}
    bare_sets = [children_of(cr_doc(i, BARE_NS)) for i in range(n)]
    per = PerCR.of(bare_sets[0])
    pool = node_pool(n, per)
    name = f"scale-{os.getpid()}-{n}"
    policy = log_dir / f"audit-policy-{n}.yaml"
    policy.write_text(yaml.safe_dump(AUDIT_POLICY))
    audit_log = log_dir / f"audit-{n}.log"
    audit_log.unlink(missing_ok=True)
    extra = {
        "kube-apiserver": (f"--audit-policy-file={policy}", f"--audit-log-path={audit_log}",
                           "--audit-log-format=json", "--audit-log-mode=blocking", f"--service-cluster-ip-range={SERVICE_CIDR}"),
        "kube-controller-manager": KCM_QPS,
    }  # fmt: skip
    out: dict[str, Any] = {
        "n": n,
        "per_cr": {"children": per.children, "pods": per.pods, "gpus": per.gpus},
        "cluster": {"nodes": pool.count, "gpus_per_node": pool.gpus_per_node, "pods_per_node": pool.pods_per_node,
                    "extra_args": {k: list(v) for k, v in extra.items()}},
    }  # fmt: skip
    t_start = time.monotonic()
    with lifecycle.running(name, pool, extra_args=extra) as state:
        out["cluster"]["up_seconds"] = round(time.monotonic() - t_start, 1)
        for who in (OPERATOR, BARE):
            pki.add_client(state.pki, who)
        admin = Http(state, "admin", maxsize=args.concurrency + 4)
        kubectl = str(build.binaries().kubectl)
        env = {**os.environ, "KUBECONFIG": str(state.kubeconfig)}
        subprocess.run([kubectl, "apply", "--server-side", "-f", str(CRD)], env=env, check=True, capture_output=True)
        crd_path = f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{P}.{G}"
        wait(lambda: cond(admin.request("GET", crd_path), "Established") == "True", 60, "the CRD Established", 0.2)
        for ns in (OP_NS, BARE_NS):
            admin.request("POST", "/api/v1/namespaces", {"metadata": {"name": ns}})
            wait(lambda ns=ns: _exists(admin, f"/api/v1/namespaces/{ns}/serviceaccounts/default"), 120,
                 f"{ns}/default ServiceAccount", 0.2)  # fmt: skip
        audit = Audit(audit_log)

        # 1. bare
        bare = api_client(state, BARE.name, args.concurrency, "hpd-bench-bare")
        w_bare = Window("bare", time.time(), metrics_before=requests_by_verb(admin))
        t0 = time.monotonic()
        with ThreadPoolExecutor(args.concurrency) as pool_:
            list(pool_.map(lambda ms: bare_apply(bare, ms), bare_sets))
        bare_s = time.monotonic() - t0
        w_bare.end, w_bare.metrics_after = time.time(), requests_by_verb(admin)
        bare_objects = n * per.children
        settle_s = wait(lambda: running_pods(admin, BARE_NS) >= n * per.pods, args.timeout, "the bare pods Running", 2)
        out["bare"] = {
            "objects": bare_objects,
            "seconds": round(bare_s, 3),
            "objects_per_second": round(bare_objects / bare_s, 2),
            "concurrency": args.concurrency,
            "seconds_until_its_pods_ran_after_the_last_apply": round(settle_s, 1),
        }

        # 2. operator
        crw, chw = CRWatch(), ChildWatch()
        watches = [Watch(admin, f"/apis/{G}/{V}/namespaces/{OP_NS}/{P}", crw.on_event, meta=False)]
        watches += [Watch(admin, k.base(OP_NS), chw.handler(k.kind), meta=True) for k in per.kinds]
        for w in watches:
            w.start()
        for w in watches:
            w.listed.wait(30)
        op_log = log_dir / f"operator-{n}.log"
        op_kc = state.root / f"{OPERATOR.name}.kubeconfig"
        op_kc.write_text(pki.kubeconfig(state.server, state.pki, OPERATOR.name))
        workers = ["--workers", str(args.concurrency)] if operator_workers() else []
        argv = ["-m", "hpd_operator", "run", "-n", OP_NS, "--liveness-port", "0", "--metrics-port", "0", *workers,
                *args.operator_arg]  # fmt: skip
        out["operator_command"] = " ".join(["python", *argv])
        with op_log.open("wb") as f:
            op = subprocess.Popen(
                [sys.executable, *argv],
                env={**os.environ, "KUBECONFIG": str(op_kc)}, stdout=f, stderr=subprocess.STDOUT, cwd=REPO,
            )  # fmt: skip
        proc = Proc(op.pid)
        try:
            wait(lambda: op.poll() is None and audit.operator_watches(P), 120, "the operator's CR watch", 0.2)
            out["operator"], windows = run_operator_phase(
                n=n, args=args, admin=admin, docs=docs, expected=expected, crw=crw, chw=chw, proc=proc, op=op
            )
            out["operator"]["throughput_ratio"] = round(out["operator"]["children_per_second"] / out["bare"][
                "objects_per_second"], 3) if out["operator"]["children_per_second"] else 0.0  # fmt: skip
            out["status_latency"] = latency(args, admin, crw)
            out["correctness"] = correctness(admin, expected=expected, per=per, n=n)
            out["operator"]["cpu_seconds_total"] = round(proc.cpu_seconds(), 2)
            out["operator"]["peak_rss_mib"] = round(proc.status_kib("VmHWM") / 1024, 1)
            out["operator"]["peak_rss_mib_sampled"] = round(proc.peak_rss_kib / 1024, 1)
        finally:
            proc.stop()
            op.terminate()
            try:
                op.wait(timeout=30)
            except subprocess.TimeoutExpired:
                op.kill()
                op.wait()
            for w in watches:
                w.stop()
        text = op_log.read_text(errors="replace")
        out["operator"]["log"] = {"path": str(op_log), "tracebacks": text.count("Traceback"),
                                  "error_lines": sum(" ERROR" in ln or "[ERROR" in ln for ln in text.splitlines())}  # fmt: skip
        events = audit.events()
        out["api_requests"] = {w.name: window_counts(events, w) for w in [w_bare, *windows]}
        idle = out["api_requests"]["idle"]
        idle["operator_reads_per_cr_per_minute"] = round(idle["operator_reads"] / n / (idle["seconds"] / 60), 4)
        out["audit"] = {"files": [str(f) for f in audit.files()], "requests": len(events)}
    out["seconds_total"] = round(time.monotonic() - t_start, 1)
    return out


def _exists(http: Http, path: str) -> bool:
    try:
        http.request("GET", path)
        return True
    except RuntimeError:
        return False


def run_operator_phase(
    *,
    n: int,
    args: argparse.Namespace,
    admin: Http,
    docs: list[dict[str, Any]],
    expected: dict[str, set[tuple[str, str]]],
    crw: CRWatch,
    chw: ChildWatch,
    proc: Proc,
    op: subprocess.Popen[bytes],
) -> tuple[dict[str, Any], list[Window]]:
    total_children = sum(len(v) for v in expected.values())
    names = [d["metadata"]["name"] for d in docs]
    cpu0 = proc.cpu_seconds()
    w_conv = Window("converge", time.time(), metrics_before=requests_by_verb(admin))
    t0 = w_conv.start
    with ThreadPoolExecutor(args.concurrency) as pool_:
        list(pool_.map(lambda d: admin.request("POST", f"/apis/{G}/{V}/namespaces/{OP_NS}/{P}", d), docs))
    created_s = time.time() - t0

    def all_children() -> bool:
        return len(chw.first_seen) >= total_children

    def all_ready() -> bool:
        return all(x in crw.first_ready for x in names)

    deadline = time.monotonic() + args.timeout
    with chw.cv:
        chw.cv.wait_for(lambda: all_children() or op.poll() is not None, args.timeout)
    with crw.cv:
        crw.cv.wait_for(lambda: all_ready() or op.poll() is not None, max(1.0, deadline - time.monotonic()))
    w_conv.end, w_conv.metrics_after = time.time(), requests_by_verb(admin)
    cpu1 = proc.cpu_seconds()
    rss_ready = proc.status_kib("VmRSS")
    res: dict[str, Any] = {
        "crs_created_seconds": round(created_s, 3),
        "children_expected": total_children,
        "children_seen": len(chw.first_seen),
        "crs_ready": sum(x in crw.first_ready for x in names),
        "exited_early": op.poll(),
    }
    if all_children():
        last = max(chw.first_seen.values())
        res["seconds_to_all_children_created"] = round(last - t0, 3)
        res["children_per_second"] = round(total_children / (last - t0), 2)
    else:
        res["seconds_to_all_children_created"] = None
        res["children_per_second"] = 0.0
    res["seconds_to_all_ready"] = round(max(crw.first_ready.values()) - t0, 3) if all_ready() else None
    res["cpu_seconds_converge"] = round(cpu1 - cpu0, 2)
    res["rss_mib_at_all_ready"] = round(rss_ready / 1024, 1)

    # 3. idle: nothing from this bench but its open watches
    time.sleep(args.settle_seconds)
    w_idle = Window("idle", time.time(), metrics_before=requests_by_verb(admin))
    cpu2 = proc.cpu_seconds()
    time.sleep(args.idle_seconds)
    w_idle.end, w_idle.metrics_after = time.time(), requests_by_verb(admin)
    res["cpu_seconds_idle"] = round(proc.cpu_seconds() - cpu2, 2)
    res["settle_seconds_before_idle"] = args.settle_seconds
    return res, [w_conv, w_idle]


def latency(args: argparse.Namespace, admin: Http, crw: CRWatch) -> dict[str, Any]:
    """Flip a decode pod's Ready condition; seconds until the CR's DecodeReady follows (both ways)."""
    names = sorted(crw.latest, key=lambda s: int(s.rsplit("-", 1)[1]))
    picks = [names[round(i * (len(names) - 1) / max(1, args.latency_samples - 1))] for i in range(args.latency_samples)]
    samples = []
    for name in dict.fromkeys(picks):
        sel = f"{contract.LABEL_INSTANCE}={name},{contract.LABEL_COMPONENT}=decode"
        pods = admin.request("GET", f"/api/v1/namespaces/{OP_NS}/pods?labelSelector={sel}", accept=META_LIST)["items"]
        pod = pods[0]["metadata"]["name"]
        sample: dict[str, Any] = {"cr": name, "pod": pod}
        for ready, key in ((False, "to_not_ready_seconds"), (True, "to_ready_seconds")):
            want = "True" if ready else "False"
            set_pod_ready(admin, OP_NS, pod, ready)
            t0 = time.time()
            ok = crw.wait(lambda name=name, want=want: cond(crw.latest.get(name, {}), "DecodeReady") == want,
                          args.latency_timeout)  # fmt: skip
            sample[key] = round(time.time() - t0, 3) if ok else None
        if sample["to_ready_seconds"] is not None:  # and the CR as a whole is Ready again before the next sample
            crw.wait(lambda name=name: cond(crw.latest.get(name, {}), "Ready") == "True", args.latency_timeout)
        samples.append(sample)
    values = [v for s in samples for v in (s["to_not_ready_seconds"], s["to_ready_seconds"])]
    timed = [v for v in values if v is not None]
    return {
        "samples": samples,
        "timeout_seconds": args.latency_timeout,
        "timed_out": len(values) - len(timed),
        "median_seconds": round(statistics.median(timed), 3) if timed else None,
        "max_seconds": max(timed) if len(timed) == len(values) else None,
    }


def correctness(admin: Http, *, expected: dict[str, set[tuple[str, str]]], per: PerCR, n: int) -> dict[str, Any]:
    crs = admin.request("GET", f"/apis/{G}/{V}/namespaces/{OP_NS}/{P}")["items"]
    uid = {c["metadata"]["name"]: c["metadata"]["uid"] for c in crs}
    owned = children_by_owner(admin, OP_NS, per.kinds)
    wrong = [name for name, want in expected.items() if owned.get(uid.get(name, "?"), set()) != want]
    orphans = sorted(f"{k} {nm}" for u, objs in owned.items() if u not in set(uid.values()) for k, nm in objs)
    bare = children_by_owner(admin, BARE_NS, per.kinds)
    return {
        "crs": len(crs),
        "crs_ready_now": sum(cond(c, "Ready") == "True" for c in crs),
        "crs_with_exactly_the_rendered_children": len(expected) - len(wrong),
        "crs_with_other_children": wrong[:20],
        "children_not_owned_by_a_cr": orphans[:20],
        "bare_objects": sum(len(v) for v in bare.values()),
        "bare_objects_expected": n * per.children,
    }


# --- the run --------------------------------------------------------------------------------------------------------
def machine() -> dict[str, Any]:
    cpuinfo = Path("/proc/cpuinfo").read_text()
    model = re.search(r"model name\s*:\s*(.*)", cpuinfo)
    mem = re.search(r"MemTotal:\s*(\d+)", Path("/proc/meminfo").read_text())
    return {
        "cpus": os.cpu_count(),
        "cpu_model": model.group(1) if model else None,
        "memory_gib": round(int(mem.group(1)) / 2**20, 1) if mem else None,
        "kernel": platform.release(),
        "python": platform.python_version(),
        "kubernetes": versions.KUBERNETES,
        "etcd": versions.ETCD,
        "kwok": versions.KWOK,
        "shared": "other engineers' test runs share this machine; see load_average",
    }


def git() -> dict[str, Any]:
    def out(*a: str) -> str:
        return subprocess.run(["git", *a], cwd=REPO, capture_output=True, text=True, check=False).stdout.strip()

    return {"commit": out("rev-parse", "HEAD"), "branch": out("rev-parse", "--abbrev-ref", "HEAD"),
            "dirty": bool(out("status", "--porcelain", "--untracked-files=no"))}  # fmt: skip


def targets(results: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    for _, r in sorted(results.items(), key=lambda kv: int(kv[0])):
        n, op = r["n"], r.get("operator", {})
        if "api_requests" not in r:
            continue
        idle = r["api_requests"]["idle"]
        lat = r["status_latency"]
        rows: list[tuple[str, Any, bool]] = [
            ("throughput_ratio", op["throughput_ratio"], op["throughput_ratio"] >= 0.5),
            ("idle_writes", idle["operator_writes"], idle["operator_writes"] == 0),
            ("idle_reads_per_cr_minute", idle["operator_reads_per_cr_per_minute"],
             idle["operator_reads_per_cr_per_minute"] < 1),
            ("status_latency", lat["max_seconds"], lat["max_seconds"] is not None and lat["max_seconds"] < 2),
        ]  # fmt: skip
        if n >= 1000:
            rows.insert(0, ("converge_ready_at_1000", op["crs_ready"], op["crs_ready"] == n))
            rows.append(("rss_at_1000", op["peak_rss_mib"], op["peak_rss_mib"] < 200))
        out += [{"n": n, "target": TARGETS[k], "value": v, "met": met} for k, v, met in rows]
    return out


def operator_workers() -> int | None:
    """The operator's default number of reconcile workers (None: it has no --workers flag)."""
    from hpd_operator import settings

    workers = getattr(settings, "WORKERS_DEFAULT", None)
    return int(workers) if workers is not None else None


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", default="10,100,1000", help="comma-separated numbers of CRs, each on a fresh cluster")
    p.add_argument("--idle-seconds", type=float, default=300)
    p.add_argument("--settle-seconds", type=float, default=15, help="after the last CR is Ready, before idle starts")
    p.add_argument(
        "--concurrency",
        type=int,
        default=operator_workers() or 8,
        help="client threads of the bare client and of CR creation, and the operator's --workers where it "
        "has that flag (default: its default worker count; else 8 = kopf's settings.execution.max_workers, "
        "the threads of the timer operator's handlers)",
    )
    p.add_argument("--latency-samples", type=int, default=5)
    p.add_argument("--latency-timeout", type=float, default=120)
    p.add_argument("--timeout", type=float, default=3600, help="seconds to wait for convergence per phase")
    p.add_argument("--operator-arg", action="append", default=[], help="extra argument of `hpd_operator run`")
    p.add_argument("--label", default="", help="suffix of the output name (e.g. before, after)")
    p.add_argument("--out", help="output JSON (default bench/results/<date>-operator-scale-N<largest>[-label].json)")
    p.add_argument("--log-dir", default="/tmp/operator-scale", help="operator logs and audit logs")
    args = p.parse_args()
    # SIGTERM (a timeout, Ctrl-C's cousin) unwinds like an exception, so the operator and the cluster are stopped
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    sizes = [int(s) for s in args.sizes.split(",")]
    day = datetime.date.today().isoformat()
    suffix = f"-{args.label}" if args.label else ""
    out = Path(args.out or REPO / "bench" / "results" / f"{day}-operator-scale-N{max(sizes)}{suffix}.json")
    log_dir = Path(args.log_dir)
    log_dir.mkdir(parents=True, exist_ok=True)
    result: dict[str, Any] = {
        "command": " ".join(["python", *sys.argv]),
        "git": git(),
        "started_at": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "machine": machine(),
        "load_average_at_start": os.getloadavg(),
        "settings": {k: v for k, v in vars(args).items() if k not in ("out",)},
        "seed": str(SEED.relative_to(REPO)),
        "method": __doc__,
        "results": {},
    }
    failed = False
    for n in sizes:
        print(f"[operator-scale] N={n} ...", file=sys.stderr, flush=True)
        try:
            result["results"][str(n)] = measure(n, args, log_dir)
        except Exception as e:  # one size failing (a timeout, a crash) still leaves the others measured
            result["results"][str(n)] = {"n": n, "error": f"{type(e).__name__}: {e}"}
            failed = True
        result["results"][str(n)]["load_average_at_end"] = os.getloadavg()
        result["targets"] = targets(result["results"])
        result["finished_at"] = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
        out.write_text(json.dumps(result, indent=2) + "\n")
        print(json.dumps({k: v for k, v in result["results"][str(n)].items() if k != "api_requests"}, indent=1),
              file=sys.stderr, flush=True)  # fmt: skip
    print(json.dumps(result["targets"], indent=1))
    print(f"wrote {out}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
