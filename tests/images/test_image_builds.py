"""Our images, built for real with buildah on a local Debian base (hack/hpd_devcluster/images.py), and run.

Cold, the first test of each image builds it (minutes); warm, each image is found by its content hash. Every
container start copies the image (vfs), so each image is started once and `probe.py` runs all its checks.
What this proves and what it cannot (no GPU: vLLM itself never runs) is in images/README.md.
"""

from __future__ import annotations

import dataclasses
import http.server
import json
import shutil
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from hpd_devcluster import images
from hpd_runtime import contract

HERE = Path(__file__).resolve().parent


def _require_tools() -> None:
    missing = [tool for tool in ("buildah", "mmdebstrap") if shutil.which(tool) is None]
    assert not missing, f"{' and '.join(missing)} missing: run hack/image-tools.sh (hack/test.sh does)"


def probe(image: str, *commands: list[str]) -> dict[str, Any]:
    """Start the image once (as its USER, host network) and run probe.py with `commands` inside it."""
    argv = ["python3", "/tmp/hpd-tests/probe.py", *(json.dumps(c) for c in commands)]
    out = subprocess.run(
        images.run_command(image, argv, {}, {str(HERE): "/tmp/hpd-tests"}),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert out.returncode == 0, f"probe in {image} exited {out.returncode}\n{out.stdout}\n{out.stderr}"
    report: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    for done in report["commands"]:
        assert done["rc"] == 0, f"{done['argv']} in {image} exited {done['rc']}\n{done['stdout']}\n{done['stderr']}"
    return report


@pytest.fixture(scope="module")
def operator_image() -> str:
    _require_tools()
    return images.ensure_image("operator")


@pytest.fixture(scope="module")
def operator_report(operator_image: str) -> dict[str, Any]:
    return probe(operator_image, ["python", "-m", "hpd_operator", "--help"])


@pytest.fixture(scope="module")
def router_report() -> dict[str, Any]:
    _require_tools()
    # the retry proxy as the operator renders it (builders.router._retry_container): its config checks with the
    # rendered environment, and dumb-init is there to turn SIGTERM into HAProxy's graceful stop
    env = " ".join(f"{k}={v}" for k, v in ((contract.ENV_RETRY_PORT, 8090), (contract.ENV_RETRY_ROUTER_PORT, 8091),
                                          (contract.ENV_RETRY_HOLD_PORT, 8092), (contract.ENV_RETRIES, 3)))  # fmt: skip
    return probe(
        images.ensure_image("router"),
        ["vllm-router", "--help"],
        ["sh", "-c", f"{env} haproxy -c -f {contract.ROUTER_RETRY_CONFIG}"],
        ["dumb-init", "--version"],
    )


@pytest.fixture(scope="module")
def vllm_report() -> dict[str, Any]:
    _require_tools()
    return probe(
        images.ensure_image("vllm"),
        ["python3", "-m", "hpd_runtime", "--help"],
        ["sh", "-c", 'echo "$HPD_CACHE_DIR"; touch /cache/w /home/hpd/w'],
        ["python3", "/tmp/hpd-tests/nixl_loopback.py"],
    )


def test_operator_image_runs_the_operator_cli_as_uid_1000(operator_report: dict[str, Any]) -> None:
    assert operator_report["uid"] == contract.IMAGE_UID and operator_report["home"] == "/tmp"
    help_text = operator_report["commands"][0]["stdout"]
    assert "usage: hpd-operator" in help_text
    assert "run" in help_text and "render" in help_text


def test_operator_image_carries_the_operator_and_no_test_harness(operator_report: dict[str, Any]) -> None:
    assert operator_report["modules"] == {"hpd_devcluster": False, "kopf": True, "hpd_runtime": True}
    assert operator_report["versions"]["hybrid-pd-operator"] == "0.1.0"


def test_router_image_runs_vllm_router_0_1_17_as_uid_1000(router_report: dict[str, Any]) -> None:
    assert router_report["uid"] == contract.IMAGE_UID
    assert router_report["versions"]["vllm-router"] == "0.1.17"
    help_text = router_report["commands"][0]["stdout"]
    assert "--worker-urls" in help_text and "--policy" in help_text
    assert "Configuration file is valid" in router_report["commands"][1]["stdout"]


def test_vllm_image_steps_install_nixl_and_the_runtime(vllm_report: dict[str, Any]) -> None:
    # The build ran the Dockerfile's own steps: pip install nixl==1.5.1 (resolved against the stand-in's torch
    # metadata, as on vLLM's image), our wheel with the runtime extra, `python3 -m hpd_runtime --help`, the user,
    # /cache and HOME. Here they are checked again at run time, as contract.IMAGE_UID.
    assert vllm_report["uid"] == contract.IMAGE_UID and vllm_report["home"] == "/home/hpd"
    assert vllm_report["versions"]["nixl"] == "1.5.1"
    assert vllm_report["versions"]["hybrid-pd-operator"] == "0.1.0"
    assert vllm_report["modules"] == {"hpd_devcluster": False, "kopf": False, "hpd_runtime": True}
    runtime_help, cache, _ = vllm_report["commands"]
    assert "launch" in runtime_help["stdout"] and "readiness" in runtime_help["stdout"]
    assert cache["stdout"] == "/cache\n"  # and the image uid could write to /cache and HOME (rc 0)


def test_vllm_image_nixl_moves_bytes_over_ucx_without_a_gpu(vllm_report: dict[str, Any]) -> None:
    # Two NIXL agents in one process: host memory -> host memory over the UCX backend (the one vLLM's
    # NixlConnector uses). Proves the installed NIXL works in the image; GPU (VRAM) transfers are not covered.
    result = json.loads(vllm_report["commands"][2]["stdout"].strip().splitlines()[-1])
    assert result == {"state": "DONE", "bytes": 262144, "equal": True, "backend": "UCX"}


@pytest.fixture()
def loopback_server() -> Iterator[int]:
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.end_headers()
            self.wfile.write(b"host-loopback")

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server.server_address[1]
    server.shutdown()
    server.server_close()


def test_run_command_reaches_host_loopback_with_env_and_read_only_mounts(
    operator_image: str, loopback_server: int, tmp_path: Path
) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)  # writable for the image uid but for the read-only mount
    (shared / "kubeconfig").write_text("apiVersion: v1\n")
    (shared / "kubeconfig").chmod(0o644)
    script = (
        "import os, urllib.request;"
        "print(urllib.request.urlopen(os.environ['URL'], timeout=10).read().decode());"
        "print(open('/etc/hpd/kubeconfig').read().strip());"
        "open('/etc/hpd/new', 'w')"
    )
    argv = images.run_command(
        operator_image,
        ["python", "-c", script],
        {"URL": f"http://127.0.0.1:{loopback_server}/"},
        {str(shared): "/etc/hpd"},
    )
    out = subprocess.run(argv, capture_output=True, text=True, timeout=300, check=False)
    assert out.stdout.split("\n")[:2] == ["host-loopback", "apiVersion: v1"], out.stderr
    assert out.returncode != 0 and "Read-only file system" in out.stderr, out.stderr
    assert sorted(p.name for p in shared.iterdir()) == ["kubeconfig"]


