"""A real kubelet runs what the operator renders (hpd_devcluster.realnode: kubelet 1.35 + containerd + CNI bridge).

The decode pod template comes from `python -m hpd_operator render` of examples/minimal.yaml, as the operator applies
it. Only what this machine forces is substituted (`on_the_real_node`): the image (a busybox image stands in for the
vLLM image, which needs a GPU), the commands of the container, probes and preStop hook (same kind, same timing), the
resources (no GPU, 2 cores) and the placement on the real node. Everything else is the operator's: the pod and
container securityContext in a Pod Security `restricted` namespace, the downward-API env and the env that depends on
it, the cache and /dev/shm volumes, the `<cr>-kv-reporter` ServiceAccount and its token, terminationGracePeriodSeconds.

Traffic: the tests' HTTP goes only to the pods' addresses on the node's own bridge (realnode.POD_CIDR).
"""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from hpd_devcluster import cluster, nodenet, realnode
from hpd_devcluster.testing import wait_for
from hpd_runtime import contract, kube_events

from .kube import REPO, kubectl_bin
from .kube import kubectl as _kubectl

CR = "minimal"
ENGINE_SCRIPT = r"""
echo env-begin; env | sort; echo env-end
if touch /root-write-probe 2>/dev/null; then echo root=writable; else echo root=read-only; fi
echo ok > /cache/write-probe && echo cache=writable
echo ok > /dev/shm/write-probe && echo shm=writable
echo "uid=$(id -u) gid=$(id -g)"
mkdir -p /cache/www && echo "$HPD_POD_IP" > /cache/www/ip && echo live > /cache/www/livez
trap 'echo term; exit 0' TERM
httpd -f -p "$HPD_RUNTIME_PORT" -h /cache/www &
echo serving
while true; do sleep 1 & wait $!; done
"""
"""The container: reports what the kubelet gave it, serves the runtime port (its liveness probe's /livez and the
pod IP it was told), turns Ready only when /cache/ready exists (the test makes it with `kubectl exec`)."""
PRESTOP = "echo prestop-begin > /proc/1/fd/1; sleep 2; echo prestop-end > /proc/1/fd/1"


@pytest.fixture(scope="module")
def real_node(devcluster: cluster.ClusterState) -> Iterator[realnode.RealNode]:
    node = realnode.start(devcluster)
    yield node
    realnode.stop(devcluster)


@pytest.fixture(scope="module")
def rendered() -> list[dict[str, Any]]:
    out = subprocess.run(
        [sys.executable, "-m", "hpd_operator", "render", "-f", str(REPO / "examples" / "minimal.yaml"), "-o", "json"],
        capture_output=True, text=True, check=True, cwd=REPO,
    )  # fmt: skip
    return list(json.loads(out.stdout)["items"])


@pytest.fixture()
def restricted_ns(api_client: client.ApiClient, rendered: list[dict[str, Any]]) -> Iterator[str]:
    """A Pod Security `restricted` namespace holding the CR's kv-reporter ServiceAccount, Role and RoleBinding."""
    core = client.CoreV1Api(api_client)
    name = f"rn-{uuid.uuid4().hex[:8]}"
    labels = {
        "pod-security.kubernetes.io/enforce": "restricted",
        "pod-security.kubernetes.io/enforce-version": "latest",
    }
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name, labels=labels)))
    wait_for(lambda: core.read_namespaced_service_account("default", name), 60, what="default ServiceAccount")
    for doc in rendered:
        if doc["kind"] in ("ServiceAccount", "Role", "RoleBinding") and doc["metadata"]["name"] == f"{CR}-kv-reporter":
            body = copy.deepcopy(doc)
            body["metadata"]["namespace"] = name
            if doc["kind"] == "ServiceAccount":
                core.create_namespaced_service_account(name, body)
            elif doc["kind"] == "Role":
                client.RbacAuthorizationV1Api(api_client).create_namespaced_role(name, body)
            else:
                client.RbacAuthorizationV1Api(api_client).create_namespaced_role_binding(name, body)
    yield name
    core.delete_namespace(name)


