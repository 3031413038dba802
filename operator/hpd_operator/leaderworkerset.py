"""I/O: whether LeaderWorkerSet is installed, for CRs whose replicas span nodes (builders/lws.py).

- At startup `handlers.setup` asks discovery whether leaderworkerset.x-k8s.io/v1 LeaderWorkerSet is served (as for
  PodMonitors) and watches LeaderWorkerSets only then.
- A CR that needs one while it is not served gets `Ready=False, reason=LeaderWorkerSetMissing` with what to install,
  and nothing is applied for it (not its one-pod role, not its router: nothing half-built; what it already had is
  left as it is). The CR is looked at again every recheck_seconds (`--recheck-seconds`) (no event announces an install).
- Each look asks discovery again, at most once per recheck_seconds for all such CRs together (one GET of
  /apis/leaderworkerset.x-k8s.io/v1). Once LeaderWorkerSet is served, the operator stops itself with exit status
  EXIT_RESTART so that its Deployment restarts it watching LeaderWorkerSets: kopf starts its watches at startup only
  (settings.py: no CRD scanning). In the meantime the CR's status says so.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from typing import Final

from kubernetes import client

from hpd_operator import apply as k8s
from hpd_operator.conditions import Failure, Reason

API_VERSION: Final = "leaderworkerset.x-k8s.io/v1"
KIND: Final = "LeaderWorkerSet"
TESTED_VERSION: Final = "v0.9.0"
"""The LWS release the operator is tested with (built from its Go module by the test harness)."""
EXIT_RESTART: Final = 3
"""`python -m hpd_operator run` exits with this after stopping itself to watch a kind installed after its start."""
MISSING: Final = (
    f"LeaderWorkerSet is not installed; install lws {TESTED_VERSION} or newer (kubernetes-sigs/lws, its release "
    "manifests or Helm chart): a role whose replica spans nodes (tensorParallelSize x pipelineParallelSize > "
    "gpusPerNode) runs as a LeaderWorkerSet. Nothing is applied for this HybridPDDeployment until then; the operator "
    "looks again every {every:g} s and restarts itself to watch LeaderWorkerSets once they are served"
)
log = logging.getLogger("hpd_operator")


class Discovery:
    """Whether LeaderWorkerSet is served, asked again at most once per `recheck_seconds` for all CRs together, and
    whether the operator stopped itself to watch it (one per operator process: handlers.Controller owns it)."""

    def __init__(self, recheck_seconds: float) -> None:
        self.recheck_seconds = recheck_seconds
        self._lock = threading.Lock()
        self._checked = float("-inf")
        self._served = False
        self._restarting = False

    def served_now(self, api: client.ApiClient) -> bool:
        """Discovery again, at most once per recheck_seconds (all CRs share the answer)."""
        with self._lock:
            if self._served or time.monotonic() - self._checked < self.recheck_seconds:
                return self._served
            self._checked = time.monotonic()
        served = k8s.api_available(api, API_VERSION, KIND)
        with self._lock:
            self._served = served
        return served

    def missing(self, api: client.ApiClient) -> Failure:
        """The failure of a CR that needs a LeaderWorkerSet the operator does not watch; stops the operator (once)
        when LeaderWorkerSet turns out to be served now."""
        if not self.served_now(api):
            return Failure(Reason.LWS_MISSING, MISSING.format(every=self.recheck_seconds))
        self.restart("LeaderWorkerSet (leaderworkerset.x-k8s.io/v1) is served now")
        return Failure(
            Reason.LWS_MISSING,
            "LeaderWorkerSet is installed now; the operator restarts to watch LeaderWorkerSets, then builds this "
            "HybridPDDeployment",
        )

    def restart(self, why: str) -> None:
        """Stop the operator gracefully (kopf handles SIGTERM); `python -m hpd_operator run` then exits
        EXIT_RESTART."""
        with self._lock:
            if self._restarting:
                return
            self._restarting = True
        log.warning(f"{why}: stopping, to be restarted watching it (exit status {EXIT_RESTART})")
        os.kill(os.getpid(), signal.SIGTERM)

    @property
    def restart_requested(self) -> bool:
        return self._restarting
