"""Run inside an image (stdlib only): run each command given as a JSON argv list, report what the tests assert on.

python3 /tmp/probe.py '["python3", "-m", "hpd_runtime", "--help"]' ...   -> one JSON line on stdout
"""

import importlib.metadata
import importlib.util
import json
import os
import subprocess
import sys


def version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


report = {
    "uid": os.getuid(),
    "home": os.environ.get("HOME"),
    "modules": {m: importlib.util.find_spec(m) is not None for m in ("hpd_devcluster", "kopf", "hpd_runtime")},
    "versions": {d: version(d) for d in ("hybrid-pd-operator", "vllm-router", "nixl", "torch")},
    "commands": [],
}
for arg in sys.argv[1:]:
    argv = json.loads(arg)
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    report["commands"].append({"argv": argv, "rc": done.returncode, "stdout": done.stdout, "stderr": done.stderr})
print(json.dumps(report))
