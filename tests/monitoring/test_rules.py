"""`promtool check rules` and `promtool test rules` on the chart's generated rule file: every alert fires on its
failure and stays silent when healthy (one promtool test case each), and a misspelled metric name is caught."""

from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from hpd_operator.monitoring import __main__ as gen
from hpd_operator.monitoring import rules

from .prom import promtool

RULES = gen.RULES_PATH
CR = 'namespace="ns",hybridpddeployment="cr"'
D = f'{CR},role="decode",pod="cr-decode-0",model_name="m",engine="0"'
P = f'{CR},role="prefill",pod="cr-prefill-0",model_name="m",engine="0"'
R = f'{CR},role="router",pod="cr-router-0"'
OP = 'controller="hybridpddeployment",namespace="hpd-system",pod="operator-0"'
DECODE_POD = {"namespace": "ns", "hybridpddeployment": "cr", "pod": "cr-decode-0"}
PREFILL_POD = {"namespace": "ns", "hybridpddeployment": "cr", "pod": "cr-prefill-0"}
CR_LABELS = {"namespace": "ns", "hybridpddeployment": "cr"}


def _hist(name: str, labels: str, per_bucket: dict[str, str]) -> list[tuple[str, str]]:
    return [(f'{name}_bucket{{{labels},le="{le}"}}', v) for le, v in per_bucket.items()]


@dataclass(frozen=True)
class Case:
    eval_time: str
    failure: list[tuple[str, str]]
    healthy: list[tuple[str, str]]
    labels: dict[str, str]


RT = f'{CR},role="decode",pod="cr-decode-0"'
"""The runtime's series (scraped on the runtime port: no vLLM model_name/engine labels)."""

