"""Token forcing: is a system's output lossless? (docs/METHOD.md §4.) Pure logic, no torch, no engine.

The scorer (the stock target with an FP32 LM head, run by a GPU worker) teacher-forces a system's
output and reports, per output token, its own argmax, log p(token) and log p(argmax). Here:

- a token is a **mismatch** if it differs from the scorer's argmax; its **margin** is
  log p(argmax) - log p(token) (>= 0; 0 for a match);
- **Phase 0** calibrates the near-tie threshold δ from stock against AR: the largest margin (of
  stock's token) at each request's first divergence, rounded up to a multiple of 1/8;
- an **event** is a mismatch with margin >= 2δ (a near-tie cannot explain it);
- the **verdict** rejects a candidate whose mismatch rate exceeds stock's by more than 0.5
  percentage points, or whose event rate exceeds stock's.

Scores arrive as any object with the proto `ScoredSequence` fields `argmax_token_ids`,
`token_logprob` and `argmax_logprob` (the GPU worker's `Scores`, or the gRPC message itself); the
controller holds the tokens it sent, so they are passed beside the scores. The scorer is reached
only through a callable (`ScoreFn`): the GPU worker's gRPC stub in production, a local scorer in
the CLI and tests.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from fractions import Fraction
from typing import Any, Protocol

DELTA_STEP = Fraction(1, 8)  # δ is a multiple of this
CONTEXT_TOKENS = 8  # tokens shown before a worst event
WORST_EVENTS = 10  # worst events kept in a report
QUANTILES = (0.5, 0.9, 0.99)  # of mismatch margins (plus the max)
MARGIN_SLACK = 1e-6  # a mismatch's margin may come out this far below 0 from rounding; clamped to 0
ROUND_SLACK = 1e-9  # calibrate_delta: a margin this close above a multiple of 1/8 counts as on it


class ScoresLike(Protocol):
    argmax_token_ids: Sequence[int]
    token_logprob: Sequence[float]
    argmax_logprob: Sequence[float]


@dataclass(frozen=True)
class ForcingSettings:
    """The verdict's thresholds (docs/METHOD.md §4)."""

    max_mismatch_excess: float = 0.005  # candidate mismatch rate may exceed stock's by this (0.5 pp)
    event_tolerance: float = 0.0  # candidate event rate may exceed stock's by this
    event_factor: float = 2.0  # an event is a mismatch with margin >= event_factor * δ

    def __post_init__(self):
        for name in ("max_mismatch_excess", "event_tolerance"):
            v = getattr(self, name)
            if not (0.0 <= v <= 1.0):
                raise ValueError(f"ForcingSettings.{name} is a rate difference in [0, 1]; got {v}")
        if not self.event_factor > 0:
            raise ValueError(f"ForcingSettings.event_factor must be > 0; got {self.event_factor}")


@dataclass(frozen=True)
class TokenStat:
    request_id: str
    position: int  # index in the output (prompt excluded)
    token: int
    argmax: int  # the scorer's argmax there
    mismatch: bool  # token != argmax
    margin: float  # log p(argmax) - log p(token); 0.0 when not a mismatch
    context: tuple[int, ...] = ()  # up to CONTEXT_TOKENS tokens before the position (prompt included)


@dataclass(frozen=True)
class WorstEvent:
    request_id: str
    position: int
    token: int
    argmax: int
    margin: float
    context: tuple[int, ...]


@dataclass(frozen=True)
class ForcingReport:
    delta: float
    event_threshold: float  # event_factor * δ
    tokens: int
    mismatches: int
    events: int
    margin_quantiles: dict[str, float | None]  # "0.5", "0.9", "0.99", "max" of mismatch margins
    worst_events: tuple[WorstEvent, ...] = field(default=())

    @property
    def mismatch_rate(self) -> float:
        return self.mismatches / self.tokens if self.tokens else 0.0

    @property
    def event_rate(self) -> float:
        return self.events / self.tokens if self.tokens else 0.0

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["worst_events"] = [{**asdict(e), "context": list(e.context)} for e in self.worst_events]
        d["mismatch_rate"], d["event_rate"] = self.mismatch_rate, self.event_rate
        return d


