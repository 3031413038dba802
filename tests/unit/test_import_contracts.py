"""The import contracts (pyproject.toml [tool.importlinter]) fail when the imports they forbid come back.

`lint-imports` runs in hack/test.sh on the tree as it is, where every contract is kept; this module shows that the
contracts are not vacuous. It copies the packages into a scratch root next to the same pyproject.toml, adds one
forbidden import to a copy, and runs `lint-imports` there: the named contract (and only the named ones) must break.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
LINT_IMPORTS = Path(sys.executable).parent / "lint-imports"
PACKAGES = {
    "hpd_operator": REPO / "operator" / "hpd_operator",
    "hpd_runtime": REPO / "images" / "runtime" / "hpd_runtime",
    "hpd_devcluster": REPO / "hack" / "hpd_devcluster",
    "tests": REPO / "tests",
    "bench": REPO / "bench",
}
DEVCLUSTER_LAYERS = "The dev harness (hack/hpd_devcluster) is layered"
ACYCLIC = "No import circle between the modules of the runtime, the dev harness, the tests or the benches"
NO_TEST_CODE = "The operator, the runtime and the dev harness stand on no test or bench code"

# (file to change, the line added at its end, the contracts that must break)
INJECTIONS = {
    # the old cycle: the control plane's teardown stopping the real node itself, in a function as it was
    "cluster imports realnode": (
        "hpd_devcluster/cluster.py",
        "def _injected() -> None:\n    from hpd_devcluster import realnode  # noqa\n",
        {DEVCLUSTER_LAYERS, ACYCLIC},
    ),
    "cluster imports lifecycle": (
        "hpd_devcluster/cluster.py",
        "from hpd_devcluster import lifecycle  # noqa\n",
        {DEVCLUSTER_LAYERS, ACYCLIC},
    ),
    "the operator imports a bench": (
        "hpd_operator/errors.py",
        "import bench.load.run_load  # noqa\n",
        {NO_TEST_CODE},
    ),
    "the runtime imports a test helper": (
        "hpd_runtime/log.py",
        "from tests.unit import test_code_shape  # noqa\n",
        {NO_TEST_CODE},
    ),
}


def _verdicts(root: Path) -> dict[str, str]:
    """Contract name -> KEPT/BROKEN, from `lint-imports` run in `root` (a wide terminal: one line per contract)."""
    env = {**os.environ, "COLUMNS": "1000", "PYTHONDONTWRITEBYTECODE": "1"}
    out = subprocess.run(
        [str(LINT_IMPORTS), "--no-cache", "--no-logo"],
        check=False,
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    verdicts = {m[1]: m[2] for m in re.finditer(r"^(.+) (KEPT|BROKEN)$", out.stdout, re.MULTILINE)}
    assert verdicts, f"lint-imports reported no contract (rc {out.returncode}):\n{out.stdout}\n{out.stderr}"
    assert (out.returncode == 0) == ("BROKEN" not in verdicts.values()), out.stdout
    return verdicts


@pytest.mark.parametrize("case", sorted(INJECTIONS))
def test_an_injected_import_breaks_its_contract(case: str, tmp_path: Path) -> None:
    path, line, expected = INJECTIONS[case]
    changed = path.split("/", 1)[0]
    for name, src in PACKAGES.items():
        if name == changed:  # a copy to change; the rest as they are
            shutil.copytree(src, tmp_path / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            (tmp_path / name).symlink_to(src, target_is_directory=True)
    shutil.copy(REPO / "pyproject.toml", tmp_path / "pyproject.toml")
    target = tmp_path / path
    target.write_text(target.read_text() + "\n\n" + line)

    verdicts = _verdicts(tmp_path)
    assert len(verdicts) >= 9, verdicts
    broken = {name for name, verdict in verdicts.items() if verdict == "BROKEN"}
    unexpected = {b for b in broken if not any(b.startswith(e) for e in expected)}
    kept = {e for e in expected if not any(b.startswith(e) for b in broken)}
    assert not kept and not unexpected, f"{case}: still kept {sorted(kept)}; broken as well {sorted(unexpected)}"
