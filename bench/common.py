"""What every benchmark script shares: the commit it measures, a recipe from the command line, a
synchronized timer and the profile of a step."""

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


def top_kernels(run, steps: int, device: str, n: int = 25) -> list[dict]:
    """The n operators that take the most time (device time on a GPU, else CPU time) while
    `run()` runs `steps` steps, per step."""
    import torch
    from torch.profiler import ProfilerActivity

    cuda = str(device).startswith("cuda")
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with torch.profiler.profile(activities=acts) as prof:
        run()
    key = (lambda e: e.self_device_time_total) if cuda else (lambda e: e.self_cpu_time_total)
    rows = sorted(prof.key_averages(), key=key, reverse=True)[:n]
    return [{"name": e.key[:120], "calls_per_step": e.count / steps, "ms_per_step": key(e) / 1e3 / steps} for e in rows]


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
