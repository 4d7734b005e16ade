"""`specpilot round`: rounds of profile → cost model → direction → agents → controller → memory.

  specpilot round --deployment FILE [--rounds K] [--agent search|command:CMD ...] [--run-dir DIR]
                  [--store URL] [--repo DIR] [--json]

A deployment file is a JSON object: "name", "target" (a checkpoint folder, relative to the file),
optional "drafter" (a checkpoint folder or "ngram"; absent or null: the deployment serves plain AR
decoding, and stock is AR), optional "drafters" ({kind: folder}, e.g. a block_markov drafter the
memory may switch to), "devices" ("cpu,cpu" | "cuda:0,cuda:1" | one device), "gpu" (the device
table's kind: cpu, h100-sxm, h200, rtx-pro-6000), "workload" (humaneval | stdlib | FILE.jsonl), "prompts",
"max_new_tokens", "draft_len", "repeats" (swapped pairs per comparison), "warmup" (untimed runs per
worker first; GPUs want several), "budgets", "max_candidates", "timeout".
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from specpilot.services.controller.round import summary_json as demo_json

EMBEDDED_RUN = "run"  # the one round record of an embedded run folder (its rounds.db)


def _deployment_defaults() -> str:
    from specpilot.services.controller.round import DEPLOYMENT_DEFAULTS, REQUIRED

    fields = ", ".join(f"{k}={json.dumps(v)}" for k, v in DEPLOYMENT_DEFAULTS.items())
    return f"\nrequired fields: {', '.join(REQUIRED)}\ndefaults of the other fields: {fields}\n"


def register(subparsers) -> None:
    p = subparsers.add_parser("round", help="run rounds for a deployment: profile, cost model, agents, verdicts, memory",
                              description=__doc__ + _deployment_defaults())
    p.add_argument("--deployment", required=True, metavar="FILE", help="deployment JSON (fields above)")
    p.add_argument("--rounds", type=int, default=1, metavar="K", help="rounds in a row")
    p.add_argument("--agent", action="append", metavar="AGENT",
                   help="search (built in; the default when none is given) | command:CMD (an external program in a "
                        "scratch worktree); repeatable")
    p.add_argument("--run-dir", metavar="DIR", help="state, verdicts, memory and report (default: runs/<name>); "
                   "an existing one is resumed")
    p.add_argument("--store", metavar="URL", help="memory database (default: SQLite in the run folder)")
    p.add_argument("--repo", metavar="DIR", help="the engine's git repository (default: this checkout, if any)")
    p.add_argument("--force-drafter", action="store_true",
                   help="use drafters whose manifest names another target, or whose vocabulary differs")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=run)


def check_deployment(dep: dict, force_drafter: bool = False) -> None:
    """What the controller's `load_deployment` cannot check without the engine and the zoo: every
    checkpoint loads and its drafters fit the target, the workload exists and parses, the device
    kind and the tree budgets are known — before any worker starts."""
    from specpilot.engine.checkpoint import check_system, drafter_kind
    from specpilot.engine.drafters import FEATURE_KINDS
    from specpilot.engine.trees import parse_policy
    from specpilot.services.controller.round import requests_of
    from specpilot.services.planner.costmodel import DEVICES

    own = [("drafter", dep["drafter"])] if dep["drafter"] else [("target", None)]  # no drafter: the target alone
    for key, drafter in [*own, *((f"drafters.{k}", v) for k, v in dep["drafters"].items())]:
        try:
            vocab = check_system(dep["target"], drafter, force_drafter).vocab_size
        except ValueError as e:
            raise ValueError(f"deployment: {key}: {e}") from None
    kinds = (*FEATURE_KINDS, "draft_lm")
    for kind, folder in dep["drafters"].items():
        actual = drafter_kind(folder)
        if kind not in kinds:
            raise ValueError(f"deployment: drafters.{kind}: unknown drafter kind; expected one of {', '.join(kinds)}")
        if actual != kind:
            raise ValueError(f"deployment: drafters.{kind}: {folder} is a {actual} drafter (its config.json), not "
                             f"{kind}; name it under \"{actual}\"")
    if dep["gpu"] not in (*DEVICES, "cpu"):
        raise ValueError(f"deployment: field 'gpu' = {dep['gpu']!r}: expected one of {', '.join((*DEVICES, 'cpu'))}")
    budgets = dep["budgets"]
    if not isinstance(budgets, list) or not budgets or not all(isinstance(b, str) for b in budgets):
        raise ValueError(f"deployment: field 'budgets' = {budgets!r}: expected a list of tree policies, e.g. "
                         '["chain", "best-first:32"]')
    for b in budgets:
        try:
            parse_policy(b)
        except ValueError as e:
            raise ValueError(f"deployment: field 'budgets': {e}") from None
    timeout = dep["timeout"]
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout > 0:
        raise ValueError(f"deployment: field 'timeout' = {timeout!r}: expected a positive number of seconds")
    w = dep["workload"]
    if not isinstance(w, str) or not w:
        raise ValueError(f"deployment: field 'workload' = {w!r}: expected humaneval, stdlib or a FILE.jsonl")
    if w not in ("humaneval", "stdlib") and not Path(w).is_file():
        raise ValueError(f"deployment: field 'workload' = {w!r}: no such file; expected humaneval, stdlib or a "
                         "workload FILE.jsonl (relative to the deployment file)")
    try:
        requests = requests_of(dep)
    except ValueError as e:
        raise ValueError(f"deployment: field 'workload': {e}") from None
    for r in requests:
        bad = [t for t in r.get("prompt_ids") or [] if t >= vocab]
        if bad:
            raise ValueError(f"deployment: workload {w}: request {r['id']!r} has prompt id {bad[0]}, outside the "
                             f"target's vocabulary (size {vocab})")
        if r.get("prompt") is not None and not (Path(dep["target"]) / "tokenizer.json").is_file():
            raise ValueError(f"deployment: workload {w}: request {r['id']!r} is text, but the target {dep['target']} "
                             "has no tokenizer.json; give prompt_ids, or a target with its tokenizer")


def run_rounds(dep_source, rounds: int, agents=None, run_dir=None, store=None, repo=None, json_out=False,
               log=print, force_drafter: bool = False) -> dict:
    from specpilot.entrypoints import bootstrap
    from specpilot.services.controller.records import RecordState, Records
    from specpilot.services.controller.round import load_deployment, run_deployment
    from specpilot.services.planner.local import check_agents

    from specpilot.sqldb import check_url

    dep = load_deployment(dep_source)
    if rounds < 1:
        raise ValueError(f"--rounds {rounds}: expected 1 or more")
    agents = check_agents(agents)
    check_deployment(dep, force_drafter)
    if store:
        check_url(store)
    repo = Path(repo) if repo else bootstrap.find_repo()
    if repo is None and any(a.startswith("command:") for a in agents):
        raise ValueError("--agent command:CMD needs the engine's git repository (--repo DIR)")
    run_dir = Path(run_dir) if run_dir else Path("runs") / dep["name"]
    run_dir.mkdir(parents=True, exist_ok=True)
    ports = bootstrap.embedded(store or f"sqlite:///{run_dir / 'memory.db'}", repo)
    records = Records(f"sqlite:///{run_dir / 'rounds.db'}")
    try:
        if records.find(EMBEDDED_RUN) is None:
            records.create(dep, rounds, agents, str(run_dir), EMBEDDED_RUN)
        records.set_state(EMBEDDED_RUN, "running")
        out = run_deployment(dep, run_dir, ports, RecordState(records, EMBEDDED_RUN), rounds, agents=agents, repo=repo,
                             log=None if json_out else log, progress=not json_out,
                             emit=lambda kind, data: records.event(EMBEDDED_RUN, kind, data))
        records.set_state(EMBEDDED_RUN, "done")
        return out
    finally:
        ports.memory.close()
        records.close()


def run(args) -> int:
    from specpilot.services.planner.report import render_dispatch, render_terminal

    summary = run_rounds(args.deployment, args.rounds, args.agent, args.run_dir, args.store, args.repo, args.json,
                         force_drafter=args.force_drafter)
    if args.json:
        print(json.dumps(demo_json(summary)))
        return 0
    for s in summary.get("lanes") or [summary]:
        if "lanes" in summary:
            print(f"batch {s['batch']}:")
        print(render_terminal(s))
        print(f"report: {s['report']}")
    if "dispatch" in summary:
        print(render_dispatch(summary["dispatch"]))
    return 0


def demo_deployment(run_dir: Path) -> Path:
    """The embedded default (`controller.round.demo_deployment`) written to `run_dir`."""
    from specpilot.services.controller.round import demo_deployment as fields

    run_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir / "deployment.json"
    path.write_text(json.dumps(fields(), indent=1))
    return path


def run_demo(rounds: int = 2, run_dir: Path | None = None, json_out: bool = False, overrides: dict | None = None,
             log=print, store: str | None = None) -> dict:
    run_dir = run_dir or Path("runs") / time.strftime("demo-%Y%m%d-%H%M%S")
    path = demo_deployment(run_dir)
    if overrides:
        path.write_text(json.dumps({**json.loads(path.read_text()), **overrides}, indent=1))
    t0 = time.time()
    summary = run_rounds(path, rounds, ["search"], run_dir, store, json_out=json_out, log=log)
    out = demo_json(summary)
    out["seconds"] = time.time() - t0
    return out
