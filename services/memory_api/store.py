"""The memory store: immutable entries in SQL (SQLite or PostgreSQL), schema kept by Alembic.

`Store(url)` opens the database and upgrades its schema to the latest revision (the migration
scripts live in `migrations/`). An entry is stored once per (id, version) and never changed; it is
stored only if its requirements resolve against the stored catalog plus itself and, when a
`reproduce` check is given, that check passes first.

Concurrency: every write is one transaction and the primary key (id, version) decides races, so
two writers of different entries both succeed and two writers of the same (id, version) get one
success and one `EntryExists`. On SQLite the connections use WAL, a busy timeout and
`BEGIN IMMEDIATE` (writers queue instead of failing); on PostgreSQL the schema upgrade holds an
advisory lock so that concurrent `Store(...)` openings do not race on the DDL (`specpilot.sqldb`).
"""

from __future__ import annotations

import builtins
import json
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from pathlib import Path

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import IntegrityError

from specpilot.sqldb import Migrations, make_engine

from .entries import SLUG, Entry, EntryError, Requirement
from .graph import resolve
from .porting import check_deployment, limits_refuse

MIGRATIONS = Migrations(Path(__file__).resolve().parent / "migrations", "alembic_version", 0x5350_4D45)
MAX_ID_LEN = 200  # the `id` column's length
MAX_VERSION = 2**31 - 1  # the `version` column is a 32-bit integer

Reproduce = Callable[[Entry, "builtins.list[Entry]"], object]

metadata = sa.MetaData()
entries_table = sa.Table(  # mirrors migrations/versions/0001_entries.py
    "entries",
    metadata,
    sa.Column("id", sa.String(MAX_ID_LEN), primary_key=True),
    sa.Column("version", sa.Integer(), primary_key=True),
    sa.Column("title", sa.Text(), nullable=False),
    sa.Column("content_hash", sa.String(64), nullable=False),
    sa.Column("body", sa.Text(), nullable=False),
    sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
)


class StoreError(Exception):
    """Base of the store's own errors."""


class EntryExists(StoreError):
    """(id, version) is already stored; entries are immutable."""

    def __init__(self, key: str):
        super().__init__(f"entry {key} already exists; entries are immutable (add a new version)")
        self.key = key


class UnknownEntry(StoreError, KeyError):
    """No such entry id, or no such version of it."""

    def __init__(self, ident: str, version: int | None = None):
        what = f"entry {ident!r}" if version is None else f"entry {ident!r} version {version!r}"
        super().__init__(f"unknown {what}")
        self.ident = ident
        self.version = version

    def __str__(self) -> str:  # KeyError would print the repr of the message
        return self.args[0]


def upgrade(engine: Engine, revision: str = "head") -> None:
    """Bring the schema to `revision` (Alembic `upgrade`)."""
    MIGRATIONS.upgrade(engine, revision)


def downgrade(engine: Engine, revision: str = "base") -> None:
    """Take the schema back to `revision` (Alembic `downgrade`)."""
    MIGRATIONS.downgrade(engine, revision)


def current_revision(engine: Engine) -> str | None:
    return MIGRATIONS.current(engine)


def _storable(entry: Entry) -> None:
    """What the schema needs beyond `Entry`'s own validation (column sizes, encodable text)."""
    if not isinstance(entry, Entry):
        raise EntryError(f"expected an Entry, got {type(entry).__name__}")
    if len(entry.id) > MAX_ID_LEN:
        raise EntryError(f"entry {entry.id[:40]}…: field 'id': longer than {MAX_ID_LEN} characters")
    if entry.version > MAX_VERSION:
        raise EntryError(f"entry {entry.id}: field 'version': {entry.version} exceeds {MAX_VERSION}")
    if "\x00" in entry.title:
        raise EntryError(f"entry {entry.key}: field 'title': contains a NUL character")
    try:
        entry.canonical_json().encode("utf-8")
    except UnicodeEncodeError as exc:
        raise EntryError(f"entry {entry.key}: text is not encodable as UTF-8 ({exc.reason})") from None


def _row_entry(row) -> Entry:
    return Entry.from_dict(json.loads(row.body))


