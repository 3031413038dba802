"""The chart's ValidatingAdmissionPolicy on Secrets a HybridPDDeployment references (admission.checkSecretReferences,
issue #32 item 3), rendered by the real helm and enforced by the real local apiserver.

A user who may create HybridPDDeployments but not read a Secret must not get that Secret into an engine pod through
the operator: every way a CR can name a Secret is refused for her, admitted once she may `get` that Secret, and
admitted for an admin. Requests are server-side dry runs as the user (`kubectl --as`), so no operator is needed."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
import yaml
from kubernetes import client

from hpd_devcluster.testing import wait_for

from .conftest import Cluster
from .helmkit import CHART, REPO, Helm, adopt_crd, find
from .test_rbac_proof import opt_in

SAMPLE = REPO / "examples" / "minimal.yaml"
USER = "alice@example.com"
AUTHOR = [{"apiGroups": ["hybridpd.io"], "resources": ["hybridpddeployments"],
           "verbs": ["get", "list", "create", "update", "patch"]}]  # fmt: skip
"""USER's Role in the namespace: HybridPDDeployments, and nothing on Secrets."""
SECRET = "hf-token"
OTHER = "db-password"


def _cr(name: str, **spec: Any) -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load(SAMPLE.read_text())
    doc["metadata"] = {"name": name}
    doc["spec"].update(spec)
    return doc


def _volume(vol: dict[str, Any]) -> dict[str, Any]:
    return {"decode": {"podTemplate": {"spec": {"volumes": [{"name": "v", **vol}]}}}}


REFERENCES: dict[str, Any] = {
    "secret-volume": lambda s: _volume({"secret": {"secretName": s}}),
    "projected-secret": lambda s: _volume(
        {"projected": {"sources": [{"configMap": {"name": "c"}}, {"secret": {"name": s}}]}}
    ),
    "csi-node-publish-secret": lambda s: _volume(
        {"csi": {"driver": "secrets-store.csi.k8s.io", "nodePublishSecretRef": {"name": s}}}
    ),
    "env-secret-key-ref": lambda s: {"env": [{"name": "X", "valueFrom": {"secretKeyRef": {"name": s, "key": "k"}}}]},
    "huggingface-token": lambda s: {
        "model": {"name": "nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-FP8", "source": {"huggingface": {"tokenSecretRef": {"name": s}}}}
    },
}  # fmt: skip
"""Every field through which a CR puts a Secret of its namespace into the engine pods."""


def test_the_policy_is_on_by_default_and_can_be_turned_off(helm: Helm) -> None:
    docs = helm.template()
    vap = find(docs, "ValidatingAdmissionPolicy", "hpd-hybrid-pd-operator-secret-references")
    assert vap["spec"]["failurePolicy"] == "Fail"
    assert vap["spec"]["matchConstraints"]["resourceRules"] == [
        {
            "apiGroups": ["hybridpd.io"],
            "apiVersions": ["*"],
            "operations": ["CREATE", "UPDATE"],
            "resources": ["hybridpddeployments"],  # not /status (the operator) nor /scale (an autoscaler)
        }
    ]
    binding = find(docs, "ValidatingAdmissionPolicyBinding", "hpd-hybrid-pd-operator-secret-references")
    assert binding["spec"] == {"policyName": vap["metadata"]["name"], "validationActions": ["Deny"]}
    off = helm.template("--set", "admission.checkSecretReferences=false")
    assert not [d for d in off if "secret-references" in d["metadata"]["name"]]


def kubectl_as(k8s: Cluster, user: str | None, ns: str, doc: dict[str, Any], verb: str = "create") -> tuple[bool, str]:
    """(admitted, stderr) of a server-side dry run of `doc` as `user` (None: the admin)."""
    who = ["--as", user] if user else []
    p = k8s.helm.kubectl(k8s.kubeconfig, verb, "--dry-run=server", "-n", ns, "-f", "-", *who, check=False,
                         stdin=json.dumps(doc))  # fmt: skip
    return p.returncode == 0, p.stderr


