"""A real Prometheus (Debian's 2.42) scrapes the whole P/D stack on loopback, and every dashboard query and every
alert expression is evaluated through its HTTP API.

Scraped: the operator (`python -m hpd_operator run`) while a CR reconciles on the local control plane; a prefill and
a decode "pod" = `python -m hpd_runtime launch` running the vLLM stand-in (vLLM 0.20's metric names and labels,
tests/runtime/vllm_metrics.py) with the runtime's /metrics beside it; a real vllm-router 0.1.17 in
--vllm-pd-disaggregation mode in front of the two stand-ins. The engine and router targets carry the pod labels a
PodMonitor sees (`__meta_kubernetes_pod_label_*`) and are relabeled with the builder's own PodMonitor relabelings,
so the `role` and `hybridpddeployment` labels come from the code under test, not from the test.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml
from kubernetes import client

from hpd_devcluster import adapter
from hpd_devcluster.testing import wait_for
from hpd_operator.monitoring import __main__ as gen
from hpd_operator.monitoring import dashboard, rules
from hpd_operator.render import render
from hpd_runtime import contract as c
from tests.cluster.kube import bound_port

from .prom import LOOPBACK, Prometheus, free_port, pod_monitor_scrape_configs

pytestmark = pytest.mark.cluster
REPO = Path(__file__).resolve().parents[2]
FAKE_VLLM = REPO / "tests" / "runtime" / "fake_vllm.py"
CRD = REPO / "crds" / "hybridpddeployments.hybridpd.io.yaml"
SEED = REPO / "examples" / "nemotron-3-nano.yaml"
CR_NAME = "nemotron-3-nano"
KV = {"prefill": "kv_producer", "decode": "kv_consumer"}
METRIC = re.compile(r"\b(?:vllm:[a-z0-9_:]+|vllm_router_[a-z0-9_]+|hpd_[a-z0-9_]+|controller_runtime_[a-z0-9_]+)")
ONLY_AFTER_A_FAILURE = frozenset({"hpd_operator_api_errors_total"})
"""Labelled counters without a child until the first failure: Prometheus knows them from # HELP/# TYPE only."""
_NO_PROXY = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def _post(url: str, body: dict[str, Any]) -> int:
    req = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"}, method="POST")
    try:
        with _NO_PROXY.open(req, timeout=30) as r:
            return int(r.status)
    except urllib.error.HTTPError as e:
        return int(e.code)


def _get(url: str) -> int:
    try:
        with _NO_PROXY.open(url, timeout=5) as r:
            return int(r.status)
    except urllib.error.HTTPError as e:
        return int(e.code)
    except OSError:
        return 0


@dataclass
class Stack:
    prom: Prometheus
    fakes: dict[str, str]
    router: str
    namespace: str


class Procs:
    def __init__(self, workdir: Path) -> None:
        self.workdir, self.procs = workdir, []  # type: list[subprocess.Popen[bytes]]

    def start(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
        with (self.workdir / f"{name}.log").open("wb") as f:
            p = subprocess.Popen(argv, env=env or dict(os.environ), stdout=f, stderr=subprocess.STDOUT, cwd=REPO)
        self.procs.append(p)
        return p

    def logs(self) -> str:
        return "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')[-3000:]}" for p in self.workdir.glob("*.log"))

    def stop(self) -> None:
        for p in reversed(self.procs):
            if p.poll() is None:
                p.terminate()
                try:
                    p.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait(timeout=10)


