"""Names and selectors of a CR's children (pure): what `<cr>-prefill` is called, which labels select it, where its
endpoint is. The builders name what they make with these, and status, report and the handlers find it with them.

Children are the engines of each generation, `<cr>-prefill-<gen>` and `<cr>-decode-<gen>` (Deployment, headless
Service, PodDisruptionBudget; `<gen>` is the generation's hash, hpd_operator.generations), and `<cr>-router` and the
`<cr>` Service; every name and label value is a DNS-1035 label of at most 63 characters (truncated with a short hash
of the full name when longer).
"""

from __future__ import annotations

import hashlib

from hpd_runtime import contract

MAX_NAME = 63
"""DNS-1035 label length: Service names, label values and (for simplicity) every child name."""


def short_name(base: str, suffix: str = "") -> str:
    """`<base>-<suffix>` (or `<base>`), truncated with a short hash of the full name when over 63 chars."""
    full = f"{base}-{suffix}" if suffix else base
    if len(full) <= MAX_NAME:
        return full
    digest = hashlib.sha256(full.encode()).hexdigest()[:8]
    tail = f"-{digest}-{suffix}" if suffix else f"-{digest}"
    return base[: MAX_NAME - len(tail)].rstrip("-.") + tail


def instance_label(cr_name: str) -> str:
    """The `app.kubernetes.io/instance` value (a label value is at most 63 chars)."""
    return short_name(cr_name)


def selector_labels(cr_name: str, component: str, generation: str | None = None) -> dict[str, str]:
    """Selectors use instance + component (they are immutable on Deployments), and for the engines of one generation
    its hash: the router's discovery, the headless Services and the Deployments select one generation only."""
    out = {contract.LABEL_INSTANCE: instance_label(cr_name), contract.LABEL_COMPONENT: component}
    if generation is not None:
        out[contract.LABEL_GENERATION] = generation
    return out


def selector_string(cr_name: str, component: str) -> str:
    """`k=v,k=v` (status.<role>.selector for the scale subresource)."""
    return ",".join(f"{k}={v}" for k, v in selector_labels(cr_name, component).items())


def role_name(cr_name: str, role: str, generation: str | None = None) -> str:
    """`<cr>-prefill-<gen>` / `<cr>-decode-<gen>`: one generation's Deployment, headless Service and
    PodDisruptionBudget (`<cr>-<role>` without a generation: what an operator before generations named them)."""
    return short_name(cr_name, f"{role}-{generation}" if generation else role)


def prefill_service_host(cr_name: str, namespace: str | None, generation: str | None) -> str:
    """The DNS name of a generation's prefill headless Service (decode's pair check resolves it to the Ready
    prefill pods of its own generation only)."""
    return role_name(cr_name, "prefill", generation) + (f".{namespace}.svc" if namespace else "")


def router_name(cr_name: str) -> str:
    """`<cr>-router`: the router's Deployment, ServiceAccount, Role and RoleBinding."""
    return short_name(cr_name, contract.COMPONENT_ROUTER)


def endpoint_service_name(cr_name: str) -> str:
    """`<cr>`: the router's Service, the CR's one endpoint."""
    return short_name(cr_name)


def endpoint_url(cr_name: str, namespace: str, port: int) -> str:
    return f"http://{endpoint_service_name(cr_name)}.{namespace}.svc:{port}"


def component_names(cr_name: str, generation: str | None) -> dict[str, str]:
    """Component (prefill, decode, router) -> its Deployment's name, the engines' of `generation`."""
    out: dict[str, str] = {role: role_name(cr_name, role, generation) for role in contract.ROLES}
    out[contract.COMPONENT_ROUTER] = router_name(cr_name)
    return out
