"""bench/common.py's per-step timing: the slope through runs of growing length and its interval."""

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
from common import slope_ci, step_ms  # noqa: E402


def test_the_slope_of_exact_runs_is_the_step_time_and_the_fixed_cost_stays_out():
    counts = [12, 24, 36, 48]
    slope, (lo, hi) = slope_ci(counts, [3.0 + 0.04 * n for n in counts])  # 3 s once per run, 40 ms a step
    assert slope == pytest.approx(0.04) and lo == pytest.approx(0.04) and hi == pytest.approx(0.04)


def test_the_interval_widens_with_noise_and_covers_the_step_time():
    rng = np.random.default_rng(1)
    counts = [k * 12 for k in range(1, 7)]
    covered, widths = 0, []
    for _ in range(40):
        secs = [0.5 + 0.04 * n + rng.normal(0, 0.02) for n in counts]
        _, (lo, hi) = slope_ci(counts, secs, draws=400)
        covered += lo <= 0.04 <= hi
        widths.append(hi - lo)
    assert covered >= 32  # a 95 % interval of 6 runs: most of 40 trials cover it
    quiet = [slope_ci(counts, [0.5 + 0.04 * n + rng.normal(0, 0.002) for n in counts], draws=400)[1] for _ in range(10)]
    assert np.median([hi - lo for lo, hi in quiet]) < np.median(widths) / 3


def test_step_ms_times_runs_of_growing_length():
    asked = []

    def timed_run(k):
        asked.append(k)
        return 1.0 + 0.025 * k

    row = step_ms(timed_run, 10, runs=4)
    assert asked == [10, 20, 30, 40]
    assert row["step_ms"] == pytest.approx(25.0) and row["step_ms_ci95"] == pytest.approx([25.0, 25.0])


def test_too_few_runs_are_named():
    with pytest.raises(ValueError, match="3 runs or more of 2 lengths or more"):
        slope_ci([12, 12, 12], [1.0, 1.1, 1.2])