def _engine(procs: Procs, role: str, workdir: Path, prefill: tuple[int, int] | None = None) -> tuple[int, int]:
    """One engine 'pod': hpd_runtime launch + the vLLM stand-in (role from --kv-transfer-config, as in vLLM). A decode
    given its `prefill` (vLLM port, runtime port) runs the pair check and the canary against it (on loopback: the
    "Service" is its address), so the data-path series exist."""
    vllm_port, runtime_port = free_port(), free_port()
    env = {
        **os.environ,
        c.ENV_ROLE: role,
        c.ENV_MODEL: "fake-model",
        c.ENV_VLLM_VERSION: "0.20.0",
        c.ENV_GPU_PRODUCT: "NVIDIA H200",
        c.ENV_TENSOR_PARALLEL_SIZE: "1",
        c.ENV_VLLM_PORT: str(vllm_port),
        c.ENV_VLLM_HOST: LOOPBACK,
        c.ENV_RUNTIME_PORT: str(runtime_port),
        c.ENV_RUNTIME_HOST: LOOPBACK,
        c.ENV_CACHE_DIR: str(workdir / f"cache-{role}"),
        c.ENV_MAX_MODEL_LEN: "2048",
        c.ENV_WARMUP_CONCURRENCY: "2",
        c.ENV_VLLM_COMMAND: f"{sys.executable} {FAKE_VLLM}",
    }
    kv = json.dumps({"kv_connector": "NixlConnector", "kv_role": KV[role]})
    argv = [sys.executable, "-m", "hpd_runtime", "launch", "--", "fake-model", "--port", str(vllm_port)]
    if prefill is not None:
        env |= {
            c.ENV_WARMUP_PAIR_CHECK: "true",
            c.ENV_PREFILL_SERVICE: LOOPBACK,
            c.ENV_PREFILL_PORT: str(prefill[0]),
            c.ENV_PREFILL_RUNTIME_PORT: str(prefill[1]),
            c.ENV_CANARY_SECONDS: "2",
            c.ENV_KV_FABRIC: "tcp",
        }
        argv.append("--enable-prompt-tokens-details")
    procs.start(f"engine-{role}", [*argv, "--kv-transfer-config", kv], env)
    return vllm_port, runtime_port


def _pod(component: str, namespace: str, ports: dict[str, int]) -> dict[str, Any]:
    """A pod as a PodMonitor discovers it: its labels, name, container and named container ports (on loopback)."""
    container = "router" if component == "router" else "vllm"
    return {
        "labels": {c.LABEL_COMPONENT: component, c.LABEL_INSTANCE: CR_NAME},
        "namespace": namespace,
        "pod": f"{CR_NAME}-{component}-0",
        "container": container,
        "ports": ports,
    }


def _operator(procs: Procs, kubeconfig: Path, namespace: str) -> int:
    """The operator's metrics port: the operator binds one the OS picks and writes it to a file (no free-then-bind)."""
    port_file = procs.workdir / "operator.metrics-port"
    env = {**os.environ, "KUBECONFIG": str(kubeconfig)}
    argv = [sys.executable, "-m", "hpd_operator", "run", "--namespace", namespace, "--liveness-port", "0"]
    proc = procs.start("operator", [*argv, "--metrics-port-file", str(port_file), "--resync-seconds", "2"], env)
    return bound_port(port_file, proc)


def _apply_crd(api: client.ApiClient, kubeconfig: Path) -> None:
    """The CRD, Established, before the operator starts: it resolves its resources once at start (no CRD scanning,
    hpd_operator/settings.py), so an operator started first never serves the CR."""
    from hpd_devcluster.build import binaries

    kubectl = [str(binaries().kubectl), "--kubeconfig", str(kubeconfig)]
    subprocess.run([*kubectl, "apply", "--server-side", "--force-conflicts", "-f", str(CRD)], check=True, timeout=60)
    ext = client.ApiextensionsV1Api(api)

    def established() -> bool:
        conds = ext.read_custom_resource_definition(f"{c.PLURAL}.{c.GROUP}").status.conditions or []
        return any(x.type == "Established" and x.status == "True" for x in conds)

    # polled, not `kubectl wait`: that fails at once when it runs before the CRD's first status (seen here)
    wait_for(established, 30, what="the CRD Established")


def _create_cr(api: client.ApiClient, namespace: str) -> None:
    client.CoreV1Api(api).create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=namespace)))
    doc = yaml.safe_load(SEED.read_text())
    doc["metadata"] = {"name": CR_NAME, "namespace": namespace}
    doc["spec"]["decode"]["autoscaling"] = {"minReplicas": 1, "maxReplicas": 1}
    client.CustomObjectsApi(api).create_namespaced_custom_object(c.GROUP, c.VERSION, namespace, c.PLURAL, doc)


