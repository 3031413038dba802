"""A real node beside the kwok ones: a kubelet built from the pinned k8s.io/kubernetes module, Debian's containerd and
runc, and the CNI bridge plugin, joined to the local control plane. Pods placed on it really run: probes, preStop
hooks, downward-API env, read-only roots and projected tokens are the kubelet's own.

What it needs on these machines (docs/development.md, "The real node"): Debian's containerd, runc and
containernetworking-plugins (hack/real-node-tools.sh), root, and a hybrid cgroup v1 host, where kubelet 1.35 only
starts with `failCgroupV1: false`, the cgroupfs driver and `failSwapOn: false`. Everything it writes lives under
`<cluster>/real-node/`, except what the kubelet and containerd insist on (`HOST_DIRS`, the kubelet's sysctls, its
cgroups, the pods' bridge): `start` records what was there before and `stop` puts it back.

Network: the pods' bridge `BRIDGE` holds `POD_CIDR`, a range no interface or route of the machine uses (checked at
start). The pods get no default route and no nameserver, so they reach only each other and the host's bridge address.
Only pods that tolerate `TAINT` land on the node; nothing else of the cluster changes.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from hpd_devcluster import build, cluster, nodenet, pki, versions

NODE_NAME = "real-node-0"
NODE_LABEL = "hybridpd.io/real-node"
TAINT = {"key": NODE_LABEL, "value": "true", "effect": "NoSchedule"}
TOLERATION = {"key": TAINT["key"], "operator": "Equal", "value": TAINT["value"], "effect": TAINT["effect"]}
POD_CIDR = "10.245.0.0/24"
"""Outside kwok's fake pod range (cluster.POD_CIDR), the Service range and every route of these machines."""
BRIDGE = "hpd0"
PAUSE_IMAGE = "localhost/hpd-pause:3.10"
TEST_IMAGE = "localhost/hpd-busybox:1.35"
"""Debian's busybox-static in a scratch image that runs as uid 65534: the tests' small image on the real node."""
TEST_IMAGE_UID = 65534
K8S_NAMESPACE = "k8s.io"
"""containerd namespace of the CRI plugin (the images the kubelet sees)."""

KUBELET_SYSCTLS = ("vm/overcommit_memory", "kernel/panic", "kernel/panic_on_oops")
"""The kubelet sets these at start (protectKernelDefaults off); `stop` restores them."""
HOST_DIRS = (
    "/var/lib/kubelet",
    "/var/log/pods",
    "/var/log/containers",
    "/run/containerd",
    "/run/netns",
    "/var/lib/cni",
)
"""Paths the kubelet, containerd's shims and CNI use whatever their config says; removed at `stop` if `start` made
them."""
CGROUP_ROOT = Path("/sys/fs/cgroup")
KUBELET_CGROUP = "kubepods"


class RealNodeError(cluster.ClusterError):
    pass


@dataclass
class RealNode:
    """What `start` did, saved in `<cluster>/real-node/state.json`, so `stop` (from any process) undoes exactly it."""

    dir: str
    pids: dict[str, int] = field(default_factory=dict)
    sysctls: dict[str, str] = field(default_factory=dict)
    made_dirs: list[str] = field(default_factory=list)
    ports: dict[str, int] = field(default_factory=dict)

    @property
    def root(self) -> Path:
        return Path(self.dir)

    @property
    def socket(self) -> Path:
        return self.root / "containerd" / "containerd.sock"

    @property
    def logs(self) -> Path:
        return self.root / "logs"

    def save(self) -> None:
        (self.root / "state.json").write_text(json.dumps(asdict(self), indent=2))

    @classmethod
    def load(cls, state: cluster.ClusterState) -> RealNode | None:
        path = node_dir(state) / "state.json"
        return cls(**json.loads(path.read_text())) if path.exists() else None


def node_dir(state: cluster.ClusterState) -> Path:
    return state.root / "real-node"


# --- tools and binaries ------------------------------------------------------------------------------------------


def bin_dir(root: Path | None = None) -> Path:
    return (root or build.cache_dir()) / "bin" / f"kubelet-v{versions.KUBERNETES}"


def missing_tools() -> list[str]:
    """Debian packages the real node needs that are not installed (hack/real-node-tools.sh installs them)."""
    need = {"containerd": shutil.which("containerd"), "runc": shutil.which("runc"), "ctr": shutil.which("ctr"),
            "containernetworking-plugins": Path("/usr/lib/cni/bridge").exists() or None,
            "busybox-static": _installed("busybox-static"), "iproute2": shutil.which("ip"),
            "gcc": shutil.which("gcc")}  # fmt: skip
    return [pkg for pkg, found in need.items() if not found]