def role_template(rendered: list[dict[str, Any]], role: str = "decode") -> dict[str, Any]:
    deps = [
        d for d in rendered if d["kind"] == "Deployment" and d["metadata"]["labels"].get("hybridpd.io/role") == role
    ]
    assert len(deps) == 1, [d["metadata"]["name"] for d in rendered]
    return copy.deepcopy(deps[0]["spec"]["template"])  # type: ignore[no-any-return]


def decode_template(rendered: list[dict[str, Any]]) -> dict[str, Any]:
    return role_template(rendered, "decode")


def placed(template: dict[str, Any], name: str, image: str) -> dict[str, Any]:
    """The rendered pod on the real node: its image from the node's containerd, no GPU, a 2-core machine's share."""
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": template["metadata"]["labels"]},
           "spec": template["spec"]}  # fmt: skip
    spec = pod["spec"]
    spec["nodeSelector"] = {realnode.NODE_LABEL: "true"}
    spec["tolerations"] = [dict(realnode.TOLERATION)]
    (c,) = spec["containers"]
    c["image"], c["imagePullPolicy"] = image, "Never"
    c["resources"] = {"requests": {"cpu": "10m", "memory": "16Mi"}, "limits": {"memory": "512Mi"}}
    return pod


def on_the_real_node(template: dict[str, Any], name: str) -> dict[str, Any]:
    """The rendered pod with only what this machine forces substituted (see the module's docstring)."""
    pod = placed(template, name, realnode.TEST_IMAGE)
    (c,) = pod["spec"]["containers"]
    c["command"], c["args"] = ["/bin/sh", "-c", ENGINE_SCRIPT], []
    for probe in ("startupProbe", "readinessProbe"):
        assert "exec" in c[probe], f"the rendered {probe} is no longer an exec probe: {c[probe]}"
    c["startupProbe"]["exec"]["command"] = ["test", "-f", "/cache/www/livez"]
    c["readinessProbe"]["exec"]["command"] = ["cat", "/cache/ready"]
    c["lifecycle"]["preStop"]["exec"]["command"] = ["/bin/sh", "-c", PRESTOP]
    return pod


def start_pod(api: client.ApiClient, ns: str, pod: dict[str, Any]) -> client.V1Pod:
    core = client.CoreV1Api(api)
    core.create_namespaced_pod(ns, pod)
    name = pod["metadata"]["name"]

    def running() -> client.V1Pod | None:
        p = core.read_namespaced_pod(name, ns)
        return p if p.status.phase == "Running" and p.status.pod_ip else None

    return wait_for(running, 90, what=f"{ns}/{name} Running on the real node")