def _pod_monitors(namespace: str) -> dict[str, dict[str, Any]]:
    """The PodMonitors the operator applies for the seed CR, by component (`engines`, `router`)."""
    doc = yaml.safe_load(SEED.read_text())
    doc["metadata"] = {"name": CR_NAME, "namespace": namespace}
    doc["spec"]["monitoring"] = {"podMonitor": True}
    monitors = {m["metadata"]["labels"][c.LABEL_COMPONENT]: m for m in render([doc]) if m["kind"] == "PodMonitor"}
    assert sorted(monitors) == ["engines", "router"], monitors
    return monitors


def _cr_phase(api: client.ApiClient, namespace: str) -> str | None:
    cr = client.CustomObjectsApi(api).get_namespaced_custom_object(c.GROUP, c.VERSION, namespace, c.PLURAL, CR_NAME)
    return (cr.get("status") or {}).get("phase")  # type: ignore[no-any-return]


@pytest.fixture(scope="module")
def stack(
    devcluster: Any, api_client: client.ApiClient, kubeconfig: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Stack]:
    workdir = tmp_path_factory.mktemp("prom-stack")
    procs = Procs(workdir)
    namespace = f"mon-{os.getpid()}"
    prom: Prometheus | None = None
    scaler: adapter.Adapter | None = None
    try:
        engines = {"prefill": _engine(procs, "prefill", workdir)}
        engines["decode"] = _engine(procs, "decode", workdir, prefill=engines["prefill"])
        router_port, router_metrics = free_port(), free_port()
        procs.start(
            "router",
            [
                str(Path(sys.executable).with_name("vllm-router")),
                "--vllm-pd-disaggregation",
                "--kv-connector",
                "nixl",
                "--prefill",
                f"http://{LOOPBACK}:{engines['prefill'][0]}",
                "--decode",
                f"http://{LOOPBACK}:{engines['decode'][0]}",
                "--host",
                LOOPBACK,
                "--port",
                str(router_port),
                # the builder passes --prometheus-host 0.0.0.0 in pods; tests stay on loopback
                "--prometheus-host",
                LOOPBACK,
                "--prometheus-port",
                str(router_metrics),
                "--health-check-interval-secs",
                "1",
                "--health-check-endpoint",
                c.PATH_VLLM_HEALTH,
            ],
        )
        _apply_crd(api_client, kubeconfig)
        op_port = _operator(procs, kubeconfig, namespace)
        # Scraped as the Prometheus Operator scrapes the operator's PodMonitors: each endpoint's port and path
        # (vLLM's metrics through the runtime port's /vllm/metrics, never vLLM's API port) and relabelings.
        monitors = _pod_monitors(namespace)
        engine_pods = [
            _pod(role, namespace, {c.PORT_NAME_HTTP: vllm, c.PORT_NAME_RUNTIME: rt})
            for role, (vllm, rt) in engines.items()
        ]
        router_pods = [_pod("router", namespace, {c.PORT_NAME_ROUTER_METRICS: router_metrics})]
        scrape = [
            *pod_monitor_scrape_configs(monitors["engines"], engine_pods),
            *pod_monitor_scrape_configs(monitors["router"], router_pods),
            {  # like the chart's ServiceMonitor: honorLabels keeps the operator's per-CR namespace label
                "job_name": "operator",
                "honor_labels": True,
                "static_configs": [
                    {"targets": [f"{LOOPBACK}:{op_port}"], "labels": {"namespace": "hpd-system", "pod": "operator-0"}}
                ],
            },
        ]
        prom = Prometheus(workdir, scrape, [gen.RULES_PATH])
        # decode autoscales (min = max = 1) on the scraped stand-in's signals, through the real metrics adapter:
        # the dashboard's autoscaling panels and HPDAutoscalerAtMaxOverTarget read what the operator then exports
        scaler = adapter.start(devcluster, prom.url, gen.ADAPTER_RULES_PATH)
        _create_cr(api_client, namespace)

        fakes = {role: f"http://{LOOPBACK}:{ports[0]}" for role, ports in engines.items()}
        runtime = {role: f"http://{LOOPBACK}:{ports[1]}" for role, ports in engines.items()}
        router = f"http://{LOOPBACK}:{router_port}"
        for role, url in runtime.items():
            wait_for(lambda u=url: _get(u + c.PATH_READYZ) == 200, 180, what=f"{role} runtime /readyz (warmup done)")
        wait_for(lambda: _get(router + "/readiness") == 200, 120, what="router /readiness")
        wait_for(lambda: _cr_phase(api_client, namespace) == "Ready", 180, what="the CR Ready")
        # Prometheus must have a sample of every counter before the failures, or increase() sees no change
        wait_for(lambda: _all_up(prom), 60, what="every scrape target up")
        _drive_traffic(prom, fakes, router)
        yield Stack(prom, fakes, router, namespace)
    except BaseException:
        print(procs.logs())
        raise
    finally:
        if scaler is not None:
            adapter.stop(devcluster, scaler)
        if prom is not None:
            prom.stop()
        procs.stop()
        try:
            client.CoreV1Api(api_client).delete_namespace(namespace)
        except client.ApiException:
            pass


