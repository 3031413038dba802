"""The decode pair check: does prefill -> decode serve what this decode computes on its own? (pure parts)

Hybrid P/D output is not bit-identical to a local run by design: prefill stops one prompt token short and decode
recomputes it with other kernels (vllm-upstream-2026-11.md section 3). So, as vLLM's own hybrid consistency test
does, the check compares the first generated tokens' top-1 logprobs (greedy, `logprobs=1`; never
`prompt_logprobs`/`echo`, which make vLLM skip the transfer), not the token ids:

- any non-finite logprob, or vLLM's clamp value -9999 (its stand-in for -inf), fails: that is the NaN signature of
  the measured corruption (token 0 repeated);
- the top-1 logprob of every compared position (the first MAX_COMPARED_TOKENS, up to and including the first
  position where the ids diverge: after that the two runs condition on different text) must agree within
  `max_delta` nats. Upstream gates at 1.5 and sees healthy runs under 0.25; the default here is 0.5 (the healthy
  deltas measured on the H200 are in bench/gpu/README.md);
- the decode response must prove a transfer happened: `usage.prompt_tokens_details.cached_tokens` >= 1 (decode
  runs with `--enable-prompt-tokens-details`; it counts tokens loaded from the prefill). Zero means the
  kv_transfer_params were dropped and decode recomputed the prompt: the check would prove nothing.

Prompt set: PAIR_PROMPT_LENGTHS, eight lengths from 300 to 3,000 tokens, the set of the project's own diagnosis
(bench/gpu/diagnose_pd.py), in which the raised block size (640/64) failed 4/8, 2/8 and 2/8 prompts in three rounds
and the failing prompts moved between rounds. Every measured round therefore failed at least 2 of these 8; at the
lowest measured per-prompt rate (1/4) all 8 pass by chance with probability 0.75^8 = 10 %, so the check runs
PAIR_ROUNDS rounds with fresh prompts (0.75^16 = 1 %) before it declares the pair good. Lengths are clamped to the
model's limit (and deduplicated), so a short maxModelLen checks fewer lengths.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import Any, Final

from hpd_runtime import contract

PAIR_PROMPT_LENGTHS: Final = (300, 650, 1000, 1400, 1800, 2200, 2600, 3000)
PAIR_ROUNDS: Final = 2
PAIR_MAX_TOKENS: Final = 4
MAX_COMPARED_TOKENS: Final = 4
"""Upstream's test compares the first 4 tokens."""
MAX_LOGPROB_DELTA_DEFAULT: Final = contract.PAIR_MAX_LOGPROB_DELTA_DEFAULT
VLLM_LOGPROB_FLOOR: Final = -9999.0
"""vLLM's OpenAI server clamps logprobs to max(lp, -9999.0): -inf arrives as -9999.0."""
MIN_PAIR_LENGTH: Final = 16
DIFFERS: Final = "P->D output differs from local"
"""The phrase a user sees in `kubectl describe hpd` (DecodeReady) when the check fails."""
BLOCK_SIZE_HINT: Final = (
    "if spec.blockSize is set, remove it (vLLM 0.20 raised 128 to a 640-token block on a 64-token kernel block and "
    "corrupted P->D); prefill and decode must derive the same attention block size"
)


@dataclasses.dataclass(frozen=True)
class Completion:
    """What the check needs from one /v1/completions answer."""

    token_ids: tuple[int, ...] | None
    logprobs: tuple[float, ...]
    cached_tokens: int | None
    prompt_tokens: int


@dataclasses.dataclass(frozen=True)
class Verdict:
    ok: bool
    reason: str
    max_delta: float
    """Largest |top-1 logprob difference| over the compared positions (nan when not comparable)."""


def pair_lengths(limit: int) -> tuple[int, ...]:
    """The prompt lengths the check sends for a prompt limit (clamped, deduplicated, in order)."""
    out: list[int] = []
    for n in PAIR_PROMPT_LENGTHS:
        m = max(MIN_PAIR_LENGTH, min(n, limit))
        if m not in out:
            out.append(m)
    return tuple(out)


def _float(x: Any) -> float:
    try:
        return float(x)
    except (TypeError, ValueError):
        return math.nan


