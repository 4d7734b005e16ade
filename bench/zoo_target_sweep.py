"""How fast a zoo target trains, and whether it then writes code, per training setting.

  python bench/zoo_target_sweep.py --preset small --role dense --device cuda \\
      --set target_batch=64 --set seq=512 --budget-s 120 --out results.json     (GPU machine)

Prepares the recipe's corpus and tokenizer exactly as `zoo build` does, then for the target of the
given role: times a few training steps at the recipe's batch shape (steady state, after warm-up),
picks the number of steps that fits `--budget-s` (at most the recipe's `target_steps`; without a
budget, the recipe's), trains a fresh target with the build's `train_target`, and measures it as
`bench/zoo_realism.py` does (164 HumanEval prompts, greedy, 128 new tokens: parse_rate, loop_rate,
held-out bits per byte). One JSON file per run; runs of several roles can share a GPU.
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
from common import git_sha  # noqa: E402
from zoo_realism import heldout_docs, measure  # noqa: E402

from specpilot.zoo import build as B  # noqa: E402
from specpilot.zoo import tokenizer as tok_mod  # noqa: E402
from specpilot.zoo import train, workloads  # noqa: E402


def step_seconds(r: B.Recipe, hybrid: bool, train_ids: torch.Tensor, device: str, steps: int = 12) -> float:
    """Seconds per training step at the recipe's shape: `steps` steps after `steps` warm-up ones."""
    def run(n):
        q = dataclasses.replace(r, target_steps=n)
        if device == "cuda":
            torch.cuda.synchronize()
        t = time.perf_counter()
        B.train_target(q, hybrid, train_ids, device, None)
        if device == "cuda":
            torch.cuda.synchronize()
        return time.perf_counter() - t
    run(steps)  # warm-up: allocator, kernels, autotuning
    return (run(2 * steps) - run(steps)) / steps


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--preset", default="small")
    ap.add_argument("--role", choices=("dense", "hybrid"), default="dense")
    ap.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE", help="override a recipe field")
    ap.add_argument("--budget-s", type=float, help="training time to fit the step count into")
    ap.add_argument("--prompts", type=int, default=164)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--keep", help="folder to save the trained target in (default: out/target_sweep/ROLE)")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    try:
        r = B.with_overrides(B.PRESETS[args.preset], args.set)
    except ValueError as e:
        ap.error(str(e))
    hybrid = args.role == "hybrid"
    t = time.perf_counter()
    inp = B.prepare(r)
    prepare_s = time.perf_counter() - t
    per_step = step_seconds(r, hybrid, inp.train_ids, args.device)
    steps = r.target_steps if args.budget_s is None else max(1, min(r.target_steps, int(args.budget_s / per_step)))
    r = dataclasses.replace(r, target_steps=steps)
    tokens = steps * r.target_batch * r.seq
    print(f"{args.role}: {per_step * 1e3:.1f} ms/step → {steps} steps, {tokens / 1e6:.1f} M tokens "
          f"({tokens / len(inp.train_ids):.2f} passes)", flush=True)
    t = time.perf_counter()
    torch.manual_seed(r.seed)
    target = B.train_target(r, hybrid, inp.train_ids, args.device, print)
    if args.device == "cuda":
        torch.cuda.synchronize()
    train_s = time.perf_counter() - t
    keep = Path(args.keep or f"out/target_sweep/{args.role}")
    B.save_model(target, keep, dtype=getattr(torch, r.store_dtype))
    tok_mod.save(inp.tok, keep)
    prompts = [q.prompt for q in workloads.humaneval(limit=args.prompts)]
    row = measure(keep, r.seq, prompts, args.new_tokens, args.device, heldout_docs())
    result = {"command": " ".join(["python"] + sys.argv), "date": datetime.date.today().isoformat(),
              "git_sha": git_sha(), "device": torch.cuda.get_device_name() if args.device == "cuda" else "cpu",
              "torch": torch.__version__, "preset": args.preset, "role": args.role, "overrides": args.set,
              "recipe": dataclasses.asdict(r), "corpus_tokens": len(inp.train_ids), "prepare_s": prepare_s,
              "step_ms": per_step * 1e3, "train_s": train_s, "train_tokens": tokens,
              "train_tok_per_s": tokens / train_s, "passes": tokens / len(inp.train_ids), **row}
    Path(args.out).write_text(json.dumps(result, indent=1))
    print(f"{args.role}: trained {train_s:.0f} s ({tokens / train_s / 1e3:.0f} k tok/s); parse_rate "
          f"{row['parse_rate']:.3f}  loop_rate {row['loop_rate']:.3f}  held-out {row['heldout_bpb']:.3f} bits/byte",
          flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
