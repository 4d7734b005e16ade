"""Token forcing's pure logic (services/controller/forcing.py): stats, Phase 0 δ, reports, verdict."""

from dataclasses import FrozenInstanceError, dataclass, field

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from specpilot.services.controller.forcing import (
    ForcingReport,
    ForcingSettings,
    SystemOutput,
    TokenStat,
    calibrate_delta,
    check_forcing,
    first_divergence,
    forcing_report,
    token_stats,
    verdict,
)


@dataclass
class S:  # stands in for the GPU worker's Scores / the proto's ScoredSequence
    argmax_token_ids: list = field(default_factory=list)
    token_logprob: list = field(default_factory=list)
    argmax_logprob: list = field(default_factory=list)


def scores_for(tokens, margins, argmax_other=999):
    """Scores where token i has the given margin (0 -> it is the argmax)."""
    return S([t if m == 0 else argmax_other for t, m in zip(tokens, margins)],
             [-1.0 - m for m in margins], [-1.0] * len(tokens))


def stat(margin, mismatch=True, rid="r", pos=0):
    return TokenStat(rid, pos, 1, 2 if mismatch else 1, mismatch, margin if mismatch else 0.0)


def report(tokens, mismatches, events, delta=0.25):
    """A report with the given counts (margins: events at 1.0, other mismatches at 0.1)."""
    stats = ([stat(1.0, pos=i) for i in range(events)] + [stat(0.1, pos=i) for i in range(events, mismatches)]
             + [stat(0.0, False, pos=i) for i in range(mismatches, tokens)])
    return forcing_report(stats, delta)


# ---- token_stats -------------------------------------------------------------------------


def test_token_stats_mismatch_margin_and_context():
    prompt = list(range(100, 110))
    tokens = [1, 2, 3, 4]
    s = S([1, 7, 3, 9], [-0.5, -2.0, -0.1, -3.0], [-0.5, -0.25, -0.1, -1.0])
    stats = token_stats(s, tokens, "q", prompt)
    assert [t.mismatch for t in stats] == [False, True, False, True]
    assert [t.margin for t in stats] == [0.0, 1.75, 0.0, 2.0]
    assert [t.argmax for t in stats] == [1, 7, 3, 9]
    assert stats[3].context == (104, 105, 106, 107, 108, 109, 1, 2, 3)[-8:]
    assert stats[0].context == tuple(prompt[-8:])
    assert token_stats(s, tokens)[1].context == (1,)  # no prompt: only earlier output tokens
    assert all(t.request_id == "q" for t in stats) and [t.position for t in stats] == [0, 1, 2, 3]


def test_token_stats_rejects_bad_scores():
    with pytest.raises(ValueError, match="lengths"):
        token_stats(S([1], [0.0], [0.0]), [1, 2])
    with pytest.raises(ValueError, match="not its maximum"):
        token_stats(S([5], [-1.0], [-2.0]), [1])
    assert token_stats(S([5], [-1.0], [-1.0 - 1e-9]), [1])[0].margin == 0.0  # rounding slack, clamped


# ---- Phase 0: δ -------------------------------------------------------------------------


def test_delta_rounds_the_largest_first_divergence_margin_up_to_eighths():
    stock = {"a": [1, 2, 3, 4], "b": [5, 6, 7]}
    ar = {"a": [1, 2, 9, 9], "b": [5, 8, 7]}
    # margins of stock's tokens: a diverges at 2 (0.232), b at 1 (0.1); later larger margins do not count
    sc = {"a": scores_for(stock["a"], [0, 0, 0.232, 5.0]), "b": scores_for(stock["b"], [0, 0.1, 3.0])}
    assert calibrate_delta(stock, ar, sc) == 0.25


@pytest.mark.parametrize("margin, delta", [(0.232, 0.25), (0.25, 0.25), (0.5, 0.5), (0.125, 0.125),
                                           (0.2500001, 0.375), (0.01, 0.125), (1.0, 1.0), (1.3, 1.375)])
def test_delta_rounding(margin, delta):
    assert calibrate_delta([[1, 2]], [[1, 3]], [scores_for([1, 2], [0, margin])]) == delta


