"""Statistics of the controller's paired runs (docs/METHOD.md §5), pure and server-free.

The controller compares a *candidate* system with the *incumbent* on the same requests:

- **Design** (`schedule`). Every (workload × batch) cell is measured in swapped pairs. With two
  devices the candidate runs on device 0 while the incumbent runs on device 1 at the same time,
  then they swap. With one device the runs interleave A B B A (A = candidate). Each pair yields
  one `PairedSample`; its `slot` says which half of the swap it is (with two devices: the
  candidate's device; with one device: 0 = the candidate ran first in the pair, 1 = second).
  Repeats are the outer loop: one repeat is a complete replication of every cell, so slow drift
  falls *between* repeats, where the t-interval over repeats sees it.
- **Estimate** (`gain`). Per cell and repeat, the log throughput ratio log(cand) − log(inc) is
  averaged over the two slots: a device that is uniformly slower (on a shared machine one CPU core
  has run 30 % slower than the other throughout) multiplies one slot's ratio by s and the other's by 1/s, so it
  cancels exactly in log space; on one device ABBA cancels a drift that is linear in log
  throughput. Gain = exp(mean over cells and repeats) = the geometric mean over cells of the
  per-cell ratios.
- **Bound**. One-sided t lower bound over the per-repeat log ratios (mean over cells per repeat),
  plus a seeded paired bootstrap over repeats as a cross-check.
- **Verdict** (`decide`). Accept iff the lower bound clears 1 % + 2 × stock noise (stock against
  itself, measured the same way), and ≥ 3 % when the outputs differ from the incumbent's.
- **Self-test** (`simulate`, `selftest`). A/A, a planted 3 % slowdown, a 12 % speedup and a label
  swap, at CPU-like noise (a swapped-slot bug is one only
  such self-tests catch).

Pure Python + numpy; imports nothing from the project (tests/unit/test_import_rules.py).
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass
from typing import Iterable, NamedTuple, Sequence

import numpy as np
from scipy.stats import t as student_t

CANDIDATE = "candidate"
INCUMBENT = "incumbent"

#: Repeats for the self-test at noise_cv 0.07 with 4 cells: 12 is the least that passes the
#: ≥ 95 % speedup bar (≈ 96 % over 400 trials, too close to the bar); 14 gives ≈ 99 %.
SELFTEST_REPEATS = 14
SELFTEST_CELLS = 4
SELFTEST_NOISE_CV = 0.07
SELFTEST_DEVICE_SKEW = 0.3
BOOTSTRAP_RESAMPLES = 2000
#: The smallest gain a round should be able to accept (as a fraction): rounds warn, naming the
#: repeats that would reach it, when their design and measured noise cannot. On a GPU timing noise
#: is well under 1 %, so 5 % is reachable with a few repeats; shared CPU cores are noisier (several
#: percent per run), so the CPU target is 10 %.
POWER_TARGET = {"gpu": 0.05, "cpu": 0.10}


class Cell(NamedTuple):
    """One (workload × batch size) cell of the comparison."""

    workload: str
    batch: int


# ---------------------------------------------------------------------------------------------
# Samples and schedule


@dataclass(frozen=True)
class PairedSample:
    """One timed comparison of candidate and incumbent in one cell.

    `slot` is the half of the swapped pair: with two devices, the device the candidate ran on
    (the incumbent ran on the other one, at the same time); with one device (ABBA), 0 when the
    candidate ran first in the pair and 1 when it ran second. `repeat` says which replication of
    the whole design the sample belongs to (the t-interval is taken over repeats).
    Throughputs are tokens per second, as timed by the controller.
    """

    workload: str
    batch: int
    slot: int
    candidate_tps: float
    incumbent_tps: float
    repeat: int

    def __post_init__(self) -> None:
        if self.slot not in (0, 1):
            raise ValueError(f"slot must be 0 or 1, got {self.slot!r}")
        for name in ("candidate_tps", "incumbent_tps"):
            v = getattr(self, name)
            if not (isinstance(v, (int, float)) and math.isfinite(v) and v > 0):
                raise ValueError(f"{name} must be a finite positive throughput, got {v!r}")
        if self.repeat < 0:
            raise ValueError(f"repeat must be >= 0, got {self.repeat}")

    @property
    def cell(self) -> Cell:
        return Cell(self.workload, self.batch)

    @property
    def log_ratio(self) -> float:
        # log(c) - log(i), not log(c / i): exactly antisymmetric under a label swap.
        return math.log(self.candidate_tps) - math.log(self.incumbent_tps)


@dataclass(frozen=True)
class Run:
    """One timed run in the schedule. Runs with the same `step` run at the same time (two
    devices); `slot` names the PairedSample the run's throughput belongs to."""

    step: int
    cell: Cell
    system: str  # CANDIDATE or INCUMBENT
    device: int
    repeat: int
    slot: int


