"""Helpers for the cluster tests: kubectl, the seed CR, reads of CRs/children/Events, waits with deadlines."""

from __future__ import annotations

import os
import socket
import subprocess
import time
import urllib.request
from collections.abc import Callable, Collection
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client
from prometheus_client.parser import text_string_to_metric_families

from hpd_devcluster.testing import _DESCRIBERS, seen, wait_for
from hpd_runtime import contract

REPO = Path(__file__).resolve().parents[2]
CRD = REPO / "crds" / "hybridpddeployments.hybridpd.io.yaml"
SEED = REPO / "examples" / "nemotron-3-nano.yaml"
G, V, P = contract.GROUP, contract.VERSION, contract.PLURAL
RESYNC = "1.5"
T = 45  # seconds: the deadline of one wait


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def bound_port(path: Path, proc: subprocess.Popen[bytes], timeout: float = 60.0) -> int:
    """The port `proc` bound and then wrote to `path` (the operator's `run --metrics-port-file`): the OS picked it
    while binding, so no other process can take it between a pick and a bind (as with free_port()). Waited for while
    `proc` runs; its exit before writing fails loudly."""
    deadline = time.monotonic() + timeout
    while True:
        text = path.read_text() if path.exists() else ""  # written atomically (a rename): empty or whole
        if text.strip():
            return int(text)
        if proc.poll() is not None:
            raise RuntimeError(f"the process exited with {proc.returncode} before it wrote its port to {path}")
        if time.monotonic() > deadline:
            raise TimeoutError(f"no port in {path} after {timeout} s")
        time.sleep(0.05)


def kubectl_bin() -> str:
    from hpd_devcluster.build import binaries

    return str(binaries().kubectl)


def kubectl(kubeconfig: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [kubectl_bin(), *args],
        env={**os.environ, "KUBECONFIG": str(kubeconfig)},
        capture_output=True,
        text=True,
        check=check,
        timeout=60,
    )


# --- helpers -------------------------------------------------------------------------------------------------
def seed(name: str = "nemotron-3-nano") -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load(SEED.read_text())
    doc["metadata"]["name"] = name
    return doc


def create(api: client.ApiClient, ns: str, doc: dict[str, Any]) -> None:
    client.CustomObjectsApi(api).create_namespaced_custom_object(G, V, ns, P, doc)


def get_cr(api: client.ApiClient, ns: str, name: str) -> dict[str, Any]:
    out: dict[str, Any] = client.CustomObjectsApi(api).get_namespaced_custom_object(G, V, ns, P, name)
    return out


def patch_spec(api: client.ApiClient, ns: str, name: str, spec: dict[str, Any]) -> None:
    client.CustomObjectsApi(api).patch_namespaced_custom_object(G, V, ns, P, name, {"spec": spec})


def cond(cr: dict[str, Any], ctype: str) -> dict[str, Any]:
    for c in (cr.get("status") or {}).get("conditions") or []:
        if c["type"] == ctype:
            return dict(c)
    return {}


def deployment(api: client.ApiClient, ns: str, name: str) -> client.V1Deployment:
    return client.AppsV1Api(api).read_namespaced_deployment(name, ns)


def container_of(dep: client.V1Deployment) -> client.V1Container:
    return dep.spec.template.spec.containers[0]


def env_of(c: client.V1Container) -> dict[str, Any]:
    return {e.name: (e.value if e.value_from is None else e.value_from) for e in c.env}


def arg(args: list[str], flag: str) -> str | None:
    return args[args.index(flag) + 1] if flag in args else None


def child_listers(api: client.ApiClient) -> dict[str, Callable[..., Any]]:
    """Kind -> the namespaced list call, for every child kind the operator makes here (PodMonitors are not served)."""
    core, apps, rbac = client.CoreV1Api(api), client.AppsV1Api(api), client.RbacAuthorizationV1Api(api)
    pol, net = client.PolicyV1Api(api), client.NetworkingV1Api(api)
    return {
        "Deployment": apps.list_namespaced_deployment,
        "Service": core.list_namespaced_service,
        "Lease": client.CoordinationV1Api(api).list_namespaced_lease,
        "ServiceAccount": core.list_namespaced_service_account,
        "Role": rbac.list_namespaced_role,
        "RoleBinding": rbac.list_namespaced_role_binding,
        "PodDisruptionBudget": pol.list_namespaced_pod_disruption_budget,
        "NetworkPolicy": net.list_namespaced_network_policy,
    }


