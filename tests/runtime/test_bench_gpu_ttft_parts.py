"""bench/gpu/run.py's `ttft-parts` step (where P->D's time to first token goes) against the vLLM stand-in
(tests/runtime/fake_vllm.py, started by our launcher through HPD_VLLM_COMMAND) and a real vllm-router: every path
answers, the bench's own two hops carry prefill's kv_transfer_params to decode, and the parts are read from each
engine's own histograms, one request at a time and with several in flight, so the GPU call runs code whose
bookkeeping already ran."""

from __future__ import annotations

import importlib.util
import random
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from tests.unit.test_bench_gpu_decode_restart import BENCH, load_run, run_on_stand_in

run = load_run("bench_gpu_run_ttft_parts")


def load_result_file() -> Any:
    spec = importlib.util.spec_from_file_location("bench_gpu_result_file_ttft_parts", BENCH / "result_file.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_per_request_ms_is_the_mean_of_the_new_samples_only() -> None:
    before = {"vllm:nixl_xfer_time_seconds_sum": 1.0, "vllm:nixl_xfer_time_seconds_count": 10.0}
    after = {"vllm:nixl_xfer_time_seconds_sum": 1.03, "vllm:nixl_xfer_time_seconds_count": 12.0,
             "vllm:time_to_first_token_seconds_sum": 0.5, "vllm:time_to_first_token_seconds_count": 0.0}  # fmt: skip
    assert run.per_request_ms(before, after) == {"nixl_xfer_time": 15.0}
    assert run.window_requests(before, {**after, "vllm:time_to_first_token_seconds_count": 7.0}) == 7


def server(queue: float, prefill: float, xfer: float | None = None, post: float | None = None) -> dict[str, float]:
    out = {"request_queue_time": queue, "request_prefill_time": prefill, "e2e_request_latency": queue + prefill + 1}
    if xfer is not None:
        out["nixl_xfer_time"], out["nixl_post_time"] = xfer, post or 0.0
    return out


def test_the_stack_adds_up_to_the_router_time_and_the_first_version_keys_stay() -> None:
    med = {
        "router": {"http_ms": 100.0, "prefill_server": server(0.5, 60.0), "decode_server": server(14.0, 10.0, 9.0, 7.0)},
        "split": {"prefill_http_ms": 65.0, "decode_http_ms": 29.0, "sum_http_ms": 94.0,
                  "prefill_server": server(0.4, 58.0), "decode_server": server(12.0, 9.5, 8.0, 6.0)},
        "colocated_decode": {"http_ms": 64.0, "prefill_server": {}, "decode_server": server(0.1, 55.0)},
        "colocated_prefill": {"http_ms": 68.0, "prefill_server": server(0.1, 60.0), "decode_server": {}},
    }  # fmt: skip
    parts = run.parts_of(med)
    v1 = {"router_total_ms": 100.0, "colocated_decode_ms": 64.0, "pd_minus_colocated_ms": 36.0, "prefill_hop_ms": 65.0,
          "decode_hop_ms": 29.0, "nixl_xfer_ms": 8.0, "nixl_post_ms": 6.0, "decode_hop_minus_xfer_ms": 21.0,
          "router_overhead_ms": 6.0, "colocated_prefill_ms": 68.0}  # fmt: skip
    assert {k: parts[k] for k in v1} == v1  # the keys and values the first version wrote
    assert parts["decode_queue_ms"] == 12.0 and parts["decode_step_ms"] == 9.5 and parts["prefill_queue_ms"] == 0.4
    stack = parts["stack"]
    assert list(stack) == list(run.PARTS_STACK)
    assert stack == {"prefill_queue": 0.5, "prefill_compute": 60.0, "descriptor_post": 7.0, "transfer": 2.0,
                     "decode_wait": 5.0, "decode_step": 10.0, "engine_handoff": 2.0, "router_http": 13.5}  # fmt: skip
    assert sum(stack.values()) == pytest.approx(100.0)
    # a path that did not run (skipped by the deadline) leaves its figures None, nothing raises
    partial = run.parts_of({"router": med["router"]})
    assert partial["pd_minus_colocated_ms"] is None and partial["nixl_xfer_ms"] is None
    assert partial["stack"]["router_http"] == 13.5 and partial["stack"]["engine_handoff"] == 2.0
    no_xfer = run.parts_of({"router": {**med["router"], "decode_server": server(1.0, 2.0)}})
    assert no_xfer["stack"]["transfer"] is None and no_xfer["stack"]["decode_wait"] is None
    assert no_xfer["stack"]["router_http"] == 34.5


def test_lengths_under_load_go_shortest_and_longest_first_and_flags_parse() -> None:
    assert run.parts_load_order((2000, 4000, 8000)) == [2000, 8000, 4000]
    assert run.parts_load_order((8000,)) == [8000]
    assert run.parts_load_order(()) == []
    assert run.ints("1,4,16") == (1, 4, 16) and run.ints_text((2000, 8000)) == "2000,8000"


def test_the_background_keeps_c_minus_1_in_flight_and_counts_what_it_sent() -> None:
    lock = threading.Lock()
    state = {"now": 0, "max": 0, "calls": 0}

    def send(ids: list[int]) -> None:
        with lock:
            state["now"] += 1
            state["calls"] += 1
            state["max"] = max(state["max"], state["now"])
            fail = state["calls"] == 3
        time.sleep(0.01)
        with lock:
            state["now"] -= 1
        if fail:
            raise OSError("refused")

    bg = run.PartsBackground(send, 8, 4, seed=1)
    bg.wait_done(6, time.perf_counter() + 10)
    got = bg.close()
    assert got["senders"] == 3 and state["max"] == 3
    assert got["errors"] == 1 and got["error_samples"] == ["OSError: refused"]
    assert got["requests"] == state["calls"] >= 7


def test_the_result_file_counts_measured_failed_and_background_requests() -> None:
    rf = load_result_file()
    one = {"all": {"router": [{}] * 5, "split": [{}] * 5, "colocated_decode": [{}] * 5, "colocated_prefill": [{}] * 5}}
    loaded = {"all": {"router": [{}] * 4, "split": [{}] * 3}, "errors": {"split": ["x"]},
              "background": {"router": {"requests": 10, "errors": 1}, "split": {"requests": 6, "errors": 0}}}  # fmt: skip
    run_ = {"ttft_parts": {"version": 2, "levels": [1, 4], "2000": one,
                           "under_load": {"4": {"2000": loaded, "8000": {"skipped": "deadline"}}}}}  # fmt: skip
    # level 1: 25 (split counts both hops); under load: 4 + 3 * 2 measured, the failed split 2, background 10 + 12
    assert rf.counts(run_) == (25 + 10 + 2 + 22, 1 + 1)


def test_ttft_parts_on_the_stand_in(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(run, "PARTS_LENGTHS", (64, 300))
    monkeypatch.setattr(run, "PARTS_LEVELS", (1, 3))
    monkeypatch.setattr(run, "PARTS_SAMPLES", 2)
    monkeypatch.setattr(run, "PARTS_LOAD_SAMPLES", 2)
    res = run_on_stand_in(run, ["cold", "ttft-parts"], tmp_path, monkeypatch, budget_s=180)
    assert "error" not in res, res.get("error")
    tp = res["ttft_parts"]
    assert tp["version"] == 2 and tp["levels"] == [1, 3] and tp["lengths"] == [64, 300]
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
        assert sum(parts["stack"].values()) == pytest.approx(parts["router_total_ms"], abs=0.01)
        # 3 in flight: the measured request among 2 background requests of its own kind, every path
        loaded = tp["under_load"]["3"][n]
        assert loaded["in_flight"] == 3 and "errors" not in loaded and "skipped_paths" not in loaded
        assert {k: len(v) for k, v in loaded["all"].items()} == dict.fromkeys(run.PARTS_LOAD_PATHS, 2)
        for path, bg in loaded["background"].items():
            assert bg["senders"] == 2 and bg["errors"] == 0 and bg["requests"] >= 2, (path, bg)
        assert all(s["kv_params_returned"] for s in loaded["all"]["split"])
        assert all("nixl_xfer_time" in s["decode_server"] for s in loaded["all"]["router"])
        assert all(s["window_requests"]["decode"] >= 1 for s in loaded["all"]["router"])
        assert not any("nixl_xfer_time" in s["decode_server"] for s in loaded["all"]["colocated_decode"])
        assert loaded["parts"]["nixl_xfer_ms"] == pytest.approx(4.0 + int(n) / 64, abs=0.01)
        assert loaded["parts"]["pd_minus_colocated_ms"] is not None
    rf = load_result_file()
    sent, failed = rf.counts(res)
    assert failed == 0 and sent > 2 * (5 * 2) + 2 * 8


def test_a_path_that_does_not_fit_before_the_deadline_is_skipped(monkeypatch: pytest.MonkeyPatch) -> None:
    roles = {"prefill": run.Role("prefill", [], {}, 1), "decode": run.Role("decode", [], {}, 1)}
    b = run.Bench([], "x", "", Path("m"), Path("c"), Path("w"), Path("o"), "m", {}, roles,
                  deadline=time.perf_counter() + 3)  # fmt: skip
    router = type("R", (), {"url": "http://127.0.0.1:9/v1/completions"})()
    row = run.parts_under_load(b, router, 8000, 16, random.Random(1), {})  # type: ignore[arg-type]
    assert row["skipped_paths"] == {"deadline": list(run.PARTS_LOAD_PATHS)} and row["all"] == {}
    assert row["parts"]["router_total_ms"] is None
