"""A role whose replica spans nodes: a LeaderWorkerSet (leaderworkerset.x-k8s.io/v1, sigs.k8s.io/lws), pure.

One group per replica, `size` = the nodes a replica spans (spec.<role>.gpusPerNode), every pod running vLLM's own
multi-node launch (the profile's args: `--nnodes`, `--node-rank $(LWS_WORKER_INDEX)`, `--master-addr
$(LWS_LEADER_ADDRESS)`, `--master-port`; the workers add `--headless`). LWS's pod webhook puts LWS_WORKER_INDEX and
LWS_LEADER_ADDRESS first in each container's env, so the kubelet expands them in the args.

- The leader (worker index 0) serves vLLM's API: warmup, pair check, readiness and the router's discovery are its
  (label hybridpd.io/group-role=leader; the router and the role's headless Service select it). The workers run the
  ranks of their nodes headless; their runtime reports Ready while those ranks run.
- restartPolicy RecreateGroupOnPodRestart: a rank that dies breaks torch.distributed for the whole group, so any
  restart in a group recreates all of its pods.
- startupPolicy LeaderCreated: the workers start with the leader (LeaderReady would deadlock: the leader is Ready
  only after the model is loaded on every rank).
- networkConfig.subdomainPolicy UniquePerReplica: LWS makes one headless Service per group, named after its leader
  pod, for the leader's DNS name; with the default (Shared) it would take a Service named like the LeaderWorkerSet,
  which is the role's own headless Service (`<cr>-<role>`, Ready leaders only) and cannot resolve a leader that is
  not Ready yet.
- Rolling updates replace one group at a time and never surge (GPUs are the scarce resource), as the Deployment does.
"""

from __future__ import annotations

from typing import Any

from hpd_operator.api.models import HybridPDDeployment
from hpd_operator.api.names import group_name
from hpd_operator.builders.common import Manifest, metadata
from hpd_operator.builders.engine import engine_pod_template
from hpd_operator.profile import Profile
from hpd_runtime import contract

LWS_API = "leaderworkerset.x-k8s.io/v1"
LWS_KIND = "LeaderWorkerSet"
RESTART_POLICY = "RecreateGroupOnPodRestart"
STARTUP_POLICY = "LeaderCreated"
SUBDOMAIN_POLICY = "UniquePerReplica"


def build_engine_group(cr: HybridPDDeployment, profile: Profile, role: contract.Role) -> Manifest:
    name, ns, rs, rp = cr.metadata.name, cr.metadata.namespace, cr.spec.role(role), profile.role(role)
    template: dict[str, Any] = {
        "size": rp.nodes,
        "restartPolicy": RESTART_POLICY,
        "leaderTemplate": engine_pod_template(cr, profile, role, contract.GROUP_LEADER),
        "workerTemplate": engine_pod_template(cr, profile, role, contract.GROUP_WORKER),
    }
    return {
        "apiVersion": LWS_API,
        "kind": LWS_KIND,
        "metadata": metadata(name, ns, group_name(name, role), role),
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
