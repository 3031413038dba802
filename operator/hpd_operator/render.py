"""`python -m hpd_operator render -f FILE [-o yaml|json]`: what the operator would apply, without a cluster.

Like `helm template`: reads every HybridPDDeployment in FILE (multi-document YAML or JSON; `-` = stdin), runs it
through exactly what the operator runs (parse -> validate -> profile -> build) and prints the manifests.
`profile_manifests` is another builder for the same hook: one render-only `hybridpd.io/v1alpha1 HybridPDProfile`
document per CR and role, the profile as data (never applied).
An invalid spec prints the same text the operator puts into the `InvalidSpec` condition and exits 2.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, TextIO

import yaml

from hpd_operator.api.models import HybridPDDeployment
from hpd_operator.api.parse import parse_cr
from hpd_operator.builders import build_all
from hpd_operator.errors import SpecError
from hpd_operator.profile import compute_profile
from hpd_operator.profile_model import Profile
from hpd_operator.validation import validate
from hpd_runtime import contract

Manifest = dict[str, Any]
Builder = Callable[[HybridPDDeployment, Profile], list[Manifest]]
"""The hook the builders plug in: the typed CR and its profile -> every object to apply."""

PROFILE_KIND = "HybridPDProfile"


class RenderError(Exception):
    """A CR in the input is invalid: `name` and the SpecError (its message is the InvalidSpec condition text)."""

    def __init__(self, name: str, error: SpecError) -> None:
        self.name, self.error = name, error
        super().__init__(f"{contract.KIND} {name}: {error.message}")


def profile_manifests(cr: HybridPDDeployment, profile: Profile) -> list[Manifest]:
    """A builder for the render hook: the profile per role, as render-only documents."""
    docs: list[Manifest] = []
    for role in contract.ROLES:
        rp = profile.role(role)
        docs.append(
            {
                "apiVersion": f"{contract.GROUP}/{contract.VERSION}",
                "kind": PROFILE_KIND,
                "metadata": {
                    "name": f"{cr.metadata.name}-{role}",
                    **({"namespace": cr.metadata.namespace} if cr.metadata.namespace else {}),
                    "annotations": {"hybridpd.io/render-only": "true"},
                },
                "role": role,
                "vllmVersion": profile.vllm_version,
                "versionRow": profile.row,
                "hybrid": profile.hybrid,
                "hybridReason": profile.hybrid_reason,
                "replicas": rp.replicas,
                "tensorParallelSize": rp.tensor_parallel_size,
                "command": ["vllm", "serve"],
                "args": list(rp.args),
                "env": rp.env_k8s(),
                "injections": [i.model_dump() for i in rp.injections],
            }
        )
    return docs


def load_documents(text: str) -> list[dict[str, Any]]:
    docs = [d for d in yaml.safe_load_all(text) if d is not None]
    out: list[dict[str, Any]] = []
    for d in docs:
        if isinstance(d, dict) and d.get("kind") == "List":
            out += [i for i in d.get("items", []) if isinstance(i, dict)]
        elif isinstance(d, dict):
            out.append(d)
    return [d for d in out if d.get("kind") == contract.KIND]


def render(objs: Iterable[dict[str, Any]], builder: Builder | None = None) -> list[Manifest]:
    """All manifests for the CRs; raises RenderError for the first invalid CR."""
    build = builder or build_all
    manifests: list[Manifest] = []
    for obj in objs:
        name = str((obj.get("metadata") or {}).get("name", "unnamed"))
        try:
            cr = parse_cr(obj)
            profile = compute_profile(validate(cr))
        except SpecError as err:
            raise RenderError(name, err) from None
        manifests += build(cr, profile)
    return manifests


def dump(manifests: list[Manifest], output: str, out: TextIO) -> None:
    if output == "json":
        json.dump({"apiVersion": "v1", "kind": "List", "items": manifests}, out, indent=2)
        out.write("\n")
    else:
        out.write(yaml.safe_dump_all(manifests, sort_keys=False, width=120))


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("render", help="print the objects the operator would apply for the CRs in a file")
    p.add_argument("-f", "--filename", required=True, help="YAML/JSON file with HybridPDDeployment(s); - = stdin")
    p.add_argument("-o", "--output", choices=("yaml", "json"), default="yaml")
    p.set_defaults(func=run)


def run(ns: argparse.Namespace, stdout: TextIO | None = None, stderr: TextIO | None = None) -> int:
    out, err = stdout or sys.stdout, stderr or sys.stderr
    try:
        text = sys.stdin.read() if ns.filename == "-" else Path(ns.filename).read_text()
    except OSError as e:
        print(f"error: cannot read {ns.filename}: {e.strerror}", file=err)
        return 1
    try:
        objs = load_documents(text)
    except yaml.YAMLError as e:
        print(f"error: {ns.filename} is not valid YAML: {e}", file=err)
        return 1
    if not objs:
        print(f"error: no {contract.KIND} in {ns.filename}", file=err)
        return 1
    try:
        manifests = render(objs)
    except RenderError as e:
        # First line names the CR; the rest is exactly the InvalidSpec condition message.
        print(f"error: {contract.KIND} {e.name} is invalid (reason InvalidSpec):", file=err)
        print(e.error.message, file=err)
        return 2
    dump(manifests, ns.output, out)
    return 0