def test_delta_without_divergence_or_at_an_exact_tie_is_one_eighth():
    assert calibrate_delta([[1, 2], [3]], [[1, 2], [3]], [scores_for([1, 2], [0, 0]), scores_for([3], [0])]) == 0.125
    assert calibrate_delta([[1, 2, 3]], [[1, 2]], [scores_for([1, 2, 3], [0, 0, 4.0])]) == 0.125  # prefix: none
    # stock's token at the divergence is the scorer's argmax (AR was the one that moved): margin 0
    assert calibrate_delta([[1, 2]], [[1, 4]], [scores_for([1, 2], [0, 0])]) == 0.125


def test_delta_needs_the_same_requests():
    with pytest.raises(ValueError, match="same requests"):
        calibrate_delta({"a": [1]}, {"b": [1]}, {"a": scores_for([1], [0])})


def test_first_divergence():
    assert first_divergence([1, 2, 3], [1, 2, 4]) == 2
    assert first_divergence([1, 2], [1, 2, 3]) is None
    assert first_divergence([], [1]) is None


# ---- reports ------------------------------------------------------------------------------


def test_events_are_mismatches_at_or_above_two_delta():
    stats = [stat(0.499, pos=0), stat(0.5, pos=1), stat(0.75, pos=2), stat(0.0, False, pos=3),
             stat(0.0, pos=4)]  # an exact tie that is still a mismatch
    r = forcing_report(stats, 0.25)
    assert (r.tokens, r.mismatches, r.events) == (5, 4, 2)
    assert r.event_threshold == 0.5
    assert r.mismatch_rate == 0.8 and r.event_rate == 0.4
    assert [(e.position, e.margin) for e in r.worst_events] == [(2, 0.75), (1, 0.5)]


def test_report_quantiles_and_worst_events():
    stats = [stat(float(i), rid=f"r{i % 3}", pos=i) for i in range(1, 101)] + [stat(0.0, False, pos=200)]
    r = forcing_report(stats, 0.125)
    q = r.margin_quantiles
    assert q["0.5"] == pytest.approx(50.5) and q["0.9"] == pytest.approx(90.1)
    assert q["0.99"] == pytest.approx(99.01) and q["max"] == 100.0
    assert len(r.worst_events) == 10 and [e.margin for e in r.worst_events] == [float(m) for m in range(100, 90, -1)]
    d = r.to_dict()
    assert d["mismatch_rate"] == 100 / 101 and d["worst_events"][0]["request_id"] == "r1"
    assert {"request_id", "position", "token", "argmax", "margin", "context"} == d["worst_events"][0].keys()


def test_empty_report():
    r = forcing_report([], 0.125)
    assert (r.tokens, r.mismatch_rate, r.event_rate) == (0, 0.0, 0.0)
    assert r.margin_quantiles == {"0.5": None, "0.9": None, "0.99": None, "max": None}
    with pytest.raises(ValueError):
        forcing_report([], 0.0)


margins = st.one_of(st.just(0.0), st.floats(0.0, 20.0, allow_nan=False))


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.booleans(), margins), max_size=60), st.integers(1, 16))
def test_report_rates_and_events_subset_property(rows, eighths):
    tokens = list(range(len(rows)))
    s = S([t + 1000 if mism else t for t, (mism, _) in zip(tokens, rows)],
          [-m if mism else -0.5 for mism, m in rows], [0.0 if mism else -0.5 for mism, _ in rows])
    stats = token_stats(s, tokens, "r")
    delta = eighths / 8
    r = forcing_report(stats, delta)
    assert 0.0 <= r.mismatch_rate <= 1.0 and 0.0 <= r.event_rate <= 1.0
    assert r.event_rate <= r.mismatch_rate and r.events <= r.mismatches <= r.tokens == len(rows)
    assert r.mismatches == sum(mism for mism, _ in rows)
    assert r.events == sum(1 for mism, m in rows if mism and m >= 2 * delta)
    by_pos = {t.position: t for t in stats}
    for e in r.worst_events:  # every listed event is a mismatch at or above 2δ
        assert by_pos[e.position].mismatch and e.margin >= 2 * delta
    assert len(r.worst_events) == min(10, r.events)


