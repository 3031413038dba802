"""The hostile/careless-input sweep against the REAL apiserver + operator (issue #13's 81-case sweep, rebuilt).

Over a hundred crafted specs: every recorded CRD case (tests/crd/cel_cases.py), what only the operator can catch
(extraArgs abbreviations and unknown flags as vLLM 0.20's parser reads them, GPUs below TP, requests over limits,
unsupported versions, TP vs the model's heads), odd-but-valid specs, and seeded random extraArgs. The claim, per
spec: the apiserver refuses it naming the field, or it gets its children, or a `Ready=False, reason=InvalidSpec`
condition whose message names the field (the time to that is printed against the issue's 15 s target). Specs are created in batches, all in one
namespace under one operator, so one CR's problem cannot hide another's. Afterwards, over several resync rounds, no
CR gets more than one InvalidSpec Warning Event (no Event storm).
"""

from __future__ import annotations

import copy
import json
import random
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

from hpd_devcluster.testing import wait_for
from hpd_runtime import contract

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "crd"))
from cel_cases import BAD_NAMES, BAD_SPECS

from .conftest import Operator

pytestmark = pytest.mark.cluster
REPO = Path(__file__).resolve().parents[2]
SEED = yaml.safe_load((REPO / "examples" / "nemotron-3-nano.yaml").read_text())["spec"]
G, V, P = contract.GROUP, contract.VERSION, contract.PLURAL
TARGET = 15.0
"""Issue #13's target from creation to children or a condition naming the field. Measured and printed, not asserted
(no wall-clock asserts: a loaded CI machine must not fail the claim itself); DEADLINE is the assert's patience."""
DEADLINE = 180.0
BATCH = 8
RESYNC = 10.0
"""The claim is about the watch-driven reconcile, not the resync: with 100+ CRs a 1.5 s resync round (each round
converges every CR) would itself be the load."""


@pytest.fixture()
def sweep_operator(
    crd: None,
    kubeconfig: Path,
    namespace: str,
    tmp_path: Path,
    operator_logs: list[Path],
) -> Iterator[Operator]:
    op = Operator(kubeconfig, namespace, tmp_path / "operator.log", resync=str(RESYNC))
    operator_logs.append(op.log)
    op.start()
    yield op
    op.stop()


@dataclass
class Case:
    id: str
    spec: dict[str, Any]
    field: str | None
    """What the refusal or the InvalidSpec condition must name; None = a valid spec that must deploy."""
    name: str = ""
    either: bool = False
    """Random argv: valid or not, it must deploy or name `field`."""


