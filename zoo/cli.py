"""`zoo` command group: `zoo workload {humaneval,stdlib} --out FILE [--limit N] [--json]`.

`register(subparsers)` adds the group to the main CLI's argparse subparsers; the parsed
args carry `func=run`, and `run(args)` returns the exit status.
"""

from __future__ import annotations

import argparse
import json
import sys

from . import workloads

SOURCES = {"humaneval": workloads.humaneval, "stdlib": workloads.stdlib_completion}


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def register(subparsers) -> argparse.ArgumentParser:
    """Add the `zoo` command group to an argparse subparsers object."""
    zoo = subparsers.add_parser("zoo", help="real corpus, tokenizer and workload files")
    commands = zoo.add_subparsers(dest="zoo_command", metavar="COMMAND", required=True)
    wl = commands.add_parser("workload", help="write a workload file (JSONL)")
    wl.add_argument("source", choices=sorted(SOURCES), help="humaneval: 164 HumanEval prompts; "
                    "stdlib: held-out standard-library function prompts")
    wl.add_argument("--out", required=True, metavar="FILE", help="JSONL file to write")
    wl.add_argument("--limit", type=_positive_int, default=None, metavar="N",
                    help="keep only the first N requests")
    wl.add_argument("--json", action="store_true", help='print {"path": ..., "count": ...}')
    wl.set_defaults(func=run)
    return zoo


def run(args: argparse.Namespace) -> int:
    """Handle a parsed `zoo ...` command; return the exit status."""
    if getattr(args, "zoo_command", None) != "workload":
        print(f"unknown zoo command {getattr(args, 'zoo_command', None)!r}", file=sys.stderr)
        return 2
    requests = SOURCES[args.source](limit=args.limit)
    count = workloads.write_jsonl(args.out, requests)
    if args.json:
        print(json.dumps({"path": str(args.out), "count": count}))
    else:
        print(f"wrote {count} {args.source} requests to {args.out}")
    return 0


def main(argv: list[str] | None = None) -> int:
    """Stand-alone entry: `python -m specpilot.zoo.cli zoo workload ...`."""
    parser = argparse.ArgumentParser(prog="specpilot")
    register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    raise SystemExit(main())
