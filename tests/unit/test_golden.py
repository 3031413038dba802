"""What `python -m hpd_operator render -f FILE -o yaml` prints is a contract: byte for byte what the committed
golden files under tests/golden/out/ hold, for every example, the bench CRs and tests/golden/crs/ (CRs that walk
the branches the examples leave out), plus each CR's status.profile (injections with their reasons, the version
rules, the warnings) and the exact error text of the invalid CRs in tests/golden/crs/invalid/.

A change that means to alter what the operator applies regenerates them and shows the difference in review:

    .venv/bin/python tests/unit/test_golden.py        # rewrite tests/golden/out/ from the current code
"""

from __future__ import annotations

import io
import sys
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import pytest
import yaml

from hpd_operator.__main__ import main
from hpd_operator.api.parse import parse_cr
from hpd_operator.profile import compute_profile
from hpd_operator.render import load_documents
from hpd_operator.validation import validate

REPO = Path(__file__).resolve().parents[2]
GOLDEN = REPO / "tests" / "golden"
OUT = GOLDEN / "out"
SOURCES: tuple[Path, ...] = (
    *sorted((REPO / "examples").glob("*.yaml")),
    REPO / "bench" / "gpu" / "sample-crs.yaml",
    *sorted((GOLDEN / "crs").glob("*.yaml")),
)
INVALID: tuple[Path, ...] = tuple(sorted((GOLDEN / "crs" / "invalid").glob("*.yaml")))


def _stem(path: Path) -> str:
    rel = path.relative_to(REPO)
    if rel.parts[:2] == ("tests", "golden"):
        rel = rel.relative_to("tests/golden/crs")
    return "-".join(rel.with_suffix("").parts)


def _cli(path: Path) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        rc = main(["render", "-f", str(path), "-o", "yaml"])
    return rc, out.getvalue(), err.getvalue()


def _profiles(path: Path) -> str:
    """status.profile of every CR in the file, by CR name."""
    by_name = {}
    for doc in load_documents(path.read_text()):
        cr = parse_cr(doc)
        by_name[cr.metadata.name] = compute_profile(validate(cr)).status()
    return yaml.safe_dump(by_name, sort_keys=False, width=120, allow_unicode=True)


def outputs() -> dict[Path, str]:
    """Golden file -> what the code produces now."""
    out: dict[Path, str] = {}
    for src in SOURCES:
        rc, text, err = _cli(src)
        assert rc == 0, f"{src}: {err}"
        out[OUT / f"{_stem(src)}.yaml"] = text
        out[OUT / f"{_stem(src)}.profile.yaml"] = _profiles(src)
    for src in INVALID:
        rc, text, err = _cli(src)
        out[OUT / f"{_stem(src)}.txt"] = f"exit {rc}\n{text}{err}"
    return out


@pytest.fixture(scope="module")
def current() -> dict[Path, str]:
    return outputs()


def test_every_golden_file_has_a_source(current: dict[Path, str]) -> None:
    committed = {p for p in OUT.rglob("*") if p.is_file()}
    assert committed == set(current), "run `.venv/bin/python tests/unit/test_golden.py` and review the diff"


@pytest.mark.parametrize("src", [*SOURCES, *INVALID], ids=_stem)
def test_render_is_byte_identical_to_the_golden_files(src: Path, current: dict[Path, str]) -> None:
    for path, text in current.items():
        if path.name.startswith(_stem(src) + "."):
            assert path.exists(), f"{path} is missing: run `.venv/bin/python tests/unit/test_golden.py`"
            assert path.read_text() == text, f"{path} differs: run `.venv/bin/python tests/unit/test_golden.py`"


def update() -> None:
    for path, text in outputs().items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        print(f"wrote {path.relative_to(REPO)}")


if __name__ == "__main__":
    sys.exit(update())
