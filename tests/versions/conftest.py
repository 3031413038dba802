"""The `vllm_parser` tier: needs the test-only venvs made by `hack/vllm-parser-env.sh --all` (vLLM 0.20.0, 0.25.1,
0.27.1, 0.33.0: about 14 GB on disk together and 7 min cold; hack/test.sh makes them).

It is deselected unless asked for (`-m vllm_parser` or HPD_VLLM_PARSER=1), so a plain `pytest` stays fast; once
selected, a missing venv FAILS (never skips) with the setup command in the message.
"""

from __future__ import annotations

import os

import pytest


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "vllm_parser: parses generated argv with vLLM's own parser (test-only venv)")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    wanted = os.environ.get("HPD_VLLM_PARSER") == "1" or "vllm_parser" in (config.getoption("-m") or "")
    if wanted:
        return
    keep, drop = [], []
    for item in items:
        (drop if item.get_closest_marker("vllm_parser") else keep).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep
