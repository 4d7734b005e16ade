"""Statistics of the controller's paired runs (services/controller/stats.py; docs/METHOD.md §5)."""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings as hsettings, strategies as st

from specpilot.services.controller import stats
from specpilot.services.controller.stats import (
    CANDIDATE,
    INCUMBENT,
    Cell,
    GainEstimate,
    PairedSample,
    Settings,
    decide,
    gain,
    pair,
    schedule,
    simulate,
    swapped,
)

CELLS = [Cell("humaneval", 1), Cell("humaneval", 8), Cell("stdlib", 1)]


# --- schedule ---------------------------------------------------------------------------------


def test_two_devices_each_cell_runs_both_systems_on_both_devices_swapped():
    runs = schedule(CELLS, devices=2, repeats=3)
    assert len(runs) == len(CELLS) * 3 * 4
    assert runs == schedule(CELLS, devices=2, repeats=3)  # deterministic
    counts = Counter((r.cell, r.system, r.device) for r in runs)
    assert set(counts) == {(c, s, d) for c in CELLS for s in (CANDIDATE, INCUMBENT) for d in (0, 1)}
    assert set(counts.values()) == {3}
    # each step: the two systems at the same time, on different devices
    by_step = defaultdict(list)
    for r in runs:
        by_step[r.step].append(r)
    for step_runs in by_step.values():
        assert sorted((r.system, r.device) for r in step_runs) in (
            [(CANDIDATE, 0), (INCUMBENT, 1)],
            [(CANDIDATE, 1), (INCUMBENT, 0)],
        )
        assert len({(r.cell, r.repeat, r.slot) for r in step_runs}) == 1
    # candidate on device 0 first, then swapped; repeats are the outer loop
    first = runs[:4]
    assert [(r.system, r.device, r.slot) for r in first] == [
        (CANDIDATE, 0, 0), (INCUMBENT, 1, 0), (CANDIDATE, 1, 1), (INCUMBENT, 0, 1)
    ]
    assert [r.repeat for r in runs] == sorted(r.repeat for r in runs)
    assert all(r.slot == r.device for r in runs if r.system == CANDIDATE)


def test_one_device_interleaves_abba():
    runs = schedule(CELLS, devices=1, repeats=2)
    assert len(runs) == len(CELLS) * 2 * 4
    assert {r.device for r in runs} == {0}
    assert [r.step for r in runs] == list(range(len(runs)))  # one at a time
    for k in range(0, len(runs), 4):
        block = runs[k : k + 4]
        assert len({(r.cell, r.repeat) for r in block}) == 1
        assert [r.system for r in block] == [CANDIDATE, INCUMBENT, INCUMBENT, CANDIDATE]
        assert [r.slot for r in block] == [0, 0, 1, 1]
    counts = Counter((r.cell, r.system) for r in runs)
    assert set(counts.values()) == {4}


@pytest.mark.parametrize(
    "cells, devices, repeats",
    [(CELLS, 3, 2), (CELLS, 0, 2), (CELLS, 2, 0), ([], 2, 2), ([Cell("a", 1), Cell("a", 1)], 2, 2)],
)
def test_schedule_rejects_bad_arguments(cells, devices, repeats):
    with pytest.raises(ValueError):
        schedule(cells, devices, repeats)


def test_pair_assembles_samples_from_runs():
    runs = schedule(CELLS[:1], devices=2, repeats=2)
    tps = [100.0 + i for i in range(len(runs))]
    samples = pair(runs, tps)
    assert len(samples) == 4
    s = next(s for s in samples if s.repeat == 1 and s.slot == 1)
    assert (s.candidate_tps, s.incumbent_tps) == (106.0, 107.0)
    with pytest.raises(ValueError):
        pair(runs[:-1], tps[:-1])  # an unpaired run
    with pytest.raises(ValueError):
        PairedSample("w", 1, 0, 0.0, 1.0, 0)  # a dead run is not a throughput


# --- gain -------------------------------------------------------------------------------------


