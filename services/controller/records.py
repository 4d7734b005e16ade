"""Round records in SQL (SQLite embedded, PostgreSQL distributed; schema kept by Alembic in
`migrations/`): one row per queued run with its deployment, state, error, lease and the round's
state document, and the run's events in order.

States: queued → running → done | failed | cancelled (the last three are final; a final record
never changes state again). A runner holds a lease on a record while it works (`claim`, renewed by
`Heartbeat`); another runner takes a record over only once the lease has expired, so a run is
never executed twice at once and a runner killed mid-run is replaced (`stale`).
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from pathlib import Path

import sqlalchemy as sa

from specpilot.sqldb import Migrations, make_engine

MIGRATIONS = Migrations(Path(__file__).resolve().parent / "migrations", "alembic_version_controller", 0x5350_4354)
STATES = ("queued", "running", "done", "failed", "cancelled")
FINAL = frozenset({"done", "failed", "cancelled"})
REQUEUED = "(queued again)"  # the lease owner of a record queued again after its runner died

metadata = sa.MetaData()
rounds = sa.Table(  # mirrors migrations/versions/0001_rounds.py
    "rounds", metadata,
    sa.Column("id", sa.String(64), primary_key=True),
    sa.Column("deployment", sa.Text(), nullable=False),
    sa.Column("rounds", sa.Integer(), nullable=False),
    sa.Column("agents", sa.Text(), nullable=False),
    sa.Column("state", sa.String(16), nullable=False),
    sa.Column("error", sa.Text()),
    sa.Column("doc", sa.Text()),
    sa.Column("run_dir", sa.Text(), nullable=False),
    sa.Column("cancel_requested", sa.Boolean(), nullable=False),
    sa.Column("lease_owner", sa.String(200)),
    sa.Column("lease_until", sa.Float()),
    sa.Column("created_at", sa.Float(), nullable=False),
    sa.Column("updated_at", sa.Float(), nullable=False),
)
events = sa.Table(
    "round_events", metadata,
    sa.Column("seq", sa.Integer(), primary_key=True, autoincrement=True),
    sa.Column("round_id", sa.String(64), nullable=False),
    sa.Column("at", sa.Float(), nullable=False),
    sa.Column("kind", sa.String(32), nullable=False),
    sa.Column("data", sa.Text(), nullable=False),
)


class UnknownRound(KeyError):
    def __init__(self, ident: str):
        super().__init__(f"unknown round {ident!r}")

    def __str__(self) -> str:
        return self.args[0]


def _row(r) -> dict:
    d = dict(r._mapping)
    for k in ("deployment", "agents", "doc"):
        d[k] = json.loads(d[k]) if d[k] is not None else None
    return d


class Records:
    def __init__(self, url: str):
        self.url = url
        self.engine = make_engine(url)
        MIGRATIONS.upgrade(self.engine)

    def close(self) -> None:
        self.engine.dispose()

    # ------------------------------------------------------------------ records
    def create(self, deployment: dict, n_rounds: int, agents: list[str], run_dir: str, ident: str | None = None) -> str:
        ident = ident or uuid.uuid4().hex
        now = time.time()
        with self.engine.begin() as c:
            c.execute(rounds.insert().values(id=ident, deployment=json.dumps(deployment), rounds=n_rounds,
                                             agents=json.dumps(agents), state="queued", run_dir=run_dir,
                                             cancel_requested=False, created_at=now, updated_at=now))
        return ident

    def find(self, ident: str) -> dict | None:
        if not isinstance(ident, str) or len(ident) > 64:
            return None
        with self.engine.begin() as c:
            r = c.execute(sa.select(rounds).where(rounds.c.id == ident)).first()
        return _row(r) if r else None

    def get(self, ident: str) -> dict:
        found = self.find(ident)
        if found is None:
            raise UnknownRound(ident)
        return found

    def list(self, limit: int = 200) -> list[dict]:
        with self.engine.begin() as c:
            return [_row(r) for r in c.execute(sa.select(rounds).order_by(rounds.c.created_at.desc()).limit(limit))]

    def counts(self) -> dict[str, int]:
        with self.engine.begin() as c:
            got = dict(c.execute(sa.select(rounds.c.state, sa.func.count()).group_by(rounds.c.state)).all())
        return {s: int(got.get(s, 0)) for s in STATES}

    def _update(self, ident: str, *where, **values) -> bool:
        values["updated_at"] = time.time()
        with self.engine.begin() as c:
            n = c.execute(rounds.update().where(rounds.c.id == ident, *where).values(**values)).rowcount
        return n == 1

    def save_doc(self, ident: str, doc: dict) -> None:
        self._update(ident, doc=json.dumps(doc))

    def set_state(self, ident: str, state: str, error: str | None = None) -> bool:
        """Move a record that is not final yet to `state`; False when it already was final."""
        assert state in STATES
        return self._update(ident, rounds.c.state.not_in(FINAL), state=state, error=error)

    def request_cancel(self, ident: str) -> dict:
        """A queued record is cancelled at once; a running one stops at its next step."""
        self.get(ident)
        self._update(ident, rounds.c.state == "queued", state="cancelled", cancel_requested=True)
        self._update(ident, rounds.c.state == "running", cancel_requested=True)
        return self.get(ident)

    def cancel_requested(self, ident: str) -> bool:
        return bool(self.get(ident)["cancel_requested"])

    # ------------------------------------------------------------------ leases
    def claim(self, ident: str, owner: str, lease: float) -> bool:
        """Take the record for `owner` unless it is final or someone else's lease is still valid."""
        now = time.time()
        free = sa.or_(rounds.c.lease_owner.is_(None), rounds.c.lease_until < now, rounds.c.lease_owner == owner,
                      rounds.c.lease_owner == REQUEUED)
        return self._update(ident, rounds.c.state.not_in(FINAL), free, lease_owner=owner, lease_until=now + lease)

    def renew(self, ident: str, owner: str, lease: float) -> bool:
        return self._update(ident, rounds.c.lease_owner == owner, lease_until=time.time() + lease)

    def release(self, ident: str, owner: str) -> None:
        self._update(ident, rounds.c.lease_owner == owner, lease_owner=None, lease_until=None)

    def stale(self) -> list[str]:
        """Records a runner started and stopped renewing (it died): to be queued again."""
        with self.engine.begin() as c:
            q = sa.select(rounds.c.id).where(rounds.c.state == "running", rounds.c.lease_until < time.time())
            return list(c.execute(q).scalars())

    def requeued(self, ident: str, hold: float) -> bool:
        """Mark a stale record as queued again: not stale for `hold` seconds, free to any runner."""
        return self._update(ident, rounds.c.state == "running", rounds.c.lease_until < time.time(),
                            lease_owner=REQUEUED, lease_until=time.time() + hold)

    # ------------------------------------------------------------------ events
    def event(self, ident: str, kind: str, data: dict) -> None:
        with self.engine.begin() as c:
            c.execute(events.insert().values(round_id=ident, at=time.time(), kind=kind, data=json.dumps(data)))

    def events(self, ident: str, after: int = 0, limit: int = 1000) -> list[dict]:
        q = (sa.select(events).where(events.c.round_id == ident, events.c.seq > after)
             .order_by(events.c.seq).limit(limit))
        with self.engine.begin() as c:
            return [{**dict(r._mapping), "data": json.loads(r.data)} for r in c.execute(q)]


class RecordState:
    """The round's state document kept in its record (what `Round` loads and saves)."""

    def __init__(self, records: Records, ident: str):
        self.records, self.ident = records, ident

    def load(self) -> dict | None:
        return self.records.get(self.ident)["doc"]

    def save(self, state: dict) -> None:
        self.records.save_doc(self.ident, state)


class Heartbeat:
    """Renews `owner`'s lease on a record every `lease / 3` seconds until stopped."""

    def __init__(self, records: Records, ident: str, owner: str, lease: float):
        self.stop_ = threading.Event()
        self.thread = threading.Thread(target=self._run, args=(records, ident, owner, lease), daemon=True)
        self.thread.start()

    def _run(self, records, ident, owner, lease) -> None:
        while not self.stop_.wait(lease / 3):
            records.renew(ident, owner, lease)

    def stop(self) -> None:
        self.stop_.set()
        self.thread.join()
