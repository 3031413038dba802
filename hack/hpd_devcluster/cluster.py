"""Start, inspect and stop a real local control plane on 127.0.0.1.

etcd + kube-apiserver + kube-controller-manager + kube-scheduler + kwok, each a child process in its own
session, logs under `<cache>/clusters/<name>/logs/`, PIDs and ports in `state.json` so `teardown` (from any
process) stops exactly what `start` started. Callers use lifecycle.py (`up`, `down`, `running`), which also
stops a real node (realnode.py) before the control plane; this module knows nothing of the real node. kwok
manages fake GPU nodes created here, so pods that request `nvidia.com/gpu` are scheduled and reach Running/Ready;
pods that ask for more than a node has stay Pending.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from hpd_devcluster import build, pki
from hpd_devcluster import state as _state

DEFAULT_NAME = "default"
KWOK_ANNOTATION = "kwok.x-k8s.io/node"
GPU_RESOURCE = "nvidia.com/gpu"
GPU_PRODUCT_LABEL = "nvidia.com/gpu.product"
SERVICE_CIDR = "10.0.0.0/24"
HPA_SYNC_SECONDS = 5
POD_CIDR = "10.244.0.0/16"
KWOK_STORAGE_CLASS = {
    "apiVersion": "storage.k8s.io/v1",
    "kind": "StorageClass",
    "metadata": {"name": "kwok-volume", "annotations": {"storageclass.kubernetes.io/is-default-class": "true"}},
    "provisioner": "kwok.x-k8s.io/volume",
    "reclaimPolicy": "Delete",
    "volumeBindingMode": "Immediate",
}
PROCESS_ORDER = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok")

# What cluster.py shares with the add-ons beside it (state.py); the names other modules and tests use from here.
ClusterError = _state.ClusterError
ClusterState = _state.ClusterState
cluster_dir = _state.cluster_dir
api = _state.api
_CHILDREN = _state.CHILDREN
_alive = _state.alive
_free_ports = _state.free_ports
_ssl_context = _state.ssl_context
_url_ok = _state.url_ok


@dataclass(frozen=True)
class NodePool:
    count: int = 4
    gpus_per_node: int = 8
    gpu_product: str = "NVIDIA-H200"
    gpu_memory_mib: int = 143771
    pods_per_node: int = 110
    cpu: str = "128"
    memory: str = "2Ti"


def _insecure() -> ssl.SSLContext:
    """kcm/scheduler serve /healthz with a self-signed cert they make at start; loopback only."""
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    return ctx


def _wait(step: str, check: Callable[[], bool], deadline: float, state: ClusterState, log: str | None) -> None:
    while time.monotonic() < deadline:
        if check():
            return
        for proc, pid in state.pids.items():
            if not _alive(pid, proc):
                raise ClusterError(step, state.logs / f"{proc}.log", f"{proc} (pid {pid}) {_exit_status(pid)}")
        time.sleep(0.2)
    raise ClusterError(step, state.logs / log if log else None, "timed out")


# --- processes -------------------------------------------------------------------------------------------------


def _exit_status(pid: int) -> str:
    proc = _CHILDREN.get(pid)
    if proc is None or proc.poll() is None:
        return "exited"
    code = proc.returncode
    return f"exited with status {code}" if code >= 0 else f"was killed by signal {-code}"


def _start(state: ClusterState, process: str, argv: list[str]) -> None:
    state.logs.mkdir(parents=True, exist_ok=True)
    with (state.logs / f"{process}.log").open("ab") as log:
        proc = subprocess.Popen(
            argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True, cwd=state.root
        )
    state.pids[process] = proc.pid
    state.argv[process] = list(argv)
    _CHILDREN[proc.pid] = proc
    state.save()


def _write_kubeconfigs(state: ClusterState) -> None:
    for client in ("admin", "kcm", "scheduler", "kwok"):
        name = "kubeconfig" if client == "admin" else f"{client}.kubeconfig"
        (state.root / name).write_text(pki.kubeconfig(state.server, state.pki, client))


def _node_manifest(name: str, pool: NodePool) -> dict[str, Any]:
    resources = {
        "cpu": pool.cpu,
        "memory": pool.memory,
        "pods": str(pool.pods_per_node),
        "ephemeral-storage": "2Ti",
        GPU_RESOURCE: str(pool.gpus_per_node),
    }
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "annotations": {KWOK_ANNOTATION: "fake", "node.alpha.kubernetes.io/ttl": "0"},
            "labels": {
                "kubernetes.io/hostname": name,
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
                "node.kubernetes.io/instance-type": "fake-gpu-8x",
                "type": "kwok",
                GPU_PRODUCT_LABEL: pool.gpu_product,
                "nvidia.com/gpu.count": str(pool.gpus_per_node),
                "nvidia.com/gpu.memory": str(pool.gpu_memory_mib),
            },
        },
        "spec": {},
        "status": {
            "capacity": resources,
            "allocatable": resources,
            "nodeInfo": {
                "architecture": "amd64",
                "operatingSystem": "linux",
                "kubeletVersion": "fake",
                "kubeProxyVersion": "fake",
            },
            "phase": "Running",
        },
    }


def add_node(
    state: ClusterState,
    name: str,
    pool: NodePool | None = None,
    labels: dict[str, str] | None = None,
    taints: list[dict[str, str]] | None = None,
) -> None:
    """One more kwok GPU node (like the ones `up` makes, plus `labels` and `taints`); kwok marks it Ready. Not
    recorded in `state.nodes` (those are the ones `up` waits for): the caller deletes it with `delete_node`."""
    node = _node_manifest(name, pool or NodePool())
    node["metadata"]["labels"].update(labels or {})
    if taints:
        node["spec"]["taints"] = taints
    api(state, "POST", "/api/v1/nodes", node)


def delete_node(state: ClusterState, name: str) -> bool:
    """Delete the Node object `name` (as a cloud provider does when a machine is gone); False if it did not exist.
    Its pods stay bound to it until the controller-manager's pod GC deletes them (after its 40 s quarantine)."""
    try:
        api(state, "DELETE", f"/api/v1/nodes/{name}")
    except urllib.error.HTTPError as exc:
        if exc.code == 404:
            return False
        raise
    return True


