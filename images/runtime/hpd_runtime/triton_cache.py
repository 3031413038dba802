"""A Triton cache manager that keeps Triton's file cache (compiled kernels and `*.autotune.json`) in one stable,
keyed directory, whatever `TRITON_CACHE_DIR` says at the moment.

Why: in compile mode vLLM 0.20-0.25 overrides `TRITON_CACHE_DIR` with a directory inside the torch.compile
artifact (`torch_compile_cache/<hash>/rank_*/triton_cache`), and that hash changed between identical restarts on
the H200, so autotune results were never reused (gpu/README.md). Triton asks `TRITON_CACHE_MANAGER`
("module:Class") for its cache manager on every lookup; `launch` sets it to
`hpd_runtime.triton_cache:StableFileCacheManager` and `HPD_TRITON_STABLE_DIR` to the keyed directory.

Safe to share: Triton's own key (a hash of the Triton build, kernel source, signature, constants, backend,
options and cache-invalidating env) names each entry, so a stale entry is never picked up. Override and dump
managers, and any process without `HPD_TRITON_STABLE_DIR`, behave exactly like Triton's `FileCacheManager`.

The class is built on first attribute access (PEP 562 module `__getattr__`), so importing this module never
imports Triton; Triton itself resolves the class only inside the vLLM processes, where it exists.
[UNVERIFIED on GPU: to be proven by the GPU issue.]
"""

from __future__ import annotations

import importlib
import os
from typing import Any

from hpd_runtime import contract as c

CLASS_NAME = "StableFileCacheManager"
MANAGER_SPEC = f"{__name__}:{CLASS_NAME}"
"""Value for TRITON_CACHE_MANAGER."""

_built: dict[str, type] = {}


def stable_dir() -> str | None:
    value = os.environ.get(c.ENV_TRITON_STABLE_DIR, "").strip()
    return value or None


def _build() -> type:
    base: Any = importlib.import_module("triton.runtime.cache").FileCacheManager

    def __init__(self: Any, key: str, override: bool = False, dump: bool = False) -> None:
        root = stable_dir()
        if override or dump or root is None:
            base.__init__(self, key, override=override, dump=dump)
            return
        self.key = key
        self.cache_dir = os.path.join(root, key)
        self.lock_path = os.path.join(self.cache_dir, "lock")
        os.makedirs(self.cache_dir, exist_ok=True)

    return type(CLASS_NAME, (base,), {"__init__": __init__, "__module__": __name__, "__doc__": __doc__})


def __getattr__(name: str) -> Any:
    if name == CLASS_NAME:
        if name not in _built:
            _built[name] = _build()
        return _built[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
