"""Pure: the bounds the operator gives each role's HorizontalPodAutoscaler, and what the autoscaler decided.

Without spec.ratio an autoscaling role's HPA gets the user's minReplicas/maxReplicas and nothing else: the HPA alone
decides. With a ratio (decode replicas per prefill replica in [rmin, rmax]) no standard scaler can decide, because
each HPA sees only its own role; the operator then narrows each HPA's min/max, from what runs now, so that any move
either HPA can make keeps decode/prefill inside the band. It never writes a Deployment's replicas itself:

- It reads each role's current replicas (its Deployment) and which way its HPA wants to go (the HPA's status:
  desiredReplicas against currentReplicas, or ScalingLimited TooManyReplicas / TooFewReplicas).
- While either role wants to grow, both may only grow: prefill in [P, floor(D / rmin)], decode in [D, floor(rmax * P)]
  (two roles growing together stay in the band; one growing while the other shrinks could leave it). A role that
  wants to grow but is held by the band pulls the other up first: its min is raised to the size the next step needs
  (decode to ceil(rmin * (P + 1)), prefill to ceil((D + 1) / rmax)), and the HPA, bound by its min, scales it.
- When one role holds and the other wants to shrink, the holding role stays (P or D alone) and the other may move
  anywhere in the band at that size: decode in [ceil(rmin * P), floor(rmax * P)], or prefill in
  [ceil(D / rmax), floor(D / rmin)] (so it can grow again at once when its load returns).
- When both want to shrink, both may only shrink: prefill in [ceil(D / rmax), P], decode in [ceil(rmin * P), D].
- A pair outside the band (the ratio was just set, or the ranges changed) is brought back by growing the smaller
  side, never by shrinking a serving role.
Every range is clipped to the user's own minReplicas/maxReplicas. The CRD refuses a band the ranges cannot meet and
one too narrow to grow one role at a time (api.rules ratio-*).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from hpd_operator.api.models import AutoscalingSpec, HybridPDDeploymentSpec
from hpd_operator.api.signals import ROLE_DEFAULT_SIGNALS, SIGNALS, SignalName
from hpd_runtime import contract

UP, DOWN, HOLD = 1, -1, 0


@dataclass(frozen=True)
class Bounds:
    min_replicas: int
    max_replicas: int
    note: str | None = None
    """The operator's ratio decision in words (None: the user's range as is)."""


def autoscaled_roles(spec: HybridPDDeploymentSpec) -> tuple[contract.Role, ...]:
    return tuple(r for r in contract.ROLES if spec.role(r).autoscaling is not None)


def signals_of(role: contract.Role, a: AutoscalingSpec) -> list[tuple[SignalName, float]]:
    """(signal name, target) the role follows: its own list, else the role's defaults."""
    if a.metrics:
        return [(m.signal, m.target) for m in a.metrics]
    return [(name, SIGNALS[name].default_target) for name in ROLE_DEFAULT_SIGNALS[role]]


def _condition(hpa: Mapping[str, Any] | None, ctype: str) -> Mapping[str, Any]:
    for c in ((hpa or {}).get("status") or {}).get("conditions") or []:
        if c.get("type") == ctype:
            return dict(c)
    return {}


def wants(hpa: Mapping[str, Any] | None) -> int:
    """Which way an HPA wants its target to go (UP, DOWN, HOLD), from its status."""
    st = (hpa or {}).get("status") or {}
    limited = _condition(hpa, "ScalingLimited")
    if limited.get("status") == "True":
        if limited.get("reason") == "TooManyReplicas":
            return UP
        if limited.get("reason") == "TooFewReplicas":
            return DOWN
    desired, current = st.get("desiredReplicas"), st.get("currentReplicas")
    if isinstance(desired, int) and isinstance(current, int) and desired != current:
        return UP if desired > current else DOWN
    return HOLD


def _clip(lo: int, hi: int, a: AutoscalingSpec) -> tuple[int, int]:
    lo, hi = max(lo, a.min_replicas), min(hi, a.max_replicas)
    if lo > hi:  # the user's range moved away from what runs: the user's range wins, the HPA moves into it
        return a.min_replicas, a.max_replicas
    return lo, hi


