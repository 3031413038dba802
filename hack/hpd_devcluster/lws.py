"""LeaderWorkerSet (sigs.k8s.io/lws) on the local control plane, for the tests of replicas that span nodes.

    lws.ensure_built()                # once: `<cache>/bin/lws-v0.9.0/{lws-manager, crds.yaml, webhooks.yaml}`
    ctl = lws.start(state)            # CRDs applied, controller + admission webhooks running on 127.0.0.1
    lws.stop(state)                   # the process gone, its webhook configurations deleted (the CRDs stay)

Built from its Go module like the control plane (build.py): `go build sigs.k8s.io/lws/cmd` at versions.LWS inside a
throw-away module, and its CRDs and webhook manifests copied from the same module's `config/` so the three always
match. It runs outside the cluster with a client certificate of its own (system:masters, like kwok's).

LWS needs its admission webhooks: the pod webhook labels each pod with its group and worker index and injects
LWS_LEADER_ADDRESS / LWS_GROUP_SIZE / LWS_WORKER_INDEX, which the operator's args refer to. The apiserver calls
webhooks over HTTPS; in a cluster that is a Service, here the controller's own webhook server listens on
https://127.0.0.1:<free port> with a serving certificate from the cluster's CA (IP SAN 127.0.0.1), and the webhook
configurations from the module name that URL (`clientConfig.url`) with the CA as `caBundle`. LWS's internal cert
rotation (which writes a Secret and patches caBundle for a Service name) is turned off in its configuration file.
The CRD's conversion-webhook patch is not applied: LeaderWorkerSet has one version (v1), nothing to convert.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import ipaddress
import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from hpd_devcluster import build, pki, versions
from hpd_devcluster.state import CHILDREN, ClusterError, ClusterState, alive, api, free_ports, ssl_context, url_ok

MODULE = "sigs.k8s.io/lws"
CRD_FILES = (
    "config/crd/bases/leaderworkerset.x-k8s.io_leaderworkersets.yaml",
    # the manager also runs LWS's DisaggregatedSet controller, which fails to start without its kind
    "config/crd/bases/disaggregatedset.x-k8s.io_disaggregatedsets.yaml",
)
WEBHOOKS_FILE = "config/webhook/manifests.yaml"
POD_WEBHOOK_SELECTOR = {"matchExpressions": [{"key": "leaderworkerset.sigs.k8s.io/name", "operator": "Exists"}]}
"""LWS's kustomize patch (config/webhook/*-patch.yaml): its pod webhooks see only pods of a LeaderWorkerSet."""
CLIENT = pki.ClientCert("lws", "lws-controller", "system:masters")
READY_TIMEOUT = 90.0


def _dir(root: Path | None = None) -> Path:
    return (root or build.cache_dir()) / "bin" / f"lws-v{versions.LWS}"


def manager_path(root: Path | None = None) -> Path:
    return _dir(root) / "lws-manager"


def built(root: Path | None = None) -> bool:
    d = _dir(root)
    return os.access(d / "lws-manager", os.X_OK) and (d / "crds.yaml").is_file() and (d / "webhooks.yaml").is_file()


def build_lws(root: Path, logs: Path) -> None:
    """`go build` the manager at versions.LWS and copy its CRDs and webhook manifests from the same module."""
    ver = versions.LWS
    log = logs / f"lws-v{ver}.log"
    log.unlink(missing_ok=True)
    env = build._go_env(root)
    with tempfile.TemporaryDirectory(prefix="hpd-lws-build-") as tmp:
        work = Path(tmp)
        build._run("lws: go mod init", ["go", "mod", "init", "example.invalid/hpd-lws-bin"], cwd=work, log=log, env=env)
        build._run("lws: go get", ["go", "get", f"{MODULE}@v{ver}"], cwd=work, log=log, env=env)
        (work / "tools.go").write_text(f'//go:build tools\n\npackage tools\n\nimport _ "{MODULE}/cmd"\n')
        build._run("lws: go mod tidy", ["go", "mod", "tidy"], cwd=work, log=log, env=env)
        out = work / "out"
        out.mkdir()
        ldflags = f"-s -w -X {MODULE}/pkg/version.GitVersion=v{ver}"
        build._run(
            "lws: go build",
            ["go", "build", "-trimpath", "-ldflags", ldflags, "-o", str(out / "lws-manager"), f"{MODULE}/cmd"],
            cwd=work,
            log=log,
            env=env,
        )
        info = json.loads(
            build._run("lws: locate config", ["go", "mod", "download", "-json", f"{MODULE}@v{ver}"],
                       cwd=work, log=log, env=env)
        )  # fmt: skip
        src = Path(info["Dir"])
        (out / "crds.yaml").write_text("\n---\n".join((src / f).read_text().strip() for f in CRD_FILES) + "\n")
        shutil.copyfile(src / WEBHOOKS_FILE, out / "webhooks.yaml")
        build._install_atomically(out, _dir(root))


