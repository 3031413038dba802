"""A work queue in the style of client-go's (k8s.io/client-go/util/workqueue), for the reconcile workers' threads.

- A key is queued at most once: adding a key that waits already does nothing (triggers coalesce).
- A key being processed is never handed to a second worker; added meanwhile, it is queued again when `done`.
- `add_after` delays an add (a retry with backoff, a requeue while something is still settling). As client-go's
  delaying queue: ONE waiting entry per key, the earliest time wins (a later `add_after` of a key that already waits
  for an earlier time changes nothing; an earlier one moves it forward). One timer thread.
- `add_rate_limited` backs off per key (base * 2^failures, capped: client-go's ItemExponentialFailureRateLimiter),
  counting a retry (`workqueue_retries_total`); `forget` resets a key's count after a success.
- Metrics under controller-runtime's names: workqueue_depth, workqueue_adds_total, workqueue_retries_total,
  workqueue_queue_duration_seconds, workqueue_work_duration_seconds (label `name`).
"""

from __future__ import annotations

import heapq
import threading
import time
from collections import deque
from collections.abc import Hashable
from typing import Generic, TypeVar

from hpd_operator import metrics

K = TypeVar("K", bound=Hashable)


class ShutDown(Exception):
    """The queue was shut down: the worker should return."""


class WorkQueue(Generic[K]):
    def __init__(self, name: str, *, base_delay: float = 0.5, max_delay: float = 60.0) -> None:
        self.name = name
        self.base_delay, self.max_delay = base_delay, max_delay
        self._cond = threading.Condition()
        self._queue: deque[K] = deque()
        self._dirty: set[K] = set()
        self._processing: set[K] = set()
        self._added_at: dict[K, float] = {}
        self._started_at: dict[K, float] = {}
        self._failures: dict[K, int] = {}
        self._due: dict[K, float] = {}
        """The one waiting entry per key: when it is due (monotonic)."""
        self._heap: list[tuple[float, int, K]] = []
        """(due, seq, key); an entry whose due time is no longer `_due[key]` is stale and skipped."""
        self._seq = 0
        self._shutdown = False
        self._timer = threading.Thread(target=self._delayer, name=f"{name}-delayer", daemon=True)
        self._timer.start()

    # --- adding --------------------------------------------------------------------------------------------------
    def add(self, key: K) -> None:
        with self._cond:
            if self._shutdown or key in self._dirty:
                return
            metrics.WORKQUEUE_ADDS.labels(self.name).inc()
            self._dirty.add(key)
            self._added_at.setdefault(key, time.monotonic())
            if key not in self._processing:
                self._queue.append(key)
                metrics.WORKQUEUE_DEPTH.labels(self.name).set(len(self._queue))
                self._cond.notify_all()

    def add_after(self, key: K, delay: float) -> None:
        if delay <= 0:
            self.add(key)
            return
        with self._cond:
            if self._shutdown:
                return
            due = time.monotonic() + delay
            if self._due.get(key, float("inf")) <= due:
                return  # already waiting for an earlier time
            self._due[key] = due
            self._seq += 1
            heapq.heappush(self._heap, (due, self._seq, key))
            self._cond.notify_all()

    def add_rate_limited(self, key: K, max_delay: float | None = None) -> float:
        """Add after this key's backoff (capped at `max_delay`, default the queue's); returns the delay."""
        with self._cond:
            n = self._failures.get(key, 0)
            self._failures[key] = n + 1
        metrics.WORKQUEUE_RETRIES.labels(self.name).inc()
        cap = self.max_delay if max_delay is None else min(max_delay, self.max_delay)
        delay = float(min(self.base_delay * 2.0 ** min(n, 62), cap))
        self.add_after(key, delay)
        return delay

    def forget(self, key: K) -> None:
        with self._cond:
            self._failures.pop(key, None)

    def failures(self, key: K) -> int:
        """How often `key` was added rate-limited since it was last forgotten."""
        with self._cond:
            return self._failures.get(key, 0)

    def waiting(self, key: K) -> float | None:
        """Seconds until `key`'s waiting entry is due (None: none waits)."""
        with self._cond:
            due = self._due.get(key)
        return None if due is None else max(due - time.monotonic(), 0.0)

    def _pop_due(self, now: float) -> list[K]:
        due: list[K] = []
        while self._heap and self._heap[0][0] <= now:
            at, _, key = heapq.heappop(self._heap)
            if self._due.get(key) == at:  # not a stale entry left by an earlier-time add_after
                del self._due[key]
                due.append(key)
        return due

    def _delayer(self) -> None:
        with self._cond:
            while not self._shutdown:
                due = self._pop_due(time.monotonic())
                if due:
                    self._cond.release()
                    try:
                        for key in due:
                            self.add(key)
                    finally:
                        self._cond.acquire()
                    continue
                timeout = self._heap[0][0] - time.monotonic() if self._heap else None
                self._cond.wait(timeout)

    # --- working -------------------------------------------------------------------------------------------------
    def get(self) -> K:
        """Block until a key is ready; raises ShutDown once the queue is shut down."""
        with self._cond:
            while not self._queue and not self._shutdown:
                self._cond.wait()
            if self._shutdown:
                raise ShutDown
            key = self._queue.popleft()
            metrics.WORKQUEUE_DEPTH.labels(self.name).set(len(self._queue))
            self._processing.add(key)
            self._dirty.discard(key)
            now = time.monotonic()
            added = self._added_at.pop(key, now)
            metrics.WORKQUEUE_QUEUE_DURATION.labels(self.name).observe(now - added)
            self._started_at[key] = now
            return key

    def done(self, key: K) -> None:
        with self._cond:
            self._processing.discard(key)
            started = self._started_at.pop(key, None)
            if started is not None:
                metrics.WORKQUEUE_WORK_DURATION.labels(self.name).observe(time.monotonic() - started)
            if key in self._dirty:
                self._queue.append(key)
                metrics.WORKQUEUE_DEPTH.labels(self.name).set(len(self._queue))
                self._cond.notify_all()

    def shutdown(self) -> None:
        with self._cond:
            self._shutdown = True
            self._cond.notify_all()

    def __len__(self) -> int:
        with self._cond:
            return len(self._queue)

    def idle(self) -> bool:
        """Nothing queued, nothing in flight (delayed adds not counted)."""
        with self._cond:
            return not self._queue and not self._processing