def _nodes_ready(state: ClusterState) -> bool:
    try:
        nodes = api(state, "GET", "/api/v1/nodes")["items"]
    except (urllib.error.URLError, OSError):
        return False
    ready = {
        n["metadata"]["name"]
        for n in nodes
        if any(c["type"] == "Ready" and c["status"] == "True" for c in n.get("status", {}).get("conditions", []))
    }
    return set(state.nodes) <= ready


def healthy(state: ClusterState) -> bool:
    if not all(_alive(pid, proc) for proc, pid in state.pids.items()):
        return False
    if set(state.pids) != set(PROCESS_ORDER):
        return False
    return _url_ok(state.server + "/readyz", _ssl_context(state)) and _nodes_ready(state)


ExtraArgs = Mapping[str, Sequence[str]]
"""Extra command-line flags per process (a key of PROCESS_ORDER), after the defaults (a repeated flag wins)."""


def check_extra_args(extra_args: ExtraArgs | None) -> None:
    unknown = set(extra_args or {}) - set(PROCESS_ORDER)
    if unknown:
        raise ValueError(f"extra_args for unknown processes {sorted(unknown)}; known: {PROCESS_ORDER}")


def start(
    name: str = DEFAULT_NAME, pool: NodePool | None = None, timeout: float = 120.0, extra_args: ExtraArgs | None = None
) -> ClusterState:
    """Start a fresh control plane `name` (the directory of an earlier one is replaced; its logs kept when a start
    is retried). Whatever ran there must be stopped first: lifecycle.up does that (a stale real node included)."""
    check_extra_args(extra_args)
    pool = pool or NodePool()
    bins = build.ensure_binaries()
    attempts = 3
    for attempt in range(1, attempts + 1):
        root = cluster_dir(name)
        if root.exists():
            # keep the failed attempt's logs next to the new ones
            if (root / "logs").exists() and attempt > 1:
                shutil.move(str(root / "logs"), str(root.parent / f"{name}.failed-attempt-{attempt - 1}-logs"))
            shutil.rmtree(root, ignore_errors=True)
        root.mkdir(parents=True)
        ports = dict(zip(("etcd", "etcd_peer", "apiserver", "kcm", "scheduler"), _free_ports(5), strict=True))
        state = ClusterState(name=name, dir=str(root), ports=ports)
        state.save()
        deadline = time.monotonic() + timeout
        try:
            _bring_up(state, bins, pool, deadline, extra_args or {})
            return state
        except ClusterError as exc:
            stop(state)
            if attempt == attempts:
                raise
            # A start can fail for reasons outside the cluster (a port taken between choosing and binding it,
            # a stalled process start on a loaded machine); fresh attempts on new ports, said out loud.
            print(f"[hpd-devcluster] {name}: start failed ({exc}); retrying on new ports", flush=True)
        except BaseException:
            stop(state)
            raise
    raise AssertionError("unreachable")