def _cells(cells: Iterable[Cell | tuple[str, int]]) -> list[Cell]:
    out = [Cell(str(c[0]), int(c[1])) for c in cells]
    if not out:
        raise ValueError("no cells to measure")
    if len(set(out)) != len(out):
        raise ValueError(f"duplicate cells: {out}")
    return out


def schedule(cells: Iterable[Cell | tuple[str, int]], devices: int, repeats: int) -> list[Run]:
    """The order of runs, deterministic: repeat by repeat, cell by cell (in the given order).

    Two devices, per cell: step k = candidate on device 0 ‖ incumbent on device 1 (slot 0),
    step k+1 = candidate on device 1 ‖ incumbent on device 0 (slot 1).
    One device, per cell: candidate, incumbent (slot 0), incumbent, candidate (slot 1) — ABBA.
    """
    cells = _cells(cells)
    if devices not in (1, 2):
        raise ValueError(f"devices must be 1 or 2, got {devices}")
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    runs: list[Run] = []
    step = 0
    for r in range(repeats):
        for cell in cells:
            if devices == 2:
                for slot in (0, 1):
                    runs.append(Run(step, cell, CANDIDATE, slot, r, slot))
                    runs.append(Run(step, cell, INCUMBENT, 1 - slot, r, slot))
                    step += 1
            else:
                for system, slot in ((CANDIDATE, 0), (INCUMBENT, 0), (INCUMBENT, 1), (CANDIDATE, 1)):
                    runs.append(Run(step, cell, system, 0, r, slot))
                    step += 1
    return runs


def pair(runs: Sequence[Run], throughputs: Sequence[float]) -> list[PairedSample]:
    """The PairedSamples of a finished schedule; `throughputs[i]` is the tokens/s of `runs[i]`."""
    if len(runs) != len(throughputs):
        raise ValueError(f"{len(runs)} runs but {len(throughputs)} throughputs")
    halves: dict[tuple[Cell, int, int], dict[str, float]] = defaultdict(dict)
    for run, tps in zip(runs, throughputs):
        key = (run.cell, run.repeat, run.slot)
        if run.system in halves[key]:
            raise ValueError(f"two {run.system} runs for {key}")
        halves[key][run.system] = float(tps)
    samples = []
    for (cell, repeat, slot), h in halves.items():
        if set(h) != {CANDIDATE, INCUMBENT}:
            raise ValueError(f"unpaired run for {cell}, repeat {repeat}, slot {slot}: {sorted(h)}")
        samples.append(PairedSample(cell.workload, cell.batch, slot, h[CANDIDATE], h[INCUMBENT], repeat))
    return samples


def swapped(samples: Iterable[PairedSample]) -> list[PairedSample]:
    """The same measurements with the labels exchanged: candidate ↔ incumbent. The slot flips
    too, since the new candidate ran on the other device (or in the other order)."""
    return [
        PairedSample(s.workload, s.batch, 1 - s.slot, s.incumbent_tps, s.candidate_tps, s.repeat)
        for s in samples
    ]


