"""Objects the CRD must reject, with the message the apiserver gives (for the cluster tests).

Each case: (id, spec, substring of the apiserver's error); the id is the rule's id in hpd_operator.api.rules where
the case exercises a rule-table row. tests/cluster/test_crd_cel.py applies every case to the real apiserver
(server-side dry run) and tests/crd/test_crd_in_sync.py runs them through the operator's own checks.
Usage: `for id, spec, msg in BAD_SPECS: apply {"apiVersion": ..., "kind": ..., "metadata": ..., "spec": spec}`.
"""

from __future__ import annotations

from typing import Any

from hpd_operator.api.rules import (
    FORBIDDEN_CONTAINER_FIELDS,
    FORBIDDEN_POD_FIELDS,
    FORBIDDEN_PROJECTION_FIELDS,
    FORBIDDEN_VOLUME_FIELDS,
)

M = {"name": "nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-FP8"}
PAIR: dict[str, Any] = {"kvTransfer": {"processNamespace": "Pair"}}

BAD_SPECS: list[tuple[str, dict[str, Any], str]] = [
    (
        "tp-divides",
        {"model": M, "prefill": {"tensorParallelSize": 3}, "decode": {"tensorParallelSize": 2}},
        "must divide one another",
    ),
    ("replicas-non-negative", {"model": M, "decode": {"replicas": -1}}, "replicas must be >= 0"),
    (
        "replica-fills-whole-nodes",
        {"model": M, "decode": {"tensorParallelSize": 12, "gpusPerNode": 8}},
        "must fit one node (at most gpusPerNode) or fill whole nodes",
    ),
    (
        "decode-not-pipeline-parallel",
        {"model": {"name": "x/y", "hybrid": "none"}, "decode": {"tensorParallelSize": 8, "pipelineParallelSize": 2}},
        "spec.decode.pipelineParallelSize must be 1",
    ),
    ("model-name-non-empty", {"model": {"name": "   "}}, "spec.model.name must be a non-empty model id"),
    (
        "extra-args-owned-flag",
        {"model": M, "decode": {"extraArgs": ["--block_size=64"]}},
        "extraArgs may not contain flags the operator owns",
    ),
    (
        "extra-args-kv-transfer",
        {"model": M, "extraArgs": ["--kv-transfer-config.kv_role", "kv_both"]},
        "extraArgs may not contain flags the operator owns",
    ),
    ("block-size-multiple-of-16", {"model": M, "blockSize": 40}, "spec.blockSize must be a multiple of 16"),
    ("operator-owned-env", {"model": M, "env": [{"name": "HPD_ROLE", "value": "x"}]}, "spec.env may not set env"),
    (  # 64 values of 24 KB: a 1.57 MB CR etcd stored, but whose every status write it refused (#32)
        "env-size",
        {"model": M, "env": [{"name": f"E{i}", "value": "x" * 24_000} for i in range(64)]},
        "spec.env values may total at most 256 KiB",
    ),
    ("rdma-fabric-needs-devices", {"model": M, "kvTransfer": {"fabric": "rdma"}}, "kvTransfer.rdma (the RDMA"),
    (
        "rdma-devices-need-rdma-fabric",
        {"model": M, "kvTransfer": {"rdma": {"resourceName": "rdma/ib"}}},
        "kvTransfer.rdma is set but kvTransfer.fabric is not rdma",
    ),
    (
        "ucx-tls-active-messages",
        {"model": M, "kvTransfer": {"ucx": {"tls": "cuda_copy,cuda_ipc"}}},
        "needs a transport UCX can send active messages on",
    ),
    (
        "ucx-tls-rdma-transport",
        {"model": M, "kvTransfer": {"fabric": "rdma", "rdma": {"resourceName": "rdma/ib"}, "ucx": {"tls": "tcp,cuda_copy"}}},
        "leaves out every InfiniBand/RoCE transport",
    ),
    (
        "host-pid-namespace-needs-cuda-ipc",
        {"model": M, "kvTransfer": {"processNamespace": "Host", "ucx": {"tls": "tcp,cuda_copy"}}},
        "kvTransfer.processNamespace Host shares the node's PID namespace only so that UCX can use cuda_ipc",
    ),
    (
        "pair-pod-needs-cuda-ipc",
        {"model": M, "kvTransfer": {"processNamespace": "Pair", "ucx": {"tls": "tcp,cuda_copy"}}},
        "kvTransfer.processNamespace Pair shares one PID namespace between prefill and decode only so that UCX",
    ),
    (
        "pair-ports-free",
        {"model": M, "kvTransfer": {"processNamespace": "Pair", "sideChannelPort": 8150}},
        "kvTransfer.sideChannelPort collides in a pair pod",
    ),
    (
        "pair-replicas-equal",
        {"model": M, **PAIR, "prefill": {"replicas": 2}, "decode": {"replicas": 3}},
        "spec.decode.replicas must equal spec.prefill.replicas",
    ),
    (
        "pair-prefill-not-autoscaling",
        {"model": M, **PAIR, "prefill": {"replicas": 2, "autoscaling": {"minReplicas": 1, "maxReplicas": 4}},
         "decode": {"replicas": 2}},
        "spec.prefill.autoscaling is not allowed",
    ),
    (
        "pair-prefill-one-node",
        {"model": M, **PAIR, "prefill": {"tensorParallelSize": 16, "gpusPerNode": 8}, "decode": {"tensorParallelSize": 8}},
        "spec.prefill.tensorParallelSize x pipelineParallelSize must fit one node",
    ),
    (
        "pair-decode-one-node",
        {"model": M, **PAIR, "prefill": {"tensorParallelSize": 16}, "decode": {"tensorParallelSize": 16, "gpusPerNode": 8}},
        "spec.decode.tensorParallelSize x pipelineParallelSize must fit one node",
    ),
    ("cache-pvc-needs-claim", {"model": M, "cache": {"type": "pvc"}}, "cache.claimName is required"),
    (
        "one-model-source",
        {"model": {**M, "source": {"pvc": {"claimName": "a", "path": "b"}, "huggingface": {"repo": "x"}}}},
        "set only one of",
    ),
    ("unknown-field", {"model": M, "bogus": 1}, 'unknown field "spec.bogus"'),
    (
        "vllm-version-outside-table",
        {"model": M, "vllmVersion": "0.19.0"},
        "spec.vllmVersion must be a vLLM release from 0.20 to 0.33",
    ),
    ("side-channel-port-free", {"model": M, "kvTransfer": {"sideChannelPort": 8000}}, "may not be 8000"),
    ("side-channel-port-free", {"model": M, "kvTransfer": {"sideChannelPort": 8081}}, "may not be 8000"),
    (
        "warmup-prompt-shorter-than-max-model-len",
        {"model": {**M, "maxModelLen": 1024}, "warmup": {"promptLengths": [512, 4096]}},
        "must be shorter than spec.model.maxModelLen",
    ),
    ("quantity", {"model": M, "decode": {"resources": {"limits": {"cpu": "abc"}}}}, "limits.cpu in body should match"),
    ("quantity-negative", {"model": M, "prefill": {"resources": {"requests": {"memory": "-1Gi"}}}}, "should match"),
    ("gpu-memory-utilization-min", {"model": M, "gpuMemoryUtilization": 0.0001}, "greater than or equal to 0.05"),
    ("max-model-len-max", {"model": {**M, "maxModelLen": 16777216}}, "less than or equal to 1048576"),
    ("pod-template-labels-type", {"model": M, "decode": {"podTemplate": {"metadata": {"labels": "oops"}}}},
     "labels in body must be of type object"),
    ("pod-template-container-is-vllm", {"model": M, "decode": {"podTemplate": {"spec": {"containers": [{"name": "x"}]}}}},
     "may only name the `vllm` container"),
    ("toleration-operator", {"model": M, "decode": {"tolerations": [{"key": "a", "operator": "Sometimes"}]}},
     "Unsupported value"),
    ("affinity-unknown", {"model": M, "decode": {"affinity": {"nodeAfinity": {}}}}, "unknown field"),
    # autoscaling (docs/autoscaling.md)
    ("autoscaling-min-not-above-max", {"model": M, "decode": {"replicas": 3, "autoscaling": {"minReplicas": 3,
     "maxReplicas": 2}}}, "autoscaling.minReplicas must be <= autoscaling.maxReplicas"),
    ("autoscaling-replicas-in-range", {"model": M, "decode": {"replicas": 9, "autoscaling": {"maxReplicas": 4}}},
     "replicas must lie within autoscaling.minReplicas..maxReplicas"),
    ("autoscaling-single-node-only", {"model": M, "decode": {"tensorParallelSize": 16, "autoscaling": {"maxReplicas": 4}}},
     "autoscaling is not supported on a role whose replica spans nodes"),
    ("autoscaling-signals-unique", {"model": M, "decode": {"autoscaling": {"maxReplicas": 4, "metrics": [
     {"signal": "kvCacheUsage", "target": 0.7}, {"signal": "kvCacheUsage", "target": 0.5}]}}},
     "autoscaling.metrics may name each signal once"),
    ("kv-cache-usage-target-fraction", {"model": M, "decode": {"autoscaling": {"maxReplicas": 4, "metrics": [
     {"signal": "kvCacheUsage", "target": 70}]}}}, "the kvCacheUsage target is a fraction"),
    ("autoscaling-signal-unknown", {"model": M, "prefill": {"autoscaling": {"maxReplicas": 4, "metrics": [
     {"signal": "gpuUtilization", "target": 1}]}}}, "Unsupported value"),
    ("autoscaling-max-required", {"model": M, "prefill": {"autoscaling": {"minReplicas": 1}}},
     "maxReplicas: Required value"),
    ("ratio-needs-autoscaling", {"model": M, "ratio": {"maxDecodePerPrefill": 4}},
     "spec.ratio bounds decode replicas per prefill replica while both roles autoscale"),
    ("ratio-has-a-bound", {"model": M, "prefill": {"autoscaling": {"maxReplicas": 2}},
     "decode": {"autoscaling": {"maxReplicas": 4}}, "ratio": {}}, "ratio needs minDecodePerPrefill"),
    ("ratio-min-not-above-max", {"model": M, "prefill": {"autoscaling": {"maxReplicas": 2}},
     "decode": {"autoscaling": {"maxReplicas": 4}}, "ratio": {"minDecodePerPrefill": 3, "maxDecodePerPrefill": 2}},
     "ratio.minDecodePerPrefill must be <= ratio.maxDecodePerPrefill"),
    ("ratio-reachable", {"model": M, "prefill": {"replicas": 4, "autoscaling": {"minReplicas": 4, "maxReplicas": 8}},
     "decode": {"autoscaling": {"maxReplicas": 3}}, "ratio": {"minDecodePerPrefill": 1}},
     "spec.ratio cannot be met within the autoscaling ranges"),
    ("ratio-room-to-grow", {"model": M, "prefill": {"autoscaling": {"maxReplicas": 4}},
     "decode": {"autoscaling": {"maxReplicas": 8}}, "ratio": {"minDecodePerPrefill": 1, "maxDecodePerPrefill": 1.5}},
     "spec.ratio.maxDecodePerPrefill is too close to minDecodePerPrefill"),
]  # fmt: skip

