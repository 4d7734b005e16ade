"""The `specpilot` command line. Every command takes --json for scripting; errors say what to do."""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from pathlib import Path

from specpilot.progress import progress_bar

MODES = ("ar", "chain", "tree", "tlv")  # engine.engine.MODES, without loading torch for the parser


MAX_DRAFT_LEN = 63  # a verify pass holds at most 64 rows, the root included (engine/decode.py MAX_TREE)


class UsageError(Exception):
    """A command line argparse refuses; `main` reports it (as JSON under --json)."""

    def __init__(self, parser: argparse.ArgumentParser, message: str):
        super().__init__(message)
        self.parser = parser


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Descriptions as written, and every option's default value shown in -h."""

    def _get_help_string(self, action):
        text = action.help or ""
        if action.default not in (None, False, argparse.SUPPRESS) and "default" not in text and action.option_strings:
            text += " (default: %(default)s)"
        return text


class Parser(argparse.ArgumentParser):
    """argparse with defaults in -h, and usage errors raised for `main` to report (as JSON under --json)."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("formatter_class", HelpFormatter)
        super().__init__(*args, **kwargs)

    def error(self, message):
        raise UsageError(self, message)


def one_line(message) -> str:
    """An error message on one line: whitespace runs (newlines included) become one space."""
    return " ".join(str(message).split())


def read_json_file(path, what: str):
    """A JSON file's value; a ValueError naming the file and what it should hold otherwise."""
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ValueError(f"{path}: no such file ({what})") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"{path}: cannot be read as JSON ({e}); expected {what}") from None


def check_engine_flags(args) -> None:
    """Refuse flags that make no sense together, with the reason, before anything loads."""
    if args.mode != "tree":
        for flag, value in (("--tree", args.tree), ("--profile", args.profile)):
            if value is not None:
                raise ValueError(f"{flag} {value} applies only to --mode tree (got --mode {args.mode})")
    if args.mode == "tree":
        args.tree = args.tree or "best-first:32"
        if args.profile and not args.tree.startswith("sequoia:"):
            raise ValueError(f"--profile is read only by sequoia:N trees (got --tree {args.tree})")
    if args.mode != "tlv":
        for flag, value in (("--tlv-nodes", args.tlv_nodes), ("--tlv-q-depth", args.tlv_q_depth)):
            if value is not None:
                raise ValueError(f"{flag} {value} applies only to --mode tlv (got --mode {args.mode})")
    if args.mode == "ar" and getattr(args, "record", None):
        raise ValueError("--record saves speculative target passes; --mode ar has none (use --mode chain or tree)")
    if not 1 <= args.draft_len <= MAX_DRAFT_LEN:
        raise ValueError(f"--draft-len {args.draft_len}: expected 1..{MAX_DRAFT_LEN} (a verify pass holds at most "
                         f"{MAX_DRAFT_LEN + 1} rows, the root included)")
    if args.max_new_tokens < 1:
        raise ValueError(f"--max-new-tokens {args.max_new_tokens}: expected a positive integer")
    if not re.fullmatch(r"cpu|cuda(:\d+)?", args.device):
        raise ValueError(f"--device {args.device!r}: expected cpu, cuda or cuda:N")
    from specpilot.engine.checkpoint import check_system, read_config

    check_system(args.target, args.drafter if args.mode != "ar" else None, args.force_drafter)
    if args.mode != "ar" and args.drafter and not args.drafter.startswith("ngram"):
        d = read_config(args.drafter)
        block = d.get("block_size", 16)
        if d.get("drafter_kind") in ("block", "block_markov") and args.draft_len > block:
            raise ValueError(f"--draft-len {args.draft_len}: the {d['drafter_kind']} drafter {args.drafter} drafts at "
                             f"most block_size = {block} positions per pass; give --draft-len {block} or less")
    tree = args.tree if args.mode == "tree" else None
    if tree:
        from specpilot.engine.trees import parse_policy

        parse_policy(tree)


def engine_config(args, **given):
    """The EngineConfig of the engine flags (generate, serve engine), checked (check_engine_flags);
    `given` names values the command chose itself."""
    from specpilot.engine.engine import EngineConfig

    check_engine_flags(args)
    tlv = {k: v for k, v in (("tlv_nodes", args.tlv_nodes), ("tlv_q_depth", args.tlv_q_depth)) if v is not None}
    fields = dict(target=args.target, drafter=args.drafter, mode=args.mode, tree=args.tree or "best-first:32",
                  profile=args.profile, draft_len=args.draft_len, dtype=args.dtype, device=args.device,
                  max_new_tokens=args.max_new_tokens, weights=args.weights, lm_head=args.lm_head,
                  driver=args.driver, draft_lens=args.draft_lens, admit_steps=args.admit_steps, **tlv)
    return EngineConfig(**{**fields, **given})


