"""Version truth test: the argv compute_profile generates is accepted by each vLLM version's OWN parser.

For every example under examples/ and the bench CR (bench/gpu/run.py's sample spec: eager, compile, and the
heterogeneous-TP fixed-weights variant), each with spec.vllmVersion set to each version below, both roles' argv are
parsed by the real `vllm serve` parser of that version, and the parsed engine settings must be what the argv says
(and what the version rules require: the HMA flag through 0.21, --no-async-scheduling through 0.25).

Setup (once, outside the repo): `hack/vllm-parser-env.sh --all` -> ~/.cache/hybrid-pd/vllm-parser-<version>.
Run: `pytest -m vllm_parser tests/versions` (or HPD_VLLM_PARSER=1). A subset: HPD_VLLM_PARSER_VERSIONS=0.20.0,0.33.0
One parser process per version parses every argv (importing vLLM + torch is the slow part).
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from hpd_operator.api.models import HybridPDDeployment, HybridPDDeploymentSpec
from hpd_operator.errors import SpecError
from hpd_operator.profile import compute_profile
from hpd_operator.profile_model import Profile
from hpd_operator.validation import validate
from hpd_operator.versions import parse_version

REPO = Path(__file__).resolve().parents[2]
PARSE = Path(__file__).with_name("vllm_parse.py")
EXAMPLES = sorted((REPO / "examples").glob("*.yaml"))
ALL_VERSIONS = ("0.20.0", "0.25.1", "0.27.1", "0.33.0")
"""One per side of the rule boundaries that change argv (HMA flag <= 0.21, no-async <= 0.25, block sizes <= 0.26);
keep in step with PARSER_VERSIONS in hack/vllm-parser-env.sh."""
VERSIONS = tuple(os.environ.get("HPD_VLLM_PARSER_VERSIONS", ",".join(ALL_VERSIONS)).split(","))
HMA = "--no-disable-hybrid-kv-cache-manager"
NO_ASYNC = "--no-async-scheduling"
BAD_ARGVS = {
    "unknown-flag": ["--model", "x/y", "--no-such-flag"],
    "unknown-kv-key": ["--model", "x/y", "--kv-transfer-config", '{"kv_connector":"NixlConnector","kv_role":"kv_producer","bogus":1}'],
}  # fmt: skip
"""The harness itself can fail: argvs every version must reject."""

pytestmark = pytest.mark.vllm_parser

BENCH_CRS = REPO / "bench" / "gpu" / "sample-crs.yaml"
"""The CRs bench/gpu renders and runs on the H200 (eager, compile, blockSize 128, both hetero-TP directions)."""


def _specs(version: str) -> dict[str, dict[str, Any]]:
    """Every CR spec the truth test covers, as raw dicts with spec.vllmVersion set to `version`."""
    out = {f"examples/{p.name}": dict(yaml.safe_load(p.read_text())["spec"]) for p in EXAMPLES}
    for doc in yaml.safe_load_all(BENCH_CRS.read_text()):
        if doc and doc.get("kind") == "HybridPDDeployment":
            out[f"bench {doc['metadata']['name']}"] = dict(doc["spec"])
    return {case: {**s, "vllmVersion": version} for case, s in out.items()}


CASES = tuple(_specs(ALL_VERSIONS[0]))
REFUSED = {
    ("examples/heterogeneous-tp.yaml", "0.20.0"): "replicated-hetero-tp-unservable",
    ("examples/heterogeneous-tp.yaml", "0.25.1"): "block-size-required-for-replicated-heads",
}
"""(case, version) pairs the operator refuses, so there is no argv to parse: the example is TP 4 -> TP 2 with
Nano's 2 KV heads replicated at TP 4, written for 0.27+ (no spec.blockSize); 0.20 cannot serve it at all (measured),
0.21-0.26 need a spec.blockSize. The test asserts the refusal and its rule instead."""


def profile_for(version: str, case: str) -> Profile:
    spec = HybridPDDeploymentSpec.model_validate(_specs(version)[case])
    return compute_profile(validate(HybridPDDeployment(spec=spec)))


def parser_python(version: str) -> Path:
    root = Path(
        os.environ.get("HPD_VLLM_PARSER_CACHE")
        or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "hybrid-pd"
    )
    venv = root / f"vllm-parser-{version}"
    py = venv / "bin" / "python"
    if not (venv / ".hpd-complete").exists() or not py.exists():
        pytest.fail(
            f"vLLM {version} parser venv missing at {venv}: run `hack/vllm-parser-env.sh {version}` "
            "(or `hack/vllm-parser-env.sh --all`) first; hack/test.sh does"
        )
    return py


@functools.cache
def parsed(version: str) -> dict[tuple[str, str], dict[str, Any]]:
    """(case, role) -> what vLLM `version`'s parser made of the argv; one parser process for all of them."""
    keys: list[tuple[str, str]] = []
    argvs: list[list[str]] = []
    for case in CASES:
        if (case, version) in REFUSED:
            continue
        p = profile_for(version, case)
        for role in ("prefill", "decode"):
            keys.append((case, role))
            argvs.append(list(p.role(role).args))  # type: ignore[arg-type]
    for name, argv in BAD_ARGVS.items():
        keys.append((name, "bad"))
        argvs.append(argv)
    proc = subprocess.run(
        [str(parser_python(version)), str(PARSE)],
        input=json.dumps(argvs),
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert proc.returncode == 0, f"vLLM {version} parser harness failed:\n{proc.stderr[-3000:]}"
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["vllm_version"] == version, f"venv for {version} holds vLLM {out['vllm_version']}"
    return dict(zip(keys, out["results"], strict=True))


def _value(args: tuple[str, ...], flag: str) -> str | None:
    return args[args.index(flag) + 1] if flag in args else None


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("case", CASES)
def test_generated_argv_parses_as_intended(version: str, case: str) -> None:
    if (case, version) in REFUSED:
        with pytest.raises(SpecError) as ei:
            profile_for(version, case)
        assert REFUSED[(case, version)] in {v.rule for v in ei.value.violations}, ei.value.message
        return
    prof = profile_for(version, case)
    parsed_version = parse_version(version)
    assert parsed_version is not None
    minor = parsed_version.minor
    for role in ("prefill", "decode"):
        rp = prof.role(role)  # type: ignore[arg-type]
        args = rp.args
        got = parsed(version)[(case, role)]
        assert got["ok"], f"vLLM {version} rejected {case} {role}: {got.get('error')}\nargv: {list(args)}"
        where = f"{case} {role} on {version}"
        assert got["model"] == prof.model, where
        assert got["tensor_parallel_size"] == rp.tensor_parallel_size, where
        block = _value(args, "--block-size")
        assert got["block_size"] == (int(block) if block else None), where
        mml = _value(args, "--max-model-len")
        assert got["max_model_len"] == (int(mml) if mml else None), where
        assert got["kv_connector"] == "NixlConnector", where
        assert got["kv_role"] == ("kv_producer" if role == "prefill" else "kv_consumer"), where
        if prof.hybrid:
            assert got["enable_prefix_caching"] is False, where
            # the version rules, as vLLM itself read them
            assert (HMA in args) is (minor <= 21), where
            if minor <= 21:
                assert got["disable_hybrid_kv_cache_manager"] is False, where
            wants_sync = minor <= 25 and (role == "decode" or rp.tensor_parallel_size > 1)
            assert (NO_ASYNC in args) is wants_sync, where
            if wants_sync:
                assert got["async_scheduling"] is False, where
        if "--enforce-eager" in args:
            assert got["enforce_eager"] is True, where
        if _value(args, "--load-format") == "dummy":
            assert "dummy" in got["load_format"].lower(), where
        if _value(args, "--gpu-memory-utilization"):
            assert got["gpu_memory_utilization"] == pytest.approx(float(_value(args, "--gpu-memory-utilization") or 0))


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("bad", sorted(BAD_ARGVS))
def test_parser_rejects_what_vllm_rejects(version: str, bad: str) -> None:
    """The harness itself can fail: an unknown flag exits 2, an unknown kv-transfer key is a validation error."""
    got = parsed(version)[(bad, "bad")]
    assert got["ok"] is False, got
    if bad == "unknown-flag":
        assert got["exit"] == 2 and "--no-such-flag" in got["error"]
    else:
        assert "bogus" in got["error"]


def test_every_example_and_the_bench_cr_are_covered() -> None:
    assert len(EXAMPLES) >= 3 and {f"examples/{p.name}" for p in EXAMPLES} <= set(CASES)
    bench_crs = [d for d in yaml.safe_load_all(BENCH_CRS.read_text()) if d and d.get("kind") == "HybridPDDeployment"]
    assert sum(c.startswith("bench") for c in CASES) == len(bench_crs) >= 3
    assert set(ALL_VERSIONS) <= set(VERSIONS) or "HPD_VLLM_PARSER_VERSIONS" in os.environ


if __name__ == "__main__":  # pragma: no cover
    sys.exit(pytest.main([__file__, "-m", "vllm_parser"]))
