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
from common import git_sha, recipe, seconds, step_ms, top_kernels  # noqa: E402
from zoo_realism import heldout_docs, measure  # noqa: E402

from specpilot.zoo import build as B  # noqa: E402
from specpilot.zoo import tokenizer as tok_mod  # noqa: E402
from specpilot.zoo import workloads  # noqa: E402


def trainer(r: B.Recipe, hybrid: bool, train_ids: torch.Tensor, device: str):
    """run(n): seconds of n more training steps of one fresh target of the role (`build.target_steps`)."""
    target = B.new_target(r, hybrid, device)
    return lambda n: seconds(lambda: B.target_steps(r, target, train_ids, n, device, "step", None), device)


def step_seconds(r: B.Recipe, hybrid: bool, train_ids: torch.Tensor, device: str, steps: int = 12,
                 profile: bool = False) -> tuple[dict, float, list | None]:
    """({"step_ms", "step_ms_ci95"} of a training step at the recipe's shape (`common.step_ms`: the
    slope through runs of 12, 24, … 72 steps), seconds of the first `steps` steps — the warm-up,
    compiling included —, and with `profile` the kernels of `steps` steady-state steps by device
    time)."""
    run = trainer(r, hybrid, train_ids, device)
    warmup = run(steps)  # allocator, kernels, autotuning, compiling
    row = step_ms(run, steps)
    kernels = top_kernels(lambda: run(steps), steps, device) if profile else None
    return row, warmup, kernels


def side_by_side(r: B.Recipe, roles: list[str], train_ids: torch.Tensor, device: str, window_s: float,
                 chunk: int = 10) -> dict:
    """Per role, ms per training step timed alone (the other role's process waiting) and beside
    the other role's (both training), as the build's side-by-side roles share one GPU. One forked
    process per role (the parent must not have touched CUDA); each warms up, then every phase
    starts at a barrier and lasts `window_s`, chunks of `chunk` steps counted until it ends."""
    import multiprocessing as mp

    ctx = mp.get_context("fork")
    barrier, queue = ctx.Barrier(len(roles)), ctx.Queue()
    phases = [(f"{role} alone", {role}) for role in roles] + [("side by side", set(roles))]

    def work(role):
        run = trainer(r, role == "hybrid", train_ids, device)
        got = {"warmup_s": run(12)}
        for name, busy in phases:
            barrier.wait()
            t, n = time.perf_counter(), 0
            while time.perf_counter() - t < window_s:
                if role in busy:
                    run(chunk)
                    n += chunk
                else:
                    time.sleep(0.05)
            if role in busy:
                got[name] = (time.perf_counter() - t) / n * 1e3
        queue.put((role, got))

    procs = [ctx.Process(target=work, args=(role,)) for role in roles]
    for pr in procs:
        pr.start()
    out = dict(queue.get() for _ in roles)
    for pr in procs:
        pr.join()
    return {role: {"warmup_s": got["warmup_s"], "alone_step_ms": got[f"{role} alone"],
                   "side_by_side_step_ms": got["side by side"]} for role, got in out.items()}


