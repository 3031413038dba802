"""Pack the staged files of one or more vLLM versions into bundles of at most CAP bytes for the device calls (one
call carries 64 MiB with the checkout): files go in order, a file that does not fit is cut across bundles as
`NAME.chunkNN` (bench/gpu/dev-stage.sh joins them on the machine before gpu-install.sh).

    python3 bench/gpu/pack_bundles.py 55000000 .gpu/x20 0.20.0=.gpu/s020      # DIR: what stage.sh made (c1, c2, ...)
    for k in .gpu/x20/k*; do cp bench/gpu/dev-stage.sh $k/; done             # each call: bash .gpu/x20/kN/dev-stage.sh .gpu/x20/kN
"""

import os
import shutil
import sys

CAP = int(sys.argv[1])
out = sys.argv[2]
srcs = sys.argv[3:]  # VERSION=DIR(with c*/ subdirs)
files = []
for s in srcs:
    v, d = s.split("=")
    for c in sorted(os.listdir(d)):
        for f in sorted(os.listdir(os.path.join(d, c))):
            files.append((v, os.path.join(d, c, f)))
shutil.rmtree(out, ignore_errors=True)
k, used = 1, 0


def bdir(k, v):
    p = os.path.join(out, f"k{k}", v)
    os.makedirs(p, exist_ok=True)
    return p


for v, path in files:
    size = os.path.getsize(path)
    name = os.path.basename(path)
    if used + size <= CAP:
        shutil.copy(path, bdir(k, v))
        used += size
        continue
    with open(path, "rb") as fh:
        i = 0
        while True:
            room = CAP - used
            if room < 1_000_000:
                k, used = k + 1, 0
                room = CAP
            data = fh.read(room)
            if not data:
                break
            with open(os.path.join(bdir(k, v), f"{name}.chunk{i:02d}"), "wb") as o:
                o.write(data)
            used += len(data)
            i += 1
for b in sorted(os.listdir(out)):
    tot = sum(os.path.getsize(os.path.join(r, f)) for r, _, fs in os.walk(os.path.join(out, b)) for f in fs)
    print(b, tot)
