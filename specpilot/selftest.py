"""`specpilot selftest`: does the controller catch what it must catch?

Token forcing, on real runs of the shipped micro dense pair (held-out stdlib prompts): every
lossless mechanism (stock chain, a best-first tree, AR) must pass; a planted logit bias that flips
at least 1 % of the tokens must be rejected; a bias too small to flip any argmax must pass.
Paired-run statistics, on simulated measurements with this machine's CPU noise
(`services/controller/stats.selftest`): stock against stock (A/A), a silent 3 % slowdown, a 12 %
speedup, and the label swap that must invert the gain; then real paired runs on the two cores:
A/A, the planted slowdown, and AR (faster than the chain on CPU micro models) against stock.
"""

from __future__ import annotations

import random

from specpilot.progress import progress_bar, progress_iter

from specpilot.demo import micro_pair
from specpilot.engine.engine import Engine, EngineConfig
from specpilot.services.controller import stats
from specpilot.services.controller.forcing import SystemOutput, calibrate_delta, check_forcing
from specpilot.services.gpu_worker.scoring import load_scorer, memo_scorer
from specpilot.zoo.workloads import stdlib_completion


def real_pairs(target, drafter, real_runs: int, repeats: int, progress) -> dict:
    """Real paired runs on this machine's two cores (workers in their own processes): stock against
    stock, a silent 3 % slowdown of stock, and AR against stock (on CPU micro models AR is faster)."""
    from specpilot.services.controller.pairing import judge, system
    from specpilot.services.gpu_worker.systems import LocalWorkers

    stock = {"target": str(target), "drafter": str(drafter), "mode": "chain", "max_new_tokens": 24}
    reqs = [{"id": r.id, "prompt": r.prompt} for r in stdlib_completion(limit=4)]
    bar = progress_bar(real_runs + 2, "real paired runs", "run", disable=not progress, leave=False)

    def accepted(candidate):
        ok = judge(system(candidate), system(stock), system(stock), reqs, ["cpu:0", "cpu:1"], repeats,
                   workers=LocalWorkers())["accepted"]
        bar.update(1)
        return ok

    out = {"real_aa_accepted": sum(accepted(stock) for _ in range(real_runs)), "real_aa_runs": real_runs,
           "real_slowdown_accepted": accepted({**stock, "defect": "slowdown:0.03"}),
           "real_speedup_accepted": accepted({**stock, "mode": "ar"})}
    bar.close()
    return out


def run_selftest(trials: int = 20, prompts: int = 8, new_tokens: int = 32, seed: int = 0, progress=True,
                 real_runs: int = 5, repeats: int = 6) -> dict:
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
        **(real_pairs(target, drafter, real_runs, repeats, progress) if real_runs else {}),
    }
