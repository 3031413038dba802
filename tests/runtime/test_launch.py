"""`python -m hpd_runtime launch` end to end with a real child process: the vLLM stand-in started through
HPD_VLLM_COMMAND exactly as vLLM would be. Loopback only; every wait is a poll with a deadline."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from hpd_runtime import contract as c
from hpd_runtime import launcher
from hpd_runtime.config import load_config
from hpd_runtime.warmup import plan_warmup

from .conftest import FAKE_VLLM, LOOPBACK, free_port, get_json, http, wait_until


class Launched:
    def __init__(self, proc: subprocess.Popen[bytes], env: dict[str, str], args: list[str], log: Path) -> None:
        self.proc, self.env, self.args, self.log = proc, env, args, log
        self.vllm = f"http://{LOOPBACK}:{env[c.ENV_VLLM_PORT]}"
        self.runtime = f"http://{LOOPBACK}:{env[c.ENV_RUNTIME_PORT]}"

    def status(self, path: str) -> int:
        return http("GET", self.runtime + path, timeout=5)[0]

    def events(self, name: str) -> list[dict[str, Any]]:
        out = []
        for line in self.log.read_text().splitlines():
            if line.startswith("{"):
                rec = json.loads(line)
                if rec.get("event") == name:
                    out.append(rec)
        return out

    def fake_requests(self) -> list[dict[str, Any]]:
        return list(get_json(self.vllm + "/_requests"))

    def wait_exit(self, timeout: float = 30) -> int:
        return self.proc.wait(timeout=timeout)


@pytest.fixture
def launch(tmp_path: Path) -> Iterator[Any]:
    started: list[Launched] = []

    def start(*fake_args: str, **env_over: str) -> Launched:
        vllm_port, runtime_port = free_port(), free_port()
        # a pod sets none of the cache vars (an explicit one wins over the keyed cache): keep the host's out
        host = {k: v for k, v in os.environ.items() if k not in launcher.CACHE_DIR_VARS}
        env = {
            **host,
            c.ENV_ROLE: "prefill",
            c.ENV_MODEL: "fake-model",
            c.ENV_VLLM_VERSION: "0.20.0",
            c.ENV_GPU_PRODUCT: "NVIDIA H200",
            c.ENV_TENSOR_PARALLEL_SIZE: "1",
            c.ENV_VLLM_PORT: str(vllm_port),
            c.ENV_VLLM_HOST: LOOPBACK,
            c.ENV_RUNTIME_PORT: str(runtime_port),
            c.ENV_RUNTIME_HOST: LOOPBACK,
            c.ENV_CACHE_DIR: str(tmp_path / "cache"),
            c.ENV_MAX_MODEL_LEN: "2048",
            c.ENV_WARMUP_CONCURRENCY: "2",
            c.ENV_VLLM_COMMAND: f"{sys.executable} {FAKE_VLLM}",
            **env_over,
        }
        args = ["fake-model", "--port", str(vllm_port), *fake_args]
        log = tmp_path / f"launch-{len(started)}.log"
        with log.open("wb") as f:
            proc = subprocess.Popen(
                [sys.executable, "-m", "hpd_runtime", "launch", "--", *args], env=env, stderr=f, stdout=f
            )
        launched = Launched(proc, env, args, log)
        started.append(launched)
        return launched

    yield start
    for ln in started:
        if ln.proc.poll() is None:
            ln.proc.send_signal(signal.SIGTERM)
            try:
                ln.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                ln.proc.kill()
                ln.proc.wait()


def test_readyz_stays_503_until_the_warmup_finished(launch: Any) -> None:
    ln = launch("--health-delay", "0.5", "--completion-delay", "0.2")
    seen: list[int] = []

    def ready() -> bool:
        seen.append(ln.status(c.PATH_READYZ))
        return seen[-1] == 200

    wait_until(ready, timeout=60, what="/readyz 200")
    cfg = load_config(ln.env, ln.args)
    plan = plan_warmup(cfg)
    # the first 200 came only after every warmup request had been answered
    assert len(ln.fake_requests()) == len(plan.sequential) + len(plan.concurrent) + len(plan.shapes) + len(
        plan.batch
    ) + len(plan.split)
    assert ln.events("warmup_finished")
    assert 503 in seen
    assert ln.status(c.PATH_LIVEZ) == 200
    per_request = ln.events("warmup_request")
    assert {r["kind"] for r in per_request} >= {
        "short",
        "chunked",
        "long",
        "continuation",
        "concurrent",
        "shape",
        "batch",
        "logprobs",
        "sampled",
    }
    assert all(isinstance(r["seconds"], float) and r["outcome"] == "ok" for r in per_request)


def test_health_500_after_ready_turns_readyz_503(launch: Any) -> None:
    ln = launch(**{c.ENV_WARMUP_ENABLED: "false"})
    wait_until(lambda: ln.status(c.PATH_READYZ) == 200, timeout=60, what="/readyz 200")
    status, _ = http("POST", ln.vllm + "/_control", {"health": 500})
    assert status == 200
    status, body = http("GET", ln.runtime + c.PATH_READYZ)
    assert status == 503 and "returned 500" in body
    assert ln.status(c.PATH_LIVEZ) == 200  # the process is alive; readiness, not liveness, reacts
    _, metrics = http("GET", ln.runtime + c.PATH_METRICS)
    assert "hpd_runtime_vllm_healthy 0.0" in metrics and "hpd_runtime_ready 0.0" in metrics
    http("POST", ln.vllm + "/_control", {"health": 200})
    assert ln.status(c.PATH_READYZ) == 200


def test_metrics_after_warmup(launch: Any) -> None:
    ln = launch()
    wait_until(lambda: ln.status(c.PATH_READYZ) == 200, timeout=60, what="/readyz 200")
    _, text = http("GET", ln.runtime + c.PATH_METRICS)
    for name in (
        "hpd_runtime_warmup_duration_seconds",
        'hpd_runtime_warmup_requests_total{kind="short",outcome="ok"} 1.0',
        "hpd_runtime_ready 1.0",
        "hpd_runtime_start_to_ready_seconds",
        "hpd_runtime_vllm_healthy 1.0",
        "hpd_runtime_warmup_completed 1.0",
    ):
        assert name in text


def _series_names(exposition: str) -> set[str]:
    return {line.split("{")[0].split(" ")[0] for line in exposition.splitlines() if line and line[0] != "#"}


def test_vllm_metrics_come_through_the_runtime_port_and_completions_do_not(launch: Any) -> None:
    """Prometheus scrapes vLLM at runtime:/vllm/metrics (the PodMonitor's vLLM endpoint): the same series vLLM serves,
    while a completion sent to the runtime port never reaches vLLM."""
    ln = launch(**{c.ENV_WARMUP_ENABLED: "false"})
    wait_until(lambda: ln.status(c.PATH_READYZ) == 200, timeout=60, what="/readyz 200")
    status, relayed = http("GET", ln.runtime + c.PATH_VLLM_METRICS)
    _, direct = http("GET", ln.vllm + c.PATH_METRICS)
    assert status == 200 and "vllm:num_requests_running" in relayed
    assert _series_names(relayed) == _series_names(direct)
    before = len(ln.fake_requests())
    body = {"model": "fake-model", "prompt": [1, 2, 3], "max_tokens": 1}
    for path in ("/v1/completions", c.PATH_VLLM_METRICS, "/vllm/v1/completions"):
        assert http("POST", ln.runtime + path, body)[0] == 501, path
    assert http("GET", ln.runtime + "/v1/models")[0] == 404
    assert len(ln.fake_requests()) == before, "nothing sent to the runtime port reached vLLM's API"


def test_warmup_failure_keeps_readyz_503_and_says_why(launch: Any) -> None:
    ln = launch("--fail", "completions", **{c.ENV_WARMUP_TIMEOUT_SECONDS: "1"})
    (failed,) = wait_until(lambda: ln.events("warmup_failed"), timeout=60, what="warmup_failed log line")
    assert failed["level"] == "error"
    assert "short request (16 tokens) failed: HTTP 500" in failed["reason"]
    status, body = http("GET", ln.runtime + c.PATH_READYZ)
    assert status == 503 and "warmup failed" in body
    assert ln.status(c.PATH_LIVEZ) == 200


def test_warmup_timeout_keeps_readyz_503_and_says_why(launch: Any) -> None:
    ln = launch("--completion-delay", "5", **{c.ENV_WARMUP_TIMEOUT_SECONDS: "1"})
    (failed,) = wait_until(lambda: ln.events("warmup_failed"), timeout=60, what="warmup_failed log line")
    assert failed["reason"].startswith("timed out after 1 s")
    status, body = http("GET", ln.runtime + c.PATH_READYZ)
    assert status == 503 and "timed out" in body


def test_launch_passes_args_and_the_keyed_cache_env_to_the_child(launch: Any, tmp_path: Path) -> None:
    ln = launch("--tensor-parallel-size", "1", **{c.ENV_WARMUP_ENABLED: "0"})
    wait_until(lambda: ln.status(c.PATH_READYZ) == 200, timeout=60, what="/readyz 200")
    child = get_json(ln.vllm + "/_env")
    assert child["argv"][1:] == ln.args
    (event,) = ln.events("launch")
    key = event["cache_key"]
    assert key.startswith("fake-model_0.20.0_nvidia-h200_tp1_prefill_")
    base = tmp_path / "cache" / key
    assert child["env"]["VLLM_CACHE_ROOT"] == str(base / "vllm")
    assert child["env"]["TRITON_CACHE_DIR"] == str(base / "triton")
    assert child["env"]["XDG_CACHE_HOME"] == str(base / "xdg")
    assert child["env"]["TRITON_CACHE_MANAGER"] == "hpd_runtime.triton_cache:StableFileCacheManager"
    assert (base / "vllm").is_dir() and (base / "triton").is_dir()


@pytest.mark.parametrize(("sig", "name"), [(signal.SIGTERM, "SIGTERM"), (signal.SIGINT, "SIGINT")])
def test_signals_are_forwarded_and_the_childs_exit_code_returned(
    launch: Any, tmp_path: Path, sig: signal.Signals, name: str
) -> None:
    marker = tmp_path / "signals.txt"
    ln = launch("--signal-file", str(marker), "--term-exit-code", "3", **{c.ENV_WARMUP_ENABLED: "0"})
    wait_until(lambda: ln.status(c.PATH_READYZ) == 200, timeout=60, what="/readyz 200")
    ln.proc.send_signal(sig)
    assert ln.wait_exit() == 3
    assert marker.read_text().split() == [name]
    assert ln.events("signal_forwarded")[0]["signal"] == name


def test_child_killed_by_a_signal_gives_128_plus_signal(launch: Any, tmp_path: Path) -> None:
    ln = launch("--on-term", "kill", **{c.ENV_WARMUP_ENABLED: "0"})
    wait_until(lambda: ln.status(c.PATH_READYZ) == 200, timeout=60, what="/readyz 200")  # child's handlers are set
    ln.proc.send_signal(signal.SIGTERM)
    assert ln.wait_exit() == 128 + signal.SIGKILL


def test_child_exit_ends_launch_with_its_code(launch: Any) -> None:
    ln = launch(**{c.ENV_WARMUP_ENABLED: "0"})
    wait_until(lambda: ln.status(c.PATH_READYZ) == 200, timeout=60, what="/readyz 200")
    pid = get_json(ln.vllm + "/_env")["pid"]
    os.kill(pid, signal.SIGKILL)
    assert ln.wait_exit() == 137
    (event,) = ln.events("vllm_exited")
    assert event["exit_code"] == 137


def test_missing_vllm_program_exits_127(launch: Any) -> None:
    ln = launch(**{c.ENV_VLLM_COMMAND: "/nonexistent/vllm-binary"})
    assert ln.wait_exit() == 127
    assert ln.events("vllm_start_failed")


def test_launch_without_args_is_a_usage_error() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "hpd_runtime", "launch", "--"], capture_output=True, text=True, check=False
    )
    assert out.returncode == 2 and "no vllm serve arguments" in out.stderr


def test_help_lists_the_subcommands() -> None:
    out = subprocess.run([sys.executable, "-m", "hpd_runtime", "--help"], capture_output=True, text=True, check=True)
    for sub in ("launch", "warmup", "readiness"):
        assert sub in out.stdout
