"""The end of every reconcile: observe what runs now (from the watch cache, after this run's own writes), compute the
status from it (hpd_operator.status), write it only when it differs, post the Events of its transitions, record the
metrics."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from kubernetes import client

from hpd_operator import apply as k8s
from hpd_operator import generations, metrics, podevents, report
from hpd_operator.api.names import kv_reporter_name
from hpd_operator.api.processns import pairs, security_event
from hpd_operator.builders.fallback import verified_ready_prefills
from hpd_operator.conditions import Reason
from hpd_operator.context import Run, TransientError
from hpd_operator.scaling import Bounds, autoscaled_roles, autoscaler_status
from hpd_operator.status import Observation, compute_status, transitions
from hpd_runtime import contract

log = logging.getLogger("hpd_operator")


def served_generations(body: Mapping[str, Any]) -> list[str]:
    """The generations the CR's status recorded as having served."""
    stored = (body.get("status") or {}).get("rollout") or {}
    return [str(g.get("hash")) for g in stored.get("generations") or [] if g.get("served")]


def observe(run: Run) -> None:
    """What runs now, from the cache (after this run's own writes went into it): the router, every generation of the
    engines (the one the router routes to stands for the engines), their pods and why they are not Ready."""
    children, pods = run.cache.children(run.namespace, run.instance), run.cache.pods(run.namespace, run.instance)
    live = generations.observe(children, pods, run.uid)
    plan = run.plan or generations.hold_plan(live, served_generations(run.body))  # an invalid spec moves nothing
    run.observed = report.observe_deployments(children, run.name, run.uid, plan.route.hash if plan else None)
    run.pods = report.observe_pods(pods)
    run.nodes = run.cache.nodes
    if plan is not None:
        run.rollout = generations.RolloutView(live, plan, probe_details(run, live))


def probe_details(run: Run, live: generations.Live) -> dict[tuple[str, str], str]:
    """Why the engine pods of each generation and role are not Ready, from the kubelet's probe Events (the exec probe
    prints the runtime's reason, e.g. "P->D output differs from local"), as the watch cache holds them."""
    out: dict[tuple[str, str], str] = {}
    for gen in live.generations.values():
        for role in contract.ROLES:
            pods = gen.pods[role]
            waiting = [str(p["metadata"]["name"]) for p in pods if not podevents.pod_ready(p)]
            if not waiting:
                continue
            detail = podevents.probe_failure(pods, run.cache.events(run.namespace, waiting))
            if detail:
                out[(gen.hash, role)] = detail
    return out


def kv_reports(run: Run) -> dict[str, Any] | None:
    """The KV path reports on the CR's kv-reporter Lease (pod uid -> JSON), as the watch cache holds it; None when the
    Lease is missing or not the CR's."""
    held = run.cache.child(run.namespace, "coordination.k8s.io/v1", "Lease", kv_reporter_name(run.name))
    if held is None or not k8s.owned_by(held, run.uid):
        return None
    return dict(held.get("reports") or {})


def prefills_checked(run: Run) -> tuple[int, int] | None:
    """(Ready prefill pods of the routed generation that every reporting Ready decode lists as pair-checked, Ready
    prefill pods), for DataPathVerified's words; None when no decode's report lists its peers."""
    if run.rollout is None:
        return None
    route = run.rollout.plan.route
    gen = run.rollout.live.generations.get(route.hash)
    if gen is None:
        return None
    verified = podevents.verified_prefills(gen.pods["decode"], gen.pods["prefill"], kv_reports(run))
    checked = verified_ready_prefills(run.name, route, gen.pods["prefill"], verified, run.nodes)
    if checked is None:
        return None
    # pair pods: each decode checks (and is ever sent KV by) only the prefill of its own pod, so a prefill counts
    # once its own decode lists it; otherwise every reporting decode must have checked it
    paired = run.cr is not None and pairs(run.cr.spec.kv_transfer)
    return (checked.by_one if paired else checked.by_every), checked.ready


def kv_path_report(run: Run) -> dict[str, Any] | None:
    """status.kvPath: the newest KV path report of a Ready decode pod of the CR (during a rollout, either
    generation's) on the CR's kv-reporter Lease, as the watch cache holds it (podevents.kv_path)."""
    pods = (run.pods or {}).get("decode") or []
    held = run.cache.child(run.namespace, "coordination.k8s.io/v1", "Lease", kv_reporter_name(run.name))
    if held is None or not k8s.owned_by(held, run.uid):
        return None
    now = report.now()
    stale = podevents.stale_reports(run.cache.pods(run.namespace, run.instance), held.get("reports"), now)
    if stale:  # reports of pods long gone: removed so the Lease's annotations do not grow with every restart
        gone = {contract.ANNOTATION_KV_REPORT_PREFIX + uid: None for uid in stale}
        try:
            k8s.patch(run.api, held, {"metadata": {"annotations": gone}})
        except client.ApiException as e:
            log.warning(
                f"{run.namespace}/{run.name}: removing {len(stale)} stale KV path reports: {k8s.api_message(e)}"
            )
    return podevents.kv_path(pods, held.get("reports"), now)


