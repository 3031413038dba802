"""Version truth test: the argv compute_profile generates is accepted by that vLLM version's OWN parser.

Setup (once, outside the repo): `hack/vllm-parser-env.sh 0.20.0` -> ~/.cache/hybrid-pd/vllm-parser-0.20.0.
Run: `pytest -m vllm_parser tests/versions` (or HPD_VLLM_PARSER=1). Other versions: HPD_VLLM_PARSER_VERSIONS=0.20.0,0.33.0
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from hpd_operator.api.models import HybridPDDeployment
from hpd_operator.profile import compute_profile

REPO = Path(__file__).resolve().parents[2]
PARSE = Path(__file__).with_name("vllm_parse.py")
SEED = REPO / "examples" / "nemotron-3-nano.yaml"
HETERO = REPO / "examples" / "heterogeneous-tp.yaml"
VERSIONS = os.environ.get("HPD_VLLM_PARSER_VERSIONS", "0.20.0").split(",")

pytestmark = pytest.mark.vllm_parser


def parser_python(version: str) -> Path:
    root = Path(
        os.environ.get("HPD_VLLM_PARSER_CACHE")
        or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "hybrid-pd"
    )
    venv = root / f"vllm-parser-{version}"
    py = venv / "bin" / "python"
    if not (venv / ".hpd-complete").exists() or not py.exists():
        pytest.fail(f"vLLM {version} parser venv missing at {venv}: run `hack/vllm-parser-env.sh {version}` first")
    return py


def parse(version: str, argv: list[str]) -> dict[str, Any]:
    proc = subprocess.run(
        [str(parser_python(version)), str(PARSE)],
        input=json.dumps(argv),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, f"vLLM {version} rejected {argv}:\n{proc.stderr[-3000:]}"
    return dict(json.loads(proc.stdout.strip().splitlines()[-1]))


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("role", ["prefill", "decode"])
def test_seed_argv_parses_with_vllms_own_parser(version: str, role: str) -> None:
    cr = HybridPDDeployment.model_validate(yaml.safe_load(SEED.read_text()))
    spec = cr.spec.model_copy(update={"vllm_version": version})
    rp = compute_profile(spec).role(role)  # type: ignore[arg-type]
    got = parse(version, list(rp.args))
    assert got["vllm_version"] == version
    assert got["tensor_parallel_size"] == 2
    assert got["block_size"] is None  # no --block-size: vLLM picks the Mamba-aligned size itself
    assert got["max_model_len"] == 8192
    assert got["gpu_memory_utilization"] == pytest.approx(0.85)
    assert got["enable_prefix_caching"] is False
    assert got["kv_connector"] == "NixlConnector"
    assert got["kv_role"] == ("kv_producer" if role == "prefill" else "kv_consumer")
    if version.startswith("0.20"):
        assert got["disable_hybrid_kv_cache_manager"] is False
    if role == "decode" and not version.startswith("0.33"):
        assert got["async_scheduling"] is False


def test_parser_rejects_an_unknown_flag() -> None:
    """The harness itself can fail: an unknown flag exits 2."""
    proc = subprocess.run(
        [str(parser_python(VERSIONS[0])), str(PARSE)],
        input=json.dumps(["--no-such-flag"]),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 2, proc.stderr[-2000:]


@pytest.mark.parametrize("version", VERSIONS)
def test_hetero_example_block_size_parses_on_both_roles(version: str) -> None:
    """The heterogeneous-TP example must set one explicit block size (its TP 4 replicates Nano's KV heads)."""
    cr = HybridPDDeployment.model_validate(yaml.safe_load(HETERO.read_text()))
    profile = compute_profile(cr.spec.model_copy(update={"vllm_version": version}))
    got = {role: parse(version, list(profile.role(role).args)) for role in ("prefill", "decode")}
    assert got["prefill"]["block_size"] == got["decode"]["block_size"] == 4096
    assert (got["prefill"]["tensor_parallel_size"], got["decode"]["tensor_parallel_size"]) == (4, 2)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(pytest.main([__file__, "-m", "vllm_parser"]))
