"""Shared fixtures. The local control plane is started once per test session (and stopped at its end)."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="session")
def devcluster() -> Iterator[object]:
    """A real etcd + kube-apiserver + controller-manager + scheduler + kwok on 127.0.0.1, with fake GPU nodes.

    Reuses a running cluster named by $HPD_TEST_CLUSTER (for fast local iteration); otherwise starts its own and
    stops it at the end of the session. Binaries are built once into ~/.cache/hybrid-pd.
    """
    from hpd_devcluster import cluster

    name = os.environ.get("HPD_TEST_CLUSTER")
    if name:
        state = cluster.ClusterState.load(name)
        if state is None or not cluster.healthy(state):
            pytest.fail(f"HPD_TEST_CLUSTER={name} is not running: python -m hpd_devcluster --name {name} up")
        yield state
        return
    with cluster.running(f"pytest-{os.getpid()}") as state:
        yield state


@pytest.fixture(scope="session")
def kubeconfig(devcluster: object) -> Path:
    return devcluster.kubeconfig  # type: ignore[attr-defined, no-any-return]


@pytest.fixture(scope="session")
def api_client(kubeconfig: Path) -> object:
    from kubernetes import client, config

    cfg = client.Configuration()
    config.load_kube_config(config_file=str(kubeconfig), client_configuration=cfg)
    return client.ApiClient(cfg)


@pytest.fixture()
def namespace(api_client: object) -> Iterator[str]:
    """A fresh namespace per test, deleted afterwards."""
    from kubernetes import client

    core = client.CoreV1Api(api_client)
    name = f"t-{uuid.uuid4().hex[:10]}"
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name)))
    wait_for_default_service_account(core, name)
    yield name
    core.delete_namespace(name)


def wait_for_default_service_account(core: object, namespace: str) -> None:
    """Pods are refused until the ServiceAccount controller made `default` (under load that takes a while), and a
    ReplicaSet backs off exponentially after a refused pod: wait for it before anything creates pods."""
    from kubernetes import client

    from hpd_devcluster.testing import wait_for

    assert isinstance(core, client.CoreV1Api)
    wait_for(lambda: core.read_namespaced_service_account("default", namespace), 60, what=f"{namespace}/default SA")


@pytest.fixture()
def operator_logs(request: pytest.FixtureRequest) -> Iterator[list[Path]]:
    """Fixtures that start an operator append its log file here; at teardown (after theirs: they depend on this one,
    so their operators are stopped by then) the tail of each is printed when the test failed or never ran."""
    logs: list[Path] = []
    yield logs
    rep = getattr(request.node, "rep_call", None)
    if rep is None or rep.failed:
        for log in logs:
            print(f"--- operator log ({log}) ---\n" + log.read_text(errors="replace")[-20000:])


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    outcome = yield
    rep = outcome.get_result()  # type: ignore[attr-defined]
    if rep.when == "call":  # read by `operator_logs`
        item.rep_call = rep  # type: ignore[attr-defined]
