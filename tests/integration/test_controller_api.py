"""The controller's REST API in-process (real SQLite records, the real in-process memory; the
queue only records what was submitted): its routes, auth, cancellation, the live events, the
dashboard pages, /metrics; and every route fuzzed from its OpenAPI schema (no 5xx, 401 without
the token on mutating routes)."""

from __future__ import annotations

import json
import re

import pytest
import schemathesis
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings

from specpilot.entrypoints.demo import micro_pair
from specpilot.services.controller.app import create_app
from specpilot.services.controller.records import Records
from specpilot.services.controller.remote import GrpcWorkers
from specpilot.services.memory_api.local import LocalMemory

TOKEN = "t0ken-for-tests"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
TARGET, DRAFTER, TRAINED = micro_pair()
DEP = {"name": "api-test", "target": str(TARGET), "drafter": str(DRAFTER), "prompts": 1, "repeats": 2}


class RecordingQueue:
    def __init__(self):
        self.submitted: list[tuple[str, str]] = []

    def submit(self, ident: str, kind: str) -> None:
        self.submitted.append((ident, kind))

    def depth(self, kinds):
        return {f"rounds.{k}": 0 for k in kinds}


@pytest.fixture
def parts(tmp_path):
    records, memory = Records(f"sqlite:///{tmp_path / 'rounds.db'}"), LocalMemory(f"sqlite:///{tmp_path / 'mem.db'}")
    queue = RecordingQueue()
    app = create_app(records, queue, GrpcWorkers([]), memory, tmp_path / "data", TOKEN, sse_poll=0.01)
    yield app, records, queue
    records.close()
    memory.close()


@pytest.fixture
def client(parts):
    with TestClient(parts[0]) as c:
        yield c


def test_a_round_is_queued_listed_shown_and_cancelled(client, parts):
    _, records, queue = parts
    assert client.post("/api/rounds", json={"deployment": DEP}).status_code == 401
    assert client.post("/api/rounds", json={"deployment": DEP}, headers={"Authorization": "Bearer nope"}).status_code == 401
    r = client.post("/api/rounds", json={"deployment": DEP, "rounds": 1}, headers=AUTH)
    assert r.status_code == 201, r.text
    ident = r.json()["id"]
    assert queue.submitted == [(ident, "cpu")]
    assert [x["id"] for x in client.get("/api/rounds").json()] == [ident]
    got = client.get(f"/api/rounds/{ident}").json()
    assert got["state"] == "queued" and got["rounds"] == [] and got["speedup_over_stock"] is None
    assert got["deployment"]["target"] == str(TARGET.resolve())  # validated and filled like the CLI's
    assert client.post(f"/api/rounds/{ident}/cancel").status_code == 401
    c = client.post(f"/api/rounds/{ident}/cancel", headers=AUTH).json()
    assert c["state"] == "cancelled"
    events = client.get(f"/api/rounds/{ident}/events").text
    assert "event: state" in events and '"text": "state queued"' in events and '"text": "state cancelled"' in events
    assert "event: end" in events
    assert client.get("/api/rounds/nope").status_code == 404


@pytest.mark.parametrize("dep, message", [
    ({"name": "x"}, "'target' is required"),
    ({**DEP, "repeats": 1}, "repeats must be at least 2"),
    ({**DEP, "colour": 1}, "unknown field 'colour'"),
    ({**DEP, "gpu": "H200 GPU"}, "'gpu' is a device kind"),
])
def test_a_bad_deployment_is_a_422_naming_the_field(client, dep, message):
    r = client.post("/api/rounds", json={"deployment": dep}, headers=AUTH)
    assert r.status_code == 422 and message in r.json()["detail"], r.text


def test_a_running_round_shows_what_it_has_and_metrics_count_it(client, parts):
    _, records, _ = parts
    ident = records.create({**DEP, "gpu": "cpu"}, 1, ["search"], "/tmp/x", "r1")
    records.set_state(ident, "running")
    doc = {"rounds": [{"round": 1, "status": "running", "direction": "tree", "incumbent": {"label": "stock"},
                       "costmodel": {"tau_current": 2.5}, "profile_seconds": 3.0,
                       "candidates": [{"name": "a", "pruned": None, "error": None,
                                       "verdict": {"accepted": True, "gain": 1.2, "lower_bound": 1.1, "seconds": 40.0,
                                                   "candidate_tps": 120.0, "incumbent_tps": 100.0}},
                                      {"name": "b", "pruned": "replay", "error": None, "verdict": None}]}]}
    records.save_doc(ident, doc)
    got = client.get(f"/api/rounds/{ident}").json()
    assert got["rounds"][0]["candidates"][0] == {"name": "a", "pruned": None, "error": None, "accepted": True,
                                                 "gain": 1.2, "lower_bound": 1.1}
    m = client.get("/metrics").text
    assert 'specpilot_rounds{state="running"} 1.0' in m
    assert 'specpilot_candidates{state="accepted"} 1.0' in m and 'specpilot_candidates{state="pruned"} 1.0' in m
    assert 'specpilot_verdicts_total{decision="accepted"} 1.0' in m
    assert 'specpilot_judge_duration_seconds_bucket{le="60.0"} 1.0' in m
    assert 'specpilot_profile_duration_seconds_count 1.0' in m
    assert 'specpilot_system_tau{round="1",run="r1",system="stock"} 2.5' in m
    assert 'specpilot_system_tokens_per_second{round="1",run="r1",system="a"} 120.0' in m
    page = client.get(f"/rounds/{ident}").text
    assert "EventSource" in page and "accepted" in page and "×1.200" in page


def test_dashboard_pages_render_without_anything_from_elsewhere(client):
    for path in ("/", "/memory", "/memory/tree-best-first", "/docs"):
        r = client.get(path)
        assert r.status_code == 200, (path, r.text[:300])
        links = re.findall(r"""(?:src|href)=["']?([^"' >]+)""", r.text)
        assert links and all(u.startswith("/") for u in links), (path, links)  # all on this server
        assert "<link" not in r.text and "@import" not in r.text
    assert "<svg" in client.get("/memory/tree-best-first").text  # the requirement graph
    assert "/api/rounds" in client.get("/docs").text
    assert client.get("/memory/nope").status_code == 404


def test_every_route_fuzzed_from_its_schema_answers_no_5xx(parts):
    """Each operation of the OpenAPI schema, with cases Hypothesis draws from it (schemathesis)."""
    schema = schemathesis.openapi.from_asgi("/openapi.json", parts[0])
    ops = [result.ok() for result in schema.get_all_operations()]
    assert len(ops) >= 12
    for op in ops:

        @given(case=op.as_strategy())
        @settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck), database=None)
        def fuzz(case):
            if case.method.upper() == "POST":  # every mutating route: 401 without the token
                assert case.call().status_code == 401
            r = case.call(headers=AUTH)
            assert r.status_code < 500, (case.method, case.path, r.status_code, r.text[:500])
            if r.status_code >= 400 and "json" in r.headers.get("content-type", ""):
                assert json.loads(r.text)["detail"]  # a message naming the problem

        fuzz()