def write_report(run: Run) -> dict[str, Any]:
    """Status from what runs now (written only when it differs), Events for what changed, metrics."""
    md = run.body["metadata"]
    stored = run.body.get("status") or {}
    # What this process wrote last is at least as new as the cached body: compare with it, so no transition is
    # reported twice.
    previous = run.ctl.memory.reported.get(run.uid) or stored.get("conditions") or []
    previous_rollout = run.ctl.memory.reported_rollout.get(run.uid) or stored.get("rollout")
    status = compute_status(
        Observation(
            autoscalers=autoscaler_report(run),
            name=run.name,
            namespace=run.namespace,
            spec=run.cr.spec if run.cr is not None and run.profile is not None else None,
            observed=run.observed,
            pods=run.pods,
            nodes=run.nodes,
            generation=md.get("generation"),
            profile=run.profile,
            failure=run.failure,
            notes=run.notes,
            previous=previous,
            now=report.now(),
            role_details=run.role_details,
            not_scheduled_after=run.ctl.cfg.not_scheduled_seconds,
            rollout=run.rollout,
            kv_path=kv_path_report(run),
            prefills_checked=prefills_checked(run),
            fallback=(run.fallback.reason, run.fallback.message, run.fallback.serving) if run.fallback else None,
        )
    )
    new_generation = stored.get("observedGeneration") != md.get("generation")
    try:
        written = report.write_status(run.api, run.body, status)
    except client.ApiException as e:
        status_refused(run, e)
        raise TransientError(f"status: {k8s.api_message(e)}") from e
    run.ctl.memory.status_refused.pop(run.uid, None)
    if written is not None:
        run.cache.put_cr(written, run.instance)
    run.ctl.memory.reported[run.uid] = status["conditions"]
    if status.get("rollout") is not None:
        run.ctl.memory.reported_rollout[run.uid] = status["rollout"]
    for action, whats in run.actions.items():
        report.event(run.api, run.body, "Normal", action, f"{str(action).lower()} " + ", ".join(whats))
    if new_generation and run.profile is not None:  # once per spec change, not per reconcile
        for warning in run.profile.warnings:
            report.event(run.api, run.body, "Warning", Reason.RISKY_SPEC, warning)
        if run.cr is not None and (trade := security_event(run.cr.spec.kv_transfer)) is not None:
            report.event(run.api, run.body, "Warning", *trade)
    for type_, reason, message in transitions(previous, status["conditions"]):
        report.event(run.api, run.body, type_, reason, message)
    for type_, reason, message in generations.rollout_transitions(previous_rollout, status.get("rollout")):
        report.event(run.api, run.body, type_, reason, message)
    metrics.record_status(run.namespace, run.name, status, md.get("creationTimestamp"))
    return status


def autoscaler_report(run: Run) -> dict[str, dict[str, Any]]:
    """status.<role>.autoscaler of each autoscaling role (its HPA as the cache holds it after this run's writes)."""
    if run.cr is None or run.profile is None:
        return {}
    route = run.rollout.plan.route.hash if run.rollout is not None else None
    hpas = report.observe_autoscalers(run.cache.children(run.namespace, run.instance), run.name, run.uid, route)
    out: dict[str, dict[str, Any]] = {}
    for role in autoscaled_roles(run.cr.spec):
        a = run.cr.spec.role(role).autoscaling
        assert a is not None
        dep = run.observed.get(role) or {}
        bounds = run.bounds.get(role) or Bounds(a.min_replicas, a.max_replicas)
        out[role] = autoscaler_status(role, a, bounds, hpas.get(role), (dep.get("spec") or {}).get("replicas"))
    return out


def status_refused(run: Run, e: client.ApiException) -> None:
    """A refused status write leaves the CR without the status that would say why: say it in a Warning Event (once
    per distinct answer; the retries with backoff post nothing new) and in the log."""
    why = (
        f"the apiserver refused this {contract.KIND}'s status ({k8s.api_message(e)}); if it names the object's "
        "size, the spec is too large to store a status beside it (shorten spec.env values or podTemplate)"
    )
    log.warning(f"{run.namespace}/{run.name}: {why}")
    if run.ctl.memory.status_refused.get(run.uid) != why:
        run.ctl.memory.status_refused[run.uid] = why
        report.event(run.api, run.body, "Warning", Reason.STATUS_WRITE_FAILED, why)
