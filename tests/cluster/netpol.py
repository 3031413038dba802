"""NetworkPolicy evaluation without a network plugin: cyclonus (`analyze --mode query-traffic`, built once by
hpd_devcluster.build.ensure_cyclonus at the version pinned in hpd_devcluster/versions.py) decides whether each
connection is allowed by a set of NetworkPolicy objects, from the pods' and namespaces' labels alone.

    verdicts = evaluate(policies, [Traffic(src, dst, 8000, "http"), ...])   # [True, False, ...]
"""

from __future__ import annotations

import json
import re
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

_VERDICT = re.compile(r"IS ALLOWED\?\s*\|\s*(TRUE|FALSE)\b")


@dataclass(frozen=True)
class Pod:
    """A pod as NetworkPolicy sees it: its labels, its namespace and that namespace's labels, an address."""

    namespace: str
    namespace_labels: dict[str, str]
    labels: dict[str, str]
    ip: str

    def peer(self) -> dict[str, Any]:
        return {
            "Internal": {
                "PodLabels": self.labels,
                "NamespaceLabels": self.namespace_labels,
                "Namespace": self.namespace,
            },
            "IP": self.ip,
        }


@dataclass(frozen=True)
class Traffic:
    """One TCP connection from `source` to `destination`'s container port `port` (named `port_name`, or "")."""

    source: Pod
    destination: Pod
    port: int
    port_name: str = ""

    def as_json(self) -> dict[str, Any]:
        return {
            "Source": self.source.peer(),
            "Destination": self.destination.peer(),
            "Protocol": "TCP",
            "ResolvedPort": self.port,
            "ResolvedPortName": self.port_name,
        }


def evaluate(policies: list[dict[str, Any]], traffic: list[Traffic]) -> list[bool]:
    """Whether each connection is allowed (ingress at the destination AND egress at the source) under `policies`."""
    from hpd_devcluster.build import ensure_cyclonus

    with tempfile.TemporaryDirectory(prefix="hpd-netpol-") as tmp:
        pdir = Path(tmp) / "policies"
        pdir.mkdir()
        for i, pol in enumerate(policies):
            (pdir / f"{i:02d}.yaml").write_text(yaml.safe_dump(pol, sort_keys=False))
        tfile = Path(tmp) / "traffic.json"
        tfile.write_text(json.dumps([t.as_json() for t in traffic]))
        out = subprocess.run(
            [str(ensure_cyclonus()), "analyze", "--mode", "query-traffic", "--policy-path", str(pdir),
             "--traffic-path", str(tfile)],
            capture_output=True, text=True, timeout=120, check=False,
        )  # fmt: skip
    verdicts = [v == "TRUE" for v in _VERDICT.findall(out.stdout)]
    assert out.returncode == 0 and len(verdicts) == len(traffic), f"cyclonus failed:\n{out.stdout}\n{out.stderr}"
    return verdicts