def _bring_up(state: ClusterState, bins: build.Binaries, pool: NodePool, deadline: float, extra: ExtraArgs) -> None:
    pki.generate(state.pki)
    _write_kubeconfigs(state)
    p, pk = state.ports, state.pki
    etcd_url = f"http://127.0.0.1:{p['etcd']}"
    peer_url = f"http://127.0.0.1:{p['etcd_peer']}"
    _start(state, "etcd", [
        str(bins.etcd), "--name=hpd", f"--data-dir={state.root / 'etcd-data'}", "--unsafe-no-fsync",
        f"--listen-client-urls={etcd_url}", f"--advertise-client-urls={etcd_url}",
        f"--listen-peer-urls={peer_url}", f"--initial-advertise-peer-urls={peer_url}",
        f"--initial-cluster=hpd={peer_url}", *extra.get("etcd", ()),
    ])  # fmt: skip
    _wait(
        "etcd /health", lambda: _url_ok(f"{etcd_url}/health"), min(deadline, time.monotonic() + 30), state, "etcd.log"
    )
    _start(state, "kube-apiserver", [
        str(bins.kube_apiserver), f"--etcd-servers={etcd_url}",
        "--bind-address=127.0.0.1", "--advertise-address=127.0.0.1", f"--secure-port={p['apiserver']}",
        f"--tls-cert-file={pk / 'apiserver.crt'}", f"--tls-private-key-file={pk / 'apiserver.key'}",
        f"--client-ca-file={pk / 'ca.crt'}", "--anonymous-auth=false", "--authorization-mode=RBAC",
        "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
        f"--service-account-key-file={pk / 'sa.pub'}", f"--service-account-signing-key-file={pk / 'sa.key'}",
        f"--service-cluster-ip-range={SERVICE_CIDR}", "--allow-privileged=true",
        # As on hardened clusters (e.g. OpenShift): an ownerReference with blockOwnerDeletion needs `update` on the
        # owner's /finalizers, so the chart's RBAC test proves that rule too.
        "--enable-admission-plugins=OwnerReferencesPermissionEnforcement",
        # The aggregation layer's front proxy, as kubeadm sets it up: requests to an APIService (the metrics
        # adapter's external.metrics.k8s.io) carry this client cert and the caller's identity in X-Remote-*.
        f"--requestheader-client-ca-file={pk / 'ca.crt'}", f"--requestheader-allowed-names={pki.FRONT_PROXY_CN}",
        "--requestheader-username-headers=X-Remote-User", "--requestheader-group-headers=X-Remote-Group",
        "--requestheader-extra-headers-prefix=X-Remote-Extra-",
        f"--proxy-client-cert-file={pk / 'front-proxy.crt'}", f"--proxy-client-key-file={pk / 'front-proxy.key'}",
        "--endpoint-reconciler-type=none", "--profiling=false", "--v=1",
        # The real node's kubelet (realnode.py), when one runs: reached on its Node's InternalIP (127.0.0.1).
        f"--kubelet-client-certificate={pk / 'apiserver-kubelet.crt'}",
        f"--kubelet-client-key={pk / 'apiserver-kubelet.key'}", "--kubelet-preferred-address-types=InternalIP",
        *extra.get("kube-apiserver", ()),
    ])  # fmt: skip
    admin_ctx = _ssl_context(state)
    _wait("kube-apiserver /readyz", lambda: _url_ok(state.server + "/readyz", admin_ctx), deadline, state,
          "kube-apiserver.log")  # fmt: skip
    kcm_kc, sch_kc = state.root / "kcm.kubeconfig", state.root / "scheduler.kubeconfig"
    _start(state, "kube-controller-manager", [
        str(bins.kube_controller_manager), f"--kubeconfig={kcm_kc}",
        f"--authentication-kubeconfig={kcm_kc}", f"--authorization-kubeconfig={kcm_kc}",
        "--bind-address=127.0.0.1", f"--secure-port={p['kcm']}", "--leader-elect=false",
        "--use-service-account-credentials=true", f"--service-account-private-key-file={pk / 'sa.key'}",
        f"--root-ca-file={pk / 'ca.crt'}", f"--cluster-signing-cert-file={pk / 'ca.crt'}",
        f"--cluster-signing-key-file={pk / 'ca.key'}", f"--requestheader-client-ca-file={pk / 'ca.crt'}",
        "--controllers=*,-nodeipam,-service-lb-controller,-cloud-node-lifecycle-controller", "--v=1",
        # The HPA controller's loop (default 15 s): autoscaling roles follow load within seconds here.
        f"--horizontal-pod-autoscaler-sync-period={HPA_SYNC_SECONDS}s",
        *extra.get("kube-controller-manager", ()),
    ])  # fmt: skip
    _start(state, "kube-scheduler", [
        str(bins.kube_scheduler), f"--kubeconfig={sch_kc}", f"--authentication-kubeconfig={sch_kc}",
        f"--authorization-kubeconfig={sch_kc}", f"--requestheader-client-ca-file={pk / 'ca.crt'}",
        "--bind-address=127.0.0.1", f"--secure-port={p['scheduler']}", "--leader-elect=false", "--v=1",
        *extra.get("kube-scheduler", ()),
    ])  # fmt: skip
    _start(state, "kwok", [
        str(bins.kwok), f"--config={bins.kwok_stages}", f"--kubeconfig={state.root / 'kwok.kubeconfig'}", "--manage-all-nodes=false",
        f"--manage-nodes-with-annotation-selector={KWOK_ANNOTATION}=fake",
        "--manage-nodes-with-label-selector=", "--manage-single-node=",
        f"--cidr={POD_CIDR}", "--node-ip=10.0.0.2", "--node-lease-duration-seconds=40", "--server-address=",
        *extra.get("kwok", ()),
    ])  # fmt: skip
    api(state, "POST", "/apis/storage.k8s.io/v1/storageclasses", KWOK_STORAGE_CLASS)
    state.nodes = [f"gpu-node-{i}" for i in range(pool.count)]
    for node in state.nodes:
        api(state, "POST", "/api/v1/nodes", _node_manifest(node, pool))
    state.save()
    insecure = _insecure()
    _wait("kube-controller-manager /healthz", lambda: _url_ok(f"https://127.0.0.1:{p['kcm']}/healthz", insecure),
          deadline, state, "kube-controller-manager.log")  # fmt: skip
    _wait("kube-scheduler /healthz", lambda: _url_ok(f"https://127.0.0.1:{p['scheduler']}/healthz", insecure),
          deadline, state, "kube-scheduler.log")  # fmt: skip
    _wait("kwok nodes Ready", lambda: _nodes_ready(state), deadline, state, "kwok.log")
    _wait("default ServiceAccount", lambda: _default_sa_exists(state), deadline, state, "kube-controller-manager.log")


