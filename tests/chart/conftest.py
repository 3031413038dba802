"""Fixtures of the chart tests: the real helm, a writable chart copy, the operator process (started in ONE place:
`operator_argv`), and the report hook the log-on-failure uses."""

from __future__ import annotations

import dataclasses
import shutil
import signal
import subprocess
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from hpd_devcluster.testing import children, kill_with_children

from .helmkit import CHART, REPO, Helm


@pytest.fixture(scope="session")
def helm(tmp_path_factory: pytest.TempPathFactory) -> Helm:
    from hpd_devcluster.build import binaries

    bins = binaries()
    if not bins.helm.exists():
        pytest.fail(f"helm is missing at {bins.helm}: run hack/setup.sh (python -m hpd_devcluster build)")
    return Helm(bins.helm, tmp_path_factory.mktemp("helm-home"), bins.kubectl)


@pytest.fixture()
def chart_copy(tmp_path: Path) -> Iterator[Path]:
    """A writable copy of the chart (for upgrade tests that change it)."""
    dst = tmp_path / "hybrid-pd-operator"
    shutil.copytree(CHART, dst)
    yield dst


class OperatorProcess:
    """The operator started by `start_operator`; its log file and metrics port (on 127.0.0.1)."""

    def __init__(self, proc: subprocess.Popen[bytes], log: Path, metrics_port: int) -> None:
        self.proc, self.log, self.metrics_port = proc, log, metrics_port

    def log_text(self) -> str:
        return self.log.read_text(errors="replace")

    def metrics(self) -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=5) as r:
            return str(r.read().decode())

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                kill_with_children(self.proc)  # the runner starts the container in a session of its own


KUBECONFIG_IN_IMAGE = "/etc/hpd/kubeconfig"
PORT_FILES_IN_IMAGE = Path("/tmp")
"""Where the operator in its image writes its metrics port (`run --metrics-port-file`): the image's HOME and WORKDIR,
writable by its user (the image runner's mounts are read-only)."""


def descendants(pid: int) -> list[int]:
    out, todo = [], children(pid)
    while todo:
        out.append(todo.pop())
        todo += children(out[-1])
    return out


def port_written_in_image(proc: subprocess.Popen[bytes], name: str, timeout: float = 120.0) -> int:
    """The metrics port the operator that `proc` runs from its image bound and then wrote to PORT_FILES_IN_IMAGE/`name`
    (`run --metrics-port-file`: the OS picked the port while binding, so no other process can take it between a pick
    and a bind). Read as the operator sees its own file system: /proc/PID/root of the container's
    `python -m hpd_operator run` process, a descendant of `proc`. Waited for while `proc` runs; its exit before the
    file is written fails loudly, and so does the deadline, naming the processes it looked at."""
    deadline, looked = time.monotonic() + timeout, ""
    while True:
        for pid in descendants(proc.pid):
            try:
                argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
                if argv[1:4] != [b"-m", b"hpd_operator", b"run"]:
                    continue
                looked = f"{pid}: {b' '.join(argv).decode(errors='replace')}"
                text = Path(f"/proc/{pid}/root{PORT_FILES_IN_IMAGE / name}").read_text()  # whole or absent (a rename)
            except OSError:
                continue
            if text.strip():
                return int(text)
        if proc.poll() is not None:
            raise RuntimeError(f"the operator's runner exited with {proc.returncode} before the port was written")
        if time.monotonic() > deadline:
            raise TimeoutError(f"no port in {PORT_FILES_IN_IMAGE / name} after {timeout} s; operator seen: {looked!r}")
        time.sleep(0.1)


def operator_argv(image: str, args: list[str], kubeconfig: Path) -> list[str]:
    """HOW the operator runs, in one place: its built image (`buildah run`, host network, as the image's USER),
    `python -m hpd_operator run ARGS`, with `kubeconfig` (self-contained, world-readable) mounted read-only."""
    from hpd_devcluster import images

    private = kubeconfig.parent / "mount"
    private.mkdir(mode=0o755, exist_ok=True)
    mounted = private / Path(KUBECONFIG_IN_IMAGE).name
    shutil.copyfile(kubeconfig, mounted)
    mounted.chmod(0o644)  # the image's uid 1000 reads it (a short-lived test token)
    return images.run_command(
        image,
        ["python", "-m", "hpd_operator", "run", *args],
        {"KUBECONFIG": KUBECONFIG_IN_IMAGE},
        {str(private): str(Path(KUBECONFIG_IN_IMAGE).parent)},
    )


@pytest.fixture(scope="session")
def operator_image() -> str:
    """The operator image, built with buildah from this checkout (cached by content hash)."""
    from hpd_devcluster import images

    return images.ensure_image("operator")


@pytest.fixture()
def start_operator(
    operator_image: str, tmp_path: Path, operator_logs: list[Path]
) -> Iterator[Callable[[Path, list[str]], OperatorProcess]]:
    """start(kubeconfig, args) runs the operator FROM ITS IMAGE with exactly `args` (the chart's Deployment args)
    except its two ports: liveness off, metrics on a loopback port the OS picks (host network; `--metrics-port-file`,
    no free-then-bind race). Returns once that port is known. Stopped at teardown; its log printed on failure."""
    started: list[OperatorProcess] = []

    def start(kubeconfig: Path, args: list[str]) -> OperatorProcess:
        keep = [a for a in args if not a.startswith(("--liveness-port", "--metrics-port"))]
        log = tmp_path / f"operator-{len(started)}.log"
        operator_logs.append(log)
        port_file = f"metrics-port-{uuid.uuid4().hex[:8]}"
        ports = ["--liveness-port=0", f"--metrics-port-file={PORT_FILES_IN_IMAGE / port_file}"]
        with log.open("ab") as f:
            proc = subprocess.Popen(
                operator_argv(operator_image, [*keep, *ports], kubeconfig), stdout=f, stderr=subprocess.STDOUT, cwd=REPO
            )
        op = OperatorProcess(proc, log, 0)
        started.append(op)  # stopped at teardown even when its port never shows
        op.metrics_port = port_written_in_image(proc, port_file)
        return op

    yield start
    for op in started:
        op.stop()


@pytest.fixture()
def make_namespace(api_client: object) -> Iterator[Callable[[str], str]]:
    """make(prefix) creates a fresh namespace; all are deleted at teardown."""
    import uuid

    from kubernetes import client

    core = client.CoreV1Api(api_client)
    made: list[str] = []

    def make(prefix: str) -> str:
        name = f"{prefix}-{uuid.uuid4().hex[:8]}"
        core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name)))
        made.append(name)
        return name

    yield make
    for name in made:
        core.delete_namespace(name)


@dataclasses.dataclass(frozen=True)
class Cluster:
    """What the cluster-side chart tests use, in one fixture: helm, the admin kubeconfig and client, fresh
    namespaces, the operator process, and a temp dir."""

    helm: Helm
    kubeconfig: Path
    api: Any
    make_namespace: Callable[[str], str]
    start_operator: Callable[[Path, list[str]], OperatorProcess]
    tmp: Path


@pytest.fixture()
def k8s(
    helm: Helm,
    kubeconfig: Path,
    api_client: Any,
    make_namespace: Callable[[str], str],
    start_operator: Callable[[Path, list[str]], OperatorProcess],
    tmp_path: Path,
) -> Cluster:
    return Cluster(helm, kubeconfig, api_client, make_namespace, start_operator, tmp_path)
