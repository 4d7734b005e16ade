"""The memory store on real databases: SQLite (tmp file) and PostgreSQL (a fresh database per test).

PostgreSQL tests are skipped, with the reason, only when the server at 127.0.0.1:5432 cannot be
reached.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor

import pytest
import sqlalchemy as sa

from specpilot.services.memory_api.entries import Contract, Entry, EntryError, Evidence, Requirement
from specpilot.services.memory_api.graph import GraphError
from specpilot.services.memory_api.porting import PortError
from specpilot.services.memory_api.store import (
    EntryExists,
    Store,
    UnknownEntry,
    current_revision,
    downgrade,
    make_engine,
    upgrade,
)

PG_ADMIN = os.environ.get("SPECPILOT_PG_ADMIN_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/postgres")


def E(ident: str, version: int = 1, *requires: tuple[str, str] | str, **kw) -> Entry:
    reqs = tuple(Requirement(r) if isinstance(r, str) else Requirement(*r) for r in requires)
    return Entry(ident, version, kw.pop("title", f"{ident} mechanism"), requires=reqs, **kw)


def _pg_admin():
    engine = sa.create_engine(PG_ADMIN, isolation_level="AUTOCOMMIT", connect_args={"connect_timeout": 3})
    try:
        with engine.connect() as conn:
            conn.execute(sa.text("SELECT 1"))
    except sa.exc.OperationalError as exc:
        engine.dispose()
        pytest.skip(f"PostgreSQL unreachable at {PG_ADMIN}: {str(exc).splitlines()[0]}")
    return engine


@pytest.fixture
def pg_url():
    admin = _pg_admin()
    name = f"specpilot_mem_{uuid.uuid4().hex[:12]}"
    with admin.connect() as conn:
        conn.execute(sa.text(f'CREATE DATABASE "{name}"'))
    try:
        yield PG_ADMIN.rsplit("/", 1)[0] + "/" + name
    finally:
        with admin.connect() as conn:
            conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


@pytest.fixture
def sqlite_url(tmp_path):
    return f"sqlite:///{tmp_path / 'memory.db'}"


@pytest.fixture(params=["sqlite", "postgresql"])
def url(request):
    return request.getfixturevalue("sqlite_url" if request.param == "sqlite" else "pg_url")


@pytest.fixture
def store(url):
    s = Store(url)
    yield s
    s.close()


def _tables(engine) -> set[str]:
    return set(sa.inspect(engine).get_table_names())


# ------------------------------------------------------------------ migrations


def test_migrations_up_and_down(url):
    engine = make_engine(url)
    try:
        assert current_revision(engine) is None
        upgrade(engine)
        assert current_revision(engine) == "0001_entries"
        cols = {c["name"] for c in sa.inspect(engine).get_columns("entries")}
        assert cols == {"id", "version", "title", "content_hash", "body", "created_at"}
        assert sa.inspect(engine).get_pk_constraint("entries")["constrained_columns"] == ["id", "version"]
        downgrade(engine, "base")
        assert current_revision(engine) is None
        assert "entries" not in _tables(engine)
        upgrade(engine, "head")  # and up again
        assert "entries" in _tables(engine)
    finally:
        engine.dispose()


def test_store_opening_migrates_and_is_idempotent(url):
    Store(url).close()
    s = Store(url)  # second opening: already at head, nothing to do
    try:
        assert current_revision(s.engine) == "0001_entries"
        assert s.catalog() == {}
    finally:
        s.close()


# ------------------------------------------------------------------ add / get / versions / list


def test_add_get_versions_list(store):
    ev = Evidence({"family": "llama", "device": "h100", "batch": 1}, 0.2, 0.1, "v-1")
    a1 = store.add(E("kv-rollback", 1, evidence=ev))
    a2 = store.add(E("kv-rollback", 2, limits={"devices": ["h100"]}))
    limits = {"families": ["llama"], "batch_max": 4}
    b = store.add(E("tree-draft", 1, ("kv-rollback", ">=2"), title="Tree drafting", limits=limits))
    c = store.add(E("greedy-switch", 1, contract=Contract("exact")))

    assert store.get("kv-rollback") == a2
    assert store.get("kv-rollback", 1) == a1
    assert store.get("tree-draft") == b
    assert store.versions("kv-rollback") == [1, 2]
    assert store.versions("tree-draft") == [1]
    assert [e.key for e in store.list()] == ["greedy-switch@1", "kv-rollback@2", "tree-draft@1"]
    assert [e.key for e in store.list(mechanism="TREE")] == ["tree-draft@1"]
    assert [e.key for e in store.list(mechanism="drafting")] == ["tree-draft@1"]  # title match
    assert [e.key for e in store.list(contract="exact")] == [c.key]
    dep = {"family": "llama", "device": "h100", "batch": 2}
    assert [e.key for e in store.list(deployment=dep)] == ["greedy-switch@1", "kv-rollback@2", "tree-draft@1"]
    dep = {"family": "llama", "device": "a10", "batch": 8}
    assert [e.key for e in store.list(deployment=dep)] == ["greedy-switch@1"]
    with pytest.raises(PortError, match="batch"):
        store.list(deployment={"family": "llama", "device": "h100"})

    cat = store.catalog()
    assert sorted(cat) == ["greedy-switch", "kv-rollback", "tree-draft"]
    assert cat["kv-rollback"] == [a1, a2]

    # the row holds the canonical JSON and its hash
    with store.engine.connect() as conn:
        sql = "SELECT body, content_hash, title FROM entries WHERE id='kv-rollback' AND version=1"
        row = conn.execute(sa.text(sql)).one()
    assert row.body == a1.canonical_json() and row.content_hash == a1.content_hash() and row.title == a1.title
    assert Entry.from_dict(json.loads(row.body)) == a1


def test_unknown_entries(store):
    store.add(E("a", 1))
    for call, match in [
        (lambda: store.get("nope"), "unknown entry 'nope'"),
        (lambda: store.get("a", 2), "unknown entry 'a' version 2"),
        (lambda: store.get("a", 10**30), "version"),
        (lambda: store.get("Bad Id\x00"), "unknown entry"),
        (lambda: store.versions("nope"), "unknown entry 'nope'"),
    ]:
        with pytest.raises(UnknownEntry, match=match) as info:
            call()
        assert isinstance(info.value, KeyError)


def test_entries_are_immutable(store):
    a = store.add(E("a", 1))
    with pytest.raises(EntryExists, match="a@1 already exists"):
        store.add(E("a", 1, title="changed"))
    with pytest.raises(EntryExists):
        store.add(E("a", 1))  # identical content: still refused
    assert store.get("a", 1) == a
    assert store.versions("a") == [1]


def test_requirements_must_resolve(store):
    with pytest.raises(GraphError, match="no entry 'b'"):
        store.add(E("a", 1, "b"))
    store.add(E("b", 1))
    with pytest.raises(GraphError, match="no version of 'b'"):
        store.add(E("a", 1, ("b", ">=2")))
    assert store.catalog().keys() == {"b"}
    store.add(E("a", 1, ("b", "==1")))
    assert store.versions("a") == [1]


def test_schema_limits_are_entry_errors(store):
    with pytest.raises(EntryError, match="version"):
        store.add(E("a", 2**31))
    with pytest.raises(EntryError, match="id"):
        store.add(E("a" * 201, 1))
    with pytest.raises(EntryError, match="NUL"):
        store.add(E("a", 1, title="x\x00y"))
    with pytest.raises(EntryError, match="UTF-8"):
        store.add(E("a", 1, title="x\ud800y"))
    assert store.catalog() == {}


def test_reproduce_gets_the_apply_order_and_a_failure_stores_nothing(store):
    store.add(E("base", 1))
    seen = []

    def ok(entry, order):
        seen.append((entry.key, [e.key for e in order]))

    store.add(E("mid", 1, "base"), reproduce=ok)
    assert seen == [("mid@1", ["base@1", "mid@1"])]

    def fails(entry, order):
        raise RuntimeError("built system differs from the accepted one")

    with pytest.raises(RuntimeError, match="differs"):
        store.add(E("top", 1, "mid"), reproduce=fails)
    with pytest.raises(UnknownEntry):
        store.get("top")
    assert sorted(store.catalog()) == ["base", "mid"]
    store.add(E("top", 1, "mid"), reproduce=ok)  # a later passing attempt stores it
    assert seen[-1] == ("top@1", ["base@1", "mid@1", "top@1"])


# ------------------------------------------------------------------ concurrency

N_WRITERS = 6
PER_WRITER = 5
N_DUPS = 4


def _writer(url: str, tag: str, barrier: threading.Barrier | None = None) -> dict:
    """Add this writer's own entries and try every shared duplicate; report what happened."""
    s = Store(url)
    try:
        if barrier is not None:
            barrier.wait()
        stored, won, lost = [], [], []
        for k in range(N_DUPS):
            for i in range(PER_WRITER):
                if k == 0:
                    stored.append(s.add(E(f"own-{tag}-{i}", 1)).key)
            try:
                s.add(E(f"dup-{k}", 1, title=f"by {tag}"))
                won.append(f"dup-{k}@1")
            except EntryExists:
                lost.append(f"dup-{k}@1")
        return {"stored": stored, "won": won, "lost": lost}
    finally:
        s.close()