def parse_completion(body: Any, prompt_tokens: int) -> Completion:
    """Pull token ids, the sampled tokens' logprobs and cached_tokens out of a completions response.

    Raises ValueError when the answer has no choices or no logprobs (then nothing can be compared)."""
    if not isinstance(body, Mapping) or not body.get("choices"):
        raise ValueError(f"no choices in the answer: {str(body)[:200]}")
    choice = body["choices"][0]
    lp = choice.get("logprobs") if isinstance(choice, Mapping) else None
    if not isinstance(lp, Mapping) or not isinstance(lp.get("token_logprobs"), list):
        raise ValueError("the answer carries no logprobs (was logprobs=1 ignored?)")
    ids_raw = choice.get("token_ids")
    ids = tuple(int(t) for t in ids_raw) if isinstance(ids_raw, list) else None
    usage = body.get("usage") if isinstance(body.get("usage"), Mapping) else {}
    details = usage.get("prompt_tokens_details") if isinstance(usage, Mapping) else None
    cached = details.get("cached_tokens") if isinstance(details, Mapping) else None
    return Completion(
        token_ids=ids,
        logprobs=tuple(_float(x) for x in lp["token_logprobs"]),
        cached_tokens=int(cached) if isinstance(cached, int) else None,
        prompt_tokens=prompt_tokens,
    )


def _bad(lp: float) -> bool:
    return not math.isfinite(lp) or lp <= VLLM_LOGPROB_FLOOR


def compare(pd: Completion, local: Completion, max_delta: float = MAX_LOGPROB_DELTA_DEFAULT) -> Verdict:
    """Judge one prompt: P->D answer vs the same prompt computed locally on decode."""
    n = pd.prompt_tokens
    for name, c in (("P->D", pd), ("local", local)):
        bad = [i for i, lp in enumerate(c.logprobs) if _bad(lp)]
        if bad:
            return Verdict(
                False, f"{n}-token prompt: {name} logprob at token {bad[0]} is {c.logprobs[bad[0]]}", math.nan
            )
        if not c.logprobs:
            return Verdict(False, f"{n}-token prompt: {name} answer has no logprobs", math.nan)
    if pd.cached_tokens is None:
        return Verdict(
            False,
            f"{n}-token prompt: decode reported no prompt_tokens_details.cached_tokens "
            "(needs --enable-prompt-tokens-details), so no transfer can be proven",
            math.nan,
        )
    if pd.cached_tokens < 1:
        return Verdict(
            False, f"{n}-token prompt: decode loaded 0 tokens from prefill (no KV transfer happened)", math.nan
        )
    k = min(MAX_COMPARED_TOKENS, len(pd.logprobs), len(local.logprobs))
    if pd.token_ids is not None and local.token_ids is not None:
        for i in range(k):
            if i < len(pd.token_ids) and i < len(local.token_ids) and pd.token_ids[i] != local.token_ids[i]:
                k = i + 1  # compare up to the first divergence: later tokens condition on different text
                break
    deltas = [abs(pd.logprobs[i] - local.logprobs[i]) for i in range(k)]
    worst = max(deltas)
    if worst > max_delta:
        i = deltas.index(worst)
        ids = ""
        if pd.token_ids is not None and local.token_ids is not None:
            ids = f" (token {pd.token_ids[i] if i < len(pd.token_ids) else '?'} vs {local.token_ids[i] if i < len(local.token_ids) else '?'})"
        return Verdict(
            False,
            f"{n}-token prompt: top-1 logprob at token {i} is {pd.logprobs[i]:.3f} via P->D vs "
            f"{local.logprobs[i]:.3f} local{ids}, |delta| {worst:.3f} > {max_delta:g} nats",
            worst,
        )
    return Verdict(True, "ok", worst)


def summarize(verdicts: Sequence[Verdict], prefill: str) -> str:
    """One line for /readyz, the probe output (-> the pod's Unhealthy Event) and the logs."""
    bad = [v for v in verdicts if not v.ok]
    if not bad:
        worst = max((v.max_delta for v in verdicts), default=0.0)
        return f"P->D matches local on {len(verdicts)} prompts via prefill {prefill} (max |delta| {worst:.3f} nats)"
    return f"{DIFFERS} on {len(bad)}/{len(verdicts)} prompts via prefill {prefill}: {bad[0].reason}; {BLOCK_SIZE_HINT}"
