"""The reconcile of one CR: a short list of named steps over one typed context (hpd_operator.context.Run), then
observe + report (hpd_operator.outcome). Any step may end it with a Failure; `run_steps` tells what is transient
(retried without a status) from what this CR's status reports.

`converge`: parse -> build -> claim -> apply -> prune, then observe + write_report. `build` plans the rollout between
generations of prefill + decode first (generations.py, docs/rollouts.md): the engines of the generation the spec asks
for are built, the router routes to the one the plan says (the new one only once it is Ready), and the children of
the generations the plan keeps (the serving one, one still draining) are neither applied nor pruned."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, cast

import kopf
import urllib3
from kubernetes import client

from hpd_operator import apply as k8s
from hpd_operator import drift, generations, metrics, podevents, report
from hpd_operator.api.models import HybridPDDeployment
from hpd_operator.api.parse import parse_cr
from hpd_operator.builders import build_all, engine_templates, generation_hash, group_roles
from hpd_operator.builders.fallback import Fallback
from hpd_operator.builders.fallback import choose as choose_fallback
from hpd_operator.cache import CRKey, plain
from hpd_operator.children import apply_children, prune, report_conflicts
from hpd_operator.conditions import Failure, Reason
from hpd_operator.context import LWS, PODMONITOR, BuildError, Run, TransientError
from hpd_operator.controller import Controller
from hpd_operator.errors import SpecError
from hpd_operator.outcome import kv_reports, observe, served_generations, write_report
from hpd_operator.profile import compute_profile
from hpd_operator.rolestate import next_pod_check
from hpd_operator.rollout import generation_answering, generation_desired, generation_ready
from hpd_operator.scaling import compute_bounds, start_replicas
from hpd_operator.validation import validate
from hpd_runtime import contract


def _cr_object(body: Mapping[str, Any]) -> dict[str, Any]:
    md = body.get("metadata", {})
    return {
        "apiVersion": body.get("apiVersion"),
        "kind": body.get("kind"),
        "metadata": {"name": md.get("name"), "namespace": md.get("namespace")},
        "spec": plain(body.get("spec", {})),
    }


def parse(run: Run) -> None:
    """Parse once, validate once (raises SpecError naming every field), then the profile."""
    cfg = run.ctl.cfg
    run.cr = parse_cr(
        _cr_object(run.body),
        vllm_image=cfg.vllm_image,
        router_image=cfg.router_image,
        pod_monitor_labels=dict(cfg.pod_monitor_labels),
        vllm_digests=dict(cfg.vllm_image_digests),
    )
    run.profile = compute_profile(validate(run.cr))
    run.notes.extend(run.profile.warnings)


def plan(run: Run) -> generations.Plan:
    """The rollout plan from what the cache holds: the spec's generation (its engine templates' hash), whether each
    running generation is Ready, the highest number the status recorded (generations.plan_rollout)."""
    assert run.cr is not None and run.profile is not None
    run.templates = engine_templates(run.cr, run.profile)  # built once: hashed here, applied by `build`
    want = generation_hash(run.cr, run.profile, run.templates)
    live = generations.observe(
        run.cache.children(run.namespace, run.instance), run.cache.pods(run.namespace, run.instance), run.uid
    )
    nodes, now, spec = run.cache.nodes, report.now(), run.cr.spec
    ready, answering = {}, {}
    for h, g in live.generations.items():
        desired = generation_desired(spec, g, want)
        ready[h], answering[h] = generation_ready(g, desired, nodes, now), generation_answering(g, desired, nodes, now)
    latest = int(((run.body.get("status") or {}).get("rollout") or {}).get("latestGeneration") or 0)
    served = served_generations(run.body)
    groups = group_roles(run.cr)
    return generations.plan_rollout(want, live, ready, latest, answering=answering, served=served, groups=groups)


def build(run: Run) -> None:
    """The whole desired set, owned by the CR, each stamped with its hash; PodMonitors only where served. The
    engines are the spec's generation's, the router routes to the one the plan says."""
    assert run.cr is not None and run.profile is not None
    try:
        run.plan = plan(run)
        scale(run, run.plan)
        run.fallback = degraded_mode(run, run.plan)
        desired = build_all(
            run.cr, run.profile, run.plan, run.bounds, run.start, fallback=run.fallback, templates=run.templates
        )
    except Exception as e:  # the schema let through something a builder cannot use: say where to look
        free = free_form_fields(run.cr)
        hint = f" (set free-form fields, taken as written: {', '.join(free)})" if free else ""
        raise BuildError(f"{type(e).__name__}: {e}{hint}") from e
    if not run.ctl.caps.podmonitors and any((d["apiVersion"], d["kind"]) == PODMONITOR for d in desired):
        run.notes.append(
            "PodMonitors skipped: monitoring.coreos.com/v1 PodMonitor is not served (no Prometheus Operator)"
        )
        desired = [d for d in desired if (d["apiVersion"], d["kind"]) != PODMONITOR]
    if not run.ctl.caps.lws and any((d["apiVersion"], d["kind"]) == LWS for d in desired):
        run.failure = run.ctl.lws.missing(run.api)  # nothing is applied, nothing half-built
        return
    for obj in desired:
        kopf.append_owner_reference(obj, owner=cast("kopf.Body", run.body))
    run.desired = [drift.stamped(obj) for obj in desired]


def degraded_mode(run: Run, plan: generations.Plan) -> Fallback | None:
    """Whether the endpoint serves colocated (hpd_operator.builders.fallback.choose), from the routed generation's
    pods and its decodes' pair-checked prefill peers (their reports on the kv-reporter Lease) as the cache holds
    them: the pod watch reconciles the CR when a pod's readiness changes, the Lease watch when a report changes."""
    assert run.cr is not None
    live = generations.observe(
        run.cache.children(run.namespace, run.instance), run.cache.pods(run.namespace, run.instance), run.uid
    )
    gen = live.generations.get(plan.route.hash)
    serving = (run.body.get("status") or {}).get("serving")
    pods = gen.pods if gen is not None else {}
    verified = podevents.verified_prefills(pods.get("decode") or [], pods.get("prefill") or [], kv_reports(run))
    return choose_fallback(
        run.cr, plan, pods, run.cache.nodes, router_pods=live.router_pods, serving=serving, verified_prefills=verified
    )


