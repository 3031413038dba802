"""Labels, metadata and small helpers shared by the builders (pure); names and selectors: hpd_operator.api.names."""

from __future__ import annotations

from typing import Any

from hpd_operator.api.names import instance_label
from hpd_runtime import contract

Manifest = dict[str, Any]


def labels(cr_name: str, component: str) -> dict[str, str]:
    out = {
        contract.LABEL_NAME: contract.APP_NAME,
        contract.LABEL_INSTANCE: instance_label(cr_name),
        contract.LABEL_COMPONENT: component,
        contract.LABEL_MANAGED_BY: contract.MANAGED_BY,
        contract.LABEL_PART_OF: contract.APP_NAME,
    }
    if component in contract.ROLES:
        out[contract.LABEL_ROLE] = component
    return out


def metadata(cr_name: str, namespace: str | None, name: str, component: str) -> dict[str, Any]:
    md: dict[str, Any] = {"name": name, "labels": labels(cr_name, component)}
    if namespace:
        md["namespace"] = namespace
    return md


def deep_merge(base: Any, override: Any) -> Any:
    """Strategic-ish merge for podTemplate overrides: dicts recursively, lists of named dicts by `name`,
    anything else replaced by the override."""
    if isinstance(base, dict) and isinstance(override, dict):
        out = dict(base)
        for k, v in override.items():
            out[k] = deep_merge(base[k], v) if k in base else v
        return out
    if (
        isinstance(base, list)
        and isinstance(override, list)
        and all(isinstance(i, dict) and "name" in i for i in base + override)
    ):
        merged = {i["name"]: i for i in base}
        order = [i["name"] for i in base]
        for i in override:
            if i["name"] in merged:
                merged[i["name"]] = deep_merge(merged[i["name"]], i)
            else:
                merged[i["name"]] = i
                order.append(i["name"])
        return [merged[n] for n in order]
    return override


# Security settings written out although they equal Kubernetes' defaults: server-side apply then makes the operator
# their owner, so a hand edit of a child (`kubectl patch ... hostNetwork: true`) is drift that drift.mismatch sees
# and the forced re-apply takes back; a field the operator never sets would be left to whoever set it. The
# apiserver stores the pod-level false booleans not at all (omitempty), which drift.mismatch reads as equal, and
# `privileged: false` as written, so neither makes the drift check fire again.
POD_SECURITY_DEFAULTS: dict[str, Any] = {"hostNetwork": False, "hostPID": False, "hostIPC": False}
"""The pod shares no namespace with the node."""


def host_namespaces(host_pid: bool) -> dict[str, Any]:
    """What an engine pod changes of POD_SECURITY_DEFAULTS: `hostPID: true` only where the profile says so
    (spec.kvTransfer.processNamespace Host, hpd_operator.api.processns); nothing otherwise, so a CR that does not opt
    in renders exactly as before."""
    return {"hostPID": True} if host_pid else {}


def container_security_context(uid: int, **extra: Any) -> dict[str, Any]:
    """The restricted container securityContext of every child container (PSS `restricted`), owned field by field.
    The user, runAsNonRoot and seccompProfile repeat the pod's: a container's own value overrides the pod's, so a
    hand edit there (`runAsUser: 0` with `runAsNonRoot: false`, `seccompProfile: Unconfined`) is taken back too."""
    return {
        "privileged": False,
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"], "add": []},
        "runAsNonRoot": True,
        "runAsUser": uid,
        "runAsGroup": uid,
        "seccompProfile": {"type": "RuntimeDefault"},
        **extra,
    }