# ---- verdict ------------------------------------------------------------------------------


def test_verdict_passes_a_system_like_stock():
    ok, reasons = verdict(report(10000, 73, 52), report(10000, 72, 53))
    assert ok and reasons == []


def test_verdict_mismatch_excess_boundary():
    stock = report(1000, 10, 0)
    assert verdict(report(1000, 15, 0), stock) == (True, [])  # exactly +0.5 pp: allowed
    ok, reasons = verdict(report(1000, 16, 0), stock)  # +0.6 pp
    assert not ok and len(reasons) == 1 and "mismatch rate" in reasons[0] and "0.5 percentage points" in reasons[0]
    assert verdict(report(10000, 150, 0), report(10000, 100, 0)) == (True, [])  # the same at another scale
    assert not verdict(report(10000, 151, 0), report(10000, 100, 0))[0]
    assert verdict(report(1000, 16, 0), stock, ForcingSettings(max_mismatch_excess=0.006)) == (True, [])


def test_verdict_event_rate_boundary():
    stock = report(1000, 10, 5)
    assert verdict(report(1000, 10, 5), stock)[0]  # equal event rate: allowed
    assert verdict(report(2000, 20, 10), stock)[0]  # equal rate, other counts
    ok, reasons = verdict(report(1000, 10, 6), stock)
    assert not ok and len(reasons) == 1 and "event rate" in reasons[0]
    assert verdict(report(1000, 10, 6), stock, ForcingSettings(event_tolerance=0.001))[0]
    assert not verdict(report(1000, 10, 7), stock, ForcingSettings(event_tolerance=0.001))[0]
    assert verdict(report(1000, 10, 0), report(1000, 10, 0))[0]  # no events on either side


def test_verdict_reports_both_failures_and_the_paper_defect():
    ok, reasons = verdict(report(10000, 200, 240), report(10000, 72, 53))  # ~2.0 % / 2.4 % vs 0.72 %
    assert not ok and len(reasons) == 2


def test_verdict_refuses_empty_and_mismatched_reports():
    assert verdict(report(0, 0, 0), report(100, 1, 0)) == (False, ["the candidate produced no tokens to score"])
    assert not verdict(report(100, 0, 0), report(0, 0, 0))[0]
    with pytest.raises(ValueError, match="event thresholds"):
        verdict(report(100, 1, 0, delta=0.25), report(100, 1, 0, delta=0.125))


def test_settings_are_frozen_and_checked():
    s = ForcingSettings()
    assert (s.max_mismatch_excess, s.event_tolerance, s.event_factor) == (0.005, 0.0, 2.0)
    with pytest.raises(FrozenInstanceError):
        s.max_mismatch_excess = 0.1
    with pytest.raises(ValueError):
        ForcingSettings(max_mismatch_excess=-0.01)
    assert isinstance(report(1, 0, 0), ForcingReport)


# ---- a whole check with a fake scorer -----------------------------------------------------


def test_check_forcing_with_a_fake_scorer():
    # the scorer's argmax after any prefix is 7; log p(7) = -0.1, every other token -3.1 (margin 3)
    def score(prompt, tokens):
        return S([7] * len(tokens), [-0.1 if t == 7 else -3.1 for t in tokens], [-0.1] * len(tokens))

    base = [SystemOutput(f"r{i}", (1, 2), (7,) * 50) for i in range(4)]
    cand = [SystemOutput(f"r{i}", (1, 2), (7,) * 49 + (3,)) for i in range(4)]
    out = check_forcing(cand, base, score, 0.25)
    assert out["passed"] is False and len(out["reasons"]) == 2
    assert out["candidate"]["mismatches"] == 4 and out["candidate"]["events"] == 4
    assert out["baseline"]["mismatches"] == 0 and out["delta"] == 0.25
    assert out["candidate"]["worst_events"][0]["context"] == [7] * 8
    assert check_forcing(base, base, score, 0.25)["passed"] is True
    with pytest.raises(ValueError, match="same requests"):
        check_forcing(cand[:3], base, score, 0.25)
    with pytest.raises(ValueError, match="prompts differ"):
        check_forcing([SystemOutput("r0", (9,), (7,))] + cand[1:], base, score, 0.25)