def _default_sa_exists(state: ClusterState) -> bool:
    try:
        api(state, "GET", "/api/v1/namespaces/default/serviceaccounts/default")
        return True
    except (urllib.error.URLError, OSError):
        return False


def stop(state: ClusterState, grace: float = 10.0) -> list[str]:
    """SIGTERM every started process (reverse start order), SIGKILL what is left after `grace`; return names."""
    order = [p for p in reversed(PROCESS_ORDER) if p in state.pids]
    stopped = [proc for proc in order if _signal(state, proc, signal.SIGTERM)]
    end = time.monotonic() + grace
    for proc in order:
        _reap(state, proc, end, signal.SIGKILL)
    for proc in order:
        _reap(state, proc, time.monotonic() + 5, None)
    return stopped


def _signal(state: ClusterState, proc: str, sig: int) -> bool:
    """Send `sig` to the process group of `proc` if it still runs; True if it did."""
    pid = state.pids[proc]
    if not _alive(pid, proc):
        return False
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, sig)
    return True


def _reap(state: ClusterState, proc: str, until: float, then: int | None) -> None:
    """Wait until `proc` exited or `until`; then send `then` (None: raise if it still runs)."""
    pid = state.pids[proc]
    while _alive(pid, proc) and time.monotonic() < until:
        time.sleep(0.05)
    if not _alive(pid, proc):
        return
    if then is None:
        raise ClusterError(f"stop {proc}", state.logs / f"{proc}.log", f"pid {pid} survived SIGKILL")
    _signal(state, proc, then)