def _installed(package: str) -> bool | None:
    proc = subprocess.run(["dpkg-query", "-W", "-f=${Status}", package], capture_output=True, text=True, check=False)
    return proc.stdout.endswith("installed") or None


def ensure_built(root: Path | None = None) -> Path:
    """kubelet and kube-proxy (k8s.io/kubernetes/cmd/... at versions.KUBERNETES) and the static `pause` of the same module's
    build/pause/linux/pause.c, built once into `<cache>/bin/kubelet-v<ver>/`; returns that directory."""
    root = root or build.cache_dir()
    dest = bin_dir(root)
    if all(os.access(dest / b, os.X_OK) for b in ("kubelet", "kube-proxy", "pause")):
        return dest
    logs = root / "logs"
    log = logs / f"kubelet-v{versions.KUBERNETES}.log"
    t0 = time.monotonic()
    build._say(f"building kubelet, kube-proxy and pause into {dest} (once; log in {log}) ...")
    with tempfile.TemporaryDirectory(prefix="hpd-kubelet-") as tmp:
        staged = Path(tmp) / "out"
        build.build_kubernetes_commands(("kubelet", "kube-proxy"), staged, log)
        info = json.loads(
            build._run("pause: locate k8s.io/kubernetes", ["go", "mod", "download", "-json",
                       f"k8s.io/kubernetes@v{versions.KUBERNETES}"], cwd=Path(tmp), log=log, env=build._go_env(root))
        )  # fmt: skip
        source = Path(info["Dir"]) / "build" / "pause" / "linux" / "pause.c"
        build._run("pause: gcc -static", ["gcc", "-Os", "-Wall", "-Werror", "-static",
                   f"-DVERSION=v{versions.KUBERNETES}-hpd", "-o", str(staged / "pause"), str(source)],
                   cwd=Path(tmp), log=log, env=dict(os.environ))  # fmt: skip
        build._install_atomically(staged, dest)
    build._say(f"  done in {time.monotonic() - t0:.0f} s")
    return dest


# --- images (buildah, as the project's images; imported into containerd from a docker-archive, no registry) -----


def _scratch_image(ref: str, files: Path, config: list[str]) -> None:
    """`ref` in the project's buildah store: `files` copied onto an empty root, then `buildah config` `config`."""
    from hpd_devcluster import images  # images imports yaml, which `up` without a real node must not need

    if images.exists(ref):
        return
    name = images._run(f"from-scratch-{ref.rsplit('/', 1)[-1]}", [*images.buildah(), "from", "scratch"],
                       capture=True).strip()  # fmt: skip
    try:
        images._run("copy", [*images.buildah(), "copy", name, f"{files}/.", "/"])
        images._run("config", [*images.buildah(), "config", *config, name])
        images._run("commit", [*images.buildah(), "commit", "--rm", name, ref])
    except BaseException:
        subprocess.run([*images.buildah(), "rm", name], capture_output=True, check=False)
        raise


def ensure_node_images(bins: Path) -> dict[str, Path]:
    """The pause and test images as docker-archives (one per image, cached by content) ready for `ctr import`."""
    from hpd_devcluster import images

    out: dict[str, Path] = {}
    with tempfile.TemporaryDirectory(prefix="hpd-node-img-") as tmp:
        pause_root = Path(tmp) / "pause"
        pause_root.mkdir()
        shutil.copy2(bins / "pause", pause_root / "pause")
        busy_root = Path(tmp) / "busybox"
        (busy_root / "bin").mkdir(parents=True)
        (busy_root / "tmp").mkdir(mode=0o1777)
        shutil.copy2("/bin/busybox", busy_root / "bin" / "busybox")
        applets = subprocess.run(["/bin/busybox", "--list"], capture_output=True, text=True, check=True).stdout.split()
        for applet in applets:
            if applet != "busybox":
                (busy_root / "bin" / applet).symlink_to("busybox")
        (busy_root / "etc").mkdir()
        (busy_root / "etc" / "passwd").write_text(f"root:x:0:0::/:/bin/sh\nnobody:x:{TEST_IMAGE_UID}:"
                                                  f"{TEST_IMAGE_UID}::/tmp:/bin/sh\n")  # fmt: skip
        specs = {
            PAUSE_IMAGE: (pause_root, ["--entrypoint", '["/pause"]', "--user", "65535:65535"]),
            TEST_IMAGE: (busy_root, ["--cmd", '["/bin/sh"]', "--env", "PATH=/bin",
                                     "--user", f"{TEST_IMAGE_UID}:{TEST_IMAGE_UID}"]),
        }  # fmt: skip
        for ref, (files, config) in specs.items():
            archive = images.root() / "archives" / (ref.rsplit("/", 1)[-1].replace(":", "_") + ".tar")
            with images._lock(f"node-{ref.rsplit('/', 1)[-1]}"):
                built_now = not images.exists(ref)
                _scratch_image(ref, files, config)
                if built_now or not archive.exists():
                    archive.parent.mkdir(parents=True, exist_ok=True)
                    archive.unlink(missing_ok=True)
                    images._run("push", [*images.buildah(), "push", ref, f"docker-archive:{archive}:{ref}"])
            out[ref] = archive
    return out