def merged(patch: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(SEED)
    for k, v in patch.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = {**out[k], **v}
        else:
            out[k] = v
    return out


def operator_only_cases() -> list[Case]:
    """Specs the apiserver admits and the operator must refuse with a condition naming the field."""
    d = "spec.decode.extraArgs[0]"
    args: list[tuple[str, list[str], str]] = [
        ("abbrev-tp", ["--tensor-parallel", "2"], d),
        ("abbrev-prefix-caching", ["--enable-prefix"], d),
        ("abbrev-async", ["--async-sched"], d),
        ("abbrev-port", ["--por", "9000"], d),
        ("abbrev-served-name", ["--served-model", "x"], d),
        ("abbrev-kv-config", ["--kv-transfer-conf", '{"kv_role":"kv_producer"}'], d),
        ("abbrev-kv-dotted", ["--kv-transfer-conf.kv_role", "kv_producer"], d),
        ("underscore-eq", ["--tensor_par=2"], d),
        ("short-prefix", ["-t", "2"], d),
        ("no-form", ["--no-enable-prefix"], d),
        ("gmu-abbrev", ["--gpu-mem=0.5"], d),
        ("speculative", ["--speculative-conf", "{}"], d),
        ("data-parallel", ["--data-parallel", "2"], d),
        ("pipeline", ["--pipeline", "2"], d),
        ("config-file", ["--config=/etc/x.yaml"], d),
        ("unknown-flag", ["--no-such-flag"], d),
        ("ambiguous", ["--max", "1"], d),
        ("stray-value", ["--enforce-eager", "yes"], "spec.decode.extraArgs[1]"),
        ("missing-value", ["--max-num-seqs"], d),
        ("switch-with-value", ["--enforce-eager=1"], d),
        ("bare-dashdash", ["--"], d),
    ]
    out = [Case(f"args-{i}", merged({"decode": {"extraArgs": a}}), f) for i, a, f in args]
    gpus = {"resources": {"limits": {"nvidia.com/gpu": 1}}, "tensorParallelSize": 4}
    out += [
        Case("gpu-below-tp", merged({"prefill": {"tensorParallelSize": 4}, "decode": gpus}), "spec.decode.resources"),
        Case(
            "requests-over-limits",
            merged({"prefill": {"resources": {"limits": {"memory": "1Gi"}, "requests": {"memory": "2Gi"}}}}),
            "spec.prefill.resources.requests.memory",
        ),
        Case(
            "router-requests-over-limits",
            merged({"router": {"resources": {"limits": {"cpu": "1"}, "requests": {"cpu": "2"}}}}),
            "spec.router.resources.requests.cpu",
        ),
        Case("unsupported-version", merged({"vllmVersion": "0.99.0"}), "spec.vllmVersion"),
        Case(
            "version-without-flag-list",
            merged({"vllmVersion": "0.22.0", "extraArgs": ["--enforce-eager"]}),
            "spec.extraArgs",
        ),
        Case(
            "tp-vs-heads",
            merged({"prefill": {"tensorParallelSize": 3}, "decode": {"tensorParallelSize": 3}}),
            "spec.prefill.tensorParallelSize",
        ),
        Case(
            "hetero-tp-needs-block-size",
            merged({"vllmVersion": "0.25.1", "prefill": {"tensorParallelSize": 4}}),
            "spec.blockSize",
        ),
        Case(  # 0.20: no block size serves it (NaN P->D measured with one that made the sizes equal)
            "hetero-tp-replicated-unservable-on-0.20",
            merged({"prefill": {"tensorParallelSize": 4}, "blockSize": 4096}),
            "spec.prefill.tensorParallelSize",
        ),
        Case("global-abbrev", merged({"extraArgs": ["--max-model", "4096"]}), "spec.extraArgs[0]"),
    ]
    return out


def valid_cases() -> list[Case]:
    """Odd but valid: each must deploy."""
    pt = {
        "metadata": {"labels": {"team": "a", contract.LABEL_INSTANCE: "hijack"}, "annotations": {"a": "b"}},
        "spec": {
            "runtimeClassName": "nvidia",
            "terminationGracePeriodSeconds": 120,
            "volumes": [{"name": "extra", "configMap": {"name": "c"}}],
            "containers": [
                {
                    "name": "vllm",
                    "imagePullPolicy": "IfNotPresent",
                    "volumeMounts": [{"name": "extra", "mountPath": "/extra"}],
                }
            ],
        },
    }
    tol = [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    aff = {
        "nodeAffinity": {
            "preferredDuringSchedulingIgnoredDuringExecution": [
                {"weight": 1, "preference": {"matchExpressions": [{"key": "gpu", "operator": "Exists"}]}}
            ]
        }
    }
    specs = [
        ("long-name", {}, "v" * 55),
        ("side-channel-9000", {"kvTransfer": {"sideChannelPort": 9000}}, ""),
        (
            "quantities",
            {
                "decode": {
                    "resources": {
                        "limits": {"memory": "1.5Gi", "cpu": "500m", "nvidia.com/gpu": 2},
                        "requests": {"cpu": "250m"},
                    }
                }
            },
            "",
        ),
        ("tolerations-affinity", {"decode": {"tolerations": tol, "affinity": aff}}, ""),
        ("pod-template", {"decode": {"podTemplate": pt}}, ""),
        (
            "free-extra-args",
            {
                "extraArgs": ["--max-num-seqs=64", "--compilation-config.cudagraph_mode", "FULL_DECODE_ONLY", "-O3"],
                "decode": {"extraArgs": ["--enforce-eager"]},
            },
            "",
        ),
        ("gmu-min", {"gpuMemoryUtilization": 0.05}, ""),
        ("max-model-len-1m", {"model": {**SEED["model"], "maxModelLen": 1048576}}, ""),
        ("warmup-below-mml", {"warmup": {"promptLengths": [16, 4096, 8191]}}, ""),
        ("unknown-field-pruned", {"bogus": 1}, ""),
        ("scaled-to-zero", {"prefill": {"replicas": 0}, "decode": {"replicas": 0}}, ""),
        ("more-gpus-than-tp", {"decode": {"resources": {"limits": {"nvidia.com/gpu": 8}}}}, ""),
        ("env-unicode-bmp", {"env": [{"name": "GREETING", "value": "grüße"}]}, ""),
        ("name-ends-like-suffix", {}, "a-prefil"),
    ]
    return [Case(f"ok-{i}", merged(p), None, name=n) for i, p, n in specs]


def random_arg_cases(n: int, seed: int) -> list[Case]:
    """Seeded random extraArgs: prefixes of real 0.20 flags, `_` spellings, `=values`, junk flags and values."""
    from hpd_operator.vllm_flags import flag_table

    table = flag_table("0.20.0")
    assert table is not None
    rng = random.Random(seed)
    strings = sorted(table.options)
    out = []
    for i in range(n):
        argv: list[str] = []
        for _ in range(rng.randint(1, 3)):
            s = rng.choice(strings)
            s = s[: rng.randint(min(3, len(s)), len(s))] if rng.random() < 0.5 else s
            if rng.random() < 0.2:
                s = s.replace("-", "_").replace("_", "-", 2)
            if rng.random() < 0.1:
                s = "--" + "".join(rng.choice("abcxyz-") for _ in range(rng.randint(2, 9)))
            argv.append(s)
            if rng.random() < 0.6:
                argv.append(rng.choice(["1", "64", "true", "x", '{"a":1}']))
        out.append(Case(f"random-{i}", merged({"decode": {"extraArgs": argv}}), "spec.decode.extraArgs", either=True))
    return out


def all_cases() -> list[Case]:
    # A field only a strict client is told about (`unknown field`) is pruned for a plain one: then it deploys.
    cases = [
        Case(f"cel-{c}-{i}", spec, None if "unknown field" in msg else "spec")
        for i, (c, spec, msg) in enumerate(BAD_SPECS)
    ]
    cases += [Case(f"name-{i}", copy.deepcopy(SEED), "metadata.name", name=n) for i, (_, n, _) in enumerate(BAD_NAMES)]
    cases += operator_only_cases() + valid_cases() + random_arg_cases(16, seed=1300)
    for i, c in enumerate(cases):
        c.name = c.name or f"s{i:03d}"
    return cases


# ---------------------------------------------------------------------------------------------------------------
def create(api: client.ApiClient, ns: str, c: Case) -> str | None:
    """None when admitted, else the apiserver's message (default field validation, as a plain client sends)."""
    body = {"apiVersion": f"{G}/{V}", "kind": contract.KIND, "metadata": {"name": c.name}, "spec": c.spec}
    try:
        client.CustomObjectsApi(api).create_namespaced_custom_object(G, V, ns, P, body)
    except client.ApiException as e:
        try:
            return str(json.loads(e.body).get("message", e.body))
        except (ValueError, TypeError):
            return str(e.body)
    return None


def outcome(api: client.ApiClient, ns: str, c: Case) -> str | None:
    """'children', 'invalid:<message>' or None (nothing yet)."""
    cr = client.CustomObjectsApi(api).get_namespaced_custom_object(G, V, ns, P, c.name)
    for cond in (cr.get("status") or {}).get("conditions") or []:
        if cond["type"] == "Ready" and cond.get("reason") == "InvalidSpec":
            return "invalid:" + str(cond.get("message"))
    sel = f"{contract.LABEL_INSTANCE}={c.name}"
    deps = client.AppsV1Api(api).list_namespaced_deployment(ns, label_selector=sel).items
    made = {d.metadata.labels.get(contract.LABEL_COMPONENT) for d in deps}  # engines of one generation, the router
    return "children" if made >= {"prefill", "decode", contract.COMPONENT_ROUTER} else None


def judge(c: Case, result: str) -> str | None:
    """None when the result keeps the promise for this case, else what is wrong."""
    if result.startswith("refused:"):
        if c.field is None:
            return f"a valid spec was refused: {result}"
        return None if ("spec." in result or "metadata.name" in result or "unknown field" in result) else result
    if result == "children":
        return None if c.field is None or c.either else f"deployed although it targets {c.field}"
    if result.startswith("invalid:"):
        if c.field is None:
            return f"a valid spec got InvalidSpec: {result}"
        return None if c.field in result else f"condition does not name {c.field}: {result}"
    return result


def test_every_accepted_spec_deploys_or_names_the_field_within_15s(
    sweep_operator: Operator,
    api_client: client.ApiClient,
    namespace: str,
) -> None:
    ns, cases = namespace, all_cases()
    assert len(cases) >= 81
    results: dict[str, str] = {}
    took: dict[str, float] = {}
    for start in range(0, len(cases), BATCH):
        batch = cases[start : start + BATCH]
        created: dict[str, float] = {}
        for c in batch:
            msg = create(api_client, ns, c)
            if msg is None:
                created[c.name] = time.monotonic()
            else:
                results[c.name] = "refused:" + msg
        pending = dict(created)

        def settle(pending: dict[str, float] = pending, batch: list[Case] = batch) -> bool:
            for c in batch:
                if c.name in pending:
                    got = outcome(api_client, ns, c)
                    if got is not None:
                        results[c.name] = got
                        took[c.name] = time.monotonic() - pending.pop(c.name)
                    elif time.monotonic() - pending[c.name] > DEADLINE:
                        results[c.name] = f"nothing within {DEADLINE:.0f} s"
                        del pending[c.name]
            return not pending

        wait_for(settle, DEADLINE + 30, what="every CR of the batch settled")
    wrong = [f"{c.id} ({c.name}): {err}" for c in cases if (err := judge(c, results[c.name])) is not None]
    counts = {k: sum(r.startswith(k) for r in results.values()) for k in ("refused", "children", "invalid")}
    for kind in ("invalid", "children"):
        times = sorted(t for n, t in took.items() if results[n].startswith(kind))
        over = sum(t > TARGET for t in times)
        print(f"sweep: {kind}: creation -> outcome median {times[len(times) // 2]:.1f} s, max {times[-1]:.1f} s, "
              f"{over} of {len(times)} over the {TARGET:.0f} s target")  # fmt: skip
    print(f"sweep: {len(cases)} specs: {counts}")
    assert not wrong, f"{len(wrong)} of {len(cases)} broke the promise:\n" + "\n".join(wrong)
    assert counts["invalid"] >= 40 and counts["children"] >= 14 and counts["refused"] >= 50, counts

    # No Event storm: over several resync rounds, at most one InvalidSpec Warning per CR.
    invalid = [c.name for c in cases if results[c.name].startswith("invalid")]
    rounds = 2.5 * RESYNC
    until = time.monotonic() + rounds

    def storm() -> bool | None:
        per: dict[str, int] = {}
        for e in client.CoreV1Api(api_client).list_namespaced_event(ns).items:
            if e.type == "Warning" and e.involved_object.name in invalid:
                per[e.involved_object.name] = per.get(e.involved_object.name, 0) + (e.count or 1)
        over = {k: v for k, v in per.items() if v > 1}
        assert not over, f"Event storm: {over}"
        return True if time.monotonic() >= until else None

    wait_for(storm, rounds + 30, what=f"no Event storm held for {rounds:.0f} s")
