#!/usr/bin/env bash
# checkov (PyPI) in its own venv in the cache outside the repo, made once; prints the path of its `checkov`.
# tests/chart/test_checkov.py runs it on the chart's renders and on every example's children. Not in the dev extra:
# checkov 3.3.30 pins packaging==23.2, networkx 2.6 and boto3, which would move the project's own dev environment.
set -euo pipefail
VERSION=3.3.30
ROOT="${HPD_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/hybrid-pd}"
VENV="$ROOT/checkov-$VERSION"
if [[ ! -x "$VENV/bin/checkov" ]]; then
  echo "[checkov] installing checkov==$VERSION into $VENV (once) ..." >&2
  python3 -m venv "$VENV.tmp" >&2
  "$VENV.tmp/bin/pip" install --quiet --disable-pip-version-check "checkov==$VERSION" >&2
  rm -rf "$VENV" && mv "$VENV.tmp" "$VENV"
  # the venv's scripts name their interpreter by absolute path: rewrite them for the final directory
  grep -rl "$VENV.tmp" "$VENV/bin" | xargs sed -i "s#$VENV.tmp#$VENV#g"
fi
echo "$VENV/bin/checkov"
