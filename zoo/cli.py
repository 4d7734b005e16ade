"""`zoo` command group:
  zoo workload {humaneval,stdlib} --out FILE [--limit N] [--json]
  zoo build --preset micro|small [--out DIR] [--device cpu|cuda] [--json]
  zoo list [--dir DIR ...] [--json]
  zoo corpus [--out FILE] [--wheels DIR] [--lock] [--json]

`register(subparsers)` adds the group to the main CLI's argparse subparsers; the parsed
args carry `func=run`, and `run(args)` returns the exit status.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

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

    b = commands.add_parser("build", help="train a preset's targets and drafters (micro: CPU; small: one GPU)")
    b.add_argument("--preset", required=True, choices=("micro", "small", "nano"))
    b.add_argument("--out", metavar="DIR", help="output folder (default: the shipped checkpoints/PRESET)")
    b.add_argument("--device", default="cpu", help="cpu or cuda")
    b.add_argument("--roles", default="dense,hybrid", help="targets to build with their drafters: dense, hybrid or both")
    b.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE",
                   help="change one recipe field for this build (repeatable; recorded in the manifest), "
                        "e.g. --set triton_gdn=true")
    b.add_argument("--json", action="store_true", help="print the manifest as JSON")
    b.set_defaults(func=run_build)

    c = commands.add_parser("corpus", help="prepare the code corpus (stdlib + pinned packages) as one .xz file")
    c.add_argument("--out", metavar="FILE", help="corpus file to write (default: zoo/data/code-corpus.jsonl.xz)")
    c.add_argument("--wheels", metavar="DIR", help="where the pinned wheels are downloaded (default: zoo/data/wheels)")
    c.add_argument("--lock", action="store_true", help="record the result as the new corpus.lock.json instead of "
                   "checking against it")
    c.add_argument("--json", action="store_true", help="print the corpus header as JSON")
    c.set_defaults(func=run_corpus)

    ls = commands.add_parser("list", help="the built models and their figures")
    ls.add_argument("--dir", action="append", metavar="DIR", help="folders to search for zoo.json (repeatable)")
    ls.add_argument("--json", action="store_true", help="print a JSON list")
    ls.set_defaults(func=run_list)
    return zoo


def run_build(args: argparse.Namespace) -> int:
    from . import build

    out = Path(args.out) if args.out else build.SHIPPED / args.preset
    roles = tuple(r.strip() for r in args.roles.split(",") if r.strip())
    if not roles or set(roles) - {"dense", "hybrid"}:
        raise ValueError(f"--roles {args.roles!r}: give dense, hybrid or dense,hybrid")
    command = " ".join(["specpilot", "zoo", "build", "--preset", args.preset, "--device", args.device, "--roles",
                        ",".join(roles)] + (["--out", str(args.out)] if args.out else [])
                       + [f"--set {a}" for a in args.set])
    recipe = build.with_overrides(build.PRESETS[args.preset], args.set)
    manifest = build.build(args.preset, out, args.device, log=(lambda *_: None) if args.json else print, roles=roles,
                           command=command, recipe=recipe)
    if args.json:
        print(json.dumps(manifest))
    return 0


def run_corpus(args: argparse.Namespace) -> int:
    from . import corpus

    out = Path(args.out) if args.out else corpus.CODE_CORPUS
    try:
        header = corpus.prepare_code_corpus(out, Path(args.wheels) if args.wheels else None,
                                            lock=None if args.lock else corpus.LOCK,
                                            log=(lambda *_: None) if args.json else print)
    except corpus.CorpusError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    if args.lock:
        corpus.write_lock(header)
    if args.json:
        print(json.dumps({k: v for k, v in header.items() if k != "packages"}))
    else:
        print(f"{header['train_files']} training / {header['heldout_files']} held-out files, "
              f"{header['train_bytes'] / 1e6:.1f} / {header['heldout_bytes'] / 1e6:.1f} MB; dropped {header['dropped']}")
    return 0


def _tau(t) -> str:
    if not t:
        return "-"
    v = t.get("humaneval") if "humaneval" in t else t.get("ngram", {}).get("humaneval")
    return f"{v:.2f}" if isinstance(v, float) else "-"


def run_list(args: argparse.Namespace) -> int:
    from . import build

    rows = build.list_models([Path(d) for d in args.dir] if args.dir else None)
    if args.json:
        print(json.dumps(rows))
        return 0
    if not rows:
        print("no built models found; build them with: specpilot zoo build --preset micro")
        return 0
    print(f"{'name':24s} {'role':8s} {'kind':13s} {'target':7s} {'params':>9s} {'loss':>6s} {'τ HE':>5s}  path")
    for r in rows:
        loss = f"{r['heldout_loss']:.3f}" if r["heldout_loss"] is not None else "-"
        print(f"{r['name']:24s} {r['role']:8s} {r['kind']:13s} {r['target'] or '-':7s} {r['params']:9d} "
              f"{loss:>6s} {_tau(r['tau']):>5s}  {r['path']}")
    print("τ HE: tokens per target pass, stock chain, HumanEval prompts (a target's row: the n-gram drafter's)")
    return 0


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
