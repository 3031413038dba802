"""Monitoring pieces that need no Prometheus: PodMonitor relabeling, operator metric helpers, generated files."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml
from prometheus_client import generate_latest

from hpd_operator import metrics
from hpd_operator.api.parse import parse_cr
from hpd_operator.builders.monitoring import CR_LABEL, ROLE_LABEL, build_pod_monitors
from hpd_operator.monitoring import __main__ as gen
from hpd_operator.monitoring import dashboard, rules

REPO = Path(__file__).resolve().parents[2]
SEED = REPO / "examples" / "nemotron-3-nano.yaml"


def _cr(**monitoring: Any) -> Any:
    doc = yaml.safe_load(SEED.read_text())
    doc["metadata"].setdefault("namespace", "ns1")
    doc["spec"]["monitoring"] = {"podMonitor": True, **monitoring}
    return parse_cr(doc)


def test_pod_monitors_relabel_component_into_role_and_name_the_cr() -> None:
    engines, router = build_pod_monitors(_cr())
    for pm in (engines, router):
        for ep in pm["spec"]["podMetricsEndpoints"]:
            assert {
                "action": "replace",
                "sourceLabels": ["__meta_kubernetes_pod_label_app_kubernetes_io_component"],
                "targetLabel": ROLE_LABEL,
            } in ep["relabelings"]
            assert {"action": "replace", "targetLabel": CR_LABEL, "replacement": "nemotron-3-nano"} in ep["relabelings"]
    assert [ep["port"] for ep in router["spec"]["podMetricsEndpoints"]] == ["metrics"]


def test_vllm_is_scraped_through_the_runtime_port_never_the_api_port() -> None:
    """vLLM's API port also serves completions: Prometheus reads vLLM's metrics where the runtime relays them, and the
    two targets on the runtime port carry different `endpoint` labels (the Prometheus Operator would otherwise give
    both the port name, and their `up` series would be one)."""
    engines, _ = build_pod_monitors(_cr())
    eps = engines["spec"]["podMetricsEndpoints"]
    assert [(ep["port"], ep["path"]) for ep in eps] == [("runtime", "/vllm/metrics"), ("runtime", "/metrics")]
    endpoint_labels = [
        next((r["replacement"] for r in ep["relabelings"] if r.get("targetLabel") == "endpoint"), ep["port"])
        for ep in eps
    ]
    assert endpoint_labels == ["vllm", "runtime"]


def test_pod_monitor_extra_labels_never_replace_the_operators_own() -> None:
    engines, _ = build_pod_monitors(
        _cr(labels={"release": "kube-prometheus-stack", "app.kubernetes.io/instance": "hijack"})
    )
    assert engines["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    assert engines["metadata"]["labels"]["app.kubernetes.io/instance"] == "nemotron-3-nano"


def test_time_to_ready_is_creation_to_ready_transition() -> None:
    ready = {"type": "Ready", "status": "True", "lastTransitionTime": "2026-11-29T10:05:30Z"}
    assert metrics.time_to_ready("2026-11-29T10:00:00Z", [ready]) == 330.0
    assert metrics.time_to_ready("2026-11-29T10:00:00Z", [{**ready, "status": "False"}]) is None
    assert metrics.time_to_ready(None, [ready]) is None


def test_record_status_and_forget_per_cr_series() -> None:
    status = {
        "phase": "Ready",
        "conditions": [{"type": "Ready", "status": "True", "lastTransitionTime": "2026-11-29T10:01:00Z"}],
        "prefill": {"readyReplicas": 1, "summary": "1/2"},
        "decode": {"readyReplicas": 3, "summary": "3/3"},
        "router": {"readyReplicas": 1, "summary": "1/1"},
    }
    metrics.record_status("nsx", "crx", status, "2026-11-29T10:00:00Z")
    text = generate_latest().decode()
    assert 'hpd_operator_desired_replicas{hybridpddeployment="crx",namespace="nsx",role="prefill"} 2.0' in text
    assert 'hpd_operator_ready_replicas{hybridpddeployment="crx",namespace="nsx",role="decode"} 3.0' in text
    assert 'hpd_operator_time_to_ready_seconds{hybridpddeployment="crx",namespace="nsx"} 60.0' in text
    assert (
        'hpd_operator_hybridpddeployment_status_phase{hybridpddeployment="crx",namespace="nsx",phase="Ready"} 1.0'
        in text
    )
    metrics.forget("nsx", "crx")
    assert 'hybridpddeployment="crx"' not in generate_latest().decode()


def test_reconcile_series_exist_at_zero_before_any_reconcile() -> None:
    text = generate_latest().decode()
    for line in (
        'controller_runtime_reconcile_total{controller="hybridpddeployment",result="error"}',
        'controller_runtime_reconcile_errors_total{controller="hybridpddeployment"}',
        'controller_runtime_terminal_reconcile_errors_total{controller="hybridpddeployment"}',
    ):
        assert line in text


def test_generated_monitoring_files_are_in_sync() -> None:
    assert gen.main(["--check"]) == 0, "run `python -m hpd_operator.monitoring`"


def test_check_reports_a_hand_edited_dashboard(tmp_path: Path) -> None:
    for path, text in gen.outputs(tmp_path).items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    assert gen.main(["--check", "--files", str(tmp_path)]) == 0
    (tmp_path / "dashboards" / "hybrid-pd.json").write_text(gen.render_dashboard().replace("p99", "p98", 1))
    assert gen.main(["--check", "--files", str(tmp_path)]) == 1


def test_every_alert_has_a_runbook_line_and_severity() -> None:
    for group in rules.build_rules()["groups"]:
        for rule in group["rules"]:
            assert rule["annotations"]["runbook"].strip() and "\n" not in rule["annotations"]["runbook"]
            # info: a state worth knowing that needs no action (kube-prometheus-stack routes it to no receiver)
            assert rule["labels"]["severity"] in ("info", "warning", "critical")
    infos = [r["alert"] for g in rules.build_rules()["groups"] for r in g["rules"] if r["labels"]["severity"] == "info"]
    assert infos == ["HPDKVPathTCPEmulation"]  # the default one-node topology's slow path: known, not a failure


def test_dashboard_covers_every_role_row() -> None:
    titles = [t for t, _ in dashboard.ROWS]
    assert titles == [
        "Latency per role",
        "Queues and KV cache",
        "NIXL KV transfer (decode pulls from prefill)",
        "Router",
        "Data path after Ready",
        "Readiness and warmup",
        "Autoscaling (per role: its own signal, docs/autoscaling.md)",
        "Operator",
    ]
    dash = dashboard.build_dashboard()
    assert dash["uid"] == dashboard.UID and len(dashboard.queries(copy.deepcopy(dash))) >= 40


def test_docs_list_every_operator_metric_and_every_alert() -> None:
    doc = (REPO / "docs" / "monitoring.md").read_text()
    from prometheus_client import REGISTRY

    names = set()
    for collector in list(REGISTRY._collector_to_names):  # every metric this process registered
        for m in collector.collect():
            if m.name.startswith(("controller_runtime_", "hpd_operator_", "workqueue_")):
                names.add(m.name + ("_total" if m.type == "counter" else ""))
    assert len(names) == 25
    assert [n for n in sorted(names) if f"`{n}`" not in doc] == []
    assert [a.name for a in rules.alerts() if f"`{a.name}`" not in doc] == []


def _sample(name: str, **labels: str) -> float:
    from prometheus_client import REGISTRY

    value = REGISTRY.get_sample_value(name, {"controller": metrics.CONTROLLER, **labels})
    assert value is not None, name
    return float(value)


def test_reconcile_counts_success_errors_and_invalid_specs_like_controller_runtime() -> None:
    import pytest

    from hpd_operator.conditions import Reason

    def snapshot() -> tuple[float, ...]:
        return (
            _sample("controller_runtime_reconcile_total", result="success"),
            _sample("controller_runtime_reconcile_total", result="error"),
            _sample("controller_runtime_reconcile_errors_total"),
            _sample("controller_runtime_terminal_reconcile_errors_total"),
            _sample("controller_runtime_reconcile_time_seconds_count"),
        )

    before = snapshot()
    with metrics.reconcile() as ok:
        ok.failed(None)
    with metrics.reconcile() as invalid:  # the user's input: an error and a terminal error
        invalid.failed(Reason.INVALID_SPEC)
    with metrics.reconcile() as bug:  # reported in the status, but a retry may help: not terminal
        bug.failed(Reason.RECONCILE_ERROR)
    with pytest.raises(RuntimeError), metrics.reconcile():
        raise RuntimeError("apiserver gone")
    after = snapshot()
    assert tuple(a - b for a, b in zip(after, before, strict=True)) == (1, 3, 3, 1, 4)
    assert _sample("controller_runtime_active_workers") == 0


def test_network_policies_let_prometheus_reach_every_pod_monitor_endpoint() -> None:
    """The default NetworkPolicies (spec.networkPolicy) must not silently block what the PodMonitors scrape."""
    from hpd_operator.builders import build_all
    from hpd_operator.profile import compute_profile
    from hpd_operator.validation import validate

    cr = _cr()
    objs = build_all(cr, compute_profile(validate(cr)))
    policies = [o for o in objs if o["kind"] == "NetworkPolicy"]
    monitors = [o for o in objs if o["kind"] == "PodMonitor"]
    assert len(monitors) == 2 and len(policies) == 2
    for pm in monitors:
        (np,) = [p for p in policies if p["spec"]["podSelector"] == pm["spec"]["selector"]]
        from_prometheus = {
            port["port"]
            for rule in np["spec"]["ingress"]
            if any("namespaceSelector" in peer for peer in rule.get("from", []))
            for port in rule.get("ports", [])
        }
        assert {ep["port"] for ep in pm["spec"]["podMetricsEndpoints"]} <= from_prometheus, pm["metadata"]["name"]


def test_operator_pod_monitor_labels_sit_under_the_crs_own() -> None:
    from hpd_operator.__main__ import build_parser

    doc = yaml.safe_load(SEED.read_text())
    doc["spec"]["monitoring"] = {"podMonitor": True, "labels": {"team": "cr-team"}}
    cr = parse_cr(doc, pod_monitor_labels={"release": "kps", "team": "default-team"})
    engines, router = build_pod_monitors(cr)
    for pm in (engines, router):
        assert pm["metadata"]["labels"]["release"] == "kps" and pm["metadata"]["labels"]["team"] == "cr-team"
    ns = build_parser().parse_args(["run", "--pod-monitor-label", "release=kps", "--pod-monitor-label", "a=b=c"])
    assert ns.pod_monitor_label == [("release", "kps"), ("a", "b=c")]
