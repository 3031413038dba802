"""A role whose replica spans nodes: one LeaderWorkerSet per generation (leaderworkerset.x-k8s.io/v1,
sigs.k8s.io/lws), pure.

One group per replica, `size` = the nodes a replica spans (spec.<role>.gpusPerNode), every pod running vLLM's own
multi-node launch (the profile's args: `--nnodes`, `--node-rank $(LWS_WORKER_INDEX)`, `--master-addr
$(LWS_LEADER_ADDRESS)`, `--master-port`; the workers add `--headless`). LWS's pod webhook puts LWS_WORKER_INDEX and
LWS_LEADER_ADDRESS first in each container's env, so the kubelet expands them in the args.

- A generation (hpd_operator.generations) of such a role is its LeaderWorkerSet `<cr>-<role>-<gen>`, labelled and
  gated like a Deployment: the leader and worker pods carry the generation's labels, the router and the
  generation's headless Service select its leaders, and the router moves to a new generation only once every
  desired group of it is Ready; the old generation's LeaderWorkerSet is pruned after it drained.
- The leader (worker index 0) serves vLLM's API: warmup, pair check, readiness and the router's discovery are its
  (label hybridpd.io/group-role=leader). The workers run the ranks of their nodes headless; their runtime reports
  Ready while those ranks run.
- restartPolicy RecreateGroupOnPodRestart: a rank that dies breaks torch.distributed for the whole group, so any
  restart in a group recreates all of its pods.
- startupPolicy LeaderCreated: the workers start with the leader (LeaderReady would deadlock: the leader is Ready
  only after the model is loaded on every rank).
- networkConfig.subdomainPolicy UniquePerReplica: LWS makes one headless Service per group, named after its leader
  pod, for the leader's DNS name; with the default (Shared) it would take a Service named like the LeaderWorkerSet,
  which is the generation's own headless Service (`<cr>-<role>-<gen>`, Ready leaders only) and cannot resolve a
  leader that is not Ready yet.
- A generation's templates never change (a changed template is a new generation); should a group be replaced in
  place, it is one group at a time without surge (GPUs are the scarce resource), as the Deployment does.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from hpd_operator.api.models import HybridPDDeployment
from hpd_operator.api.names import group_name
from hpd_operator.builders.common import Manifest
from hpd_operator.builders.engine import generation_metadata, in_generation
from hpd_operator.generations import GROUP_KIND, Generation
from hpd_runtime import contract

LWS_API = "leaderworkerset.x-k8s.io/v1"
LWS_KIND = GROUP_KIND
RESTART_POLICY = "RecreateGroupOnPodRestart"
STARTUP_POLICY = "LeaderCreated"
SUBDOMAIN_POLICY = "UniquePerReplica"


def build_engine_group(
    cr: HybridPDDeployment, shape: Mapping[str, Any], role: contract.Role, gen: Generation
) -> Manifest:
    """The LeaderWorkerSet of `role` in generation `gen`, from the role's group shape (engine_templates)."""
    name, rs = cr.metadata.name, cr.spec.role(role)
    template: dict[str, Any] = {
        "size": shape["size"],
        "restartPolicy": RESTART_POLICY,
        "leaderTemplate": in_generation(shape["leaderTemplate"], cr, gen),
        "workerTemplate": in_generation(shape["workerTemplate"], cr, gen),
    }
    return {
        "apiVersion": LWS_API,
        "kind": LWS_KIND,
        "metadata": generation_metadata(cr, role, gen, group_name(name, role, gen.hash)),
        "spec": {
            "replicas": rs.replicas,
            "startupPolicy": STARTUP_POLICY,
            "rolloutStrategy": {
                "type": "RollingUpdate",
                "rollingUpdateConfiguration": {"maxUnavailable": 1, "maxSurge": 0},
            },
            "networkConfig": {"subdomainPolicy": SUBDOMAIN_POLICY},
            "leaderWorkerTemplate": template,
        },
    }
