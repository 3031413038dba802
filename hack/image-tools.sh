#!/usr/bin/env bash
# Install the local image-build tools from Debian, idempotently: buildah (builds our Dockerfiles with the vfs
# storage driver and chroot isolation, as root, no daemon) and mmdebstrap (builds the Debian bookworm base the
# Dockerfiles are built on, since no container registry is reachable here). Used by the image tests
# (tests/runtime/test_images.py through hack/hpd_devcluster/images.py); hack/test.sh calls it.
set -euo pipefail
need=()
command -v buildah >/dev/null 2>&1 || need+=(buildah)
command -v mmdebstrap >/dev/null 2>&1 || need+=(mmdebstrap)
# uidmap: buildah's dependency for rootless use; harmless as root. fuse-overlayfs is not needed (vfs).
if [ "${#need[@]}" -eq 0 ]; then
  exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
  echo "image-tools: need root to apt-get install ${need[*]} (or install them yourself)" >&2
  exit 2
fi
echo "[image-tools] apt-get install ${need[*]} ..." >&2
export DEBIAN_FRONTEND=noninteractive
if ! apt-cache policy "${need[@]}" 2>/dev/null | grep -q 'Candidate: [0-9]'; then
  apt-get update -qq
fi
apt-get install -y -qq --no-install-recommends "${need[@]}" >&2
