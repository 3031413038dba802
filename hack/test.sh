#!/usr/bin/env bash
# Everything CI runs: install, lint, type-check, generated-file drift, then all test tiers. The tests start and
# stop their own local control plane (a pytest session fixture), so nothing is left running afterwards.
set -euo pipefail
cd "$(dirname "$0")/.."
hack/setup.sh
. .venv/bin/activate
echo "[test] ruff" >&2
ruff check .
ruff format --check .
echo "[test] mypy" >&2
mypy
echo "[test] pytest" >&2
python -m pytest "$@"
