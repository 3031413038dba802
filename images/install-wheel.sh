#!/bin/sh
# Install the project's wheel with one extra, exactly as the images do it. The ONE place that says how:
# images/vllm/Dockerfile and images/operator/Dockerfile run this script, and tests/runtime/test_images.py runs it
# against a clean venv (PYTHON=<venv python>).
#   usage: install-wheel.sh DIST_DIR EXTRA      e.g. install-wheel.sh /tmp/dist runtime
# A shell glob with the extra appended ("*.whl[runtime]") would be read as a bracket expression, so the single
# wheel is looked up first; more or less than one wheel in DIST_DIR is an error.
set -eu
dist="$1"
extra="$2"
python="${PYTHON:-python3}"
set -- "$dist"/hybrid_pd_operator-*-py3-none-any.whl
if [ "$#" -ne 1 ] || [ ! -f "$1" ]; then
    echo "install-wheel.sh: expected exactly one hybrid_pd_operator wheel in $dist, found: $*" >&2
    exit 1
fi
"$python" -m pip install --no-cache-dir --disable-pip-version-check "$1[$extra]"
