"""How a feature drafter's chain τ grows with its depth, training steps and learning rate (block
drafters with and without the lead-token row or the pointer head; either kind with and without input
norms), on one zoo target.

  python bench/zoo_block_sweep.py --preset small --device cuda --out results.json   (GPU machine)

Trains the preset's dense (or hybrid) target and its distillation data exactly as `zoo build`
does (or, with --zoo, takes a built set's target, tokenizer and recipe), then drafters of `--kind`
for each setting of the grid (the rest of the recipe unchanged), and measures each one's
stock-chain τ on the build's HumanEval and held-out stdlib prompts, beside the n-gram drafter's.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import git_sha, recipe  # noqa: E402

from specpilot.engine.checkpoint import load_model  # noqa: E402
from specpilot.engine.drafters import FeatureDrafter, NgramDrafter  # noqa: E402
from specpilot.zoo import build as B  # noqa: E402
from specpilot.zoo import tokenizer as tok_mod  # noqa: E402
from specpilot.zoo import train  # noqa: E402


def reach(per_prompt: list[list[int]], upto: int = 6) -> list[float]:
    """Share of decoding steps (every prompt's, pooled) whose τ is at least k, k = 2..upto: how far
    along the block a chain's acceptance gets."""
    steps = [t for p in per_prompt for t in p]
    return [sum(t >= k for t in steps) / max(1, len(steps)) for k in range(2, upto + 1)]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--preset", default="small")
    ap.add_argument("--role", choices=("dense", "hybrid"), default="dense")
    ap.add_argument("--layers", default="1,2,4")
    ap.add_argument("--steps", default="1200,3600")
    ap.add_argument("--kind", choices=("block", "sequential"), default="block")
    ap.add_argument("--lead", default="1", help="lead-token row off / on: 0, 1 or 0,1 (block kind)")
    ap.add_argument("--copy", help="the pointer head off / on: 0, 1 or 0,1 (block kind; default: the recipe's)")
    ap.add_argument("--input-norm", help="input norms off / on: 0, 1 or 0,1 (default: the recipe's)")
    ap.add_argument("--anchors", help="blocks per training sequence, e.g. 8,32 (default: the recipe's)")
    ap.add_argument("--lr", help="learning rates, e.g. 2e-3,3e-3 (default: the recipe's, for the kind)")
    ap.add_argument("--optimizer", help="adamw, muon or adamw,muon: what trains the drafter's matrices "
                                        "(train.matrices; default: the recipe's drafter_optimizer)")
    ap.add_argument("--context-weight", help="a context row's loss weight against a mask row's, e.g. 0.25,1 "
                                             "(block kind; default: the recipe's context_weight)")
    ap.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE",
                    help="override a recipe field (repeatable), e.g. --set vocab=8192 --set eval_prompts=64")
    ap.add_argument("--zoo", help="a built set's folder (its zoo.json): sweep drafters of its --role target, "
                                   "with its recipe and tokenizer, instead of training a target")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    r, tok, target = recipe(ap, args), None, None
    if args.zoo:
        try:
            built = B.recipe_from(json.loads((Path(args.zoo) / "zoo.json").read_text())["recipe"])
            folder = Path(args.zoo) / args.role
            tok, target = tok_mod.load(folder), load_model(folder, device=args.device)
        except (OSError, ValueError, KeyError, TypeError) as e:  # CheckpointError is a ValueError
            ap.error(f"--zoo {args.zoo}: not a built set with a {args.role} target ({e})")
        try:
            r = B.with_overrides(built, args.set)
        except ValueError as e:
            ap.error(str(e))
    result = {"command": " ".join(["python"] + sys.argv), "date": datetime.date.today().isoformat(),
              "git_sha": git_sha(), "device": torch.cuda.get_device_name() if args.device == "cuda" else "cpu",
              "torch": torch.__version__, "preset": r.name, "role": args.role, "zoo": args.zoo,
              "overrides": args.set, "recipe": dataclasses.asdict(r), "runs": []}
    torch.manual_seed(r.seed)
    inp = B.prepare(r, tok=tok)
    if target is None:
        target = B.as_stored(B.train_target(r, args.role == "hybrid", inp.train_ids, args.device, print),
                             getattr(torch, r.store_dtype))
    cfg = target.cfg
    t = time.perf_counter()
    seqs, feats = B.distillation_data(r, target, inp.train_ids, inp.fn_prompts, args.device)
    result["distill_s"] = time.perf_counter() - t
    result["target_heldout_loss"] = train.heldout_loss(target, inp.held_ids, r.seq, 64, r.seed + 3, args.device)
    conts = B.eval_continuations(r, target, inp.prompts)
    result["prompt_tokens"] = {k: [len(c.prompt) for c in cs] for k, cs in conts.items()}
    result["continuations"] = {k: [inp.tok.decode(list(c.tokens)) for c in cs[:4]] for k, cs in conts.items()}
    # the bar every learned drafter must clear, on the same continuations
    result["ngram_tau"] = {k: B.measure_tau(target, NgramDrafter(), cs, r.block) for k, cs in conts.items()}
    print(json.dumps({"ngram_tau": result["ngram_tau"]}), flush=True)
    _, batch, kind_lr = r.training(args.kind, args.role)
    lrs = [float(x) for x in args.lr.split(",")] if args.lr else [kind_lr]
    anchors = [int(x) for x in args.anchors.split(",")] if args.anchors else [r.anchors]
    flags = lambda text, default: [bool(int(x)) for x in text.split(",")] if text else [default]  # noqa: E731
    leads = flags(args.lead, r.block_lead) if args.kind == "block" else [False]
    copies = flags(args.copy, r.block_copy) if args.kind == "block" else [False]
    optimizers = args.optimizer.split(",") if args.optimizer else [r.drafter_optimizer]
    if bad := [o for o in optimizers if o not in ("adamw", "muon")]:
        ap.error(f"--optimizer {','.join(bad)}: expected adamw and/or muon")
    cws = [float(x) for x in args.context_weight.split(",")] if args.context_weight else [r.context_weight]
    grid = [(lead, copy, norm, layers, steps, lr, a, opt, cw) for lead in leads for copy in copies
            for norm in flags(args.input_norm, r.input_norm)
            for layers in [int(x) for x in args.layers.split(",")] for steps in [int(x) for x in args.steps.split(",")]
            for lr in lrs for a in anchors for opt in optimizers for cw in cws]
    for lead, copy, norm, layers, steps, lr, a, opt, cw in grid:
        dcfg = dataclasses.replace(B.drafter_config(r, args.kind, cfg), num_hidden_layers=layers, lead_token=lead,
                                   input_norm=norm, copy_head=copy)
        t = time.perf_counter()
        net = train.train_drafter(dcfg, target, seqs, feats, r.prompt_len, steps, batch, lr, r.seed + 5,
                                  f"{args.kind} {layers}L {steps} lr {lr:g} anchors {a}{' lead' if lead else ''}"
                                  f"{' copy' if copy else ''}{' norm' if norm else ''} {opt} context {cw:g}", print,
                                  **B.drafter_options(r) | {"anchors": a, "muon": opt == "muon", "context_weight": cw})
        train_s = time.perf_counter() - t
        net = B.as_stored(net, getattr(torch, r.store_dtype))
        per_prompt = {k: B.prompt_taus(target, FeatureDrafter(net, target), cs, r.block) for k, cs in conts.items()}
        result["runs"].append({"kind": args.kind, "lead_token": lead, "copy_head": copy, "input_norm": norm,
                               "layers": layers, "steps": steps, "lr": lr, "anchors": a, "optimizer": opt,
                               "context_weight": cw, "train_s": train_s,
                               "tau": {k: B.pooled_tau(v) for k, v in per_prompt.items()},
                               "reach": {k: reach(v) for k, v in per_prompt.items()},
                               "tau_per_prompt": {k: [B.pooled_tau([t]) for t in v] for k, v in per_prompt.items()}})
        print(json.dumps({k: v for k, v in result["runs"][-1].items() if k != "tau_per_prompt"}), flush=True)
        Path(args.out).write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
