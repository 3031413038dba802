"""Issue #24: how long the first HybridPDDeployment takes to turn Ready after `helm install` on a cluster that has
never seen the CRD, against a CR created a minute later on the same cluster (discovery long caught up).

Per round: a fresh local control plane (etcd + kube-apiserver + controller-manager + scheduler + kwok GPU nodes,
hpd_devcluster), `helm install` of charts/hybrid-pd-operator (CRD included), the operator from this checkout as the
chart's ServiceAccount (what `make demo` does), `kubectl apply` of examples/nemotron-3-nano.yaml at once, then a
second CR (same spec, another name) 60 s after the first turned Ready. Times are measured on this machine's
monotonic clock by polling the CR (0.1 s): from the end of `helm install` and from the CR's creation to Ready=True.
The operator's own counters tell whether the round met the admission race (children refused blockOwnerDeletion, 403,
and written without it: `hpd_operator_owner_references_deferred_total`).

    python bench/fresh_install/run.py [--rounds 5] [--later 60] [--out bench/results/<date>-fresh-install.json]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shlex
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client, config
from prometheus_client.parser import text_string_to_metric_families

from hpd_devcluster import lifecycle
from hpd_devcluster.build import binaries

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "hybrid-pd-operator"
SEED = REPO / "examples" / "nemotron-3-nano.yaml"
RELEASE, RELEASE_NS = "hpd", "hpd-system"
G, V, P = "hybridpd.io", "v1alpha1", "hybridpddeployments"


def api_of(kubeconfig: Path) -> client.ApiClient:
    cfg = client.Configuration()
    config.load_kube_config(config_file=str(kubeconfig), client_configuration=cfg)
    return client.ApiClient(cfg)


def run(*argv: str, kubeconfig: Path) -> None:
    subprocess.run(
        argv, env={**os.environ, "KUBECONFIG": str(kubeconfig)}, check=True, capture_output=True, timeout=300
    )


def sa_kubeconfig(admin: Path, out: Path) -> Path:
    """The chart's ServiceAccount with a TokenRequest token (the demo's hack/demo.sh does the same with kubectl)."""
    sys.path.insert(0, str(REPO / "tests"))
    from chart.helmkit import sa_kubeconfig as make

    return make(admin, RELEASE_NS, f"{RELEASE}-hybrid-pd-operator", out)


def ready_at(api: client.ApiClient, ns: str, name: str, deadline_s: float) -> float:
    custom = client.CustomObjectsApi(api)
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        try:
            cr = custom.get_namespaced_custom_object(G, V, ns, P, name)
        except client.ApiException:
            cr = {}
        conds = (cr.get("status") or {}).get("conditions") or []
        if any(c["type"] == "Ready" and c["status"] == "True" for c in conds):
            return time.monotonic()
        time.sleep(0.1)
    raise TimeoutError(f"{ns}/{name} not Ready within {deadline_s:.0f} s")


def counters(port: int) -> dict[str, float]:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    out: dict[str, float] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name in ("hpd_operator_owner_references_deferred_total", "workqueue_retries_total"):
                out[s.name] = out.get(s.name, 0.0) + s.value
            if s.name == "hpd_operator_api_errors_total" and s.labels.get("operation") == "apply":
                key = f"apply_errors_{s.labels.get('code')}"
                out[key] = out.get(key, 0.0) + s.value
    return out


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def one_round(i: int, later_s: float, work: Path) -> dict[str, Any]:
    bins = binaries()
    with lifecycle.running(f"fresh-bench-{os.getpid()}-{i}") as state:
        kubeconfig = Path(state.kubeconfig)
        api = api_of(kubeconfig)
        run(
            str(bins.helm),
            "install",
            RELEASE,
            str(CHART),
            "-n",
            RELEASE_NS,
            "--create-namespace",
            kubeconfig=kubeconfig,
        )
        installed = time.monotonic()
        # the chart's default rbac.fence: the operator writes only in namespaces opted in by this label
        client.CoreV1Api(api).patch_namespace(
            "default", {"metadata": {"labels": {"hybridpd.io/operator-writes": "allowed"}}}
        )
        port, log = free_port(), work / f"operator-{i}.log"
        sa = sa_kubeconfig(kubeconfig, work / f"operator-{i}.kubeconfig")
        with log.open("wb") as f:
            op = subprocess.Popen(
                [sys.executable, "-m", "hpd_operator", "run", "--liveness-port", "0", "--metrics-port", str(port)],
                env={**os.environ, "KUBECONFIG": str(sa)}, stdout=f, stderr=subprocess.STDOUT, cwd=REPO,
            )  # fmt: skip
        try:
            run(str(bins.kubectl), "apply", "-n", "default", "-f", str(SEED), kubeconfig=kubeconfig)
            created = time.monotonic()
            first = ready_at(api, "default", "nemotron-3-nano", 600)
            race = counters(port)
            time.sleep(later_s)
            doc = yaml.safe_load(SEED.read_text())
            doc["metadata"]["name"] = "later"
            client.CustomObjectsApi(api).create_namespaced_custom_object(G, V, "default", P, doc)
            later_created = time.monotonic()
            later = ready_at(api, "default", "later", 600)
        finally:
            op.terminate()
            op.wait(30)
    return {
        "round": i,
        "install_to_ready_s": round(first - installed, 2),
        "create_to_ready_s": round(first - created, 2),
        "later_create_to_ready_s": round(later - later_created, 2),
        "operator_counters_at_first_ready": race,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--later", type=float, default=60.0, help="seconds after the first Ready to create the second CR")
    ap.add_argument("--out", type=Path, default=None)
    ns = ap.parse_args()
    work = Path(os.environ.get("TMPDIR", "/tmp")) / f"fresh-install-{os.getpid()}"
    work.mkdir(parents=True, exist_ok=True)
    rounds = [one_round(i, ns.later, work) for i in range(ns.rounds)]
    for r in rounds:
        print(json.dumps(r), flush=True)

    def median(key: str) -> float:
        return round(statistics.median(r[key] for r in rounds), 2)

    result = {
        "what": "first CR after helm install on a fresh cluster vs a CR created later (issue #24)",
        "command": "python " + shlex.join(["bench/fresh_install/run.py", *sys.argv[1:]]),
        "date": datetime.date.today().isoformat(),
        "machine": {"cpus": os.cpu_count()},
        "rounds": rounds,
        "median_install_to_ready_s": median("install_to_ready_s"),
        "median_create_to_ready_s": median("create_to_ready_s"),
        "median_later_create_to_ready_s": median("later_create_to_ready_s"),
        "rounds_that_met_the_admission_race": sum(
            1
            for r in rounds
            if r["operator_counters_at_first_ready"].get("hpd_operator_owner_references_deferred_total")
        ),
    }
    result["ratio_first_vs_later"] = round(
        result["median_create_to_ready_s"] / result["median_later_create_to_ready_s"], 2
    )
    text = json.dumps(result, indent=2)
    print(text)
    if ns.out is not None:
        ns.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