CASES: dict[str, Case] = {
    "HPDKVPathBelowFabricFloor": Case(
        "15m",
        [(f'hpd_runtime_kv_transfer_below_floor{{{RT},fabric="rdma"}}', "1x20")],
        [(f'hpd_runtime_kv_transfer_below_floor{{{RT},fabric="rdma"}}', "0x20")],
        DECODE_POD,
    ),
    "HPDKVPathTCPEmulation": Case(
        "35m",
        [(f'hpd_runtime_kv_transport{{{RT},transport="tcp emulation"}}', "1x40")],
        [(f'hpd_runtime_kv_transport{{{RT},transport="cuda_ipc"}}', "1x40")],
        DECODE_POD,
    ),
    "HPDCanaryFailing": Case(
        "5m",
        [
            (f'hpd_runtime_canary_checks_total{{{RT},result="ok"}}', "0 1 2 2 2 2"),
            (f'hpd_runtime_canary_checks_total{{{RT},result="differs"}}', "0 0 0 1 1 1"),
        ],
        [(f'hpd_runtime_canary_checks_total{{{RT},result="ok"}}', "0+1x6")],
        DECODE_POD,
    ),
    "HPDCanaryStale": Case(
        "40m",
        [(f'hpd_runtime_canary_last_success_timestamp_seconds{{{RT},prefill="10.0.0.1:8000"}}', "0x45")],
        [(f'hpd_runtime_canary_last_success_timestamp_seconds{{{RT},prefill="10.0.0.1:8000"}}', "0+60x45")],
        DECODE_POD,
    ),
    "HPDNixlTransfersFailing": Case(
        "6m",
        [(f"vllm:nixl_num_failed_transfers_total{{{D}}}", "0 0 0 2 4 6 8")],
        [(f"vllm:nixl_num_failed_transfers_total{{{D}}}", "0x8")],
        DECODE_POD,
    ),
    "HPDNixlBroken": Case(
        "16m",
        [
            (f"vllm:nixl_num_failed_transfers_total{{{D}}}", "0+2x20"),
            (f"vllm:nixl_xfer_time_seconds_count{{{D}}}", "5x20"),
        ],
        [
            (f"vllm:nixl_num_failed_transfers_total{{{D}}}", "0+2x20"),
            (f"vllm:nixl_xfer_time_seconds_count{{{D}}}", "5+3x20"),
        ],
        DECODE_POD,
    ),
    "HPDNixlNotificationsFailing": Case(
        "5m",
        [(f"vllm:nixl_num_failed_notifications_total{{{D}}}", "0 0 1 2 3 4")],
        [(f"vllm:nixl_num_failed_notifications_total{{{D}}}", "0x6")],
        DECODE_POD,
    ),
    "HPDKVExpiredOnPrefill": Case(
        "5m",
        [(f"vllm:nixl_num_kv_expired_reqs_total{{{P}}}", "0 0 0 1 1 1")],
        [(f"vllm:nixl_num_kv_expired_reqs_total{{{P}}}", "0x6")],
        PREFILL_POD,
    ),
    "HPDNixlTransferSlow": Case(
        "16m",
        _hist("vllm:nixl_xfer_time_seconds", D, {"0.5": "0x20", "1": "0x20", "5": "0+10x20", "+Inf": "0+10x20"}),
        _hist(
            "vllm:nixl_xfer_time_seconds",
            D,
            {"0.5": "0+10x20", "1": "0+10x20", "5": "0+10x20", "+Inf": "0+10x20"},
        ),
        CR_LABELS,
    ),
    "HPDDecodeRecomputingPrompts": Case(
        "25m",
        [
            (f'vllm:prompt_tokens_by_source_total{{{D},source="local_compute"}}', "0+100x30"),
            (f'vllm:prompt_tokens_by_source_total{{{D},source="external_kv_transfer"}}', "0x30"),
            (f"vllm:prompt_tokens_total{{{D}}}", "0+100x30"),
        ],
        [
            (f'vllm:prompt_tokens_by_source_total{{{D},source="local_compute"}}', "0+1x30"),
            (f'vllm:prompt_tokens_by_source_total{{{D},source="external_kv_transfer"}}', "0+99x30"),
            (f"vllm:prompt_tokens_total{{{D}}}", "0+100x30"),
        ],
        CR_LABELS,
    ),
    "HPDRequestsStuckWaitingForKV": Case(
        "12m",
        [
            (f'vllm:num_requests_waiting_by_reason{{{D},reason="deferred"}}', "3x20"),
            (f"vllm:nixl_xfer_time_seconds_count{{{D}}}", "7x20"),
        ],
        [
            (f'vllm:num_requests_waiting_by_reason{{{D},reason="deferred"}}', "3x20"),
            (f"vllm:nixl_xfer_time_seconds_count{{{D}}}", "0+5x20"),
        ],
        DECODE_POD,
    ),
    "HPDKVLoadErrors": Case(
        "12m",
        [(f'vllm:request_success_total{{{D},finished_reason="error"}}', "0+5x20")],
        [
            (f'vllm:request_success_total{{{D},finished_reason="error"}}', "0x20"),
            (f'vllm:request_success_total{{{D},finished_reason="stop"}}', "0+5x20"),
        ],
        DECODE_POD,
    ),
    "HPDRolePoolEmpty": Case(
        "10m",
        [
            (f'hpd_operator_desired_replicas{{{CR},role="decode"}}', "2x20"),
            (f'hpd_operator_ready_replicas{{{CR},role="decode"}}', "0x20"),
        ],
        [
            (f'hpd_operator_desired_replicas{{{CR},role="decode"}}', "2x20"),
            (f'hpd_operator_ready_replicas{{{CR},role="decode"}}', "2x20"),
            (f'hpd_operator_desired_replicas{{{CR},role="prefill"}}', "0x20"),  # scaled to 0 on purpose
            (f'hpd_operator_ready_replicas{{{CR},role="prefill"}}', "0x20"),
        ],
        {**CR_LABELS, "role": "decode"},
    ),
    "HPDRouterWorkerUnhealthy": Case(
        "6m",
        [(f'vllm_router_worker_health{{{R},worker="http://10.0.0.7:8000"}}', "0x10")],
        [(f'vllm_router_worker_health{{{R},worker="http://10.0.0.7:8000"}}', "1x10")],
        {"namespace": "ns", "hybridpddeployment": "cr", "pod": "cr-router-0", "worker": "http://10.0.0.7:8000"},
    ),
    "HPDRouterPDErrors": Case(
        "12m",
        [
            (f'vllm_router_pd_prefill_requests_total{{{R},worker="w1"}}', "0+10x20"),
            (f'vllm_router_pd_prefill_errors_total{{{R},worker="w1"}}', "0+5x20"),
            (f'vllm_router_pd_decode_requests_total{{{R},worker="w2"}}', "0+5x20"),
        ],
        [
            (f'vllm_router_pd_prefill_requests_total{{{R},worker="w1"}}', "0+10x20"),
            (f'vllm_router_pd_prefill_errors_total{{{R},worker="w1"}}', "0x20"),
            (f'vllm_router_pd_decode_requests_total{{{R},worker="w2"}}', "0+10x20"),
        ],
        {"namespace": "ns", "hybridpddeployment": "cr", "pod": "cr-router-0"},
    ),
    "HPDWarmupOverBudget": Case(
        "1m",
        [(f"hpd_runtime_warmup_failed{{{P}}}", "1x5")],
        [(f"hpd_runtime_warmup_failed{{{P}}}", "0x5")],
        {**PREFILL_POD, "role": "prefill"},
    ),
    "HPDNotReady": Case(
        "20m",
        [
            (f'hpd_operator_hybridpddeployment_status_phase{{{CR},phase="Ready"}}', "0x30"),
            *[(f'hpd_operator_desired_replicas{{{CR},role="{r}"}}', "1x30") for r in ("prefill", "decode", "router")],
        ],
        [
            (f'hpd_operator_hybridpddeployment_status_phase{{{CR},phase="Ready"}}', "1x30"),
            (
                'hpd_operator_hybridpddeployment_status_phase{namespace="ns",hybridpddeployment="idle",phase="Ready"}',
                "0x30",
            ),
            ('hpd_operator_desired_replicas{namespace="ns",hybridpddeployment="idle",role="decode"}', "0x30"),
        ],
        CR_LABELS,
    ),
    "HPDAutoscalerAtMaxOverTarget": Case(
        "15m",
        [
            (f'hpd_operator_autoscaler_signal_ratio{{{CR},role="prefill",signal="waitingRequests"}}', "2.5x20"),
            (f'hpd_operator_autoscaler_at_max{{{CR},role="prefill"}}', "1x20"),
        ],
        [  # over target but still growing; at its maximum with the load within target
            (f'hpd_operator_autoscaler_signal_ratio{{{CR},role="prefill",signal="waitingRequests"}}', "2.5x20"),
            (f'hpd_operator_autoscaler_at_max{{{CR},role="prefill"}}', "0x20"),
            (f'hpd_operator_autoscaler_signal_ratio{{{CR},role="decode",signal="kvCacheUsage"}}', "0.9x20"),
            (f'hpd_operator_autoscaler_at_max{{{CR},role="decode"}}', "1x20"),
        ],
        {**CR_LABELS, "role": "prefill"},
    ),
    "HPDServingColocated": Case(
        "5m",
        [(f'hpd_operator_serving_colocated{{{CR},role="prefill"}}', "1x10")],
        [  # through the router: 0 for every role
            (f'hpd_operator_serving_colocated{{{CR},role="prefill"}}', "0x10"),
            (f'hpd_operator_serving_colocated{{{CR},role="decode"}}', "0x10"),
        ],
        {**CR_LABELS, "role": "prefill"},
    ),
    "HPDOperatorReconcileErrors": Case(
        "25m",
        [
            (f"controller_runtime_reconcile_errors_total{{{OP}}}", "0+3x30"),
            (f"controller_runtime_terminal_reconcile_errors_total{{{OP}}}", "0x30"),
        ],
        [  # only invalid specs (terminal errors): a user's problem, reported in the CR's status
            (f"controller_runtime_reconcile_errors_total{{{OP}}}", "0+3x30"),
            (f"controller_runtime_terminal_reconcile_errors_total{{{OP}}}", "0+3x30"),
        ],
        {"namespace": "hpd-system", "pod": "operator-0"},
    ),
}