def t_quantile(p: float, df: float) -> float:
    """The p-quantile of Student's t with df degrees of freedom."""
    return float(student_t.ppf(p, df))


# ---------------------------------------------------------------------------------------------
# Gain


@dataclass(frozen=True)
class GainEstimate:
    """Candidate over incumbent throughput, with its one-sided lower confidence bounds.

    `per_repeat` holds the raw per-repeat values the bounds are computed from: for each repeat
    (in order), the mean over cells of the slot-averaged log ratio. `per_cell` holds each cell's
    gain (geometric mean over repeats).
    """

    gain: float
    lower: float  # one-sided t lower bound: the one decisions use
    lower_bootstrap: float  # paired bootstrap over repeats, percentile: cross-check only
    confidence: float
    repeats: int
    cells: tuple[Cell, ...]
    per_repeat: tuple[float, ...]
    per_cell: tuple[tuple[Cell, float], ...]
    log_gain: float
    std_err: float  # of log_gain, over repeats
    t_quantile: float
    bootstrap_resamples: int
    seed: int

    @property
    def half_width(self) -> float:
        """One-sided half-width of the t interval, in ratio units: gain − lower."""
        return self.gain - self.lower


def gain(
    samples: Iterable[PairedSample],
    confidence: float = 0.95,
    bootstrap_resamples: int = BOOTSTRAP_RESAMPLES,
    seed: int = 0,
) -> GainEstimate:
    """Geometric-mean gain of candidate over incumbent, with a one-sided lower bound.

    Per cell and repeat: the log ratio averaged over the swapped pair (slot 0 and slot 1), so a
    constant device speed difference cancels exactly. Per repeat: the mean over cells. Gain =
    exp(mean over repeats) — equal to the geometric mean over cells of the per-cell ratios, since
    the design is balanced (every cell has every repeat and both slots; anything else is an
    error, not something to average around).

    The decision bound is the one-sided Student t bound over the n per-repeat values:
    exp(mean − t_{confidence, n−1} · sd / √n). Why t and not the bootstrap:

    - n is small (a repeat re-runs every cell on both devices, so 5–20 repeats is what a round
      affords). The percentile bootstrap over n values is known to undercover at small n: its
      spread is the plug-in sd (too small by √((n−1)/n)) and its tails are normal-like, not
      t-like, so with 5–12 repeats it claims more confidence than it has — exactly the wrong
      direction for an acceptance rule.
    - The per-repeat values are close to normal: throughput noise is multiplicative (so its log
      is roughly normal, and exactly normal in `simulate`), and each value is already an average
      of 2 × cells log ratios. Under normality the t bound is exact.
    - Repeats, not individual runs, are the independent units: noise shared by the runs of one
      repeat (a busy host, thermal state) is inside each per-repeat value, and the interval is
      over those values — so the t bound does not treat correlated runs as independent.

    The bootstrap (paired: a resample draws whole repeats, every cell and both systems together;
    seeded, so the estimate is reproducible) is reported as a cross-check: a bootstrap bound well
    below the t bound flags skewed or heavy-tailed per-repeat values (an outlier repeat), where
    the normal assumption is doubtful. `decide` records it in its reasons but never decides on it.
    """
    if not 0.5 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0.5, 1), got {confidence}")
    by_key: dict[tuple[Cell, int, int], float] = {}
    for s in samples:
        key = (s.cell, s.repeat, s.slot)
        if key in by_key:
            raise ValueError(f"two samples for cell {s.cell}, repeat {s.repeat}, slot {s.slot}")
        by_key[key] = s.log_ratio
    if not by_key:
        raise ValueError("no samples")
    cells = tuple(sorted({k[0] for k in by_key}))
    repeats = sorted({k[1] for k in by_key})
    missing = [
        (c, r, slot) for c in cells for r in repeats for slot in (0, 1) if (c, r, slot) not in by_key
    ]
    if missing:
        shown = ", ".join(f"{c.workload}×{c.batch} repeat {r} slot {slot}" for c, r, slot in missing[:5])
        raise ValueError(f"unbalanced design, {len(missing)} missing samples: {shown}")
    n = len(repeats)
    if n < 2:
        raise ValueError("need at least 2 repeats for a confidence bound")

    # d[c, r]: per cell and repeat, the log ratio averaged over the swapped pair.
    d = np.array([[(by_key[(c, r, 0)] + by_key[(c, r, 1)]) / 2.0 for r in repeats] for c in cells])
    per_repeat = d.mean(axis=0)  # mean over cells, per repeat
    mean = float(per_repeat.mean())
    sd = float(per_repeat.std(ddof=1))
    se = sd / math.sqrt(n)
    tq = t_quantile(confidence, n - 1)
    lower = math.exp(mean - tq * se)

    rng = np.random.default_rng(seed)
    idx = rng.integers(0, n, size=(bootstrap_resamples, n))
    boot = per_repeat[idx].mean(axis=1)
    lower_boot = math.exp(float(np.quantile(boot, 1.0 - confidence)))

    per_cell = tuple((c, math.exp(float(row.mean()))) for c, row in zip(cells, d))
    return GainEstimate(
        gain=math.exp(mean),
        lower=lower,
        lower_bootstrap=lower_boot,
        confidence=confidence,
        repeats=n,
        cells=cells,
        per_repeat=tuple(float(v) for v in per_repeat),
        per_cell=per_cell,
        log_gain=mean,
        std_err=se,
        t_quantile=tq,
        bootstrap_resamples=bootstrap_resamples,
        seed=seed,
    )


