"""The memory API over HTTP: a thin FastAPI wiring of `store`, `graph` and `porting`.

Domain errors map to 4xx with a message naming the problem: EntryError / GraphError / PortError
-> 422, EntryExists -> 409, UnknownEntry -> 404; malformed JSON and bad parameters -> 422.
"""

from __future__ import annotations

from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from fastapi import Body, FastAPI, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from .entries import Entry, EntryError, Requirement
from .graph import GraphError, graph_json, graph_svg, resolve
from .porting import PortError, port
from .local import reproduce_check
from .store import EntryExists, Store, UnknownEntry

ENTRY_EXAMPLE = {
    "id": "tree-draft",
    "version": 1,
    "title": "Tree drafting with top-k branching",
    "requires": [{"id": "kv-rollback", "constraint": ">=1"}],
    "contract": {"rule": "token_forcing", "output_may_differ": False, "options": {}},
    "limits": {"families": ["llama"], "batch_max": 8},
}
ERRORS = {
    404: {"description": "Unknown entry id or version"},
    409: {"description": "This (id, version) is already stored; entries are immutable"},
    422: {"description": "Malformed request, invalid entry, or requirements that do not resolve"},
}


def _error(status: int, kind: str, message: str, **extra: Any) -> JSONResponse:
    return JSONResponse(status_code=status, content={"error": kind, "detail": message, **extra})


def _requirements(body: Any) -> list[Requirement]:
    if not isinstance(body, list):
        raise EntryError(f"resolve: expected a list of {{id, constraint}} objects, got {type(body).__name__}")
    out = []
    for i, r in enumerate(body):
        try:
            out.append(Requirement.from_dict(r))
        except TypeError as exc:  # missing or extra fields
            raise EntryError(f"resolve: requirement [{i}]: {exc}") from None
    return out


