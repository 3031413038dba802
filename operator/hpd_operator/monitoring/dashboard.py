"""The P/D Grafana dashboard, built with grafana-foundation-sdk (Grafana's own typed builders).

The panel content (titles, PromQL, legends, units) is plain data in ROWS; `build_dashboard()` turns it into the
dashboard model. Queries select on the labels the PodMonitors add (`namespace`, `hybridpddeployment`, `role`,
`pod`) through the dashboard variables `$namespace` and `$hybridpddeployment`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from grafana_foundation_sdk.builders import dashboard as gdash
from grafana_foundation_sdk.builders import prometheus as gprom
from grafana_foundation_sdk.builders import timeseries as gts
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import dashboard as mdash

UID = "hybrid-pd-overview"
TITLE = "Hybrid P/D (prefill/decode) serving"
DS = mdash.DataSourceRef(type_val="prometheus", uid="${datasource}")
SEL = 'namespace=~"$namespace", hybridpddeployment=~"$hybridpddeployment"'
RATE = "$__rate_interval"
OPERATOR = 'controller="hybridpddeployment"'


@dataclass(frozen=True)
class Query:
    expr: str
    legend: str


@dataclass(frozen=True)
class Panel:
    title: str
    unit: str
    queries: tuple[Query, ...]
    description: str = ""


def _quantiles(metric: str, by: str, where: str = SEL) -> tuple[Query, ...]:
    return tuple(
        Query(
            f"histogram_quantile({q}, sum by ({by}, le) (rate({metric}_bucket{{{where}}}[{RATE}])))",
            f"p{round(q * 100)} {{{{{by}}}}}",
        )
        for q in (0.5, 0.99)
    )


DECODE = f'{SEL}, role="decode"'
PREFILL = f'{SEL}, role="prefill"'
ROUTER = f'{SEL}, role="router"'

ROWS: tuple[tuple[str, tuple[Panel, ...]], ...] = (
    (
        "Latency per role",
        (
            Panel("Time to first token", "s", _quantiles("vllm:time_to_first_token_seconds", "role")),
            Panel("Inter-token latency", "s", _quantiles("vllm:inter_token_latency_seconds", "role")),
            Panel("End-to-end request latency", "s", _quantiles("vllm:e2e_request_latency_seconds", "role")),
        ),
    ),
    (
        "Queues and KV cache",
        (
            Panel(
                "Requests running / waiting",
                "short",
                (
                    Query(f"sum by (role) (vllm:num_requests_running{{{SEL}}})", "running {{role}}"),
                    Query(f"sum by (role) (vllm:num_requests_waiting{{{SEL}}})", "waiting {{role}}"),
                ),
            ),
            Panel(
                "Waiting for remote KV (deferred) vs capacity",
                "short",
                (
                    Query(
                        f"sum by (role, reason) (vllm:num_requests_waiting_by_reason{{{SEL}}})", "{{role}} {{reason}}"
                    ),
                ),
                "reason=deferred on decode: requests blocked on a KV transfer from prefill.",
            ),
            Panel(
                "KV cache usage",
                "percentunit",
                (Query(f"max by (role, pod) (vllm:kv_cache_usage_perc{{{SEL}}})", "{{role}} {{pod}}"),),
            ),
            Panel("Queue time", "s", _quantiles("vllm:request_queue_time_seconds", "role")),
        ),
    ),
    (
        "NIXL KV transfer (decode pulls from prefill)",
        (
            Panel("KV transfer time", "s", _quantiles("vllm:nixl_xfer_time_seconds", "role", DECODE)),
            Panel(
                "KV bytes transferred",
                "Bps",
                (
                    Query(f"sum by (role) (rate(vllm:nixl_bytes_transferred_sum{{{DECODE}}}[{RATE}]))", "bytes/s"),
                    Query(
                        f"sum by (role) (rate(vllm:nixl_bytes_transferred_sum{{{DECODE}}}[{RATE}]))"
                        f" / sum by (role) (rate(vllm:nixl_bytes_transferred_count{{{DECODE}}}[{RATE}]))",
                        "bytes per transfer",
                    ),
                ),
            ),
            Panel(
                "Failed transfers, failed notifications, expired KV",
                "short",
                (
                    Query(
                        f"sum by (role) (increase(vllm:nixl_num_failed_transfers_total{{{SEL}}}[{RATE}]))",
                        "failed transfers {{role}}",
                    ),
                    Query(
                        f"sum by (role) (increase(vllm:nixl_num_failed_notifications_total{{{SEL}}}[{RATE}]))",
                        "failed notifications {{role}}",
                    ),
                    Query(
                        f"sum by (role) (increase(vllm:nixl_num_kv_expired_reqs_total{{{SEL}}}[{RATE}]))",
                        "KV expired {{role}}",
                    ),
                ),
            ),
            Panel(
                "Decode prompt tokens: received vs recomputed",
                "short",
                (
                    Query(
                        f"sum by (source) (rate(vllm:prompt_tokens_by_source_total{{{DECODE}}}[{RATE}]))",
                        "{{source}}",
                    ),
                ),
                "external_kv_transfer = received from prefill; local_compute on decode = KV that did not arrive.",
            ),
            Panel(
                "Requests finished with error",
                "reqps",
                (
                    Query(
                        f'sum by (role) (rate(vllm:request_success_total{{{SEL}, finished_reason="error"}}[{RATE}]))',
                        "{{role}}",
                    ),
                ),
            ),
        ),
    ),
    (
        "Router",
        (
            Panel(
                "P/D requests",
                "reqps",
                (
                    Query(f"sum by (route) (rate(vllm_router_pd_requests_total{{{ROUTER}}}[{RATE}]))", "{{route}}"),
                    Query(f"sum(rate(vllm_router_pd_prefill_requests_total{{{ROUTER}}}[{RATE}]))", "to prefill"),
                    Query(f"sum(rate(vllm_router_pd_decode_requests_total{{{ROUTER}}}[{RATE}]))", "to decode"),
                ),
            ),
            Panel(
                "P/D errors",
                "reqps",
                (
                    Query(f"sum(rate(vllm_router_pd_prefill_errors_total{{{ROUTER}}}[{RATE}]))", "prefill errors"),
                    Query(f"sum(rate(vllm_router_pd_decode_errors_total{{{ROUTER}}}[{RATE}]))", "decode errors"),
                ),
            ),
            Panel(
                "Worker health (router's view)",
                "short",
                (Query(f"min by (worker) (vllm_router_worker_health{{{ROUTER}}})", "{{worker}}"),),
                "1 healthy, 0 failing the router's health check.",
            ),
            Panel("P/D request duration", "s", _quantiles("vllm_router_pd_request_duration_seconds", "route", ROUTER)),
        ),
    ),
    (
        "Data path after Ready",
        (
            Panel(
                "KV rate measured by decode's checks",
                "Bps",
                (
                    Query(
                        f"max by (pod, fabric) (hpd_runtime_kv_transfer_bytes_per_second{{{DECODE}}})",
                        "{{pod}} over {{fabric}}",
                    ),
                ),
                "The rate of the last pair check or canary's own transfers (decode's NIXL counters around it). "
                "Under spec.kvTransfer.floorGBps (rdma: 5 GB/s) the runtime reports the path as slow.",
            ),
            Panel(
                "KV bytes per request (last check)",
                "bytes",
                (
                    Query(
                        f"max by (pod) (hpd_runtime_kv_transfer_bytes_per_request{{{DECODE}}})",
                        "{{pod}}",
                    ),
                ),
            ),
            Panel(
                "Canary round trips",
                "short",
                (
                    Query(
                        f"sum by (result) (increase(hpd_runtime_canary_checks_total{{{DECODE}}}[{RATE}]))",
                        "{{result}}",
                    ),
                ),
                "ok / differs (decode turns not Ready) / error (the peer did not answer). The canary's requests "
                "reach the engines directly: the Router row's panels count user traffic only.",
            ),
            Panel(
                "Seconds since the last canary that passed",
                "s",
                (
                    Query(
                        f"time() - max by (pod) (hpd_runtime_canary_last_success_timestamp_seconds{{{DECODE}}})",
                        "{{pod}}",
                    ),
                ),
            ),
        ),
    ),
    (
        "Readiness and warmup",
        (
            Panel(
                "Ready replicas per role",
                "short",
                (
                    Query(f"sum by (role) (hpd_operator_ready_replicas{{{SEL}}})", "ready {{role}}"),
                    Query(f"sum by (role) (hpd_operator_desired_replicas{{{SEL}}})", "desired {{role}}"),
                ),
            ),
            Panel(
                "Warmup duration",
                "s",
                (Query(f"max by (role, pod) (hpd_runtime_warmup_duration_seconds{{{SEL}}})", "{{role}} {{pod}}"),),
            ),
            Panel(
                "Time to Ready",
                "s",
                (
                    Query(f"max by (role, pod) (hpd_runtime_start_to_ready_seconds{{{SEL}}})", "pod {{role}} {{pod}}"),
                    Query(
                        f"max by (hybridpddeployment) (hpd_operator_time_to_ready_seconds{{{SEL}}})",
                        "CR {{hybridpddeployment}}",
                    ),
                ),
                "Pods: runtime start to first Ready (load + warmup). CR: creation to Ready.",
            ),
            Panel(
                "Warmup failures",
                "short",
                (Query(f"sum by (role) (hpd_runtime_warmup_failed{{{SEL}}})", "{{role}}"),),
            ),
        ),
    ),
    (
        "Autoscaling (per role: its own signal, docs/autoscaling.md)",
        (
            Panel(
                "Replicas per role",
                "short",
                (
                    Query(f'sum by (role) (hpd_operator_desired_replicas{{{SEL}, role!="router"}})', "{{role}}"),
                    Query(f"max by (role) (hpd_operator_autoscaler_at_max{{{SEL}}})", "at max {{role}}"),
                ),
                "What each role's autoscaler chose; 'at max' is 1 while a role runs at the most it may (maxReplicas, "
                "or fewer where spec.ratio bounds it).",
            ),
            Panel(
                "Signal per replica over target",
                "percentunit",
                (
                    Query(
                        f"max by (role, signal) (hpd_operator_autoscaler_signal_ratio{{{SEL}}})", "{{role}} {{signal}}"
                    ),
                ),
                "Above 100 %: the role wants more replicas; held there at its maximum, HPDAutoscalerAtMaxOverTarget.",
            ),
            Panel(
                "Signals (vLLM, per role)",
                "short",
                (
                    Query(f"sum(vllm:num_requests_waiting{{{PREFILL}}})", "prefill waiting requests"),
                    Query(f"sum(vllm:kv_cache_usage_perc{{{DECODE}}})", "decode KV cache in use (caches)"),
                    Query(f"sum(vllm:num_requests_running{{{DECODE}}})", "decode running requests"),
                ),
                "The totals each role's HPA divides by its replicas (api/signals.py): the adapter serves them.",
            ),
        ),
    ),
    (
        "Operator",
        (
            Panel(
                "Reconciles",
                "ops",
                (
                    Query(
                        f"sum by (result) (rate(controller_runtime_reconcile_total{{{OPERATOR}}}[{RATE}]))",
                        "{{result}}",
                    ),
                ),
            ),
            Panel(
                "Reconcile errors and API errors",
                "ops",
                (
                    Query(f"sum(rate(controller_runtime_reconcile_errors_total{{{OPERATOR}}}[{RATE}]))", "reconcile"),
                    Query(
                        f"sum(rate(controller_runtime_terminal_reconcile_errors_total{{{OPERATOR}}}[{RATE}]))",
                        "invalid spec",
                    ),
                    Query(
                        f"sum by (operation, code) (rate(hpd_operator_api_errors_total[{RATE}]))",
                        "API {{operation}} {{code}}",
                    ),
                ),
            ),
            Panel(
                "Reconcile latency",
                "s",
                _quantiles("controller_runtime_reconcile_time_seconds", "controller", OPERATOR),
            ),
            Panel(
                "HybridPDDeployments by phase",
                "short",
                (Query("sum by (phase) (hpd_operator_hybridpddeployments)", "{{phase}}"),),
            ),
        ),
    ),
)


def _variable(name: str, label: str, query: str) -> gdash.QueryVariable:
    return (
        gdash.QueryVariable(name)
        .label(label)
        .datasource(DS)
        .query({"query": query, "refId": name})
        .refresh(mdash.VariableRefresh.ON_TIME_RANGE_CHANGED)
        .multi(True)
        .include_all(True)
        .all_value(".*")
        .current(mdash.VariableOption(selected=True, text="All", value="$__all"))
    )


def _panel(p: Panel) -> gts.Panel:
    out = gts.Panel().title(p.title).unit(p.unit).datasource(DS).height(8).span(8)
    if p.description:
        out = out.description(p.description)
    for i, q in enumerate(p.queries):
        out = out.with_target(gprom.Dataquery().expr(q.expr).legend_format(q.legend).ref_id(chr(ord("A") + i)))
    return out


def build_dashboard() -> dict[str, Any]:
    d = (
        gdash.Dashboard(TITLE)
        .uid(UID)
        .tags(["hybrid-pd", "vllm", "prefill-decode", "nixl"])
        .description("Disaggregated prefill/decode serving managed by hybrid-pd-operator (vLLM 0.20, vllm-router)")
        .refresh("30s")
        .time("now-1h", "now")
        .timezone("browser")
        .with_variable(gdash.DatasourceVariable("datasource").label("Data source").type("prometheus"))
        .with_variable(_variable("namespace", "Namespace", "label_values(hpd_operator_desired_replicas, namespace)"))
        .with_variable(
            _variable(
                "hybridpddeployment",
                "HybridPDDeployment",
                'label_values(hpd_operator_desired_replicas{namespace=~"$namespace"}, hybridpddeployment)',
            )
        )
    )
    for title, panels in ROWS:
        d = d.with_row(gdash.Row(title))
        for p in panels:
            d = d.with_panel(_panel(p))
    out: dict[str, Any] = json.loads(json.dumps(d.build(), cls=JSONEncoder))
    return out


def queries(dash: dict[str, Any]) -> list[tuple[str, str]]:
    """(panel title, expr) of every target in a dashboard JSON (rows included)."""
    found: list[tuple[str, str]] = []
    for panel in dash.get("panels", []):
        for p in [panel, *panel.get("panels", [])]:
            found += [(str(p.get("title")), str(t["expr"])) for t in p.get("targets", []) if "expr" in t]
    return found
