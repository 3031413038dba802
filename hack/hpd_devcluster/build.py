"""Build (once) and locate the binaries of the local control plane.

Everything lands in a cache outside the repository, keyed by version, so a second `up` costs nothing:

    <cache>/bin/kubernetes-v1.35.4/{kube-apiserver,kube-controller-manager,kube-scheduler}
    <cache>/bin/etcd-v3.6.16/etcd
    <cache>/bin/kwok-v0.8.0/kwok
    <cache>/bin/kubectl-layer-<pin>/{kubectl,helm}
    <cache>/bin/cyclonus-v0.5.6/cyclonus      (a test tool, not part of the control plane: `ensure_cyclonus`)

`k8s.io/kubernetes` and `go.etcd.io/etcd/server/v3` carry `replace` directives, so `go install pkg@version`
refuses them; each is built inside a throw-away module that requires it and replaces every staging module
by its published version. A failed step raises `BuildError` naming the step and its log file.
"""

from __future__ import annotations

import io
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path

from hpd_devcluster import versions


class BuildError(RuntimeError):
    """A build step failed; the message names the step and the log that holds its output."""

    def __init__(self, step: str, log: Path, hint: str = "") -> None:
        tail = ""
        if log.exists():
            tail = "\n".join(log.read_text(errors="replace").splitlines()[-15:])
        super().__init__(f"build step {step!r} failed; full log: {log}{(' (' + hint + ')') if hint else ''}\n{tail}")
        self.step = step
        self.log = log


def cache_dir() -> Path:
    """Root of everything cached: `$HPD_CACHE_DIR`, else `$XDG_CACHE_HOME/hybrid-pd`, else `~/.cache/hybrid-pd`."""
    if env := os.environ.get("HPD_CACHE_DIR"):
        return Path(env)
    xdg = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(xdg) / "hybrid-pd"


@dataclass(frozen=True)
class Binaries:
    etcd: Path
    kube_apiserver: Path
    kube_controller_manager: Path
    kube_scheduler: Path
    kwok: Path
    kwok_stages: Path
    kubectl: Path
    helm: Path
    prometheus_adapter: Path

    def all(self) -> dict[str, Path]:
        return {k: v for k, v in self.__dict__.items()}


def _paths(root: Path) -> Binaries:
    k8s = root / "bin" / f"kubernetes-v{versions.KUBERNETES}"
    layer = re.sub(r"[^A-Za-z0-9.]+", "-", versions.KUBECTL_LAYER)
    return Binaries(
        etcd=root / "bin" / f"etcd-v{versions.ETCD}" / "etcd",
        kube_apiserver=k8s / "kube-apiserver",
        kube_controller_manager=k8s / "kube-controller-manager",
        kube_scheduler=k8s / "kube-scheduler",
        kwok=root / "bin" / f"kwok-v{versions.KWOK}" / "kwok",
        kwok_stages=root / "bin" / f"kwok-v{versions.KWOK}" / "stages.yaml",
        kubectl=root / "bin" / layer / "kubectl",
        helm=root / "bin" / layer / "helm",
        prometheus_adapter=root / "bin" / f"prometheus-adapter-v{versions.PROMETHEUS_ADAPTER}" / "adapter",
    )


def binaries(root: Path | None = None) -> Binaries:
    """Paths of the cached binaries, without building; `missing()` says which are absent."""
    return _paths(root or cache_dir())


def missing(bins: Binaries) -> list[str]:
    return [
        name
        for name, path in bins.all().items()
        if not (path.is_file() if path.suffix == ".yaml" else os.access(path, os.X_OK))
    ]


def _go_env(root: Path) -> dict[str, str]:
    env = dict(os.environ)
    env.update(CGO_ENABLED="0", GOFLAGS="-mod=mod -buildvcs=false", GOTOOLCHAIN=versions.GOTOOLCHAIN, GOWORK="off")
    return env


def _run(step: str, cmd: list[str], *, cwd: Path, log: Path, env: dict[str, str]) -> str:
    log.parent.mkdir(parents=True, exist_ok=True)
    if shutil.which(cmd[0]) is None:
        raise BuildError(step, log, f"{cmd[0]!r} is not on PATH; install Go >= 1.26")
    with log.open("a") as fh:
        fh.write(f"$ {' '.join(cmd)}   (in {cwd})\n")
        fh.flush()
        proc = subprocess.run(cmd, check=False, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=fh, text=True)
        fh.write(proc.stdout)
    if proc.returncode != 0:
        raise BuildError(step, log)
    return proc.stdout


