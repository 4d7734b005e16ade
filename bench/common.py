"""What every benchmark script shares: the commit it measures, a recipe from the command line, a
synchronized timer, the per-step time of runs of growing length and the profile of a step."""

from __future__ import annotations

from pathlib import Path

from specpilot import gitrun


def git_sha() -> str:
    """The commit of this checkout (gitrun.head_sha: GIT_SHA wins, "+dirty" for changed files)."""
    return gitrun.head_sha(Path(__file__).resolve().parent)


def deal(fn, prompts: list, jobs: int, pool, *args) -> dict:
    """`fn(prompts, *args, threads=None)` → {"continuations_s": s, "kinds": {kind: {key: per-prompt
    list, or seconds under keys ending in "_s"}}}, run here on every prompt (no pool), or with the
    prompts dealt round-robin to `jobs` pool processes of one torch thread each: per-prompt lists
    come back in prompt order, seconds are summed over processes."""
    if pool is None:
        return fn(prompts, *args)
    parts = list(pool.map(fn, *zip(*[(prompts[i::jobs], *args, 1) for i in range(jobs)])))
    out = {"continuations_s": sum(p["continuations_s"] for p in parts), "kinds": {}}
    for kind in parts[0]["kinds"]:
        row = out["kinds"][kind] = {}
        for key in parts[0]["kinds"][kind]:
            vals = [p["kinds"][kind][key] for p in parts]
            # prompt i went to process i % jobs, as its (i // jobs)-th prompt
            row[key] = sum(vals) if key.endswith("_s") else [vals[i % jobs][i // jobs] for i in range(len(prompts))]
    return out


def top_kernels(run, steps: int, device: str, n: int = 25, total: bool = False) -> list[dict]:
    """The n operators that take the most time (device time on a GPU, else CPU time) while
    `run()` runs `steps` steps, per step; with `total`, a last row "(all)" sums every operator."""
    import torch
    from torch.profiler import ProfilerActivity

    cuda = str(device).startswith("cuda")
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with torch.profiler.profile(activities=acts) as prof:
        run()
    key = (lambda e: e.self_device_time_total) if cuda else (lambda e: e.self_cpu_time_total)
    events = sorted(prof.key_averages(), key=key, reverse=True)
    rows = [{"name": e.key[:120], "calls_per_step": e.count / steps, "ms_per_step": key(e) / 1e3 / steps}
            for e in events[:n]]
    if total:
        rows.append({"name": "(all)", "calls_per_step": sum(e.count for e in events) / steps,
                     "ms_per_step": sum(map(key, events)) / 1e3 / steps})
    return rows


def recipe(ap, args):
    """The recipe of `--preset` with the `--set FIELD=VALUE` changes; a bad change is the parser's
    one-line usage error."""
    from specpilot.zoo import build

    try:
        return build.with_overrides(build.PRESETS[args.preset], args.set)
    except ValueError as e:
        ap.error(str(e))


def seconds(fn, device: str) -> float:
    """Wall seconds of fn(), with the device's queued work finished before and after."""
    import time

    import torch

    cuda = str(device).startswith("cuda")
    if cuda:
        torch.cuda.synchronize()
    t = time.perf_counter()
    fn()
    if cuda:
        torch.cuda.synchronize()
    return time.perf_counter() - t


def slope_ci(counts: list[int], secs: list[float], draws: int = 2000, seed: int = 0) -> tuple[float, tuple[float, float]]:
    """(slope, its 95 % bootstrap interval) of the least-squares line through runs of counts[i]
    steps that took secs[i] seconds: seconds per step, as criterion samples runs of growing length
    — what every run pays once (building optimizers, first steps) is the intercept, not the slope.
    The interval resamples the runs (draws with a single distinct count are drawn again)."""
    import numpy as np

    x, y = np.asarray(counts, dtype=float), np.asarray(secs, dtype=float)
    if len(x) != len(y) or len(x) < 3 or len(set(counts)) < 2:
        raise ValueError(f"slope_ci needs 3 runs or more of 2 lengths or more, got counts {counts}, {len(y)} times")
    fit = lambda i: float(np.polyfit(x[i], y[i], 1)[0])  # noqa: E731
    rng, got = np.random.default_rng(seed), []
    while len(got) < draws:
        i = rng.integers(0, len(x), len(x))
        if len(set(x[i])) > 1:
            got.append(fit(i))
    lo, hi = np.percentile(got, [2.5, 97.5])
    return fit(np.arange(len(x))), (float(lo), float(hi))


def step_ms(timed_run, steps: int, runs: int = 6) -> dict:
    """timed_run(k) → seconds of k more steps (warmed up already). Runs of steps, 2 × steps, …,
    runs × steps steps → {"step_ms": the slope (`slope_ci`), "step_ms_ci95": its interval}."""
    counts = [k * steps for k in range(1, runs + 1)]
    slope, (lo, hi) = slope_ci(counts, [timed_run(n) for n in counts])
    return {"step_ms": slope * 1e3, "step_ms_ci95": [lo * 1e3, hi * 1e3]}
