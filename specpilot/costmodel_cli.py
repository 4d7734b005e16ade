"""`specpilot costmodel`: where a deployment's speed leaks.

Profiles the engine (stock chain and best-first trees of several budgets) on HumanEval prompts,
measures τ(N), T_step(N) and T_AR, computes c(N) = T_step / T_AR and speedup = τ / c, picks the
best budget, and splits what is left into the three ceiling factors (tree: the oracle's τ by exact
replay over the current τ; kernels: profiled time over byte floors; off-profile: measured step over
profiled time), naming the direction a round should attack.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
from tqdm import tqdm

POLICIES = ("chain", "best-first:16", "best-first:32", "best-first:63")


def mean(xs) -> float:
    xs = list(xs)
    return sum(xs) / len(xs) if xs else 0.0


def run_costmodel(target_dir, drafter_dir, prompts: int = 4, new_tokens: int = 48, device: str = "cpu",
                  device_kind: str | None = None, policies=POLICIES, progress=True) -> dict:
    from specpilot.engine.checkpoint import load_model
    from specpilot.engine.decode import generate
    from specpilot.engine.drafters import load_drafter
    from specpilot.engine.engine import load_tokenizer
    from specpilot.engine.profiler import mean_step, profile_generate
    from specpilot.engine.replay import make_policy, replay
    from specpilot.services.planner import costmodel
    from specpilot.zoo.workloads import humaneval

    target = load_model(target_dir, torch.float32, device)
    drafter = load_drafter(str(drafter_dir), torch.float32, device, target)
    tok = load_tokenizer(target_dir)
    if tok is None:
        raise ValueError(f"{target_dir} has no tokenizer.json: the cost model profiles on HumanEval text prompts")
    ids = [tok.encode(r.prompt).ids[-512:] for r in humaneval(limit=prompts)]
    rows, t_ars = {}, []
    bar = tqdm(total=len(policies) * len(ids), desc="profiling", disable=not progress, file=sys.stderr)
    for spec in policies:
        steps, walls = [], []
        for p in ids:
            res = profile_generate(target, p, new_tokens, drafter, draft_len=16, policy=make_policy(spec))
            steps += res.steps
            walls += res.reference_step_wall
            t_ars.append(res.t_ar)
            bar.update(1)
        rows[spec] = {"mean_step": mean_step(steps), "tau": mean(s.tau for s in steps), "t_step": mean(walls)}
    bar.close()
    t_ar = mean(t_ars)
    table = []
    for spec, r in rows.items():
        c = costmodel.step_cost(r["t_step"], t_ar)
        table.append({"policy": spec, "rows": r["mean_step"].n, "tau": r["tau"], "t_step_s": r["t_step"], "c": c,
                      "speedup": costmodel.speedup(r["tau"], r["t_step"], t_ar)})
    best = max(table, key=lambda r: (r["speedup"], -table.index(r)))
    record = []
    for p in ids:
        generate(target, p, new_tokens, drafter, draft_len=16, policy=make_policy(best["policy"]), record=record)
    tau_oracle = mean(replay(record, "oracle"))
    step = rows[best["policy"]]["mean_step"]
    measured = {k: v for k, v in step.kernels.items() if k != "other"}  # "other" is the off-profile remainder
    profile = costmodel.Profile(t_step=best["t_step_s"], kernels=measured, n=step.n)
    kind = device_kind or ("cpu" if device == "cpu" else "h200")
    ceil = costmodel.ceiling(profile, kind, best["tau"], max(tau_oracle, best["tau"]))
    return {"target": str(target_dir), "drafter": str(drafter_dir), "device": device, "device_kind": kind,
            "t_ar_s": t_ar, "budgets": table, "best": best["policy"], "tau_oracle": tau_oracle,
            "ceiling": {"factors": ceil.factors, "product": ceil.product, "largest": ceil.largest,
                        "per_class": [{"class": r.kernel_class, "seconds": r.seconds, "floor_s": r.floor, "ratio": r.ratio}
                                      for r in ceil.per_class]},
            "direction": costmodel.direction(ceil), "table": costmodel.render_table(ceil),
            "svg": costmodel.render_svg(ceil)}


def register(subparsers) -> None:
    p = subparsers.add_parser("costmodel", help="τ(N), c(N), speedup, the best budget and the ceiling factors")
    p.add_argument("--target", required=True, metavar="DIR")
    p.add_argument("--drafter", required=True, metavar="DIR")
    p.add_argument("--device", default="cpu")
    p.add_argument("--device-kind", choices=("h100-sxm", "h200", "rtx-pro-6000", "cpu"),
                   help="peak figures for the byte floors (default: cpu, measured; h200 on CUDA)")
    p.add_argument("--prompts", type=int, default=4, metavar="N")
    p.add_argument("--new-tokens", type=int, default=48, metavar="N")
    p.add_argument("--svg", metavar="FILE", help="write the ceiling chart")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=run)


def run(args) -> int:
    out = run_costmodel(args.target, args.drafter, args.prompts, args.new_tokens, args.device, args.device_kind,
                        progress=not args.json)
    if args.svg:
        Path(args.svg).write_text(out["svg"])
    if args.json:
        print(json.dumps({k: v for k, v in out.items() if k not in ("table", "svg")}))
        return 0
    print(f"T_AR {out['t_ar_s'] * 1e3:.2f} ms ({out['device']})")
    print(f"{'policy':16s} {'rows':>5s} {'τ':>6s} {'T_step':>10s} {'c':>6s} {'speedup':>8s}")
    for r in out["budgets"]:
        rows = str(r["rows"]) if r["rows"] >= 0 else "mixed"
        print(f"{r['policy']:16s} {rows:>5s} {r['tau']:6.2f} {r['t_step_s'] * 1e3:8.2f}ms {r['c']:6.2f} "
              f"{r['speedup']:8.2f}")
    print(f"best: {out['best']} · oracle τ {out['tau_oracle']:.2f}\n")
    print(out["table"])
    return 0