def import_image(node: RealNode, archive: Path, ref: str | None = None) -> None:
    """Load a docker- or OCI-archive into the node's containerd (what the kubelet runs with imagePullPolicy Never);
    nothing to do when the node already has `ref`."""
    if ref is not None and ref in _ctr(node, "images", "ls", "-q").split():
        return
    _ctr(node, "images", "import", "--no-unpack=false", str(archive))


def _ctr(node: RealNode, *args: str) -> str:
    argv = ["ctr", "--address", str(node.socket), "--namespace", K8S_NAMESPACE, *args]
    proc = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=120)
    if proc.returncode != 0:
        raise RealNodeError(f"ctr {' '.join(args[:2])}", None, proc.stderr.strip())
    return proc.stdout


# --- host checks and side effects -----------------------------------------------------------------------------


def _ip_json(*args: str) -> list[dict[str, Any]]:
    out = subprocess.run(["ip", "-j", *args], capture_output=True, text=True, check=True).stdout
    return json.loads(out or "[]")  # type: ignore[no-any-return]


def check_pod_range() -> None:
    """Refuse to start if any interface address or route other than our own bridge's overlaps POD_CIDR."""
    net = ipaddress.ip_network(POD_CIDR)
    for link in _ip_json("-4", "addr"):
        if link.get("ifname") == BRIDGE:
            continue
        for addr in link.get("addr_info", []):
            iface = ipaddress.ip_interface(f"{addr['local']}/{addr['prefixlen']}")
            if iface.network.overlaps(net):
                raise RealNodeError("pod range", None, f"{POD_CIDR} overlaps {iface} on {link['ifname']}")
    for route in _ip_json("-4", "route"):
        if route.get("dev") == BRIDGE or route.get("dst") in (None, "default"):
            continue
        if ipaddress.ip_network(route["dst"], strict=False).overlaps(net):
            raise RealNodeError("pod range", None, f"{POD_CIDR} overlaps the route {route}")


def _read_sysctls() -> dict[str, str]:
    return {name: (Path("/proc/sys") / name).read_text().strip() for name in KUBELET_SYSCTLS}


def _mounts_under(prefixes: tuple[str, ...]) -> list[str]:
    mounts = []
    for line in Path("/proc/self/mounts").read_text().splitlines():
        target = line.split()[1].replace("\\040", " ")
        if any(target == p or target.startswith(p.rstrip("/") + "/") for p in prefixes):
            mounts.append(target)
    return sorted(set(mounts), key=len, reverse=True)


def _unmount_all(prefixes: tuple[str, ...]) -> None:
    for _ in range(5):  # a bind mount of a mount point shows once per layer
        targets = _mounts_under(prefixes)
        if not targets:
            return
        for target in targets:
            subprocess.run(["umount", target], capture_output=True, check=False)
    for target in _mounts_under(prefixes):
        subprocess.run(["umount", "-l", target], capture_output=True, check=False)


def _remove_cgroups() -> list[str]:
    """rmdir the kubelet's `kubepods` tree in every cgroup v1 hierarchy (deepest first; only empty cgroups go)."""
    removed = []
    for top in sorted(CGROUP_ROOT.glob(f"*/{KUBELET_CGROUP}")):
        for dirpath, _dirs, _files in sorted(os.walk(top), key=lambda w: len(w[0]), reverse=True):
            with contextlib.suppress(OSError):
                os.rmdir(dirpath)
                removed.append(dirpath)
    return removed


# --- start ------------------------------------------------------------------------------------------------------


def _containerd_config(node: RealNode) -> str:
    r = node.root
    return f"""version = 2
root = "{r / "containerd" / "root"}"
state = "{r / "containerd" / "state"}"
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.zfs"]
[grpc]
  address = "{node.socket}"
[ttrpc]
  address = "{node.socket}.ttrpc"
[debug]
  address = ""
[metrics]
  address = ""
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{PAUSE_IMAGE}"
  # This machine's root lacks CAP_SYS_RESOURCE: lowering oom_score_adj fails, and every sandbox with it
  # (runc: "can't get final child's PID from pipe: EOF").
  restrict_oom_score_adj = true
  enable_selinux = false
  [plugins."io.containerd.grpc.v1.cri".containerd]
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "{r / "cni" / "net.d"}"
"""


