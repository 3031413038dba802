"""The recorded CRD cases (tests/crd/cel_cases.py) against the REAL apiserver: every bad object is refused with the
recorded message (server-side dry run, so nothing is stored), every good one is admitted."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from hpd_runtime import contract

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "crd"))
from cel_cases import BAD_NAMES, BAD_SPECS, BAD_UPDATES, GOOD_SPECS

pytestmark = pytest.mark.cluster
CRD = Path(__file__).resolve().parents[2] / "crds" / "hybridpddeployments.hybridpd.io.yaml"
G, V, P = contract.GROUP, contract.VERSION, contract.PLURAL


@pytest.fixture(scope="module")
def crd_installed(kubeconfig: Path, api_client: client.ApiClient) -> None:
    from hpd_devcluster.build import binaries
    from hpd_devcluster.testing import wait_for

    env = {**os.environ, "KUBECONFIG": str(kubeconfig)}
    kubectl = str(binaries().kubectl)
    subprocess.run([kubectl, "apply", "--server-side", "--force-conflicts", "-f", str(CRD)], env=env, check=True,
                   capture_output=True, timeout=60)  # fmt: skip
    ext = client.ApiextensionsV1Api(api_client)

    def established() -> bool:
        conds = ext.read_custom_resource_definition(f"{P}.{G}").status.conditions or []
        return any(c.type == "Established" and c.status == "True" for c in conds)

    # polled, not `kubectl wait`: that fails at once when it runs before the CRD's first status (as it did when this
    # module was the first of its xdist worker to install the CRD), like the cluster tests' session `crd` fixture
    wait_for(established, 30, what="the CRD Established")


def dry_run(api: client.ApiClient, ns: str, name: str, spec: dict[str, Any]) -> str | None:
    """None when admitted, else the apiserver's message."""
    body = {"apiVersion": f"{G}/{V}", "kind": contract.KIND, "metadata": {"name": name}, "spec": spec}
    try:
        client.CustomObjectsApi(api).create_namespaced_custom_object(
            G, V, ns, P, body, dry_run="All", field_validation="Strict"
        )
    except client.ApiException as e:
        try:
            return str(json.loads(e.body).get("message", e.body))
        except (ValueError, TypeError):
            return str(e.body)
    return None


def test_every_recorded_bad_spec_is_refused_with_its_message(
    crd_installed: None, api_client: client.ApiClient, namespace: str
) -> None:
    wrong = []
    for case, spec, msg in BAD_SPECS:
        got = dry_run(api_client, namespace, "cel-case", spec)
        if got is None or msg not in got:
            wrong.append(f"{case}: expected {msg!r}, got {got!r}")
    assert not wrong, "\n".join(wrong)


def test_every_recorded_bad_name_is_refused(crd_installed: None, api_client: client.ApiClient, namespace: str) -> None:
    for rule, name, msg in BAD_NAMES:
        got = dry_run(api_client, namespace, name, {"model": {"name": "x/y"}})
        assert got is not None and msg in got, (rule, name, got)


def test_every_recorded_good_spec_is_admitted(
    crd_installed: None, api_client: client.ApiClient, namespace: str
) -> None:
    for case, spec in GOOD_SPECS:
        assert dry_run(api_client, namespace, "cel-good", spec) is None, case


def test_every_recorded_bad_update_is_refused_with_its_message(
    crd_installed: None, api_client: client.ApiClient, namespace: str
) -> None:
    """Transition rules: the object is admitted as created, the update is refused (dry run)."""
    api = client.CustomObjectsApi(api_client)
    for i, (case, before, after, msg) in enumerate(BAD_UPDATES):
        name = f"cel-update-{i}"
        body = {"apiVersion": f"{G}/{V}", "kind": contract.KIND, "metadata": {"name": name}, "spec": before}
        api.create_namespaced_custom_object(G, V, namespace, P, body)
        with pytest.raises(client.ApiException) as ei:
            api.patch_namespaced_custom_object(G, V, namespace, P, name, {"spec": after}, dry_run="All")
        assert msg in str(ei.value.body), (case, ei.value.body)
