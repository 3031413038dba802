"""Chart test helpers: the real helm (from the devcluster cache) with its config/cache/data in a temp dir, kubectl."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "hybrid-pd-operator"
CRD_FILE = REPO / "crds" / "hybridpddeployments.hybridpd.io.yaml"
CRD_NAME = "hybridpddeployments.hybridpd.io"


class Helm:
    """`helm` with an isolated HELM_*_HOME; `run` returns the CompletedProcess (check=False to inspect failures)."""

    def __init__(self, binary: Path, home: Path, kubectl: Path) -> None:
        self.binary, self.home, self.kubectl_binary = binary, home, kubectl

    def env(self, kubeconfig: Path | None = None) -> dict[str, str]:
        env = {
            **os.environ,
            "HELM_CACHE_HOME": str(self.home / "cache"),
            "HELM_CONFIG_HOME": str(self.home / "config"),
            "HELM_DATA_HOME": str(self.home / "data"),
        }
        if kubeconfig is not None:
            env["KUBECONFIG"] = str(kubeconfig)
        return env

    def run(
        self, *args: str, kubeconfig: Path | None = None, check: bool = True, timeout: float = 180
    ) -> subprocess.CompletedProcess[str]:
        p = subprocess.run(
            [str(self.binary), *args],
            env=self.env(kubeconfig),
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        if check and p.returncode != 0:
            raise AssertionError(f"helm {' '.join(args)} failed ({p.returncode}):\n{p.stdout}\n{p.stderr}")
        return p

    def template(
        self, *args: str, chart: Path = CHART, release: str = "hpd", namespace: str = "hpd-system"
    ) -> list[Any]:
        out = self.run("template", release, str(chart), "--namespace", namespace, *args).stdout
        return [d for d in yaml.safe_load_all(out) if d]

    def kubectl(
        self, kubeconfig: Path, *args: str, check: bool = True, stdin: str | None = None
    ) -> subprocess.CompletedProcess[str]:
        p = subprocess.run(
            [str(self.kubectl_binary), *args],
            env={**os.environ, "KUBECONFIG": str(kubeconfig)},
            capture_output=True,
            text=True,
            timeout=120,
            input=stdin,
            check=False,
        )
        if check and p.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)} failed ({p.returncode}):\n{p.stdout}\n{p.stderr}")
        return p


def find(docs: Sequence[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    hits = [d for d in docs if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)]
    assert len(hits) == 1, f"expected one {kind} {name or ''}, got {[d['metadata']['name'] for d in hits]}"
    return hits[0]


def kinds(docs: Sequence[dict[str, Any]]) -> list[str]:
    return sorted(d["kind"] for d in docs)


def adopt_crd(helm: Helm, kubeconfig: Path, release: str, namespace: str) -> None:
    """Make the CRD (applied from crds/ if absent) adoptable by `release`: the documented path for a cluster whose
    CRD was applied with kubectl before the chart (docs/install.md), and what lets every test install with crds.enabled."""
    helm.kubectl(kubeconfig, "apply", "--server-side", "--force-conflicts", "-f", str(CRD_FILE))
    helm.kubectl(
        kubeconfig, "annotate", "--overwrite", "crd", CRD_NAME,
        f"meta.helm.sh/release-name={release}", f"meta.helm.sh/release-namespace={namespace}",
    )  # fmt: skip
    helm.kubectl(kubeconfig, "label", "--overwrite", "crd", CRD_NAME, "app.kubernetes.io/managed-by=Helm")


def restore_crd(helm: Helm, kubeconfig: Path) -> None:
    """Put the committed CRD back exactly (PUT, not apply: fields another manager added go too). `replace` without
    --force updates in place; it never deletes the CRD or any CR."""
    helm.kubectl(kubeconfig, "replace", "-f", str(CRD_FILE))


def sa_kubeconfig(admin_kubeconfig: Path, namespace: str, service_account: str, out: Path) -> Path:
    """A kubeconfig that authenticates as the ServiceAccount with a token from the TokenRequest API (what a pod's
    projected token is), CA inlined so it works from inside a container too."""
    import base64

    from kubernetes import client, config

    cfg = client.Configuration()
    config.load_kube_config(config_file=str(admin_kubeconfig), client_configuration=cfg)
    core = client.CoreV1Api(client.ApiClient(cfg))
    req = client.AuthenticationV1TokenRequest(spec=client.V1TokenRequestSpec(audiences=[], expiration_seconds=3600))
    token = core.create_namespaced_service_account_token(service_account, namespace, req).status.token
    admin = yaml.safe_load(admin_kubeconfig.read_text())
    cluster = admin["clusters"][0]["cluster"]
    ca = Path(cluster["certificate-authority"]).read_bytes() if "certificate-authority" in cluster else None
    ca_data = base64.b64encode(ca).decode() if ca else cluster["certificate-authority-data"]
    user = f"system:serviceaccount:{namespace}:{service_account}"
    out.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [
                    {"name": "c", "cluster": {"server": cluster["server"], "certificate-authority-data": ca_data}}
                ],
                "users": [{"name": user, "user": {"token": token}}],
                "contexts": [{"name": "sa", "context": {"cluster": "c", "user": user}}],
                "current-context": "sa",
            }
        )
    )
    return out


Rule = tuple[str, str, str]
"""(apiGroup, resource[/subresource], verb)."""


def wait_rbac(api: Any, sa_namespace: str, service_account: str, namespace: str, want: dict[Rule, bool]) -> None:
    """Until the apiserver's authorizer answers every rule of `want` for the ServiceAccount in `namespace` as `want`
    says (SubjectAccessReview: the same RBAC cache the ServiceAccount's own requests meet). RBAC written a moment ago
    is not enforced at once: the authorizer follows Roles and bindings through a watch, so under load an operator
    started right after `helm install` (or after a Role was patched) met the rules as they were before (a 403 on the
    CR's status 1.5 s after the install, in a clean-clone CI run)."""
    from kubernetes import client

    from hpd_devcluster.testing import wait_for

    user = f"system:serviceaccount:{sa_namespace}:{service_account}"
    groups = ["system:serviceaccounts", f"system:serviceaccounts:{sa_namespace}", "system:authenticated"]
    authz = client.AuthorizationV1Api(api)

    def answers() -> dict[Rule, bool]:
        out = {}
        for group, resource, verb in want:
            res, _, sub = resource.partition("/")
            attrs = client.V1ResourceAttributes(namespace=namespace, group=group, resource=res, subresource=sub or None,
                                                verb=verb)  # fmt: skip
            spec = client.V1SubjectAccessReviewSpec(user=user, groups=groups, resource_attributes=attrs)
            review = authz.create_subject_access_review(client.V1SubjectAccessReview(spec=spec))
            out[(group, resource, verb)] = bool(review.status.allowed)
        return out

    seen: dict[Rule, bool] = {}

    def settled() -> bool:
        seen.update(answers())
        return seen == want

    wait_for(settled, 60, what=f"RBAC for {user} in {namespace} as wanted",
             show=lambda: {r: v for r, v in seen.items() if want[r] != v})  # fmt: skip