def read_requests(path):
    """Requests from a workload file, or from `generate --out` / `--json` output (its prompt ids)."""
    from specpilot.zoo.workloads import Request, read_workload

    outputs = read_generated(path, strict=False)
    if outputs is not None:
        return [Request(id=o["id"], prompt_ids=list(o["prompt_ids"])) for o in outputs]
    return read_workload(path)


def read_generated(path, strict: bool = True) -> list[dict] | None:
    """`generate --json` output (one object with "outputs") or `generate --out` JSON lines, as a list of
    {"id", "prompt_ids", "tokens", ...}; None (strict=False) when the file is something else."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ValueError(f"{path}: no such file") from None
    except (OSError, UnicodeDecodeError) as e:
        raise ValueError(f"{path}: cannot be read ({e})") from None
    try:
        whole = json.loads(text)
        rows = whole["outputs"] if isinstance(whole, dict) and "outputs" in whole else None
    except json.JSONDecodeError:
        rows = None
    if rows is None:
        rows = []
        for n, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as e:
                if not strict:
                    return None
                raise ValueError(f"{path}:{n}: not JSON ({e.msg}); expected generate --out lines") from None
    need = {"id", "prompt_ids", "tokens"}
    bad = ([(1, rows)] if not isinstance(rows, list)
           else [(n, r) for n, r in enumerate(rows, 1) if not isinstance(r, dict) or not need <= r.keys()])
    if bad:
        if not strict:
            return None
        n, row = bad[0]
        what = f"missing {', '.join(sorted(need - row.keys()))}" if isinstance(row, dict) else "not an object"
        raise ValueError(f'{path}:{n}: {what}; expected generate --json output or JSON lines of {{"id", "prompt_ids", '
                         '"tokens"}, as `specpilot generate --out FILE` writes them')
    return rows


def tlv_args(p) -> None:
    p.add_argument("--tlv-nodes", type=int, metavar="N", help="tlv mode: nodes of the quick pass's tree and of each "
                   "exact pass, the root aside, 1..63 (default 32)")
    p.add_argument("--tlv-q-depth", type=int, metavar="D", help="tlv mode: depth of the quick pass's tree (default 8)")


def _engine_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--target", required=True, metavar="DIR", help="target checkpoint folder (Hugging Face format)")
    p.add_argument("--drafter", metavar="DIR|ngram", help="drafter checkpoint folder, or 'ngram' (prompt lookup)")
    p.add_argument("--mode", choices=MODES, default="chain",
                   help="ar: plain greedy; chain: stock speculative; tree: verify a draft tree (--tree); tlv: "
                   "two-level verification (a quick pass on W12's 8-bit view picks the path one exact pass verifies)")
    tlv_args(p)
    p.add_argument("--tree", default=None, metavar="POLICY",
                   help="tree mode only: best-first:N | topk:K:N | sequoia:N | shared:N:C (a batch shares N nodes a "
                   "request, at most C to one) | chain (default best-first:32)")
    p.add_argument("--profile", metavar="FILE", help="sequoia: acceptance profile from `specpilot replay --profile-out`")
    p.add_argument("--draft-len", type=int, default=8, metavar="N",
                   help=f"drafted positions per step, 1..{MAX_DRAFT_LEN} (default 8)")
    p.add_argument("--draft-lens", default=None, metavar="L,L,...",
                   help="per-request draft lengths, e.g. 16,12,8: each request drafts the shortest one its recent "
                   "acceptance and the drafter's confidence allow (static driver)")
    p.add_argument("--admit-steps", type=int, default=0, metavar="K",
                   help="batch > 1: a waiting prompt whose prefill fits K verify steps rides the busy lanes' steps "
                   "instead of a prefill pass (default 0: always a pass)")
    p.add_argument("--force-drafter", action="store_true",
                   help="use a drafter whose manifest names another target, or whose vocabulary differs")
    p.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N")
    p.add_argument("--dtype", choices=("float64", "float32", "bfloat16"), default="float32")
    p.add_argument("--max-new-tokens", type=int, default=64, metavar="N")
    p.add_argument("--weights", choices=("bf16", "w12"), default="bf16",
                   help="the target's layer weights: as stored (bf16) or W12, 12 bits a weight, bit-exact")
    p.add_argument("--lm-head", choices=("bf16", "w12", "certified"), default="bf16",
                   help="the target's LM head: dense, W12, or certified (INT8 with an error bound, exact argmax)")
    p.add_argument("--driver", choices=("auto", "static", "eager"), default="auto",
                   help="auto: the static (CUDA-graph) driver on CUDA where it runs the drafter, else eager")


def cmd_generate(args) -> int:
    from specpilot.engine.engine import Engine, EngineConfig
    from specpilot.zoo.workloads import Request

    if bool(args.workload) == bool(args.prompt):
        raise ValueError("give exactly one of --workload FILE.jsonl or --prompt TEXT")
    cfg = engine_config(args)
    requests = read_requests(args.workload) if args.workload else [Request(id="prompt", prompt=args.prompt)]
    engine = Engine(cfg)
    prompt_ids = [engine.encode(r) for r in requests]  # checks every request before any generation
    records = [] if args.record else None
    with progress_bar(len(requests), "generate", "req", disable=len(requests) < 2 or args.json) as bar:
        out = engine.run(requests, progress=bar.update, records=records, batch=args.batch)
    for o, ids in zip(out["outputs"], prompt_ids):
        o["prompt_ids"] = list(ids)
    if args.record:
        from specpilot.engine.replay import write_record

        write_record(args.record, records)
    if args.out:
        Path(args.out).write_text("".join(json.dumps(o) + "\n" for o in out["outputs"]), encoding="utf-8")
    if args.json:
        print(json.dumps(out))
        return 0
    for o in out["outputs"]:
        print(f"── {o['id']}  (τ {o['tau_mean']:.2f}, {o['steps']} steps)")
        print(o["text"] if o["text"] is not None else o["tokens"])
    steps = f"{out['steps']} target passes" if out["batch"] == 1 else \
        f"{out['steps']} request steps, at batch {out['batch']}"
    print(f"\nτ {out['tau_mean']:.2f} · {out['tokens_per_s']:.1f} tokens/s · {steps}")
    if args.out:
        print(f"outputs: {args.out} (for specpilot force --outputs / --baseline / --ar)")
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
    from specpilot.devices import device_list
    from specpilot.engine.checkpoint import check_system
    from specpilot.engine.engine import EngineConfig
    from specpilot.services.controller.pairing import judge, system, write_verdict
    from specpilot.entrypoints.bootstrap import local_workers
    from specpilot.systemspec import parse_system

    example = '{"target": "DIR", "drafter": "DIR", "mode": "chain"}'

    def config(path):
        cfg = read_json_file(path, f"a JSON object of EngineConfig fields, e.g. {example}, or generate --json output")
        if isinstance(cfg, dict) and isinstance(cfg.get("config"), dict) and "outputs" in cfg:
            cfg = cfg["config"]  # `generate --json` output names the system it ran
        if isinstance(cfg, dict) and "server" in cfg:  # a server system: checked as such, its target's vocabulary
            spec = parse_system(cfg, str(path))
            if spec.target:
                vocab[spec.target] = check_system(spec.target, None).vocab_size
            return cfg
        try:
            if not isinstance(cfg, dict):
                raise TypeError("not a JSON object")
            EngineConfig(**cfg).validate()
        except (TypeError, ValueError) as e:
            raise ValueError(f"{path}: not a system config ({one_line(e)}); write a JSON object of EngineConfig "
                             f"fields, e.g. {example}") from None
        try:
            vocab[cfg["target"]] = check_system(cfg["target"], cfg.get("drafter") if cfg.get("mode", "chain") != "ar"
                                                else None, args.force_drafter).vocab_size
        except ValueError as e:
            raise ValueError(f"{path}: {e}") from None
        return cfg

    vocab: dict[str, int] = {}

    if args.repeats < 2:
        raise ValueError(f"--repeats {args.repeats}: expected 2 or more (the bound is a t-interval over repeats)")
    if not args.timeout > 0:
        raise ValueError(f"--timeout {args.timeout}: expected a positive number of seconds")
    if args.batch < 1:
        raise ValueError(f"--batch {args.batch}: expected 1 or more requests decoded at once")
    if args.max_new_tokens < 1:
        raise ValueError(f"--max-new-tokens {args.max_new_tokens}: expected a positive integer")
    cand, inc = config(args.candidate), config(args.incumbent)
    if not args.stock and "server" in inc:
        raise ValueError(f"{args.incumbent} is a server system: give --stock (what token forcing compares against)")
    stock = config(args.stock) if args.stock else {**inc, "mode": "chain"}
    reqs = [{k: v for k, v in {"id": r.id, "prompt": r.prompt, "prompt_ids": list(r.prompt_ids) if r.prompt_ids
             else None, "max_new_tokens": r.max_new_tokens or args.max_new_tokens}.items() if v is not None}
            for r in read_requests(args.workload)]
    for r in reqs:
        for target, size in vocab.items():
            bad = [t for t in r.get("prompt_ids", []) if t >= size]
            if bad:
                raise ValueError(f"{args.workload}: request {r['id']!r} has prompt id {bad[0]}, outside the vocabulary "
                                 f"of {target} (size {size})")
            if "prompt" in r and not (Path(target) / "tokenizer.json").is_file():
                raise ValueError(f"{args.workload}: request {r['id']!r} is text, but {target} has no tokenizer.json; "
                                 "give prompt_ids")
    devices = device_list(args.devices)
    steps = 2 * args.repeats * (2 if len(devices) == 1 else 1)
    with progress_bar(2 * steps, "paired runs", "step", disable=args.json) as bar:
        record = judge(system(cand), system(inc), system(stock), reqs, devices, args.repeats, timeout=args.timeout,
                       progress=bar.update, workers=local_workers(), batch=args.batch)
    path = write_verdict(record, args.verdicts)
    out = {k: record[k] for k in ("gain", "lower_bound", "stock_noise", "threshold", "accepted", "reasons",
                                  "outputs_differ", "batch")} | {"verdict": str(path)}
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
    from specpilot.entrypoints.selftest import run_selftest

    if args.trials < 1 or args.real_runs < 0 or args.repeats < 2:
        raise ValueError(f"--trials {args.trials} / --real-runs {args.real_runs} / --repeats {args.repeats}: expected "
                         "--trials 1 or more, --real-runs 0 or more and --repeats 2 or more (a verdict's bound needs 2)")
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
    from specpilot.entrypoints.memory_cli import default_url
    from specpilot.entrypoints.round_cli import run_demo
    from specpilot.sqldb import check_url

    if args.rounds < 1:
        raise ValueError(f"--rounds {args.rounds}: expected 1 or more")
    store = check_url(args.store or default_url(), "--store" if args.store else "SPECPILOT_MEMORY_URL")
    if args.repeats is not None and args.repeats < 2:
        raise ValueError(f"--repeats {args.repeats}: expected 2 or more (the bound is a t-interval over repeats)")
    overrides = {"prompts": 1, "max_new_tokens": 16, "repeats": 2, "budgets": ["chain", "best-first:16"],
                 "max_candidates": 1} if args.quick else {}
    if args.repeats is not None:
        overrides["repeats"] = args.repeats
    out = run_demo(args.rounds, Path(args.run_dir) if args.run_dir else None, args.json, overrides or None,
                   store=store)
    if args.json:
        print(json.dumps(out))
        return 0
    print()
    print(demo_headline(out, store, args.store is not None))
    return 0


def demo_headline(out: dict, store: str, custom_store: bool) -> str:
    """What a user wants first after the demo: the final system against stock and against AR, each
    with its 95 % lower bound, and where to look next."""
    final = out.get("final") or {}

    def fig(key):
        f = final.get(key) or {}
        return (f"×{f['gain']:.3f} (95 % lower bound ×{f['lower_bound']:.3f})"
                if f.get("gain") is not None and f.get("lower_bound") is not None else "not measured")

    report = Path(out["report"])
    run_dir = report.parent.parent if report.name == "index.html" else report.parent
    accepted = [a["entry"] for r in out["rounds"] for a in r["accepted"]]
    mem = "specpilot memory" + (f" --store {store}" if custom_store else "") + " list"
    return "\n".join([
        f"final system: {final.get('label', '?')} — {len(out['rounds'])} rounds in {out['seconds']:.0f} s, "
        "timed by the controller in paired, swapped runs",
        f"  speed-up over the stock chain: {fig('speedup_over_stock')}",
        f"  speed-up over plain AR:        {fig('speedup_over_ar')}",
        f"  accepted: {', '.join(accepted) if accepted else 'nothing (the stock chain stays)'}",
        "next:",
        f"  report    {report}",
        f"  verdicts  {run_dir / 'verdicts'}/",
        f"  memory    {mem}" + (f"   (this run's entries: {', '.join(accepted)})" if accepted else ""),
    ])


def build_parser() -> argparse.ArgumentParser:
    from specpilot.entrypoints import costmodel_cli, engine_server_cli, force_cli, memory_cli, round_cli, stack_cli, w12_cli
    from specpilot.zoo import cli as zoo_cli

    parser = Parser(prog="specpilot", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    g = sub.add_parser("generate", help="greedy generation, AR or speculative, on a prompt or workload")
    _engine_args(g)
    g.add_argument("--workload", metavar="FILE.jsonl", help='requests, one {"id", "prompt"|"prompt_ids"} per line '
                   "(or another generate's --out file)")
    g.add_argument("--prompt", metavar="TEXT", help="a single text prompt")
    g.add_argument("--batch", type=int, default=1, metavar="N",
                   help="decode N requests at once (continuous batching on the static driver; default 1)")
    g.add_argument("--record", metavar="FILE", help="save every target pass (lattice, tree, argmax) for replay")
    g.add_argument("--out", metavar="FILE", help='write the outputs as JSON lines {"id", "prompt_ids", "tokens", ...} '
                   "(what force and pair read)")
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
    pr.add_argument("--candidate", required=True, metavar="CONFIG",
                    help="JSON file of EngineConfig fields, generate --json output (its config), or a server system "
                         '{"server": {"launch": [...], "url": ..., "api": "sglang"|"openai", "target": DIR}}')
    pr.add_argument("--incumbent", required=True, metavar="CONFIG",
                    help="as --candidate")
    pr.add_argument("--stock", metavar="CONFIG", help="stock system for the noise run (default: the incumbent's "
                    "target and drafter, chain mode)")
    pr.add_argument("--workload", required=True, metavar="FILE.jsonl",
                    help="requests (a workload file, or generate --out / --json output: its prompt ids)")
    pr.add_argument("--force-drafter", action="store_true",
                    help="use a drafter whose manifest names another target, or whose vocabulary differs")
    pr.add_argument("--devices", default="cpu,cpu", help="cpu,cpu (one core each) | cuda:0,cuda:1 | one device: ABBA")
    pr.add_argument("--repeats", type=int, default=14, metavar="N", help="swapped pairs per comparison (default 14)")
    pr.add_argument("--batch", type=int, default=1, metavar="N",
                    help="requests decoded at once in every timed run (continuous batching; default 1)")
    pr.add_argument("--max-new-tokens", type=int, default=64, metavar="N",
                    help="token limit of each request that sets none, the same for every system (default 64)")
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
    d.add_argument("--store", metavar="URL", help="the memory's database (default: the one `specpilot memory` "
                   "reads: SPECPILOT_MEMORY_URL or a SQLite file in the user's data folder)")
    d.add_argument("--quick", action="store_true", help="a smoke run: 1 prompt, 16 tokens, 2 repeats, 1 candidate "
                   "per round (its verdicts are weak: too few repeats)")
    d.add_argument("--repeats", type=int, metavar="N", help="swapped repeats of every paired verdict (default: the "
                   "embedded deployment's 14; fewer are faster and weaker)")
    d.add_argument("--json", action="store_true", help="print one JSON object")
    d.set_defaults(func=cmd_demo)

    zoo_cli.register(sub)
    force_cli.register(sub)
    memory_cli.register(sub)
    engine_server_cli.register(sub)  # adds `serve engine` to memory_cli's `serve`
    costmodel_cli.register(sub)
    round_cli.register(sub)
    stack_cli.register(sub)
    w12_cli.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run a command; bad input is one line on stderr (under --json one {"error": ...} object on stdout)
    and exit status 2, never a traceback."""
    argv = sys.argv[1:] if argv is None else list(argv)
    json_out = "--json" in argv
    try:
        args = build_parser().parse_args(argv)
    except UsageError as e:
        if json_out:
            print(json.dumps({"error": f"{e.parser.prog}: {one_line(e)}"}))
        else:
            e.parser.print_usage(sys.stderr)
            print(f"{e.parser.prog}: error: {one_line(e)}", file=sys.stderr)
        return 2
    try:
        return args.func(args)
    except BrokenPipeError:  # the reader went away (`| head`): stop quietly
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except (ValueError, RuntimeError, LookupError, OSError, TimeoutError) as e:  # CheckpointError is a ValueError
        if isinstance(e, KeyError) and e.args:
            msg = e.args[0]
        elif isinstance(e, OSError) and e.filename and e.strerror:
            msg = f"{e.filename}: {e.strerror}"
        else:
            msg = e
        msg = one_line(msg) or type(e).__name__
        if json_out:
            print(json.dumps({"error": msg, "command": args.command}))
        else:
            print(f"specpilot {args.command}: error: {msg}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(json.dumps({"error": "interrupted"}) if json_out else "interrupted", file=sys.stdout if json_out
              else sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