def token_stats(scores: ScoresLike, tokens: Sequence[int], request_id: str = "",
                prompt_ids: Sequence[int] = ()) -> list[TokenStat]:
    """One TokenStat per output token, from the scorer's view of `tokens`."""
    n = len(tokens)
    lens = (len(scores.argmax_token_ids), len(scores.token_logprob), len(scores.argmax_logprob))
    if any(k != n for k in lens):
        raise ValueError(f"request {request_id!r}: {n} tokens but scores of lengths {lens}")
    stream = list(prompt_ids) + list(tokens)
    p = len(prompt_ids)
    out = []
    for i, (tok, best, lp_tok, lp_best) in enumerate(zip(tokens, scores.argmax_token_ids, scores.token_logprob,
                                                         scores.argmax_logprob)):
        tok, best = int(tok), int(best)
        mismatch = tok != best
        margin = 0.0
        if mismatch:
            margin = float(lp_best) - float(lp_tok)
            if not margin >= -MARGIN_SLACK:  # also catches NaN
                raise ValueError(f"request {request_id!r} position {i}: log p(argmax) {lp_best} is below "
                                 f"log p(token) {lp_tok}; the scorer's argmax is not its maximum")
            margin = max(margin, 0.0)
        ctx = tuple(stream[max(0, p + i - CONTEXT_TOKENS): p + i])
        out.append(TokenStat(request_id, i, tok, best, mismatch, margin, ctx))
    return out


def _by_id(x) -> dict:
    return dict(x) if isinstance(x, Mapping) else dict(enumerate(x))


def first_divergence(a: Sequence[int], b: Sequence[int]) -> int | None:
    """The first index where a and b hold different tokens; None if one is a prefix of the other."""
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)


def calibrate_delta(stock_tokens, ar_tokens, stock_scores) -> float:
    """Phase 0: δ from stock against AR on one workload.

    All three arguments are per request, either mappings keyed by request id or sequences in the
    same order: stock's output tokens, AR's output tokens, and the scorer's scores of stock's
    output. For each request, take the first position where stock and AR differ (outputs where
    one is a prefix of the other have none); δ is the largest margin of stock's token at those
    positions, rounded UP to a multiple of 1/8 (margins within ROUND_SLACK above a multiple stay
    on it). δ is at least 1/8: with no divergence anywhere, or only exact ties (margin 0), δ = 1/8
    (a δ of 0 would make every mismatch an event).
    """
    stock, ar, sc = _by_id(stock_tokens), _by_id(ar_tokens), _by_id(stock_scores)
    if stock.keys() != ar.keys() or stock.keys() != sc.keys():
        raise ValueError("calibrate_delta: stock tokens, AR tokens and stock scores must cover the same requests")
    largest = 0.0
    for rid, toks in stock.items():
        i = first_divergence(toks, ar[rid])
        if i is None:
            continue
        stat = token_stats(sc[rid], toks, str(rid))[i]
        largest = max(largest, stat.margin)
    steps = max(1, math.ceil(largest / DELTA_STEP - ROUND_SLACK))
    return float(steps * DELTA_STEP)


def _quantile(sorted_values: list[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default method)."""
    pos = q * (len(sorted_values) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)


def forcing_report(stats: Sequence[TokenStat], delta: float, settings: ForcingSettings | None = None) -> ForcingReport:
    """Mismatch and event counts over all scored tokens of a system (every request together)."""
    settings = settings or ForcingSettings()
    if not delta > 0:
        raise ValueError(f"δ must be > 0; got {delta}")
    threshold = settings.event_factor * delta
    mism = [s for s in stats if s.mismatch]
    events = [s for s in mism if s.margin >= threshold]
    margins = sorted(s.margin for s in mism)
    quant: dict[str, float | None] = {str(q): (_quantile(margins, q) if margins else None) for q in QUANTILES}
    quant["max"] = margins[-1] if margins else None
    worst = sorted(events, key=lambda s: (-s.margin, str(s.request_id), s.position))[:WORST_EVENTS]
    return ForcingReport(
        delta=delta, event_threshold=threshold, tokens=len(stats), mismatches=len(mism), events=len(events),
        margin_quantiles=quant,
        worst_events=tuple(WorstEvent(s.request_id, s.position, s.token, s.argmax, s.margin, s.context)
                           for s in worst),
    )


def _exact(x: float) -> Fraction:
    """A setting as the decimal it was written as (0.005 is 1/200, not the nearest double)."""
    return Fraction(repr(x))


def verdict(candidate: ForcingReport, stock: ForcingReport,
            settings: ForcingSettings | None = None) -> tuple[bool, list[str]]:
    """(passed, reasons). Rates are compared exactly, as fractions of counts: a candidate exactly
    at a limit passes."""
    settings = settings or ForcingSettings()
    if candidate.event_threshold != stock.event_threshold:
        raise ValueError(f"reports were made with different event thresholds ({candidate.event_threshold} vs "
                         f"{stock.event_threshold}); build both with the same δ and settings")
    reasons = []
    if candidate.tokens == 0:
        reasons.append("the candidate produced no tokens to score")
    if stock.tokens == 0:
        reasons.append("the stock baseline produced no tokens to score")
    if reasons:
        return False, reasons
    c_mm, s_mm = Fraction(candidate.mismatches, candidate.tokens), Fraction(stock.mismatches, stock.tokens)
    c_ev, s_ev = Fraction(candidate.events, candidate.tokens), Fraction(stock.events, stock.tokens)
    excess = _exact(settings.max_mismatch_excess)
    if c_mm > s_mm + excess:
        reasons.append(f"mismatch rate {float(c_mm):.4%} ({candidate.mismatches}/{candidate.tokens}) exceeds "
                       f"stock's {float(s_mm):.4%} ({stock.mismatches}/{stock.tokens}) by more than "
                       f"{float(excess) * 100:g} percentage points")
    tol = _exact(settings.event_tolerance)
    if c_ev > s_ev + tol:
        reasons.append(f"event rate {float(c_ev):.4%} ({candidate.events}/{candidate.tokens} mismatches with margin "
                       f">= {candidate.event_threshold:g} nat) exceeds stock's {float(s_ev):.4%} "
                       f"({stock.events}/{stock.tokens})" + (f" by more than {float(tol) * 100:g} percentage points"
                                                              if tol else ""))
    return not reasons, reasons


# ---- one whole token-forcing check (what the CLI and, later, the round run) --------------------


@dataclass(frozen=True)
class SystemOutput:
    """One request's output from a system."""

    id: str
    prompt_ids: tuple[int, ...]
    tokens: tuple[int, ...]


ScoreFn = Callable[[Sequence[int], Sequence[int]], ScoresLike]  # (prompt_ids, tokens) -> scores


def system_stats(outputs: Sequence[SystemOutput], score: ScoreFn) -> list[TokenStat]:
    stats = []
    for o in outputs:
        stats += token_stats(score(o.prompt_ids, o.tokens), o.tokens, o.id, o.prompt_ids)
    return stats


def check_forcing(candidate: Sequence[SystemOutput], baseline: Sequence[SystemOutput], score: ScoreFn,
                  delta: float, settings: ForcingSettings | None = None) -> dict[str, Any]:
    """Score a candidate's and stock's outputs on the same requests; report both and the verdict.
    Returns {"candidate": report, "baseline": report, "delta", "passed", "reasons"} (JSON-ready)."""
    settings = settings or ForcingSettings()
    cand_ids, base_ids = [o.id for o in candidate], [o.id for o in baseline]
    if len(set(cand_ids)) != len(cand_ids) or len(set(base_ids)) != len(base_ids):
        raise ValueError("request ids must be unique within a system's outputs")
    if set(cand_ids) != set(base_ids):
        missing = sorted(set(base_ids) ^ set(cand_ids))[:5]
        raise ValueError(f"candidate and baseline must cover the same requests; differing ids: {missing}")
    prompts = {o.id: o.prompt_ids for o in baseline}
    bad = [o.id for o in candidate if tuple(o.prompt_ids) != tuple(prompts[o.id])][:5]
    if bad:
        raise ValueError(f"candidate and baseline prompts differ for requests {bad}")
    cand = forcing_report(system_stats(candidate, score), delta, settings)
    base = forcing_report(system_stats(baseline, score), delta, settings)
    passed, reasons = verdict(cand, base, settings)
    return {"candidate": cand.to_dict(), "baseline": base.to_dict(), "delta": delta, "passed": passed,
            "reasons": reasons}