def _samples(ratios: dict[Cell, float], repeats: int, base: float = 250.0) -> list[PairedSample]:
    return [
        PairedSample(c.workload, c.batch, slot, base * g, base, r)
        for c, g in ratios.items()
        for r in range(repeats)
        for slot in (0, 1)
    ]


def test_gain_of_exact_ratios_is_the_geometric_mean():
    ratios = {CELLS[0]: 1.1, CELLS[1]: 1.2, CELLS[2]: 0.9}
    est = gain(_samples(ratios, repeats=4))
    truth = (1.1 * 1.2 * 0.9) ** (1 / 3)
    assert est.gain == pytest.approx(truth, rel=1e-12)
    assert est.lower == pytest.approx(truth, rel=1e-12)  # no spread, no width
    assert dict(est.per_cell) == pytest.approx(ratios, rel=1e-12)
    assert len(est.per_repeat) == 4 and est.repeats == 4
    assert est.per_repeat == pytest.approx([math.log(truth)] * 4, rel=1e-12)


@pytest.mark.parametrize("true_gain", [0.97, 1.0, 1.12])
def test_noiseless_simulation_recovers_the_truth(true_gain):
    est = gain(simulate(true_gain, noise_cv=0.0, device_skew=0.3, repeats=3, cells=4, seed=0))
    assert est.gain == pytest.approx(true_gain, rel=1e-12)


def test_device_skew_cancels():
    # noiseless: a 30 % slower device 1, true gain 1.0 -> exactly 1.0 ...
    samples = simulate(1.0, noise_cv=0.0, device_skew=0.3, repeats=3, cells=2, seed=0)
    assert gain(samples).gain == pytest.approx(1.0, abs=1e-12)
    # ... although each half of the swap alone is off by the skew
    slot0 = [s.candidate_tps / s.incumbent_tps for s in samples if s.slot == 0]
    assert slot0 == pytest.approx([1 / 0.7] * len(slot0))
    # noisy: the same noise with and without the skew gives the same estimate
    a = gain(simulate(1.0, 0.07, 0.0, repeats=8, cells=4, seed=5))
    b = gain(simulate(1.0, 0.07, 0.3, repeats=8, cells=4, seed=5))
    assert b.gain == pytest.approx(a.gain, rel=1e-12)
    assert b.lower == pytest.approx(a.lower, rel=1e-12)
    assert abs(b.gain - 1.0) < 0.05


def test_abba_cancels_linear_drift_on_one_device():
    samples = simulate(1.05, noise_cv=0.0, device_skew=0.3, repeats=3, cells=2, seed=0, devices=1)
    assert gain(samples).gain == pytest.approx(1.05, rel=1e-12)


def test_lower_bound_is_below_the_estimate_and_tightens_with_repeats():
    widths = {}
    for repeats in (4, 16):
        ws = []
        for seed in range(20):
            est = gain(simulate(1.05, 0.07, 0.3, repeats, cells=4, seed=seed))
            assert est.lower < est.gain
            assert est.lower_bootstrap < est.gain
            ws.append(est.gain - est.lower)
        widths[repeats] = float(np.mean(ws))
    # the t half-width shrinks like t_{n-1} / sqrt(n): about 2.8x from 4 to 16 repeats
    assert widths[16] < widths[4] / 2


def test_gain_is_reproducible_and_the_bootstrap_is_seeded():
    samples = simulate(1.02, 0.07, 0.1, repeats=6, cells=3, seed=9)
    assert gain(samples, seed=3) == gain(samples, seed=3)
    assert gain(samples, seed=3).gain == gain(list(reversed(samples)), seed=4).gain


def test_gain_rejects_unbalanced_or_tiny_designs():
    samples = simulate(1.0, 0.07, 0.0, repeats=3, cells=2, seed=0)
    with pytest.raises(ValueError, match="unbalanced"):
        gain(samples[1:])  # one half of a swap missing
    with pytest.raises(ValueError, match="two samples"):
        gain(samples + samples[:1])
    with pytest.raises(ValueError, match="2 repeats"):
        gain([s for s in samples if s.repeat == 0])
    with pytest.raises(ValueError):
        gain([])


