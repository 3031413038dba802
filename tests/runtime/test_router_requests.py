"""What vllm-router 0.1.17 (the router the operator deploys, `--vllm-pd-disaggregation`) sends to prefill and
decode for one client request: the warmup must pay every first-use cost those requests can trigger. A real router
binary in front of two vLLM stand-ins that record every body (loopback only)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from hpd_runtime import warmup as w
from hpd_runtime.config import load_config

from .conftest import LOOPBACK, Fake, free_port, http, wait_until

ROUTER = Path(sys.executable).with_name("vllm-router")


@pytest.fixture
def router(start_fake: Callable[..., Fake]) -> Iterator[tuple[str, Fake, Fake]]:
    assert ROUTER.exists(), f"vllm-router is not installed next to {sys.executable} (pip install vllm-router)"
    prefill, decode = start_fake(), start_fake()
    port = free_port()
    argv = [
        str(ROUTER), "--vllm-pd-disaggregation", "--prefill", prefill.url, "--decode", decode.url,
        "--host", LOOPBACK, "--port", str(port), "--prometheus-host", LOOPBACK, "--prometheus-port", str(free_port()),
    ]  # fmt: skip
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        url = f"http://{LOOPBACK}:{port}"
        wait_until(lambda: http("GET", url + "/health")[0] == 200, timeout=60, what="router /health")
        yield url, prefill, decode
    finally:
        proc.terminate()
        proc.wait(10)


def test_the_router_forwards_a_clients_logprobs_and_sampling_to_prefill(router: tuple[str, Fake, Fake]) -> None:
    """The first request asking for logprobs compiles vLLM's torch.compile'd token-rank function on whichever role
    computes logprobs; the router makes prefill compute them too, so prefill's warmup must ask for logprobs."""
    url, prefill, decode = router
    client = {"model": "fake-model", "prompt": list(range(3, 40)), "max_tokens": 4, "temperature": 0.8,
              "top_p": 0.95, "top_k": 40, "seed": 7, "logprobs": 1, "return_tokens_as_token_ids": True}  # fmt: skip
    status, text = http("POST", url + "/v1/completions", client, timeout=30)
    assert status == 200, text
    (p,) = [r["body"] for r in prefill.requests()]
    (d,) = [r["body"] for r in decode.requests()]
    for body in (p, d):
        # the router parses floats as f32: 0.8 comes back as 0.800000011920929
        assert {k: body.get(k) for k in ("logprobs", "temperature", "top_p", "top_k", "seed")} == pytest.approx({
            "logprobs": 1, "temperature": 0.8, "top_p": 0.95, "top_k": 40, "seed": 7,
        }, rel=1e-6)  # fmt: skip
    assert p["max_tokens"] == 1 and p["kv_transfer_params"]["do_remote_decode"] is True
    assert d["kv_transfer_params"]["do_remote_prefill"] is True
    # so the warmup plan (run on both roles) asks for both: greedy logprobs, and sampled with logprobs
    plan = w.plan_warmup(load_config({}))
    fields = [dict(x.sampling) for x in plan.sequential if x.sampling]
    assert any(f.get("logprobs") == 1 and "temperature" not in f for f in fields)
    assert any(f.get("logprobs") == 1 and f.get("temperature", 0) > 0 and "top_p" in f for f in fields)