# ---------------------------------------------------------------------------------------------
# Decision


@dataclass(frozen=True)
class Settings:
    """Named thresholds of the acceptance rule (docs/METHOD.md §5)."""

    min_gain: float = 0.01  # lower bound must beat 1 + this ...
    noise_multiplier: float = 2.0  # ... + this × stock noise
    differing_output_min_gain: float = 0.03  # and reach this when outputs differ
    confidence: float = 0.95  # of the lower bounds (both the candidate's and stock's)


@dataclass(frozen=True)
class Decision:
    accepted: bool
    threshold: float  # what lower − 1 had to clear
    reasons: tuple[str, ...]
    stock_noise: float = float("nan")


def stock_noise(stock: GainEstimate) -> float:
    """Stock noise: |g − 1| + (g − L) of stock measured against itself, the same way.

    g is the A/A gain, L its one-sided t lower bound at the same confidence, so g − L is the
    interval's half-width. The truth of an A/A comparison is exactly 1, so everything it
    reports is error of the measurement setup: |g − 1| is the error it made, and g − L the
    random error it could just as well have made at this confidence and number of repeats. Any
    systematic bias b the swap fails to cancel (drift, warm-up order, a device effect that is not
    a constant factor) satisfies |b| ≤ |g − 1| + |random error| ≤ |g − 1| + (g − L) with about
    the stated confidence — so stock noise is an upper bound on the setup's bias, in the same
    units as the candidate's lower bound − 1. It also scales with the machine: under 0.1 % on a
    GPU, several percent on shared CPU cores, so the bar rises where timing is worse.
    """
    return abs(stock.gain - 1.0) + (stock.gain - stock.lower)


