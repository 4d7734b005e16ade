"""Round records (SQLite and PostgreSQL, real): states, cancellation, leases, queuing again after
a runner died, events; and the round task's idempotence around them."""

from __future__ import annotations

import time
import uuid

import pytest
import sqlalchemy as sa

from specpilot.services.controller import records as rec_mod
from specpilot.services.controller import runner
from specpilot.services.controller.records import Records
from specpilot.settings import Settings

PG_ADMIN = "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"
DEP = {"name": "x", "gpu": "cpu"}


@pytest.fixture(params=["sqlite", "postgresql"])
def records(request, tmp_path):
    if request.param == "sqlite":
        r = Records(f"sqlite:///{tmp_path / 'rounds.db'}")
        yield r
        r.close()
        return
    admin = sa.create_engine(PG_ADMIN, isolation_level="AUTOCOMMIT", connect_args={"connect_timeout": 3})
    try:
        with admin.connect():
            pass
    except sa.exc.OperationalError as e:
        pytest.skip(f"PostgreSQL unreachable: {str(e).splitlines()[0]}")
    name = f"specpilot_rec_{uuid.uuid4().hex[:10]}"
    with admin.connect() as c:
        c.execute(sa.text(f'CREATE DATABASE "{name}"'))
    r = Records(PG_ADMIN.rsplit("/", 1)[0] + "/" + name)
    try:
        yield r
    finally:
        r.close()
        with admin.connect() as c:
            c.execute(sa.text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


def test_states_only_move_forward_and_cancellation(records):
    a = records.create(DEP, 1, ["search"], "/tmp/a")
    assert records.get(a)["state"] == "queued" and records.counts()["queued"] == 1
    assert records.request_cancel(a)["state"] == "cancelled"  # queued: at once
    assert not records.set_state(a, "running")  # final stays final
    b = records.create(DEP, 1, ["search"], "/tmp/b")
    records.set_state(b, "running")
    got = records.request_cancel(b)
    assert got["state"] == "running" and got["cancel_requested"]  # running: at its next step
    with pytest.raises(KeyError, match="unknown round"):
        records.get("nope")
    assert records.find("x" * 100) is None


def test_a_lease_keeps_a_second_runner_out_until_it_expires(records, monkeypatch):
    a = records.create(DEP, 1, ["search"], "/tmp/a")
    records.set_state(a, "running")
    assert records.claim(a, "one", lease=30)
    assert not records.claim(a, "two", lease=30)  # a duplicate delivery leaves it alone
    assert records.claim(a, "one", lease=30) and records.renew(a, "one", 30)
    assert records.stale() == []
    now = time.time()
    monkeypatch.setattr(rec_mod.time, "time", lambda: now + 60)  # "one" stopped renewing
    assert records.stale() == [a]
    assert records.requeued(a, hold=600) and not records.requeued(a, hold=600)  # once
    assert records.stale() == []
    assert records.claim(a, "two", lease=30)  # the new runner takes it
    records.release(a, "two")
    assert records.get(a)["lease_owner"] is None


def test_events_come_back_in_order_from_a_point(records):
    a = records.create(DEP, 1, ["search"], "/tmp/a")
    for i in range(5):
        records.event(a, "step", {"i": i})
    evs = records.events(a)
    assert [e["data"]["i"] for e in evs] == list(range(5))
    assert [e["data"]["i"] for e in records.events(a, after=evs[2]["seq"])] == [3, 4]


def test_the_round_task_leaves_final_and_held_records_alone(tmp_path):
    records = Records(f"sqlite:///{tmp_path / 'rounds.db'}")
    settings = Settings(db_url=records.url, data_dir=tmp_path)
    done = records.create(DEP, 1, ["search"], str(tmp_path / "d"))
    records.set_state(done, "done")
    assert runner.execute(records, done, settings.repo, object) == "done"
    held = records.create(DEP, 1, ["search"], str(tmp_path / "h"))
    records.set_state(held, "running")
    records.claim(held, "someone-alive", lease=60)
    assert runner.execute(records, held, settings.repo, object) == "running elsewhere"
    assert records.get(held)["state"] == "running" and records.events(held) == []
    cancelled = records.create(DEP, 1, ["search"], str(tmp_path / "c"))
    records.set_state(cancelled, "running")
    records.request_cancel(cancelled)
    assert runner.execute(records, cancelled, settings.repo, object) == "cancelled"
    records.close()