def _ready_check(state: ClusterState, process: str) -> Callable[[], bool]:
    """How `up` knows `process` serves (kwok has no endpoint: its nodes' readiness stands for it)."""
    p, insecure = state.ports, _insecure()
    checks: dict[str, Callable[[], bool]] = {
        "etcd": lambda: _url_ok(f"http://127.0.0.1:{p['etcd']}/health"),
        "kube-apiserver": lambda: _url_ok(state.server + "/readyz", _ssl_context(state)),
        "kube-controller-manager": lambda: _url_ok(f"https://127.0.0.1:{p['kcm']}/healthz", insecure),
        "kube-scheduler": lambda: _url_ok(f"https://127.0.0.1:{p['scheduler']}/healthz", insecure),
        "kwok": lambda: _nodes_ready(state),
    }
    return checks[process]


def restart(state: ClusterState, process: str, grace: float = 3.0, timeout: float = 60.0) -> None:
    """Stop one process of a running cluster (SIGTERM, SIGKILL after `grace`) and start it again with the same
    command line, on the same ports and data; return once it serves again (e.g. kube-apiserver /readyz).

    kube-apiserver stops listening at once on SIGTERM, then waits for open watches up to its request timeout
    (60 s) before it exits: the short default `grace` ends that wait, as a kubelet's SIGKILL would."""
    argv = state.argv.get(process)
    if argv is None:
        raise ClusterError(
            f"restart {process}", None, f"no command line recorded for it (cluster {state.name!r} was started by an "
            f"older hpd_devcluster): python -m hpd_devcluster --name {state.name} down, then up"
        )  # fmt: skip
    _signal(state, process, signal.SIGTERM)
    _reap(state, process, time.monotonic() + grace, signal.SIGKILL)
    _reap(state, process, time.monotonic() + 5, None)
    _start(state, process, argv)
    _wait(f"restart {process}", _ready_check(state, process), time.monotonic() + timeout, state, f"{process}.log")


def teardown(state: ClusterState) -> list[str]:
    """Stop the control plane `start` started and delete its data (logs are kept); return the processes stopped.
    What runs on it (a real node, the LWS controller) is stopped first, by lifecycle.down."""
    stopped = stop(state)
    shutil.rmtree(state.root / "etcd-data", ignore_errors=True)
    (state.root / "state.json").unlink(missing_ok=True)
    return stopped


def env(state: ClusterState) -> dict[str, str]:
    bins = build.binaries()
    path = os.pathsep.join([str(bins.kubectl.parent), os.environ.get("PATH", "")])
    return {"KUBECONFIG": str(state.kubeconfig), "PATH": path}


def listening_ports(state: ClusterState) -> list[int]:
    """Ports of this cluster that still accept connections on 127.0.0.1."""
    open_ports = []
    for port in state.ports.values():
        with socket.socket() as s:
            s.settimeout(0.5)
            if s.connect_ex(("127.0.0.1", port)) == 0:
                open_ports.append(port)
    return open_ports
