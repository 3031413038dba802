"""Failover on the real node: a decode lost under traffic, with the operator's rendered pods on a real kubelet,
containerd, CNI bridge and kube-proxy (test_real_node_e2e's cluster, operator and CR fixtures, imported).

(a) The only decode deleted under traffic: degraded mode (hpd_operator.builders.fallback) switches the CR's endpoint
    Service `<cr>` to the prefill pod, which answers the requests itself (the stand-in's answer without
    kv_transfer_params); once the Deployment's replacement decode is Ready (its pair check passed), the Service
    selects the router again and answers go prefill -> decode.
(b) One decode of two crashes: its engine process (the stand-in vLLM, a child of the runtime's launcher in the
    container) SIGKILLed from the host, found through containerd's task list. The launcher exits with it, the kubelet
    restarts the container, the pod is Ready again after its pair check. vllm-router 0.1.17 in P/D mode retries no
    request and keeps sending to a dead engine until it takes it out (its service discovery seeing the pod NotReady,
    or its health checker's verdict: docs/reliability.md); the router pod's retry proxy sends what the router failed
    in that window again. Asserted: the kill costs at most the requests in flight at it, none hangs (each answered
    or refused within a bound derived from the router's rendered health-check flags and the proxy's holds), the
    status says a decode is down meanwhile, and nothing fails once the pod is Ready again (after its pair check).
(c) The only prefill deleted under traffic: degraded mode the other way round: the endpoint selects the decode pod,
    which answers on its own (no kv_transfer_params in what it receives); once the Deployment's replacement prefill is
    Ready and decode has passed its pair check with it, the Service selects the router again. Decode stays Ready: its
    monitor re-checks a new prefill address on its next poll (hpd_runtime.pairing) and lists the peers it verified in
    its KV path report, which fallback.choose waits for: asserted is that decode re-checks the replacement, stays the
    same Ready pod, and that P/D resumed only after that re-check.

Clients: `WORKERS` loops of one request at a time to the Service's ClusterIP (bounded, only this node's pods), each
request counted in the phase it was sent in. Timings are never asserted (only an order: in (c), P/D resumes after
decode's re-check); with HPD_RECORD_RESULTS=1 they are written to RESULT (bench/results), otherwise nothing is written,
so a CI run leaves the committed result as it was measured.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kubernetes import client
from prometheus_client.parser import text_string_to_metric_families

from hpd_devcluster import realnode
from hpd_devcluster.testing import children, wait_for
from hpd_runtime import contract

from .kube import REPO, arg, cond, events, get_cr, operator_metrics, patch_spec, wait_cr, wait_ready
from .test_real_node_e2e import (  # noqa: F401  (e2e, ready_cr: the module-scoped fixtures)
    CR,
    E2E,
    READY_S,
    e2e,
    pods,
    post_completion,
    ready_cr,
    recorded,
    unique_prompt,
)

RESULT = REPO / "bench" / "results" / "2026-12-07-real-node-failover-retry-proxy.json"
"""Where HPD_RECORD_RESULTS=1 writes (2026-12-04-real-node-failover.json: the same scenarios before the router pod had
its retry proxy)."""
RECORD = os.environ.get("HPD_RECORD_RESULTS") == "1"
WORKERS = 2
MAX_TOKENS = 2
NORMAL_S = 30.0
"""What a request may take on this loaded 2-core machine when nothing fails (test_real_node_e2e.complete's timeout)."""
PD_ID = re.compile(r"prefill_addr_([\d.]+):\d+___decode_addr_([\d.]+):\d+")
"""vllm-router's answer id in P/D mode: `cmpl-___prefill_addr_<ip:port>___decode_addr_<ip:port>_<uuid>`."""


# --- the clients ----------------------------------------------------------------------------------------------------
@dataclass
class Sent:
    phase: str
    at: float
    """monotonic time it was sent"""
    latency_s: float
    prompt: str
    answer: dict[str, Any] | None
    error: str | None
    timed_out: bool

    @property
    def end(self) -> float:
        return self.at + self.latency_s


@dataclass
class Traffic:
    """`workers` loops of one request at a time to `url` until stopped; each request is counted in the phase that
    was current when it was sent. `on_answer` sees every answer (it may move the phase on)."""

    url: str
    timeout: float = NORMAL_S
    workers: int = WORKERS
    on_answer: Callable[[Traffic, dict[str, Any]], None] | None = None
    phase: str = "before"
    marks: dict[str, float] = field(default_factory=dict)
    """phase -> monotonic time it began"""
    results: list[Sent] = field(default_factory=list)
    inflight: int = 0
    stop: threading.Event = field(default_factory=threading.Event)
    lock: threading.Lock = field(default_factory=threading.Lock)
    threads: list[threading.Thread] = field(default_factory=list)

    def advance(self, frm: str, to: str) -> bool:
        """Move from phase `frm` to `to` (only from `frm`: the first to see the change moves it)."""
        with self.lock:
            if self.phase != frm:
                return False
            self.phase, self.marks[to] = to, time.monotonic()
            return True

    def _one(self) -> None:
        prompt = unique_prompt()
        with self.lock:
            phase = self.phase
            self.inflight += 1
        t0 = time.monotonic()
        answer, err, timed_out = None, None, False
        try:
            answer = post_completion(self.url, prompt, MAX_TOKENS, self.timeout)
        except urllib.error.HTTPError as exc:
            err = f"HTTP {exc.code}: {exc.read().decode(errors='replace')[:200]}"
        except (urllib.error.URLError, OSError, ValueError) as exc:
            timed_out = isinstance(exc, TimeoutError) or isinstance(getattr(exc, "reason", None), TimeoutError)
            err = f"{type(exc).__name__}: {exc}"
        with self.lock:
            self.inflight -= 1
            self.results.append(Sent(phase, t0, time.monotonic() - t0, prompt, answer, err, timed_out))
        if answer is not None and self.on_answer is not None:
            self.on_answer(self, answer)

    def _loop(self) -> None:
        while not self.stop.is_set():
            self._one()
            time.sleep(0.05)

    def __enter__(self) -> Traffic:
        self.marks["before"] = time.monotonic()
        self.threads = [threading.Thread(target=self._loop, daemon=True) for _ in range(self.workers)]
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(timeout=self.timeout + 10)

    def of(self, phase: str) -> list[Sent]:
        with self.lock:
            return [s for s in self.results if s.phase == phase]

    def wait_answered(self, phase: str, n: int, timeout: float = 120) -> None:
        wait_for(lambda: len([s for s in self.of(phase) if s.answer is not None]) >= n, timeout,
                 what=f"{n} answers sent in phase {phase}", show=self.summary)  # fmt: skip

    def summary(self) -> dict[str, dict[str, Any]]:
        with self.lock:
            phases = list(dict.fromkeys(s.phase for s in self.results))
        return {p: phase_counts(self.of(p)) for p in phases}


def phase_counts(sent: list[Sent]) -> dict[str, Any]:
    failed = [s for s in sent if s.answer is None]
    return {
        "sent": len(sent),
        "answered": len(sent) - len(failed),
        "failed": len(failed),
        "timed_out": sum(s.timed_out for s in sent),
        "max_latency_s": round(max((s.latency_s for s in sent), default=0.0), 3),
        "errors": sorted({re.sub(r"\d+\.\d+\.\d+\.\d+(:\d+)?", "<addr>", s.error or "") for s in failed})[:5],
    }


def split_at(sent: list[Sent], t: float) -> tuple[list[Sent], list[Sent]]:
    """(the requests that ended before `t`, those still in flight at `t`) of `sent` (all sent before `t`)."""
    return [s for s in sent if s.end < t], [s for s in sent if s.end >= t]


def failed_at(sent: list[Sent], t0: float) -> list[float]:
    """When each failed request of `sent` was sent, in seconds after `t0` (the first 50)."""
    return [round(s.at - t0, 2) for s in sent if s.answer is None][:50]


def route(answer: dict[str, Any]) -> tuple[str, str] | None:
    """(prefill IP, decode IP) of an answer vllm-router put together; None for an engine's own answer."""
    m = PD_ID.search(str(answer.get("id")))
    return (m[1], m[2]) if m else None


def decode_ip(s: Sent) -> str | None:
    r = route(s.answer) if s.answer is not None else None
    return r[1] if r is not None else None


def colocated_problem(answer: dict[str, Any]) -> str | None:
    """Why `answer` is not the stand-in engine's own complete answer (no router, no KV handed over), or None."""
    choice = (answer.get("choices") or [{}])[0]
    if route(answer) is not None:
        return "put together by the router"
    if answer.get("kv_transfer_params") is not None:
        return "carries kv_transfer_params"
    if choice.get("text") != "x" * MAX_TOKENS or (answer.get("usage") or {}).get("completion_tokens") != MAX_TOKENS:
        return "not the stand-in's answer of MAX_TOKENS tokens"
    if not str(answer.get("system_fingerprint", "prefill=none")).startswith("prefill=none"):
        return "decoded from a prefill's KV"
    return None


# --- the cluster ----------------------------------------------------------------------------------------------------
def ready(pod: client.V1Pod) -> bool:
    return pod.metadata.deletion_timestamp is None and any(
        c.type == "Ready" and c.status == "True" for c in pod.status.conditions or []
    )


def all_pods(e: E2E, role: str) -> list[client.V1Pod]:
    """Every pod of `role`, Running or not, being deleted or not."""
    sel = f"app.kubernetes.io/instance={CR},app.kubernetes.io/component={role}"
    return list(client.CoreV1Api(e.api).list_namespaced_pod(e.ns, label_selector=sel).items)


def cluster_ip_url(e: E2E) -> str:
    svc = client.CoreV1Api(e.api).read_namespaced_service(CR, e.ns)
    return f"http://{svc.spec.cluster_ip}:{svc.spec.ports[0].port}"


def cr_reasons(e: E2E) -> list[str]:
    """The reasons of the Events about the CR (not its Service, also `<cr>`), each as often as it was counted."""
    return [ev.reason for ev in events(e.api, e.ns, CR) if ev.involved_object.kind == contract.KIND
            for _ in range(ev.count or 1)]  # fmt: skip


def colocated_metric(e: E2E, role: str) -> float:
    return operator_metrics(e.operator.metrics_port, namespace=e.ns, hybridpddeployment=CR, role=role).get(
        "hpd_operator_serving_colocated", -1.0
    )


def hang_bound(e: E2E) -> tuple[float, dict[str, Any]]:
    """The longest a request may take while a decode is dead, from the router Deployment's rendered flags: the
    router's verdict on an engine that fails its health checks (failure threshold x (interval + check timeout)),
    plus the retry proxy's holds (every other retry waits one second: images/router/retry.cfg), plus what a request
    may take when nothing fails here (NORMAL_S). A killed engine's sockets are reset by the kernel, so a request sent
    to it fails at once; one that waited longer than this hung."""
    dep = client.AppsV1Api(e.api).read_namespaced_deployment(f"{CR}-router", e.ns)
    args = list(dep.spec.template.spec.containers[0].args or [])
    rendered = [arg(args, f) for f in ("--health-check-interval-secs", "--health-failure-threshold",
                                       "--health-check-timeout-secs")]  # fmt: skip
    assert None not in rendered, f"the router's health-check flags are not rendered: {args}"
    interval, threshold, check_timeout = float(rendered[0] or 0), int(rendered[1] or 0), float(rendered[2] or 0)
    verdict = threshold * (interval + check_timeout)
    retry = {c.name: c for c in dep.spec.template.spec.containers}.get("retry")
    retries = int({v.name: v.value for v in (retry.env or [])}[contract.ENV_RETRIES]) if retry else 0
    holds = float((retries + 1) // 2)
    flags = {"health_check_interval_s": interval, "health_failure_threshold": threshold,
             "health_check_timeout_s": check_timeout, "request_timeout_rendered": arg(args, "--request-timeout-secs"),
             "verdict_s": verdict, "retries": retries, "retry_holds_s": holds, "normal_request_s": NORMAL_S,
             "bound_s": verdict + holds + NORMAL_S}  # fmt: skip
    return verdict + holds + NORMAL_S, flags


def engine_process(e: E2E, container_id: str) -> tuple[int, int]:
    """(the container's init process: the runtime's launcher, its child the stand-in vLLM) as host PIDs, from
    containerd's task list of the node's own containerd and the launcher's children."""
    node = realnode.RealNode.load(e.state)
    assert node is not None, "no real node state"
    tasks = subprocess.run(["ctr", "--address", str(node.socket), "--namespace", realnode.K8S_NAMESPACE, "tasks", "ls"],
                           capture_output=True, text=True, check=True, timeout=30).stdout  # fmt: skip
    init = [
        int(cols[1]) for cols in (line.split() for line in tasks.splitlines()[1:]) if cols and cols[0] == container_id
    ]
    assert len(init) == 1, f"container {container_id} not in containerd's tasks:\n{tasks}"
    engines = [c for c in children(init[0]) if b"fake_vllm.py" in Path(f"/proc/{c}/cmdline").read_bytes()]
    assert len(engines) == 1, f"launcher {init[0]}'s children {children(init[0])}: not one stand-in vLLM"
    assert container_id in Path(f"/proc/{engines[0]}/cgroup").read_text(), "the engine is not in that container"
    return init[0], engines[0]


@contextmanager
def polling(check: Callable[[], None], interval: float) -> Iterator[None]:
    """Run `check` every `interval` s in a thread for the duration of the block (its errors count as "not seen")."""
    stop = threading.Event()

    def loop() -> None:
        while not stop.is_set():
            try:
                check()
            except Exception as exc:  # an apiserver hiccup under load: the next round reads again
                print(f"poll: {type(exc).__name__}: {exc}")
            stop.wait(interval)

    t = threading.Thread(target=loop, daemon=True)
    t.start()
    try:
        yield
    finally:
        stop.set()
        t.join(timeout=30)


def record(key: str, data: dict[str, Any]) -> None:
    """Write scenario `key` into RESULT (other scenarios' entries kept), with the totals over all of them; only with
    HPD_RECORD_RESULTS=1."""
    if not RECORD:
        return
    doc = json.loads(RESULT.read_text()) if RESULT.exists() else {}
    scenarios = {**doc.get("scenarios", {}), key: data}
    totals = {k: sum(s["requests"][k] for s in scenarios.values()) for k in ("sent", "answered", "failed")}
    command = "cd /work/main && HPD_RECORD_RESULTS=1 flock /tmp/hpd-realnode.lock " + shlex.join(
        getattr(sys, "orig_argv", sys.argv)
    )
    doc = {
        "date": "2026-12-04",
        "what": "failover on the real node (tests/cluster/test_real_node_failover.py): the only decode deleted under "
        "traffic (degraded mode: the endpoint serves colocated on prefill, then P/D again), one decode of two "
        "whose engine process was SIGKILLed under traffic, and the only prefill deleted under traffic (degraded "
        "mode: colocated on decode, then P/D again); failed requests per phase from the clients' side",
        "setup": {
            "machine": "the project's 2-core dev machine, shared with other engineers' runs; one real node (kubelet "
            "1.35, containerd, runc, CNI bridge, kube-proxy, CoreDNS: hack/hpd_devcluster) on the local control plane",
            "model": "none: the engine stand-in (tests/runtime/fake_vllm.py in the vllm image's runtime, "
            "realnode.ensure_engine_standin) behind the real vllm-router 0.1.17 image",
            "vllm_version": None,
            "mode": None,
            "gpus_per_role": {},
            "roles_share_gpu": None,
            "roles_share_pid_namespace": False,
        },
        "command": command,
        "requests": {**totals, "counted": "every request of every scenario's clients (the pods' warmup and pair "
                     "checks excluded); failed = an HTTP error, a refused or reset connection, or no answer in time"},
        "scenarios": scenarios,
    }  # fmt: skip
    RESULT.write_text(json.dumps(doc, indent=1) + "\n")


def since(t0: float, marks: dict[str, float]) -> dict[str, float]:
    return {k: round(v - t0, 2) for k, v in marks.items()}


# --- (a) the only decode lost: degraded mode ------------------------------------------------------------------------
def test_the_only_decode_deleted_under_traffic_serves_colocated_on_prefill_then_pd_again(
    e2e: E2E,  # noqa: F811
    ready_cr: dict[str, Any],  # noqa: F811
) -> None:
    """No request fails while the endpoint serves colocated: the Service selects the prefill pod, which answers on
    its own (no kv_transfer_params); the CR says Degraded=True DecodeUnavailable with one Event and the metric; once
    the replacement decode passed its pair check the endpoint is the router again (an answer prefill -> the new
    decode), Degraded is False, one PDRestored Event."""
    patch_spec(e2e.api, e2e.ns, CR, {"decode": {"replicas": 1}})
    wait_for(lambda: len(all_pods(e2e, "decode")) == 1 and all(ready(p) for p in all_pods(e2e, "decode")),
             READY_S, what="one Ready decode pod")  # fmt: skip
    wait_ready(e2e.api, e2e.ns, CR, timeout=READY_S)
    (prefill,), (victim,) = pods(e2e, "prefill"), pods(e2e, "decode")
    before_events = cr_reasons(e2e)
    seen: dict[str, Any] = {}
    marks: dict[str, float] = {}

    def on_answer(tr: Traffic, answer: dict[str, Any]) -> None:
        if colocated_problem(answer) is None:
            tr.advance("switching", "degraded")  # the data path switched: the first colocated answer
        elif (r := route(answer)) is not None and r[1] != victim.status.pod_ip:
            tr.advance("restoring", "after")  # the first answer through the replacement decode

    def watch() -> None:
        now = time.monotonic()
        new = [p for p in all_pods(e2e, "decode") if p.metadata.name != victim.metadata.name and ready(p)]
        if new and "replacement_ready" not in marks:
            marks["replacement_ready"] = now
            seen["replacement"] = new[0]
            seen["router_ready_at_replacement_ready"] = [ready(p) for p in all_pods(e2e, "router")]
        if new:
            traffic.advance("degraded", "restoring")
        cr = get_cr(e2e.api, e2e.ns, CR)
        deg, serving = cond(cr, "Degraded"), (cr.get("status") or {}).get("serving")
        if deg.get("reason") == "DecodeUnavailable" and "cr_degraded" not in marks:
            marks["cr_degraded"], seen["degraded"], seen["serving"] = now, deg, serving
        if "cr_degraded" in marks and serving == "router" and "cr_restored" not in marks:
            marks["cr_restored"] = now
        if "metric_colocated" not in marks and colocated_metric(e2e, "prefill") == 1.0:
            marks["metric_colocated"] = now

    traffic = Traffic(cluster_ip_url(e2e), on_answer=on_answer)
    with traffic, polling(watch, 0.1):
        traffic.wait_answered("before", 10)
        traffic.advance("before", "switching")
        # the clock reads before the call: the router sees the pod Terminating (and drops it) while the API call is
        # still returning, so a request ending during the call ended after the delete (in_flight_at_delete)
        t_delete = time.monotonic()
        client.CoreV1Api(e2e.api).delete_namespaced_pod(victim.metadata.name, e2e.ns)
        wait_for(lambda: "degraded" in traffic.marks, READY_S, what="a colocated answer", show=traffic.summary)
        wait_for(lambda: "cr_degraded" in marks, 60, what="Degraded=True DecodeUnavailable")
        wait_for(lambda: "metric_colocated" in marks, 60, what="hpd_operator_serving_colocated{role=prefill} 1")
        traffic.wait_answered("degraded", 5)
        wait_for(lambda: "after" in traffic.marks, READY_S, what="an answer through the replacement decode",
                 show=lambda: (since(t_delete, marks), traffic.summary()))  # fmt: skip
        traffic.wait_answered("after", 10)
    final = wait_cr(e2e.api, e2e.ns, CR, lambda c: cond(c, "Degraded").get("status") == "False", "Degraded=False",
                    timeout=120)  # fmt: skip
    wait_for(lambda: colocated_metric(e2e, "prefill") == 0.0, 60, what="hpd_operator_serving_colocated 0")
    wait_for(lambda: cr_reasons(e2e).count("PDRestored") > before_events.count("PDRestored"), 60, what="PDRestored")
    new_events = list((Counter(cr_reasons(e2e)) - Counter(before_events)).elements())

    ended_before, in_flight = split_at(traffic.of("before"), t_delete)
    counts = {"before": phase_counts(ended_before), "in_flight_at_delete": phase_counts(in_flight)}
    counts |= {p: phase_counts(traffic.of(p)) for p in ("switching", "degraded", "restoring", "after")}
    switch = {**since(t_delete, marks), **since(t_delete, {f"{k}_phase": v for k, v in traffic.marks.items()})}
    window = in_flight + traffic.of("switching")  # in flight at the delete, or sent before the first colocated answer
    replacement: client.V1Pod = seen["replacement"]
    result = {
        "scenario": "CR with 1 prefill and 1 decode, degradedMode on (default); the decode pod deleted (graceful) "
        f"under {WORKERS} clients",
        "phases": "by the time a request was sent: before (until the delete; in_flight_at_delete: sent before, "
        "answered or failed after it), switching (until the first colocated answer), degraded (until the replacement "
        "decode was seen Ready), restoring (until the first answer through it), after",
        "per_phase": counts,
        "switch_window": {**phase_counts(window), "what": "in flight at the delete or sent before the first "
                          "colocated answer: the only requests allowed to fail"},
        "seconds_after_delete": switch,
        "failed_sent_s_after_delete": failed_at(traffic.results, t_delete),
        "router_pod_ready_when_the_replacement_turned_ready": seen.get("router_ready_at_replacement_ready"),
        "degraded_condition": seen["degraded"],
        "events_after_delete": new_events,
        "requests": phase_counts(traffic.of("before") + traffic.of("switching") + traffic.of("degraded")
                                 + traffic.of("restoring") + traffic.of("after")),
    }  # fmt: skip
    record("only_decode_deleted_degraded_mode", result)
    print(json.dumps(result, indent=1, default=str))

    # failures only in the switch window (requests in flight at the delete or sent before the first colocated
    # answer), none a hang: 0 failed before, 0 from the first colocated answer on (degraded, restoring, after)
    assert counts["before"]["failed"] == 0, counts["before"]
    assert all(c["timed_out"] == 0 for c in counts.values()), counts
    for phase in ("degraded", "restoring", "after"):
        assert counts[phase]["failed"] == 0, (phase, counts[phase], failed_at(traffic.of(phase), t_delete))
    # the switch: the CR says so, with one Event and the metric
    assert seen["degraded"]["status"] == "True" and seen["degraded"]["message"].startswith("serving colocated on "
                                                                                          "prefill"), seen  # fmt: skip
    assert seen["serving"] == "colocated on prefill", seen
    assert new_events.count("DecodeUnavailable") == 1 and new_events.count("PDRestored") == 1, new_events
    # degraded: every request answered, by prefill itself
    degraded = traffic.of("degraded")
    assert degraded, counts
    replacement_ip = replacement.status.pod_ip
    # (an answer through the replacement may end the phase before the poll saw the replacement Ready)
    odd = [(colocated_problem(s.answer), s.answer) for s in degraded if s.answer and decode_ip(s) != replacement_ip]
    assert all(problem is None for problem, _ in odd), odd
    at_prefill = {str((r["body"] or {}).get("prompt")): r for r in recorded(prefill)}
    for s in (s for s in degraded if decode_ip(s) is None):
        got = at_prefill.get(s.prompt)
        assert got is not None and not got["body"].get("kv_transfer_params"), (s.prompt, got)
    assert pods(e2e, "prefill")[0].metadata.uid == prefill.metadata.uid, "the prefill pod was replaced"
    # back to P/D: the replacement passed its pair check, answers go prefill -> the replacement, nothing fails after
    ours = {s.prompt for s in traffic.results}  # (the runtime's own requests may send token ids: a list)
    pair_checks = [r for r in recorded(replacement) if ((r["body"] or {}).get("kv_transfer_params") or {})
                   .get("do_remote_prefill") and str(r["body"].get("prompt")) not in ours]  # fmt: skip
    assert pair_checks, "the replacement decode served before any pair check"
    after = traffic.of("after")
    assert {route(s.answer) for s in after if s.answer} == {(prefill.status.pod_ip, replacement_ip)}
    assert (final.get("status") or {}).get("serving") == "router", final.get("status")


# --- (b) one decode of two crashes: its engine SIGKILLed ------------------------------------------------------------
def test_a_sigkilled_decode_engine_restarts_and_no_request_hangs_or_fails_after_it_is_ready(
    e2e: E2E,  # noqa: F811
    ready_cr: dict[str, Any],  # noqa: F811
) -> None:
    """The stand-in vLLM of one decode pod of two SIGKILLed under traffic: every request is answered or refused
    within `hang_bound` (none hangs), the status says one decode is not Ready (and the endpoint stays the router: a
    Ready decode is left), the container restarts (the launcher exits 137 with its engine), the pod is Ready again,
    and from then on no request fails. The failures in between are recorded against the requests in flight."""
    patch_spec(e2e.api, e2e.ns, CR, {"decode": {"replicas": 2}})
    wait_for(lambda: len(all_pods(e2e, "decode")) == 2 and all(ready(p) for p in all_pods(e2e, "decode")),
             READY_S, what="2 Ready decode pods")  # fmt: skip
    wait_ready(e2e.api, e2e.ns, CR, timeout=READY_S)
    victim = sorted(pods(e2e, "decode"), key=lambda p: str(p.metadata.name))[0]
    status = victim.status.container_statuses[0]
    container_id, restarts = status.container_id.split("://", 1)[1], status.restart_count
    _launcher, engine_pid = engine_process(e2e, container_id)
    bound, flags = hang_bound(e2e)
    before_events = cr_reasons(e2e)
    samples: list[dict[str, Any]] = []

    def watch() -> None:
        cr = get_cr(e2e.api, e2e.ns, CR)
        st = cr.get("status") or {}
        samples.append({"t": time.monotonic(), "decode_ready": (st.get("decode") or {}).get("readyReplicas"),
                        "Ready": cond(cr, "Ready").get("status"), "DecodeReady": cond(cr, "DecodeReady").get("status"),
                        "Degraded": cond(cr, "Degraded").get("reason"), "serving": st.get("serving")})  # fmt: skip

    def victim_back() -> bool:
        pod = client.CoreV1Api(e2e.api).read_namespaced_pod(victim.metadata.name, e2e.ns)
        return ready(pod) and pod.status.container_statuses[0].restart_count > restarts

    traffic = Traffic(cluster_ip_url(e2e), timeout=bound)
    with traffic, polling(watch, 0.25):
        traffic.wait_answered("before", 10)
        with traffic.lock:  # the kill happens with the phase switch: nothing is sent in between
            in_flight = traffic.inflight
            traffic.phase = "crashed"
            traffic.marks["crashed"] = t_kill = time.monotonic()
            os.kill(engine_pid, signal.SIGKILL)
        wait_for(victim_back, READY_S, what="the killed decode's container restarted and Ready")
        t_pod_ready = time.monotonic()
        wait_ready(e2e.api, e2e.ns, CR, timeout=READY_S)
        t_cr_ready = time.monotonic()
        traffic.advance("crashed", "after")
        traffic.wait_answered("after", 20)
        wait_for(lambda: any(decode_ip(s) == victim.status.pod_ip for s in traffic.of("after")), 120,
                 what="an answer through the restarted decode")  # fmt: skip
    hung = [t.name for t in traffic.threads if t.is_alive()]
    pod = client.CoreV1Api(e2e.api).read_namespaced_pod(victim.metadata.name, e2e.ns)
    last = pod.status.container_statuses[0].last_state.terminated
    ended_before, in_flight_sent = split_at(traffic.of("before"), t_kill)
    counts = {"before": phase_counts(ended_before), "in_flight_at_kill": phase_counts(in_flight_sent)}
    counts |= {p: phase_counts(traffic.of(p)) for p in ("crashed", "after")}
    lost = counts["in_flight_at_kill"]["failed"] + counts["crashed"]["failed"]
    during = [s for s in samples if t_kill <= s["t"] <= t_pod_ready]
    result = {
        "scenario": f"CR with 1 prefill and 2 decodes; one decode's engine process (the stand-in vLLM, host PID from "
        f"containerd's task list) SIGKILLed under {WORKERS} clients",
        "phases": "by the time a request was sent: before (until the kill; in_flight_at_kill: sent before, answered "
        "or failed after it), crashed (until the pod was Ready again), after",
        "per_phase": counts,
        "in_flight_at_kill": in_flight,
        "failed_because_of_the_kill": lost,
        "failed_le_in_flight": lost <= in_flight,
        "failed_sent_s_after_kill": failed_at(traffic.results, t_kill),
        "why_not": None if lost <= in_flight else "the router sent requests to the dead decode until its discovery "
        "saw the pod NotReady (or its health checker failed it), and the retry proxy's attempts "
        f"({flags['retries']} retries) did not outlast that (see failed_sent_s_after_kill)",
        "hang_bound": flags,
        "seconds_after_kill": {"status_one_decode_down": next((round(s["t"] - t_kill, 2) for s in during
                                                               if s["decode_ready"] == 1), None),
                               "last_failed_sent": max((round(s.at - t_kill, 2) for s in traffic.results
                                                        if s.answer is None), default=None),
                               "pod_ready_again": round(t_pod_ready - t_kill, 2),
                               "cr_ready_again": round(t_cr_ready - t_kill, 2)},
        "container_last_exit_code": last.exit_code if last else None,
        "status_while_down": {"samples": len(during), "decode_ready_seen": sorted({str(s["decode_ready"]) for s in during}),
                              "Ready_seen": sorted({str(s["Ready"]) for s in during}),
                              "serving_seen": sorted({str(s["serving"]) for s in during})},
        "events_after_kill": list((Counter(cr_reasons(e2e)) - Counter(before_events)).elements()),
        "requests": phase_counts(traffic.of("before") + traffic.of("crashed") + traffic.of("after")),
    }  # fmt: skip
    record("one_of_two_decodes_sigkilled", result)
    print(json.dumps(result, indent=1, default=str))

    assert not hung, f"clients still waiting after {bound} s: {hung}"
    assert all(c["timed_out"] == 0 for c in counts.values()), counts  # none waited past the bound: no hang
    assert counts["before"]["failed"] == 0, counts["before"]
    # the router pod's retry proxy sends what the router failed again: the kill costs at most what was in flight
    assert lost <= in_flight, result
    assert last is not None and last.exit_code == 137, last  # the launcher exited with its SIGKILLed engine
    # the status said a decode was down, and the endpoint stayed the router (one Ready decode was left)
    assert any(s["decode_ready"] == 1 and s["Ready"] == "False" for s in during), during
    assert {s["serving"] for s in samples} == {"router"}, samples
    assert "DecodeUnavailable" not in {s["Degraded"] for s in samples}, samples
    assert "DecodeUnavailable" not in result["events_after_kill"], result["events_after_kill"]
    # back in P/D only after the restarted engine's pair check (its /_requests start empty with the new process)
    ours = {s.prompt for s in traffic.results}
    pair_checks = [r for r in recorded(pod) if ((r["body"] or {}).get("kv_transfer_params") or {})
                   .get("do_remote_prefill") and str(r["body"].get("prompt")) not in ours]  # fmt: skip
    assert pair_checks, "the restarted decode served before any pair check"
    assert counts["after"]["failed"] == 0 and counts["after"]["answered"] >= 20, counts["after"]


# --- (c) the only prefill lost: degraded mode on decode -------------------------------------------------------------
def pair_checks_ok(pod: client.V1Pod) -> float:
    """Decode's runtime counter of passed pair checks (its /metrics on the runtime port, from the pod's address)."""
    url = f"http://{pod.status.pod_ip}:{contract.RUNTIME_PORT}/metrics"
    text = urllib.request.urlopen(url, timeout=5).read().decode()
    return sum(s.value for fam in text_string_to_metric_families(text) for s in fam.samples
               if s.name == "hpd_runtime_pair_checks_total" and s.labels.get("result") == "ok")  # fmt: skip


def test_the_only_prefill_deleted_under_traffic_serves_colocated_on_decode_then_pd_again(
    e2e: E2E,  # noqa: F811
    ready_cr: dict[str, Any],  # noqa: F811
) -> None:
    """No request fails while the endpoint serves colocated on decode: the Service selects the decode pod, which
    answers on its own (it receives no kv_transfer_params); the CR says Degraded=True PrefillUnavailable with one
    Event and the metric; once the replacement prefill is Ready the endpoint is the router again (an answer through
    the new prefill -> the same decode), Degraded is False, one PDRestored Event, nothing fails after. Decode stays
    the same Ready pod (not restarted) and re-checks its pair with the replacement (its monitor: a new prefill
    address is checked on the next poll), a check that passes, and the endpoint goes back to the router only after it
    (fallback.choose waits for a decode's report to list the replacement)."""
    patch_spec(e2e.api, e2e.ns, CR, {"prefill": {"replicas": 1}, "decode": {"replicas": 1}})
    wait_for(lambda: all(len(all_pods(e2e, r)) == 1 and all(ready(p) for p in all_pods(e2e, r))
                         for r in ("prefill", "decode")),
             READY_S, what="one Ready prefill and one Ready decode pod",
             show=lambda: {r: [(p.metadata.name, ready(p)) for p in all_pods(e2e, r)] for r in contract.ROLES})  # fmt: skip
    wait_ready(e2e.api, e2e.ns, CR, timeout=READY_S)
    (victim,), (decode,) = pods(e2e, "prefill"), pods(e2e, "decode")
    decode_restarts = decode.status.container_statuses[0].restart_count
    checks_before = pair_checks_ok(decode)
    before_events = cr_reasons(e2e)
    seen: dict[str, Any] = {}
    marks: dict[str, float] = {}
    samples: list[dict[str, Any]] = []

    def on_answer(tr: Traffic, answer: dict[str, Any]) -> None:
        if colocated_problem(answer) is None:
            tr.advance("switching", "degraded")  # the data path switched: the first colocated answer
        elif (r := route(answer)) is not None and r[0] != victim.status.pod_ip:
            tr.advance("restoring", "after")  # the first answer through the replacement prefill

    def watch() -> None:
        now = time.monotonic()
        new = [p for p in all_pods(e2e, "prefill") if p.metadata.name != victim.metadata.name and ready(p)]
        if new and "replacement_ready" not in marks:
            marks["replacement_ready"] = now
            seen["replacement"] = new[0]
            seen["router_ready_at_replacement_ready"] = [ready(p) for p in all_pods(e2e, "router")]
        if new:
            traffic.advance("degraded", "restoring")
        cr = get_cr(e2e.api, e2e.ns, CR)
        deg, serving = cond(cr, "Degraded"), (cr.get("status") or {}).get("serving")
        samples.append({"t": now, "serving": serving, "Degraded": deg.get("reason"),
                        "DataPathVerified": cond(cr, "DataPathVerified").get("status"),
                        "decode_ready": ((cr.get("status") or {}).get("decode") or {}).get("readyReplicas")})  # fmt: skip
        if deg.get("reason") == "PrefillUnavailable" and "cr_degraded" not in marks:
            marks["cr_degraded"], seen["degraded"], seen["serving"] = now, deg, serving
        if "cr_degraded" in marks and serving == "router" and "cr_restored" not in marks:
            marks["cr_restored"] = now
            seen["data_path_verified_at_restore"] = cond(cr, "DataPathVerified")
        if "metric_colocated" not in marks and colocated_metric(e2e, "decode") == 1.0:
            marks["metric_colocated"] = now
        if "replacement_ready" in marks and "decode_rechecked" not in marks and pair_checks_ok(decode) > checks_before:
            marks["decode_rechecked"] = now  # decode's runtime counted a passed pair check (with the replacement)

    traffic = Traffic(cluster_ip_url(e2e), on_answer=on_answer)
    with traffic, polling(watch, 0.1):
        traffic.wait_answered("before", 10)
        traffic.advance("before", "switching")
        # the clock reads before the call: the router sees the pod Terminating (and drops it) while the API call is
        # still returning, so a request ending during the call ended after the delete (in_flight_at_delete)
        t_delete = time.monotonic()
        client.CoreV1Api(e2e.api).delete_namespaced_pod(victim.metadata.name, e2e.ns)
        show = lambda: (since(t_delete, marks), traffic.summary())  # noqa: E731
        wait_for(lambda: "degraded" in traffic.marks, READY_S, what="a colocated answer", show=show)
        wait_for(lambda: "cr_degraded" in marks, 60, what="Degraded=True PrefillUnavailable",
                 show=lambda: samples[-3:])  # fmt: skip
        wait_for(lambda: "metric_colocated" in marks, 60, what="hpd_operator_serving_colocated{role=decode} 1",
                 show=show)  # fmt: skip
        traffic.wait_answered("degraded", 5)
        wait_for(lambda: "after" in traffic.marks, READY_S, what="an answer through the replacement prefill",
                 show=show)  # fmt: skip
        traffic.wait_answered("after", 10)
        wait_for(lambda: "decode_rechecked" in marks, 120, what="decode's passed pair check with the replacement",
                 show=lambda: (show(), pair_checks_ok(decode), checks_before))  # fmt: skip
        n_after = len(traffic.of("after"))
        wait_for(lambda: len([s for s in traffic.of("after") if s.answer is not None]) >= n_after + 10, 120,
                 what="10 more answers after decode's re-check", show=show)  # fmt: skip
    final = wait_cr(e2e.api, e2e.ns, CR, lambda c: cond(c, "Degraded").get("status") == "False", "Degraded=False",
                    timeout=120)  # fmt: skip
    wait_for(lambda: colocated_metric(e2e, "decode") == 0.0, 60, what="hpd_operator_serving_colocated 0",
             show=lambda: colocated_metric(e2e, "decode"))  # fmt: skip
    wait_for(lambda: cr_reasons(e2e).count("PDRestored") > before_events.count("PDRestored"), 60, what="PDRestored",
             show=lambda: cr_reasons(e2e))  # fmt: skip
    new_events = list((Counter(cr_reasons(e2e)) - Counter(before_events)).elements())

    replacement: client.V1Pod = seen["replacement"]
    ours = {s.prompt for s in traffic.results}  # (the runtime's own requests send token ids: a list)
    at_new_prefill = recorded(replacement)
    at_decode = recorded(decode)
    # decode's pair check with the replacement: the prompts it sent there (X-Request-Id hpd-pair-*), then to itself
    pair_rids = {r["request_id"] for r in at_new_prefill if str(r.get("request_id") or "").startswith("hpd-pair-")}
    pair_at_decode = [r for r in at_decode if r.get("request_id") in pair_rids]
    routed_at_new_prefill = [r for r in at_new_prefill if str((r["body"] or {}).get("prompt")) in ours]
    first_routed = min((r["t"] for r in routed_at_new_prefill), default=None)
    first_pair = min((r["t"] for r in at_new_prefill if r.get("request_id") in pair_rids), default=None)
    last_pair = max((r["t"] for r in pair_at_decode), default=None)

    ended_before, in_flight = split_at(traffic.of("before"), t_delete)
    counts = {"before": phase_counts(ended_before), "in_flight_at_delete": phase_counts(in_flight)}
    counts |= {p: phase_counts(traffic.of(p)) for p in ("switching", "degraded", "restoring", "after")}
    rechecked_at = marks["decode_rechecked"]
    counts["after_decode_rechecked"] = phase_counts([s for s in traffic.of("after") if s.at > rechecked_at])
    switch = {**since(t_delete, marks), **since(t_delete, {f"{k}_phase": v for k, v in traffic.marks.items()})}
    engine_clock = {"first_routed_request_at_replacement": first_routed,  # the engines' time.monotonic(): the host's
                    "first_pair_check_request_at_replacement": first_pair,  # (containers share CLOCK_MONOTONIC)
                    "last_pair_check_request_at_decode": last_pair}  # fmt: skip
    window = in_flight + traffic.of("switching")  # in flight at the delete, or sent before the first colocated answer
    during = [
        s for s in samples if marks.get("cr_degraded", t_delete) <= s["t"] < marks.get("cr_restored", float("inf"))
    ]
    result = {
        "scenario": "CR with 1 prefill and 1 decode, degradedMode on (default); the prefill pod deleted (graceful) "
        f"under {WORKERS} clients",
        "phases": "by the time a request was sent: before (until the delete; in_flight_at_delete: sent before, "
        "answered or failed after it), switching (until the first colocated answer), degraded (until the replacement "
        "prefill was seen Ready), restoring (until the first answer through it), after (after_decode_rechecked: "
        "the part of after sent once decode's runtime had counted its passed pair check with the replacement)",
        "per_phase": counts,
        "switch_window": {**phase_counts(window), "what": "in flight at the delete or sent before the first "
                          "colocated answer: the only requests allowed to fail"},
        "seconds_after_delete": switch,
        "engine_seconds_after_delete": {k: None if v is None else round(v - t_delete, 2)
                                        for k, v in engine_clock.items()},
        "pd_resumed_before_decode_rechecked": None if first_routed is None or first_pair is None
        else first_routed < first_pair,
        "pd_resumption_vs_recheck": "the operator switches the endpoint back once a Ready decode's KV path report "
        "lists a Ready prefill pod as pair-checked (fallback.choose; and a router pod is Ready); decode stays Ready "
        "and re-checks a new prefill address on its monitor's next poll (HPD_PAIR_RECHECK_SECONDS, 10 s by default), "
        "so P/D resumes after that re-check",
        "decode_pair_check_with_replacement": {"prompts_at_replacement": len(pair_rids),
                                               "requests_at_decode": len(pair_at_decode),
                                               "passed_checks_counted": pair_checks_ok(decode) - checks_before},
        "data_path_verified_at_restore": seen.get("data_path_verified_at_restore"),
        "status_while_degraded": {"samples": len(during), "serving_seen": sorted({str(s["serving"]) for s in during}),
                                  "decode_ready_seen": sorted({str(s["decode_ready"]) for s in during})},
        "failed_sent_s_after_delete": failed_at(traffic.results, t_delete),
        "router_pod_ready_when_the_replacement_turned_ready": seen.get("router_ready_at_replacement_ready"),
        "degraded_condition": seen["degraded"],
        "events_after_delete": new_events,
        "requests": phase_counts(traffic.of("before") + traffic.of("switching") + traffic.of("degraded")
                                 + traffic.of("restoring") + traffic.of("after")),
    }  # fmt: skip
    record("only_prefill_deleted_degraded_mode", result)
    print(json.dumps(result, indent=1, default=str))

    # failures only in the switch window (requests in flight at the delete or sent before the first colocated
    # answer), none a hang: 0 failed before, 0 from the first colocated answer on (degraded, restoring, after)
    assert counts["before"]["failed"] == 0, counts["before"]
    assert all(c["timed_out"] == 0 for c in counts.values()), counts
    for phase in ("degraded", "restoring", "after"):
        assert counts[phase]["failed"] == 0, (phase, counts[phase], failed_at(traffic.of(phase), t_delete))
    # the switch: the CR says so, with one Event and the metric
    assert seen["degraded"]["status"] == "True" and seen["degraded"]["message"].startswith("serving colocated on "
                                                                                          "decode"), seen  # fmt: skip
    assert seen["serving"] == "colocated on decode", seen
    assert new_events.count("PrefillUnavailable") == 1 and new_events.count("PDRestored") == 1, new_events
    assert "DecodeUnavailable" not in new_events, new_events
    # degraded: every request answered, by decode itself, which received it without kv_transfer_params
    degraded = traffic.of("degraded")
    assert degraded, counts
    replacement_ip = replacement.status.pod_ip
    # (an answer through the replacement may end the phase before the poll saw the replacement Ready)
    odd = [(colocated_problem(s.answer), s.answer) for s in degraded if s.answer is not None
           and (route(s.answer) or (replacement_ip,))[0] != replacement_ip]  # fmt: skip
    assert all(problem is None for problem, _ in odd), odd
    decode_got = {str((r["body"] or {}).get("prompt")): r for r in at_decode}
    colocated = [s for s in degraded if s.answer is not None and route(s.answer) is None]
    assert colocated, counts
    for s in colocated:
        got = decode_got.get(s.prompt)
        assert got is not None and not got["body"].get("kv_transfer_params"), (s.prompt, got)
    # decode stayed the same pod, never restarted, and served throughout (the degraded endpoint is decode)
    now_decode = pods(e2e, "decode")
    assert [p.metadata.uid for p in now_decode] == [decode.metadata.uid], "the decode pod was replaced"
    assert now_decode[0].status.container_statuses[0].restart_count == decode_restarts, "decode restarted"
    assert {s["serving"] for s in during} <= {"colocated on decode"}, during
    # decode re-checked its pair with the replacement prefill (its monitor's promise) and the check passed
    assert pair_rids and pair_at_decode, ("decode sent no pair check to the replacement prefill", len(at_new_prefill))
    assert pair_checks_ok(decode) > checks_before
    # ... and only then back to P/D: the first request the router sent the replacement came after the last of the
    # check's P->D requests at decode (the engines' clock), and the status said `router` no earlier than this poll
    # saw decode's passed check (the poll reads the CR before decode's counter, which counts before the report; a
    # status the poll never saw say `router` came later still)
    assert first_routed is not None and last_pair is not None and first_routed > last_pair, engine_clock
    assert marks["decode_rechecked"] <= marks.get("cr_restored", float("inf")), since(t_delete, marks)
    # back to P/D: answers go the replacement prefill -> the same decode, nothing fails after
    after = traffic.of("after")
    assert {route(s.answer) for s in after if s.answer} == {(replacement_ip, decode.status.pod_ip)}
    assert counts["after_decode_rechecked"]["answered"] >= 10, counts["after_decode_rechecked"]
    assert (final.get("status") or {}).get("serving") == "router", final.get("status")
