"""bench/gpu/run.py's `ttft-parts` step (where P->D's time to first token goes) against the vLLM stand-in
(tests/runtime/fake_vllm.py, started by our launcher through HPD_VLLM_COMMAND) and a real vllm-router: every path
answers, the bench's own two hops carry prefill's kv_transfer_params to decode, and the parts are read from each
engine's own histograms, so the GPU call runs code whose bookkeeping already ran."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.unit.test_bench_gpu_decode_restart import load_run, run_on_stand_in

run = load_run("bench_gpu_run_ttft_parts")


def test_per_request_ms_is_the_mean_of_the_new_samples_only() -> None:
    before = {"vllm:nixl_xfer_time_seconds_sum": 1.0, "vllm:nixl_xfer_time_seconds_count": 10.0}
    after = {"vllm:nixl_xfer_time_seconds_sum": 1.03, "vllm:nixl_xfer_time_seconds_count": 12.0,
             "vllm:time_to_first_token_seconds_sum": 0.5, "vllm:time_to_first_token_seconds_count": 0.0}  # fmt: skip
    assert run.per_request_ms(before, after) == {"nixl_xfer_time": 15.0}


def test_ttft_parts_on_the_stand_in(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(run, "PARTS_LENGTHS", (64, 300))
    monkeypatch.setattr(run, "PARTS_SAMPLES", 2)
    res = run_on_stand_in(run, ["cold", "ttft-parts"], tmp_path, monkeypatch, budget_s=180)
    assert "error" not in res, res.get("error")
    tp = res["ttft_parts"]
    for n in ("64", "300"):
        row = tp[n]
        assert {k: len(v) for k, v in row["all"].items()} == dict.fromkeys(
            ("router", "split", "colocated_decode", "colocated_prefill"), 2
        )
        assert all(s["kv_params_returned"] for s in row["all"]["split"])
        # the stand-in's decode records a NIXL transfer only for a request that carried prefill's params
        assert all("nixl_xfer_time" in s["decode_server"] for s in row["all"]["split"])
        assert all("nixl_xfer_time" in s["decode_server"] for s in row["all"]["router"])
        assert not any("nixl_xfer_time" in s["decode_server"] for s in row["all"]["colocated_decode"])
        assert all("e2e_request_latency" in s["prefill_server"] for s in row["all"]["colocated_prefill"])
        parts = row["parts"]
        assert parts["nixl_xfer_ms"] == pytest.approx(4.0 + int(n) / 64, abs=0.01)  # the stand-in's figure
        assert parts["decode_hop_minus_xfer_ms"] == pytest.approx(parts["decode_hop_ms"] - parts["nixl_xfer_ms"])
        assert parts["router_overhead_ms"] == pytest.approx(
            parts["router_total_ms"] - row["median"]["split"]["sum_http_ms"]
        )