def test_t_quantile_matches_tables():
    for p, df, want in [
        (0.95, 1, 6.313751514675),
        (0.95, 4, 2.131846786327),
        (0.95, 9, 1.833112932653),
        (0.95, 29, 1.699127026533),
        (0.975, 10, 2.228138851986),
        (0.99, 5, 3.364929998),
    ]:
        assert stats.t_quantile(p, df) == pytest.approx(want, rel=1e-9)
    assert stats.t_quantile(0.05, 9) == pytest.approx(-1.833112932653, rel=1e-9)


# --- against independent references -----------------------------------------------------------
# Fixed samples whose per-repeat log ratios are known exactly; the expected bounds are worked by
# hand (below) and by scipy.stats, which shares no code with stats.py's arithmetic.
#
# CAND: per-repeat log ratios d = 0.10, 0.05, 0.12, 0.08, 0.07 (n = 5).
#   mean 0.084; squared deviations 0.000256 + 0.001156 + 0.001296 + 0.000016 + 0.000196 = 0.00292
#   sample sd = √(0.00292 / 4) = 0.0270185; se = sd / √5 = 0.0120830; t(0.95, 4) = 2.1318468
#   lower = exp(0.084 − 2.1318468 · 0.0120830) = exp(0.0582408) = 1.0599702
# STOCK (A/A): d = 0.01, −0.01, 0.00, 0.02, −0.02: mean 0, sample sd = √(0.001 / 4) = 0.0158114,
#   se = 0.0070711, lower = exp(−0.0150744) = 0.9850386; stock noise = |1 − 1| + (1 − 0.9850386)
#   = 0.0149614; bar = 0.01 + 2 · 0.0149614 = 0.0399228.
CAND_D = [0.10, 0.05, 0.12, 0.08, 0.07]
STOCK_D = [0.01, -0.01, 0.00, 0.02, -0.02]


def _fixed(per_repeat: list[float], cells=CELLS[:2]) -> list[PairedSample]:
    """Samples whose per-repeat value (mean over cells of the slot-averaged log ratio) is exactly
    per_repeat[r]: the slots and the cells differ, their averages do not."""
    out = []
    for r, d in enumerate(per_repeat):
        for j, c in enumerate(cells):
            shift = 0.03 * (1 if j == 0 else -1)  # cells off the repeat's value by ±0.03
            for slot, skew in ((0, 0.2), (1, -0.2)):  # a device effect that the swap cancels
                out.append(PairedSample(c.workload, c.batch, slot, 300.0 * math.exp(d + shift + skew), 300.0, r))
    return out


def test_lower_bound_matches_the_hand_computation_and_scipy():
    scipy_stats = pytest.importorskip("scipy.stats")
    est = gain(_fixed(CAND_D))
    assert est.per_repeat == pytest.approx(CAND_D, abs=1e-12)
    assert est.gain == pytest.approx(math.exp(0.084), rel=1e-12)
    assert est.std_err == pytest.approx(0.0120830, abs=1e-7)
    assert est.t_quantile == pytest.approx(2.1318468, abs=1e-7)
    assert est.lower == pytest.approx(1.0599702, abs=1e-7)
    ref = scipy_stats.ttest_1samp(CAND_D, 0.0, alternative="greater").confidence_interval(0.95).low
    assert math.log(est.lower) == pytest.approx(ref, rel=1e-10)
    for conf in (0.9, 0.99):
        ref = scipy_stats.ttest_1samp(CAND_D, 0.0, alternative="greater").confidence_interval(conf).low
        assert math.log(gain(_fixed(CAND_D), confidence=conf).lower) == pytest.approx(ref, rel=1e-10)