def kubectl(kubeconfig: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """kubectl that fails with its stderr in the message."""
    proc = _kubectl(kubeconfig, *args, check=False)
    assert proc.returncode == 0, f"kubectl {' '.join(args)}: exit {proc.returncode}: {proc.stderr}"
    return proc


def logs(kubeconfig: Path, ns: str, name: str) -> str:
    return kubectl(kubeconfig, "-n", ns, "logs", name).stdout


def is_ready(pod: client.V1Pod) -> bool:
    return any(c.type == "Ready" and c.status == "True" for c in pod.status.conditions or [])


def test_rendered_decode_pod_turns_ready_only_through_its_exec_probe(
    real_node: realnode.RealNode, api_client: client.ApiClient, kubeconfig: Path, restricted_ns: str,
    rendered: list[dict[str, Any]],
) -> None:  # fmt: skip
    ns, core = restricted_ns, client.CoreV1Api(api_client)
    template = decode_template(rendered)
    pod = start_pod(api_client, ns, on_the_real_node(template, "decode-0"))
    assert pod.spec.node_name == realnode.NODE_NAME
    assert pod.status.pod_ip.startswith(realnode.POD_CIDR.rsplit(".", 1)[0] + ".")

    # Not Ready while its readiness probe fails, and the probe's own words show in `kubectl describe pod`.
    def probe_failed() -> str | None:
        out = kubectl(kubeconfig, "-n", ns, "describe", "pod", "decode-0").stdout
        return out if "Readiness probe failed" in out and "/cache/ready" in out else None

    described = wait_for(probe_failed, 60, what="a failed readiness probe in kubectl describe pod")
    assert "No such file or directory" in described
    assert not is_ready(core.read_namespaced_pod("decode-0", ns))
    kubectl(kubeconfig, "-n", ns, "exec", "decode-0", "--", "touch", "/cache/ready")  # exec through the kubelet
    wait_for(lambda: is_ready(core.read_namespaced_pod("decode-0", ns)), 60, what="Ready after the probe passes")

    out = logs(kubeconfig, ns, "decode-0")
    env = dict(
        ln.split("=", 1) for ln in out.split("env-begin\n", 1)[1].split("env-end", 1)[0].splitlines() if "=" in ln
    )
    ip = pod.status.pod_ip
    assert env["HPD_POD_IP"] == ip, "the downward API's status.podIP"
    assert env["VLLM_NIXL_SIDE_CHANNEL_HOST"] == ip, "$(HPD_POD_IP) expanded by the kubelet"
    assert env["HPD_POD_NAME"] == "decode-0" and env["HPD_POD_NAMESPACE"] == ns
    sc = template["spec"]["containers"][0]["securityContext"]
    assert f"uid={sc['runAsUser']} gid={sc['runAsGroup']}" in out
    root = "read-only" if sc.get("readOnlyRootFilesystem") else "writable"
    assert f"root={root}" in out and "cache=writable" in out and "shm=writable" in out, out

    # The pod's network namespace, on the node's own bridge: the runtime port answers with the pod's own IP.
    port = env["HPD_RUNTIME_PORT"]
    with urllib.request.urlopen(f"http://{ip}:{port}/ip", timeout=5) as resp:
        assert resp.read().decode().strip() == ip


@pytest.mark.usefixtures("real_node")
def test_kubelet_projects_the_kv_reporter_token(
    api_client: client.ApiClient,
    restricted_ns: str,
    rendered: list[dict[str, Any]],
    devcluster: cluster.ClusterState,
    tmp_path: Path,
) -> None:  # fmt: skip
    ns, kubeconfig = restricted_ns, devcluster.kubeconfig
    start_pod(api_client, ns, on_the_real_node(decode_template(rendered), "decode-0"))
    token = kubectl(kubeconfig, "-n", ns, "exec", "decode-0", "--", "cat",
                    "/var/run/secrets/kubernetes.io/serviceaccount/token").stdout.strip()  # fmt: skip
    review = client.AuthenticationV1Api(api_client).create_token_review(
        client.V1TokenReview(spec=client.V1TokenReviewSpec(token=token))
    )
    assert review.status.authenticated, review.status.error
    assert review.status.user.username == f"system:serviceaccount:{ns}:{CR}-kv-reporter"
    uid = client.CoreV1Api(api_client).read_namespaced_pod("decode-0", ns).metadata.uid
    assert (review.status.user.extra or {}).get("authentication.kubernetes.io/pod-uid") == [uid], "a pod-bound token"

    # What that token may do, through the runtime's own reporter (hpd_runtime.kube_events, which runs in decode and
    # reaches the apiserver in-cluster; here from the host, since this node has no route to it): create the KVPath
    # Event about its pod; read nothing, not even its own pod.
    token_file = tmp_path / "token"
    token_file.write_text(token)
    target = kube_events.Target(devcluster.server, str(token_file), str(devcluster.pki / "ca.crt"), "decode-0", ns, uid)
    body = kube_events.event_body(target, "Normal", "real node token test", {}, time.time())
    assert kube_events.post(target, body) == 201
    reasons = [e.reason for e in client.CoreV1Api(api_client).list_namespaced_event(ns).items]
    assert contract.EVENT_REASON_KV_PATH in reasons
    cfg = client.Configuration(host=devcluster.server)
    cfg.ssl_ca_cert = str(devcluster.pki / "ca.crt")
    cfg.api_key = {"authorization": f"Bearer {token}"}
    with pytest.raises(client.ApiException) as denied:
        client.CoreV1Api(client.ApiClient(cfg)).read_namespaced_pod("decode-0", ns)
    assert denied.value.status == 403


def test_prestop_runs_before_sigterm_inside_the_grace_period(
    real_node: realnode.RealNode, api_client: client.ApiClient, kubeconfig: Path, restricted_ns: str,
    rendered: list[dict[str, Any]],
) -> None:  # fmt: skip
    ns, core = restricted_ns, client.CoreV1Api(api_client)
    pod = start_pod(api_client, ns, on_the_real_node(decode_template(rendered), "decode-0"))
    grace = pod.spec.termination_grace_period_seconds
    wait_for(lambda: "serving" in logs(kubeconfig, ns, "decode-0"), 30, what="the container serving")
    follow = subprocess.Popen([kubectl_bin(), "-n", ns, "logs", "-f", "decode-0"], stdout=subprocess.PIPE, text=True,
                              env={**os.environ, "KUBECONFIG": str(kubeconfig)})  # fmt: skip
    try:
        t0 = time.monotonic()
        core.delete_namespaced_pod("decode-0", ns)

        def gone() -> bool:
            try:
                core.read_namespaced_pod("decode-0", ns)
            except client.ApiException as exc:
                return exc.status == 404
            return False

        wait_for(gone, grace + 30, what="the pod gone")
        took = time.monotonic() - t0
        out, _ = follow.communicate(timeout=30)
    finally:
        follow.kill()
    lines = [ln for ln in out.splitlines() if ln in ("prestop-begin", "prestop-end", "term")]
    assert lines[-3:] == ["prestop-begin", "prestop-end", "term"], out[-2000:]
    assert took < grace, f"deletion took {took:.0f} s, grace {grace} s: the container was killed, not drained"


def test_rendered_prefill_runs_the_runtime_and_serves_after_its_warmup(
    real_node: realnode.RealNode, api_client: client.ApiClient, restricted_ns: str, rendered: list[dict[str, Any]]
) -> None:
    """The released vllm image's `hpd_runtime launch` (warmup, readiness server, the exec probe `hpd_runtime probe`)
    as the operator renders it, with the runtime tests' fake vLLM in place of vLLM (a test-only image variant)."""
    ns, core = restricted_ns, client.CoreV1Api(api_client)
    ref, archive = realnode.ensure_engine_standin()
    realnode.import_image(real_node, archive, ref)
    template = role_template(rendered, "prefill")
    pod = start_pod(api_client, ns, placed(template, "prefill-0", ref))
    env = {e["name"]: e.get("value") for e in template["spec"]["containers"][0]["env"]}
    base = f"http://{pod.status.pod_ip}:{env['HPD_VLLM_PORT']}"
    wait_for(lambda: is_ready(core.read_namespaced_pod("prefill-0", ns)), 180, what="prefill Ready on the real node")

    with urllib.request.urlopen(f"{base}/_requests", timeout=5) as resp:
        warmup = [r for r in json.load(resp) if r.get("path") == "/v1/completions"]
    assert warmup, "Ready before the runtime's warmup sent any completion"
    body = json.dumps({"model": env["HPD_MODEL"], "prompt": [1, 2, 3, 4], "max_tokens": 3}).encode()
    req = urllib.request.Request(f"{base}/v1/completions", data=body, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as resp:
        answer = json.load(resp)
    assert answer["choices"] and answer["usage"]["completion_tokens"] == 3, answer


def get_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=10) as resp:
        return json.load(resp)


def post_json(url: str, body: dict[str, Any]) -> Any:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as resp:
        return json.load(resp)


def test_decode_turns_ready_after_its_pair_check_with_a_real_prefill_pod(
    real_node: realnode.RealNode, api_client: client.ApiClient, restricted_ns: str, rendered: list[dict[str, Any]]
) -> None:
    """Decode's runtime pairs with a prefill pod over the pods' network (decode pod -> prefill pod) before Ready,
    finding it by the rendered headless prefill Service's name (the node's CoreDNS)."""
    ns, core = restricted_ns, client.CoreV1Api(api_client)
    ref, archive = realnode.ensure_engine_standin()
    realnode.import_image(real_node, archive, ref)
    prefill = start_pod(api_client, ns, placed(role_template(rendered, "prefill"), "prefill-0", ref))
    wait_for(lambda: is_ready(core.read_namespaced_pod("prefill-0", ns)), 180, what="prefill Ready")
    template = role_template(rendered, "decode")
    env = {e["name"]: e.get("value") for e in template["spec"]["containers"][0]["env"]}
    assert env["HPD_WARMUP_PAIR_CHECK"] == "true"
    pod = placed(template, "decode-0", ref)
    (service,) = [o for o in rendered if o["kind"] == "Service" and o["metadata"]["name"] == env["HPD_PREFILL_SERVICE"]]
    core.create_namespaced_service(ns, service)
    decode = start_pod(api_client, ns, pod)
    wait_for(lambda: is_ready(core.read_namespaced_pod("decode-0", ns)), 180, what="decode Ready after its pair check")

    port = env["HPD_VLLM_PORT"]
    p_url, d_url = f"http://{prefill.status.pod_ip}:{port}", f"http://{decode.status.pod_ip}:{port}"
    to_prefill = [r for r in get_json(f"{p_url}/_requests") if (r["body"] or {}).get("kv_transfer_params")]
    from_prefill = [r for r in get_json(f"{d_url}/_requests")
                    if ((r["body"] or {}).get("kv_transfer_params") or {}).get("do_remote_prefill")]  # fmt: skip
    assert to_prefill, "decode's pair check sent nothing to the prefill pod"
    assert from_prefill, "decode's pair check never decoded from prefill's KV"

    # One request as the router sends it: prefill, then decode with prefill's kv_transfer_params.
    prompt = {"model": env["HPD_MODEL"], "prompt": [5, 6, 7, 8], "max_tokens": 1}
    first = post_json(f"{p_url}/v1/completions", {**prompt, "kv_transfer_params": {"do_remote_decode": True}})
    assert first["kv_transfer_params"]["do_remote_prefill"] is True
    answer = post_json(f"{d_url}/v1/completions", {**prompt, "max_tokens": 4,
                                                   "kv_transfer_params": first["kv_transfer_params"]})  # fmt: skip
    assert answer["usage"]["completion_tokens"] == 4 and answer["choices"][0]["text"], answer


CLIENT_SCRIPT = r"""
import json, os, socket, ssl, urllib.request
sa = "/var/run/secrets/kubernetes.io/serviceaccount"
host, port, web = os.environ["KUBERNETES_SERVICE_HOST"], os.environ["KUBERNETES_SERVICE_PORT"], os.environ["WEB"]
out = {"apiserver": f"{host}:{port}", "web_ip": socket.gethostbyname(web)}
with urllib.request.urlopen(f"http://{web}:8080/name", timeout=10) as resp:
    out["web"] = resp.read().decode().strip()
review = {"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"}
req = urllib.request.Request(f"https://{host}:{port}/apis/authentication.k8s.io/v1/selfsubjectreviews",
                             data=json.dumps(review).encode(), method="POST",
                             headers={"Authorization": "Bearer " + open(sa + "/token").read(),
                                      "Content-Type": "application/json"})
with urllib.request.urlopen(req, context=ssl.create_default_context(cafile=sa + "/ca.crt"), timeout=10) as resp:
    out["user"] = json.load(resp)["status"]["userInfo"]["username"]
try:
    socket.gethostbyname("example.com")
    out["outside"] = "resolved"
except OSError as exc:
    out["outside"] = f"unresolved: {exc}"
print("RESULT " + json.dumps(out), flush=True)
"""
"""A pod that reaches a Service by its DNS name (CoreDNS -> ClusterIP -> kube-proxy -> the server pod) and the
apiserver at KUBERNETES_SERVICE_HOST with its ServiceAccount token, and finds no name outside the cluster."""


def test_pods_reach_services_by_name_and_the_apiserver_with_their_token(
    real_node: realnode.RealNode, api_client: client.ApiClient, namespace: str, kubeconfig: Path
) -> None:
    """kube-proxy, CoreDNS and the apiserver's address for pods (hpd_devcluster.nodenet), from inside a pod."""
    ns, core = namespace, client.CoreV1Api(api_client)
    ref, archive = realnode.ensure_engine_standin()
    realnode.import_image(real_node, archive, ref)
    web = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "web", "labels": {"app": "web"}}, "spec": {
        "nodeSelector": {realnode.NODE_LABEL: "true"}, "tolerations": [dict(realnode.TOLERATION)],
        "containers": [{"name": "web", "image": realnode.TEST_IMAGE, "imagePullPolicy": "Never",
                        "command": ["/bin/sh", "-c", "echo web-pod > /www/name && exec httpd -f -p 8080 -h /www"],
                        "volumeMounts": [{"name": "www", "mountPath": "/www"}],
                        "resources": {"requests": {"cpu": "10m", "memory": "16Mi"}}}],
        "volumes": [{"name": "www", "emptyDir": {}}]}}  # fmt: skip
    start_pod(api_client, ns, web)
    svc = core.create_namespaced_service(ns, {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "web"},
                                              "spec": {"selector": {"app": "web"},
                                                       "ports": [{"port": 8080, "targetPort": 8080}]}})  # fmt: skip
    cluster_ip = svc.spec.cluster_ip

    def served_from_host() -> str | None:  # kube-proxy's rules from the host: the Service's virtual IP answers
        try:
            with urllib.request.urlopen(f"http://{cluster_ip}:8080/name", timeout=2) as resp:
                return resp.read().decode().strip()  # type: ignore[no-any-return]
        except OSError:
            return None

    assert wait_for(served_from_host, 60, what=f"Service web ({cluster_ip}) answering from the host") == "web-pod"

    client_pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "client"}, "spec": {
        "restartPolicy": "Never", "nodeSelector": {realnode.NODE_LABEL: "true"},
        "tolerations": [dict(realnode.TOLERATION)],
        "containers": [{"name": "client", "image": ref, "imagePullPolicy": "Never",
                        "command": ["python3", "-c", CLIENT_SCRIPT], "env": [{"name": "WEB", "value": f"web.{ns}.svc"}],
                        "resources": {"requests": {"cpu": "10m", "memory": "16Mi"}}}]}}  # fmt: skip
    core.create_namespaced_pod(ns, client_pod)
    phase = wait_for(lambda: core.read_namespaced_pod("client", ns).status.phase in ("Succeeded", "Failed") and
                     core.read_namespaced_pod("client", ns).status.phase, 120, what="the client pod done")  # fmt: skip
    out = logs(kubeconfig, ns, "client")
    assert phase == "Succeeded", out[-3000:]
    (line,) = [ln for ln in out.splitlines() if ln.startswith("RESULT ")]
    result = json.loads(line.removeprefix("RESULT "))
    assert result["web_ip"] == cluster_ip, result
    assert result["web"] == "web-pod", result
    assert result["apiserver"] == f"{nodenet.KUBERNETES_SERVICE_IP}:443", result
    assert result["user"] == f"system:serviceaccount:{ns}:default", result
    assert result["outside"].startswith("unresolved"), result


