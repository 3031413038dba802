"""The load signals a role can autoscale on: one table for the CRD's enum, the HPAs the operator renders, the
metrics adapter's rules and the dashboard/alert (pure, no I/O).

Each signal is a vLLM 0.20 series (names checked against shared/reference/monitoring-facts-2026-11.md and scraped by
a real Prometheus in tests/autoscaling), exposed to the HorizontalPodAutoscaler as an *external* metric by a metrics
adapter (prometheus-adapter: `external_rules()` is its config). The HPA selects the series of one role of one CR with
the labels the PodMonitors put on every engine series (`hybridpddeployment`, `role`; the adapter adds `namespace`),
and holds the signal's per-replica average at the target (`AverageValue`: desired = ceil(sum / target)).
"""

from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType
from typing import Final, Literal

from hpd_runtime import contract

SignalName = Literal["waitingRequests", "promptTokensPerSecond", "kvCacheUsage", "runningRequests"]

CR_LABEL: Final = "hybridpddeployment"
"""The series label that carries the owning CR's name (builders.monitoring relabels it onto every engine series)."""
ROLE_LABEL: Final = "role"
"""The series label that carries prefill/decode (the pod's component label)."""


@dataclass(frozen=True)
class Signal:
    name: SignalName
    """The value of spec.<role>.autoscaling.metrics[].signal."""
    series: str
    """The vLLM series it reads."""
    metric: str
    """The external metric name the adapter serves it under (external.metrics.k8s.io)."""
    query: str
    """PromQL over one role of one CR, `{sel}` = its label matchers: the per-role total the HPA divides by the
    target (also the adapter's metricsQuery with `<<.Series>>{<<.LabelMatchers>>}` in place of series{sel})."""
    default_target: float
    unit: str
    help: str

    def promql(self, selector: str) -> str:
        """The query with explicit matchers (`hybridpddeployment="x",role="prefill"`) for the dashboard and alerts."""
        return self.query.replace("{sel}", "{" + selector + "}").replace("SERIES", self.series)

    def adapter_query(self) -> str:
        return self.query.replace("SERIES{sel}", "<<.Series>>{<<.LabelMatchers>>}")


SIGNALS: Final = MappingProxyType(
    {
        s.name: s
        for s in (
            Signal(
                name="waitingRequests",
                series="vllm:num_requests_waiting",
                metric="hpd_vllm_waiting_requests",
                query="sum(SERIES{sel})",
                default_target=4.0,
                unit="requests",
                help="requests queued in vLLM, not yet scheduled (a prefill backlog: each is a whole prompt to compute)",
            ),
            Signal(
                name="promptTokensPerSecond",
                series="vllm:prompt_tokens_total",
                metric="hpd_vllm_prompt_tokens_per_second",
                query="sum(rate(SERIES{sel}[1m]))",
                default_target=8000.0,
                unit="tokens/s",
                help="prompt tokens computed per second (prefill throughput; set the target below one replica's "
                "measured capacity)",
            ),
            Signal(
                name="kvCacheUsage",
                series="vllm:kv_cache_usage_perc",
                metric="hpd_vllm_kv_cache_usage",
                query="sum(SERIES{sel})",
                default_target=0.7,
                unit="fraction (0-1)",
                help="the share of the KV cache in use (decode holds every running sequence's KV: near 1, vLLM "
                "preempts)",
            ),
            Signal(
                name="runningRequests",
                series="vllm:num_requests_running",
                metric="hpd_vllm_running_requests",
                query="sum(SERIES{sel})",
                default_target=32.0,
                unit="requests",
                help="requests in vLLM's running batch (decode concurrency)",
            ),
        )
    }
)

ROLE_DEFAULT_SIGNALS: Final[MappingProxyType[contract.Role, tuple[SignalName, ...]]] = MappingProxyType(
    {"prefill": ("waitingRequests",), "decode": ("kvCacheUsage", "runningRequests")}
)
"""What a role follows when spec.<role>.autoscaling.metrics is empty: prefill its queue of whole prompts, decode its
KV cache and its running batch (the HPA takes the larger of the two recommendations)."""


def selector(cr_name: str, role: str) -> dict[str, str]:
    """The series labels of one role of one CR (the HPA's external metric selector; the adapter adds namespace)."""
    return {CR_LABEL: cr_name, ROLE_LABEL: role}


def external_rules() -> list[dict[str, object]]:
    """prometheus-adapter `externalRules`: each signal under its external metric name, namespaced by the series'
    `namespace` label, its query summed over the series the HPA's selector picks."""
    return [
        {
            "seriesQuery": f'{s.series}{{namespace!="",{CR_LABEL}!="",{ROLE_LABEL}!=""}}',
            "resources": {"overrides": {"namespace": {"resource": "namespace"}}},
            "name": {"matches": f"^{s.series}$", "as": s.metric},
            "metricsQuery": s.adapter_query(),
        }
        for s in SIGNALS.values()
    ]