def test_bootstrap_bound_matches_the_exact_bootstrap_distribution_and_scipy():
    """n = 5 repeats: all 5⁵ equally likely resamples can be enumerated, so the percentile
    bootstrap's 5 % quantile is known exactly (0.066: hand-checkable, the 157th of 3125 sorted
    resample means); the seeded Monte Carlo bound and scipy's must land on it."""
    scipy_stats = pytest.importorskip("scipy.stats")
    from itertools import product

    means = sorted(sum(c) / 5 for c in product(CAND_D, repeat=5))
    exact = float(np.quantile(means, 0.05))
    assert exact == pytest.approx(0.066, abs=1e-12)
    est = gain(_fixed(CAND_D), bootstrap_resamples=20_000, seed=1)
    assert math.log(est.lower_bootstrap) == pytest.approx(exact, abs=0.002)
    ref = scipy_stats.bootstrap((np.array(CAND_D),), np.mean, confidence_level=0.95, alternative="greater",
                                method="percentile", n_resamples=20_000, random_state=0).confidence_interval.low
    assert math.log(est.lower_bootstrap) == pytest.approx(ref, abs=0.002)


def test_decision_matches_the_hand_computation():
    cand, stock = gain(_fixed(CAND_D)), gain(_fixed(STOCK_D))
    assert stock.gain == pytest.approx(1.0, abs=1e-12)
    assert stock.lower == pytest.approx(0.9850386, abs=1e-7)
    d = decide(cand, stock, outputs_differ=False)
    assert d.stock_noise == pytest.approx(0.0149614, abs=1e-7)
    assert d.threshold == pytest.approx(0.0399228, abs=1e-7)
    assert d.accepted  # 0.0599702 > 0.0399228
    assert decide(cand, stock, outputs_differ=True).accepted  # and ≥ 0.03
    # a bar of 1 % + 4 × noise = 0.0698456 is above the bound: rejected
    assert not decide(cand, stock, False, Settings(noise_multiplier=4.0)).accepted
    # the same spread around a smaller gain: d − 0.04 has lower bound exp(0.0182408) − 1 < the bar
    assert not decide(gain(_fixed([x - 0.04 for x in CAND_D])), stock, False).accepted


# --- decide -----------------------------------------------------------------------------------


def _est(g: float, lower: float, confidence: float = 0.95) -> GainEstimate:
    return GainEstimate(
        gain=g, lower=lower, lower_bootstrap=lower, confidence=confidence, repeats=10,
        cells=(Cell("w", 1),), per_repeat=(), per_cell=(), log_gain=math.log(g), std_err=0.0,
        t_quantile=1.83, bootstrap_resamples=0, seed=0,
    )


def test_stock_noise_is_distance_from_one_plus_half_width():
    assert stats.stock_noise(_est(1.25, 1.0)) == 0.5
    assert stats.stock_noise(_est(0.98, 0.96)) == pytest.approx(0.04)
    assert stats.stock_noise(_est(1.0, 1.0)) == 0.0


def test_decide_exact_boundaries():
    quiet = _est(1.0, 1.0)  # stock noise 0
    cand = _est(1.6, 1.5)  # lower - 1 == 0.5 exactly
    # strict: lower - 1 must exceed min_gain + k * noise
    assert not decide(cand, quiet, False, Settings(min_gain=0.5)).accepted
    assert decide(cand, quiet, False, Settings(min_gain=0.25)).accepted
    # noise term: stock 1.25 with lower 1.0 -> noise 0.5, bar = 0 + 1 * 0.5
    noisy = _est(1.25, 1.0)
    assert not decide(cand, noisy, False, Settings(min_gain=0.0, noise_multiplier=1.0)).accepted
    d = decide(cand, noisy, False, Settings(min_gain=0.0, noise_multiplier=0.75))
    assert d.accepted and d.threshold == 0.375 and d.stock_noise == 0.5
    # differing outputs: >= differing_output_min_gain (inclusive)
    d = decide(cand, quiet, True, Settings(min_gain=0.25, differing_output_min_gain=0.5))
    assert d.accepted and d.threshold == 0.5
    d = decide(cand, quiet, True, Settings(min_gain=0.25, differing_output_min_gain=0.75))
    assert not d.accepted and d.threshold == 0.75


