"""The controller over HTTP: the REST API, the dashboard, the live view (server-sent events) and
/metrics — a thin FastAPI wiring of the round records, the queue, the GPU workers' health and the
memory.

Mutating routes need `Authorization: Bearer <token>` (401 without). Every bad request is a 4xx
with a JSON body {"error", "detail"} naming what is wrong; no route answers 5xx on bad input.
The OpenAPI schema is at /openapi.json and rendered at /docs without anything from a CDN.
"""

from __future__ import annotations

import asyncio
import json
import re
import secrets
import time
from pathlib import Path
from typing import Any

from fastapi import Depends, FastAPI, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse, HTMLResponse, JSONResponse, Response, StreamingResponse
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from pydantic import BaseModel, ConfigDict, Field

from . import dashboard
from .metrics import ControllerCollector
from .records import FINAL, Records
from .round import DEPLOYMENT_DEFAULTS, demo_deployment, load_deployment, summary_json

KIND = re.compile(r"[a-z0-9][a-z0-9-]{0,31}")
REPORT_FILE = re.compile(r"(index|round-[0-9]{1,4})\.html")
ERRORS = {401: {"description": "Missing or wrong bearer token"},
          404: {"description": "Unknown round or entry"},
          422: {"description": "Malformed request or deployment; `detail` names the field"}}


class RoundRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    deployment: dict[str, Any] = Field(..., description="a deployment, as `specpilot round --deployment` reads it; "
                                       "checkpoint paths absolute or relative to the controller's working folder")
    rounds: int = Field(1, ge=1, le=20, description="rounds in a row")


def _error(status: int, kind: str, detail: str, **headers) -> JSONResponse:
    return JSONResponse(status_code=status, content={"error": kind, "detail": detail}, headers=headers or None)


def round_view(rec: dict) -> dict:
    doc = rec.get("doc") or {}

    def view(d: dict) -> dict:
        return summary_json({"rounds": d.get("rounds", []), "final": d.get("final"), "report": d.get("report")})

    out = {"id": rec["id"], "state": rec["state"], "error": rec.get("error"), "deployment": rec["deployment"],
           "rounds_requested": rec["rounds"], "created_at": rec["created_at"], "updated_at": rec["updated_at"]}
    if "lanes" in doc:  # judged per batch size: each size's rounds, and the dispatch table once made
        return out | {"lanes": [{"batch": int(b), **view(d)} for b, d in sorted(doc["lanes"].items(),
                                                                                 key=lambda x: int(x[0]))],
                      "dispatch": doc.get("dispatch")}
    s = view(doc)
    return out | {k: s[k] for k in ("rounds", "speedup_over_stock", "speedup_over_ar", "final", "report")}