def _cni_config(node: RealNode) -> dict[str, Any]:
    """bridge + host-local: no default route and no masquerade, so a pod reaches only POD_CIDR and, through the
    host (kube-proxy, nodenet.py), the Service range."""
    return {
        "cniVersion": "0.4.0",
        "name": "hpd-real-node",
        "plugins": [{
            "type": "bridge", "bridge": BRIDGE, "isGateway": True, "ipMasq": False, "hairpinMode": True,
            "ipam": {"type": "host-local", "ranges": [[{"subnet": POD_CIDR}]],
                     "routes": [{"dst": cluster.SERVICE_CIDR}],
                     "dataDir": str(node.root / "cni" / "ipam")},
        }],
    }  # fmt: skip


def _kubelet_config(state: cluster.ClusterState, node: RealNode) -> dict[str, Any]:
    return {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "address": "127.0.0.1",
        "port": node.ports["kubelet"],
        "readOnlyPort": 0,
        "healthzBindAddress": "127.0.0.1",
        "healthzPort": node.ports["kubelet_healthz"],
        "authentication": {"anonymous": {"enabled": False}, "webhook": {"enabled": True},
                           "x509": {"clientCAFile": str(state.pki / "ca.crt")}},
        "authorization": {"mode": "Webhook"},
        # A hybrid cgroup v1/v2 host (docs/development.md): kubelet 1.35 refuses cgroup v1 unless told.
        "failCgroupV1": False,
        "cgroupDriver": "cgroupfs",
        "failSwapOn": False,
        "containerRuntimeEndpoint": f"unix://{node.socket}",
        "podLogsDir": str(node.root / "pod-logs"),
        "resolvConf": "",  # no upstream nameserver: the pods resolve nothing outside the cluster
        "clusterDomain": nodenet.CLUSTER_DOMAIN,
        "clusterDNS": [nodenet.host_ip(POD_CIDR)],  # CoreDNS on the bridge's host address (nodenet.py)
        "registerWithTaints": [TAINT],
        "maxPods": 30,
        "serializeImagePulls": False,
        "imageGCHighThresholdPercent": 100,
        "evictionHard": {"memory.available": "100Mi", "nodefs.available": "1%", "imagefs.available": "1%"},
        "nodeStatusReportFrequency": "10s",
        "syncFrequency": "10s",
        "fileCheckFrequency": "1h",
        "staticPodPath": "",
        "rotateCertificates": False,
        "serverTLSBootstrap": False,
    }  # fmt: skip


def _spawn(node: RealNode, name: str, argv: list[str]) -> None:
    node.logs.mkdir(parents=True, exist_ok=True)
    with (node.logs / f"{name}.log").open("ab") as log:
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True, cwd=node.root)  # fmt: skip
    cluster._CHILDREN[proc.pid] = proc
    node.pids[name] = proc.pid
    node.save()


def _wait(node: RealNode, step: str, check: Any, timeout: float, log: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(Exception):
            if check():
                return
        for name, pid in node.pids.items():
            if not cluster._alive(pid, name):
                raise RealNodeError(step, node.logs / f"{name}.log", f"{name} (pid {pid}) {cluster._exit_status(pid)}")
        time.sleep(0.2)
    raise RealNodeError(step, node.logs / log, "timed out")


def _bind_nodes_group(state: cluster.ClusterState) -> None:
    """The control plane authorizes with RBAC only (no Node authorizer), and the built-in `system:node` binding has
    no subjects: bind the group `system:nodes` to the ClusterRole `system:node`, as the kubelet's cert says."""
    crb = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
           "metadata": {"name": "hpd-devcluster:system:nodes"},
           "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "system:node"},
           "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": "system:nodes"}]}  # fmt: skip
    try:
        cluster.api(state, "POST", "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings", crb)
    except urllib.error.HTTPError as exc:
        if exc.code != 409:
            raise


def _node_ready(state: cluster.ClusterState) -> bool:
    node = cluster.api(state, "GET", f"/api/v1/nodes/{NODE_NAME}")
    conds = node.get("status", {}).get("conditions", [])
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conds)


