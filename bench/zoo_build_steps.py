"""Where a zoo build's time goes after its targets: one decode step of the batched greedy
distillation pass, one training step of each feature drafter kind and one of the draft LM's corpus
steps, at a recipe's shapes, through the build's own functions (`train.greedy_continuations`,
`train.train_drafter`, `train.train_lm`; CUDA graphs where the recipe has `cuda_graphs`), with the
preset's stages estimated from them; `--profile` adds the top operators of each.

  python bench/zoo_build_steps.py --preset small --device cuda --profile --out results.json

The weights are random (a step's time does not depend on them) and so are the token ids; the
target is rounded to the stored dtype and computes in float32, as in the build. A step's time is
the slope through runs of n, 2n, … 6n steps (`common.step_ms`), so what every run pays once —
warm-up, capture, prefill — stays in the intercept.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import git_sha, recipe, seconds, step_ms, top_kernels  # noqa: E402

from specpilot.zoo import build as B  # noqa: E402
from specpilot.zoo import train  # noqa: E402


def per_step(run, n: int, device: str, profile: bool) -> dict:
    """run(k) runs k steps; → ms per step and its interval (`common.step_ms`: the slope through runs
    of n, 2n, … 6n steps), and the top operators of n steps."""
    seconds(lambda: run(n), device)  # warm-up
    row = step_ms(lambda k: seconds(lambda: run(k), device), n)
    if profile:
        row["kernels"] = top_kernels(lambda: run(n), n, device)
    return row


def role_steps(r: B.Recipe, hybrid: bool, device: str, n: int, seqs_n: int, profile: bool) -> dict:
    target = B.as_stored(B.new_target(r, hybrid, device), getattr(torch, r.store_dtype)).eval()
    gen = torch.Generator().manual_seed(0)
    prompts = torch.randint(1, r.vocab, (r.gen_batch, r.prompt_len), generator=gen).to(device)
    decode = per_step(lambda k: train.greedy_continuations(target, prompts, k, batch=r.gen_batch), n, device, profile)
    passes = -(-r.distill_seqs // r.gen_batch)
    out = {"decode": decode | {"batch": r.gen_batch, "stage_estimate_s": decode["step_ms"] / 1e3 * r.gen_len * passes}}
    if not hybrid and r.draft_lm_corpus_steps:  # the draft LM's corpus steps (trained once, by the dense role)
        lm = B.new_draft_lm(r, device)
        stream = torch.randint(1, r.vocab, (1 << 20,), generator=gen)

        def lm_run(k):
            return train.train_lm(lm, stream, k, r.target_batch, r.seq, r.draft_lm_lr, r.seed + 8, "draft LM", None,
                                  device, graph=r.cuda_graphs)
        row = per_step(lm_run, n, device, profile)
        out["draft_lm_corpus"] = row | {"batch": r.target_batch, "stage_estimate_s": row["step_ms"] / 1e3 *
                                        r.draft_lm_corpus_steps}
    seqs = torch.randint(1, r.vocab, (seqs_n, r.prompt_len + r.gen_len), generator=gen).to(device)
    layers = tuple(B.drafter_config(r, "block", target.cfg).target_layers)
    feats = train.target_features(target, seqs, layers)
    block = None
    for kind in B.KINDS:
        steps, batch, lr = r.training(kind, "hybrid" if hybrid else "dense")
        cfg = B.drafter_config(r, kind, target.cfg)

        def run(k, cfg=cfg, batch=batch, lr=lr):
            return train.train_drafter(cfg, target, seqs, feats, r.prompt_len, k, batch, lr, r.seed + 5, kind, None,
                                       body=block, **B.drafter_options(r))
        row = per_step(run, n, device, profile)
        out[kind] = row | {"batch": batch, "stage_estimate_s": row["step_ms"] / 1e3 * steps}
        if kind == "block":
            block = run(1)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--preset", default="small")
    ap.add_argument("--role", choices=("dense", "hybrid"), action="append", help="default: both")
    ap.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE", help="override a recipe field")
    ap.add_argument("--steps", type=int, default=10, help="n: steps of the shortest timed run (runs of n, 2n, … 6n)")
    ap.add_argument("--seqs", type=int, default=512, help="random distillation sequences the drafters draw from")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    r = recipe(ap, args)
    result = {"command": " ".join(["python"] + sys.argv), "date": datetime.date.today().isoformat(),
              "git_sha": git_sha(), "device": torch.cuda.get_device_name() if args.device.startswith("cuda") else "cpu",
              "torch": torch.__version__, "preset": args.preset, "overrides": args.set, "steps": args.steps,
              "recipe": dataclasses.asdict(r), "roles": {}}
    for role in args.role or ["dense", "hybrid"]:
        torch.manual_seed(r.seed)
        result["roles"][role] = got = role_steps(r, role == "hybrid", args.device, args.steps, args.seqs, args.profile)
        for stage, row in got.items():
            print(f"{role:7s} {stage:13s} {row['step_ms']:8.2f} ms/step  stage ≈ {row['stage_estimate_s']:.1f} s",
                  flush=True)
        Path(args.out).write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
