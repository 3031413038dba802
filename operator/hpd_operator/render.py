"""`python -m hpd_operator render -f FILE [-o yaml|json]`: what the operator would apply, without a cluster.

Like `helm template`: reads every HybridPDDeployment in FILE (multi-document YAML or JSON; `-` = stdin),
validates it exactly as the operator does (schema -> profile) and prints the manifests. Until the builders
exist (`hpd_operator.builders.build_all(cr, profile) -> list[dict]`), it prints one
`hybridpd.io/v1alpha1 HybridPDProfile` document per CR and role: a render-only view of the profile, never applied.
An invalid spec prints the same text the operator puts into the `InvalidSpec` condition and exits 2.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, TextIO

import pydantic
import yaml

from hpd_operator.api import constants as c
from hpd_operator.api.models import HybridPDDeployment, with_default_images, with_default_pod_monitor_labels
from hpd_operator.api.rules import violations
from hpd_operator.errors import SpecError
from hpd_operator.profile import Profile, compute_profile
from hpd_operator.validation import validate
from hpd_runtime import contract

Manifest = dict[str, Any]
Builder = Callable[[HybridPDDeployment, Profile], list[Manifest]]
"""The hook the builders plug in: the typed CR and its profile -> every object to apply."""

PROFILE_KIND = "HybridPDProfile"


def parse_cr(
    obj: dict[str, Any],
    *,
    vllm_image: str = c.VLLM_IMAGE_TEMPLATE,
    router_image: str = c.DEFAULT_ROUTER_IMAGE,
    pod_monitor_labels: Mapping[str, str] | None = None,
) -> HybridPDDeployment:
    """Parse one CR dict; schema errors become a SpecError with camelCase field paths. Images the CR leaves out
    become the given defaults (the operator passes its `--vllm-image/--router-image`), and its
    `--pod-monitor-label`s go under the CR's own spec.monitoring.labels."""
    try:
        cr = HybridPDDeployment.model_validate(obj)
    except pydantic.ValidationError as err:
        raise SpecError.from_validation_error(err, prefix="") from None
    problems = violations("root", cr, "")  # metadata.name; the spec's checks run in validation.validate
    if problems:
        raise SpecError(problems)
    image_set = isinstance(obj.get("spec"), dict) and obj["spec"].get("image") is not None
    cr = with_default_images(cr, vllm_image=vllm_image, router_image=router_image, image_set=image_set)
    return with_default_pod_monitor_labels(cr, pod_monitor_labels or {})


class RenderError(Exception):
    """A CR in the input is invalid: `name` and the SpecError (its message is the InvalidSpec condition text)."""

    def __init__(self, name: str, error: SpecError) -> None:
        self.name, self.error = name, error
        super().__init__(f"{contract.KIND} {name}: {error.message}")


def profile_manifests(cr: HybridPDDeployment, profile: Profile) -> list[Manifest]:
    """The fallback 'builder': the profile per role, as render-only documents."""
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


def default_builder() -> Builder:
    """`hpd_operator.builders.build_all` when it exists, else the profile view."""
    try:
        from hpd_operator import builders
    except ImportError:  # pragma: no cover - the package always exists
        return profile_manifests
    build_all = getattr(builders, "build_all", None)
    return build_all if callable(build_all) else profile_manifests


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
    build = builder or default_builder()
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