def _patch(state: cluster.ClusterState, path: str, patch: dict[str, Any]) -> None:
    req = urllib.request.Request(state.server + path, data=json.dumps(patch).encode(), method="PATCH",
                                 headers={"Content-Type": "application/merge-patch+json"})  # fmt: skip
    with urllib.request.urlopen(req, context=cluster._ssl_context(state), timeout=10):
        pass


def _initialize_node(state: cluster.ClusterState, taint: bool, gpus: int) -> None:
    """What a cloud controller does for a kubelet run with `--cloud-provider=external`: set the Node's addresses and
    lift the `uninitialized` taint. The kubelet listens on 127.0.0.1 but refuses `--node-ip=127.0.0.1` ("nodeIP can't
    be loopback"); on its own it reports the machine's eth0 address, where the apiserver's logs/exec requests would go.
    With an external cloud provider it leaves addresses alone once the Node has some."""
    addresses = [{"type": "InternalIP", "address": "127.0.0.1"}, {"type": "Hostname", "address": NODE_NAME}]
    status: dict[str, Any] = {"addresses": addresses}
    if gpus:  # a plain extended resource, as a node's admin may advertise one: no device plugin, no GPU behind it
        status["capacity"] = {cluster.GPU_RESOURCE: str(gpus)}
    _patch(state, f"/api/v1/nodes/{NODE_NAME}/status", {"status": status})
    _patch(state, f"/api/v1/nodes/{NODE_NAME}", {"spec": {"taints": [TAINT] if taint else None}})


def _node_addresses(state: cluster.ClusterState) -> list[dict[str, str]]:
    node = cluster.api(state, "GET", f"/api/v1/nodes/{NODE_NAME}")
    return node.get("status", {}).get("addresses", [])  # type: ignore[no-any-return]


def start(state: cluster.ClusterState, timeout: float = 120.0, taint: bool = True, gpus: int = 0) -> RealNode:
    """Start containerd and the kubelet for the cluster `state`, import the node images, wait until the Node is
    Ready with InternalIP 127.0.0.1. Idempotent: a running node of this cluster is returned as is.

    `taint`: only pods that tolerate TAINT land here (beside kwok nodes); without it (a cluster with no kwok node,
    the demo) every pod does. `gpus`: the Node advertises that many `nvidia.com/gpu` as a plain extended resource,
    so the operator's engine pods (their GPU limit is at least tensorParallelSize) are scheduled here; nothing backs
    it, and only the CPU engine stand-in (`ensure_engine_standin`) runs in them."""
    existing = RealNode.load(state)
    if existing is not None and all(cluster._alive(pid, name) for name, pid in existing.pids.items()):
        return existing
    if existing is not None:
        stop(state)
    if os.geteuid() != 0:
        raise RealNodeError("real node", None, "needs root (containerd, runc, network namespaces)")
    if missing := missing_tools():
        raise RealNodeError(
            "real node tools", None, f"not installed: {', '.join(missing)}; run hack/real-node-tools.sh"
        )
    other = _other_owner(state)
    if other:
        raise RealNodeError("real node", None, f"cluster {other!r} runs a real node on this machine (one at a time)")
    check_pod_range()
    bins = ensure_built()
    coredns = nodenet.ensure_coredns()
    from hpd_devcluster import images

    try:
        archives = ensure_node_images(bins)
    except images.ImageError as exc:
        raise RealNodeError("real node images", None, str(exc)) from exc

    root = node_dir(state)
    shutil.rmtree(root, ignore_errors=True)
    (root / "cni" / "net.d").mkdir(parents=True)
    port_names = ("kubelet", "kubelet_healthz", "kube_proxy_healthz", "kube_proxy_metrics")
    node = RealNode(dir=str(root), ports=dict(zip(port_names, cluster._free_ports(4), strict=True)))
    node.made_dirs = [d for d in HOST_DIRS if not os.path.lexists(d)]
    node.sysctls = _read_sysctls()
    node.save()
    _owner_file().write_text(state.name)
    try:
        _make_bridge()
        (root / "containerd.toml").write_text(_containerd_config(node))
        (root / "cni" / "net.d" / "10-hpd.conflist").write_text(json.dumps(_cni_config(node), indent=2))
        _spawn(node, "containerd", ["containerd", "--config", str(root / "containerd.toml")])
        _wait(node, "containerd serves", lambda: _ctr(node, "version") != "", 30, "containerd.log")
        for archive in archives.values():
            import_image(node, archive)

        pki.add_client(state.pki, pki.ClientCert("kubelet", f"system:node:{NODE_NAME}", "system:nodes"))
        (root / "kubelet.kubeconfig").write_text(pki.kubeconfig(state.server, state.pki, "kubelet"))
        (root / "kubelet.json").write_text(json.dumps(_kubelet_config(state, node), indent=2))
        _bind_nodes_group(state)
        _spawn(node, "kubelet", [
            str(bins / "kubelet"), f"--config={root / 'kubelet.json'}", f"--kubeconfig={root / 'kubelet.kubeconfig'}",
            f"--root-dir={root / 'kubelet'}", f"--cert-dir={root / 'kubelet-pki'}", f"--hostname-override={NODE_NAME}",
            f"--node-labels={NODE_LABEL}=true", "--cloud-provider=external", "--v=1",
        ])  # fmt: skip
        _wait(node, "real node Ready", lambda: _node_ready(state), timeout, "kubelet.log")
        _initialize_node(state, taint, gpus)
        _wait(node, "real node InternalIP 127.0.0.1",
              lambda: {"type": "InternalIP", "address": "127.0.0.1"} in _node_addresses(state), 30, "kubelet.log")  # fmt: skip
        _start_network(state, node, bins, coredns)
    except BaseException:
        stop(state)
        raise
    return node


