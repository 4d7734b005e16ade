"""The `specpilot` command line. Every command takes --json for scripting; errors say what to do."""

from __future__ import annotations

import argparse
import json
import sys

from tqdm import tqdm


def _engine_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--target", required=True, metavar="DIR", help="target checkpoint folder (Hugging Face format)")
    p.add_argument("--drafter", metavar="DIR|ngram", help="drafter checkpoint folder, or 'ngram' (prompt lookup)")
    p.add_argument("--mode", choices=("ar", "chain"), default="chain", help="ar: plain greedy; chain: stock speculative")
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
    engine = Engine(EngineConfig(target=args.target, drafter=args.drafter, mode=args.mode,
                                 draft_len=args.draft_len, dtype=args.dtype, device=args.device,
                                 max_new_tokens=args.max_new_tokens))
    with tqdm(total=len(requests), desc="generate", unit="req", file=sys.stderr,
              disable=len(requests) < 2) as bar:
        out = engine.run(requests, progress=bar.update)
    if args.json:
        print(json.dumps(out))
        return 0
    for o in out["outputs"]:
        print(f"── {o['id']}  (τ {o['tau_mean']:.2f}, {o['steps']} steps)")
        print(o["text"] if o["text"] is not None else o["tokens"])
    print(f"\nτ {out['tau_mean']:.2f} · {out['tokens_per_s']:.1f} tokens/s · {out['steps']} target passes")
    return 0


def cmd_demo(args) -> int:
    from specpilot.demo import run_demo

    out = run_demo(log=None if args.json else print)
    if args.json:
        print(json.dumps(out))
    return 0


def build_parser() -> argparse.ArgumentParser:
    from specpilot.zoo import cli as zoo_cli

    parser = argparse.ArgumentParser(prog="specpilot", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    g = sub.add_parser("generate", help="greedy generation, AR or speculative, on a prompt or workload")
    _engine_args(g)
    g.add_argument("--workload", metavar="FILE.jsonl", help='requests, one {"id", "prompt"|"prompt_ids"} per line')
    g.add_argument("--prompt", metavar="TEXT", help="a single text prompt")
    g.add_argument("--json", action="store_true", help="print one JSON object")
    g.set_defaults(func=cmd_generate)

    d = sub.add_parser("demo", help="speculative generation on the shipped micro models")
    d.add_argument("--json", action="store_true", help="print one JSON object")
    d.set_defaults(func=cmd_demo)

    zoo_cli.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    from specpilot.engine.checkpoint import CheckpointError

    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except (CheckpointError, ValueError, FileNotFoundError) as e:
        print(f"specpilot {args.command}: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
