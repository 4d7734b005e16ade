"""The `specpilot` command line. Every command takes --json for scripting; errors say what to do."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from tqdm import tqdm


def _engine_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--target", required=True, metavar="DIR", help="target checkpoint folder (Hugging Face format)")
    p.add_argument("--drafter", metavar="DIR|ngram", help="drafter checkpoint folder, or 'ngram' (prompt lookup)")
    p.add_argument("--mode", choices=("ar", "chain", "tree"), default="chain",
                   help="ar: plain greedy; chain: stock speculative; tree: verify a draft tree (--tree)")
    p.add_argument("--tree", default="best-first:32", metavar="POLICY",
                   help="tree mode: best-first:N | topk:K:N | sequoia:N | chain (default best-first:32)")
    p.add_argument("--profile", metavar="FILE", help="sequoia: acceptance profile from `specpilot replay --profile-out`")
    p.add_argument("--draft-len", type=int, default=8, metavar="N", help="drafted positions per step (default 8)")
    p.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N")
    p.add_argument("--dtype", choices=("float64", "float32", "bfloat16"), default="float32")
    p.add_argument("--max-new-tokens", type=int, default=64, metavar="N")


def cmd_generate(args) -> int:
    from specpilot.engine.engine import Engine, EngineConfig
    from specpilot.zoo.workloads import Request, read_workload

    if bool(args.workload) == bool(args.prompt):
        raise ValueError("give exactly one of --workload FILE.jsonl or --prompt TEXT")
    requests = read_workload(args.workload) if args.workload else [Request(id="prompt", prompt=args.prompt)]
    engine = Engine(EngineConfig(target=args.target, drafter=args.drafter, mode=args.mode, tree=args.tree,
                                 profile=args.profile, draft_len=args.draft_len, dtype=args.dtype,
                                 device=args.device, max_new_tokens=args.max_new_tokens))
    records = [] if args.record else None
    with tqdm(total=len(requests), desc="generate", unit="req", file=sys.stderr,
              disable=len(requests) < 2) as bar:
        out = engine.run(requests, progress=bar.update, records=records)
    if args.record:
        from specpilot.engine.replay import write_record

        write_record(args.record, records)
    if args.json:
        print(json.dumps(out))
        return 0
    for o in out["outputs"]:
        print(f"── {o['id']}  (τ {o['tau_mean']:.2f}, {o['steps']} steps)")
        print(o["text"] if o["text"] is not None else o["tokens"])
    print(f"\nτ {out['tau_mean']:.2f} · {out['tokens_per_s']:.1f} tokens/s · {out['steps']} target passes")
    return 0


def cmd_replay(args) -> int:
    from specpilot.engine.replay import acceptance_profile, read_record, replay

    runs = read_record(args.record)
    steps = [s for _, _, st in runs for s in st]
    if not steps:
        raise ValueError(f"{args.record} holds no steps")
    profile = acceptance_profile(steps)
    if args.profile_out:
        Path(args.profile_out).write_text(json.dumps({"profile": profile.tolist(), "record": args.record}))
    online = sum(s.tau for s in steps) / len(steps)
    rows = []
    for spec in args.policy or ["chain", "best-first:32", "oracle"]:
        taus = replay(steps, spec, profile)
        rows.append({"policy": spec, "tau_mean": sum(taus) / len(taus), "steps": len(taus)})
    out = {"record": args.record, "recorded_policies": sorted({p for _, p, _ in runs}), "online_tau_mean": online,
           "policies": rows}
    if args.json:
        print(json.dumps(out))
        return 0
    print(f"{len(steps)} recorded target passes ({', '.join(out['recorded_policies'])}), online τ {online:.3f}")
    for r in rows:
        print(f"  {r['policy']:16s} τ {r['tau_mean']:.3f}")
    print("sequoia shapes are fitted on this same record (in-sample)")
    return 0


def cmd_pair(args) -> int:
    from specpilot.engine.engine import EngineConfig
    from specpilot.devices import device_list
    from specpilot.services.controller.pairing import judge, system, write_verdict
    from specpilot.services.gpu_worker.systems import LocalWorkers
    from specpilot.zoo.workloads import read_workload

    def config(path):
        try:
            cfg = json.loads(Path(path).read_text())
            EngineConfig(**cfg).validate()
        except (OSError, json.JSONDecodeError, TypeError, ValueError) as e:
            raise ValueError(f"{path}: not a system config ({e}); write a JSON object of EngineConfig fields, "
                             'e.g. {"target": "DIR", "drafter": "DIR", "mode": "chain"}') from None
        return cfg

    cand, inc = config(args.candidate), config(args.incumbent)
    stock = config(args.stock) if args.stock else {**inc, "mode": "chain"}
    reqs = [{k: v for k, v in {"id": r.id, "prompt": r.prompt, "prompt_ids": list(r.prompt_ids) if r.prompt_ids
             else None, "max_new_tokens": r.max_new_tokens}.items() if v is not None} for r in read_workload(args.workload)]
    devices = device_list(args.devices)
    steps = 2 * args.repeats * (2 if len(devices) == 1 else 1)
    with tqdm(total=2 * steps, desc="paired runs", unit="step", file=sys.stderr, disable=args.json) as bar:
        record = judge(system(cand), system(inc), system(stock), reqs, devices, args.repeats, timeout=args.timeout,
                       progress=bar.update, workers=LocalWorkers())
    path = write_verdict(record, args.verdicts)
    out = {k: record[k] for k in ("gain", "lower_bound", "stock_noise", "threshold", "accepted", "reasons",
                                  "outputs_differ")} | {"verdict": str(path)}
    if args.json:
        print(json.dumps(out))
        return 0
    print(f"gain ×{out['gain']:.4f}, 95 % lower bound ×{out['lower_bound']:.4f}, stock noise {out['stock_noise']:.4f}"
          f" → {'ACCEPTED' if out['accepted'] else 'rejected'} (bound − 1 had to clear {out['threshold']:.4f})")
    for r in out["reasons"]:
        print(f"  {r}")
    print(f"verdict: {path}")
    return 0


def cmd_selftest(args) -> int:
    from specpilot.selftest import run_selftest

    if args.repeats < 2:
        raise ValueError(f"--repeats {args.repeats}: a verdict's bound needs at least 2 repeats")
    out = run_selftest(trials=args.trials, progress=not args.json, real_runs=args.real_runs,
                       design=(args.repeats, 1))
    if args.json:
        print(json.dumps(out))
        return 0
    print(f"token forcing (δ {out['delta']}): lossless mechanisms pass: {out['lossless_passed']}")
    print(f"  planted logit bias rejected in {out['defect_rejected']} of {out['defect_trials']} trials that flip "
          f"≥ 1 % of tokens ({out['defect_trials_below_1pct_flips']} trials flipped less)")
    print(f"  a bias that flips no argmax passes: {out['no_flip_bias_passed']}")
    ref, d = out["reference_design"], out["deployment_design"]
    print(f"paired runs ({out['paired_runs']}), reference design {ref['repeats']} repeats × {ref['cells']} cells at "
          f"noise cv {ref['noise_cv']:.0%}: A/A accepted {out['aa_accepted']}/{out['aa_trials']}, "
          f"3 % slowdown accepted {out['slowdown_accepted']}/{out['slowdown_trials']}, 12 % speedup accepted "
          f"{out['speedup_accepted']}/{out['speedup_trials']}, label swap inverts the gain: {out['swap_inverts']}")
    print(f"  at this deployment's design, {d['repeats']} repeats × {d['cells']} cell, noise cv {d['noise_cv']:.1%} "
          f"({d['noise_source']}): A/A accepted {d['aa_accepted']}/{d['trials']}, 3 % slowdown "
          f"{d['slowdown_accepted']}/{d['trials']}, 12 % speedup {d['speedup_accepted']}/{d['trials']}; smallest "
          f"gain accepted about half the time {d['smallest_gain']:.1%} (CPU target {d['target']:.0%}"
          + (")" if d["meets_target"] else f": not met, {d['repeats_for_target'] or 'no number of'} repeats would)"))
    if args.real_runs:
        print(f"real paired runs (2 cores): A/A accepted {out['real_aa_accepted']}/{out['real_aa_runs']}, "
              f"3 % slowdown accepted: {out['real_slowdown_accepted']}, "
              f"AR (faster on CPU) accepted: {out['real_speedup_accepted']}")
    return 0


def cmd_demo(args) -> int:
    from specpilot.round_cli import run_demo

    quick = {"prompts": 1, "max_new_tokens": 16, "repeats": 2, "budgets": ["chain", "best-first:16"],
             "max_candidates": 1} if args.quick else None
    out = run_demo(args.rounds, Path(args.run_dir) if args.run_dir else None, args.json, quick)
    if args.json:
        print(json.dumps(out))
        return 0
    stock = out["speedup_over_stock"]
    print(f"\n{len(out['rounds'])} rounds in {out['seconds']:.0f} s; final system ×{stock:.3f} over stock chain "
          f"(×{out['speedup_over_ar']:.3f} over AR), timed by the controller")
    print(f"report: {out['report']}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    from specpilot import costmodel_cli, force_cli, memory_cli, round_cli, stack_cli
    from specpilot.zoo import cli as zoo_cli

    parser = argparse.ArgumentParser(prog="specpilot", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    g = sub.add_parser("generate", help="greedy generation, AR or speculative, on a prompt or workload")
    _engine_args(g)
    g.add_argument("--workload", metavar="FILE.jsonl", help='requests, one {"id", "prompt"|"prompt_ids"} per line')
    g.add_argument("--prompt", metavar="TEXT", help="a single text prompt")
    g.add_argument("--record", metavar="FILE", help="save every target pass (lattice, tree, argmax) for replay")
    g.add_argument("--json", action="store_true", help="print one JSON object")
    g.set_defaults(func=cmd_generate)

    r = sub.add_parser("replay", help="τ of tree policies on recorded target passes, offline and exact")
    r.add_argument("--record", required=True, metavar="FILE", help="from `generate --record FILE`")
    r.add_argument("--policy", action="append", metavar="POLICY",
                   help="chain | best-first:N | topk:K:N | sequoia:N | oracle (repeatable)")
    r.add_argument("--profile-out", metavar="FILE", help="write the measured acceptance profile (for sequoia)")
    r.add_argument("--json", action="store_true", help="print one JSON object")
    r.set_defaults(func=cmd_replay)

    pr = sub.add_parser("pair", help="paired, swapped timing of two systems, each in its own process; a verdict")
    pr.add_argument("--candidate", required=True, metavar="CONFIG", help="JSON file of EngineConfig fields")
    pr.add_argument("--incumbent", required=True, metavar="CONFIG", help="JSON file of EngineConfig fields")
    pr.add_argument("--stock", metavar="CONFIG", help="stock system for the noise run (default: the incumbent's "
                    "target and drafter, chain mode)")
    pr.add_argument("--workload", required=True, metavar="FILE.jsonl")
    pr.add_argument("--devices", default="cpu,cpu", help="cpu,cpu (one core each) | cuda:0,cuda:1 | one device: ABBA")
    pr.add_argument("--repeats", type=int, default=14, metavar="N", help="swapped pairs per comparison (default 14)")
    pr.add_argument("--timeout", type=float, default=600.0, metavar="S", help="per worker call (default 600 s)")
    pr.add_argument("--verdicts", default="verdicts", metavar="DIR", help="where verdict records are stored")
    pr.add_argument("--json", action="store_true", help="print one JSON object")
    pr.set_defaults(func=cmd_pair)

    st = sub.add_parser("selftest", help="the controller's self-tests: planted defects, A/A, slowdown, swap")
    st.add_argument("--trials", type=int, default=20, metavar="N", help="planted logit-bias trials (default 20)")
    st.add_argument("--real-runs", type=int, default=5, metavar="N", help="real A/A paired runs (default 5)")
    st.add_argument("--repeats", type=int, default=6, metavar="N",
                    help="the deployment's repeats: its power is reported at N repeats × 1 cell (default 6, a round's)")
    st.add_argument("--json", action="store_true", help="print one JSON object")
    st.set_defaults(func=cmd_selftest)

    d = sub.add_parser("demo", help="the embedded default: rounds on the shipped micro pair, CPU only, and a report")
    d.add_argument("--rounds", type=int, default=2, metavar="K", help="rounds (default 2)")
    d.add_argument("--run-dir", metavar="DIR", help="default: runs/demo-<date>")
    d.add_argument("--quick", action="store_true", help="a smoke run: 1 prompt, 16 tokens, 2 repeats, 1 candidate "
                   "per round (its verdicts are weak: too few repeats)")
    d.add_argument("--json", action="store_true", help="print one JSON object")
    d.set_defaults(func=cmd_demo)

    zoo_cli.register(sub)
    force_cli.register(sub)
    memory_cli.register(sub)
    costmodel_cli.register(sub)
    round_cli.register(sub)
    stack_cli.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    from specpilot.engine.checkpoint import CheckpointError

    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except (CheckpointError, ValueError, FileNotFoundError, RuntimeError, LookupError) as e:
        msg = e.args[0] if isinstance(e, KeyError) and e.args else e
        print(f"specpilot {args.command}: error: {msg}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
