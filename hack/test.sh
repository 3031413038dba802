#!/usr/bin/env bash
# Everything CI runs: install, lint, type-check, generated-file drift, then all test tiers. The tests start and
# stop their own local control plane (a pytest session fixture), so nothing is left running afterwards.
set -euo pipefail
cd "$(dirname "$0")/.."
hack/setup.sh
# Prometheus + promtool (Debian package) for tests/monitoring: installed once, never started as a service.
hack/prometheus.sh >/dev/null
hack/image-tools.sh  # buildah + mmdebstrap from Debian: the image tests build our images for real
hack/actionlint.sh >/dev/null  # the release workflow's linter, built once from its Go module
# The version truth test parses the generated argv with vLLM 0.20.0's own parser, in a test-only venv kept in
# ~/.cache/hybrid-pd (about 5.5 GB and 2 minutes once; reused afterwards).
hack/vllm-parser-env.sh 0.20.0 >/dev/null
export HPD_VLLM_PARSER=1
. .venv/bin/activate
echo "[test] ruff" >&2
ruff check .
ruff format --check .
echo "[test] mypy" >&2
mypy
echo "[test] pytest" >&2
python -m pytest "$@"