def _say(msg: str) -> None:
    print(f"[hpd-devcluster] {msg}", file=sys.stderr, flush=True)


def _install_atomically(built: Path, dest_dir: Path) -> None:
    """Move a finished build dir into place in one rename, so a killed build never leaves half a cache."""
    dest_dir.parent.mkdir(parents=True, exist_ok=True)
    if dest_dir.exists():
        shutil.rmtree(dest_dir)
    os.replace(built, dest_dir)


def build_kubernetes(root: Path, logs: Path) -> None:
    build_kubernetes_commands(
        ("kube-apiserver", "kube-controller-manager", "kube-scheduler"),
        _paths(root).kube_apiserver.parent,
        logs / f"kubernetes-v{versions.KUBERNETES}.log",
    )


def build_kubernetes_commands(cmds: tuple[str, ...], dest: Path, log: Path) -> None:
    """Build `k8s.io/kubernetes/cmd/<c>` for each of `cmds` at versions.KUBERNETES into `dest` (replaced whole)."""
    ver = versions.KUBERNETES
    minor = ver.split(".")[1]
    log.unlink(missing_ok=True)
    env = _go_env(dest)
    with tempfile.TemporaryDirectory(prefix="hpd-k8s-build-") as tmp:
        work = Path(tmp)
        _run(
            "kubernetes: go mod init", ["go", "mod", "init", "example.invalid/hpd-k8s-bin"], cwd=work, log=log, env=env
        )
        info = json.loads(
            _run(
                "kubernetes: download k8s.io/kubernetes",
                ["go", "mod", "download", "-json", f"k8s.io/kubernetes@v{ver}"],
                cwd=work,
                log=log,
                env=env,
            )
        )
        upstream = Path(info["GoMod"]).read_text()
        go_line = re.search(r"^go (\S+)$", upstream, re.M)
        edits = [f"-require=k8s.io/kubernetes@v{ver}"]
        if go_line:
            edits.append(f"-go={go_line.group(1)}")
        staging = re.findall(r"^\s*(k8s\.io/[A-Za-z0-9._-]+) => \./staging/src/", upstream, re.M)
        if not staging:
            raise BuildError(
                "kubernetes: read staging modules", log, "no staging replaces found in k8s.io/kubernetes go.mod"
            )
        edits += [f"-replace={m}={m}@v0.{ver.split('.', 1)[1]}" for m in staging]
        _run("kubernetes: go mod edit", ["go", "mod", "edit", *edits], cwd=work, log=log, env=env)
        godebug = [ln for ln in upstream.splitlines() if ln.startswith("godebug")]
        if godebug:
            with (work / "go.mod").open("a") as fh:
                fh.write("\n".join(godebug) + "\n")
        (work / "tools.go").write_text(
            "//go:build tools\n\npackage tools\n\nimport (\n"
            + "".join(f'\t_ "k8s.io/kubernetes/cmd/{c}"\n' for c in cmds)
            + ")\n"
        )
        _run("kubernetes: go mod tidy", ["go", "mod", "tidy"], cwd=work, log=log, env=env)
        ldflags = ["-s", "-w"]
        for pkg in ("k8s.io/component-base/version", "k8s.io/client-go/pkg/version"):
            ldflags += [
                f"-X {pkg}.gitVersion=v{ver}",
                f"-X {pkg}.gitMajor=1",
                f"-X {pkg}.gitMinor={minor}",
                f"-X {pkg}.gitTreeState=clean",
                f"-X {pkg}.buildDate=1970-01-01T00:00:00Z",
            ]
        out = work / "out"
        out.mkdir()
        _run(
            f"kubernetes: go build {' '.join(cmds)}",
            [
                "go",
                "build",
                "-trimpath",
                "-ldflags",
                " ".join(ldflags),
                "-o",
                str(out) + "/",
                *[f"k8s.io/kubernetes/cmd/{c}" for c in cmds],
            ],
            cwd=work,
            log=log,
            env=env,
        )
        _install_atomically(out, dest)


