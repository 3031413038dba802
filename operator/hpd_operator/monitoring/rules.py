"""The alert rules for P/D failure modes: the one source of the chart's `files/prometheus-rules.yaml`.

Label conventions (what the PodMonitors and the operator put on every series): `namespace`, `hybridpddeployment`
(the CR), `role` (prefill/decode/router), `pod`. vLLM 0.20 names (vllm:*), vllm-router 0.1.17 names
(vllm_router_*), the runtime's (hpd_runtime_*) and the operator's (controller_runtime_*, hpd_operator_*).
Each alert has a promtool unit test in tests/monitoring/test_rules.py (fires on the failure, silent when healthy).
Annotations use only `$labels` (no `$value`), so the expected annotations of a unit test follow from its labels.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

CR = "namespace, hybridpddeployment"
POD = f"{CR}, pod"
CONTROLLER = 'controller="hybridpddeployment"'


@dataclass(frozen=True)
class Alert:
    name: str
    expr: str
    for_: str
    severity: str
    summary: str
    description: str
    runbook: str
    """What to check first, in one line (the `runbook` annotation)."""
    labels: dict[str, str] = field(default_factory=dict)

    def rule(self) -> dict[str, Any]:
        out: dict[str, Any] = {"alert": self.name, "expr": self.expr}
        if self.for_ != "0m":
            out["for"] = self.for_
        out["labels"] = {"severity": self.severity, **self.labels}
        out["annotations"] = {"summary": self.summary, "description": self.description, "runbook": self.runbook}
        return out


KV_TRANSFER = (
    Alert(
        name="HPDNixlTransfersFailing",
        expr=f'sum by ({POD}) (increase(vllm:nixl_num_failed_transfers_total{{role="decode"}}[5m])) > 0',
        for_="0m",
        severity="warning",
        summary="NIXL KV transfers fail on decode pod {{ $labels.pod }}",
        description="KV transfers from prefill failed on {{ $labels.namespace }}/{{ $labels.pod }} in the last "
        "5 minutes; with kvTransfer.loadFailurePolicy=fail those requests end in HTTP 500.",
        runbook="Check the decode pod's log for 'NIXL transfer failure' and the UCX transports (spec.kvTransfer.ucx); "
        "a prefill pod that restarted leaves stale handshakes until decode reconnects.",
    ),
    Alert(
        name="HPDNixlBroken",
        expr=(
            f'(sum by ({POD}) (increase(vllm:nixl_num_failed_transfers_total{{role="decode"}}[10m])) > 0)'
            f" and on ({POD}) "
            f'(sum by ({POD}) (increase(vllm:nixl_xfer_time_seconds_count{{role="decode"}}[10m])) == 0)'
        ),
        for_="5m",
        severity="critical",
        summary="Every NIXL KV transfer fails on decode pod {{ $labels.pod }}",
        description="Transfers fail and none has completed for 10 minutes on {{ $labels.namespace }}/{{ $labels.pod }}: "
        "P/D serving is down for this pod.",
        runbook="vLLM 0.20 counts every transfer as failed when the image's NIXL lacks telemetry (vLLM PR #58038): "
        "check the NIXL build in the image; else check that decode reaches prefill's side-channel port.",
    ),
    Alert(
        name="HPDNixlNotificationsFailing",
        expr=f'sum by ({POD}) (increase(vllm:nixl_num_failed_notifications_total{{role="decode"}}[10m])) > 0',
        for_="0m",
        severity="warning",
        summary="Decode pod {{ $labels.pod }} cannot notify prefill that KV blocks are free",
        description="Failed P<-D notifications on {{ $labels.namespace }}/{{ $labels.pod }}: prefill holds those "
        "blocks until VLLM_NIXL_ABORT_REQUEST_TIMEOUT (480 s), which shrinks its KV cache.",
        runbook="Check network reachability from decode to the prefill pods' side-channel port (nixl-side).",
    ),
    Alert(
        name="HPDKVExpiredOnPrefill",
        expr=f'sum by ({POD}) (increase(vllm:nixl_num_kv_expired_reqs_total{{role="prefill"}}[10m])) > 0',
        for_="0m",
        severity="warning",
        summary="Prefill pod {{ $labels.pod }} freed KV that decode never pulled",
        description="Requests' KV expired on {{ $labels.namespace }}/{{ $labels.pod }} in the last 10 minutes:"
        " decode died, never pulled, or the router lost the request.",
        runbook="Look for decode restarts and router errors at the same time (HPDRouterPDErrors, decode pod events).",
    ),
    Alert(
        name="HPDNixlTransferSlow",
        expr=(
            f"histogram_quantile(0.99, sum by ({CR}, le) "
            f'(rate(vllm:nixl_xfer_time_seconds_bucket{{role="decode"}}[5m]))) > 1'
        ),
        for_="10m",
        severity="warning",
        summary="NIXL KV transfer p99 above 1 s in {{ $labels.namespace }}/{{ $labels.hybridpddeployment }}",
        description="The p99 of one P->D KV transfer has been above 1 s for 10 minutes.",
        runbook="Check that UCX uses RDMA/NVLink (UCX_TLS in spec.kvTransfer.ucx) and not TCP; compare bytes per "
        "transfer on the dashboard.",
    ),
    Alert(
        name="HPDKVPathBelowFabricFloor",
        expr=f'max by ({POD}) (hpd_runtime_kv_transfer_below_floor{{role="decode"}}) == 1',
        for_="10m",
        severity="warning",
        summary="KV moves below the declared fabric's floor on decode pod {{ $labels.pod }}",
        description="The last pair check or canary of {{ $labels.namespace }}/{{ $labels.pod }} measured a KV rate "
        "under spec.kvTransfer.floorGBps (rdma: 5 GB/s): the pods serve, but every request pays a slow transfer.",
        runbook="Did UCX fall back to TCP? Check the RDMA devices in the pod (spec.kvTransfer.rdma), "
        "spec.kvTransfer.ucx.netDevices, GPUDirect (nvidia-peermem) on the node; decode's /readyz names the rate.",
    ),
    Alert(
        name="HPDKVPathTCPEmulation",
        expr=f'max by ({POD}) (hpd_runtime_kv_transport{{role="decode",transport="tcp emulation"}}) == 1',
        for_="30m",
        severity="info",
        summary="KV moves over UCX's TCP emulation on decode pod {{ $labels.pod }}",
        description="UCX chose its TCP emulation for the KV reads of {{ $labels.namespace }}/{{ $labels.pod }}: "
        "prefill and decode on one node in separate PID namespaces (the default two pods) cannot open each other's "
        "CUDA IPC handles, so KV moves at about 0.5 GB/s instead of 10-24 GB/s (docs/kv-topologies.md). Expected "
        "with the default topology; the fast path on one node is spec.kvTransfer.processNamespace Pair.",
        runbook="kubectl get hpd -o jsonpath='{.status.kvPath}'; to keep cuda_ipc on one node use "
        "processNamespace: Pair (a fixed 1:1 pair per pod) or Host (opt-in security trade).",
    ),
    Alert(
        name="HPDCanaryFailing",
        expr=f'sum by ({POD}) (increase(hpd_runtime_canary_checks_total{{role="decode",result!="ok"}}[15m])) > 0',
        for_="0m",
        severity="warning",
        summary="Decode pod {{ $labels.pod }}'s P->D canary failed",
        description="A canary round trip of {{ $labels.namespace }}/{{ $labels.pod }} failed in the last 15 minutes "
        "(differs: that decode turned not Ready with the reason; error: a prefill did not answer).",
        runbook="kubectl describe hpd: the DecodeReady condition carries the runtime's reason; two failures in a row "
        "restart decode's vLLM.",
    ),
    Alert(
        name="HPDCanaryStale",
        expr=(f'(time() - max by ({POD}) (hpd_runtime_canary_last_success_timestamp_seconds{{role="decode"}})) > 1800'),
        for_="5m",
        severity="warning",
        summary="No passing canary for 30 minutes on decode pod {{ $labels.pod }}",
        description="The data path of {{ $labels.namespace }}/{{ $labels.pod }} has not been re-proved for 30 "
        "minutes (6 default periods): the canary stopped or keeps failing.",
        runbook="Check the decode log for canary lines and spec.warmup.canarySeconds (0 = off: then this series "
        "never appears).",
    ),
    Alert(
        name="HPDDecodeRecomputingPrompts",
        expr=(
            f"sum by ({CR}) "
            f'(rate(vllm:prompt_tokens_by_source_total{{role="decode",source="local_compute"}}[10m]))'
            f' / sum by ({CR}) (rate(vllm:prompt_tokens_total{{role="decode"}}[10m])) > 0.5'
        ),
        for_="10m",
        severity="warning",
        summary="Decode computes prompts itself instead of receiving KV in "
        "{{ $labels.namespace }}/{{ $labels.hybridpddeployment }}",
        description="More than half of decode's prompt tokens are computed locally for 10 minutes: P/D is "
        "not saving prefill work.",
        runbook="Check that requests go through the router (not straight to decode) and that decode's "
        "vllm:nixl_xfer_time_seconds_count grows.",
    ),
    Alert(
        name="HPDRequestsStuckWaitingForKV",
        expr=(
            f'(max by ({POD}) (vllm:num_requests_waiting_by_reason{{role="decode",reason="deferred"}}) > 0)'
            f" and on ({POD}) "
            f'(sum by ({POD}) (increase(vllm:nixl_xfer_time_seconds_count{{role="decode"}}[5m])) == 0)'
        ),
        for_="5m",
        severity="critical",
        summary="Requests wait for remote KV on decode pod {{ $labels.pod }} and no transfer completes",
        description="Requests deferred on {{ $labels.namespace }}/{{ $labels.pod }} for 5 minutes "
        "with no completed KV transfer.",
        runbook="Check the prefill pods (Ready, vllm:nixl_num_kv_expired_reqs_total) and the decode log for "
        "handshake errors; restarting the decode pod re-does the handshake.",
    ),
    Alert(
        name="HPDKVLoadErrors",
        expr=f'sum by ({POD}) (rate(vllm:request_success_total{{finished_reason="error"}}[5m])) > 0',
        for_="5m",
        severity="warning",
        summary="Requests end in error on {{ $labels.pod }}",
        description="Requests finish with reason=error on {{ $labels.namespace }}/{{ $labels.pod }}"
        " (in P/D mostly failed KV loads; clients get HTTP 500).",
        runbook="Correlate with HPDNixlTransfersFailing; see the pod's log for the failed request ids.",
    ),
)

ROUTER = (
    Alert(
        name="HPDRolePoolEmpty",
        expr=(
            f'(max by ({CR}, role) (hpd_operator_desired_replicas{{role=~"prefill|decode"}}) > 0)'
            f" and on ({CR}, role) "
            f'(max by ({CR}, role) (hpd_operator_ready_replicas{{role=~"prefill|decode"}}) == 0)'
        ),
        for_="5m",
        severity="critical",
        summary="No ready {{ $labels.role }} replica in {{ $labels.namespace }}/{{ $labels.hybridpddeployment }}",
        description="The router cannot serve P/D: its {{ $labels.role }} pool is empty although the spec asks for "
        "replicas.",
        runbook="kubectl describe the <cr>-{{ $labels.role }} pods: Pending (GPUs), CrashLoop (vLLM log) or "
        "not Ready (runtime /readyz says why: warmup or vLLM health).",
    ),
    Alert(
        name="HPDRouterWorkerUnhealthy",
        expr=f"min by ({POD}, worker) (vllm_router_worker_health) == 0",
        for_="5m",
        severity="warning",
        summary="Router {{ $labels.pod }} health-checks {{ $labels.worker }} as down",
        description="vllm-router's health checker has failed {{ $labels.worker }} for 5 minutes while its discovery "
        "still lists it (a pod that turned NotReady or was deleted is dropped at once): a hung engine whose pod reads "
        "Ready, or a stale registration.",
        runbook="Check the worker pod (runtime /readyz, vLLM log); if it is gone, restart the router pod to drop the "
        "stale worker.",
    ),
    Alert(
        name="HPDRouterPDErrors",
        expr=(
            f"(sum by ({POD}) (rate(vllm_router_pd_prefill_errors_total[5m]))"
            f" / sum by ({POD}) (rate(vllm_router_pd_prefill_requests_total[5m])) > 0.05)"
            f" or (sum by ({POD}) (rate(vllm_router_pd_decode_errors_total[5m]))"
            f" / sum by ({POD}) (rate(vllm_router_pd_decode_requests_total[5m])) > 0.05)"
        ),
        for_="5m",
        severity="warning",
        summary="More than 5% of P/D requests fail at router {{ $labels.pod }}",
        description="More than 5% of prefill or decode requests fail at the router for 5 minutes.",
        runbook="The dashboard's router row shows which stage fails; then see that role's pods.",
    ),
)

LIFECYCLE = (
    Alert(
        name="HPDWarmupOverBudget",
        expr=f"max by ({POD}, role) (hpd_runtime_warmup_failed) == 1",
        for_="0m",
        severity="warning",
        summary="Warmup of {{ $labels.role }} pod {{ $labels.pod }} failed or ran over spec.warmup.timeoutSeconds",
        description="The pod stays not Ready (the runtime holds it out of rotation).",
        runbook="kubectl logs the pod: the runtime logs every warmup request and its error; raise "
        "spec.warmup.timeoutSeconds only if the first compile is legitimately slower.",
    ),
    Alert(
        name="HPDNotReady",
        expr=(
            f'(max by ({CR}) (hpd_operator_hybridpddeployment_status_phase{{phase="Ready"}}) == 0)'
            f" unless on ({CR}) (min by ({CR}) (hpd_operator_desired_replicas) == 0)"
        ),
        for_="15m",
        severity="warning",
        summary="HybridPDDeployment {{ $labels.namespace }}/{{ $labels.hybridpddeployment }} not Ready for 15 minutes",
        description="The CR is not Ready (and no role is scaled to 0).",
        runbook="kubectl get hpd -n {{ $labels.namespace }} {{ $labels.hybridpddeployment }} -o yaml: the Ready "
        "condition's message names the component that is not ready.",
    ),
    Alert(
        name="HPDServingColocated",
        expr=f"max by ({CR}, role) (hpd_operator_serving_colocated) == 1",
        for_="1m",
        severity="warning",
        summary="{{ $labels.namespace }}/{{ $labels.hybridpddeployment }} serves colocated on {{ $labels.role }} "
        "(degraded mode)",
        description="The serving generation has no Ready pod of the other role: the endpoint selects its "
        "{{ $labels.role }} pods directly, which were sized for one role (fewer requests at once, slower decode).",
        runbook="kubectl describe hpd {{ $labels.hybridpddeployment }} -n {{ $labels.namespace }}: the Degraded "
        "condition names the missing role; its pods' probe output (the role's condition) says why they are not Ready.",
    ),
    Alert(
        name="HPDOperatorReconcileErrors",
        expr=(
            f"sum by (namespace, pod) (rate(controller_runtime_reconcile_errors_total{{{CONTROLLER}}}[10m]))"
            f" - sum by (namespace, pod) "
            f"(rate(controller_runtime_terminal_reconcile_errors_total{{{CONTROLLER}}}[10m])) > 0"
        ),
        for_="10m",
        severity="warning",
        summary="The hybrid-pd-operator fails to reconcile",
        description="Reconcile errors for 10 minutes (API trouble, or ReconcileError: a bug or input no check "
        "foresaw); failures caused by a CR's input (InvalidSpec, ApplyFailed, OwnershipConflict) are not counted.",
        runbook="See the operator log and the CRs' Warning Events (ReconcileError names the step); "
        "hpd_operator_api_errors_total tells which API call fails.",
    ),
)

ROLE = f"{CR}, role"
AUTOSCALING = (
    Alert(
        name="HPDAutoscalerAtMaxOverTarget",
        expr=(
            f"(max by ({ROLE}) (hpd_operator_autoscaler_signal_ratio) > 1.2)"
            f" and on ({ROLE}) (max by ({ROLE}) (hpd_operator_autoscaler_at_max) == 1)"
        ),
        for_="10m",
        severity="warning",
        summary="{{ $labels.role }} of {{ $labels.namespace }}/{{ $labels.hybridpddeployment }} runs at its maximum "
        "and its load is still over target",
        description="For 10 minutes the role's autoscaler has held it at the most replicas it may run (its "
        "maxReplicas, or fewer where spec.ratio bounds it to the other role) while its signal stayed over 120 % "
        "of the target: requests queue (prefill) or the KV cache preempts (decode).",
        runbook="kubectl get hpd {{ $labels.hybridpddeployment }} -n {{ $labels.namespace }} -o wide: the "
        "autoscaler column and status.{{ $labels.role }}.autoscaler.reason say whether maxReplicas or the ratio "
        "holds it; raise spec.{{ $labels.role }}.autoscaling.maxReplicas (GPUs permitting) or the ratio bound.",
    ),
)

GROUPS: dict[str, tuple[Alert, ...]] = {
    "hybrid-pd.kv-transfer": KV_TRANSFER,
    "hybrid-pd.router": ROUTER,
    "hybrid-pd.lifecycle": LIFECYCLE,
    "hybrid-pd.autoscaling": AUTOSCALING,
}


def alerts() -> list[Alert]:
    return [a for group in GROUPS.values() for a in group]


def build_rules() -> dict[str, Any]:
    """Plain Prometheus rule file (`groups:`): what promtool reads and a PrometheusRule's `spec`."""
    return {"groups": [{"name": name, "rules": [a.rule() for a in group]} for name, group in GROUPS.items()]}
