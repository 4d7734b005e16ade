"""Paired, swapped runs of two systems (docs/METHOD.md §5).

Each system runs in a process of its own that the GPU worker interface starts (`ports.GpuWorkers`:
local processes embedded, gRPC workers distributed), every call under a hard timeout. The
controller does the timing: the round trip of a Generate call, which returns only after the
worker's device has finished. It
keeps every timed run's outputs and re-checks them. Verdict records are JSON files written once
(never rewritten) with the controller's own code hash, the inputs, the raw samples and the decision.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import subprocess
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from specpilot.systemspec import EngineSystem, ServerSystem, SystemSpec, is_server, parse_server

from . import stats
from .forcing import SystemOutput, calibrate_delta, check_forcing
from .ports import GpuWorkers, System


def system(config: dict, patch: str = "", base_rev: str | None = None) -> SystemSpec:
    """The system of a round's configuration (engine settings, or {"server": ...}), its code patch
    and the pinned revision, as the GPU worker interface takes it."""
    if is_server(config):
        if patch.strip():
            raise ValueError("a server system carries no code patch")
        return parse_server(config["server"])
    return EngineSystem(config=dict(config), patch=patch, base_rev=base_rev)


def reference(stock: SystemSpec) -> EngineSystem:
    """AR decoding of stock's target: what stock is forced against (Phase 0) and the scorer of
    token forcing (teacher-forced by that target, float32 head)."""
    if isinstance(stock, ServerSystem):
        if not stock.target:
            raise ValueError("a server stock needs 'target' (the checkpoint it serves) for token forcing")
        return EngineSystem(config={"target": stock.target, "mode": "ar"})
    return dataclasses.replace(stock, config={**stock.config, "mode": "ar"})


def timed_generate(sys_: System, requests: list[dict],
                   batch: int = 1) -> tuple[list[list[int]], list[list[int]], float]:
    """Outputs and prompt ids of the requests (`batch` decoding at once), and the round trip the
    controller measured on its own clock (the system reports no time)."""
    t0 = time.perf_counter()
    outputs, prompt_ids = sys_.generate(requests, batch)
    return outputs, prompt_ids, time.perf_counter() - t0


STEADY_RUNS, STEADY_SPREAD, MAX_WARMUP = 3, 0.03, 12


def steady(seconds: list[float], runs: int = STEADY_RUNS, spread: float = STEADY_SPREAD) -> bool:
    """The last `runs` round trips lie within `spread` of their median (relative): the system's
    compiles, captures, allocator growth and clock ramp-up are behind it."""
    if len(seconds) < runs:
        return False
    last = sorted(seconds[-runs:])
    mid = last[len(last) // 2]
    return (last[-1] - last[0]) <= spread * mid


def warm_up(sys_: System, requests: list[dict], least: int, most: int = MAX_WARMUP, batch: int = 1) -> list[float]:
    """Untimed runs of the requests until the round trip is steady (at least `least`, at most
    `most` runs); returns the round trips, for the verdict."""
    seconds: list[float] = []
    while len(seconds) < most and (len(seconds) < least or not steady(seconds)):
        seconds.append(timed_generate(sys_, requests, batch)[2])
    return seconds


def gpu_clocks(devices: list[str]) -> dict:
    """SM and memory clocks of the local CUDA devices, as nvidia-smi reads them (left as they
    are: the controller records them, never sets them); {} without CUDA devices or nvidia-smi."""
    idx = sorted({d.split(":")[1] if ":" in d else "0" for d in devices if d.startswith("cuda")})
    if not idx:
        return {}
    try:
        r = subprocess.run(["nvidia-smi", "-i", ",".join(idx), "--query-gpu=index,clocks.sm,clocks.mem",
                            "--format=csv,noheader,nounits"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return {}
    rows = [line.split(", ") for line in r.stdout.strip().splitlines() if r.returncode == 0]
    return {f"cuda:{row[0]}": {"sm_MHz": row[1], "mem_MHz": row[2]} for row in rows if len(row) == 3}


def run_pair(candidate: SystemSpec, incumbent: SystemSpec, requests: list[dict], devices: list[str], repeats: int,
             timeout: float = 600.0, progress=None, warmup: int = 1, *, workers: GpuWorkers, batch: int = 1) -> dict:
    """Time candidate against incumbent (systems: `system(...)`) on the swapped schedule, each
    system started by `workers` on each device and warmed up until its round trip is steady
    (`warm_up`: at least `warmup` untimed runs), `batch` requests decoding at once. Returns the
    samples (output tokens per second over the whole workload), the outputs of every timed run per
    system, the warm-up round trips and the GPU clocks seen before and after."""
    runs = stats.schedule([("workload", batch)], len(devices), repeats)
    configs = {stats.CANDIDATE: candidate, stats.INCUMBENT: incumbent}
    started: dict = {}
    try:
        keys = [(system, d) for system in configs for d in sorted({r.device for r in runs})]
        with ThreadPoolExecutor(len(keys)) as pool:  # the processes load their systems side by side
            futures = {k: pool.submit(workers.start, configs[k[0]], devices[k[1]], timeout) for k in keys}
        failed = None
        for k, f in futures.items():
            if f.exception() is None:
                started[k] = f.result()
            else:
                failed = failed or f.exception()
        if failed:
            raise failed
        with ThreadPoolExecutor(len(started)) as pool:  # side by side, as the timed runs will be
            futures = {k: pool.submit(warm_up, w, requests, warmup, MAX_WARMUP, batch) for k, w in started.items()}
            warm = {f"{k[0]}@{devices[k[1]]}": f.result() for k, f in futures.items()}
        clocks_before = gpu_clocks(devices)
        prompt_ids: list = []
        tps, outputs = [0.0] * len(runs), {s: [] for s in configs}
        for step in sorted({r.step for r in runs}):
            idx = [i for i, r in enumerate(runs) if r.step == step]
            results: dict[int, tuple] = {}

            def one(i):
                try:
                    results[i] = timed_generate(started[runs[i].system, runs[i].device], requests, batch)
                except Exception as e:  # noqa: BLE001 — re-raised below in this thread
                    results[i] = e

            threads = [threading.Thread(target=one, args=(i,)) for i in idx]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            for i in idx:
                if isinstance(results[i], Exception):
                    raise results[i]
                outs, prompt_ids, seconds = results[i]
                tps[i] = sum(len(o) for o in outs) / seconds
                outputs[runs[i].system].append(outs)
            if progress:
                progress(1)
    finally:
        for w in started.values():
            w.close()
    return {"samples": stats.pair(runs, tps), "outputs": outputs, "prompt_ids": prompt_ids, "warmup_s": warm,
            "clocks": {"before": clocks_before, "after": gpu_clocks(devices)}}


def code_hash() -> str:
    """sha256 over the controller's own source files, in name order."""
    h = hashlib.sha256()
    for f in sorted(Path(__file__).parent.glob("*.py")):
        h.update(f.name.encode() + b"\0" + f.read_bytes())
    return h.hexdigest()


