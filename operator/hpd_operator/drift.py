"""Pure: whether a child must be applied, from its desired manifest and the cached (trimmed) live object.

A child is applied when it is missing, when its `contract.ANNOTATION_DESIRED_HASH` differs from the hash of the
desired manifest (the spec, the operator's defaults or its version changed), or when it drifted. The drift test
costs no request while nobody else touched the child:

1. `touched_by_others`: the child's managedFields (main resource, not status/scale) hold an entry of another
   manager (kubectl edit/apply/replace, a script, a controller) at least as new as the operator's own entry,
   other than one that only sets annotations the operator does not set (the Deployment controller's
   `deployment.kubernetes.io/revision`), or the child's generation moved since the operator last applied or
   verified it (handlers.needs_apply keeps that per process). Only then:
2. `mismatch`: the live object (one GET) is compared with the desired manifest: every field the operator sets has the
   value it sets (extra fields and apiserver defaults are fine; a list must have the same length). A mismatch is
   drift: re-apply (server-side apply with force takes the fields back).

Why not a plain compare of every cached child with its desired manifest: it needs the whole object cached (memory
at 1,000 CRs) and the apiserver's defaults and normalisations make it noisy; managedFields says for free whether
anyone but the operator wrote the object since the operator's own apply.

Limits: the managedFields time has 1 s resolution, hence "at least as new". An edit that only removes fields
leaves no managedFields entry: on kinds with a generation (Deployment, PodDisruptionBudget, NetworkPolicy) the
generation moves and the child is read back; on the others (Service, ServiceAccount, Role, RoleBinding) such an
edit is not seen until the desired manifest changes. A key added to an atomic map the operator sets (a Service's
selector) passes `mismatch` (extra keys are allowed), so it is not repaired either. A change that makes
`mismatch` fail but that the apply cannot undo (a field another manager owns), or a value the apiserver normalises
(a quantity written "0.5" read back "500m"), would re-apply on every reconcile; the caller remembers the signature
(other managers' newest write, generation) it verified or applied (`handlers._CHECKED`), so each such change costs
at most one GET and one apply per process (after a restart, once more). A child whose managers were all the operator is never read back: an edit by
anyone else shows in managedFields, and a deletion or a label removed shows in the watch.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

from hpd_runtime import contract


def desired_hash(obj: Mapping[str, Any]) -> str:
    """A stable hash of a desired manifest (without the hash annotation itself)."""
    md = dict(obj.get("metadata") or {})
    ann = {k: v for k, v in (md.get("annotations") or {}).items() if k != contract.ANNOTATION_DESIRED_HASH}
    md["annotations"] = ann
    text = json.dumps({**obj, "metadata": md}, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def stamped(obj: Mapping[str, Any]) -> dict[str, Any]:
    """`obj` with its hash annotation set (what is applied)."""
    out = dict(obj)
    md = dict(out.get("metadata") or {})
    md["annotations"] = {**(md.get("annotations") or {}), contract.ANNOTATION_DESIRED_HASH: desired_hash(obj)}
    out["metadata"] = md
    return out


def live_hash(live: Mapping[str, Any]) -> str | None:
    return ((live.get("metadata") or {}).get("annotations") or {}).get(contract.ANNOTATION_DESIRED_HASH)


def _annotations_only(fields: Any, ours: Mapping[str, Any]) -> bool:
    """A managedFields field set that only sets annotations the operator does not set."""
    if not isinstance(fields, Mapping) or set(fields) != {"f:metadata"}:
        return False
    meta = fields["f:metadata"]
    if not isinstance(meta, Mapping) or set(meta) - {"f:annotations"}:
        return False
    keys = {k.removeprefix("f:") for k in (meta.get("f:annotations") or {}) if k != "."}
    return not keys & set(ours)


def touched_by_others(live: Mapping[str, Any], desired: Mapping[str, Any]) -> str | None:
    """The newest time another manager wrote a field of the main resource that may be ours, if it is at least as
    new as the operator's own write (None: nobody else touched it since)."""
    entries = (live.get("metadata") or {}).get("managedFields") or []
    ours = [str(e.get("time") or "") for e in entries if e.get("manager") == contract.FIELD_MANAGER]
    mine = max(ours, default="")
    annotations = (desired.get("metadata") or {}).get("annotations") or {}
    newest: str | None = None
    for e in entries:
        if e.get("manager") == contract.FIELD_MANAGER or _annotations_only(e.get("fieldsV1"), annotations):
            continue
        when = str(e.get("time") or "")
        if when >= mine and (newest is None or when > newest):
            newest = when
    return newest


def foreign_env(desired: Mapping[str, Any], live: Mapping[str, Any]) -> dict[str, Any] | None:
    """A strategic merge patch that deletes the env entries another manager added to a container of a workload's pod
    template that the operator renders (None: there are none). Server-side apply cannot take them back (they are
    that manager's fields), and an env entry changes what the engines run without a new generation, so the operator
    removes them with an ordinary patch after its apply."""

    def containers(obj: Mapping[str, Any]) -> dict[str, list[Any]]:
        pod = ((obj.get("spec") or {}).get("template") or {}).get("spec") or {}
        return {str(c.get("name")): list(c.get("env") or []) for c in pod.get("containers") or []}

    ours, theirs = containers(desired), containers(live)
    patch = []
    for name, env in ours.items():
        keep = {str(e.get("name")) for e in env}
        extra = sorted({str(e.get("name")) for e in theirs.get(name, []) if str(e.get("name")) not in keep})
        if extra:
            patch.append({"name": name, "env": [{"name": n, "$patch": "delete"} for n in extra]})
    return {"spec": {"template": {"spec": {"containers": patch}}}} if patch else None


def mismatch(want: Any, got: Any, where: str = "") -> str | None:
    """The first path where `got` does not carry `want` (None: every desired field has its value)."""
    if isinstance(want, Mapping):
        if not isinstance(got, Mapping):
            return where or "."
        for k, v in want.items():
            if k not in got:
                if v in (False, None, 0, "", [], {}):
                    continue  # omitempty: the apiserver drops zero values
                return f"{where}.{k}"
            found = mismatch(v, got[k], f"{where}.{k}")
            if found is not None:
                return found
        return None
    if isinstance(want, list):
        if not isinstance(got, list) or len(got) != len(want):
            return where
        for i, (a, b) in enumerate(zip(want, got, strict=True)):
            found = mismatch(a, b, f"{where}[{i}]")
            if found is not None:
                return found
        return None
    if want == got or str(want) == str(got):
        return None
    return where