def test_image_reference_follows_the_dockerfile_content(
    operator_image: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ref, _ = images.image_ref("operator")
    assert ref == operator_image  # warm: nothing changed, nothing to build
    changed = tmp_path / "Dockerfile"
    changed.write_text(images.SPECS["operator"].dockerfile.read_text() + "# changed\n")
    monkeypatch.setitem(images.SPECS, "operator", dataclasses.replace(images.SPECS["operator"], dockerfile=changed))
    assert images.image_ref("operator")[0] != ref


@pytest.mark.cluster
def test_operator_image_reaches_the_local_apiserver_with_a_mounted_kubeconfig(
    operator_image: str, kubeconfig: Path, api_client: Any, tmp_path: Path
) -> None:
    from kubernetes import client

    private = tmp_path / "kube"
    private.mkdir(mode=0o755)
    images.portable_kubeconfig(kubeconfig, private / "config")
    script = (
        "from kubernetes import client, config;"
        "config.load_kube_config('/etc/hpd/config');"
        "print(client.VersionApi().get_code().git_version);"
        "print(len(client.CoreV1Api().list_namespace().items) > 0)"
    )
    out = subprocess.run(
        images.run_command(operator_image, ["python", "-c", script], {}, {str(private): "/etc/hpd"}),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    expected = client.VersionApi(api_client).get_code().git_version
    assert out.stdout.split() == [expected, "True"]
