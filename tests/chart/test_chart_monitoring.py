"""The chart's monitoring templates (templates/monitoring/) rendered by the real helm: toggles, extra labels, the generated dashboard and
rules carried verbatim, rule overrides, and promtool accepting the rendered PrometheusRule."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from hpd_operator.monitoring import __main__ as gen
from hpd_operator.monitoring import rules

from .helmkit import CHART, Helm


def promtool() -> str:
    path = shutil.which("promtool")
    if path is None:
        pytest.fail("`promtool` is missing: run hack/prometheus.sh (installs Debian's prometheus package)")
    return path


def render(helm: Helm, *sets: str, values: dict[str, Any] | None = None, tmp: Path | None = None) -> list[Any]:
    args: list[str] = []
    for s in sets:
        args += ["--set", s]
    if values is not None:
        assert tmp is not None
        vf = tmp / "values.yaml"
        vf.write_text(yaml.safe_dump(values))
        args += ["-f", str(vf)]
    return helm.template(*args, release="rel")


def by_kind(docs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] == kind]


ALL_ON = (
    "metrics.serviceMonitor.enabled=true",
    "metrics.serviceMonitor.additionalLabels.release=kube-prometheus-stack",
    "dashboards.enabled=true",
    "prometheusRule.enabled=true",
    "prometheusRule.additionalLabels.release=kube-prometheus-stack",
)


def test_monitoring_is_off_by_default(helm: Helm) -> None:
    kinds = {d["kind"] for d in render(helm)}
    assert not kinds & {"ServiceMonitor", "PrometheusRule"}
    assert not [d for d in render(helm) if d["metadata"]["name"].endswith("-dashboards")]


def test_service_monitor_scrapes_the_operator_metrics_service_with_honor_labels(helm: Helm) -> None:
    docs = render(helm, *ALL_ON)
    (sm,) = by_kind(docs, "ServiceMonitor")
    assert sm["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    (ep,) = sm["spec"]["endpoints"]
    assert ep["port"] == "metrics" and ep["path"] == "/metrics" and ep["honorLabels"] is True
    svc = next(d for d in by_kind(docs, "Service") if d["metadata"]["name"] == "rel-hybrid-pd-operator-metrics")
    assert svc["spec"]["ports"][0]["name"] == "metrics" and svc["spec"]["ports"][0]["port"] == 9090
    assert sm["spec"]["selector"]["matchLabels"].items() <= svc["metadata"]["labels"].items()


def test_dashboard_configmap_carries_the_generated_json_under_the_sidecar_label(helm: Helm) -> None:
    (cm,) = [d for d in render(helm, *ALL_ON) if d["kind"] == "ConfigMap"]
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert cm["data"]["hybrid-pd.json"] == gen.DASHBOARD_PATH.read_text()
    assert json.loads(cm["data"]["hybrid-pd.json"])["uid"] == "hybrid-pd-overview"
    (cm2,) = [
        d
        for d in render(helm, "dashboards.enabled=true", "dashboards.label=dash", "dashboards.labelValue=yes")
        if d["kind"] == "ConfigMap"
    ]
    assert cm2["metadata"]["labels"]["dash"] == "yes" and "grafana_dashboard" not in cm2["metadata"]["labels"]


def test_prometheus_rule_is_the_generated_rules_file(helm: Helm) -> None:
    (pr,) = by_kind(render(helm, *ALL_ON), "PrometheusRule")
    assert pr["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    assert pr["spec"] == rules.build_rules()


def test_prometheus_rule_overrides_disable_and_extra_labels(helm: Helm, tmp_path: Path) -> None:
    values = {
        "prometheusRule": {
            "enabled": True,
            "disabled": ["HPDNixlTransferSlow"],
            "additionalRuleLabels": {"team": "serving"},
            "overrides": {"HPDNotReady": {"for": "30m", "labels": {"severity": "critical"}}},
        }
    }
    (pr,) = by_kind(render(helm, values=values, tmp=tmp_path), "PrometheusRule")
    got = {r["alert"]: r for g in pr["spec"]["groups"] for r in g["rules"]}
    assert "HPDNixlTransferSlow" not in got and len(got) == len(rules.alerts()) - 1
    assert got["HPDNotReady"]["for"] == "30m" and got["HPDNotReady"]["labels"]["severity"] == "critical"
    assert all(r["labels"]["team"] == "serving" for r in got.values())
    assert got["HPDNixlBroken"]["labels"]["severity"] == "critical"
    assert got["HPDKVLoadErrors"]["annotations"]["runbook"]

    spec = tmp_path / "rendered-rules.yaml"
    spec.write_text(yaml.safe_dump(pr["spec"]))
    out = subprocess.run(
        [promtool(), "check", "rules", str(spec)], capture_output=True, text=True, timeout=60, check=False
    )
    assert out.returncode == 0, out.stdout + out.stderr


MONITORING_BAD: list[tuple[dict[str, Any], str, str]] = [
    ({"dashboards": {"labelValue": 1}}, "dashboards.labelValue", "Expected: string, given: integer"),
    ({"dashboards": {"enable": True}}, "dashboards", "Additional property enable is not allowed"),
    ({"metrics": {"serviceMonitor": {"interval": "30 seconds"}}}, "metrics.serviceMonitor.interval", "Does not match"),
    (
        {"prometheusRule": {"overrides": {"HPDNotReady": {"for": "soon"}}}},
        "prometheusRule.overrides.HPDNotReady.for",
        "Does not match",
    ),
    (
        {"prometheusRule": {"additionalLabels": {"release": 1}}},
        "prometheusRule.additionalLabels.release",
        "Expected: string",
    ),
]


@pytest.mark.parametrize(("bad", "field", "rule"), MONITORING_BAD, ids=[b[1] for b in MONITORING_BAD])
def test_schema_rejects_bad_monitoring_values(
    helm: Helm, tmp_path: Path, bad: dict[str, Any], field: str, rule: str
) -> None:
    f = tmp_path / "bad.yaml"
    f.write_text(yaml.safe_dump(bad))
    p = helm.run("template", "x", str(CHART), "-f", str(f), check=False)
    assert p.returncode != 0, f"helm accepted {bad}"
    assert any(line.startswith(f"- {field}: ") and rule in line for line in p.stderr.splitlines()), p.stderr


def test_service_monitor_without_the_metrics_service_is_refused(helm: Helm) -> None:
    p = helm.run(
        "template",
        "x",
        str(CHART),
        "--set",
        "metrics.serviceMonitor.enabled=true",
        "--set",
        "metrics.service.enabled=false",
        check=False,
    )
    assert p.returncode != 0 and "metrics.serviceMonitor.enabled needs metrics.service.enabled" in p.stderr


def test_pod_monitor_labels_become_operator_flags(helm: Helm) -> None:
    docs = render(helm, "podMonitors.labels.release=kube-prometheus-stack")
    (dep,) = by_kind(docs, "Deployment")
    assert (
        "--pod-monitor-label=release=kube-prometheus-stack" in dep["spec"]["template"]["spec"]["containers"][0]["args"]
    )
    (plain,) = by_kind(render(helm), "Deployment")
    assert not [a for a in plain["spec"]["template"]["spec"]["containers"][0]["args"] if "pod-monitor" in a]