def _all_up(prom: Prometheus) -> list[dict[str, Any]] | None:
    ts = prom.targets()
    return ts if ts and all(t["health"] == "up" for t in ts) else None


def _completion(router: str, n: int) -> int:
    return _post(router + "/v1/completions", {"model": "fake-model", "prompt": list(range(1, 40 + n)), "max_tokens": 4})


def _fail_then_scrape(prom: Prometheus, request: Callable[[], int], series: str) -> None:
    assert request() >= 500
    wait_for(lambda: prom.query(series)["data"]["result"], 30, what=f"{series} scraped")
    assert request() >= 500 and request() >= 500


def _drive_traffic(prom: Prometheus, fakes: dict[str, str], router: str) -> None:
    """Healthy P/D traffic, then one failing prefill and one failing KV load (router errors, vLLM errors), then the
    injected P/D signals that only a real failure produces (expired KV on prefill, failed notifications, deferred)."""
    assert [_completion(router, i) for i in range(12)] == [200] * 12
    # vllm-router creates an error counter at its first error with value 1, which rate() cannot see: fail once,
    # let Prometheus scrape the new series, then fail twice more.
    assert _post(fakes["prefill"] + "/_control", {"fail": "completions"}) == 200
    _fail_then_scrape(prom, lambda: _completion(router, 100), "vllm_router_pd_prefill_errors_total")
    assert _post(fakes["prefill"] + "/_control", {"fail": None}) == 200
    assert _post(fakes["decode"] + "/_control", {"metrics": {"nixl_fail": True}}) == 200
    _fail_then_scrape(prom, lambda: _completion(router, 200), "vllm_router_pd_decode_errors_total")
    assert _post(fakes["decode"] + "/_control", {"metrics": {"nixl_fail": False, "failed_notifications": 1}}) == 200
    assert _post(fakes["prefill"] + "/_control", {"metrics": {"kv_expired": 1}}) == 200
    assert [_completion(router, i) for i in range(3)] == [200] * 3


# --- the check -----------------------------------------------------------------------------------------------
def grafana_to_promql(expr: str) -> str:
    """Grafana's variables as a user with 'All' selected would send them."""
    return expr.replace("$__rate_interval", "5m").replace("$namespace", ".*").replace("$hybridpddeployment", ".*")


def metric_names(expr: str) -> set[str]:
    return set(METRIC.findall(expr))


