"""The memory API over HTTP (FastAPI TestClient) on a tmp SQLite store: every route, the OpenAPI
schema, and malformed input of many kinds answered 4xx with a message, never 5xx."""

from __future__ import annotations

import xml.etree.ElementTree as ET

import pytest
from fastapi.testclient import TestClient

from specpilot.services.memory_api.app import create_app

ROUTES = {
    ("post", "/entries"),
    ("get", "/entries"),
    ("get", "/entries/{id}"),
    ("get", "/entries/{id}/versions"),
    ("get", "/entries/{id}/versions/{version}"),
    ("get", "/entries/{id}/graph"),
    ("get", "/entries/{id}/graph.svg"),
    ("post", "/resolve"),
    ("post", "/port"),
}


def entry(ident: str, version: int = 1, requires=(), **kw) -> dict:
    d = {"id": ident, "version": version, "title": kw.pop("title", f"{ident} mechanism")}
    d["requires"] = [
        {"id": r, "constraint": "*"} if isinstance(r, str) else {"id": r[0], "constraint": r[1]} for r in requires
    ]
    d.update(kw)
    return d


@pytest.fixture
def client(tmp_path):
    with TestClient(create_app(f"sqlite:///{tmp_path / 'memory.db'}"), raise_server_exceptions=False) as c:
        yield c


@pytest.fixture
def filled(client):
    for body in [
        entry("kv-rollback", 1),
        entry("kv-rollback", 2, limits={"devices": ["h100"]}),
        entry("tree-draft", 1, [("kv-rollback", ">=1")], title="Tree drafting", limits={"families": ["llama"]},
              variants={"k4": {"k": 4}, "k8": {"k": 8}}),
        entry("greedy-switch", 1, contract={"rule": "exact", "output_may_differ": False, "options": {}}),
    ]:
        r = client.post("/entries", json=body)
        assert r.status_code == 201, r.text
        assert r.json()["id"] == body["id"] and r.json()["version"] == body["version"]
    return client


def test_openapi_lists_every_route_with_a_summary(client):
    schema = client.get("/openapi.json").json()
    found = {(m, p) for p, ops in schema["paths"].items() for m in ops}
    assert ROUTES <= found
    for method, path in ROUTES:
        assert schema["paths"][path][method].get("summary"), (method, path)
    assert "image/svg+xml" in schema["paths"]["/entries/{id}/graph.svg"]["get"]["responses"]["200"]["content"]


def test_entries_routes(filled):
    c = filled
    assert c.get("/entries/kv-rollback").json()["version"] == 2
    assert c.get("/entries/kv-rollback/versions").json() == {"id": "kv-rollback", "versions": [1, 2]}
    one = c.get("/entries/kv-rollback/versions/1")
    assert one.status_code == 200 and one.json()["version"] == 1 and "limits" in one.json()
    keys = lambda r: [f"{e['id']}@{e['version']}" for e in r.json()]  # noqa: E731
    assert keys(c.get("/entries")) == ["greedy-switch@1", "kv-rollback@2", "tree-draft@1"]
    assert keys(c.get("/entries", params={"mechanism": "draft"})) == ["tree-draft@1"]
    assert keys(c.get("/entries", params={"contract": "exact"})) == ["greedy-switch@1"]
    dep = {"family": "llama", "device": "h100", "batch": 1}
    assert keys(c.get("/entries", params=dep)) == ["greedy-switch@1", "kv-rollback@2", "tree-draft@1"]
    dep = {"family": "qwen", "device": "a10", "batch": 1}
    assert keys(c.get("/entries", params=dep)) == ["greedy-switch@1"]


def test_existing_version_is_409(filled):
    r = filled.post("/entries", json=entry("kv-rollback", 1, title="changed"))
    assert r.status_code == 409 and "kv-rollback@1 already exists" in r.json()["detail"]
    assert filled.get("/entries/kv-rollback/versions/1").json()["title"] == "kv-rollback mechanism"


def test_graph_routes(filled):
    g = filled.get("/entries/tree-draft/graph").json()
    assert g["order"] == ["kv-rollback@2", "tree-draft@1"]
    assert {n["key"] for n in g["nodes"]} == {"kv-rollback@2", "tree-draft@1"}
    assert g["edges"] == [{"from": "tree-draft@1", "to": "kv-rollback", "to_key": "kv-rollback@2", "constraint": ">=1"}]
    assert filled.get("/entries/kv-rollback/graph", params={"version": 1}).json()["order"] == ["kv-rollback@1"]
    r = filled.get("/entries/tree-draft/graph.svg")
    assert r.status_code == 200 and r.headers["content-type"].startswith("image/svg+xml")
    root = ET.fromstring(r.text)
    assert root.tag.endswith("svg") and "tree-draft@1" in r.text