def baseline(stock: SystemSpec, requests: list[dict], devices: list[str], repeats: int, timeout: float = 600.0,
             progress=None, warmup: int = 1, *, workers: GpuWorkers, batch: int = 1) -> dict:
    """What every verdict of a round compares against: stock against itself on the swapped schedule
    (the noise), stock's outputs, and δ of token forcing from stock against AR (Phase 0), scored by
    stock's target in a worker of its own. AR decodes one request at a time: at batch > 1 stock's
    batched outputs are forced against unbatched AR. Plain data, so a round can store it and resume."""
    aa = run_pair(stock, stock, requests, devices, repeats, timeout, progress, warmup, workers=workers, batch=batch)
    stock_out = aa["outputs"][stats.INCUMBENT][0]
    ar_worker = workers.start(reference(stock), devices[0], timeout)  # also the scorer
    try:
        ar, _ = ar_worker.generate(requests)
        base = _outputs(requests, aa["prompt_ids"], stock_out)
        delta = calibrate_delta({o.id: o.tokens for o in base}, {r["id"]: tuple(t) for r, t in zip(requests, ar)},
                                {o.id: ar_worker.score(o.prompt_ids, o.tokens) for o in base})
    finally:
        ar_worker.close()
    return {"samples": [dataclasses.asdict(x) for x in aa["samples"]], "stock_outputs": stock_out,
            "prompt_ids": aa["prompt_ids"], "delta": delta, "warmup_s": aa["warmup_s"], "clocks": aa["clocks"]}