class Store:
    """Immutable, versioned memory entries in a SQL database (see the module docstring)."""

    def __init__(self, url: str = "sqlite:///memory.db"):
        self.url = url
        self._engine = make_engine(url)
        upgrade(self._engine)

    @property
    def engine(self) -> Engine:
        return self._engine

    def close(self) -> None:
        self._engine.dispose()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ------------------------------------------------------------------ writes

    def add(self, entry: Entry, reproduce: Reproduce | None = None) -> Entry:
        """Store `entry`. Raises EntryExists, GraphError (requirements), or whatever `reproduce` raises.

        `reproduce(entry, order)` gets the resolved apply order (requirements first, `entry` last)
        and runs before the insert, outside the write transaction; if it raises, nothing is stored.
        """
        _storable(entry)
        if entry.version in self.versions(entry.id, missing_ok=True):
            raise EntryExists(entry.key)
        order = self._resolve_with(entry, self.catalog())
        if reproduce is not None:
            reproduce(entry, order)
        row = {
            "id": entry.id,
            "version": entry.version,
            "title": entry.title,
            "content_hash": entry.content_hash(),
            "body": entry.canonical_json(),
            "created_at": datetime.now(UTC),
        }
        try:
            with self._engine.begin() as conn:
                # entries are never removed, so what resolved above still resolves; check again in
                # the transaction anyway (a concurrent writer may have added higher versions)
                self._resolve_with(entry, self._catalog(conn))
                conn.execute(entries_table.insert().values(**row))
        except IntegrityError:
            raise EntryExists(entry.key) from None
        return entry

    @staticmethod
    def _resolve_with(entry: Entry, catalog: dict[str, builtins.list[Entry]]) -> builtins.list[Entry]:
        versions = catalog.setdefault(entry.id, [])
        if any(e.version == entry.version for e in versions):  # stored meanwhile by another writer
            raise EntryExists(entry.key)
        versions.append(entry)
        return resolve([Requirement(entry.id, f"=={entry.version}")], catalog)

    # ------------------------------------------------------------------ reads

    def get(self, id: str, version: int | None = None) -> Entry:
        """The entry `id` at `version` (the latest when None). Raises UnknownEntry."""
        if not isinstance(id, str) or not SLUG.fullmatch(id) or len(id) > MAX_ID_LEN:
            raise UnknownEntry(id, version)
        if version is not None and (
            not isinstance(version, int) or isinstance(version, bool) or not 1 <= version <= MAX_VERSION
        ):
            raise UnknownEntry(id, version)
        t = entries_table
        q = sa.select(t.c.body).where(t.c.id == id)
        q = q.order_by(t.c.version.desc()).limit(1) if version is None else q.where(t.c.version == version)
        with self._engine.begin() as conn:
            row = conn.execute(q).first()
        if row is None:
            raise UnknownEntry(id, version)
        return _row_entry(row)

    def versions(self, id: str, *, missing_ok: bool = False) -> builtins.list[int]:
        """The stored versions of `id`, ascending. Raises UnknownEntry when there are none."""
        found: builtins.list[int] = []
        if isinstance(id, str) and SLUG.fullmatch(id) and len(id) <= MAX_ID_LEN:
            t = entries_table
            with self._engine.begin() as conn:
                found = list(conn.execute(sa.select(t.c.version).where(t.c.id == id).order_by(t.c.version)).scalars())
        if not found and not missing_ok:
            raise UnknownEntry(id)
        return found

    def list(
        self,
        mechanism: str | None = None,
        contract: str | None = None,
        deployment: Mapping | None = None,
    ) -> builtins.list[Entry]:
        """The latest version of each id, in id order, filtered.

        mechanism: case-insensitive substring of the id or the title; contract: equal to
        `contract.rule`; deployment: {family, device, batch} allowed by the entry's limits
        (`porting.check_deployment` validates it: PortError when malformed).
        """
        dep = check_deployment(deployment) if deployment is not None else None
        t = entries_table
        latest = sa.select(t.c.id, sa.func.max(t.c.version).label("v")).group_by(t.c.id).subquery()
        q = (
            sa.select(t.c.body)
            .join(latest, sa.and_(t.c.id == latest.c.id, t.c.version == latest.c.v))
            .order_by(t.c.id)
        )
        with self._engine.begin() as conn:
            entries = [_row_entry(r) for r in conn.execute(q)]
        out = []
        for e in entries:
            if mechanism is not None and not (mechanism.lower() in e.id or mechanism.lower() in e.title.lower()):
                continue
            if contract is not None and e.contract.rule != contract:
                continue
            if dep is not None and limits_refuse(e.limits, dep) is not None:
                continue
            out.append(e)
        return out

    def catalog(self) -> dict[str, builtins.list[Entry]]:
        """Every stored entry: id -> its versions, ascending (the shape `graph.resolve` takes)."""
        with self._engine.begin() as conn:
            return self._catalog(conn)

    @staticmethod
    def _catalog(conn: Connection) -> dict[str, builtins.list[Entry]]:
        t = entries_table
        cat: dict[str, builtins.list[Entry]] = {}
        for row in conn.execute(sa.select(t.c.body).order_by(t.c.id, t.c.version)):
            e = _row_entry(row)
            cat.setdefault(e.id, []).append(e)
        return cat