AUTOSCALING = {"model": M, "decode": {"replicas": 2, "autoscaling": {"minReplicas": 1, "maxReplicas": 4}}}
BAD_UPDATES: list[tuple[str, dict[str, Any], dict[str, Any], str]] = [
    # (rule id, spec as created, spec as updated, message): transition rules (CEL oldSelf) hold on updates only,
    # e.g. `kubectl scale hpd` (the scale subresource writes spec.decode.replicas) on an autoscaling decode.
    ("autoscaling-replicas-not-pinned", AUTOSCALING, {**AUTOSCALING, "decode": {**AUTOSCALING["decode"], "replicas": 3}},
     "replicas cannot be changed while autoscaling is set"),
]  # fmt: skip

_SAMPLE: dict[str, Any] = {"bool": True, "str": "x", "obj": {}, "list": [{}], "strlist": ["x"], "map": {"a": "b"}}
_KIND = {
    **dict.fromkeys(["hostNetwork", "hostPID", "hostIPC", "hostUsers", "automountServiceAccountToken",
                     "shareProcessNamespace"], "bool"),
    **dict.fromkeys(["serviceAccountName", "serviceAccount", "nodeName", "image", "workingDir"], "str"),
    **dict.fromkeys(["initContainers", "ephemeralContainers", "tolerations", "ports", "env", "envFrom"], "list"),
    **dict.fromkeys(["command", "args"], "strlist"),
    "nodeSelector": "map",
}  # fmt: skip