def _make_bridge() -> None:
    """The pods' bridge with the host's address, before CNI's first pod: CoreDNS binds that address (CNI's bridge
    plugin takes a bridge that exists, with its gateway address)."""
    gateway = f"{nodenet.host_ip(POD_CIDR)}/{ipaddress.ip_network(POD_CIDR).prefixlen}"
    subprocess.run(["ip", "link", "delete", BRIDGE], capture_output=True, check=False)
    for argv in (["link", "add", BRIDGE, "type", "bridge"], ["addr", "add", gateway, "dev", BRIDGE],
                 ["link", "set", BRIDGE, "up"]):  # fmt: skip
        proc = subprocess.run(["ip", *argv], capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            raise RealNodeError(f"ip {' '.join(argv)}", None, proc.stderr.strip())


def _start_network(state: cluster.ClusterState, node: RealNode, bins: Path, coredns: Path) -> None:
    """kube-proxy, CoreDNS and the apiserver's address for the pods (nodenet.py); waits until kube-proxy synced its
    rules and CoreDNS answers for the `kubernetes` Service."""
    configs = nodenet.write_configs(state, node.root, NODE_NAME, POD_CIDR, node.ports)
    nodenet.add_apiserver_rule(BRIDGE, state.ports["apiserver"])
    _spawn(node, "kube-proxy", [str(bins / "kube-proxy"), f"--config={configs['kube-proxy']}", "--v=1"])
    _spawn(node, "coredns", [str(coredns), "-conf", str(configs["coredns"])])
    healthz = f"http://127.0.0.1:{node.ports['kube_proxy_healthz']}/healthz"
    _wait(node, "kube-proxy synced", lambda: cluster._url_ok(healthz), 60, "kube-proxy.log")
    name = f"kubernetes.default.svc.{nodenet.CLUSTER_DOMAIN}"
    _wait(node, "CoreDNS answers", lambda: nodenet.resolve(name, nodenet.host_ip(POD_CIDR)) ==
          nodenet.KUBERNETES_SERVICE_IP, 60, "coredns.log")  # fmt: skip


def _owner_file() -> Path:
    return build.cache_dir() / "real-node.owner"


def _other_owner(state: cluster.ClusterState) -> str | None:
    """The name of another cluster whose real node still runs here (containerd's shims and /var/log/containers
    are per machine, so one real node at a time)."""
    path = _owner_file()
    if not path.exists():
        return None
    name = path.read_text().strip()
    if name == state.name:
        return None
    other = cluster.ClusterState.load(name)
    node = RealNode.load(other) if other is not None else None
    if node is not None and any(cluster._alive(pid, proc) for proc, pid in node.pids.items()):
        return name
    return None


# --- stop -------------------------------------------------------------------------------------------------------


def _delete_pods(state: cluster.ClusterState, node: RealNode, timeout: float = 60.0) -> None:
    """Delete every pod on the node (grace 0) while the kubelet runs, and wait until containerd runs no task: the
    kubelet stops the sandboxes, so CNI releases their addresses and the network namespaces go."""
    with contextlib.suppress(urllib.error.URLError, OSError, ValueError):
        pods = cluster.api(state, "GET", f"/api/v1/pods?fieldSelector=spec.nodeName%3D{NODE_NAME}")["items"]
        for pod in pods:
            meta = pod["metadata"]
            with contextlib.suppress(urllib.error.HTTPError):
                cluster.api(state, "DELETE", f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}",
                            {"gracePeriodSeconds": 0})  # fmt: skip
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and cluster._alive(node.pids.get("kubelet", 0), "kubelet"):
        try:
            if not _running_tasks(node):
                return
        except RealNodeError:
            return
        time.sleep(0.5)