def _check(results: list[dict], store: Store, writers: int) -> None:
    keys = {e.key for es in store.catalog().values() for e in es}
    own = {k for r in results for k in r["stored"]}
    assert len(own) == writers * PER_WRITER and own <= keys  # no entry lost
    won = [k for r in results for k in r["won"]]
    lost = [k for r in results for k in r["lost"]]
    for k in range(N_DUPS):
        assert won.count(f"dup-{k}@1") == 1  # exactly one writer stored each duplicate
        assert lost.count(f"dup-{k}@1") == writers - 1  # every other one was refused
    assert len(keys) == writers * PER_WRITER + N_DUPS


def test_concurrent_writer_threads(url, store):
    barrier = threading.Barrier(N_WRITERS)
    with ThreadPoolExecutor(N_WRITERS) as pool:
        results = list(pool.map(lambda t: _writer(url, f"t{t}", barrier), range(N_WRITERS)))
    _check(results, store, N_WRITERS)


def test_threads_sharing_one_store(url, store):
    with ThreadPoolExecutor(8) as pool:
        outcomes = list(pool.map(lambda i: _try_add(store, E("same", 1, title=f"by {i}")), range(8)))
        list(pool.map(lambda i: store.add(E(f"n{i}", 1)), range(16)))
    assert outcomes.count("ok") == 1 and outcomes.count("exists") == 7
    assert len(store.catalog()) == 17


def _try_add(store: Store, entry: Entry) -> str:
    try:
        store.add(entry)
        return "ok"
    except EntryExists:
        return "exists"


CHILD = """
import json, sys, time
sys.path.insert(0, {here!r})
from test_memory_store import _writer
url, tag, start = sys.argv[1], sys.argv[2], float(sys.argv[3])
time.sleep(max(0.0, start - time.time()))
print(json.dumps(_writer(url, tag)))
"""


def test_concurrent_writer_processes_sqlite(sqlite_url):
    Store(sqlite_url).close()  # schema first, so both children start writing at once
    start = time.time() + 1.5
    code = CHILD.format(here=os.path.dirname(__file__))
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", code, sqlite_url, f"p{i}", str(start)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(2)
    ]
    results = []
    for p in procs:
        out, err = p.communicate(timeout=60)
        assert p.returncode == 0, err
        results.append(json.loads(out.strip().splitlines()[-1]))
    s = Store(sqlite_url)
    try:
        _check(results, s, 2)
    finally:
        s.close()