@pytest.fixture()
def installed(k8s: Cluster) -> Iterator[str]:
    """The chart installed with its defaults; a namespace where USER may write HybridPDDeployments, not Secrets."""
    rel, work = k8s.make_namespace("hpd-system"), k8s.make_namespace("team")
    adopt_crd(k8s.helm, k8s.kubeconfig, "hpd", rel)
    k8s.helm.run("install", "hpd", str(CHART), "-n", rel, kubeconfig=k8s.kubeconfig)
    opt_in(k8s.api, work)  # the default rbac.fence: else every CR created here is admitted with a warning
    core, rbac = client.CoreV1Api(k8s.api), client.RbacAuthorizationV1Api(k8s.api)
    for s in (SECRET, OTHER):
        core.create_namespaced_secret(
            work, client.V1Secret(metadata=client.V1ObjectMeta(name=s), string_data={"k": "v"})
        )
    rbac.create_namespaced_role(work, {"metadata": {"name": "hpd-author"}, "rules": AUTHOR})
    rbac.create_namespaced_role_binding(
        work,
        {
            "metadata": {"name": "hpd-author"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "hpd-author"},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": USER}],
        },
    )
    try:
        yield work
    finally:
        k8s.helm.run("uninstall", "hpd", "-n", rel, kubeconfig=k8s.kubeconfig, check=False)


def grant_get(k8s: Cluster, ns: str, secret: str) -> None:
    rbac = client.RbacAuthorizationV1Api(k8s.api)
    name = f"read-{secret}"
    rules = [{"apiGroups": [""], "resources": ["secrets"], "resourceNames": [secret], "verbs": ["get"]}]
    rbac.create_namespaced_role(ns, {"metadata": {"name": name}, "rules": rules})
    rbac.create_namespaced_role_binding(
        ns,
        {
            "metadata": {"name": name},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": USER}],
        },
    )


@pytest.mark.cluster
def test_a_cr_may_reference_only_secrets_its_author_may_read(k8s: Cluster, installed: str) -> None:
    ns = installed
    plain = _cr("plain")
    assert kubectl_as(k8s, USER, ns, plain) == (True, "")  # USER may create CRs: the Role works
    first = _cr("first", **REFERENCES["secret-volume"](SECRET))
    # the policy is live once the apiserver refuses (its informer syncs within a second or two)
    wait_for(lambda: not kubectl_as(k8s, USER, ns, first)[0], 30, what="the policy enforced")

    for kind, ref in REFERENCES.items():
        admitted, err = kubectl_as(k8s, USER, ns, _cr(f"r-{kind}", **ref(SECRET)))
        assert not admitted, f"{kind}: admitted for a user who may not get the Secret"
        assert (
            f"{USER} may not get every Secret that HybridPDDeployment r-{kind} references in namespace {ns} ({SECRET})"
            in err
        ), (kind, err)
        assert kubectl_as(k8s, None, ns, _cr(f"r-{kind}", **ref(SECRET))) == (True, ""), kind  # an admin may

    grant_get(k8s, ns, SECRET)
    for kind, ref in REFERENCES.items():
        ok = wait_for(lambda r=ref, k=kind: kubectl_as(k8s, USER, ns, _cr(f"r-{k}", **r(SECRET)))[0], 30, what=kind)
        assert ok
        admitted, err = kubectl_as(k8s, USER, ns, _cr(f"o-{kind}", **ref(OTHER)))
        assert not admitted and f"({OTHER})" in err, (kind, err)  # only the Secret she may read

    # an update by her of a CR naming a Secret she may not read is refused too (the whole spec is checked)
    theirs = _cr("theirs", **REFERENCES["env-secret-key-ref"](OTHER))
    k8s.helm.kubectl(k8s.kubeconfig, "create", "-n", ns, "-f", "-", stdin=json.dumps(theirs))
    patch = json.dumps({"spec": {"decode": {"replicas": 2}}})
    p = k8s.helm.kubectl(k8s.kubeconfig, "patch", "hpd", "theirs", "-n", ns, "--type=merge", "-p", patch,
                         "--dry-run=server", "--as", USER, check=False)  # fmt: skip
    assert p.returncode != 0 and f"({OTHER})" in p.stderr, p.stderr
    # ... while scaling through /scale (an autoscaler, `kubectl scale`) is not matched: no spec author's choice
    scale = {"apiGroups": ["hybridpd.io"], "resources": ["hybridpddeployments/scale"], "verbs": ["get", "patch"]}
    client.RbacAuthorizationV1Api(k8s.api).patch_namespaced_role("hpd-author", ns, {"rules": [*AUTHOR, scale]})

    def scaled() -> bool:
        p = k8s.helm.kubectl(k8s.kubeconfig, "scale", "hpd/theirs", "-n", ns, "--replicas=2", "--as", USER,
                             check=False)  # fmt: skip
        return p.returncode == 0

    wait_for(scaled, 30, what="kubectl scale as the user")