def _known(prom: Prometheus, name: str) -> bool:
    """The metric has series, or (a labelled metric without children yet) Prometheus scraped its # TYPE.

    Metadata is keyed by family: the text format names a counter family `x_total`, OpenMetrics (what
    prometheus_client serves Prometheus) names it `x`; histogram series add `_bucket`, `_sum`, `_count`."""
    if prom.query(f'count({{__name__="{name}"}})')["data"]["result"]:
        return True
    meta = prom.api("metadata")["data"]
    if name in meta:
        return True
    family, suffix = re.match(r"(.*?)(_total|_bucket|_sum|_count)?$", name).groups()  # type: ignore[union-attr]
    kinds = {"_total": {"counter"}, "_bucket": {"histogram"}, "_sum": {"histogram", "summary"}}
    want = kinds.get(suffix or "", {"histogram", "summary"} if suffix == "_count" else set())
    return any(m.get("type") in want for m in meta.get(family, []))


def problems(prom: Prometheus, expr: str, *, must_have_data: bool) -> list[str]:
    """Why `expr` is broken: a query error, a metric Prometheus never saw, or (if asked) an empty result."""
    out: list[str] = []
    reply = prom.query(grafana_to_promql(expr))
    if reply.get("status") != "success":
        return [f"{expr}: {reply.get('errorType')}: {reply.get('error')}"]
    names = metric_names(expr)
    if not names:
        out.append(f"{expr}: names no metric this test knows how to check")
    out += [f"{expr}: metric {n} not scraped from any target" for n in sorted(names) if not _known(prom, n)]
    if must_have_data and not reply["data"]["result"] and not names <= ONLY_AFTER_A_FAILURE:
        out.append(f"{expr}: empty result")
    return out


def problems_eventually(prom: Prometheus, exprs: list[str], *, must_have_data: bool, timeout: float) -> list[str]:
    """Poll until no expression has a problem (scrapes arrive every second) or the deadline; the last problems."""
    deadline = time.monotonic() + timeout
    while True:
        found = [p for e in exprs for p in problems(prom, e, must_have_data=must_have_data)]
        if not found or time.monotonic() > deadline:
            return found
        time.sleep(1)


def _dashboard_exprs() -> list[str]:
    return [e for _, e in dashboard.queries(json.loads(gen.DASHBOARD_PATH.read_text()))]


# --- tests ---------------------------------------------------------------------------------------------------
def test_every_target_is_up_and_relabeled_with_role_and_cr(stack: Stack) -> None:
    targets = wait_for(lambda: _all_up(stack.prom), 30, what="every scrape target up")
    roles = sorted(t["labels"].get("role", "") for t in targets if t["labels"]["job"] != "operator")
    assert roles == ["decode", "decode", "prefill", "prefill", "router"]
    assert all(t["labels"].get("hybridpddeployment") == CR_NAME for t in targets if t["labels"]["job"] != "operator")
    got = stack.prom.query(f'count by (role) (vllm:num_requests_running{{hybridpddeployment="{CR_NAME}"}})')
    assert sorted(r["metric"]["role"] for r in got["data"]["result"]) == ["decode", "prefill"]


def test_vllm_metrics_come_from_the_runtime_port_and_each_target_keeps_its_own_up_series(stack: Stack) -> None:
    """No scrape reaches vLLM's API port (it serves completions; the NetworkPolicy admits Prometheus on the runtime
    port only), and the two targets sharing that port stay two series: `up` once per pod and endpoint."""
    targets = wait_for(lambda: _all_up(stack.prom), 30, what="every scrape target up")
    vllm_ports = {urlsplit(url).port for url in stack.fakes.values()}
    engine_urls = [urlsplit(t["scrapeUrl"]) for t in targets if t["labels"].get("role") in ("prefill", "decode")]
    assert sorted(u.path for u in engine_urls) == ["/metrics", "/metrics", "/vllm/metrics", "/vllm/metrics"]
    assert not [u for u in engine_urls if u.port in vllm_ports], engine_urls
    up = stack.prom.query('up{role=~"prefill|decode"}')["data"]["result"]
    assert sorted((r["metric"]["pod"], r["metric"]["endpoint"], r["value"][1]) for r in up) == [
        (f"{CR_NAME}-decode-0", "runtime", "1"),
        (f"{CR_NAME}-decode-0", "vllm", "1"),
        (f"{CR_NAME}-prefill-0", "runtime", "1"),
        (f"{CR_NAME}-prefill-0", "vllm", "1"),
    ]
    running = stack.prom.query("vllm:num_requests_running")["data"]["result"]
    assert {r["metric"]["endpoint"] for r in running} == {"vllm"}