def test_decide_with_default_settings():
    s = Settings()
    assert (s.min_gain, s.noise_multiplier, s.differing_output_min_gain, s.confidence) == (0.01, 2.0, 0.03, 0.95)
    stock = _est(1.01, 1.0)  # noise 0.01 + 0.01 = 0.02 -> bar 0.01 + 2 * 0.02 = 0.05
    assert decide(_est(1.1, 1.05 + 1e-9), stock, False).accepted
    d = decide(_est(1.1, 1.05 - 1e-9), stock, False)
    assert not d.accepted and d.threshold == pytest.approx(0.05)
    assert d.reasons[-1] == "rejected"
    # outputs differ: the 3 % floor binds when noise is low
    quiet = _est(1.0, 1.0)
    assert decide(_est(1.05, 1.02), quiet, False).accepted
    d = decide(_est(1.05, 1.02), quiet, True)
    assert not d.accepted and d.threshold == 0.03
    assert any("outputs differ" in r for r in d.reasons)
    # the decision rests on the t bound, not the bootstrap
    cand = replace(_est(1.1, 1.06), lower_bootstrap=1.04)
    d = decide(cand, stock, False)
    assert d.accepted and any("bootstrap" in r and "other way" in r for r in d.reasons)


def test_decide_refuses_nonsense():
    stock = _est(1.0, 1.0)
    assert not decide(_est(1.2, float("nan")), stock, False).accepted
    assert not decide(_est(1.2, 1.15), _est(1.0, float("nan")), False).accepted
    with pytest.raises(ValueError, match="confidence"):
        decide(_est(1.2, 1.1, confidence=0.9), stock, False)


# --- self-test --------------------------------------------------------------------------------


def test_selftest_meets_the_bars():
    res = stats.selftest(trials=200, seed=0)
    assert res["aa_trials"] == res["slowdown_trials"] == res["speedup_trials"] == 200
    assert res["aa_accepted"] <= 0.05 * res["aa_trials"]
    assert res["slowdown_accepted"] == 0
    assert res["speedup_accepted"] >= 0.95 * res["speedup_trials"]
    assert res["swap_inverts"] is True
    assert res["repeats"] == stats.SELFTEST_REPEATS
    # the t bound alone is calibrated: A/A clears 1 in about 5 % of trials
    assert res["aa_lower_above_one"] <= 0.1 * res["aa_trials"]


def test_simulate_is_deterministic():
    assert simulate(1.1, 0.07, 0.2, 3, 2, seed=1) == simulate(1.1, 0.07, 0.2, 3, 2, seed=1)
    assert simulate(1.1, 0.07, 0.2, 3, 2, seed=1) != simulate(1.1, 0.07, 0.2, 3, 2, seed=2)


# --- swap property ----------------------------------------------------------------------------

_tps = st.floats(min_value=1e-3, max_value=1e6, allow_nan=False, allow_infinity=False)


@st.composite
def _designs(draw):
    n_cells = draw(st.integers(1, 3))
    repeats = draw(st.integers(2, 5))
    cells = [Cell(f"w{i}", b) for i, b in enumerate(draw(st.lists(st.sampled_from([1, 4, 8]), min_size=n_cells, max_size=n_cells)))]
    return [
        PairedSample(c.workload, c.batch, slot, draw(_tps), draw(_tps), r)
        for c in cells
        for r in range(repeats)
        for slot in (0, 1)
    ]


@hsettings(max_examples=150, deadline=None)
@given(_designs())
def test_swapping_labels_inverts_the_gain_exactly(samples):
    ab, ba = gain(samples), gain(swapped(samples))
    assert ba.log_gain == -ab.log_gain
    assert ba.per_repeat == tuple(-v for v in ab.per_repeat)
    assert ab.gain * ba.gain == pytest.approx(1.0, abs=1e-12)
    # the swapped lower bound is the reciprocal of the original upper bound
    upper = math.exp(ab.log_gain + ab.t_quantile * ab.std_err)
    assert ba.lower * upper == pytest.approx(1.0, rel=1e-9)
    assert swapped(swapped(samples)) == samples


