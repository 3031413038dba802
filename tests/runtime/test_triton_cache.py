"""hpd_runtime.triton_cache against a minimal stand-in of `triton.runtime.cache` (Triton's own lookup protocol:
TRITON_CACHE_MANAGER="module:Class", Class(key, override=False, dump=False)). Real Triton: the GPU issue."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

from hpd_runtime import contract as c
from hpd_runtime import triton_cache

FAKE_TRITON_CACHE = textwrap.dedent(
    """
    import importlib, os

    class FileCacheManager:
        def __init__(self, key, override=False, dump=False):
            self.key = key
            self.lock_path = None
            root = os.environ["TRITON_OVERRIDE_DIR"] if override else os.environ["TRITON_CACHE_DIR"]
            self.cache_dir = os.path.join(root, key)
            if not override:
                self.lock_path = os.path.join(self.cache_dir, "lock")
                os.makedirs(self.cache_dir, exist_ok=True)

        def put(self, data, filename, binary=True):
            path = os.path.join(self.cache_dir, filename)
            with open(path, "w") as f:
                f.write(data)
            return path

    def get_cache_manager(key):
        spec = os.environ.get("TRITON_CACHE_MANAGER")
        cls = FileCacheManager
        if spec:
            module, name = spec.split(":")
            cls = getattr(importlib.import_module(module), name)
        return cls(key)
    """
)

PROBE = textwrap.dedent(
    """
    import json, os, sys
    import hpd_runtime.triton_cache
    imported_early = "triton" in sys.modules
    from triton.runtime.cache import get_cache_manager, FileCacheManager
    m = get_cache_manager("KEY1")
    path = m.put("{}", "fn.autotune.json", binary=False)
    print(json.dumps({"imported_early": imported_early, "path": path, "lock": m.lock_path,
                      "subclass": isinstance(m, FileCacheManager), "cls": type(m).__name__}))
    """
)


def _probe(tmp_path: Path, **env: str) -> dict[str, object]:
    pkg = tmp_path / "site" / "triton" / "runtime"
    pkg.mkdir(parents=True, exist_ok=True)
    (pkg.parent / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "cache.py").write_text(FAKE_TRITON_CACHE)
    full = {**os.environ, "PYTHONPATH": str(tmp_path / "site"), **env}
    out = subprocess.run([sys.executable, "-c", PROBE], env=full, capture_output=True, text=True, check=True)
    result: dict[str, object] = json.loads(out.stdout)
    return result


def test_stable_manager_writes_into_the_keyed_dir_not_the_redirected_one(tmp_path: Path) -> None:
    stable, redirected = tmp_path / "cache" / "key" / "triton", tmp_path / "inductor-hash" / "triton_cache"
    got = _probe(
        tmp_path,
        TRITON_CACHE_MANAGER=triton_cache.MANAGER_SPEC,
        TRITON_CACHE_DIR=str(redirected),
        **{c.ENV_TRITON_STABLE_DIR: str(stable)},
    )
    assert got["path"] == str(stable / "KEY1" / "fn.autotune.json")
    assert got["lock"] == str(stable / "KEY1" / "lock")
    assert got["subclass"] is True and got["cls"] == "StableFileCacheManager"
    assert got["imported_early"] is False  # importing hpd_runtime.triton_cache does not import Triton
    assert not redirected.exists()


def test_without_a_stable_dir_it_behaves_like_tritons_manager(tmp_path: Path) -> None:
    plain = tmp_path / "plain"
    got = _probe(tmp_path, TRITON_CACHE_MANAGER=triton_cache.MANAGER_SPEC, TRITON_CACHE_DIR=str(plain))
    assert got["path"] == str(plain / "KEY1" / "fn.autotune.json")
