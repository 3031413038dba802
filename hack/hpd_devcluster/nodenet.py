"""Service traffic, the apiserver and cluster DNS for the real node's pods (realnode.py starts and stops these).

- **kube-proxy** (iptables mode), built from the same k8s.io/kubernetes module as the control plane: Service
  virtual IPs (cluster.SERVICE_CIDR) route to the node's pods, from the pods and from the host. `masqueradeAll`: a pod
  reaching a Service whose endpoint sits on the same bridge gets its answer back through the host whatever the
  machine's `bridge-nf-call-iptables` says. No NodePorts outside the bridge, no conntrack sysctls, no `route_localnet`
  on every interface (`localhostNodePorts: false`).
- **The apiserver from the pods:** it listens on 127.0.0.1 only. The pods are told `KUBERNETES_SERVICE_HOST` =
  the `kubernetes` Service's ClusterIP (10.0.0.1:443, in the apiserver's certificate); one DNAT rule of our own chain
  `APISERVER_CHAIN`, for packets that arrive on the pods' bridge only, sends that address to 127.0.0.1:<apiserver
  port>, which `route_localnet` on the bridge (and nowhere else) allows. The `kubernetes` Service keeps no endpoints
  (the control plane runs `--endpoint-reconciler-type=none`: an endpoint may not be a loopback address), so
  kube-proxy leaves that address to the rule. Nothing else listens beyond loopback.
- **Cluster DNS:** CoreDNS (github.com/coredns/coredns at `COREDNS`, built with only its `bind`, `errors` and
  `kubernetes` plugins) on the bridge's host address, port 53, serving `cluster.local` from the apiserver and
  nothing else (no `forward`: a name outside the cluster gets REFUSED, never a query to another server). The
  operator renders Service names (decode's HPD_PREFILL_SERVICE `<cr>-prefill-<gen>.<ns>.svc`), so the pods need one.
  It runs on the host, not as a pod: no image to load, and the node's pods stay the operator's alone.

Everything here that changes the host is undone by `stop`: kube-proxy's chains (`kube-proxy --cleanup`), ours, the
kubelet's (`KUBELET_CHAINS`), and the bridge (with its `route_localnet`) goes with realnode.stop.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import secrets
import shlex
import socket
import struct
import subprocess
import tempfile
import time
import urllib.error
from pathlib import Path
from typing import Any

from hpd_devcluster import build, cluster, pki

COREDNS = "1.14.7"
"""github.com/coredns/coredns: the cluster DNS of the real node's pods."""
COREDNS_PLUGINS = ("bind", "errors", "kubernetes")
APISERVER_CHAIN = "HPD-APISERVER"
KUBELET_CHAINS = ("KUBE-FIREWALL", "KUBE-KUBELET-CANARY", "KUBE-IPTABLES-HINT")
"""Chains the kubelet makes in iptables and ip6tables (it has no cleanup of its own)."""
KUBERNETES_SERVICE_IP = str(ipaddress.ip_network(cluster.SERVICE_CIDR)[1])
CLUSTER_DOMAIN = "cluster.local"


def host_ip(pod_cidr: str) -> str:
    """The bridge's address on the host (the pods' gateway, host-local's default): the first of `pod_cidr`."""
    return str(ipaddress.ip_network(pod_cidr)[1])


# --- binaries ----------------------------------------------------------------------------------------------------


def coredns_path(root: Path | None = None) -> Path:
    return (root or build.cache_dir()) / "bin" / f"coredns-v{COREDNS}" / "coredns"


def ensure_coredns(root: Path | None = None) -> Path:
    """CoreDNS with only COREDNS_PLUGINS (a main of our own that imports coremain and them, as CoreDNS documents for
    custom builds), built once into `<cache>/bin/coredns-v<ver>/`."""
    root = root or build.cache_dir()
    dest = coredns_path(root)
    if os.access(dest, os.X_OK):
        return dest
    log = root / "logs" / f"coredns-v{COREDNS}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    log.unlink(missing_ok=True)
    t0 = time.monotonic()
    build._say(f"building coredns into {dest.parent} (once; log in {log}) ...")
    env = build._go_env(root)
    with tempfile.TemporaryDirectory(prefix="hpd-coredns-") as tmp:
        work = Path(tmp)
        build._run("coredns: go mod init", ["go", "mod", "init", "example.invalid/hpd-coredns"], cwd=work, log=log,
                   env=env)  # fmt: skip
        imports = "".join(f'\t_ "github.com/coredns/coredns/plugin/{p}"\n' for p in COREDNS_PLUGINS)
        (work / "main.go").write_text(f'package main\n\nimport (\n\t"github.com/coredns/coredns/coremain"\n{imports})'
                                      "\n\nfunc main() { coremain.Run() }\n")  # fmt: skip
        build._run("coredns: go get", ["go", "get", f"github.com/coredns/coredns@v{COREDNS}"], cwd=work, log=log,
                   env=env)  # fmt: skip
        build._run("coredns: go mod tidy", ["go", "mod", "tidy"], cwd=work, log=log, env=env)
        out = work / "out"
        out.mkdir()
        build._run("coredns: go build", ["go", "build", "-trimpath", "-ldflags", "-s -w", "-o", str(out / "coredns"),
                   "."], cwd=work, log=log, env=env)  # fmt: skip
        build._install_atomically(out, dest.parent)
    build._say(f"  done in {time.monotonic() - t0:.0f} s")
    return dest