def children(api: client.ApiClient, ns: str, name: str) -> dict[str, list[str]]:
    sel = f"{contract.LABEL_INSTANCE}={name},{contract.LABEL_MANAGED_BY}={contract.MANAGED_BY}"
    return {k: sorted(o.metadata.name for o in f(ns, label_selector=sel).items) for k, f in child_listers(api).items()}


EXPECTED = {
    "Deployment": ["{n}-decode-{g}", "{n}-prefill-{g}", "{n}-router"],
    "Service": ["{n}", "{n}-decode-{g}", "{n}-prefill-{g}"],
    "Lease": ["{n}-kv-reporter"],
    "ServiceAccount": ["{n}-kv-reporter", "{n}-router"],
    "Role": ["{n}-kv-reporter", "{n}-router"],
    "RoleBinding": ["{n}-kv-reporter", "{n}-router"],
    "PodDisruptionBudget": [],
    "NetworkPolicy": ["{n}-engines", "{n}-router"],
}
"""A CR's children when one generation `{g}` of its engines runs (docs/rollouts.md)."""


def expected(name: str, gen: str, **extra: list[str]) -> dict[str, list[str]]:
    """The children of CR `name` running generation `gen` (its hash) alone; `extra` replaces a kind's list."""
    out = {k: sorted(x.format(n=name, g=gen) for x in v) for k, v in EXPECTED.items()}
    for k, v in extra.items():
        out[k] = sorted(x.format(n=name, g=gen) for x in v)
    return out


def generation(doc: dict[str, Any], namespace: str) -> str:
    """The generation (hash) the operator runs for `doc`, from what `render` builds for it (not from the CR's
    status): the operator in these tests runs with the default images, as render does."""
    from hpd_operator.render import render

    doc = {**doc, "metadata": {**doc["metadata"], "namespace": namespace}}
    deps = [m for m in render([doc]) if m["kind"] in ("Deployment", "LeaderWorkerSet")]
    return str(next(d for d in deps if d["metadata"]["labels"].get(contract.LABEL_COMPONENT) == "prefill")
               ["metadata"]["labels"][contract.LABEL_GENERATION])  # fmt: skip


def serving(api: client.ApiClient, ns: str, name: str) -> str:
    """The generation (hash) the router of CR `name` routes to, from its Deployment's label."""
    dep = client.AppsV1Api(api).read_namespaced_deployment(f"{name}-router", ns)
    return str(dep.metadata.labels[contract.LABEL_GENERATION])


def engine_deployment(api: client.ApiClient, ns: str, name: str, role: str) -> client.V1Deployment:
    """The `role` Deployment of the generation CR `name` serves (`<name>-<role>-<hash>`)."""
    return deployment(api, ns, f"{name}-{role}-{serving(api, ns, name)}")


def wait_cr(
    api: client.ApiClient, ns: str, name: str, pred: Callable[[dict[str, Any]], bool], what: str, *, timeout: float = T
) -> dict[str, Any]:
    """Poll the CR until `pred(cr)`; returns that CR."""

    last: list[dict[str, Any]] = []

    def check() -> dict[str, Any] | None:
        cr = get_cr(api, ns, name)
        last[:] = [cr]
        return cr if pred(cr) else None

    def show() -> str:
        return f"{name}'s last status: {cr_status(last[0]) if last else '(never read)'}"

    return wait_for(check, timeout, what=what, show=show)


def wait_ready(api: client.ApiClient, ns: str, name: str, want: str = "True", timeout: float = T) -> dict[str, Any]:
    return wait_cr(
        api, ns, name, lambda c: cond(c, "Ready").get("status") == want, f"{name} Ready={want}", timeout=timeout
    )