def _refused(where: str, name: str) -> dict[str, Any]:
    value = _SAMPLE[_KIND.get(name, "obj")]
    pod: dict[str, Any]
    if where == "pod":
        pod = {name: value}
    elif where == "container":
        pod = {"containers": [{"name": "vllm", name: value}]}
    elif where == "projection":
        pod = {"volumes": [{"name": "v", "projected": {"sources": [{"configMap": {"name": "c"}}, {name: value}]}}]}
    else:
        pod = {"volumes": [{"name": "v", name: value}]}
    return {"model": M, "prefill": {"podTemplate": {"spec": pod}}}


BAD_SPECS += [
    (f"podTemplate.spec-{n}-not-allowed", _refused("pod", n), f"podTemplate.spec.{n} may not be set")
    for n in FORBIDDEN_POD_FIELDS
]
BAD_SPECS += [
    (f"podTemplate.spec.containers[]-{n}-not-allowed", _refused("container", n), f"containers[].{n} may not be set")
    for n in FORBIDDEN_CONTAINER_FIELDS
]
BAD_SPECS += [
    (f"podTemplate.spec.volumes[]-{n}-not-allowed", _refused("volume", n), f"volumes[].{n} may not be set")
    for n in FORBIDDEN_VOLUME_FIELDS
]

