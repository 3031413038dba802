"""A GPU node whose kubelet is the test: nothing but the test decides when its pods turn Ready.

kwok marks every pod it places Ready at once, which is no use for a test that must hold a new generation's decode
not Ready (its pair check has not passed) while the old one serves. `ManualNode` is a Node object kwok does not
manage (no kwok annotation), tainted so that only pods tolerating `TAINT` land on it. A background thread does what
a kubelet would: keeps the node's Lease fresh (so the node lifecycle controller keeps it Ready), reports every new
pod bound to it as Running but not Ready (its containers started, its readiness probe failing), reports the
readiness the test asks for with `set_ready`, and finishes a pod's deletion once it is asked (the containers
exited). Nothing connects to any pod: the pods get fake IPs as kwok's do.
"""

from __future__ import annotations

import datetime
import threading
import time
import uuid
from typing import Any

from kubernetes import client

from hpd_devcluster.testing import wait_for

POOL_LABEL = "hybridpd.test/manual-pool"
TAINT = {"key": "hybridpd.test/manual-kubelet", "value": "true", "effect": "NoSchedule"}
TOLERATION = {"key": TAINT["key"], "operator": "Equal", "value": TAINT["value"], "effect": TAINT["effect"]}
LEASE_SECONDS = 40


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


def _stamp(t: datetime.datetime) -> str:
    return t.strftime("%Y-%m-%dT%H:%M:%SZ")


def _stamp_micro(t: datetime.datetime) -> str:
    return t.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def place(spec: dict[str, Any], pool: str) -> None:
    """Put both engine roles of a CR spec on the node(s) of `pool` (and only there)."""
    for role in ("prefill", "decode"):
        spec[role]["nodeSelector"] = {POOL_LABEL: pool}
        spec[role]["tolerations"] = [dict(TOLERATION)]