def events(api: client.ApiClient, ns: str, name: str) -> list[client.CoreV1Event]:
    """Events about the object `name` in `ns`."""
    return list(client.CoreV1Api(api).list_namespaced_event(ns, field_selector=f"involvedObject.name={name}").items)


def cr_warnings(api: client.ApiClient, ns: str, name: str) -> list[client.CoreV1Event]:
    """Warning Events about the CR `name`, not about another object of that name: the router's Service is `<cr>` too,
    and the controller-manager posts Warnings on Services (FailedToUpdateEndpointSlices) when a sync fails."""
    return [e for e in events(api, ns, name) if e.type == "Warning" and e.involved_object.kind == contract.KIND]


def hold(check: Callable[[], bool], seconds: float, what: str, interval: float = 0.3) -> None:
    """A negative claim held over time: `check()` must stay true for `seconds` (several resync rounds)."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        assert check(), "\n".join([f"{what}: no longer true", *(seen(d) for d in _DESCRIBERS)])
        time.sleep(interval)


def operator_metrics(port: int, **labels: str | Collection[str]) -> dict[str, float]:
    """The operator's own /metrics on 127.0.0.1:`port`, summed by sample name, over the samples whose labels match
    `labels` (each a value, or a collection of values any of which matches; a sample without the label does not)."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    want = {k: {v} if isinstance(v, str) else set(v) for k, v in labels.items()}
    out: dict[str, float] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if all(s.labels.get(k) in vs for k, vs in want.items()):
                out[s.name] = out.get(s.name, 0.0) + s.value
    return out


# --- what a timed-out wait prints (hpd_devcluster.testing.describing; pushed per test by tests/cluster/conftest.py) --
def cr_status(cr: dict[str, Any]) -> str:
    st = cr.get("status") or {}
    conds = "; ".join(
        f"{c.get('type')}={c.get('status')} {c.get('reason', '')}: {str(c.get('message', ''))[:300]}"
        for c in st.get("conditions") or []
    )
    return (
        f"generation {cr['metadata'].get('generation')} observedGeneration {st.get('observedGeneration')} "
        f"phase {st.get('phase')} rollout {st.get('rollout')} conditions [{conds}]"
    )


def snapshot(api: client.ApiClient, ns: str) -> str:
    """The namespace as a failed wait should show it: each CR's status, each workload's rollout counts, each pod's
    phase/node/readiness and the Events (newest last), one line each."""
    lines = [f"--- namespace {ns} at the deadline ---"]
    for cr in client.CustomObjectsApi(api).list_namespaced_custom_object(G, V, ns, P).get("items", []):
        lines.append(f"{contract.KIND} {cr['metadata']['name']}: {cr_status(cr)}")
    for d in client.AppsV1Api(api).list_namespaced_deployment(ns).items:
        st = d.status
        lines.append(
            f"Deployment {d.metadata.name}: spec.replicas {d.spec.replicas} generation {d.metadata.generation} "
            f"observed {st.observed_generation} replicas {st.replicas} updated {st.updated_replicas} "
            f"ready {st.ready_replicas} available {st.available_replicas}"
        )
    for pod in client.CoreV1Api(api).list_namespaced_pod(ns).items:
        ready = [c.status for c in pod.status.conditions or [] if c.type == "Ready"]
        gone = " deleting" if pod.metadata.deletion_timestamp else ""
        lines.append(f"Pod {pod.metadata.name}: {pod.status.phase}{gone} node {pod.spec.node_name} Ready {ready}")
    evs = client.CoreV1Api(api).list_namespaced_event(ns).items
    evs.sort(key=lambda e: e.last_timestamp or e.event_time or e.metadata.creation_timestamp)
    for e in evs[-40:]:
        obj = e.involved_object
        lines.append(f"Event {e.type} {e.reason} x{e.count or 1} {obj.kind}/{obj.name}: {(e.message or '')[:300]}")
    return "\n".join(lines)
