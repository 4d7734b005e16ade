"""`specpilot costmodel`: where a deployment's speed leaks.

Profiles the engine (stock chain and best-first trees of several budgets) on HumanEval prompts,
measures τ(N), T_step(N) and T_AR, computes c(N) = T_step / T_AR and speedup = τ / c, picks the
best budget, and splits what is left into the four ceiling factors (tree: the oracle's τ by exact
replay over the current τ; kernels: profiled time over byte floors; off-profile: measured step over
profiled time; rows: the floors at the rows verified over those at the rows the oracle's τ needs),
naming the direction a round should attack. `--batch B` measures at B requests decoded at once
(the batched decoder users run); `--batch 1,16` measures each size and sets them side by side.
"""

from __future__ import annotations

import json
from pathlib import Path

from specpilot.progress import progress_bar

POLICIES = ("chain", "best-first:16", "best-first:32", "best-first:63")


def parse_batches(text: str) -> list[int]:
    """"16" or "1,16": distinct positive batch sizes, increasing; a one-line error otherwise."""
    parts = [p.strip() for p in str(text).split(",")]
    if not all(p.isdigit() and int(p) > 0 for p in parts) or len(set(map(int, parts))) != len(parts):
        raise ValueError(f"--batch {text!r}: expected a positive integer (requests decoded at once) or a list of "
                         "distinct ones, e.g. 1,16")
    return sorted(int(p) for p in parts)


def run_costmodel(target_dir, drafter_dir, prompts: int = 4, new_tokens: int = 48, device: str = "cpu",
                  device_kind: str | None = None, policies=POLICIES, progress=True, batch: int = 1) -> dict:
    """Measure (the GPU worker's Profile, in this process) and analyze (the planner's cost model)
    the stock chain system of a target and drafter, with best-first budgets beside it, at `batch`
    requests decoded at once."""
    from specpilot.engine.engine import Engine, EngineConfig
    from specpilot.services.gpu_worker.profiling import measure
    from specpilot.services.planner import costmodel
    from specpilot.zoo.workloads import humaneval

    costmodel.check_batch(batch)
    engine = Engine(EngineConfig(target=str(target_dir), drafter=str(drafter_dir), mode="chain", draft_len=16,
                                 device=device))
    if engine.tokenizer is None:
        raise ValueError(f"{target_dir} has no tokenizer.json: the cost model profiles on HumanEval text prompts")
    ids = [engine.encode(r)[-512:] for r in humaneval(limit=prompts)]
    with progress_bar(len(policies) * len(ids), f"profiling at batch {batch}", "run", disable=not progress) as bar:
        m = measure(engine, ids, new_tokens, list(policies), [], progress=bar.update, batch=batch)
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
    p.add_argument("--batch", default="1", metavar="N[,N...]",
                   help="requests decoded at once (default 1); several, e.g. 1,16: each measured, side by side")
    p.add_argument("--svg", metavar="FILE", help="write the ceiling chart (several batch sizes: speedup by batch)")
    p.add_argument("--force-drafter", action="store_true",
                   help="use a drafter whose manifest names another target, or whose vocabulary differs")
    p.add_argument("--json", action="store_true",
                   help="print one JSON object (several batch sizes: their analyses under \"batches\")")
    p.set_defaults(func=run)


def run(args) -> int:
    from specpilot.engine.checkpoint import check_system
    from specpilot.services.planner import costmodel

    for flag, v in (("--prompts", args.prompts), ("--new-tokens", args.new_tokens)):
        if v < 1:
            raise ValueError(f"{flag} {v}: expected a positive integer")
    batches = parse_batches(args.batch)
    if not args.device.startswith(("cpu", "cuda")):
        raise ValueError(f"--device {args.device!r}: expected cpu, cuda or cuda:N")
    check_system(args.target, args.drafter, args.force_drafter)
    outs = [run_costmodel(args.target, args.drafter, args.prompts, args.new_tokens, args.device, args.device_kind,
                          progress=not args.json, batch=b) for b in batches]
    if args.svg:
        Path(args.svg).write_text(outs[0]["svg"] if len(outs) == 1 else costmodel.render_batch_svg(outs))
    if args.json:
        plain = [{k: v for k, v in o.items() if k not in ("table", "svg")} for o in outs]
        common = {k: plain[0][k] for k in ("target", "drafter", "device", "device_kind")}
        print(json.dumps(plain[0] if len(plain) == 1 else {**common, "batches": plain}))
        return 0
    for out in outs:
        print(f"T_AR {out['t_ar_s'] * 1e3:.2f} ms at batch {out['batch']} ({out['device']})")
        print(f"{'policy':16s} {'rows':>6s} {'τ':>6s} {'T_step':>10s} {'c':>6s} {'speedup':>8s}")
        for r in out["budgets"]:
            print(f"{r['policy']:16s} {r['rows']:6.1f} {r['tau']:6.2f} {r['t_step_s'] * 1e3:8.2f}ms {r['c']:6.2f} "
                  f"{r['speedup']:8.2f}")
        print(f"best: {out['best']} · oracle τ {out['tau_oracle']:.2f} (on the {out['current']} recording)\n")
        print(out["table"])
    if len(outs) > 1:
        print(costmodel.render_batch_table(outs))
    return 0