def ensure_built(root: Path | None = None) -> Path:
    """The manager, built once into the cache (rebuilt only when missing); returns its directory."""
    root = root or build.cache_dir()
    if not built(root):
        t0 = time.monotonic()
        build._say(f"building LeaderWorkerSet v{versions.LWS} into {_dir(root)} (once; log in {root / 'logs'}) ...")
        build_lws(root, root / "logs")
        build._say(f"  done in {time.monotonic() - t0:.0f} s")
    return _dir(root)


# --- running it against a cluster -------------------------------------------------------------------------------
@dataclass
class Controller:
    pid: int
    webhook_port: int
    health_port: int
    log: str


def _state_file(state: ClusterState) -> Path:
    return state.root / "lws.json"


def _serving_cert(pki_dir: Path, out: Path) -> None:
    """tls.crt/tls.key for 127.0.0.1, signed by the cluster's CA (the apiserver verifies the webhook against it)."""
    ca_key = serialization.load_pem_private_key((pki_dir / "ca.key").read_bytes(), password=None)
    assert isinstance(ca_key, ec.EllipticCurvePrivateKey)
    ca_name = x509.load_pem_x509_certificate((pki_dir / "ca.crt").read_bytes()).subject
    key = ec.generate_private_key(ec.SECP256R1())
    now = dt.datetime.now(dt.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "lws-webhook")]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=365))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    out.mkdir(parents=True, exist_ok=True)
    (out / "tls.crt").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    (out / "tls.key").write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    (out / "tls.key").chmod(0o600)


def config_file(webhook_port: int, health_port: int, cert_dir: Path) -> dict[str, Any]:
    """LWS's own Configuration (config.lws.x-k8s.io/v1alpha1, api/config/v1alpha1): webhooks on loopback with our
    certificate, no cert rotation, no leader election, no metrics server."""
    return {
        "apiVersion": "config.lws.x-k8s.io/v1alpha1",
        "kind": "Configuration",
        "leaderElection": {"leaderElect": False},
        "internalCertManagement": {"enable": False},
        "webhook": {"host": "127.0.0.1", "port": webhook_port, "certDir": str(cert_dir)},
        "health": {"healthProbeBindAddress": f"127.0.0.1:{health_port}"},
        "metrics": {"bindAddress": "0"},
    }


def webhook_configurations(src: Path, webhook_port: int, ca_bundle: bytes) -> list[dict[str, Any]]:
    """The module's webhook configurations with each Service reference turned into a loopback URL (same path), the
    CA, and LWS's pod objectSelector; named after this harness so they never clash with an installed LWS."""
    import base64

    out = []
    for doc in yaml.safe_load_all(src.read_text()):
        if not doc:
            continue
        doc["metadata"] = {"name": f"hpd-devcluster-lws-{doc['kind'].lower()}"}
        for hook in doc["webhooks"]:
            path = hook["clientConfig"]["service"]["path"]
            hook["clientConfig"] = {
                "url": f"https://127.0.0.1:{webhook_port}{path}",
                "caBundle": base64.b64encode(ca_bundle).decode(),
            }
            if hook["rules"][0]["resources"] == ["pods"]:
                hook["objectSelector"] = POD_WEBHOOK_SELECTOR
            hook["timeoutSeconds"] = 10
        out.append(doc)
    return out


_PATHS = {
    "CustomResourceDefinition": "/apis/apiextensions.k8s.io/v1/customresourcedefinitions",
    "MutatingWebhookConfiguration": "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations",
    "ValidatingWebhookConfiguration": "/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations",
}


def _apply(state: ClusterState, obj: dict[str, Any]) -> None:
    """Server-side apply one cluster-scoped object (field manager hpd-devcluster)."""
    url = f"{state.server}{_PATHS[obj['kind']]}/{obj['metadata']['name']}?fieldManager=hpd-devcluster&force=true"
    req = urllib.request.Request(
        url, data=json.dumps(obj).encode(), method="PATCH", headers={"Content-Type": "application/apply-patch+yaml"}
    )
    with urllib.request.urlopen(req, context=ssl_context(state), timeout=60):
        pass


def _delete(state: ClusterState, kind: str, name: str) -> None:
    with contextlib.suppress(urllib.error.HTTPError):
        api(state, "DELETE", f"{_PATHS[kind]}/{name}")


def install_crds(state: ClusterState) -> None:
    """LeaderWorkerSet's CRDs, applied and Established."""
    d = ensure_built()
    names = []
    for doc in yaml.safe_load_all((d / "crds.yaml").read_text()):
        if doc:
            _apply(state, doc)
            names.append(doc["metadata"]["name"])
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if all(_established(state, n) for n in names):
            return
        time.sleep(0.2)
    raise ClusterError("lws: CRDs Established", None, "timed out")


def _established(state: ClusterState, name: str) -> bool:
    crd = api(state, "GET", f"{_PATHS['CustomResourceDefinition']}/{name}")
    return any(
        c["type"] == "Established" and c["status"] == "True" for c in (crd.get("status") or {}).get("conditions") or []
    )