def create_app(records: Records, queue, workers, memory, data_dir: Path, token: str, sse_poll: float = 0.5) -> FastAPI:
    """`queue`: submit(id, kind) and depth(kinds); `workers`: the GPU workers' health(); `memory`:
    the memory's entries(), get(), graph_svg()."""
    app = FastAPI(title="SpecPilot controller", version="1", docs_url=None, redoc_url=None,
                  description="Queue rounds, watch them, read their verdicts; the GPU workers' health; metrics.")
    bearer = HTTPBearer(auto_error=False, description="SPECPILOT_TOKEN")
    registry = CollectorRegistry()
    registry.register(ControllerCollector(records, workers.health, queue.depth))

    def require_token(cred: HTTPAuthorizationCredentials | None = Depends(bearer)) -> None:
        if cred is None or not secrets.compare_digest(cred.credentials.encode(), token.encode()):
            raise Unauthorized()

    class Unauthorized(Exception):
        pass

    @app.exception_handler(Unauthorized)
    async def _unauthorized(request: Request, exc: Unauthorized):
        return _error(401, "unauthorized", "send Authorization: Bearer <token> (printed by `specpilot stack up`, "
                      "or SPECPILOT_TOKEN)", **{"WWW-Authenticate": "Bearer"})

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError):
        parts = [f"{'.'.join(str(p) for p in x.get('loc', ()))}: {x.get('msg', '')}" for x in exc.errors()]
        return _error(422, "invalid_request", "; ".join(parts) or "invalid request")

    def found(ident: str) -> dict:
        rec = records.find(ident)
        if rec is None:
            raise LookupError(f"unknown round {ident!r}")
        return rec

    @app.exception_handler(LookupError)
    async def _unknown(request: Request, exc: LookupError):
        return _error(404, "not_found", str(exc.args[0] if exc.args else exc))

    # ------------------------------------------------------------------ the REST API
    @app.get("/healthz", tags=["service"], summary="Liveness and the database")
    def healthz() -> dict:
        records.counts()
        return {"ok": True}

    @app.post("/api/rounds", status_code=201, tags=["rounds"], summary="Queue rounds for a deployment",
              dependencies=[Depends(require_token)], responses={401: ERRORS[401], 422: ERRORS[422]},
              description="Validates the deployment as the CLI does and queues it on `rounds.<gpu>`. "
              f"Fields and defaults: {', '.join(f'{k}={v!r}' for k, v in DEPLOYMENT_DEFAULTS.items())}.")
    def post_round(body: RoundRequest) -> dict:
        try:
            dep = load_deployment(body.deployment)
        except (ValueError, OSError) as e:
            return _error(422, "invalid_deployment", str(e))
        if not isinstance(dep.get("gpu"), str) or not KIND.fullmatch(dep["gpu"]):
            return _error(422, "invalid_deployment", "deployment: 'gpu' is a device kind such as cpu, h100-sxm, "
                          "h200, rtx-pro-6000 (lower case letters, digits, '-')")
        try:
            json.dumps(dep, allow_nan=False)
        except ValueError as e:
            return _error(422, "invalid_deployment", f"deployment: {e}")
        ident = secrets.token_hex(8)
        records.create(dep, body.rounds, ["search"], str(data_dir.resolve() / "rounds" / ident), ident)
        records.event(ident, "state", {"state": "queued"})
        queue.submit(ident, dep["gpu"])
        return {"id": ident}

    @app.get("/api/rounds", tags=["rounds"], summary="Queued runs, newest first")
    def list_rounds(limit: int = Query(100, ge=1, le=1000)) -> list[dict]:
        return [{"id": r["id"], "state": r["state"], "deployment": r["deployment"].get("name"),
                 "gpu": r["deployment"].get("gpu"), "rounds": r["rounds"], "error": r.get("error"),
                 "created_at": r["created_at"], "updated_at": r["updated_at"]} for r in records.list(limit)]

    @app.get("/api/rounds/{id}", tags=["rounds"], summary="A run: state, rounds, verdicts, speed-up",
             responses={404: ERRORS[404]})
    def get_round(id: str) -> dict:
        return round_view(found(id))

    @app.post("/api/rounds/{id}/cancel", tags=["rounds"], summary="Cancel a run",
              description="A queued run is cancelled at once; a running one stops at its next step.",
              dependencies=[Depends(require_token)], responses={401: ERRORS[401], 404: ERRORS[404]})
    def cancel_round(id: str) -> dict:
        found(id)
        rec = records.request_cancel(id)
        if rec["state"] == "cancelled":
            records.event(id, "state", {"state": "cancelled"})
        return {"id": id, "state": rec["state"], "cancel_requested": bool(rec["cancel_requested"])}

    @app.get("/api/rounds/{id}/events", tags=["rounds"], summary="Live events (server-sent events)",
             description="step, candidate, verdict and state events as they happen, from `after` on; the "
             "stream ends once the run is final, or after `wait` seconds without news.",
             response_class=StreamingResponse, responses={200: {"content": {"text/event-stream": {}}},
                                                          404: ERRORS[404]})
    async def round_events(id: str, after: int = Query(0, ge=0, le=2**62),
                           wait: float = Query(600.0, ge=0.0, le=3600.0)):
        found(id)

        async def stream():
            last, quiet = after, time.monotonic()
            while True:
                evs = await asyncio.to_thread(records.events, id, last)
                for ev in evs:
                    last = ev["seq"]
                    body = {"at": ev["at"], "data": ev["data"], "text": dashboard.event_text(ev["kind"], ev["data"])}
                    yield f"id: {ev['seq']}\nevent: {ev['kind']}\ndata: {json.dumps(body)}\n\n"
                if evs:
                    quiet = time.monotonic()
                    continue
                rec = await asyncio.to_thread(records.find, id)
                if rec is None or rec["state"] in FINAL or time.monotonic() - quiet >= wait:
                    yield "event: end\ndata: {}\n\n"
                    return
                yield ": keep-alive\n\n"
                await asyncio.sleep(sse_poll)

        return StreamingResponse(stream(), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})

    @app.get("/api/workers", tags=["workers"], summary="The GPU workers and their health")
    def get_workers() -> list[dict]:
        return [{"address": w["address"], "device": w["device"], "kind": w["kind"], "healthy": w["healthy"],
                 "detail": w.get("detail"), "systems": w.get("systems")} for w in workers.health()]

    @app.get("/metrics", tags=["service"], summary="Prometheus metrics", response_class=Response,
             responses={200: {"content": {CONTENT_TYPE_LATEST: {}}}})
    def metrics():
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    # ------------------------------------------------------------------ the dashboard
    def defaults() -> dict:
        return {**demo_deployment(), "rounds": 1}

    @app.get("/", tags=["dashboard"], summary="Dashboard: rounds, the form to queue one, workers",
             response_class=HTMLResponse)
    def home():
        return HTMLResponse(dashboard.index(records.list(100), workers.health(), defaults()))

    @app.get("/rounds/{id}", tags=["dashboard"], summary="Dashboard: one run, live", response_class=HTMLResponse,
             responses={404: ERRORS[404]})
    def round_page(id: str):
        rec = found(id)
        return HTMLResponse(dashboard.round_page(rec, round_view(rec), records.events(id)))

    @app.get("/rounds/{id}/report/{name}", tags=["dashboard"], summary="A run's HTML report pages",
             response_class=HTMLResponse, responses={404: ERRORS[404]})
    def report_file(id: str, name: str):
        return report_page(id, name, "")

    @app.get("/rounds/{id}/batch-{batch}/report/{name}", tags=["dashboard"], response_class=HTMLResponse,
             summary="The HTML report pages of one batch size of a run judged per batch size",
             responses={404: ERRORS[404]})
    def lane_report_file(id: str, batch: int, name: str):
        return report_page(id, name, f"batch-{batch}")

    def report_page(id: str, name: str, lane: str):
        rec = found(id)
        path = Path(rec["run_dir"]) / lane / "report" / name
        if not REPORT_FILE.fullmatch(name) or not path.is_file():
            raise LookupError(f"no report page {name!r} for round {id!r}{' ' + lane if lane else ''} (yet)")
        return FileResponse(path, media_type="text/html")

    @app.get("/memory", tags=["dashboard"], summary="Dashboard: memory entries", response_class=HTMLResponse)
    def memory_page():
        try:
            return HTMLResponse(dashboard.memory_page(memory.entries(), None))
        except (RuntimeError, ValueError) as e:
            return HTMLResponse(dashboard.memory_page([], str(e)))

    @app.get("/memory/{id}", tags=["dashboard"], summary="Dashboard: one entry and its requirement graph",
             response_class=HTMLResponse, responses={404: ERRORS[404]})
    def entry_page(id: str):
        try:
            entry = memory.get(id)
        except ValueError as e:
            raise LookupError(str(e)) from None
        except RuntimeError as e:
            return HTMLResponse(dashboard.memory_page([], str(e)), status_code=503)
        try:
            svg, error = memory.graph_svg(id), None
        except (RuntimeError, ValueError) as e:
            svg, error = None, str(e)
        return HTMLResponse(dashboard.entry_page(entry, svg, error))

    @app.get("/docs", tags=["service"], summary="The API, rendered from its OpenAPI schema", response_class=HTMLResponse)
    def docs():
        return HTMLResponse(dashboard.api_docs(app.openapi()))

    return app
