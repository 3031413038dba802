"""Names and selectors of a CR's children (pure): what `<cr>-prefill` is called, which labels select it, where its
endpoint is. The builders name what they make with these, and status, report and the handlers find it with them.

Children are the engines of each generation, `<cr>-prefill-<gen>` and `<cr>-decode-<gen>` (a Deployment, or a
LeaderWorkerSet for a role whose replica spans nodes; a headless Service, a PodDisruptionBudget; `<gen>` is the
generation's hash, hpd_operator.generations), and `<cr>-router` and the `<cr>` Service; every name and label value
is a DNS-1035 label of at most 63 characters (truncated with a short hash of the full name when longer).
"""

from __future__ import annotations

import hashlib

from hpd_runtime import contract

MAX_NAME = 63
"""DNS-1035 label length: Service names, label values and (for simplicity) every child name."""
MAX_GROUP_NAME = 47
"""A LeaderWorkerSet's name: LWS names each group's worker StatefulSet `<name>-<group>`, and a StatefulSet's pods carry
the label controller-revision-hash `<statefulset>-<hash of up to 10 chars>`, a label value of at most 63 chars:
63 - 11 - len("-1023") (replicas <= 1024) = 47."""


def short_name(base: str, suffix: str = "", limit: int = MAX_NAME) -> str:
    """`<base>-<suffix>` (or `<base>`), truncated with a short hash of the full name when over `limit` chars."""
    full = f"{base}-{suffix}" if suffix else base
    if len(full) <= limit:
        return full
    digest = hashlib.sha256(full.encode()).hexdigest()[:8]
    tail = f"-{digest}-{suffix}" if suffix else f"-{digest}"
    return base[: limit - len(tail)].rstrip("-.") + tail


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


def group_name(cr_name: str, role: str, generation: str | None = None) -> str:
    """`<cr>-prefill-<gen>` / `<cr>-decode-<gen>` as one generation's LeaderWorkerSet (a role whose replica spans
    nodes), at most MAX_GROUP_NAME chars; its pods are `<name>-<group>` (leader) and `<name>-<group>-<index>`
    (workers)."""
    return short_name(cr_name, f"{role}-{generation}" if generation else role, MAX_GROUP_NAME)


def serving_selector(cr_name: str, role: str, generation: str | None, leaders_only: bool) -> dict[str, str]:
    """The pods of a role that serve vLLM's API in one generation (the router's discovery, the role's headless
    Service: decode's pair check): every pod of a one-pod replica, the leaders of replicas that span nodes
    (`leaders_only`: workers serve no API)."""
    out = selector_labels(cr_name, role, generation)
    if leaders_only:
        out[contract.LABEL_GROUP_ROLE] = contract.GROUP_LEADER
    return out


def router_name(cr_name: str) -> str:
    """`<cr>-router`: the router's Deployment, ServiceAccount, Role and RoleBinding."""
    return short_name(cr_name, contract.COMPONENT_ROUTER)


def kv_reporter_name(cr_name: str) -> str:
    """`<cr>-kv-reporter`: the decode pods' ServiceAccount, Role, RoleBinding and the Lease their KV path reports
    go into (hpd_runtime/kube_events.py)."""
    return short_name(cr_name, "kv-reporter")


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