BAD_SPECS += [
    (
        f"podTemplate.spec.volumes[].projected.sources[]-{n}-not-allowed",
        _refused("projection", n),
        f"sources[].{n} may not be set",
    )
    for n in FORBIDDEN_PROJECTION_FIELDS
]
_TOKEN = {"serviceAccountToken": {"path": "token", "expirationSeconds": 3600}}
BAD_SPECS += [
    (
        "podTemplate.spec.volumes[].projected.sources[]-serviceAccountToken-not-allowed",
        {"model": M, "decode": {"podTemplate": {"spec": {"volumes": [{"name": "t", "projected": {"sources": [_TOKEN]}}]}}}},
        "engine pods get no ServiceAccount token",
    ),
    *[
        (
            "pod-template-no-security-annotations",
            {"model": M, "decode": {"podTemplate": {"metadata": {"annotations": {"team": "a", key: value}}}}},
            "may not choose a security profile",
        )
        for key, value in (
            ("container.apparmor.security.beta.kubernetes.io/vllm", "unconfined"),
            ("seccomp.security.alpha.kubernetes.io/pod", "unconfined"),
            ("container.seccomp.security.alpha.kubernetes.io/vllm", "unconfined"),
        )
    ],
    *[
        (
            "pod-template-no-system-priority",
            {"model": M, "prefill": {"podTemplate": {"spec": {"priorityClassName": name}}}},
            "may not name a `system-*` PriorityClass",
        )
        for name in ("system-node-critical", "system-cluster-critical", "system-anything")
    ],
]  # fmt: skip