# --- iptables ------------------------------------------------------------------------------------------------------


def _iptables(*args: str, v6: bool = False, check: bool = True) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(["ip6tables" if v6 else "iptables", "-w", "5", *args], capture_output=True, text=True,
                          check=False)  # fmt: skip
    if check and proc.returncode != 0:
        raise cluster.ClusterError(f"iptables {' '.join(args)}", None, proc.stderr.strip())
    return proc


def add_apiserver_rule(bridge: str, apiserver_port: int) -> None:
    """nat PREROUTING -> APISERVER_CHAIN: from the bridge, KUBERNETES_SERVICE_IP:443 -> 127.0.0.1:<apiserver>."""
    remove_apiserver_rule()
    (Path("/proc/sys/net/ipv4/conf") / bridge / "route_localnet").write_text("1\n")
    _iptables("-t", "nat", "-N", APISERVER_CHAIN)
    _iptables("-t", "nat", "-A", APISERVER_CHAIN, "-i", bridge, "-d", f"{KUBERNETES_SERVICE_IP}/32", "-p", "tcp",
              "--dport", "443", "-j", "DNAT", "--to-destination", f"127.0.0.1:{apiserver_port}")  # fmt: skip
    _iptables("-t", "nat", "-I", "PREROUTING", "1", "-j", APISERVER_CHAIN)


def remove_apiserver_rule() -> None:
    while _iptables("-t", "nat", "-D", "PREROUTING", "-j", APISERVER_CHAIN, check=False).returncode == 0:
        pass
    _iptables("-t", "nat", "-F", APISERVER_CHAIN, check=False)
    _iptables("-t", "nat", "-X", APISERVER_CHAIN, check=False)


def remove_kubelet_chains() -> None:
    """The kubelet's chains and the rules that jump to them, in every table of iptables and ip6tables."""
    for v6 in (False, True):
        saved = subprocess.run(["ip6tables-save" if v6 else "iptables-save"], capture_output=True, text=True,
                               check=False).stdout  # fmt: skip
        table = ""
        jumps: list[tuple[str, list[str]]] = []
        chains: list[tuple[str, str]] = []
        for line in saved.splitlines():
            if line.startswith("*"):
                table = line[1:]
            elif line.startswith(":") and line[1:].split()[0] in KUBELET_CHAINS:
                chains.append((table, line[1:].split()[0]))
            elif line.startswith("-A ") and " -j " in line:
                words = shlex.split(line)
                if words[1] not in KUBELET_CHAINS and words[words.index("-j") + 1] in KUBELET_CHAINS:
                    jumps.append((table, ["-D", *words[1:]]))
        for tbl, rule in jumps:
            _iptables("-t", tbl, *rule, v6=v6, check=False)
        for tbl, chain in chains:
            _iptables("-t", tbl, "-F", chain, v6=v6, check=False)
        for tbl, chain in chains:
            _iptables("-t", tbl, "-X", chain, v6=v6, check=False)


def kube_chains() -> list[str]:
    """Chains named KUBE-* or HPD-* in iptables and ip6tables (what teardown must leave none of)."""
    found = []
    for tool in ("iptables-save", "ip6tables-save"):
        out = subprocess.run([tool], capture_output=True, text=True, check=False).stdout
        found += [f"{tool}:{ln[1:].split()[0]}" for ln in out.splitlines()
                  if ln.startswith((":KUBE-", f":{APISERVER_CHAIN}"))]  # fmt: skip
    return found


def resolve(name: str, server: str, timeout: float = 2.0) -> str | None:
    """The first A record of `name` from the DNS server `server`:53 (one UDP query; None without an answer)."""
    qid = secrets.randbits(16)
    question = b"".join(bytes([len(p)]) + p.encode() for p in name.rstrip(".").split(".")) + b"\0"
    query = struct.pack("!HHHHHH", qid, 0x0100, 1, 0, 0, 0) + question + struct.pack("!HH", 1, 1)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.settimeout(timeout)
        sock.sendto(query, (server, 53))
        reply = sock.recv(4096)
    rid, flags, _qd, ancount, _ns, _ar = struct.unpack("!HHHHHH", reply[:12])
    if rid != qid or flags & 0xF or not ancount:
        return None
    pos = 12 + len(question) + 4
    for _ in range(ancount):
        pos += 2 if reply[pos] & 0xC0 == 0xC0 else reply.index(b"\0", pos) + 1 - pos
        rtype, _cls, _ttl, length = struct.unpack("!HHIH", reply[pos : pos + 10])
        pos += 10
        if rtype == 1 and length == 4:
            return socket.inet_ntoa(reply[pos : pos + 4])
        pos += length
    return None


