"""`specpilot serve engine`: the engine behind SGLang's native `POST /generate` and OpenAI's
`POST /v1/completions` (services/engine_server/), greedy and lossless, concurrent requests
batched by one decode thread. It adds the service `engine` to the `serve` command that
memory_cli registers (memory-api, controller), with the engine's own flags."""

from __future__ import annotations

import json
import socket
import sys

from specpilot.entrypoints.cli import MODES, tlv_args

DEFAULT_PORT = 8720
DEFAULT_MAX_BATCH = 8  # where the engine batches (the static driver); else 1
DEFAULT_MAX_NEW = 1024
# the engine flags (dest, flag): given to another service they are refused
ENGINE_FLAGS = (("target", "--target"), ("drafter", "--drafter"), ("mode", "--mode"), ("tree", "--tree"),
                ("profile", "--profile"), ("draft_len", "--draft-len"), ("force_drafter", "--force-drafter"),
                ("dtype", "--dtype"), ("device", "--device"), ("max_new_tokens", "--max-new-tokens"),
                ("max_batch", "--max-batch"), ("weights", "--weights"), ("lm_head", "--lm-head"),
                ("driver", "--driver"), ("draft_lens", "--draft-lens"), ("admit_steps", "--admit-steps"),
                ("tlv_nodes", "--tlv-nodes"), ("tlv_q_depth", "--tlv-q-depth"))
OTHER_FLAGS = (("store", "--store"), ("repo", "--repo"), ("stock_rev", "--stock-rev"))


def register(subparsers) -> None:
    serve = subparsers.choices["serve"]
    service = next(a for a in serve._actions if a.dest == "service")
    service.choices = [*service.choices, "engine"]
    port = next(a for a in serve._actions if a.dest == "port")
    port.help = f"{port.help}, {DEFAULT_PORT} (engine; 0: any free port)"
    g = serve.add_argument_group("engine", "serve engine only: the engine behind POST /generate (SGLang-native) "
                                 "and POST /v1/completions (OpenAI-compatible), greedy decoding")
    g.add_argument("--target", metavar="DIR", help="target checkpoint folder (Hugging Face format)")
    g.add_argument("--drafter", metavar="DIR|ngram", help="drafter checkpoint folder, or 'ngram'")
    g.add_argument("--mode", choices=MODES, help="default: chain with --drafter, else ar")
    tlv_args(g)
    g.add_argument("--tree", metavar="POLICY", help="tree mode: best-first:N | topk:K:N | sequoia:N | shared:N:C "
                   "| chain (default best-first:32)")
    g.add_argument("--profile", metavar="FILE", help="sequoia: acceptance profile from `specpilot replay "
                   "--profile-out`")
    g.add_argument("--draft-len", type=int, metavar="N", help="drafted positions per step (default 8)")
    g.add_argument("--draft-lens", metavar="L,L,...", help="per-request draft lengths, e.g. 16,12,8 (static driver)")
    g.add_argument("--admit-steps", type=int, metavar="K", help="a waiting prompt whose prefill fits K verify steps "
                   "rides the busy lanes' steps (default 0: a prefill pass)")
    g.add_argument("--force-drafter", action="store_true",
                   help="use a drafter whose manifest names another target, or whose vocabulary differs")
    g.add_argument("--dtype", choices=("float64", "float32", "bfloat16"), help="default float32")
    g.add_argument("--device", help="cpu, cuda or cuda:N (default cpu)")
    g.add_argument("--max-new-tokens", type=int, metavar="N",
                   help=f"the most new tokens one request may ask for (default {DEFAULT_MAX_NEW})")
    g.add_argument("--max-batch", type=int, metavar="N", help="requests decoded in one engine call (continuous "
                   f"batching; default {DEFAULT_MAX_BATCH} where the engine batches (the static driver), else 1)")
    g.add_argument("--weights", choices=("bf16", "w12"), help="the target's layer weights (default bf16)")
    g.add_argument("--lm-head", choices=("bf16", "w12", "certified"), help="the target's LM head (default bf16)")
    g.add_argument("--driver", choices=("auto", "static", "eager"), help="default auto")
    others = serve.get_default("func")

    def run(args) -> int:
        if args.service == "engine":
            return serve_engine(args)
        given = [flag for dest, flag in ENGINE_FLAGS if getattr(args, dest, None) not in (None, False)]
        if given:
            raise ValueError(f"{given[0]} applies only to `specpilot serve engine` (got serve {args.service})")
        return others(args)

    serve.set_defaults(func=run)


def serve_engine(args) -> int:
    from specpilot.entrypoints.cli import engine_config
    from specpilot.engine.engine import Engine

    given = [flag for dest, flag in OTHER_FLAGS if getattr(args, dest, None) is not None]
    if given:
        raise ValueError(f"{given[0]} applies to serve memory-api / controller, not to serve engine")
    if not args.target:
        raise ValueError("serve engine needs --target DIR (a checkpoint folder)")
    args.mode = args.mode or ("chain" if args.drafter else "ar")
    args.draft_len = 8 if args.draft_len is None else args.draft_len
    args.admit_steps = args.admit_steps or 0
    args.dtype, args.device = args.dtype or "float32", args.device or "cpu"
    args.max_new_tokens = DEFAULT_MAX_NEW if args.max_new_tokens is None else args.max_new_tokens
    port = DEFAULT_PORT if args.port is None else args.port
    if not 0 <= port < 65536:
        raise ValueError(f"--port {port}: expected 0..65535 (0: any free port)")
    if args.max_batch is not None and args.max_batch < 1:
        raise ValueError(f"--max-batch {args.max_batch}: expected a positive integer")
    engine = Engine(engine_config(args, drafter=args.drafter if args.mode != "ar" else None,
                                  weights=args.weights or "bf16", lm_head=args.lm_head or "bf16",
                                  driver=args.driver or "auto"))

    import uvicorn

    from specpilot.services.engine_server.app import batch_refusal, create_app

    max_batch = args.max_batch
    if max_batch is None:
        max_batch = DEFAULT_MAX_BATCH if batch_refusal(engine, DEFAULT_MAX_BATCH) is None else 1
    why = batch_refusal(engine, max_batch)
    if why:
        raise ValueError(f"--max-batch {max_batch}: {why}")
    sock = socket.socket(socket.AF_INET6 if ":" in args.host else socket.AF_INET)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((args.host, port))
    except OSError as e:
        sock.close()
        raise ValueError(f"--host {args.host} --port {port}: cannot listen there ({e.strerror or e})") from None
    sock.listen(2048)
    app = create_app(engine, max_batch)
    bound = sock.getsockname()[1]
    url = f"http://{'[' + args.host + ']' if ':' in args.host else args.host}:{bound}"
    info = app.state.info
    if args.json:
        print(json.dumps({"url": url, **info}), flush=True)
    else:
        print(f"serving {info['target']} ({info['mode']}{', drafter ' + info['drafter'] if info['drafter'] else ''}, "
              f"{info['dtype']} on {info['device']}, max batch {max_batch}) at {url} — POST /generate, "
              "POST /v1/completions, GET /health, GET /server_info", flush=True)
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning" if args.json else "info",
                                           access_log=not args.json, lifespan="on"))
    server.run(sockets=[sock])
    sys.stdout.flush()
    return 0