def scale(run: Run, plan: generations.Plan) -> None:
    """The autoscaling roles' HPA bounds and start counts, from the generation the router routes to (its Deployments'
    replicas and its HPAs as the cache holds them): scaling.compute_bounds, scaling.start_replicas."""
    assert run.cr is not None
    children = run.cache.children(run.namespace, run.instance)
    deployments = report.observe_deployments(children, run.name, run.uid, plan.route.hash)
    run.hpas = dict(report.observe_autoscalers(children, run.name, run.uid, plan.route.hash))
    current: dict[str, Any] = {
        r: ((deployments.get(r) or {}).get("spec") or {}).get("replicas") for r in contract.ROLES
    }
    run.bounds = compute_bounds(run.cr.spec, current, run.hpas)
    run.start = start_replicas(run.cr.spec, current, run.bounds)


def free_form_fields(cr: HybridPDDeployment) -> list[str]:
    """The spec fields the CRD preserves as written (podTemplate, affinity, tolerations, env valueFrom)."""
    out = []
    for role in contract.ROLES:
        rs = cr.spec.role(role)
        for fname, value in (
            ("podTemplate", rs.pod_template),
            ("affinity", rs.affinity),
            ("tolerations", rs.tolerations),
        ):
            if value:
                out.append(f"spec.{role}.{fname}")
    out += [f"spec.env[{i}].valueFrom" for i, e in enumerate(cr.spec.env) if e.value_from is not None]
    return out


def claim(run: Run) -> None:
    """What this CR owns, the desired names another CR's child holds (never taken over), and the desired names the
    cache does not hold at all (created only if nothing holds them: `create_child`). No request."""
    labelled = {k8s.key(e): e for e in run.cache.children(run.namespace, run.instance)}
    run.ours = {k: e for k, e in labelled.items() if k8s.owned_by(e, run.uid)}
    for obj in run.desired:
        k = k8s.key(obj)
        held = labelled.get(k) or run.cache.child(run.namespace, *k)
        if held is None:
            run.absent.add(k)
        elif not k8s.owned_by(held, run.uid):
            run.conflicts[k] = k8s.holder(held)
    report_conflicts(run)


STEPS: tuple[tuple[str, Callable[[Run], None]], ...] = (
    ("parse", parse),
    ("build", build),
    ("claim", claim),
    ("apply", apply_children),
    ("prune", prune),
)
"""The reconcile of one CR; any step may end it with a Failure (see `run_steps`), then observe + report run."""


def run_steps(run: Run) -> None:
    for name, step in STEPS:
        try:
            step(run)
        except SpecError as err:
            run.failure = Failure(Reason.INVALID_SPEC, err.message)
        except client.ApiException as e:
            if not k8s.refused(e):
                raise TransientError(f"{name}: {k8s.api_message(e)}") from e
            run.failure = Failure(Reason.RECONCILE_ERROR, f"step {name} failed: {k8s.api_message(e)}")
        except (urllib3.exceptions.HTTPError, OSError) as e:  # no connection: nothing to say about this CR
            raise TransientError(f"{name}: {e!r}") from e
        except Exception as e:  # a bug or input no check foresaw: this CR's problem only
            what = str(e) if isinstance(e, BuildError) else f"{type(e).__name__}: {e}"
            run.failure = Failure(Reason.RECONCILE_ERROR, f"step {name} failed: {what}")
        if run.failure is not None and run.failure.reason != Reason.OWNERSHIP_CONFLICT:
            return


def converge(ctl: Controller, body: Mapping[str, Any]) -> Run:
    """The steps, then observe + report. Raises TransientError (and lets connection errors through) only for
    failures worth a blind retry; everything else ends in this CR's status."""
    with metrics.reconcile() as outcome:
        run = Run(ctl, body)
        run_steps(run)
        try:
            observe(run)
        except client.ApiException as e:
            raise TransientError(f"observe: {k8s.api_message(e)}") from e
        after = ctl.cfg.not_scheduled_seconds
        pod_check = next_pod_check((p for pods in run.pods.values() for p in pods), report.now(), after)
        if pod_check is not None:  # a pod no scheduler looked at turns NotScheduled then: no event announces it
            run.requeue_after = min(run.requeue_after or pod_check, pod_check)
        write_report(run)
        outcome.failed(run.failure.reason if run.failure is not None else None)
        outcome.requeue(retry=run.retry is not None, after=run.requeue_after is not None)
        return run


def reconcile_key(ctl: Controller, key: CRKey) -> Run | None:
    """Converge the CR `key` as cached now (nothing when it is gone or being deleted)."""
    body = ctl.cache.cr(key)
    if body is None or body.get("metadata", {}).get("deletionTimestamp"):
        return None
    return converge(ctl, body)
