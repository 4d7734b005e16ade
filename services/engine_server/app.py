"""The engine over HTTP — a thin FastAPI wiring of `protocol` (parsing, answers) and `Batcher`
(the decode thread):

- `GET /health` (200 while the engine serves), `GET /server_info` (also `/get_server_info`),
  `GET /v1/models`;
- `POST /generate`: SGLang's native API; `POST /v1/completions`: the OpenAI API.

Greedy only; the tokens are `Engine.generate`'s for the same request. Every error is one JSON
object {"error": {"message", "type", "param", "code"}} with its message on one line: a bad
request a 4xx naming the field, an engine failure a 500 for the requests it hit only.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from contextlib import asynccontextmanager
from pathlib import Path

from fastapi import FastAPI, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

from specpilot.zoo.workloads import Request as EngineRequest

from . import protocol
from .batcher import Batcher, EngineFailure, Unavailable


def version() -> str:
    from importlib.metadata import PackageNotFoundError, version as package_version

    try:
        return package_version("specpilot")
    except PackageNotFoundError:
        return "unknown"


def batch_refusal(engine, max_batch: int) -> str | None:
    """Why the engine cannot decode `max_batch` requests at once (None: it can). Asks
    `Engine.generate_batch` itself with no requests: it checks the drafter, the policy and the
    driver before it looks at the list."""
    if max_batch == 1:
        return None
    try:
        engine.generate_batch([], max_batch)
    except ValueError as e:
        return " ".join(str(e).split())
    return None


def limits_of(engine) -> protocol.Limits:
    cfg = engine.target.cfg
    encode = None
    if engine.tokenizer is not None:
        def encode(text: str) -> list[int]:
            return engine.encode(EngineRequest(id="prompt", prompt=text))
    return protocol.Limits(vocab_size=cfg.vocab_size, max_new_tokens=engine.cfg.max_new_tokens,
                           context=cfg.max_position_embeddings, eos=frozenset(cfg.eos_token_id), encode=encode)


def server_info(engine, max_batch: int, model: str) -> dict:
    c = engine.cfg
    return {"model": model, "target": c.target, "drafter": c.drafter if c.mode != "ar" else None, "mode": c.mode,
            "tree": c.tree if c.mode == "tree" else None, "draft_len": c.draft_len if c.mode != "ar" else None,
            "dtype": c.dtype, "device": c.device, "driver": engine.driver, "weights": c.weights,
            "lm_head": c.lm_head, "max_batch": max_batch, "max_new_tokens": c.max_new_tokens,
            "context_length": engine.target.cfg.max_position_embeddings,
            "vocab_size": engine.target.cfg.vocab_size, "tokenizer": engine.tokenizer is not None,
            "eos_token_ids": sorted(engine.target.cfg.eos_token_id), "sampling": "greedy", "version": version()}


def create_app(engine, max_batch: int = 1, model: str | None = None) -> FastAPI:
    """The HTTP app over a loaded `Engine`: one decode thread decodes up to `max_batch` waiting
    requests per engine call (a ValueError, with the engine's reason, when it cannot batch).
    `model`: the name /v1 answers with (default: the target folder's name). The app's
    `state.batcher` is the decode thread; it stops when the app shuts down."""
    if not isinstance(max_batch, int) or isinstance(max_batch, bool) or max_batch < 1:
        raise ValueError(f"max_batch {max_batch!r}: expected a positive integer")
    why = batch_refusal(engine, max_batch)
    if why:
        raise ValueError(why)
    model = model or Path(engine.cfg.target).name
    limits = limits_of(engine)
    info = server_info(engine, max_batch, model)
    batcher = Batcher(engine, max_batch)

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        yield
        await run_in_threadpool(batcher.close, 60.0)

    app = FastAPI(title="SpecPilot engine server", version=info["version"], lifespan=lifespan, docs_url=None,
                  redoc_url=None, description="Greedy, lossless decoding by the SpecPilot engine behind SGLang's "
                  "native /generate and OpenAI's /v1/completions.")
    app.state.batcher = batcher
    app.state.info = info

    def error(status: int, message: str, param: str | None = None, kind: str | None = None) -> JSONResponse:
        return JSONResponse(status_code=status, content=protocol.error_body(status, message, param, kind))

    @app.exception_handler(protocol.BadRequest)
    async def _bad(request: Request, exc: protocol.BadRequest):
        return error(exc.status, str(exc), exc.param)

    @app.exception_handler(EngineFailure)
    async def _failed(request: Request, exc: EngineFailure):
        return error(500, str(exc), kind="engine_error")

    @app.exception_handler(Unavailable)
    async def _unavailable(request: Request, exc: Unavailable):
        return error(503, str(exc), kind="unavailable")

    @app.exception_handler(HTTPException)
    async def _http(request: Request, exc: HTTPException):
        what = {404: f"no route {request.url.path}; this server answers GET /health, /server_info, /v1/models and "
                     "POST /generate, /v1/completions",
                405: f"{request.method} is not allowed on {request.url.path}"}.get(exc.status_code, str(exc.detail))
        return error(exc.status_code, what)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError):
        parts = [f"{'.'.join(str(p) for p in x.get('loc', ()))}: {x.get('msg', '')}" for x in exc.errors()]
        return error(422, "; ".join(parts) or "invalid request")

    @app.exception_handler(Exception)
    async def _crash(request: Request, exc: Exception):
        return error(500, f"{type(exc).__name__}: {exc}")

    async def decode(jobs: tuple[protocol.Job, ...]) -> list:
        futures = [batcher.submit(EngineRequest(id=j.rid, prompt_ids=j.prompt_ids, max_new_tokens=j.max_new_tokens))
                   for j in jobs]
        served = await asyncio.gather(*(asyncio.wrap_future(f) for f in futures), return_exceptions=True)
        failed = next((s for s in served if isinstance(s, BaseException)), None)
        if failed is not None:  # the first failure answers for the request; the others are retrieved
            raise failed
        return served

    @app.get("/health", tags=["service"], summary="200 while the engine is loaded and its decode thread runs")
    def health():
        if not batcher.alive():
            return error(503, "the engine's decode thread is not running", kind="unavailable")
        return {"status": "ok"}

    @app.get("/server_info", tags=["service"], summary="What is served: target, drafter, mode, dtype, device, ...")
    @app.get("/get_server_info", include_in_schema=False)
    def get_server_info() -> dict:
        return info | {"engine_calls": batcher.stats(), "waiting": batcher.waiting()}

    @app.get("/v1/models", tags=["openai"], summary="The one model served")
    def models() -> dict:
        return {"object": "list", "data": [{"id": model, "object": "model", "created": 0, "owned_by": "specpilot"}]}

    @app.post("/generate", tags=["sglang"], summary="SGLang's native generate: text or input_ids, sampling_params")
    async def generate(request: Request):
        t0 = time.perf_counter()
        body = protocol.read_body(await request.body())
        call = await run_in_threadpool(protocol.parse_generate, body, limits, lambda: secrets.token_hex(16))
        served = await decode(call.jobs)
        e2e = time.perf_counter() - t0
        answers = []
        for job, s in zip(call.jobs, served):
            fin = protocol.finish(job, s.result.tokens, limits.eos)
            answers.append(protocol.generate_answer(job, fin, engine.decode_text(fin.tokens), len(s.result.steps),
                                                    s.result.tau_mean, e2e, s.batch))
        return answers if call.listed else answers[0]

    @app.post("/v1/completions", tags=["openai"], summary="OpenAI completions: prompt as text, token ids, or a list")
    async def completions(request: Request):
        body = protocol.read_body(await request.body())
        cid = f"cmpl-{secrets.token_hex(12)}"
        call = await run_in_threadpool(protocol.parse_completion, body, limits, cid)
        served = await decode(call.jobs)
        fins = [protocol.finish(j, s.result.tokens, limits.eos) for j, s in zip(call.jobs, served)]
        return protocol.completion_answer(cid, int(time.time()), model, call.jobs, fins,
                                          [engine.decode_text(f.tokens) for f in fins])

    return app