class ManualNode:
    def __init__(self, api: client.ApiClient, gpus: int = 16) -> None:
        self.api, self.gpus = api, gpus
        self.core = client.CoreV1Api(api)
        self.coord = client.CoordinationV1Api(api)
        self.name = f"manual-{uuid.uuid4().hex[:8]}"
        self.pool = self.name
        self.ready: dict[str, bool] = {}
        """Pod name -> the readiness the test asked for (default: not Ready)."""
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"kubelet-{self.name}", daemon=True)
        self._ips: dict[str, str] = {}
        self.errors: list[str] = []

    # --- lifecycle ---------------------------------------------------------------------------------------------
    def start(self) -> ManualNode:
        resources = {"cpu": "256", "memory": "4Ti", "pods": "110", "ephemeral-storage": "2Ti",
                     "nvidia.com/gpu": str(self.gpus)}  # fmt: skip
        node = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": self.name, "labels": {"kubernetes.io/hostname": self.name, POOL_LABEL: self.pool,
                                                       "nvidia.com/gpu.product": "NVIDIA-H200"}},
            "spec": {"taints": [dict(TAINT)]},
        }  # fmt: skip
        self.core.create_node(node)
        self._renew_lease()
        status = {"status": {"capacity": resources, "allocatable": resources, "phase": "Running",
                             "conditions": [self._node_ready()],
                             "nodeInfo": {"architecture": "amd64", "operatingSystem": "linux",
                                          "kubeletVersion": "manual", "kubeProxyVersion": "manual"}}}  # fmt: skip
        self.core.patch_node_status(self.name, status)
        self._thread.start()

        def schedulable() -> bool:  # the lifecycle controller lifts the not-ready taint admission put on
            n = self.core.read_node(self.name)
            return not any(t.key.startswith("node.kubernetes.io/") for t in n.spec.taints or [])

        wait_for(schedulable, 60, what=f"node {self.name} schedulable")
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)
        for pod in self._pods():
            self._force_delete(pod)
        try:
            self.core.delete_node(self.name)
        except client.ApiException as e:
            if e.status != 404:
                raise
        try:
            self.coord.delete_namespaced_lease(self.name, "kube-node-lease")
        except client.ApiException as e:
            if e.status != 404:
                raise

    # --- what the test decides ---------------------------------------------------------------------------------
    def set_ready(self, pod: str, ready: bool = True) -> None:
        with self._lock:
            self.ready[pod] = ready

    def pods(self, **labels: str) -> list[client.V1Pod]:
        """The pods bound to this node (not being deleted) carrying `labels`."""
        out = []
        for p in self._pods():
            have = p.metadata.labels or {}
            if not p.metadata.deletion_timestamp and all(have.get(k) == v for k, v in labels.items()):
                out.append(p)
        return sorted(out, key=lambda p: p.metadata.name)

    # --- the kubelet's loop ------------------------------------------------------------------------------------
    def _pods(self) -> list[client.V1Pod]:
        return list(self.core.list_pod_for_all_namespaces(field_selector=f"spec.nodeName={self.name}").items)

    def _node_ready(self) -> dict[str, Any]:
        t = _stamp(_now())
        return {"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "the test is the kubelet",
                "lastHeartbeatTime": t, "lastTransitionTime": t}  # fmt: skip

    def _renew_lease(self) -> None:
        now = _now()
        body = client.V1Lease(
            metadata=client.V1ObjectMeta(name=self.name, namespace="kube-node-lease"),
            spec=client.V1LeaseSpec(holder_identity=self.name, lease_duration_seconds=LEASE_SECONDS, renew_time=now),
        )
        try:
            self.coord.patch_namespaced_lease(self.name, "kube-node-lease", {"spec": {"renewTime": _stamp_micro(now)}})
        except client.ApiException as e:
            if e.status != 404:
                raise
            self.coord.create_namespaced_lease("kube-node-lease", body)

    def _run(self) -> None:
        last_lease = time.monotonic()
        while not self._stop.wait(0.2):
            try:
                if time.monotonic() - last_lease > 5:
                    self._renew_lease()
                    last_lease = time.monotonic()
                for pod in self._pods():
                    self._sync(pod)
            except Exception as e:  # keep going: the test's waits report what did not happen
                self.errors.append(getattr(e, "body", None) or repr(e))

    def _sync(self, pod: client.V1Pod) -> None:
        if pod.metadata.deletion_timestamp:
            self._force_delete(pod)
            return
        with self._lock:
            want = self.ready.get(pod.metadata.name, False)
        conds = {c.type: c.status for c in pod.status.conditions or []}
        if pod.status.phase == "Running" and conds.get("Ready") == ("True" if want else "False"):
            return
        self._report(pod, want)

    def _report(self, pod: client.V1Pod, ready: bool) -> None:
        t = _stamp(_now())
        flag = "True" if ready else "False"
        ip = self._ips.setdefault(pod.metadata.uid, f"10.250.{len(self._ips) // 250}.{len(self._ips) % 250 + 1}")
        status = {
            "phase": "Running",
            "podIP": ip,
            "podIPs": [{"ip": ip}],
            "hostIP": "10.0.0.3",
            "startTime": t,
            "conditions": [
                {"type": "Initialized", "status": "True", "lastTransitionTime": t},
                {"type": "PodScheduled", "status": "True", "lastTransitionTime": t},
                {"type": "ContainersReady", "status": flag, "lastTransitionTime": t},
                {"type": "Ready", "status": flag, "lastTransitionTime": t},
            ],
            "containerStatuses": [
                {"name": c.name, "image": c.image, "imageID": "", "ready": ready, "started": True, "restartCount": 0,
                 "state": {"running": {"startedAt": t}}}
                for c in pod.spec.containers
            ],
        }  # fmt: skip
        self.core.patch_namespaced_pod_status(pod.metadata.name, pod.metadata.namespace, {"status": status})

    def _force_delete(self, pod: client.V1Pod) -> None:
        try:
            self.core.delete_namespaced_pod(
                pod.metadata.name,
                pod.metadata.namespace,
                grace_period_seconds=0,
                body=client.V1DeleteOptions(grace_period_seconds=0, preconditions={"uid": pod.metadata.uid}),
            )
        except client.ApiException as e:
            if e.status not in (404, 409):
                raise