BAD_NAMES: list[tuple[str, str, str]] = [
    ("name-dns-1035", "a.b", "must be a DNS-1035 label"),
    ("name-dns-1035", "1a", "must be a DNS-1035 label"),
    ("name-dns-1035", "a" * 56, "must be a DNS-1035 label"),
    ("name-no-child-suffix", "a-prefill", "may not end in -prefill"),
    ("name-no-child-suffix", "a-router", "may not end in -prefill"),
    ("name-no-generation-suffix", "a-prefill-1a2b3c4d", "may not end in -prefill-<8 hex digits>"),
]
"""(rule id, metadata.name, substring of the apiserver's error)."""

GOOD_SPECS: list[tuple[str, dict[str, Any]]] = [
    (  # a decode replica over two 8-GPU nodes, a prefill of two pipeline stages (attention-only, vLLM 0.27+)
        "multi-node",
        {
            "model": {"name": "x/y", "hybrid": "none"},
            "vllmVersion": "0.27.1",
            "prefill": {"tensorParallelSize": 4, "pipelineParallelSize": 2},
            "decode": {"tensorParallelSize": 16, "gpusPerNode": 8},
        },
    ),
    ("extra-args-allowed", {"model": M, "extraArgs": ["--enforce-eager", "--model-impl", "vllm"]}),
    (  # the node's PID namespace, opted in, with a UCX transport list that keeps cuda_ipc
        "host-pid-namespace-with-cuda-ipc",
        {"model": M, "kvTransfer": {"processNamespace": "Host", "ucx": {"tls": "tcp,cuda_copy,cuda_ipc"}}},
    ),
    (  # pair pods: equal replicas, decode's autoscaling scales the pairs, a UCX list that keeps cuda_ipc
        "pair-pods",
        {
            "model": M,
            "kvTransfer": {"processNamespace": "Pair", "ucx": {"tls": "tcp,cuda_copy,cuda_ipc"}},
            "prefill": {"replicas": 2, "tensorParallelSize": 2},
            "decode": {"replicas": 2, "autoscaling": {"minReplicas": 1, "maxReplicas": 4}},
        },
    ),
    (
        "pod-template-allowed",
        {
            "model": M,
            "decode": {
                "tolerations": [{"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}],
                "affinity": {"nodeAffinity": {}},
                "resources": {"limits": {"cpu": "500m"}},
                "podTemplate": {
                    "metadata": {"labels": {"team": "a"}, "annotations": {"example.com/owner": "team-a"}},
                    "spec": {
                        "runtimeClassName": "nvidia",
                        "priorityClassName": "high",
                        "containers": [{"name": "vllm", "imagePullPolicy": "Always"}],
                        "volumes": [
                            {"name": "v", "emptyDir": {}},
                            {
                                "name": "p",
                                "projected": {
                                    "defaultMode": 420,
                                    "sources": [
                                        {"configMap": {"name": "c"}},
                                        {
                                            "downwardAPI": {
                                                "items": [{"path": "l", "fieldRef": {"fieldPath": "metadata.labels"}}]
                                            }
                                        },
                                    ],
                                },
                            },
                        ],
                    },
                },
            },
        },
    ),
    ("max-model-len-1m", {"model": {**M, "maxModelLen": 1048576}, "gpuMemoryUtilization": 0.9}),
    ("quantities", {"model": M, "decode": {"resources": {"limits": {"nvidia.com/gpu": 2, "memory": "64Gi"}}}}),
    (
        "hetero-tp",
        {
            "model": M,
            "vllmVersion": "0.25.1",
            "blockSize": 4096,
            "prefill": {"tensorParallelSize": 4},
            "decode": {"tensorParallelSize": 2},
        },
    ),
]
