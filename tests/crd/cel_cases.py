"""Objects the CRD must reject, with the message the apiserver gives (for the cluster tests).

Each case: (id, spec, substring of the apiserver's error). All were checked by hand with
`kubectl apply --dry-run=server` against the local control plane (k8s 1.35.4).
Usage: `for id, spec, msg in BAD_SPECS: apply {"apiVersion": ..., "kind": ..., "metadata": ..., "spec": spec}`.
"""

from __future__ import annotations

from typing import Any

M = {"name": "nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-FP8"}

BAD_SPECS: list[tuple[str, dict[str, Any], str]] = [
    (
        "tp-divides",
        {"model": M, "prefill": {"tensorParallelSize": 3}, "decode": {"tensorParallelSize": 2}},
        "must divide one another",
    ),
    ("replicas-non-negative", {"model": M, "decode": {"replicas": -1}}, "replicas must be >= 0"),
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
    ("owned-env", {"model": M, "env": [{"name": "HPD_ROLE", "value": "x"}]}, "spec.env may not set env"),
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
]

GOOD_SPECS: list[tuple[str, dict[str, Any]]] = [
    ("extra-args-allowed", {"model": M, "extraArgs": ["--enforce-eager", "--model-impl", "vllm"]}),
    ("quantities", {"model": M, "decode": {"resources": {"limits": {"nvidia.com/gpu": 2, "memory": "64Gi"}}}}),
    (
        "hetero-tp",
        {"model": M, "blockSize": 4096, "prefill": {"tensorParallelSize": 4}, "decode": {"tensorParallelSize": 2}},
    ),
]