def _outputs(requests, prompt_ids, tokens) -> list[SystemOutput]:
    return [SystemOutput(r["id"], tuple(p), tuple(t)) for r, p, t in zip(requests, prompt_ids, tokens)]


def forcing(candidate_out, base: dict, requests, stock: SystemSpec, timeout: float, workers: GpuWorkers,
            device: str) -> dict:
    """Token forcing of the candidate's timed outputs against stock's, scored by stock's target."""
    scorer = workers.start(reference(stock), device, timeout)
    try:
        return check_forcing(_outputs(requests, base["prompt_ids"], candidate_out),
                             _outputs(requests, base["prompt_ids"], base["stock_outputs"]), scorer.score,
                             base["delta"])
    finally:
        scorer.close()


def judge(candidate: SystemSpec, incumbent: SystemSpec, stock: SystemSpec, requests: list[dict], devices: list[str], repeats: int,
          settings: stats.Settings = stats.Settings(), timeout: float = 600.0, progress=None,
          base: dict | None = None, warmup: int = 1, *, workers: GpuWorkers, batch: int = 1) -> dict:
    """Candidate vs incumbent, both swapped, against the stock baseline (`baseline`: stock vs stock
    noise, stock's outputs and δ; measured here when not given); token forcing of the candidate's
    timed outputs; the decision. `batch` requests decode at once in every timed run."""
    base = base or baseline(stock, requests, devices, repeats, timeout, progress, warmup, workers=workers, batch=batch)
    main = run_pair(candidate, incumbent, requests, devices, repeats, timeout, progress, warmup, workers=workers,
                    batch=batch)
    cand_out, inc_out = main["outputs"][stats.CANDIDATE], main["outputs"][stats.INCUMBENT]
    deterministic = all(o == cand_out[0] for o in cand_out) and all(o == inc_out[0] for o in inc_out)
    noise_samples = [stats.PairedSample(**x) for x in base["samples"]]
    est, noise = stats.gain(main["samples"], settings.confidence), stats.gain(noise_samples, settings.confidence)
    decision = stats.decide(est, noise, outputs_differ=cand_out[0] != inc_out[0], settings=settings)
    forced = forcing(cand_out[0], base, requests, stock, timeout, workers, devices[0])
    reasons = list(decision.reasons) + [f"token forcing: {r}" for r in forced["reasons"]]
    accepted = decision.accepted and deterministic and forced["passed"]
    if not deterministic:
        reasons.append("a system's outputs changed between timed runs: its timing cannot be trusted")
    return {
        "candidate": candidate.to_json(), "incumbent": incumbent.to_json(), "stock": stock.to_json(),
        "controller_code_sha256": code_hash(), "devices": devices, "repeats": repeats, "batch": batch,
        "requests": requests, "settings": dataclasses.asdict(settings),
        "samples": [dataclasses.asdict(x) for x in main["samples"]],
        "stock_samples": base["samples"], "delta": base["delta"],
        "gain": est.gain, "lower_bound": est.lower, "stock_noise": decision.stock_noise,
        "threshold": decision.threshold, "outputs_differ": cand_out[0] != inc_out[0],
        "outputs_deterministic": deterministic, "forcing": forced, "accepted": accepted, "reasons": reasons,
        "warmup_s": main["warmup_s"], "clocks": main["clocks"],
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def write_verdict(record: dict, folder) -> Path:
    """Store a verdict as <id>.json, id = sha256 of its content; an existing one is never rewritten."""
    body = json.dumps(record, indent=1, sort_keys=True)
    vid = hashlib.sha256(body.encode()).hexdigest()[:16]
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{vid}.json"
    with open(path, "x") as f:  # 'x': fails rather than overwrite
        f.write(body)
    return path