def uninstall_crds(state: ClusterState) -> None:
    """Delete LeaderWorkerSet's CRDs (and with them every LeaderWorkerSet) and wait until they are gone."""
    names = [d["metadata"]["name"] for d in yaml.safe_load_all((_dir() / "crds.yaml").read_text()) if d]
    for n in names:
        _delete(state, "CustomResourceDefinition", n)
    deadline = time.monotonic() + 60
    while any(_exists(state, n) for n in names):
        if time.monotonic() > deadline:
            raise ClusterError("lws: CRDs deleted", None, "timed out")
        time.sleep(0.2)


def _exists(state: ClusterState, name: str) -> bool:
    try:
        api(state, "GET", f"{_PATHS['CustomResourceDefinition']}/{name}")
    except urllib.error.HTTPError as exc:
        if exc.code == 404:
            return False
        raise
    return True


def _port_ready(port: int, ctx: ssl.SSLContext) -> bool:
    try:
        with (
            socket.create_connection(("127.0.0.1", port), timeout=1) as s,
            ctx.wrap_socket(s, server_hostname="127.0.0.1"),
        ):
            return True
    except (OSError, ssl.SSLError):
        return False


def start(state: ClusterState) -> Controller:
    """CRDs, then the controller with its webhooks on loopback, then the webhook configurations; returns once the
    controller answers its readiness check and its webhook server accepts TLS from the cluster's CA. A controller
    this harness already runs on the cluster is kept."""
    d = ensure_built()
    install_crds(state)
    ctl = load(state)
    if ctl is None or not alive(ctl.pid, "lws-manager"):
        ctl = _launch(state, d)
    for hook in webhook_configurations(d / "webhooks.yaml", ctl.webhook_port, (state.pki / "ca.crt").read_bytes()):
        _apply(state, hook)
    return ctl


def _launch(state: ClusterState, d: Path) -> Controller:
    work = state.root / "lws"
    shutil.rmtree(work, ignore_errors=True)
    _serving_cert(state.pki, work / "certs")
    pki.add_client(state.pki, CLIENT)
    (work / "kubeconfig").write_text(pki.kubeconfig(state.server, state.pki, CLIENT.name))
    webhook_port, health_port = free_ports(2)
    (work / "config.yaml").write_text(json.dumps(config_file(webhook_port, health_port, work / "certs")))
    log = state.logs / "lws-manager.log"
    state.logs.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "KUBECONFIG": str(work / "kubeconfig")}
    with log.open("ab") as fh:
        proc = subprocess.Popen(
            [str(d / "lws-manager"), f"--config={work / 'config.yaml'}", "--zap-log-level=info"],
            stdout=fh, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True, cwd=work, env=env,
        )  # fmt: skip
    CHILDREN[proc.pid] = proc
    ctl = Controller(pid=proc.pid, webhook_port=webhook_port, health_port=health_port, log=str(log))
    _state_file(state).write_text(json.dumps(asdict(ctl)))
    ca = ssl.create_default_context(cafile=str(state.pki / "ca.crt"))
    deadline = time.monotonic() + READY_TIMEOUT
    ready = f"http://127.0.0.1:{health_port}/readyz"
    while not (url_ok(ready) and _port_ready(webhook_port, ca)):
        if proc.poll() is not None:
            _state_file(state).unlink(missing_ok=True)
            raise ClusterError("lws: start", log, f"lws-manager exited with status {proc.returncode}")
        if time.monotonic() > deadline:
            stop(state)
            raise ClusterError("lws: start", log, "its webhook server did not answer in time")
        time.sleep(0.2)
    return ctl


def load(state: ClusterState) -> Controller | None:
    path = _state_file(state)
    return Controller(**json.loads(path.read_text())) if path.exists() else None


def stop(state: ClusterState) -> bool:
    """Delete the webhook configurations first (so no pod waits on a webhook that is gone), then stop the
    controller (SIGTERM, SIGKILL after 10 s); True if one was running."""
    ctl = load(state)
    for kind in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"):
        _delete(state, kind, f"hpd-devcluster-lws-{kind.lower()}")
    if ctl is None:
        return False
    _state_file(state).unlink(missing_ok=True)
    if not alive(ctl.pid, "lws-manager"):
        return False
    with contextlib.suppress(ProcessLookupError):
        os.killpg(ctl.pid, signal.SIGTERM)
    end = time.monotonic() + 10
    while alive(ctl.pid, "lws-manager") and time.monotonic() < end:
        time.sleep(0.05)
    if alive(ctl.pid, "lws-manager"):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(ctl.pid, signal.SIGKILL)
    child = CHILDREN.pop(ctl.pid, None)
    if child is not None:
        child.wait(timeout=10)
    return True


@contextlib.contextmanager
def running(state: ClusterState) -> Any:
    """LWS for the duration of a `with` block (the CRDs stay: deleting them would delete every LeaderWorkerSet)."""
    ctl = start(state)
    try:
        yield ctl
    finally:
        stop(state)
