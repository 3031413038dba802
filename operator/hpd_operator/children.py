"""The apply and prune steps of a reconcile: create or server-side apply each desired child that differs from what
runs (a child is read back only on suspicion of drift), hand an autoscaling role's replicas to its autoscaler, and
delete what the CR owns and no longer wants. The requests themselves are apply.py's."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any, cast

from kubernetes import client

from hpd_operator import apply as k8s
from hpd_operator import blame, drift, generations, metrics
from hpd_operator.builders import Manifest
from hpd_operator.conditions import Failure, Reason
from hpd_operator.context import Run
from hpd_runtime import contract

log = logging.getLogger("hpd_operator")


def report_conflicts(run: Run) -> None:
    """The OwnershipConflict failure naming every desired name held by something else (the rest is applied)."""
    if not run.conflicts:
        return
    held = "; ".join(f"{kind} {name} exists and is {who}" for (_, kind, name), who in run.conflicts.items())
    run.failure = Failure(
        Reason.OWNERSHIP_CONFLICT,
        f"{held}: left alone (rename this {contract.KIND} or delete that object); the other children are applied",
    )


def _signature(live: Mapping[str, Any], desired: Mapping[str, Any]) -> tuple[str | None, int | None]:
    return drift.touched_by_others(live, desired), (live.get("metadata") or {}).get("generation")


def needs_apply(run: Run, obj: Manifest, live: Manifest | None) -> str | None:
    """Why `obj` must be applied (None: the live child is what we want). Reads the child only on suspicion."""
    if live is None:
        return "missing"
    if drift.live_hash(live) != drift.live_hash(obj):
        return "changed"
    uid = str(live["metadata"].get("uid"))
    sig = _signature(live, obj)
    last = run.ctl.memory.checked.get(uid)
    if (last is None and sig[0] is None) or last == sig:
        run.ctl.memory.checked[uid] = (
            sig  # first sight, untouched by others since our write; or already verified as it is
        )
        return None
    full = k8s.get(run.api, obj)
    if full is None:
        return "missing"
    where = drift.mismatch(obj, full)
    if where is None:
        run.ctl.memory.checked[uid] = _signature(full, obj)
        return None
    return f"drifted at {where}"


def create_child(run: Run, obj: Manifest) -> Manifest | None:
    """Create a child the cache does not hold, in one request unless its name is taken; then read who holds it: our
    own child (the watch has not delivered it yet) is applied as usual, anything else is a conflict (None)."""
    for _ in range(2):  # the holder may be deleted between the create and the read: try once more
        new = k8s.create(run.api, obj)
        if new is not None:
            return new
        live = k8s.get(run.api, obj)
        if live is None:
            continue
        if k8s.owned_by(live, run.uid):
            return k8s.apply(run.api, obj)
        run.conflicts[k8s.key(obj)] = k8s.holder(live)
        return None
    what = f"{obj['kind']} {obj['metadata']['name']}"
    raise client.ApiException(status=409, reason="Conflict", body=f"{what} keeps being created and deleted by another")


def write_child(run: Run, obj: Manifest) -> Manifest | None:
    """Create `obj` if the cache does not hold it, else apply it if it differs; the object as stored, or None when
    nothing was written (unchanged, or its name is held by another object: `run.conflicts`)."""
    k = k8s.key(obj)
    what = f"{obj['kind']} {obj['metadata']['name']}"
    role = autoscaled_role(run, obj)
    if k in run.absent:
        log.debug(f"{run.namespace}/{run.name}: create {what}")
        return create_child(run, obj if role is None else with_initial_replicas(run, obj, role))
    live = run.ours.get(k)
    why = needs_apply(run, obj, live)
    if why is None:
        return None
    if role is not None and live is not None and k8s.owns_replicas(live):
        hand_off_replicas(run, obj, live, role)
    log.debug(f"{run.namespace}/{run.name}: apply {what} ({why})")
    new = k8s.apply(run.api, obj)
    extra = drift.foreign_env(obj, new) if obj["kind"] == "Deployment" else None
    if extra is not None:  # env entries added by hand stay after an apply (another manager's fields): delete them
        log.info(f"{run.namespace}/{run.name}: {what}: removing env entries another manager added")
        new = k8s.patch(run.api, obj, extra)
    return new


def autoscaled_role(run: Run, obj: Manifest) -> contract.Role | None:
    """The role of an engine Deployment whose replicas an HPA owns (the builder left them out), else None."""
    if obj["kind"] != "Deployment" or "replicas" in obj["spec"] or run.cr is None:
        return None
    labels = obj["metadata"].get("labels") or {}
    if labels.get(contract.LABEL_COMPONENT) == contract.COMPONENT_PAIR:
        return "decode"  # pair pods: decode's autoscaling scales the pair Deployment
    role = labels.get(contract.LABEL_ROLE)
    return cast("contract.Role", role) if role in contract.ROLES else None


def with_initial_replicas(run: Run, obj: Manifest, role: contract.Role) -> Manifest:
    """A new autoscaling role's Deployment of the serving generation starts at scaling.start_replicas (a first
    generation: spec.<role>.replicas within its autoscaler's bounds; written once, at creation; the HPA's first scale
    takes the field over, and the operator never writes it again)."""
    assert run.cr is not None
    n = run.start.get(role, run.cr.spec.role(role).replicas)
    return {**obj, "spec": {"replicas": n, **obj["spec"]}}


def hand_off_replicas(run: Run, obj: Manifest, live: Manifest, role: contract.Role) -> None:
    """The operator owned this Deployment's replicas (the role just started to autoscale, or was created by this
    process): keep the live value under the hand-off manager before the apply that leaves the field out."""
    replicas = (live.get("spec") or {}).get("replicas")
    if not isinstance(replicas, int):
        return
    k8s.hand_off_replicas(run.api, obj, replicas)
    metrics.REPLICAS_HANDED_OFF.labels(role=role).inc()
    log.info(f"{run.namespace}/{run.name}: {role} autoscales: spec.replicas ({replicas}) handed to its autoscaler")


def unblocked(run: Run, obj: Manifest) -> Manifest:
    """`obj` without blockOwnerDeletion, to write after the apiserver refused it because it cannot resolve the
    owner's kind yet (`k8s.owner_kind_unknown`): the child exists at once and is garbage-collected with its CR all
    the same; the CR is retried with backoff until the full owner reference is taken (the apiserver's admission
    discovery refreshes every 30 s). Only foreground deletion of the CR in that window would not wait for it."""
    run.retry = (
        f"children written without blockOwnerDeletion: the apiserver cannot resolve kind {contract.KIND} yet (a CRD "
        "created moments ago; its admission discovery refreshes every 30 s)"
    )
    return drift.stamped(k8s.without_block_owner_deletion(obj))


def apply_children(run: Run) -> None:
    """Create or server-side apply each desired child this CR may own that differs from what runs. Any refusal of
    the apiserver is reported (ApplyFailed, naming the child, the code and the apiserver's message; the CR is
    retried with backoff), the rest still applied; only a lost connection ends the step. A workload whose
    ServiceAccount could not be created in this pass waits for the retry (its pods would fail "serviceaccount not
    found" and the Deployment controller would report a RolloutFailed of its own)."""
    refused: list[str] = []
    missing_accounts: set[str] = set()
    conflicts = len(run.conflicts)
    for desired in run.desired:
        k, obj = k8s.key(desired), desired
        if k in run.conflicts:
            continue
        account = pod_service_account(obj)
        if account is not None and account in missing_accounts:
            refused.append(
                f"{obj['kind']} {obj['metadata']['name']}: not applied until ServiceAccount {account} exists"
            )
            continue
        try:
            try:
                new = write_child(run, obj)
            except client.ApiException as e:
                if not k8s.owner_kind_unknown(e):
                    raise
                metrics.api_error("apply", e.status)
                metrics.OWNER_REFERENCES_DEFERRED.labels(kind=obj["kind"]).inc()
                obj = unblocked(run, obj)
                new = write_child(run, obj)
        except client.ApiException as e:
            if k8s.namespace_terminating(e):  # every create here is refused now; the CR goes with the namespace
                log.debug(f"{run.namespace}/{run.name}: namespace is being deleted, {obj['kind']} not created")
                return
            metrics.api_error("apply", e.status)
            why = blame.hint(k8s.api_message(e), obj, run.body.get("spec") or {})
            refused.append(f"{obj['kind']} {obj['metadata']['name']}: {why}")
            if obj["kind"] == "ServiceAccount" and k in run.absent:
                missing_accounts.add(str(obj["metadata"]["name"]))
            continue
        if new is None:
            continue
        run.cache.put_child(new)
        run.ctl.memory.checked[str(new["metadata"].get("uid"))] = _signature(new, obj)
        action = _action(run.ours.get(k), new)
        metrics.OBJECTS_APPLIED.labels(kind=obj["kind"], action=str(action or "unchanged").lower()).inc()
        if action is not None:
            run.actions[action].append(f"{obj['kind']} {obj['metadata']['name']}")
    if len(run.conflicts) > conflicts:
        report_conflicts(run)
    if refused:
        message = "the apiserver refused " + "; ".join(refused)
        run.failure = run.failure or Failure(Reason.APPLY_FAILED, message)
        if run.failure.reason != Reason.APPLY_FAILED:
            run.failure = Failure(run.failure.reason, f"{run.failure.message}; {message}")


def pod_service_account(obj: Mapping[str, Any]) -> str | None:
    """The ServiceAccount a workload's pods run as (a Deployment's template, a LeaderWorkerSet's leader or worker)."""
    spec = obj.get("spec") or {}
    group = spec.get("leaderWorkerTemplate") or {}
    for template in (spec.get("template"), group.get("leaderTemplate"), group.get("workerTemplate")):
        name = ((template or {}).get("spec") or {}).get("serviceAccountName")
        if name:
            return str(name)
    return None


def _action(old: Manifest | None, new: Manifest) -> Reason | None:
    if old is None:
        return Reason.CREATED
    gen_old, gen_new = old["metadata"].get("generation"), new["metadata"].get("generation")
    if gen_old is not None:
        changed = gen_old != gen_new
    else:
        changed = old["metadata"].get("resourceVersion") != new["metadata"].get("resourceVersion")
    return Reason.UPDATED if changed else None


def prune(run: Run) -> None:
    """Delete what this CR owns and no longer wants (only after a clean apply): a generation the plan no longer
    keeps (drained, or cancelled before it served) goes with the rest; a kept one stays as it is."""
    if run.failure is not None:
        return
    for obj in k8s.stale(run.ours.values(), run.desired):
        if run.plan is not None and generations.kept(obj, run.plan):
            continue
        k8s.delete(run.api, obj)
        run.cache.drop_child(obj)
        metrics.OBJECTS_PRUNED.labels(kind=obj["kind"]).inc()
        run.actions[Reason.PRUNED].append(f"{obj['kind']} {obj['metadata']['name']}")
