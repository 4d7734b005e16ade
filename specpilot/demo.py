"""`specpilot demo`: speculative generation on the micro models, AR against stock chain decoding.

Uses the zoo's shipped micro checkpoints when they exist; otherwise it writes random-weight micro
checkpoints once (under the user cache) so that the pipeline still runs end to end.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

from specpilot.engine.checkpoint import save_model
from specpilot.engine.drafters import save_drafter
from specpilot.engine.engine import Engine, EngineConfig
from specpilot.engine.synthetic import random_drafter_net, random_model, tiny_config
from specpilot import zoo
from specpilot.zoo.workloads import Request

SHIPPED = Path(zoo.__file__).resolve().parent / "checkpoints" / "micro"


def micro_pair() -> tuple[Path, Path, bool]:
    """(target folder, block-drafter folder, trained?)"""
    if (SHIPPED / "dense" / "config.json").is_file() and (SHIPPED / "dense-block" / "config.json").is_file():
        return SHIPPED / "dense", SHIPPED / "dense-block", True
    root = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "specpilot" / "random-micro"
    if not (root / "drafter" / "config.json").is_file():
        cfg = tiny_config("llama", vocab=512, hidden=128, layers=4)
        save_model(random_model(cfg, seed=0), root / "target")
        save_drafter(random_drafter_net("block", cfg, seed=1, block=8), root / "drafter")
    return root / "target", root / "drafter", False


def run_demo(log=print) -> dict:
    log = log or (lambda *a, **k: None)
    target, drafter, trained = micro_pair()
    if not trained:
        log("(no trained micro checkpoints found: using random weights, so τ stays near 1)")
    torch.manual_seed(0)
    reqs = [Request(id=f"p{i}", prompt_ids=tuple(int(t) for t in torch.randint(1, 500, (12,))))
            for i in range(3)]
    if trained:
        from specpilot.zoo.workloads import humaneval
        reqs = humaneval(limit=3)
    results = {}
    for mode in ("ar", "chain", "tree"):
        eng = Engine(EngineConfig(target=str(target), drafter=str(drafter), mode=mode, tree="best-first:32",
                                  draft_len=16, max_new_tokens=48))
        eng.run(reqs[:1])  # warm-up
        results[mode] = eng.run(reqs)
    for o_ar, o_ch in zip(results["ar"]["outputs"], results["chain"]["outputs"]):
        log(f"── {o_ch['id']}  chain τ {o_ch['tau_mean']:.2f}  (identical to AR: {o_ar['tokens'] == o_ch['tokens']})")
        log(o_ch["text"] if o_ch["text"] is not None else o_ch["tokens"])
    ar, ch, tr = results["ar"], results["chain"], results["tree"]
    log(f"\ntarget {target} · drafter {drafter}")
    for name, r in (("AR", ar), ("stock chain", ch), ("best-first:32 tree", tr)):
        log(f"  {name:19s} τ {r['tau_mean']:.2f}  {r['tokens_per_s']:7.1f} tokens/s  "
            f"×{r['tokens_per_s'] / ar['tokens_per_s']:.2f} over AR")
    log("  (CPU, micro models: a target pass costs little more than a drafter pass, so τ gains show as "
        "speed only where the target dominates — on a GPU)")
    return {"trained": trained, "target": str(target), "drafter": str(drafter),
            "tau_mean": ch["tau_mean"], "tree_tau_mean": tr["tau_mean"],
            "ar_tokens_per_s": ar["tokens_per_s"], "chain_tokens_per_s": ch["tokens_per_s"],
            "tree_tokens_per_s": tr["tokens_per_s"],
            "lossless": all(a["tokens"] == c["tokens"] == t["tokens"]
                            for a, c, t in zip(ar["outputs"], ch["outputs"], tr["outputs"]))}