def create_app(store_url: str, repo: str | Path | None = None, stock_rev: str | None = None) -> FastAPI:
    """A FastAPI app serving the memory store at `store_url` (opened, and migrated, on startup).
    `repo` and `stock_rev` (the engine's git repository and the pinned stock revision) enable the
    reproduce check of entries that carry a code delta."""

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        yield
        app.state.store.close()

    app = FastAPI(
        title="SpecPilot memory API",
        version="1",
        description="Versioned, immutable memory entries; their requirement graph; porting to a new deployment.",
        lifespan=lifespan,
    )
    app.state.store = store = Store(store_url)

    @app.exception_handler(RequestValidationError)
    async def _invalid_request(request: Request, exc: RequestValidationError):
        errors = exc.errors()
        parts = [f"{'.'.join(str(p) for p in e.get('loc', ()))}: {e.get('msg', '')}" for e in errors]
        safe = [{"loc": [str(p) for p in e.get("loc", ())], "msg": str(e.get("msg", ""))} for e in errors]
        return _error(422, "invalid_request", "; ".join(parts) or "invalid request", errors=safe)

    @app.exception_handler(EntryError)
    async def _entry_error(request: Request, exc: EntryError):
        return _error(422, "invalid_entry", str(exc))

    @app.exception_handler(GraphError)
    async def _graph_error(request: Request, exc: GraphError):
        return _error(422, f"requirements_{exc.kind}", str(exc))

    @app.exception_handler(PortError)
    async def _port_error(request: Request, exc: PortError):
        return _error(422, "invalid_deployment", str(exc))

    @app.exception_handler(ValueError)
    async def _value_error(request: Request, exc: ValueError):  # any other domain validation error
        return _error(422, "invalid_input", str(exc))

    @app.exception_handler(EntryExists)
    async def _exists(request: Request, exc: EntryExists):
        return _error(409, "entry_exists", str(exc))

    @app.exception_handler(UnknownEntry)
    async def _unknown(request: Request, exc: UnknownEntry):
        return _error(404, "unknown_entry", str(exc))

    def resolved(ident: str, version: int | None) -> list[Entry]:
        e = store.get(ident, version)
        return resolve([Requirement(e.id, f"=={e.version}")], store.catalog())

    @app.post(
        "/entries",
        status_code=201,
        tags=["entries"],
        summary="Add an entry",
        description="Stores a new (id, version). Its requirements must resolve against the stored catalog "
        "plus itself. Entries are immutable: an existing (id, version) answers 409.",
        responses={409: ERRORS[409], 422: ERRORS[422]},
    )
    def add_entry(
        entry: dict[str, Any] = Body(..., examples=[ENTRY_EXAMPLE]),
        expected_tree: str | None = Query(None, description="git tree id of the accepted system's code; needed "
                                          "when the entry carries a code delta, checked whenever given "
                                          "(the reproduce check)"),
    ) -> dict:
        e = Entry.from_dict(entry)
        return store.add(e, reproduce=reproduce_check(repo, stock_rev, e, expected_tree)).to_dict()

    @app.get(
        "/entries",
        tags=["entries"],
        summary="List entries (latest version of each id)",
        description="Filters: `mechanism` (substring of id or title), `contract` (the contract rule), and a "
        "deployment (`family`, `device`, `batch`, all three together) allowed by the entry's limits.",
        responses={422: ERRORS[422]},
    )
    def list_entries(
        mechanism: str | None = Query(None, description="substring of the id or title (case-insensitive)"),
        contract: str | None = Query(None, description="contract rule, e.g. token_forcing"),
        family: str | None = Query(None, description="deployment model family"),
        device: str | None = Query(None, description="deployment device"),
        batch: int | None = Query(None, description="deployment batch size"),
    ) -> list[dict]:
        deployment = None
        if (family, device, batch) != (None, None, None):
            deployment = {"family": family, "device": device, "batch": batch}
        return [e.to_dict() for e in store.list(mechanism, contract, deployment)]

    @app.get(
        "/entries/{id}",
        tags=["entries"],
        summary="Get the latest version of an entry",
        responses={404: ERRORS[404]},
    )
    def get_entry(id: str) -> dict:
        return store.get(id).to_dict()

    @app.get(
        "/entries/{id}/versions",
        tags=["entries"],
        summary="List the stored versions of an entry",
        responses={404: ERRORS[404]},
    )
    def get_versions(id: str) -> dict:
        return {"id": id, "versions": store.versions(id)}

    @app.get(
        "/entries/{id}/versions/{version}",
        tags=["entries"],
        summary="Get one version of an entry",
        responses={404: ERRORS[404], 422: ERRORS[422]},
    )
    def get_version(id: str, version: int) -> dict:
        return store.get(id, version).to_dict()

    @app.get(
        "/entries/{id}/graph",
        tags=["graph"],
        summary="Requirement graph of an entry (JSON)",
        description="Nodes and edges of the entry (latest, or `version`) with its resolved requirements.",
        responses={404: ERRORS[404], 422: ERRORS[422]},
    )
    def get_graph(id: str, version: int | None = Query(None, description="version (latest when omitted)")) -> dict:
        order = resolved(id, version)
        return {"order": [e.key for e in order], **graph_json(order)}

    @app.get(
        "/entries/{id}/graph.svg",
        tags=["graph"],
        summary="Requirement graph of an entry (SVG)",
        response_class=Response,
        responses={200: {"content": {"image/svg+xml": {}}}, 404: ERRORS[404], 422: ERRORS[422]},
    )
    def get_graph_svg(id: str, version: int | None = Query(None, description="version (latest when omitted)")):
        return Response(graph_svg(resolved(id, version)), media_type="image/svg+xml")

    @app.post(
        "/resolve",
        tags=["graph"],
        summary="Resolve requirements to an apply order",
        description="Body: a list of {id, constraint}. Answers the chosen entries, requirements first.",
        responses={422: ERRORS[422]},
    )
    def post_resolve(
        requirements: list[Any] = Body(..., examples=[[{"id": "tree-draft", "constraint": ">=1"}]]),
    ) -> dict:
        order = resolve(_requirements(requirements), store.catalog())
        return {"order": [e.key for e in order], "entries": [e.to_dict() for e in order]}

    @app.post(
        "/port",
        tags=["graph"],
        summary="Plan porting the memory to a deployment",
        description="Body: {family, device, batch}. Answers the PortPlan: apply order (each a reuse), "
        "starting system, the entries skipped with the reason, and the ordered entries themselves.",
        responses={422: ERRORS[422]},
    )
    def post_port(
        deployment: dict[str, Any] = Body(..., examples=[{"family": "llama", "device": "h100", "batch": 1}]),
    ) -> dict:
        plan = port(deployment, store.catalog())
        return {**plan.to_dict(), "entries": [e.to_dict() for e in plan.order]}

    registry = CollectorRegistry()
    entries_gauge = Gauge("specpilot_memory_entries", "Stored entries (latest versions) and versions",
                          ["what"], registry=registry)
    requests = Counter("specpilot_memory_requests", "Requests served, by route and status", ["route", "status"],
                       registry=registry)

    @app.middleware("http")
    async def count(request: Request, call_next):
        response = await call_next(request)
        route = request.scope.get("route")
        requests.labels(getattr(route, "path", "unmatched"), str(response.status_code)).inc()
        return response

    @app.get("/metrics", tags=["service"], summary="Prometheus metrics", response_class=Response,
             responses={200: {"content": {CONTENT_TYPE_LATEST: {}}}})
    def metrics():
        catalog = store.catalog()
        entries_gauge.labels("entries").set(len(catalog))
        entries_gauge.labels("versions").set(sum(len(v) for v in catalog.values()))
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    return app