# --- configs -------------------------------------------------------------------------------------------------------


def kube_proxy_config(node_name: str, kubeconfig: Path, pod_cidr: str, ports: dict[str, int]) -> dict[str, Any]:
    return {
        "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
        "kind": "KubeProxyConfiguration",
        "clientConnection": {"kubeconfig": str(kubeconfig)},
        "hostnameOverride": node_name,
        "bindAddress": "127.0.0.1",
        "healthzBindAddress": f"127.0.0.1:{ports['kube_proxy_healthz']}",
        "metricsBindAddress": f"127.0.0.1:{ports['kube_proxy_metrics']}",
        "mode": "iptables",
        "clusterCIDR": pod_cidr,
        "detectLocalMode": "ClusterCIDR",
        "nodePortAddresses": [f"{host_ip(pod_cidr)}/32"],
        "iptables": {"masqueradeAll": True, "localhostNodePorts": False, "syncPeriod": "30s", "minSyncPeriod": "0s"},
        # 0: leave the machine's conntrack sysctls alone
        "conntrack": {"maxPerCore": 0, "min": 0, "tcpEstablishedTimeout": "0s", "tcpCloseWaitTimeout": "0s"},
        "oomScoreAdj": 0,
    }  # fmt: skip


def corefile(pod_cidr: str, kubeconfig: Path) -> str:
    return f"""{CLUSTER_DOMAIN}:53 {{
    bind {host_ip(pod_cidr)}
    errors
    kubernetes {CLUSTER_DOMAIN} {{
        kubeconfig {kubeconfig} hpd-dev
    }}
}}
"""


COREDNS_RULES = [
    {"apiGroups": [""], "resources": ["endpoints", "services", "pods", "namespaces"], "verbs": ["list", "watch"]},
    {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"], "verbs": ["list", "watch"]},
]
COREDNS_USER = "hpd-devcluster:coredns"


def grant(state: cluster.ClusterState) -> None:
    """Client certs for kube-proxy (system:kube-proxy: the built-in system:node-proxier binding) and CoreDNS (a
    ClusterRole of its own: list/watch Services, EndpointSlices, namespaces, pods)."""
    pki.add_client(state.pki, pki.ClientCert("kube-proxy", "system:kube-proxy"))
    pki.add_client(state.pki, pki.ClientCert("coredns", COREDNS_USER))
    role = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": COREDNS_USER},
            "rules": COREDNS_RULES}  # fmt: skip
    binding = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
               "metadata": {"name": COREDNS_USER},
               "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": COREDNS_USER},
               "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": COREDNS_USER}]}  # fmt: skip
    for path, obj in (("clusterroles", role), ("clusterrolebindings", binding)):
        try:
            cluster.api(state, "POST", f"/apis/rbac.authorization.k8s.io/v1/{path}", obj)
        except urllib.error.HTTPError as exc:
            if exc.code != 409:
                raise


def write_configs(state: cluster.ClusterState, root: Path, node_name: str, pod_cidr: str,
                  ports: dict[str, int]) -> dict[str, Path]:  # fmt: skip
    """kube-proxy's and CoreDNS's kubeconfigs and configs under `root`; returns the config paths by process."""
    grant(state)
    paths = {}
    for client in ("kube-proxy", "coredns"):
        (root / f"{client}.kubeconfig").write_text(pki.kubeconfig(state.server, state.pki, client))
    paths["kube-proxy"] = root / "kube-proxy.json"
    paths["kube-proxy"].write_text(json.dumps(kube_proxy_config(node_name, root / "kube-proxy.kubeconfig", pod_cidr,
                                                                ports), indent=2))  # fmt: skip
    paths["coredns"] = root / "Corefile"
    paths["coredns"].write_text(corefile(pod_cidr, root / "coredns.kubeconfig"))
    return paths


def cleanup(kube_proxy: Path | None) -> None:
    """Undo this module's host changes: kube-proxy's chains (its own `--cleanup`), ours, the kubelet's."""
    if kube_proxy is not None and kube_proxy.exists():
        with contextlib.suppress(subprocess.TimeoutExpired, OSError):
            subprocess.run([str(kube_proxy), "--cleanup", "--v=0"], capture_output=True, timeout=60, check=False)
    remove_apiserver_rule()
    remove_kubelet_chains()