def build_etcd(root: Path, logs: Path) -> None:
    ver = versions.ETCD
    log = logs / f"etcd-v{ver}.log"
    log.unlink(missing_ok=True)
    env = _go_env(root)
    with tempfile.TemporaryDirectory(prefix="hpd-etcd-build-") as tmp:
        work = Path(tmp)
        _run("etcd: go mod init", ["go", "mod", "init", "example.invalid/hpd-etcd-bin"], cwd=work, log=log, env=env)
        _run("etcd: go get", ["go", "get", f"go.etcd.io/etcd/server/v3@v{ver}"], cwd=work, log=log, env=env)
        out = work / "out"
        out.mkdir()
        _run(
            "etcd: go build",
            ["go", "build", "-trimpath", "-ldflags", "-s -w", "-o", str(out / "etcd"), "go.etcd.io/etcd/server/v3"],
            cwd=work,
            log=log,
            env=env,
        )
        _install_atomically(out, _paths(root).etcd.parent)


KWOK_STAGES = (
    # kwok's own "fast" stages (what `kwokctl` installs by default): nodes Ready with lease heartbeats,
    # pods Running/Ready right after scheduling, deleted promptly.
    "node/fast/node-initialize.yaml",
    "node/heartbeat-with-lease/node-heartbeat-with-lease.yaml",
    "pod/fast/pod-ready.yaml",
    "pod/fast/pod-complete.yaml",
    "pod/fast/pod-delete.yaml",
    # PVCs of StorageClass `kwok-volume` (made default at `up`) get a bound fake PV.
    "volume/fast/pvc-provision.yaml",
    "volume/fast/pv-bind.yaml",
    "volume/fast/pvc-delete.yaml",
    "volume/fast/pv-delete.yaml",
)


def build_kwok(root: Path, logs: Path) -> None:
    ver = versions.KWOK
    log = logs / f"kwok-v{ver}.log"
    log.unlink(missing_ok=True)
    env = _go_env(root)
    with tempfile.TemporaryDirectory(prefix="hpd-kwok-build-") as tmp:
        out = Path(tmp) / "out"
        out.mkdir()
        env["GOBIN"] = str(out)
        env["GOFLAGS"] = "-buildvcs=false"
        _run(
            "kwok: go install",
            ["go", "install", "-trimpath", "-ldflags", "-s -w", f"sigs.k8s.io/kwok/cmd/kwok@v{ver}"],
            cwd=Path(tmp),
            log=log,
            env=env,
        )
        info = json.loads(
            _run("kwok: locate stages", ["go", "mod", "download", "-json", f"sigs.k8s.io/kwok@v{ver}"],
                 cwd=Path(tmp), log=log, env=env)
        )  # fmt: skip
        stage_root = Path(info["Dir"]) / "kustomize" / "stage"
        docs = [(stage_root / rel).read_text() for rel in KWOK_STAGES]
        (out / "stages.yaml").write_text("\n---\n".join(d.strip() for d in docs) + "\n")
        _install_atomically(out, _paths(root).kwok.parent)


def build_prometheus_adapter(root: Path, logs: Path) -> None:
    """sigs.k8s.io/prometheus-adapter's `adapter` command, in a throw-away module that requires it (the proxy has no
    version list for the module, so `go install pkg@version`, which asks for one, is refused)."""
    ver = versions.PROMETHEUS_ADAPTER
    log = logs / f"prometheus-adapter-v{ver}.log"
    log.unlink(missing_ok=True)
    env = _go_env(root)
    with tempfile.TemporaryDirectory(prefix="hpd-adapter-build-") as tmp:
        work = Path(tmp)
        step = "prometheus-adapter"
        _run(
            f"{step}: go mod init", ["go", "mod", "init", "example.invalid/hpd-adapter-bin"], cwd=work, log=log, env=env
        )
        (work / "tools.go").write_text(
            '//go:build tools\n\npackage tools\n\nimport _ "sigs.k8s.io/prometheus-adapter/cmd/adapter"\n'
        )
        _run(f"{step}: go get", ["go", "get", f"sigs.k8s.io/prometheus-adapter@v{ver}"], cwd=work, log=log, env=env)
        _run(f"{step}: go mod tidy", ["go", "mod", "tidy"], cwd=work, log=log, env=env)
        out = work / "out"
        out.mkdir()
        _run(
            f"{step}: go build",
            ["go", "build", "-trimpath", "-ldflags", "-s -w", "-o", str(out / "adapter"),
             "sigs.k8s.io/prometheus-adapter/cmd/adapter"],
            cwd=work, log=log, env=env,
        )  # fmt: skip
        _install_atomically(out, _paths(root).prometheus_adapter.parent)