def in_threads(r: B.Recipe, train_ids: torch.Tensor, steps: int) -> dict:
    """Both roles trained by `build.target_steps` in ONE process, each in its own thread on its own CUDA
    stream, so that kernels of both may run at once (two processes only take turns on the GPU).
    Each role first warms up (compiles) alone, then is timed alone for `steps` steps; then both run
    together, the dense role given as many steps as take it as long alone as the hybrid's `steps`.
    → per role its alone ms per step, and the pair's seconds against the sum of the alone times."""
    import threading

    roles = {role: (B.new_target(r, role == "hybrid", "cuda"), torch.cuda.Stream()) for role in ("dense", "hybrid")}

    def run(role: str, n: int) -> None:
        target, stream = roles[role]
        with torch.cuda.stream(stream):
            B.target_steps(r, target, train_ids, n, "cuda", role, None)

    got: dict = {}
    for role in roles:
        got[role] = {"warmup_s": seconds(lambda: run(role, 12), "cuda")}
        got[role]["alone_step_ms"] = seconds(lambda: run(role, steps), "cuda") / steps * 1e3
    n = {"hybrid": steps, "dense": max(1, round(steps * got["hybrid"]["alone_step_ms"] / got["dense"]["alone_step_ms"]))}
    alone_s = sum(n[role] * got[role]["alone_step_ms"] / 1e3 for role in roles)
    threads = [threading.Thread(target=run, args=(role, n[role])) for role in roles]
    torch.cuda.synchronize()
    t = time.perf_counter()
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    torch.cuda.synchronize()
    together_s = time.perf_counter() - t
    return {"roles": got, "together_steps": n, "together_s": together_s, "alone_s": alone_s,
            "speedup": alone_s / together_s}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--preset", default="small")
    ap.add_argument("--role", choices=("dense", "hybrid"), action="append",
                    help="the target to train (default dense); with --time-only, repeat it to time several")
    ap.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE", help="override a recipe field")
    ap.add_argument("--budget-s", type=float, help="training time to fit the step count into")
    ap.add_argument("--prompts", type=int, default=164)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--keep", help="folder to save the trained target in (default: out/target_sweep/ROLE)")
    ap.add_argument("--time-only", action="store_true", help="only time the steps (no training run, no measures)")
    ap.add_argument("--profile", action="store_true", help="with --time-only: the top kernels of a step by device time")
    ap.add_argument("--side-by-side", type=float, metavar="SECONDS",
                    help="with --time-only and two roles: time each role's steps alone and beside the other's, "
                         "SECONDS per phase, in two processes sharing the GPU as the build's roles do")
    ap.add_argument("--threads", type=int, metavar="STEPS",
                    help="with --time-only: time both roles alone and together in one process, a thread and a "
                         "CUDA stream each, STEPS hybrid steps per phase (in_threads)")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    r = recipe(ap, args)
    roles = args.role or ["dense"]
    if len(roles) > 1 and not args.time_only:
        ap.error("several --role only with --time-only")
    t = time.perf_counter()
    inp = B.prepare(r)
    prepare_s = time.perf_counter() - t
    if args.side_by_side:
        if not args.time_only or len(roles) != 2:
            ap.error("--side-by-side needs --time-only and both --role dense --role hybrid")
        shared = side_by_side(r, roles, inp.train_ids, args.device, args.side_by_side)
    head = {"command": " ".join(["python"] + sys.argv), "date": datetime.date.today().isoformat(),
            "git_sha": git_sha(), "device": torch.cuda.get_device_name() if args.device == "cuda" else "cpu",
            "torch": torch.__version__, "preset": args.preset, "overrides": args.set,
            "corpus_tokens": len(inp.train_ids), "prepare_s": prepare_s}
    if args.threads:
        if not args.time_only or args.device != "cuda":
            ap.error("--threads needs --time-only and --device cuda")
        got = in_threads(r, inp.train_ids, args.threads)
        for role, row in got["roles"].items():
            print(f"{role}: {row['alone_step_ms']:.1f} ms/step alone (warm-up {row['warmup_s']:.1f} s)", flush=True)
        print(f"together, one process: {got['together_s']:.1f} s for {got['together_steps']} steps, "
              f"{got['alone_s']:.1f} s alone: ×{got['speedup']:.3f}", flush=True)
        Path(args.out).write_text(json.dumps(head | got | {"recipe": dataclasses.asdict(r)}, indent=1))
        return 0
    if args.side_by_side:
        for role, got in shared.items():
            print(f"{role}: {got['alone_step_ms']:.1f} ms/step alone, {got['side_by_side_step_ms']:.1f} beside the "
                  f"other role (warm-up {got['warmup_s']:.1f} s)", flush=True)
        Path(args.out).write_text(json.dumps(head | {"window_s": args.side_by_side, "roles": shared,
                                                     "recipe": dataclasses.asdict(r)}, indent=1))
        return 0
    timed = {}
    for role in roles:
        row, warmup_s, kernels = step_seconds(r, role == "hybrid", inp.train_ids, args.device,
                                              profile=args.profile and args.time_only)
        timed[role] = row | {"warmup_s": warmup_s, "step_tok_per_s": r.target_batch * r.seq / row["step_ms"] * 1e3}
        if kernels is not None:
            timed[role]["kernels"] = kernels
            for k in kernels[:12]:
                print(f"  {k['ms_per_step']:7.2f} ms  {k['calls_per_step']:6.1f}×  {k['name']}", flush=True)
        lo, hi = row["step_ms_ci95"]
        print(f"{role}: {row['step_ms']:.1f} ms/step [{lo:.1f}, {hi:.1f}] "
              f"({timed[role]['step_tok_per_s'] / 1e3:.0f} k tok/s), warm-up {warmup_s:.1f} s", flush=True)
    if args.time_only:
        Path(args.out).write_text(json.dumps(head | {"roles": timed, "recipe": dataclasses.asdict(r)}, indent=1))
        return 0
    role = roles[0]
    hybrid, step_s = role == "hybrid", timed[role]["step_ms"] / 1e3
    head |= {"role": role, **timed[role]}
    steps = r.target_steps if args.budget_s is None else max(1, min(r.target_steps, int(args.budget_s / step_s)))
    r = dataclasses.replace(r, target_steps=steps)
    tokens = steps * r.target_batch * r.seq
    print(f"{role}: {step_s * 1e3:.1f} ms/step → {steps} steps, {tokens / 1e6:.1f} M tokens "
          f"({tokens / len(inp.train_ids):.2f} passes)", flush=True)
    t = time.perf_counter()
    torch.manual_seed(r.seed)
    target = B.train_target(r, hybrid, inp.train_ids, args.device, print)
    if args.device == "cuda":
        torch.cuda.synchronize()
    train_s = time.perf_counter() - t
    keep = Path(args.keep or f"out/target_sweep/{role}")
    B.save_model(target, keep, dtype=getattr(torch, r.store_dtype))
    tok_mod.save(inp.tok, keep)
    prompts = [q.prompt for q in workloads.humaneval(limit=args.prompts)]
    row = measure(keep, r.seq, prompts, args.new_tokens, args.device, heldout_docs())
    result = {**head, "recipe": dataclasses.asdict(r), "train_s": train_s, "train_tokens": tokens,
              "train_tok_per_s": tokens / train_s, "passes": tokens / len(inp.train_ids), **row}
    Path(args.out).write_text(json.dumps(result, indent=1))
    print(f"{role}: trained {train_s:.0f} s ({tokens / train_s / 1e3:.0f} k tok/s); parse_rate "
          f"{row['parse_rate']:.3f}  loop_rate {row['loop_rate']:.3f}  held-out {row['heldout_bpb']:.3f} bits/byte",
          flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