def compute_bounds(
    spec: HybridPDDeploymentSpec,
    current: Mapping[str, Any],
    hpas: Mapping[str, Mapping[str, Any] | None],
) -> dict[str, Bounds]:
    """The min/max each autoscaling role's HPA gets (see the module doc). `current`: each role's Deployment
    spec.replicas (None: not created yet), `hpas`: each role's HPA as observed (None: none yet)."""
    out: dict[str, Bounds] = {}
    for role in autoscaled_roles(spec):
        a = spec.role(role).autoscaling
        assert a is not None
        out[role] = Bounds(a.min_replicas, a.max_replicas)
    if spec.ratio is None or len(out) != len(contract.ROLES):
        return out
    pa, da = spec.prefill.autoscaling, spec.decode.autoscaling
    assert pa is not None and da is not None
    p = current.get("prefill") or spec.prefill.replicas
    d = current.get("decode") or spec.decode.replicas
    rmin = spec.ratio.min_decode_per_prefill or 0.0
    rmax = spec.ratio.max_decode_per_prefill or math.inf
    pair = _Pair(
        p=p, d=d, rmin=rmin, rmax=rmax, pa=pa, da=da,
        want_p=_effective(wants(hpas.get("prefill")), p, pa), want_d=_effective(wants(hpas.get("decode")), d, da),
    )  # fmt: skip
    (p_lo, p_hi), (d_lo, d_hi), note = _ranges(pair)
    pl, ph = _clip(p_lo, p_hi, pa)
    dl, dh = _clip(d_lo, d_hi, da)
    return {"prefill": Bounds(pl, ph, note), "decode": Bounds(dl, dh, note)}


def start_replicas(
    spec: HybridPDDeploymentSpec, serving: Mapping[str, Any], bounds: Mapping[str, Bounds]
) -> dict[str, int]:
    """The count each autoscaling role's Deployment of a generation starts at: what the serving generation runs now
    (`serving`: each role's Deployment spec.replicas, its HPA's choice; None when nothing serves: spec.<role>.replicas),
    within the role's HPA bounds. A new generation thus takes traffic with the capacity the old one had, and a first
    one starts where the user said."""
    out: dict[str, int] = {}
    for role in autoscaled_roles(spec):
        n = serving.get(role)
        n = n if isinstance(n, int) and n > 0 else spec.role(role).replicas
        b = bounds.get(role)
        if b is not None:
            n = min(max(n, b.min_replicas), b.max_replicas)
        out[role] = n
    return out


@dataclass(frozen=True)
class _Pair:
    """What runs (p prefill, d decode), the band [rmin, rmax], which way each HPA wants, the user's ranges."""

    p: int
    d: int
    rmin: float
    rmax: float
    want_p: int
    want_d: int
    pa: AutoscalingSpec
    da: AutoscalingSpec


def _effective(want: int, cur: int, a: AutoscalingSpec) -> int:
    """A wish the user's own range allows (a role at its maxReplicas that wants more is not growing)."""
    if want == UP and cur >= a.max_replicas:
        return HOLD
    if want == DOWN and cur <= a.min_replicas:
        return HOLD
    return want


def _floor(x: float) -> int:
    return 10**9 if math.isinf(x) else math.floor(x + 1e-9)


def _ceil(x: float) -> int:
    return math.ceil(x - 1e-9)


Range = tuple[int, int]


def _ranges(x: _Pair) -> tuple[Range, Range, str | None]:
    """(prefill range, decode range, note) before the user's ranges are applied."""
    p, d, rmin, rmax = x.p, x.d, x.rmin, x.rmax
    band = f"decode/prefill in [{rmin:g}, {rmax:g}]"
    d_need, p_need = _ceil(rmin * p), _ceil(d / rmax) if not math.isinf(rmax) else 1
    if d < d_need:
        return (p, p), (d_need, max(d_need, _floor(rmax * p))), f"{band}: decode raised to {d_need} to restore it"
    if p < p_need:
        hi = max(p_need, _floor(d / rmin) if rmin > 0 else p_need)
        return (p_need, hi), (d, d), f"{band}: prefill raised to {p_need} to restore it"
    p_hi = _floor(d / rmin) if rmin > 0 else 10**9
    d_hi = _floor(rmax * p)
    if UP in (x.want_p, x.want_d) or (x.want_p == HOLD and x.want_d == HOLD):
        return _grow(x, band, p_hi, d_hi)
    # One role holds while the other wants to shrink (held at the band's floor, or a one-scrape dip): the holding
    # role stays where it is and the other gets the whole band at that size, so it can also grow again without
    # waiting for the next reconcile (a decode held at 3 by prefill's 3 kept a max of 3 until the resync).
    if x.want_p == HOLD:
        return (p, p), (d_need, d_hi), f"{band}: prefill holds at {p}; decode anywhere in the band"
    if x.want_d == HOLD:
        return (max(p_need, 1), p_hi), (d, d), f"{band}: decode holds at {d}; prefill anywhere in the band"
    return (min(max(p_need, 1), p), p), (min(max(d_need, 1), d), d), f"{band}: both roles may only shrink now"


