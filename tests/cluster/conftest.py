"""Cluster-test fixtures: the CRD, the operator as a subprocess (its log printed when a test fails; the outcome comes
from the makereport hook in tests/conftest.py)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from kubernetes import client

from hpd_devcluster.testing import describing, wait_for

from .kube import CRD, REPO, RESYNC, G, P, bound_port, kubectl, snapshot


@pytest.fixture(autouse=True)
def _namespace_on_timeout(request: pytest.FixtureRequest) -> Iterator[None]:
    """A test that has a `namespace`: every wait of it that times out (hpd_devcluster.testing.wait_for, kube.hold)
    also prints that namespace as it was then (CRs' conditions, Deployments, pods, Events)."""
    if "namespace" not in request.fixturenames:
        yield
        return
    ns, api = request.getfixturevalue("namespace"), request.getfixturevalue("api_client")
    with describing(lambda: snapshot(api, ns)):
        yield


@pytest.fixture(scope="session")
def crd(kubeconfig: Path, api_client: client.ApiClient) -> None:
    kubectl(kubeconfig, "apply", "--server-side", "--force-conflicts", "-f", str(CRD))
    ext = client.ApiextensionsV1Api(api_client)

    def established() -> bool:
        conds = ext.read_custom_resource_definition(f"{P}.{G}").status.conditions or []
        return any(c.type == "Established" and c.status == "True" for c in conds)

    # polled, not `kubectl wait`: that can fail at once when it runs before the CRD's first status
    wait_for(established, 30, what="the CRD Established")


class Operator:
    """`python -m hpd_operator run --namespace NS` as a subprocess; start/stop/kill at will."""

    def __init__(
        self, kubeconfig: Path, namespace: str, log: Path, resync: str = RESYNC, extra: tuple[str, ...] = ()
    ) -> None:
        self.kubeconfig, self.namespace, self.log, self.resync = kubeconfig, namespace, log, resync
        self.extra = extra
        self.proc: subprocess.Popen[bytes] | None = None
        self.port_file = log.with_name(log.name + ".metrics-port")
        self._metrics_port = 0

    @property
    def metrics_port(self) -> int:
        """The metrics port this start of the operator bound (the OS picks it; the operator writes it to
        `port_file`): read, and waited for, on first use after each start."""
        if not self._metrics_port:
            assert self.proc is not None, "the operator is not running"
            self._metrics_port = bound_port(self.port_file, self.proc)
        return self._metrics_port

    def start(self) -> None:
        self.port_file.unlink(missing_ok=True)  # a restart binds (and writes) a port of its own
        self._metrics_port = 0
        env = {**os.environ, "KUBECONFIG": str(self.kubeconfig)}
        with self.log.open("ab") as f:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "hpd_operator", "run", "--namespace", self.namespace, "--liveness-port", "0",
                 "--metrics-port-file", str(self.port_file), "--resync-seconds", self.resync, *self.extra],
                env=env, stdout=f, stderr=subprocess.STDOUT, cwd=REPO,
            )  # fmt: skip

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        self.proc = None


@pytest.fixture()
def operator(
    crd: None, kubeconfig: Path, namespace: str, tmp_path: Path, operator_logs: list[Path]
) -> Iterator[Operator]:
    op = Operator(kubeconfig, namespace, tmp_path / "operator.log")
    operator_logs.append(op.log)
    op.start()
    yield op
    op.stop()


@pytest.fixture()
def operator_factory(
    crd: None, kubeconfig: Path, namespace: str, tmp_path: Path, operator_logs: list[Path]
) -> Iterator[Callable[..., Operator]]:
    """start(*extra_args, via=KUBECONFIG): the operator without the safety resync; stopped at teardown."""
    started: list[Operator] = []

    def start(*extra: str, via: Path = kubeconfig) -> Operator:
        op = Operator(via, namespace, tmp_path / f"operator-{len(started)}.log", "3600", extra=extra)
        operator_logs.append(op.log)
        op.start()
        started.append(op)
        return op

    yield start
    for op in started:
        op.stop()