def test_resolve_and_port(filled):
    body = [{"id": "tree-draft", "constraint": "*"}, {"id": "kv-rollback", "constraint": "<=1"}]
    r = filled.post("/resolve", json=body)
    assert r.status_code == 200, r.text
    assert r.json()["order"] == ["kv-rollback@1", "tree-draft@1"]
    assert r.json()["entries"][0]["version"] == 1
    r = filled.post("/port", json={"family": "llama", "device": "a10", "batch": 1})
    assert r.status_code == 200, r.text
    plan = r.json()
    assert plan["order"] == ["greedy-switch@1", "kv-rollback@1", "tree-draft@1"]
    assert plan["starting_system"]["variants"] == {"tree-draft": "k4"}
    assert plan["skipped"] == []


def _assert_4xx(r, status=None, words=()):
    assert 400 <= r.status_code < 500, (r.status_code, r.text)
    if status is not None:
        assert r.status_code == status, r.text
    detail = r.json()["detail"]
    assert isinstance(detail, str) and detail
    for w in words:
        assert w in detail, (w, detail)


def test_domain_errors_name_the_problem(filled):
    c = filled
    _assert_4xx(c.get("/entries/nope"), 404, ["nope"])
    _assert_4xx(c.get("/entries/nope/versions"), 404, ["nope"])
    _assert_4xx(c.get("/entries/kv-rollback/versions/9"), 404, ["kv-rollback", "9"])
    _assert_4xx(c.get("/entries/nope/graph"), 404, ["nope"])
    _assert_4xx(c.get("/entries/nope/graph.svg"), 404, ["nope"])
    _assert_4xx(c.post("/entries", json=entry("a", 1, ["missing"])), 422, ["missing"])
    _assert_4xx(c.post("/entries", json=entry("a", 1, [("kv-rollback", ">=7")])), 422, ["kv-rollback", ">=7"])
    _assert_4xx(c.post("/entries", json=entry("a", 0)), 422, ["version"])
    _assert_4xx(c.post("/entries", json=entry("A b", 1)), 422, ["id"])
    _assert_4xx(c.post("/entries", json={**entry("a"), "colour": "red"}), 422, ["colour"])
    _assert_4xx(c.post("/resolve", json=[{"id": "nope"}]), 422, ["nope"])
    _assert_4xx(c.post("/resolve", json=[{"id": "kv-rollback", "constraint": "latest"}]), 422, ["constraint"])
    _assert_4xx(c.post("/port", json={"family": "llama"}), 422, ["device"])
    _assert_4xx(c.get("/entries", params={"family": "llama"}), 422, ["device"])
    _assert_4xx(c.get("/entries", params={"batch": "many"}), 422, ["batch"])
    _assert_4xx(c.get("/entries/kv-rollback/versions/one"), 422, ["version"])


GARBAGE_BODIES = [
    b"",
    b"not json",
    b"{",
    b"null",
    b"[]",
    b"42",
    b'"a string"',
    b"\xff\xfe\x00garbage",
    b'{"id": null}',
    b'{"id": "a"}',
    b'{"id": "a", "version": "1", "title": "t"}',
    b'{"id": "a", "version": 1.5, "title": "t"}',
    b'{"id": "a", "version": true, "title": "t"}',
    b'{"id": "a", "version": 99999999999999999999999999, "title": "t"}',
    b'{"id": "a", "version": 1, "title": ""}',
    b'{"id": "a", "version": 1, "title": "t\\u0000"}',
    b'{"id": "a", "version": 1, "title": "\\ud800"}',
    b'{"id": "' + b"a" * 300 + b'", "version": 1, "title": "t"}',
    b'{"id": "a", "version": 1, "title": "t", "requires": "b"}',
    b'{"id": "a", "version": 1, "title": "t", "requires": [1]}',
    b'{"id": "a", "version": 1, "title": "t", "requires": [{}]}',
    b'{"id": "a", "version": 1, "title": "t", "requires": [{"id": "a"}]}',
    b'{"id": "a", "version": 1, "title": "t", "requires": [{"id": "b", "x": 1}]}',
    b'{"id": "a", "version": 1, "title": "t", "contract": []}',
    b'{"id": "a", "version": 1, "title": "t", "contract": {"rule": 3}}',
    b'{"id": "a", "version": 1, "title": "t", "evidence": {"gain": 1}}',
    b'{"id": "a", "version": 1, "title": "t", "evidence": {"deployment": {}, "gain": 1e999, "lower_bound": 0, '
    b'"verdict_id": "v"}}',
    b'{"id": "a", "version": 1, "title": "t", "limits": {"batch_max": 0}}',
    b'{"id": "a", "version": 1, "title": "t", "limits": {"gpus": 1}}',
    b'{"id": "a", "version": 1, "title": "t", "variants": {"": {}}}',
    b'{"id": "a", "version": 1, "title": "t", "variants": {"v": 3}}',
    b'{"id": "a", "version": 1, "title": "t", "unverified": "x"}',
    b'{"id": "a", "version": 1, "title": "t", "lineage": {"round": 1}}',
    b'{"id": "a", "version": 1, "title": "t", "reuse_of": "nope"}',
    b"[" * 5000 + b"]" * 5000,
    b'{"a":' * 3000 + b"1" + b"}" * 3000,
]


