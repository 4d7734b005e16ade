"""`specpilot memory list|show|graph|port|seed` and `specpilot serve memory-api`.

The memory lives in a database (SQLite file by default, PostgreSQL in the distributed setup):
`--store URL` or SPECPILOT_MEMORY_URL.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path


def default_url() -> str:
    path = Path(os.environ.get("XDG_DATA_HOME", Path.home() / ".local" / "share")) / "specpilot" / "memory.db"
    path.parent.mkdir(parents=True, exist_ok=True)
    return os.environ.get("SPECPILOT_MEMORY_URL", f"sqlite:///{path}")


def register(subparsers) -> None:
    mem = subparsers.add_parser("memory", help="versioned mechanism entries, requirement graphs, porting")
    mem.add_argument("--store", default=None, metavar="URL", help="database URL (default: SPECPILOT_MEMORY_URL "
                     "or a SQLite file in the user's data folder)")
    cmds = mem.add_subparsers(dest="memory_command", metavar="COMMAND", required=True)
    ls = cmds.add_parser("list", help="the latest version of every entry")
    ls.add_argument("--mechanism", help="substring of the id or title")
    ls.add_argument("--contract", help="correctness rule, e.g. token_forcing")
    show = cmds.add_parser("show", help="one entry")
    show.add_argument("id")
    show.add_argument("--version", type=int)
    graph = cmds.add_parser("graph", help="an entry's resolved requirement graph")
    graph.add_argument("id")
    graph.add_argument("--svg", metavar="FILE", help="also draw it as SVG")
    port = cmds.add_parser("port", help="the starting system for a deployment: stock + the entries that carry")
    port.add_argument("--deployment", required=True, metavar="JSON|FILE",
                      help='e.g. {"family": "qwen3", "device": "h200", "batch": 1}')
    cmds.add_parser("seed", help="store the entries of the engine's built-in mechanisms")
    for p in (ls, show, graph, port, *cmds.choices.values()):
        if not any(a.dest == "json" for a in p._actions):
            p.add_argument("--json", action="store_true", help="print JSON")
            p.add_argument("--store", default=argparse.SUPPRESS, metavar="URL",
                           help="database URL, here or before the command")
    mem.set_defaults(func=run)

    serve = subparsers.add_parser("serve", help="run a service: the memory API, or the controller (REST API and "
                                  "dashboard; settings from SPECPILOT_* variables, see specpilot/settings.py)")
    serve.add_argument("service", choices=["memory-api", "controller"])
    serve.add_argument("--store", default=None, metavar="URL", help="memory-api: the memory's database (default: "
                       "SPECPILOT_MEMORY_URL or the user's SQLite file); controller: the round records' database "
                       "(default: SPECPILOT_DB_URL or SQLite under SPECPILOT_DATA)")
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=None, help="default 8710 (memory-api), 8700 (controller)")
    serve.add_argument("--repo", metavar="DIR", help="the engine's git repository (reproduce checks of code deltas)")
    serve.add_argument("--stock-rev", metavar="REV", help="the pinned stock revision in --repo")
    serve.add_argument("--json", action="store_true", help="errors as one JSON object (the service logs as usual)")
    serve.set_defaults(func=run_serve)


def _entry_row(e) -> str:
    ev = f"gain ×{e.evidence.gain:.3f}" if e.evidence else "no evidence yet"
    return f"{e.key:32s} {e.title[:48]:48s} {len(e.requires):2d} req  {len(e.variants):2d} variants  {ev}"


def run(args) -> int:
    from specpilot.services.memory_api import graph, porting
    from specpilot.services.memory_api.store import Store

    from specpilot.sqldb import check_url

    store = Store(check_url(args.store or default_url(), "--store" if args.store else "SPECPILOT_MEMORY_URL"))
    try:
        cmd = args.memory_command
        if cmd == "list":
            entries = store.list(mechanism=args.mechanism, contract=args.contract)
            if args.json:
                print(json.dumps([e.to_dict() for e in entries]))
            else:
                print("\n".join(_entry_row(e) for e in entries) or "the memory is empty: `specpilot memory seed` "
                      "stores the built-in mechanisms")
        elif cmd == "show":
            e = store.get(args.id, args.version)
            print(json.dumps(e.to_dict(), indent=None if args.json else 1))
        elif cmd == "graph":
            e = store.get(args.id)
            order = graph.resolve(list(e.requires), store.catalog()) + [e]
            if args.svg:
                Path(args.svg).write_text(graph.graph_svg(order))
            g = graph.graph_json(order)
            print(json.dumps(g) if args.json else "\n".join(
                f"{ed['from']} → {ed['to_key']} ({ed['constraint']})" for ed in g["edges"]) or f"{e.key}: no requirements")
        elif cmd == "port":
            text = args.deployment
            try:
                deployment = json.loads(Path(text).read_text() if Path(text).is_file() else text)
            except (OSError, json.JSONDecodeError):
                raise ValueError(f"--deployment {text!r}: neither a JSON object nor a readable JSON file; e.g. "
                                 '{"family": "qwen3", "device": "h200", "batch": 1}') from None
            out = porting.port(deployment, store.catalog()).to_dict()
            if args.json:
                print(json.dumps(out))
            else:
                print(f"starting system: stock + {', '.join(out['order']) or 'nothing'} (each a reuse, to be "
                      "re-tuned and re-measured by the next round)")
                for s in out["skipped"]:
                    print(f"  skipped {s['id']}: {s['reason']}")
        elif cmd == "seed":
            from specpilot.services.memory_api.seed import seed_entries
            from specpilot.services.memory_api.store import EntryExists

            added = []
            for e in seed_entries():
                try:
                    added.append(store.add(e).key)
                except EntryExists:
                    pass
            print(json.dumps({"added": added}) if args.json else f"stored {len(added)} seed entries")
        return 0
    finally:
        store.close()


def run_serve(args) -> int:
    from specpilot.sqldb import check_url

    if args.port is not None and not 0 < args.port < 65536:
        raise ValueError(f"--port {args.port}: expected 1..65535")
    if args.service == "controller":
        from specpilot.entrypoints.stack_cli import serve_controller

        args.port = args.port or 8700
        return serve_controller(args)
    import uvicorn

    from specpilot.services.memory_api.app import create_app

    uvicorn.run(create_app(check_url(args.store or default_url(), "--store" if args.store else "SPECPILOT_MEMORY_URL"),
                           args.repo, args.stock_rev), host=args.host,
                port=args.port or 8710)
    return 0