def _grow(x: _Pair, band: str, p_hi: int, d_hi: int) -> tuple[Range, Range, str | None]:
    """Both roles may only grow; a role held by the band pulls the other up first."""
    p, d = x.p, x.d
    p_lo, d_lo, notes = p, d, []
    if x.want_p == UP and p_hi <= p:
        step = _ceil(x.rmin * (p + 1))
        if step <= min(d_hi, x.da.max_replicas):
            d_lo = max(d, step)
            notes.append(f"prefill wants more than the band allows at {d} decode: decode raised to {d_lo} first")
        else:
            notes.append(f"prefill held at {p} (decode cannot grow first)")
    if x.want_d == UP and d_hi <= d:
        step = _ceil((d + 1) / x.rmax)
        if step <= min(p_hi, x.pa.max_replicas):
            p_lo = max(p, step)
            notes.append(f"decode wants more than the band allows at {p} prefill: prefill raised to {p_lo} first")
        else:
            notes.append(f"decode held at {d} (prefill cannot grow first)")
    note = f"{band}: " + ("; ".join(notes) if notes else "both roles may only grow now")
    return (p_lo, max(p_lo, p_hi)), (d_lo, max(d_lo, d_hi)), note


# --- what the autoscaler decided (status.<role>.autoscaler) -------------------------------------------------------
_METRIC_SIGNAL = {s.metric: s.name for s in SIGNALS.values()}


def _quantity(q: object) -> float | None:
    """An HPA metric value (`9`, `500m`, `1500m`, `12k`) as a float."""
    if isinstance(q, int | float):
        return float(q)
    if not isinstance(q, str) or not q:
        return None
    scale = {"m": 1e-3, "k": 1e3, "M": 1e6, "G": 1e9}.get(q[-1])
    try:
        return float(q[:-1]) * scale if scale else float(q)
    except ValueError:
        return None


def signal_values(hpa: Mapping[str, Any] | None, targets: Mapping[str, float]) -> list[str]:
    """`signal value/target` per external metric the HPA last read (its per-replica average)."""
    out = []
    for m in ((hpa or {}).get("status") or {}).get("currentMetrics") or []:
        ext = m.get("external") or {}
        name = _METRIC_SIGNAL.get(str((ext.get("metric") or {}).get("name")))
        value = _quantity((ext.get("current") or {}).get("averageValue"))
        if name is not None and value is not None:
            out.append(f"{name} {value:.3g}/{targets.get(name, float('nan')):g}")
    return out


def decision(hpa: Mapping[str, Any] | None, bounds: Bounds, a: AutoscalingSpec) -> tuple[str, str]:
    """(decision, reason) of an HPA: Pending, NoMetrics, ScalingUp, ScalingDown, AtMax, AtMin, HeldByRatio, Steady."""
    st = (hpa or {}).get("status") or {}
    if hpa is None or not st.get("conditions"):
        return "Pending", "the autoscaler has not evaluated its metrics yet"
    active, limited, able = (_condition(hpa, t) for t in ("ScalingActive", "ScalingLimited", "AbleToScale"))
    words = "; ".join(f"{c['reason']}: {c.get('message', '')}" for c in (able, active, limited) if c.get("reason"))
    if bounds.note:
        words += f"; operator: {bounds.note}"
    if active.get("status") == "False":
        return "NoMetrics", words
    desired, current = st.get("desiredReplicas"), st.get("currentReplicas")
    if isinstance(desired, int) and isinstance(current, int) and desired != current:
        return ("ScalingUp" if desired > current else "ScalingDown"), words
    if limited.get("status") == "True":
        up = limited.get("reason") == "TooManyReplicas"
        narrowed = bounds.max_replicas < a.max_replicas if up else bounds.min_replicas > a.min_replicas
        return ("HeldByRatio" if narrowed else ("AtMax" if up else "AtMin")), words
    return "Steady", words


def autoscaler_status(
    role: contract.Role, a: AutoscalingSpec, bounds: Bounds, hpa: Mapping[str, Any] | None, replicas: int | None
) -> dict[str, Any]:
    """status.<role>.autoscaler (camelCase)."""
    st = (hpa or {}).get("status") or {}
    what, why = decision(hpa, bounds, a)
    current = st.get("currentReplicas", replicas)
    # Without metrics the HPA's desiredReplicas reads 0 although it scales nothing: the count stays where it is
    desired = current if what in ("Pending", "NoMetrics") else st.get("desiredReplicas", current)
    out: dict[str, Any] = {
        "minReplicas": bounds.min_replicas,
        "maxReplicas": bounds.max_replicas,
        "decision": what,
        "reason": why[:4000],
        "signals": signal_values(hpa, dict(signals_of(role, a))),
        "summary": f"{current if current is not None else '-'}->{desired if desired is not None else '-'} {what}",
    }
    for key, value in (("currentReplicas", current), ("desiredReplicas", desired),
                       ("lastScaleTime", st.get("lastScaleTime"))):  # fmt: skip
        if value is not None:
            out[key] = value
    return out
