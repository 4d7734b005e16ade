"""`specpilot selftest`: does the controller catch what it must catch?

Token forcing, on real runs of the shipped micro dense pair (held-out stdlib prompts): every
lossless mechanism (stock chain, a best-first tree, AR) must pass; a planted logit bias that flips
at least 1 % of the tokens must be rejected; a bias too small to flip any argmax must pass.
Paired-run statistics, on simulated measurements with this machine's CPU noise
(`services/controller/stats.selftest`): stock against stock (A/A), a silent 3 % slowdown, a 12 %
speedup, and the label swap that must invert the gain, at a reference design (14 repeats × 4
cells) and again at the deployment's own (a round's repeats × 1 cell) with the noise the real runs
measured — with the smallest gain that design accepts; then real paired runs on the two cores:
A/A, the planted slowdown, and AR (faster than the chain on CPU micro models) against stock.
"""

from __future__ import annotations

import math
import random

from specpilot.progress import progress_bar, progress_iter

from specpilot.entrypoints.demo import micro_pair
from specpilot.engine.engine import Engine, EngineConfig
from specpilot.services.controller import stats
from specpilot.services.controller.forcing import SystemOutput, calibrate_delta, check_forcing
from specpilot.services.gpu_worker.scoring import load_scorer, memo_scorer
from specpilot.zoo.workloads import stdlib_completion


def real_pairs(target, drafter, real_runs: int, repeats: int, progress) -> dict:
    """Real paired runs on this machine's two cores (workers in their own processes): stock against
    stock, a silent 3 % slowdown of stock, and AR against stock (on CPU micro models AR is faster)."""
    from specpilot.services.controller.pairing import judge, system
    from specpilot.entrypoints.bootstrap import local_workers

    stock = {"target": str(target), "drafter": str(drafter), "mode": "chain", "max_new_tokens": 24}
    reqs = [{"id": r.id, "prompt": r.prompt} for r in stdlib_completion(limit=4)]
    bar = progress_bar(real_runs + 2, "real paired runs", "run", disable=not progress, leave=False)

    aa_noise = []

    def accepted(candidate, aa=False):
        rec = judge(system(candidate), system(stock), system(stock), reqs, ["cpu:0", "cpu:1"], repeats,
                    workers=local_workers())
        if aa:  # this machine's per-run noise, as stock against itself shows it
            aa_noise.append(stats.noise_cv(stats.gain([stats.PairedSample(**x) for x in rec["samples"]])))
        bar.update(1)
        return rec["accepted"]

    out = {"real_aa_accepted": sum(accepted(stock, aa=True) for _ in range(real_runs)), "real_aa_runs": real_runs,
           "real_slowdown_accepted": accepted({**stock, "defect": "slowdown:0.03"}),
           "real_speedup_accepted": accepted({**stock, "mode": "ar"}),
           "real_noise_cv": math.sqrt(sum(c * c for c in aa_noise) / len(aa_noise)) if aa_noise else None}
    bar.close()
    return out


def design_power(repeats: int, cells: int, noise_cv: float, device: str = "cpu", trials: int = 200,
                 seed: int = 0) -> dict:
    """The paired-run rule at a deployment's own design (its repeats × cells) and noise: how often the
    simulated A/A, 3 % slowdown and 12 % speedup are accepted, and the smallest gain it accepts
    about half the time against the device kind's target (stats.POWER_TARGET)."""
    sim = stats.selftest(trials=trials, seed=seed, repeats=repeats, cells=cells, noise_cv=noise_cv)
    sd = math.sqrt(math.log1p(noise_cv * noise_cv) / cells)  # per-repeat sd of the log ratio (stats.noise_cv)
    smallest = stats.smallest_acceptable_gain(sd, repeats) - 1.0
    target = stats.POWER_TARGET[device]
    return {"repeats": repeats, "cells": cells, "noise_cv": noise_cv, "trials": trials,
            "aa_accepted": sim["aa_accepted"], "slowdown_accepted": sim["slowdown_accepted"],
            "speedup_accepted": sim["speedup_accepted"], "smallest_gain": smallest, "target": target,
            "meets_target": smallest <= target, "repeats_for_target": stats.repeats_for(target, sd)}