def decide(
    candidate_vs_incumbent: GainEstimate,
    stock_noise_estimate: GainEstimate,
    outputs_differ: bool,
    settings: Settings = Settings(),
) -> Decision:
    """Accept iff L − 1 > min_gain + noise_multiplier × stock noise, and, when the candidate's
    outputs differ from the incumbent's, also L − 1 ≥ differing_output_min_gain; L is the
    candidate's one-sided t lower bound. `threshold` is the larger of the two bars."""
    cand, stock = candidate_vs_incumbent, stock_noise_estimate
    for name, est in (("candidate", cand), ("stock", stock)):
        if est.confidence != settings.confidence:
            raise ValueError(
                f"{name} estimate is at confidence {est.confidence}, settings need {settings.confidence}"
            )
    noise = stock_noise(stock)
    bar = settings.min_gain + settings.noise_multiplier * noise
    threshold = max(bar, settings.differing_output_min_gain) if outputs_differ else bar
    margin = cand.lower - 1.0
    pct = f"{settings.confidence:.0%}"
    reasons = [
        f"gain {cand.gain:.4f}, {pct} lower bound {cand.lower:.4f} (t, {cand.repeats} repeats × "
        f"{len(cand.cells)} cells); bootstrap lower bound {cand.lower_bootstrap:.4f} (cross-check)",
        f"stock noise {noise:.4f} = |{stock.gain:.4f} − 1| + half-width {stock.half_width:.4f} "
        f"(stock vs stock, {stock.repeats} repeats)",
    ]
    finite = all(math.isfinite(v) for v in (cand.lower, stock.gain, stock.lower))
    ok_noise = finite and margin > bar
    ok_diff = (not outputs_differ) or (finite and margin >= settings.differing_output_min_gain)
    reasons.append(
        f"lower bound − 1 = {margin:+.4f} {'>' if ok_noise else 'is not >'} "
        f"{settings.min_gain} + {settings.noise_multiplier} × {noise:.4f} = {bar:.4f}"
    )
    if outputs_differ:
        reasons.append(
            f"outputs differ from the incumbent's: lower bound − 1 = {margin:+.4f} "
            f"{'≥' if ok_diff else 'is not ≥'} {settings.differing_output_min_gain}"
        )
    if not finite:
        reasons.append("non-finite estimate: rejected")
    if (stock.repeats, stock.cells) != (cand.repeats, cand.cells):
        reasons.append(
            "warning: stock noise was not measured the same way as the candidate "
            f"({stock.repeats} repeats × {len(stock.cells)} cells vs {cand.repeats} × {len(cand.cells)})"
        )
    accepted = bool(ok_noise and ok_diff)
    if accepted != (cand.lower_bootstrap - 1.0 > threshold):
        reasons.append("warning: the bootstrap cross-check would decide the other way")
    reasons.append("accepted" if accepted else "rejected")
    return Decision(accepted, threshold, tuple(reasons), noise)


# ---------------------------------------------------------------------------------------------
# Power: the smallest gain a design can accept


def per_repeat_sd(est: GainEstimate) -> float:
    """The sample standard deviation of an estimate's per-repeat log ratios."""
    return float(np.std(est.per_repeat, ddof=1))


def noise_cv(est: GainEstimate) -> float:
    """The per-run coefficient of variation of throughput that stock against itself implies.

    A per-repeat value averages, over c cells, the mean of two slots' log ratios; each log ratio is
    the difference of two independent runs' log noise (variance 2σ²), so a per-repeat value has
    variance σ²/c: σ = sd · √c, and lognormal noise of log-sd σ has cv √(e^{σ²} − 1)."""
    sigma = per_repeat_sd(est) * math.sqrt(len(est.cells))
    return math.sqrt(math.expm1(sigma * sigma))


def smallest_acceptable_gain(sd: float, repeats: int, settings: Settings = Settings()) -> float:
    """The true gain the rule accepts about half the time, at `repeats` repeats and per-repeat
    log-ratio standard deviation `sd` (stock noise measured the same way).

    With the estimate at the truth g, the lower bound is g · e^{−t·se} (se = sd/√n, t the
    one-sided t quantile at n − 1 degrees of freedom) and the bar 1 + min_gain + k × stock noise,
    where stock noise is its expectation for an A/A comparison of the same design: E|ĝ − 1| ≈
    √(2/π) · se plus the half-width 1 − e^{−t·se}. Solving g · e^{−t·se} = the bar gives g."""
    if repeats < 2 or not sd >= 0:
        raise ValueError(f"need repeats ≥ 2 and sd ≥ 0, got repeats {repeats}, sd {sd}")
    se = sd / math.sqrt(repeats)
    tq = t_quantile(settings.confidence, repeats - 1)
    noise = math.sqrt(2.0 / math.pi) * se - math.expm1(-tq * se)
    return (1.0 + settings.min_gain + settings.noise_multiplier * noise) * math.exp(tq * se)


