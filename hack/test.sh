#!/usr/bin/env bash
# Everything CI runs: install, lint, type-check, generated-file drift, then all test tiers. The tests start and
# stop their own local control plane (a pytest session fixture), so nothing is left running afterwards.
set -euo pipefail
cd "$(dirname "$0")/.."
hack/setup.sh
# Prometheus + promtool (Debian package) for tests/monitoring: installed once, never started as a service.
hack/prometheus.sh >/dev/null
hack/image-tools.sh  # buildah + mmdebstrap from Debian: the image tests build our images for real
hack/real-node-tools.sh  # containerd, runc, CNI plugins, busybox-static from Debian: the real node's runtime
hack/actionlint.sh >/dev/null  # the release workflow's linter, built once from its Go module
hack/scan-tools.sh >/dev/null  # checkov (PyPI) in its own venv, once: tests/chart/test_checkov.py
# cyclonus, the NetworkPolicy evaluator of tests/cluster/test_network_policy.py, and LeaderWorkerSet (the multi-node
# roles' tests/cluster/test_multi_node.py), each built once from its Go module
.venv/bin/python -m hpd_devcluster build --test-tools >/dev/null
# The version truth test parses the generated argv with the own parsers of vLLM 0.20, 0.25, 0.27 and 0.33, in
# test-only venvs kept in ~/.cache/hybrid-pd (made once by uv with one shared package cache and hard links: about
# 14 GB on disk for the four, 3 torch versions; about 7 minutes cold; reused afterwards).
hack/vllm-parser-env.sh --all >/dev/null
export HPD_VLLM_PARSER=1
. .venv/bin/activate
echo "[test] ruff" >&2
ruff check .
ruff format --check .
echo "[test] mypy" >&2
mypy
echo "[test] import contracts" >&2
lint-imports  # the layers, no import circle, pure rooms, no dev-only code in what ships (pyproject.toml)
# Our three images, built once here (warm: one `buildah inspect` each) so that no pytest worker waits on another's
# build behind the per-image lock.
for image in operator router vllm; do python -m hpd_devcluster.images build "$image" >/dev/null; done
# pytest-xdist workers (docs/development.md, "Parallel workers"): each its own control plane; a module's tests on one
# worker, the real-node modules all on one, the longest scopes first (tests/conftest.py). HPD_TEST_WORKERS=0: serial.
echo "[test] pytest (${HPD_TEST_WORKERS:=3} workers)" >&2
python -m pytest -n "$HPD_TEST_WORKERS" "$@"