def test_operator_series_describe_the_cr_under_its_own_namespace(stack: Stack) -> None:
    """honor_labels (as the chart's ServiceMonitor sets it) keeps the CR's namespace on the per-CR series."""
    sel = f'namespace="{stack.namespace}", hybridpddeployment="{CR_NAME}"'
    ready = stack.prom.query(f"hpd_operator_ready_replicas{{{sel}}}")["data"]["result"]
    assert sorted((r["metric"]["role"], r["value"][1]) for r in ready) == [
        ("decode", "1"),
        ("prefill", "1"),
        ("router", "1"),
    ]
    phase = stack.prom.query(f'hpd_operator_hybridpddeployment_status_phase{{{sel}, phase="Ready"}}')
    assert [r["value"][1] for r in phase["data"]["result"]] == ["1"]
    (took,) = stack.prom.query(f"hpd_operator_time_to_ready_seconds{{{sel}}}")["data"]["result"]
    assert 0 <= float(took["value"][1]) < 600
    total = stack.prom.query('sum(controller_runtime_reconcile_total{result="success"})')["data"]["result"]
    assert float(total[0]["value"][1]) >= 1


def test_every_dashboard_query_returns_data(stack: Stack) -> None:
    exprs = _dashboard_exprs()
    assert len(exprs) >= 40
    assert problems_eventually(stack.prom, exprs, must_have_data=True, timeout=60) == []


def test_every_alert_expression_evaluates_on_scraped_metrics(stack: Stack) -> None:
    exprs = [a.expr for a in rules.alerts()]
    assert problems_eventually(stack.prom, exprs, must_have_data=False, timeout=60) == []


@pytest.mark.parametrize(
    "alert",
    [
        "HPDNixlTransfersFailing",
        "HPDNixlNotificationsFailing",
        "HPDKVExpiredOnPrefill",
        "HPDKVLoadErrors",
        "HPDRouterPDErrors",
    ],
)
def test_injected_failure_makes_the_alert_expression_true(stack: Stack, alert: str) -> None:
    expr = next(a.expr for a in rules.alerts() if a.name == alert)
    result = wait_for(lambda: stack.prom.query(expr)["data"]["result"], 60, what=f"{alert} expression non-empty")
    assert all(r["metric"]["namespace"] == stack.namespace for r in result)


def test_healthy_stack_keeps_the_operator_and_readiness_alerts_silent(stack: Stack) -> None:
    for name in ("HPDRolePoolEmpty", "HPDWarmupOverBudget", "HPDOperatorReconcileErrors", "HPDNixlBroken"):
        expr = next(a.expr for a in rules.alerts() if a.name == name)
        assert stack.prom.query(expr)["data"]["result"] == [], name


@pytest.mark.parametrize(
    ("expr", "misspelled"),
    [
        (
            'sum by (role) (vllm:num_requests_waiting_by_reason{role="decode"})',
            'sum by (role) (vllm:num_requests_waiting_by_reasons{role="decode"})',
        ),
        ("sum(rate(vllm:nixl_num_failed_transfers_total[5m]))", "sum(rate(vllm:nixl_num_failed_transfers[5m]))"),
        ("vllm_router_worker_health", "vllm_router_workers_health"),
    ],
)
def test_a_misspelled_metric_name_fails_the_check(stack: Stack, expr: str, misspelled: str) -> None:
    assert problems_eventually(stack.prom, [expr], must_have_data=True, timeout=30) == []
    found = problems(stack.prom, misspelled, must_have_data=False)
    assert found and "not scraped from any target" in found[0], found