def _running_tasks(node: RealNode) -> list[str]:
    lines = _ctr(node, "tasks", "ls").splitlines()[1:]
    return [ln.split()[0] for ln in lines if ln.split() and ln.split()[-1] == "RUNNING"]


def _force_remove_containers(node: RealNode) -> None:
    """What the kubelet left: kill every task of the CRI namespace, then delete tasks and containers."""
    with contextlib.suppress(RealNodeError, subprocess.TimeoutExpired, OSError):
        for task in _running_tasks(node):
            with contextlib.suppress(RealNodeError):
                _ctr(node, "tasks", "kill", "--signal", "SIGKILL", task)
        deadline = time.monotonic() + 10
        while _running_tasks(node) and time.monotonic() < deadline:
            time.sleep(0.2)
        for line in _ctr(node, "tasks", "ls").splitlines()[1:]:
            if line.split():
                with contextlib.suppress(RealNodeError):
                    _ctr(node, "tasks", "delete", "--force", line.split()[0])
        for cid in _ctr(node, "containers", "ls", "-q").split():
            with contextlib.suppress(RealNodeError):
                _ctr(node, "containers", "delete", cid)


def _stop_pid(name: str, pid: int, grace: float) -> None:
    if not cluster._alive(pid, name):
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGTERM)
    end = time.monotonic() + grace
    while cluster._alive(pid, name) and time.monotonic() < end:
        time.sleep(0.05)
    if cluster._alive(pid, name):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGKILL)


def _our_shims(node: RealNode) -> list[int]:
    """PIDs of containerd-shim processes serving our containerd (their command line names its socket)."""
    pids = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if argv and os.path.basename(argv[0].decode(errors="replace")).startswith("containerd-shim") and \
                str(node.socket).encode() in argv:  # fmt: skip
            pids.append(int(proc.name))
    return pids


def stop(state: cluster.ClusterState) -> list[str]:
    """Undo `start`: pods, kubelet, containers, containerd and its shims, mounts, the bridge, the kubelet's
    cgroups and sysctls, the host directories it made. Safe to call twice; returns what it stopped."""
    node = RealNode.load(state)
    if node is None:
        return []
    stopped: list[str] = []
    kubelet_pid = node.pids.get("kubelet")
    if kubelet_pid and cluster._alive(kubelet_pid, "kubelet"):
        _delete_pods(state, node)
        _stop_pid("kubelet", kubelet_pid, 10)
        stopped.append("kubelet")
    for name in ("kube-proxy", "coredns"):
        pid = node.pids.get(name)
        if pid and cluster._alive(pid, name):
            _stop_pid(name, pid, 10)
            stopped.append(name)
    containerd_pid = node.pids.get("containerd")
    if containerd_pid and cluster._alive(containerd_pid, "containerd"):
        _force_remove_containers(node)
        _stop_pid("containerd", containerd_pid, 10)
        stopped.append("containerd")
    for pid in _our_shims(node):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    _unmount_all((str(node.root), "/run/containerd", "/run/netns", *node.made_dirs))
    nodenet.cleanup(bin_dir() / "kube-proxy")
    subprocess.run(["ip", "link", "delete", BRIDGE], capture_output=True, check=False)
    for name, value in node.sysctls.items():
        with contextlib.suppress(OSError):
            (Path("/proc/sys") / name).write_text(value + "\n")
    _remove_cgroups()
    for path in node.made_dirs:
        shutil.rmtree(path, ignore_errors=True)
    with contextlib.suppress(urllib.error.URLError, OSError, cluster.ClusterError):
        cluster.api(state, "DELETE", f"/api/v1/nodes/{NODE_NAME}")
    shutil.rmtree(node.root / "containerd", ignore_errors=True)
    shutil.rmtree(node.root / "kubelet", ignore_errors=True)
    (node.root / "state.json").unlink(missing_ok=True)
    if _owner_file().exists() and _owner_file().read_text().strip() == state.name:
        _owner_file().unlink()
    return stopped


# --- the engine stand-in (test-only image variant) ---------------------------------------------------------------

STANDIN_SOURCES = ("tests/runtime/fake_vllm.py", "tests/runtime/vllm_metrics.py")
"""The runtime tests' vLLM stand-in; copied into a test-only variant of the vllm image, never into a release image."""
STANDIN_DIR = "/opt/hpd-test-standin"
STANDIN_REPO = "localhost/hpd-vllm-test-standin"