def run_selftest(trials: int = 20, prompts: int = 8, new_tokens: int = 32, seed: int = 0, progress=True,
                 real_runs: int = 5, repeats: int = 6, design: tuple[int, int] = (6, 1)) -> dict:
    """`design`: the deployment's (repeats, cells) — a round times one cell, with the deployment's
    repeats (6 by default). Its power is simulated at the noise the real A/A runs measured (at
    stats.SELFTEST_NOISE_CV when no real runs are made)."""
    target, drafter, trained = micro_pair()
    if not trained:
        raise ValueError("selftest needs the shipped micro checkpoints (zoo/checkpoints/micro); "
                         "build them with: specpilot zoo build --preset micro")
    reqs = stdlib_completion(limit=prompts)
    model = load_scorer(target)
    scorer = memo_scorer(model)

    def outputs(mode: str, **kw) -> list[SystemOutput]:
        eng = Engine(EngineConfig(target=str(target), drafter=str(drafter), mode=mode, draft_len=16,
                                  max_new_tokens=new_tokens, **kw))
        return [SystemOutput(r.id, tuple(eng.encode(r)), tuple(eng.generate(r).tokens)) for r in reqs]

    stock, ar = outputs("chain"), outputs("ar")
    delta = calibrate_delta({o.id: o.tokens for o in stock}, {o.id: o.tokens for o in ar},
                            {o.id: scorer(o.prompt_ids, o.tokens) for o in stock})
    lossless = {name: check_forcing(outs, stock, scorer, delta)["passed"]
                for name, outs in (("ar", ar), ("best-first:32", outputs("tree", tree="best-first:32")))}

    rng = random.Random(seed)
    vocab = model.cfg.vocab_size
    defect_runs = []
    for _ in progress_iter(range(trials), "defect trials", "trial", disable=not progress, leave=False):
        toks = rng.sample(range(2, vocab), max(1, vocab // 50))  # 2 % of the vocabulary
        nats = rng.uniform(1.5, 3.0)
        out = check_forcing(outputs("ar", defect=f"logit_bias:{','.join(map(str, toks))}:{nats}"),
                            stock, scorer, delta)
        defect_runs.append({"flip_rate": out["candidate"]["mismatch_rate"] - out["baseline"]["mismatch_rate"],
                            "rejected": not out["passed"], "nats": nats})
    counted = [r for r in defect_runs if r["flip_rate"] >= 0.01]
    tiny = check_forcing(outputs("ar", defect=f"logit_bias:{rng.randrange(2, vocab)}:1e-7"), stock, scorer, delta)

    sim = stats.selftest(trials=200, seed=seed)
    real = real_pairs(target, drafter, real_runs, repeats, progress) if real_runs else {}
    noise = real.get("real_noise_cv") or stats.SELFTEST_NOISE_CV
    at_design = {**design_power(*design, noise, seed=seed),
                 "noise_source": "measured by the real A/A runs" if real.get("real_noise_cv") else "assumed"}
    return {
        "delta": delta,
        "lossless_passed": lossless,
        "defect_rejected": sum(r["rejected"] for r in counted),
        "defect_trials": len(counted),
        "defect_trials_below_1pct_flips": len(defect_runs) - len(counted),
        "defect_runs": defect_runs,
        "no_flip_bias_passed": tiny["passed"],
        "aa_accepted": sim["aa_accepted"], "aa_trials": sim["aa_trials"],
        "slowdown_accepted": sim["slowdown_accepted"], "slowdown_trials": sim["slowdown_trials"],
        "speedup_accepted": sim["speedup_accepted"], "speedup_trials": sim["speedup_trials"],
        "swap_inverts": sim["swap_inverts"],
        "paired_runs": f"{sim['aa_trials']} simulated trials per case (stats.simulate, CPU noise) + real runs",
        "reference_design": {"repeats": sim["repeats"], "cells": sim["cells"], "noise_cv": sim["noise_cv"]},
        "deployment_design": at_design,
        **real,
    }
