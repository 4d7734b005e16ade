"""`specpilot costmodel`: where a deployment's speed leaks.

Profiles the engine (stock chain and best-first trees of several budgets) on HumanEval prompts,
measures τ(N), T_step(N) and T_AR, computes c(N) = T_step / T_AR and speedup = τ / c, picks the
best budget, and splits what is left into the three ceiling factors (tree: the oracle's τ by exact
replay over the current τ; kernels: profiled time over byte floors; off-profile: measured step over
profiled time), naming the direction a round should attack.
"""

from __future__ import annotations

import json
from pathlib import Path

from specpilot.progress import progress_bar

POLICIES = ("chain", "best-first:16", "best-first:32", "best-first:63")


def run_costmodel(target_dir, drafter_dir, prompts: int = 4, new_tokens: int = 48, device: str = "cpu",
                  device_kind: str | None = None, policies=POLICIES, progress=True) -> dict:
    """Measure (the GPU worker's Profile, in this process) and analyze (the planner's cost model)
    the stock chain system of a target and drafter, with best-first budgets beside it."""
    from specpilot.engine.engine import Engine, EngineConfig
    from specpilot.services.gpu_worker.profiling import measure
    from specpilot.services.planner import costmodel
    from specpilot.zoo.workloads import humaneval

    engine = Engine(EngineConfig(target=str(target_dir), drafter=str(drafter_dir), mode="chain", draft_len=16,
                                 device=device))
    if engine.tokenizer is None:
        raise ValueError(f"{target_dir} has no tokenizer.json: the cost model profiles on HumanEval text prompts")
    ids = [engine.encode(r)[-512:] for r in humaneval(limit=prompts)]
    with progress_bar(len(policies) * len(ids), "profiling", "run", disable=not progress) as bar:
        m = measure(engine, ids, new_tokens, list(policies), [], progress=bar.update)
    kind = device_kind or ("cpu" if device == "cpu" else "h200")
    return {"target": str(target_dir), "drafter": str(drafter_dir), "device": device, "device_kind": kind,
            **costmodel.analyze(m, kind)}


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
    p.add_argument("--force-drafter", action="store_true",
                   help="use a drafter whose manifest names another target, or whose vocabulary differs")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=run)


def run(args) -> int:
    from specpilot.engine.checkpoint import check_system

    for flag, v in (("--prompts", args.prompts), ("--new-tokens", args.new_tokens)):
        if v < 1:
            raise ValueError(f"{flag} {v}: expected a positive integer")
    if not args.device.startswith(("cpu", "cuda")):
        raise ValueError(f"--device {args.device!r}: expected cpu, cuda or cuda:N")
    check_system(args.target, args.drafter, args.force_drafter)
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
        print(f"{r['policy']:16s} {r['rows']:5.1f} {r['tau']:6.2f} {r['t_step_s'] * 1e3:8.2f}ms {r['c']:6.2f} "
              f"{r['speedup']:8.2f}")
    print(f"best: {out['best']} · oracle τ {out['tau_oracle']:.2f} (on the {out['current']} recording)\n")
    print(out["table"])
    return 0