def ensure_engine_standin() -> tuple[str, Path]:
    """The vllm image (images.ensure_image("vllm"): hpd_runtime launch, warmup, probes, drain as released) with
    HPD_VLLM_COMMAND pointing at the runtime tests' fake vLLM instead of vLLM (no GPU here). Returns the image
    reference and a docker-archive of it for `import_image`. Tagged by a hash of the vllm image and the stand-in."""
    from hpd_devcluster import images

    base = images.ensure_image("vllm")
    repo = Path(images.REPO)
    ref = f"{STANDIN_REPO}:{images._hash(base, *((repo / s).read_bytes() for s in STANDIN_SOURCES))}"
    archive = images.root() / "archives" / (ref.rsplit("/", 1)[-1].replace(":", "_") + ".tar")
    with images._lock("vllm-test-standin"):
        if not images.exists(ref):
            name = images._run("standin-from", [*images.buildah(), "from", "--pull-never", base], capture=True).strip()
            try:
                images._run("standin-copy", [*images.buildah(), "copy", name,
                                             *(str(repo / s) for s in STANDIN_SOURCES), STANDIN_DIR + "/"])  # fmt: skip
                command = f"python3 {STANDIN_DIR}/fake_vllm.py"
                images._run("standin-config", [*images.buildah(), "config", "--env", f"HPD_VLLM_COMMAND={command}",
                                               "--label", "hybridpd.io/test-only=true", name])  # fmt: skip
                images._run("standin-commit", [*images.buildah(), "commit", "--rm", name, ref])
            except BaseException:
                subprocess.run([*images.buildah(), "rm", name], capture_output=True, check=False)
                raise
        if not archive.exists():
            archive.parent.mkdir(parents=True, exist_ok=True)
            partial = archive.with_suffix(".partial")
            partial.unlink(missing_ok=True)
            images._run("standin-push", [*images.buildah(), "push", ref, f"docker-archive:{partial}:{ref}"])
            partial.rename(archive)
            _prune_standins(ref, archive)
    return ref, archive


def _prune_standins(keep_ref: str, keep_archive: Path) -> None:
    """Older stand-in builds (a new one follows every change of the wheel's sources): their archive and image."""
    from hpd_devcluster import images

    for old in keep_archive.parent.glob(STANDIN_REPO.rsplit("/", 1)[-1] + "_*.tar"):
        if old != keep_archive:
            old.unlink(missing_ok=True)
    listed = subprocess.run([*images.buildah(), "images", "--json", "--filter", f"reference={STANDIN_REPO}"],
                            capture_output=True, text=True, env=images._env(), check=False)  # fmt: skip
    if listed.returncode != 0 or not listed.stdout.strip():
        return
    for image in json.loads(listed.stdout):
        if not any(keep_ref in name for name in image.get("names") or []):
            subprocess.run([*images.buildah(), "rmi", image["id"]], capture_output=True, env=images._env(), check=False)


# --- the project's images on the node (the demo) ------------------------------------------------------------------


def _archive(ref: str) -> Path:
    """A docker-archive of the buildah image `ref` (written once per reference) for `import_image`."""
    from hpd_devcluster import images

    archive = images.root() / "archives" / (ref.rsplit("/", 1)[-1].replace(":", "_") + ".tar")
    if not archive.exists():
        archive.parent.mkdir(parents=True, exist_ok=True)
        partial = archive.with_suffix(".partial")
        partial.unlink(missing_ok=True)
        images._run(f"push-{ref}", [*images.buildah(), "push", ref, f"docker-archive:{partial}:{ref}"])
        partial.rename(archive)
        prefix = ref.rsplit("/", 1)[-1].split(":", 1)[0] + "_"
        for old in archive.parent.glob(prefix + "*.tar"):  # earlier builds of the same image
            if old != archive:
                old.unlink(missing_ok=True)
    return archive


def load_images(state: cluster.ClusterState, names: tuple[str, ...] = ("operator", "router")) -> dict[str, str]:
    """The images `names` (images.ensure_image) and the engine stand-in, built if their inputs changed and imported
    into the running real node's containerd: {"operator": ref, "router": ref, "engine": ref}."""
    from hpd_devcluster import images

    node = RealNode.load(state)
    if node is None:
        raise RealNodeError("load images", None, f"cluster {state.name!r} runs no real node (up --real-node)")
    refs: dict[str, str] = {name: images.ensure_image(name) for name in images.IMAGE_NAMES if name in names}
    for ref in refs.values():
        import_image(node, _archive(ref), ref)
    engine, archive = ensure_engine_standin()
    import_image(node, archive, engine)
    return {**refs, "engine": engine}