def cyclonus_path(root: Path | None = None) -> Path:
    return (root or cache_dir()) / "bin" / f"cyclonus-v{versions.CYCLONUS}" / "cyclonus"


def build_cyclonus(root: Path, logs: Path) -> None:
    ver = versions.CYCLONUS
    log = logs / f"cyclonus-v{ver}.log"
    log.unlink(missing_ok=True)
    env = _go_env(root)
    with tempfile.TemporaryDirectory(prefix="hpd-cyclonus-build-") as tmp:
        out = Path(tmp) / "out"
        out.mkdir()
        env["GOBIN"] = str(out)
        env["GOFLAGS"] = "-buildvcs=false"
        _run(
            "cyclonus: go install",
            ["go", "install", "-trimpath", "-ldflags", "-s -w", f"github.com/mattfenwick/cyclonus/cmd/cyclonus@v{ver}"],
            cwd=Path(tmp),
            log=log,
            env=env,
        )
        _install_atomically(out, cyclonus_path(root).parent)


def ensure_cyclonus(root: Path | None = None) -> Path:
    """The NetworkPolicy evaluator the tests use (versions.CYCLONUS), built once into the cache."""
    root = root or cache_dir()
    path = cyclonus_path(root)
    if not os.access(path, os.X_OK):
        t0 = time.monotonic()
        _say(f"building cyclonus v{versions.CYCLONUS} into {path.parent} (once; log in {root / 'logs'}) ...")
        build_cyclonus(root, root / "logs")
        _say(f"  done in {time.monotonic() - t0:.0f} s")
    return path


def fetch_kubectl_helm(root: Path, logs: Path) -> None:
    """Extract static kubectl and helm from the PyPI kubectl-layer wheel (its jsii tarball holds layer.zip)."""
    log = logs / "kubectl-helm.log"
    log.unlink(missing_ok=True)
    dest = _paths(root).kubectl.parent
    with tempfile.TemporaryDirectory(prefix="hpd-layer-") as tmp:
        work = Path(tmp)
        _run(
            "kubectl/helm: pip download",
            [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "-d", str(work), versions.KUBECTL_LAYER],
            cwd=work,
            log=log,
            env=dict(os.environ),
        )
        wheel = next(work.glob("*.whl"))
        with zipfile.ZipFile(wheel) as whl:
            tgz_name = next(n for n in whl.namelist() if n.endswith(".jsii.tgz"))
            with tarfile.open(fileobj=io.BytesIO(whl.read(tgz_name))) as tgz:
                member = tgz.extractfile("package/lib/layer.zip")
                if member is None:
                    raise BuildError("kubectl/helm: find layer.zip", log)
                layer = zipfile.ZipFile(io.BytesIO(member.read()))
        out = work / "out"
        out.mkdir()
        for name, target in (("kubectl/kubectl", "kubectl"), ("helm/helm", "helm")):
            (out / target).write_bytes(layer.read(name))
            (out / target).chmod(0o755)
        _install_atomically(out, dest)


STEPS = {
    "kube_apiserver": build_kubernetes,
    "kube_controller_manager": build_kubernetes,
    "kube_scheduler": build_kubernetes,
    "etcd": build_etcd,
    "kwok": build_kwok,
    "kwok_stages": build_kwok,
    "kubectl": fetch_kubectl_helm,
    "helm": fetch_kubectl_helm,
    "prometheus_adapter": build_prometheus_adapter,
}


def ensure_binaries(root: Path | None = None) -> Binaries:
    """Build whatever is missing from the cache (only that), then return the paths."""
    root = root or cache_dir()
    bins = _paths(root)
    logs = root / "logs"
    done: set[object] = set()
    for name in missing(bins):
        step = STEPS[name]
        if step in done:
            continue
        done.add(step)
        t0 = time.monotonic()
        _say(
            f"building {step.__name__.removeprefix('build_').removeprefix('fetch_')} into {root} (once; log in {logs}) ..."
        )
        step(root, logs)
        _say(f"  done in {time.monotonic() - t0:.0f} s")
    still = missing(bins)
    if still:
        raise BuildError("verify binaries", logs, f"still missing after build: {', '.join(still)}")
    return bins
