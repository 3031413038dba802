"""Warmup: the prompt plan (pure) and runs against the vLLM stand-in (in-process, loopback only)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest

from hpd_runtime import contract as c
from hpd_runtime import warmup as w
from hpd_runtime.config import RuntimeConfig, load_config
from hpd_runtime.paircheck import PAIR_ROUNDS, pair_lengths
from hpd_runtime.readiness import RuntimeMetrics, RuntimeState
from hpd_runtime.warmup import PAIR_KV_PARAMS, Warmup, plan_warmup

from .conftest import LOOPBACK, Fake


def cfg_for(port: int, **env: str) -> RuntimeConfig:
    base = {c.ENV_VLLM_HOST: LOOPBACK, c.ENV_VLLM_PORT: str(port), c.ENV_MODEL: "fake-model"}
    return load_config({**base, **env})


def sample(metric: RuntimeMetrics, name: str, **labels: str) -> float:
    value = metric.registry.get_sample_value(name, labels or None)
    return 0.0 if value is None else value


@pytest.fixture(autouse=True)
def fast_retries(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(w, "RETRY_BACKOFF_SECONDS", (0.05,))
    monkeypatch.setattr(w, "HEALTH_POLL_SECONDS", 0.05)


# --- the plan --------------------------------------------------------------------------------------------------


def test_plan_covers_short_multi_chunk_long_and_continuation() -> None:
    cfg = load_config(
        {c.ENV_SSD_CHUNK_SIZE: "128", c.ENV_MAX_MODEL_LEN: "4096"}, ["m", "--max-num-batched-tokens", "1024"]
    )
    plan = plan_warmup(cfg)
    by_kind = {p.kind: p for p in plan.sequential}
    assert len(by_kind["short"].tokens) <= 32
    assert len(by_kind["chunked"].tokens) >= 2 * 128
    assert len(by_kind["long"].tokens) > 1024  # longer than one scheduler step: chunked prefill, initial states
    cont = by_kind["continuation"].tokens
    assert cont[: len(by_kind["chunked"].tokens)] == by_kind["chunked"].tokens
    assert len(cont) > len(by_kind["chunked"].tokens)
    assert len(plan.concurrent) == c.WARMUP_CONCURRENCY_DEFAULT
    assert plan.pair is False


def test_plan_never_exceeds_max_model_len_and_ids_stay_in_the_safe_range() -> None:
    cfg = load_config(
        {c.ENV_MAX_MODEL_LEN: "300", c.ENV_WARMUP_MAX_TOKENS: "4"}, ["m", "--max-num-batched-tokens=8192"]
    )
    plan = plan_warmup(cfg)
    prompts = [*plan.sequential, *plan.concurrent]
    assert all(len(p.tokens) + p.max_tokens < 300 for p in prompts)
    assert all(w.TOKEN_ID_MIN <= t <= w.TOKEN_ID_MAX for p in prompts for t in p.tokens)


@pytest.mark.parametrize(
    ("max_model_len", "budget_args", "budget"),
    [
        # the H200 run: maxModelLen 4096, no --max-num-batched-tokens (vLLM chose 8192): nothing split a prompt, and
        # the first concurrent long prompts after Ready autotuned the initial-states SSD kernels on prefill for 30 s
        ("4096", [], w.SPLIT_BUDGET_DEFAULT),
        ("9216", ["--max-num-batched-tokens", "8192"], 8192),
        ("131072", ["--max-num-batched-tokens=2048"], 2048),
        ("300", [], w.SPLIT_BUDGET_DEFAULT),
    ],
)
def test_the_split_step_sends_more_tokens_at_once_than_a_step_holds(
    max_model_len: str, budget_args: list[str], budget: int
) -> None:
    """Whatever the budget, the `split` prompts sent together exceed it even without their first one (which the
    scheduler may take alone): some prompt is split and its next chunk runs the SSD kernels with initial states."""
    cfg = load_config({c.ENV_MAX_MODEL_LEN: max_model_len}, ["m", *budget_args])
    plan = plan_warmup(cfg)
    lengths = [len(p.tokens) for p in plan.split]
    assert lengths and all(p.kind == "split" and not p.sampling for p in plan.split)
    assert all(n + plan.split[0].max_tokens < int(max_model_len) for n in lengths)  # every prompt fits the model
    assert sum(lengths[1:]) > budget, (lengths, budget)
    assert sum(lengths) <= budget + 3 * max(lengths), "no more prefill than the split needs"


def test_plan_is_deterministic() -> None:
    cfg = load_config({c.ENV_MAX_MODEL_LEN: "4096"})
    assert plan_warmup(cfg) == plan_warmup(cfg)


def test_explicit_lengths_replace_the_derived_ones() -> None:
    cfg = load_config({c.ENV_WARMUP_PROMPT_LENGTHS: "8, 600", c.ENV_MAX_MODEL_LEN: "4096"})
    plan = plan_warmup(cfg)
    assert [(p.kind, len(p.tokens)) for p in plan.sequential[:2]] == [("custom", 8), ("custom", 600)]
    assert plan.sequential[2].kind == "continuation"
    assert plan.sequential[2].tokens[:600] == plan.sequential[1].tokens


def test_plan_asks_for_logprobs_and_random_sampling_once_each() -> None:
    """User requests ask for logprobs and sample at temperature > 0; the other steps are greedy without logprobs."""
    plan = plan_warmup(load_config({c.ENV_MAX_MODEL_LEN: "4096"}))
    bodies = {p.kind: w.completion_body(load_config({}), p) for p in plan.sequential}
    assert bodies["logprobs"]["logprobs"] == 1 and bodies["logprobs"]["temperature"] == 0
    assert bodies["logprobs"]["return_tokens_as_token_ids"] is True  # vLLM 0.20 + --skip-tokenizer-init: else 400
    sampled = bodies["sampled"]
    assert sampled["temperature"] > 0 and 0 < sampled["top_p"] < 1 and sampled["top_k"] > 1 and "seed" in sampled
    assert sampled["logprobs"] == 1
    every = (*plan.sequential, *plan.concurrent, *plan.shapes, *plan.batch, *plan.split)
    others = [p for p in every if p.kind not in ("logprobs", "sampled")]
    assert all(not p.sampling for p in others)


# --- runs against the stand-in ---------------------------------------------------------------------------------


def run_warmup(cfg: RuntimeConfig, resolver: Callable[[str, int], list[tuple[str, int]]] | None = None) -> Any:
    state = RuntimeState(RuntimeMetrics())
    kw: dict[str, Any] = {} if resolver is None else {"resolver": resolver}
    ok = Warmup(cfg, state, threading.Event(), identity=lambda h, p: None, **kw).run()
    return ok, state


def test_warmup_sends_the_plan_and_marks_warm(start_fake: Callable[..., Fake]) -> None:
    fake = start_fake()
    cfg = cfg_for(fake.port, **{c.ENV_WARMUP_CONCURRENCY: "3", c.ENV_MAX_MODEL_LEN: "2048"})
    ok, state = run_warmup(cfg)
    assert ok and state.warm.is_set()
    plan = plan_warmup(cfg)
    got = fake.requests()
    assert len(got) == len(plan.sequential) + len(plan.concurrent) + len(plan.shapes) + len(plan.batch) + len(
        plan.split
    )
    assert [r["body"]["prompt"] for r in got[: len(plan.sequential)]] == [list(p.tokens) for p in plan.sequential]
    assert all(r["body"]["model"] == "fake-model" and r["body"]["stream"] is False for r in got)
    assert all(r["request_id"] and r["request_id"].startswith("hpd-warmup-") for r in got)
    sent = {r["request_id"].split("-")[2]: r["body"] for r in got}
    assert sent["logprobs"]["logprobs"] == 1 and sent["sampled"]["temperature"] > 0
    assert sample(state.metrics, "hpd_runtime_warmup_requests_total", kind="concurrent", outcome="ok") == 3
    assert sample(state.metrics, "hpd_runtime_warmup_completed") == 1


def test_pair_check_calls_prefill_then_decode_with_prefills_params(start_fake: Callable[..., Fake]) -> None:
    prefill, decode = start_fake(), start_fake("--enable-prompt-tokens-details")
    cfg = cfg_for(
        decode.port,
        **{
            c.ENV_ROLE: "decode",
            c.ENV_WARMUP_PAIR_CHECK: "true",
            c.ENV_PREFILL_SERVICE: "demo-prefill.ns.svc.cluster.local",
            c.ENV_PREFILL_PORT: "8000",
            c.ENV_WARMUP_CONCURRENCY: "1",
        },
    )
    asked: list[tuple[str, int]] = []

    def resolver(service: str, port: int) -> list[tuple[str, int]]:
        asked.append((service, port))
        return [(LOOPBACK, prefill.port)]

    ok, _ = run_warmup(cfg, resolver)
    assert ok
    assert asked == [("demo-prefill.ns.svc.cluster.local", 8000)]
    p_req = prefill.requests()[0]
    assert all(r["body"]["kv_transfer_params"] == PAIR_KV_PARAMS for r in prefill.requests())
    assert p_req["body"]["max_tokens"] == 1 and p_req["body"]["stream"] is False
    d_req = next(r for r in decode.requests() if "kv_transfer_params" in r["body"])
    assert d_req["body"]["logprobs"] == 1 and "prompt_logprobs" not in d_req["body"] and "echo" not in d_req["body"]
    assert d_req["request_id"] == p_req["request_id"]
    assert d_req["t"] > p_req["t"]  # CLOCK_MONOTONIC is system-wide: prefill was answered first
    assert d_req["body"]["prompt"] == p_req["body"]["prompt"]
    expected = {
        "do_remote_prefill": True,
        "do_remote_decode": False,
        "remote_block_ids": [[1, 2, 3]],
        "remote_engine_id": f"fake-engine-{prefill.port}",
        "remote_request_id": f"prefill-{p_req['request_id']}",
        "remote_host": "127.0.0.1",
        "remote_port": 5600,
        "tp_size": 1,
    }
    assert d_req["body"]["kv_transfer_params"] == expected
    # each P->D request is followed by the same prompt computed locally (no kv_transfer_params)
    reqs = decode.requests()
    i = reqs.index(d_req)
    assert reqs[i + 1]["body"]["prompt"] == d_req["body"]["prompt"] and "kv_transfer_params" not in reqs[i + 1]["body"]


def test_pair_check_waits_for_a_ready_prefill_pod(start_fake: Callable[..., Fake]) -> None:
    prefill, decode = start_fake(), start_fake("--enable-prompt-tokens-details")
    cfg = cfg_for(
        decode.port,
        **{c.ENV_WARMUP_PAIR_CHECK: "1", c.ENV_PREFILL_SERVICE: "p", c.ENV_WARMUP_TIMEOUT_SECONDS: "30"},
    )
    calls = []

    def resolver(service: str, port: int) -> list[tuple[str, int]]:
        calls.append(1)
        return [] if len(calls) < 3 else [(LOOPBACK, prefill.port)]

    ok, state = run_warmup(cfg, resolver)
    assert ok and len(calls) == 3
    assert len(prefill.requests()) == PAIR_ROUNDS * len(pair_lengths(w.prompt_limit(cfg)))
    assert state.pair_fault() is None


def test_prefill_without_kv_transfer_params_fails_the_pair_check(start_fake: Callable[..., Fake]) -> None:
    prefill, decode = start_fake("--fail", "no-kv-params"), start_fake()
    cfg = cfg_for(
        decode.port,
        **{c.ENV_WARMUP_PAIR_CHECK: "1", c.ENV_PREFILL_SERVICE: "p", c.ENV_WARMUP_TIMEOUT_SECONDS: "8"},
    )
    ok, state = run_warmup(cfg, lambda s, p: [(LOOPBACK, prefill.port)])
    assert not ok and not state.warm.is_set()
    phase, reason = state.snapshot()
    assert phase == "failed" and "returned no kv_transfer_params" in reason
    assert all("kv_transfer_params" not in r["body"] for r in decode.requests())  # decode never got a pair request


def test_a_request_cut_short_by_the_deadline_keeps_the_earlier_reason(start_fake: Callable[..., Fake]) -> None:
    """The last pair attempt starts with less time left than prefill takes to answer: its timeout is the deadline's,
    so the reason still names what failed before (the suite once saw "timed out" here instead, under load)."""
    prefill, decode = start_fake("--fail", "no-kv-params", "--completion-delay", "1.5"), start_fake()
    cfg = cfg_for(
        decode.port,
        **{c.ENV_WARMUP_PAIR_CHECK: "1", c.ENV_PREFILL_SERVICE: "p", c.ENV_WARMUP_TIMEOUT_SECONDS: "5"},
    )
    ok, state = run_warmup(cfg, lambda s, p: [(LOOPBACK, prefill.port)])
    assert not ok
    _, reason = state.snapshot()
    assert reason.startswith("timed out after 5 s") and reason.endswith("prefill returned no kv_transfer_params")
    assert len(prefill.requests()) >= 2, "the deadline must have cut a second attempt short"


def test_a_4xx_from_local_vllm_fails_at_once(start_fake: Callable[..., Fake]) -> None:
    fake = start_fake("--fail", "bad-request")
    ok, state = run_warmup(cfg_for(fake.port, **{c.ENV_WARMUP_TIMEOUT_SECONDS: "600"}))
    assert not ok
    _, reason = state.snapshot()
    assert "short request (16 tokens) failed: HTTP 400" in reason
    assert len(fake.requests()) == 1
    assert sample(state.metrics, "hpd_runtime_warmup_failed") == 1


def test_5xx_is_retried_until_the_deadline(start_fake: Callable[..., Fake]) -> None:
    fake = start_fake("--fail", "completions")
    ok, state = run_warmup(cfg_for(fake.port, **{c.ENV_WARMUP_TIMEOUT_SECONDS: "1"}))
    assert not ok
    _, reason = state.snapshot()
    assert reason.startswith("timed out after 1 s; last error: short request (16 tokens) failed: HTTP 500")
    assert len(fake.requests()) >= 2
    assert sample(state.metrics, "hpd_runtime_warmup_requests_total", kind="short", outcome="error") >= 2


def test_disabled_warmup_is_warm_as_soon_as_health_is_ok(start_fake: Callable[..., Fake]) -> None:
    fake = start_fake()
    ok, state = run_warmup(cfg_for(fake.port, **{c.ENV_WARMUP_ENABLED: "false"}))
    assert ok and state.warm.is_set()
    assert fake.requests() == []


def test_shape_lengths_cover_both_sides_of_every_power_of_two_up_to_the_limit() -> None:
    lengths = w.shape_lengths(4091)
    assert {1, 2, 3, 15, 16, 31, 32, 2047, 2048, 4091} <= set(lengths)
    assert all(n <= 4091 for n in lengths) and lengths == tuple(sorted(set(lengths)))
    assert len([n for n in lengths if n % 16]) >= len([n for n in lengths if n % 16 == 0])  # both classes
    cfg = load_config({c.ENV_MAX_MODEL_LEN: "4096"})
    plan = plan_warmup(cfg)
    assert [len(p.tokens) for p in plan.shapes] == list(w.shape_lengths(w.prompt_limit(cfg)))
    assert len(plan.batch) == w.BATCH_CLASS_SIZE