def repeats_for(target: float, sd: float, settings: Settings = Settings(), most: int = 200) -> int | None:
    """The fewest repeats at which the smallest acceptable gain is at most 1 + target (None: not
    within `most` — the bar's 1 % floor or the noise keeps it above)."""
    for n in range(2, most + 1):
        if smallest_acceptable_gain(sd, n, settings) <= 1.0 + target:
            return n
    return None


def power_check(stock: GainEstimate, device: str, settings: Settings = Settings()) -> dict:
    """What a design can accept, from stock measured against itself with it: the smallest gain it
    accepts about half the time, the target for the device kind ("gpu" or "cpu"), whether it is
    met, and the repeats that would meet it."""
    if device not in POWER_TARGET:
        raise ValueError(f"device kind {device!r}: expected one of {tuple(POWER_TARGET)}")
    sd, target = per_repeat_sd(stock), POWER_TARGET[device]
    smallest = smallest_acceptable_gain(sd, stock.repeats, settings) - 1.0
    return {"repeats": stock.repeats, "cells": len(stock.cells), "per_repeat_sd": sd, "noise_cv": noise_cv(stock),
            "smallest_gain": smallest, "target": target, "device": device, "meets_target": smallest <= target,
            "repeats_for_target": repeats_for(target, sd, settings)}


def power_warning(check: dict) -> str | None:
    """A `power_check` that misses its target, as a warning naming what to change (None if met)."""
    if check["meets_target"]:
        return None
    need = check["repeats_for_target"]
    fix = f"set the deployment's repeats to {need}" if need else "no repeat count reaches it: make the timing quieter"
    return (f"warning: with {check['repeats']} repeats × {check['cells']} cell(s) and this noise (per-run cv "
            f"{check['noise_cv']:.1%}) the smallest gain a verdict accepts is about {check['smallest_gain']:.1%}, "
            f"above the {check['device']} target of {check['target']:.0%}; {fix}")


# ---------------------------------------------------------------------------------------------
# Synthetic measurements and the self-test


def default_cells(n: int) -> list[Cell]:
    """n cells: workloads w0, w1, ... each at batch 1 and batch 8."""
    return [Cell(f"w{i // 2}", (1, 8)[i % 2]) for i in range(n)]


def simulate(
    true_gain: float,
    noise_cv: float,
    device_skew: float,
    repeats: int,
    cells: int | Iterable[Cell | tuple[str, int]],
    seed: int,
    devices: int = 2,
) -> list[PairedSample]:
    """Synthetic paired samples from the real `schedule` and `pair`.

    Every run's throughput = base(cell) × true_gain (candidate only) × device factor × noise,
    with noise lognormal of mean 1 and coefficient of variation `noise_cv`, independent per run.
    Two devices: device 1 is slower by `device_skew` (factor 1 − device_skew). One device: the
    machine drifts, log-linearly, to 1 − device_skew over each cell's four ABBA runs.
    """
    cell_list = default_cells(cells) if isinstance(cells, int) else _cells(cells)
    if not 0.0 <= device_skew < 1.0:
        raise ValueError(f"device_skew must be in [0, 1), got {device_skew}")
    runs = schedule(cell_list, devices, repeats)
    rng = np.random.default_rng(seed)
    sigma = math.sqrt(math.log1p(noise_cv**2))
    noise = rng.lognormal(-sigma * sigma / 2.0, sigma, size=len(runs))
    base = {c: 100.0 * c.batch * (1.0 + 0.25 * i) for i, c in enumerate(cell_list)}
    tps = []
    for k, run in enumerate(runs):
        v = base[run.cell] * (true_gain if run.system == CANDIDATE else 1.0) * float(noise[k])
        if devices == 2:
            v *= (1.0 - device_skew) if run.device == 1 else 1.0
        else:
            position = run.step % 4  # position within the cell's ABBA block
            v *= (1.0 - device_skew) ** (position / 3.0)
        tps.append(v)
    return pair(runs, tps)