def test_stop_puts_the_host_back(real_node: realnode.RealNode, devcluster: cluster.ClusterState) -> None:
    """Runs last in this module: `stop` undoes what the node changed on the machine (the fixture's stop is a no-op)."""
    made, sysctls = list(real_node.made_dirs), dict(real_node.sysctls)
    assert Path(f"/sys/class/net/{realnode.BRIDGE}").exists()
    assert realnode.stop(devcluster) == ["kubelet", "kube-proxy", "coredns", "containerd"]
    for path in made:
        assert not os.path.lexists(path), f"{path} left behind"
    for name, value in sysctls.items():
        assert (Path("/proc/sys") / name).read_text().strip() == value, name
    assert not Path(f"/sys/class/net/{realnode.BRIDGE}").exists()
    assert not list(realnode.CGROUP_ROOT.glob(f"*/{realnode.KUBELET_CGROUP}"))
    assert not realnode._mounts_under((str(real_node.root), "/run/containerd", "/run/netns"))
    assert not realnode._our_shims(real_node)
    assert not nodenet.kube_chains(), "iptables chains left behind"
    with pytest.raises(client.ApiException) as missing:
        client.CoreV1Api(client.ApiClient(_admin(devcluster))).read_node(realnode.NODE_NAME)
    assert missing.value.status == 404


def _admin(state: cluster.ClusterState) -> client.Configuration:
    from kubernetes import config

    cfg = client.Configuration()
    config.load_kube_config(config_file=str(state.kubeconfig), client_configuration=cfg)
    return cfg
