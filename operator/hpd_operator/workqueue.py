"""A work queue in the style of client-go's (k8s.io/client-go/util/workqueue), for the reconcile workers' threads.

- A key is queued at most once: adding a key that waits already does nothing (triggers coalesce).
- A key being processed is never handed to a second worker; added meanwhile, it is queued again when `done`.
- `add_after` delays an add (retries with backoff, a requeue while something is still settling); one timer thread.
- `add_rate_limited` backs off per key (base * 2^failures, capped); `forget` resets a key's count after a success.
- Metrics under controller-runtime's names: workqueue_depth, workqueue_adds_total,
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
        self._waiting: list[tuple[float, int, K]] = []
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
            self._seq += 1
            heapq.heappush(self._waiting, (time.monotonic() + delay, self._seq, key))
            self._cond.notify_all()

    def add_rate_limited(self, key: K) -> float:
        """Add after this key's backoff; returns the delay."""
        with self._cond:
            n = self._failures.get(key, 0)
            self._failures[key] = n + 1
        delay = float(min(self.base_delay * 2.0**n, self.max_delay))
        self.add_after(key, delay)
        return delay

    def forget(self, key: K) -> None:
        with self._cond:
            self._failures.pop(key, None)

    def _delayer(self) -> None:
        with self._cond:
            while not self._shutdown:
                now = time.monotonic()
                due: list[K] = []
                while self._waiting and self._waiting[0][0] <= now:
                    due.append(heapq.heappop(self._waiting)[2])
                if due:
                    self._cond.release()
                    try:
                        for key in due:
                            self.add(key)
                    finally:
                        self._cond.acquire()
                    continue
                timeout = self._waiting[0][0] - now if self._waiting else None
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