# --- power ------------------------------------------------------------------------------------


def _acceptance(true_gain: float, cv: float, repeats: int, cells: int, trials: int = 200) -> float:
    """How often the whole rule (stock noise measured the same way) accepts a true gain, simulated."""
    rng, accepted = np.random.default_rng(11), 0
    for _ in range(trials):
        a, b = (int(x) for x in rng.integers(0, 2**62, 2))
        stock = gain(simulate(1.0, cv, 0.1, repeats, cells, a), bootstrap_resamples=10)
        cand = gain(simulate(true_gain, cv, 0.1, repeats, cells, b), bootstrap_resamples=10)
        accepted += decide(cand, stock, False).accepted
    return accepted / trials


@pytest.mark.parametrize("cv, repeats, cells", [(0.07, 6, 1), (0.07, 14, 4), (0.02, 4, 1)])
def test_smallest_acceptable_gain_is_where_the_simulated_rule_accepts_half_the_time(cv, repeats, cells):
    """The closed form against the real rule on simulated runs: about half accepted at the smallest
    acceptable gain, nearly all at twice its margin, nearly none at half of it."""
    sd = math.sqrt(math.log1p(cv * cv)) / math.sqrt(cells)  # per-repeat sd of the log ratio (see noise_cv)
    g = stats.smallest_acceptable_gain(sd, repeats)
    assert 0.3 <= _acceptance(g, cv, repeats, cells) <= 0.75
    assert _acceptance(1 + 2 * (g - 1), cv, repeats, cells) >= 0.95
    assert _acceptance(1 + (g - 1) / 2, cv, repeats, cells) <= 0.1


def test_the_rounds_design_on_cpu_noise_cannot_accept_a_12_percent_gain():
    """6 repeats × 1 cell at 7 % per-run noise: the smallest acceptable gain is about 24 %, so a
    12 % gain is rarely accepted (the reference design, 14 × 4, accepts it almost always)."""
    sd = math.sqrt(math.log1p(0.07**2))
    assert 0.2 < stats.smallest_acceptable_gain(sd, 6) - 1 < 0.3
    assert stats.smallest_acceptable_gain(sd / 2, 14) - 1 < 0.1
    assert _acceptance(1.12, 0.07, 6, 1) < 0.1


def test_noise_cv_recovers_the_simulated_noise():
    for cv, cells in ((0.07, 1), (0.03, 4)):
        est = gain(simulate(1.0, cv, 0.2, 400, cells, seed=3), bootstrap_resamples=10)
        assert stats.noise_cv(est) == pytest.approx(cv, rel=0.1)


def test_power_check_names_the_repeats_that_reach_the_target():
    quiet = gain(_fixed([0.002, -0.002, 0.001, -0.001, 0.0]))
    ok = stats.power_check(quiet, "gpu")
    assert ok["meets_target"] and ok["smallest_gain"] < 0.05 and ok["repeats_for_target"] <= 5
    loud = gain(_fixed(STOCK_D))  # per-repeat sd 0.0158 at 5 repeats
    bad = stats.power_check(loud, "gpu")
    assert not bad["meets_target"] and bad["smallest_gain"] > 0.05 and bad["target"] == 0.05
    n = bad["repeats_for_target"]
    assert stats.smallest_acceptable_gain(bad["per_repeat_sd"], n) <= 1.05 < \
        stats.smallest_acceptable_gain(bad["per_repeat_sd"], n - 1)
    assert stats.power_check(loud, "cpu")["target"] == 0.10
    assert stats.repeats_for(0.005, 0.01) is None  # below the 1 % floor: no number of repeats
    with pytest.raises(ValueError, match="device kind"):
        stats.power_check(loud, "tpu")