def _annotations(alert: rules.Alert, labels: dict[str, str]) -> dict[str, str]:
    """Annotations use only `{{ $labels.x }}` (rules.py promises it), so they render by substitution."""
    out = {}
    for k, v in alert.rule()["annotations"].items():
        out[k] = re.sub(r"\{\{ \$labels\.(\w+) \}\}", lambda m: labels[m.group(1)], v)
        assert "{{" not in out[k], f"{alert.name}.{k} uses more than $labels: {v}"
    return out


def unit_tests(rule_file: Path) -> dict[str, Any]:
    by_name = {a.name: a for a in rules.alerts()}
    tests: list[dict[str, Any]] = []
    for name, case in CASES.items():
        alert = by_name[name]
        labels = {**case.labels, "severity": alert.severity, **alert.labels}
        for what, series, expected in (
            (
                "fires on the failure",
                case.failure,
                [{"exp_labels": labels, "exp_annotations": _annotations(alert, labels)}],
            ),
            ("silent when healthy", case.healthy, []),
        ):
            tests.append(
                {
                    "name": f"{name} {what}",
                    "interval": "1m",
                    "input_series": [{"series": s, "values": v} for s, v in series],
                    "alert_rule_test": [{"eval_time": case.eval_time, "alertname": name, "exp_alerts": expected}],
                }
            )
    return {"rule_files": [str(rule_file)], "evaluation_interval": "1m", "tests": tests}


def _promtool_test(tmp_path: Path, rule_file: Path) -> subprocess.CompletedProcess[str]:
    test_file = tmp_path / "rules_test.yaml"
    test_file.write_text(yaml.safe_dump(unit_tests(rule_file), sort_keys=False))
    return subprocess.run(
        [promtool(), "test", "rules", str(test_file)], capture_output=True, text=True, timeout=120, check=False
    )


def test_promtool_check_rules_accepts_the_chart_rules() -> None:
    out = subprocess.run(
        [promtool(), "check", "rules", str(RULES)], capture_output=True, text=True, timeout=60, check=False
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert f"SUCCESS: {len(rules.alerts())} rules found" in out.stdout


def test_every_alert_has_a_firing_and_a_silent_unit_test() -> None:
    assert set(CASES) == {a.name for a in rules.alerts()}


def test_promtool_unit_tests_pass(tmp_path: Path) -> None:
    out = _promtool_test(tmp_path, RULES)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "SUCCESS" in out.stdout


@pytest.mark.parametrize(
    ("name", "misspelled"),
    [
        ("vllm:nixl_num_failed_transfers_total", "vllm:nixl_num_failed_transfers"),
        ("hpd_runtime_warmup_failed", "hpd_runtime_warmup_fail"),
    ],
)
def test_a_misspelled_metric_fails_the_unit_tests(tmp_path: Path, name: str, misspelled: str) -> None:
    broken = tmp_path / "broken-rules.yaml"
    text = RULES.read_text()
    assert name in text
    broken.write_text(text.replace(name, misspelled))
    out = _promtool_test(tmp_path, broken)
    assert out.returncode != 0, "promtool passed rules with a misspelled metric name"
