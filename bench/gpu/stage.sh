#!/usr/bin/env bash
# Build bundles that put vLLM VERSION + NIXL 1.5.1 on the H200 GPU machine (no registry there; torch 2.11.0+cu130
# and Triton 3.6.0 installed, which vLLM 0.20.x-0.25.x pin; 0.27+ pins torch 2.13+ and cannot run there).
#
#   bench/gpu/stage.sh VERSION DIR [REUSE]   # e.g. bench/gpu/stage.sh 0.25.1 .gpu-0.25.1  -> DIR/c1 .. DIR/cN
# REUSE: the DIR of a version staged earlier on the same machine; wheels found there (same name and size) are listed
# in c1/reuse.txt instead of carried again (gpu-install.sh copies them from REUSE_FROM). 0.25.1 after 0.20.0: 3
# bundles instead of 4.
#
# Each bundle is under 60 MB (one command on the GPU machine can bring 64 MiB): files are packed into bundles of at
# most 58 MB, the vLLM and FA3 archives split to fit; the nixl-cu13 wheel (58.8 MB) is a bundle of its own. The wheel list beyond vLLM is
# bench/gpu/wheels/VERSION.txt (derived from the vLLM wheel's METADATA; its header says how). Runs here (PyPI
# reachable); needs python3 -m pip, xz, split, unzip. Never commit DIR (echo /DIR/ >> .git/info/exclude).
# On the GPU machine: copy every bundle's files into /tmp/stage/, then `bash /tmp/stage/gpu-install.sh`
# (bench/gpu/README.md, "Staging another vLLM version").
set -euo pipefail
version=${1:?usage: stage.sh VERSION DIR}
dir=${2:?usage: stage.sh VERSION DIR [REUSE]}
reuse=$(cd "${3:-/nonexistent}" 2>/dev/null && pwd || true)
here=$(cd "$(dirname "$0")" && pwd)
wheels="$here/wheels/$version.txt"
[[ -f $wheels ]] || { echo "stage.sh: no wheel list $wheels (derive one from the vLLM wheel's METADATA)" >&2; exit 2; }
case "$version" in
  0.20.*) xgrammar=0.1.32 ;;
  0.2[1-5].*) xgrammar=0.2.3 ;;
  *) echo "stage.sh: vLLM $version pins a torch the H200 machine does not have (2.11.0 there)" >&2; exit 2 ;;
esac
limit=58000000
rm -rf "$dir" && mkdir -p "$dir"/{dl,out,wheels} && cd "$dir"
pyplat=(--only-binary=:all: --python-version 3.12 --implementation cp --platform manylinux_2_17_x86_64
        --platform manylinux2014_x86_64 --platform manylinux_2_24_x86_64 --platform manylinux_2_27_x86_64
        --platform manylinux_2_28_x86_64 --platform manylinux_2_34_x86_64 --platform manylinux_2_35_x86_64)
python3 -m pip download -q --no-deps -d dl "vllm==$version"
python3 -m pip download -q --no-deps "${pyplat[@]}" -d wheels "xgrammar==$xgrammar" nixl==1.5.1 nixl-cu13==1.5.1
python3 -m pip download -q --no-deps "${pyplat[@]}" -d wheels -r "$wheels"

# vLLM, slimmed: Hopper needs FA3 only; the MoE kernels, DeepGEMM, the SM100 FMHA, the optional Rust frontend
# (vllm-rs, used only with VLLM_USE_RUST_FRONTEND) and the instrumentator's static files are not used by a dense
# tiny model on an H200. Every one of them is imported behind an ImportError guard or lazily.
rm -rf slim fa3 && mkdir -p slim fa3/vllm/vllm_flash_attn
(cd slim && unzip -q ../dl/vllm-"$version"-*.whl)
mv slim/vllm/vllm_flash_attn/_vllm_fa3_C.abi3.so fa3/vllm/vllm_flash_attn/
rm -rf slim/vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so slim/vllm/_moe_C*.so slim/vllm/third_party/deep_gemm \
       slim/vllm/third_party/fmha_sm100 slim/vllm/vllm-rs slim/vllm/entrypoints/serve/instrumentator/static
tar -cf - -C slim . | xz -T0 -6 > out/vllm.tar.xz
tar -cf - -C fa3 vllm | xz -T0 -4 > out/fa3.tar.xz
for f in out/vllm.tar.xz out/fa3.tar.xz; do
  split -b "$limit" -d -a 2 "$f" "$f.part_" && rm "$f"
done
cp wheels/*.whl out/
cp "$here/gpu-install.sh" out/

# Pack the files into bundles c1..cN of at most $limit bytes each (a larger single file alone), largest first.
python3 - "$limit" "$reuse" <<'PY'
import glob
import os
import shutil
import sys

limit = int(sys.argv[1])
have = {os.path.basename(f): os.path.getsize(f) for f in glob.glob(os.path.join(sys.argv[2], "c*", "*.whl"))} if sys.argv[2] else {}
reused = sorted(f for f in os.listdir("out") if have.get(f) == os.path.getsize(os.path.join("out", f)))
for f in reused:
    os.remove(os.path.join("out", f))
files = sorted(os.listdir("out"), key=lambda f: -os.path.getsize(os.path.join("out", f)))
bins: list[list[str]] = []
sizes: list[int] = []
for f in files:
    size = os.path.getsize(os.path.join("out", f))
    for i, used in enumerate(sizes):
        if used + size <= limit:
            bins[i].append(f)
            sizes[i] += size
            break
    else:
        bins.append([f])
        sizes.append(size)
for i, names in enumerate(bins, 1):
    os.makedirs(f"c{i}")
    for f in names:
        shutil.move(os.path.join("out", f), os.path.join(f"c{i}", f))
if reused:
    with open("c1/reuse.txt", "w") as fh:
        fh.write("\n".join(reused) + "\n")
print(f"{len(bins)} bundles:", ", ".join(f"c{i} {s / 1e6:.1f} MB" for i, s in enumerate(sizes, 1)),
      f"({len(reused)} wheels reused from {sys.argv[2]})" if reused else "")
PY
rm -rf dl wheels slim fa3 out
echo "vLLM $version staged in $dir: copy each c*/ into /tmp/stage/ on the GPU machine, then bash /tmp/stage/gpu-install.sh"