@pytest.mark.parametrize("path", ["/entries", "/resolve", "/port"])
def test_garbage_bodies_are_4xx_never_5xx(client, path):
    for body in GARBAGE_BODIES:
        r = client.post(path, content=body, headers={"content-type": "application/json"})
        if path == "/resolve" and body == b"[]":  # resolving nothing is valid: an empty order
            assert r.status_code == 200 and r.json()["order"] == []
            continue
        assert 400 <= r.status_code < 500, (path, body[:80], r.status_code, r.text[:300])
        assert r.json()["detail"], (path, body[:80])
    for headers in ({"content-type": "text/plain"}, {}):
        r = client.post(path, content=b'{"id": "a"}', headers=headers)
        assert 400 <= r.status_code < 500, (path, headers, r.status_code, r.text[:300])
    assert client.get("/entries").json() == []  # none of it was stored


@pytest.mark.parametrize(
    "url",
    [
        "/entries/%00",
        "/entries/" + "x" * 500,
        "/entries/A%20B/versions",
        "/entries/a/versions/0",
        "/entries/a/versions/-1",
        "/entries/a/versions/99999999999999999999999999",
        "/entries/a/versions/1e3",
        "/entries/a/graph?version=abc",
        "/entries/a/graph.svg?version=99999999999999999999999",
        "/entries?batch=-1&family=f&device=d",
        "/entries?family=&device=d&batch=1",
        "/nowhere",
    ],
)
def test_garbage_urls_are_4xx(client, url):
    r = client.get(url)
    assert 400 <= r.status_code < 500, (url, r.status_code, r.text[:300])
    assert r.json()["detail"]


@pytest.mark.parametrize(
    "url", ["/entries?batch=99999999999999999999999&family=f&device=d", "/entries?mechanism=%00&contract=%00"]
)
def test_odd_but_valid_queries_answer_200(client, url):
    r = client.get(url)
    assert r.status_code == 200 and r.json() == []


def test_wrong_methods_are_4xx(client):
    assert client.delete("/entries/a").status_code == 405
    assert client.put("/entries", json={}).status_code == 405


def test_an_entry_with_a_code_delta_is_stored_only_if_it_reproduces(tmp_path):
    import subprocess

    from fastapi.testclient import TestClient

    from specpilot.services.memory_api.app import create_app
    from specpilot.services.memory_api.reproduce import diff_between, tree_of_worktree

    def git(*args, cwd=tmp_path / "repo"):
        return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True).stdout.strip()

    repo = tmp_path / "repo"
    (repo / "engine").mkdir(parents=True)
    (repo / "engine" / "trees.py").write_text("MAX_DEPTH = 15\n")
    git("init", "-q")
    git("add", "-A")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "stock")
    stock = git("rev-parse", "HEAD")
    git("worktree", "add", "-q", "--detach", str(tmp_path / "cand"), stock)
    (tmp_path / "cand" / "engine" / "trees.py").write_text("MAX_DEPTH = 31\n")
    delta, tree = diff_between(repo, stock, tmp_path / "cand"), tree_of_worktree(tmp_path / "cand")
    entry = {"id": "deeper-trees", "version": 1, "title": "deeper trees", "delta": delta}
    client = TestClient(create_app(f"sqlite:///{tmp_path / 'm.db'}", repo, stock))
    r = client.post("/entries", json=entry)
    assert r.status_code == 422 and "expected_tree" in r.json()["detail"]
    r = client.post("/entries", json=entry, params={"expected_tree": git("rev-parse", "HEAD^{tree}")})
    assert r.status_code == 422 and "deeper-trees@1" in r.json()["detail"]  # stock's tree: the delta is extra
    assert client.get("/entries/deeper-trees").status_code == 404  # a failed check stores nothing
    r = client.post("/entries", json=entry, params={"expected_tree": tree})
    assert r.status_code == 201 and r.json()["delta"] == delta
    unconfigured = TestClient(create_app(f"sqlite:///{tmp_path / 'n.db'}"))
    r = unconfigured.post("/entries", json=entry, params={"expected_tree": tree})
    assert r.status_code == 422 and "--repo" in r.json()["detail"]
