"""The operator's state, in one object created once by `run` (handlers.setup): the API client, what the apiserver
serves, the settings, the watch cache, the work queue and what this process remembers between reconciles. Nothing
else in the package keeps state between calls (tests/unit/test_module_state.py checks that no module holds any)."""

from __future__ import annotations

import asyncio
import threading
from dataclasses import dataclass, field
from typing import Any

from kubernetes import client, config
from kubernetes.client import rest

from hpd_operator import metrics
from hpd_operator.cache import Cache, CRKey
from hpd_operator.leaderworkerset import Discovery
from hpd_operator.settings import OperatorConfig
from hpd_operator.workqueue import WorkQueue


@dataclass(frozen=True)
class Capabilities:
    """What the apiserver serves and the operator may watch, decided once at startup."""

    podmonitors: bool
    nodes: bool
    lws: bool = False
    """LeaderWorkerSet is served: roles whose replicas span nodes can be built (leaderworkerset.py: re-checked while
    missing)."""


class CountingRESTClient(rest.RESTClientObject):
    """The kubernetes client's REST client, counting every request it sends (metrics.API_REQUESTS, by verb)."""

    def request(self, method: str, url: str, *args: Any, **kwargs: Any) -> Any:
        metrics.API_REQUESTS.labels(method.upper()).inc()
        return super().request(method, url, *args, **kwargs)  # type: ignore[no-untyped-call]


class CountingApiClient(client.ApiClient):
    """An ApiClient whose requests are counted (CountingRESTClient); kopf watches with its own client."""

    def __init__(self, configuration: client.Configuration) -> None:
        super().__init__(configuration)
        self.rest_client = CountingRESTClient(configuration)


def new_client() -> client.ApiClient:
    """One kubernetes ApiClient for our own calls (in-cluster config, else the kubeconfig), counting its requests."""
    cfg = client.Configuration()
    try:
        config.load_incluster_config(client_configuration=cfg)  # type: ignore[no-untyped-call]
    except config.ConfigException:
        config.load_kube_config(client_configuration=cfg)  # type: ignore[no-untyped-call]
    return CountingApiClient(cfg)


@dataclass
class Memory:
    """What this process remembers between reconciles (none of it is needed after a restart: it only saves work)."""

    seen: dict[CRKey, tuple[str, object, bool]] = field(default_factory=dict)
    """CR key -> (uid, generation, being deleted) of the last event that queued it (controller-runtime's
    GenerationChangedPredicate): a status write (the operator's own, every reconcile that changes something) or a
    label/annotation edit changes none of these, and the operator uses none of them, so such events queue nothing."""
    checked: dict[str, tuple[str | None, int | None]] = field(default_factory=dict)
    """Child uid -> (another manager's newest write time, generation) as last verified or applied by this process:
    the drift test reads the child back only when that signature moves (drift.py)."""
    reported: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    """CR uid -> the conditions this process last wrote."""
    reported_rollout: dict[str, dict[str, Any]] = field(default_factory=dict)
    """CR uid -> the status.rollout this process last wrote (one Event per rollout transition)."""
    status_refused: dict[str, str] = field(default_factory=dict)
    """CR uid -> why the apiserver refused its last status write (one Warning Event per distinct reason)."""

    def forget(self, key: CRKey, uid: str) -> None:
        self.reported.pop(uid, None)
        self.reported_rollout.pop(uid, None)
        self.status_refused.pop(uid, None)
        self.seen.pop(key, None)


class Controller:
    """The one owner of the operator's state; the kopf handlers, the workers and each reconcile reach it."""

    def __init__(self, api: client.ApiClient, caps: Capabilities, cfg: OperatorConfig) -> None:
        self.api, self.caps, self.cfg = api, caps, cfg
        self.cache = Cache()
        self.queue: WorkQueue[CRKey] = WorkQueue(metrics.CONTROLLER, max_delay=cfg.max_backoff_seconds)
        self.memory = Memory()
        self.lws = Discovery(cfg.recheck_seconds)
        self.workers: list[threading.Thread] = []
        self.resync_task: asyncio.Task[None] | None = None

    def forget(self, key: CRKey, uid: str) -> None:
        """A CR is gone: drop its metrics and what this process remembers of it (children go by garbage
        collection)."""
        metrics.forget(*key)
        self.memory.forget(key, uid)
        self.queue.forget(key)
