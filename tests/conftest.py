"""Shared fixtures. The local control plane is started once per test session (and stopped at its end): under
pytest-xdist once per worker (each worker is its own session and process, so its cluster is `pytest-<its pid>`, on
ports of its own, with its own state directory)."""

from __future__ import annotations

import json
import os
import time
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
    from hpd_devcluster import cluster, lifecycle

    name = os.environ.get("HPD_TEST_CLUSTER")
    if name:
        state = cluster.ClusterState.load(name)
        if state is None or not cluster.healthy(state):
            pytest.fail(f"HPD_TEST_CLUSTER={name} is not running: python -m hpd_devcluster --name {name} up")
        yield state
        return
    name = f"pytest-{os.getpid()}"
    t0 = time.monotonic()
    state = lifecycle.up(name)
    up_s = time.monotonic() - t0
    try:
        yield state
    finally:
        t1 = time.monotonic()
        lifecycle.down(name)
        _record_timing(name, up_s, time.monotonic() - t1)


def _record_timing(name: str, up_s: float, down_s: float) -> None:
    """The control plane's start and stop times, one JSON line per session (per xdist worker) appended to the file
    $HPD_TEST_TIMINGS names, when it is set (bench/results' test-time tables are made from it)."""
    path = os.environ.get("HPD_TEST_TIMINGS")
    if path:
        worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
        line = {"cluster": name, "worker": worker, "up_s": round(up_s, 2), "down_s": round(down_s, 2)}
        with open(path, "a") as f:
            f.write(json.dumps(line) + "\n")


REAL_NODE_GROUP = "real-node"
"""The xdist scope of every tests/cluster/test_real_node*.py test: the real node's kubelet, containerd and CNI bridge
are one per machine (realnode.py), so those tests all run in one worker, one after another."""


def xdist_scope(nodeid: str) -> str:
    """Which tests share a worker under `pytest -n N`: the tests of one module (its module-scoped fixtures, a built
    image, a LeaderWorkerSet controller, a Prometheus, are made once), and all the real-node modules together.

    A scheduler of our own (below), not `xdist_group` marks with `--dist loadgroup`: pytest-xdist 3.8 groups by
    rewriting `item._nodeid`, which pytest 9 no longer reads (a node's id is `_id`), so its groups are silently
    ignored (measured: a marked group spread over 3 workers)."""
    path = nodeid.split("::", 1)[0]
    if path.startswith("tests/cluster/") and path.rsplit("/", 1)[-1].startswith("test_real_node"):
        return REAL_NODE_GROUP
    return path


LONGEST_SCOPES_FIRST = (
    REAL_NODE_GROUP,
    "tests/versions/",
    "tests/cluster/test_multi_node.py",
    "tests/chart/",
    "tests/cluster/test_event_driven.py",
    "tests/images/",
    "tests/monitoring/",
    "tests/cluster/",
)
"""The scopes that take longest, in the order they start (the rest follow in collection order). Under `-n N` a
scope runs whole on one worker, so the longest must not start last: the real-node modules (one scope, run one after
another) are the run's critical path, tests/versions' vLLM imports and CPU runs of vLLM the heaviest CPU
(bench/results/2026-12-03-test-times.json, `slowest_40`: the last 12 minutes of a run that left them for last were
these alone). Serially the order changes nothing but the order."""


def _scope_rank(nodeid: str) -> int:
    scope = xdist_scope(nodeid)
    return next((i for i, p in enumerate(LONGEST_SCOPES_FIRST) if scope.startswith(p)), len(LONGEST_SCOPES_FIRST))


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The longest scopes first (`LONGEST_SCOPES_FIRST`); a stable sort, so each module keeps its own order."""
    items.sort(key=lambda item: _scope_rank(item.nodeid))


def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object:
    """Under `-n N`: whole scopes (`xdist_scope`) go to one worker each, in collection order (longest first, above),
    the next to whichever worker is free. xdist's own reordering (by the number of tests in a scope) is off: a scope
    of many quick unit tests is not a long one."""
    from xdist.scheduler import LoadScopeScheduling

    class Scopes(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return xdist_scope(nodeid)

    config.option.loadscopereorder = False
    return Scopes(config, log)


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
    _record_phase(item.nodeid, call)


def _record_phase(nodeid: str, call: pytest.CallInfo[None]) -> None:
    """Each test phase's worker, start (epoch s) and duration, one JSON line in $HPD_TEST_TIMINGS when it is set: what
    each worker ran when (bench/results' test-time tables; `--durations` has no worker and no start)."""
    path = os.environ.get("HPD_TEST_TIMINGS")
    if path:
        worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
        line = {"test": nodeid, "phase": call.when, "worker": worker, "start": round(call.start, 2),
                "seconds": round(call.duration, 2)}  # fmt: skip
        with open(path, "a") as f:
            f.write(json.dumps(line) + "\n")
