"""The reconcile workers (threads: the kubernetes client is synchronous) and the safety resync: each worker takes a
CR key from the work queue, converges it (hpd_operator.reconcile) and schedules its retry with backoff; one CR's
failure never stops a worker."""

from __future__ import annotations

import asyncio
import logging
import threading

import kopf
from kubernetes import client

from hpd_operator import apply as k8s
from hpd_operator import metrics
from hpd_operator.cache import Cache, CRKey
from hpd_operator.conditions import Reason
from hpd_operator.context import Run
from hpd_operator.controller import Controller
from hpd_operator.reconcile import reconcile_key
from hpd_operator.settings import OperatorConfig
from hpd_operator.workqueue import ShutDown, WorkQueue

log = logging.getLogger("hpd_operator")


def describe(e: BaseException) -> tuple[str, str]:
    """(code, text) of a failure for the log and the api_errors metric: the apiserver's code and message when an API
    call failed (also behind a TransientError), else the exception itself."""
    for err in (e, e.__cause__):
        if isinstance(err, client.ApiException):
            return str(err.status), k8s.api_message(err)
    return type(e).__name__, str(e) or repr(e)


def schedule(queue: WorkQueue[CRKey], key: CRKey, run: Run | None, cfg: OperatorConfig) -> None:
    """After a reconcile: forget the key's backoff when the CR converged; otherwise retry it with backoff, whatever
    the failure (controller-runtime requeues every error): RBAC gets fixed, a quota raised, a namespace or a CRD's
    discovery appears, a name is freed, a spec edited. Spec-bound failures back off to the cap like the rest; a name
    held by another object is looked at again at least every settings.recheck_seconds (no event announces its
    deletion). Retries write no status and post no Event unless the failure's message changed."""
    why = None if run is None else (run.failure.message if run.failure is not None else run.retry)
    if run is None or why is None:
        queue.forget(key)
        if run is not None and run.requeue_after is not None:
            queue.add_after(key, run.requeue_after)
        return
    # no event announces what these wait for: the deletion of an object without our label, LWS being installed
    recheck = run.failure is not None and run.failure.reason in (Reason.OWNERSHIP_CONFLICT, Reason.LWS_MISSING)
    first = queue.failures(key) == 0
    delay = queue.add_rate_limited(key, cfg.recheck_seconds if recheck else None)
    (log.info if first else log.debug)(f"{key[0]}/{key[1]}: not converged, retrying in {delay:.1f} s: {why}")


def worker(ctl: Controller) -> None:
    """Take keys until the queue shuts down; one CR's failure never stops the worker."""
    queue = ctl.queue
    while True:
        try:
            key = queue.get()
        except ShutDown:
            return
        try:
            run = reconcile_key(ctl, key)
        except Exception as e:  # transient API trouble or a refused status write: back off and retry this key
            delay = queue.add_rate_limited(key)
            code, text = describe(e)
            metrics.api_error("reconcile", code)
            log.warning(f"reconcile {key[0]}/{key[1]} failed ({text}); retrying in {delay:.1f} s")
        else:
            schedule(queue, key, run, ctl.cfg)
        finally:
            queue.done(key)


def resync_once(cache: Cache, queue: WorkQueue[CRKey]) -> int:
    """Queue every cached CR (drift correction and fresh status without a list call); returns how many."""
    keys = cache.cr_keys()
    for key in keys:
        queue.add(key)
    for what, n in cache.sizes().items():
        metrics.OBSERVED_OBJECTS.labels(what).set(n)
    return len(keys)


async def resync_loop(ctl: Controller) -> None:
    """Queue every cached CR every settings.resync_seconds (an asyncio task, not a kopf timer: see handlers.py)."""
    while True:
        await asyncio.sleep(ctl.cfg.resync_seconds)
        resync_once(ctl.cache, ctl.queue)


def start(ctl: Controller) -> None:
    """The reconcile workers and the safety resync. Kept on the Controller, not in kopf's memo: kopf copies the memo
    into its memory of every watched object."""
    ctl.workers = [
        threading.Thread(target=worker, args=(ctl,), name=f"reconcile-{i}", daemon=True) for i in range(ctl.cfg.workers)
    ]
    for t in ctl.workers:
        t.start()
    ctl.resync_task = asyncio.create_task(resync_loop(ctl))


def workers_alive(workers: list[threading.Thread]) -> int:
    """What liveness (/healthz) means: this process can still converge CRs. kopf answers /healthz from its own event
    loop; this probe adds the reconcile threads (a dead worker thread would leave CRs unconverged while the loop looks
    healthy), and /healthz answers 500 when one died, so the kubelet restarts the operator. The apiserver's
    reachability is NOT part of it: a restart cannot bring an apiserver back, and every operator of a cluster
    restarting through a control-plane outage would only add load when it returns (the watches and the backoff
    resume on their own: tests/cluster/test_reliability.py)."""
    dead = [t.name for t in workers if not t.is_alive()]
    if dead:
        raise kopf.PermanentError(f"reconcile worker thread(s) exited: {', '.join(dead)}")
    return len(workers)


def stop(ctl: Controller) -> None:
    if ctl.resync_task is not None:
        ctl.resync_task.cancel()
    ctl.queue.shutdown()