def selftest(
    trials: int = 200,
    seed: int = 0,
    repeats: int = SELFTEST_REPEATS,
    cells: int = SELFTEST_CELLS,
    noise_cv: float = SELFTEST_NOISE_CV,
    max_device_skew: float = SELFTEST_DEVICE_SKEW,
    settings: Settings = Settings(),
) -> dict:
    """Simulated trials of the whole rule: each trial measures stock against itself (the noise)
    and a candidate against stock, with the device skew drawn in [0, max_device_skew], and
    decides. Scenarios: A/A (true gain 1.0), a planted 3 % slowdown (0.97), a 12 % speedup
    (1.12). Also checks that swapping the labels on the same samples inverts the gain.

    The binding bar is the speedup's power: the threshold is 1 % + 2 × stock noise, and stock
    noise itself is ≈ 2–3 % at noise_cv 0.07 — A/A and the slowdown are rejected in every trial
    at any repeat count tried (4–20). Speedup acceptance, 4 cells, 400 trials: 12 repeats ≈ 96 %,
    14 ≈ 99.5 %, 10 ≈ 91 %. What matters is about cells × repeats ≈ 50 pairs per system: 1 cell
    needed ≈ 38 repeats, 2 cells ≈ 21, 8 cells ≈ 6; noise_cv 0.14 with 4 cells ≈ 44, 0.21 ≈ 80.
    Extra keys: `aa_lower_above_one` (how often the A/A t bound alone exceeds 1; ≈ 1 − confidence
    if the bound is calibrated) and the same for the bootstrap bound.
    """
    rng = np.random.default_rng(seed)
    counts = {"aa": 0, "slowdown": 0, "speedup": 0}
    aa_t_above, aa_boot_above = 0, 0
    swap_ok = True
    scenarios = (("aa", 1.0), ("slowdown", 0.97), ("speedup", 1.12))
    for _ in range(trials):
        for name, truth in scenarios:
            skew = float(rng.uniform(0.0, max_device_skew))
            s_seed, c_seed = (int(x) for x in rng.integers(0, 2**63 - 1, size=2))
            stock = gain(simulate(1.0, noise_cv, skew, repeats, cells, s_seed), settings.confidence)
            samples = simulate(truth, noise_cv, skew, repeats, cells, c_seed)
            est = gain(samples, settings.confidence)
            if decide(est, stock, outputs_differ=False, settings=settings).accepted:
                counts[name] += 1
            back = gain(swapped(samples), settings.confidence)
            swap_ok &= abs(est.gain * back.gain - 1.0) <= 1e-9
            if name == "aa":
                aa_t_above += est.lower > 1.0
                aa_boot_above += est.lower_bootstrap > 1.0
    return {
        "aa_accepted": counts["aa"],
        "aa_trials": trials,
        "slowdown_accepted": counts["slowdown"],
        "slowdown_trials": trials,
        "speedup_accepted": counts["speedup"],
        "speedup_trials": trials,
        "swap_inverts": bool(swap_ok),
        "repeats": repeats,
        "cells": cells,
        "noise_cv": noise_cv,
        "max_device_skew": max_device_skew,
        "aa_lower_above_one": aa_t_above,
        "aa_bootstrap_lower_above_one": aa_boot_above,
    }
