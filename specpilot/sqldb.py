"""SQL plumbing shared by the services that keep state in a database (the memory store, the
controller's round records): engines for SQLite or PostgreSQL, and Alembic migrations run inside
one transaction.

On SQLite the connections use WAL, a busy timeout and `BEGIN IMMEDIATE` (writers queue instead of
failing); on PostgreSQL a migration holds an advisory lock so that concurrent openings do not race
on the DDL.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import sqlalchemy as sa
from alembic import command
from alembic.config import Config
from sqlalchemy import event
from sqlalchemy.engine import Connection, Engine

SQLITE_BUSY_MS = 30_000


def make_engine(url: str) -> Engine:
    """An engine for `url`; on SQLite with WAL, a busy timeout and `BEGIN IMMEDIATE` transactions."""
    if not url.startswith("sqlite"):
        return sa.create_engine(url, pool_pre_ping=True)
    engine = sa.create_engine(url, connect_args={"timeout": SQLITE_BUSY_MS / 1000, "check_same_thread": False})

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn, _record):
        dbapi_conn.isolation_level = None  # let SQLAlchemy's "begin" event emit BEGIN itself
        cur = dbapi_conn.cursor()
        cur.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_MS}")
        if url not in ("sqlite://", "sqlite:///:memory:"):
            cur.execute("PRAGMA journal_mode=WAL")
        cur.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn):
        conn.exec_driver_sql("BEGIN IMMEDIATE")  # take the write lock up front: no upgrade deadlocks

    return engine


class Migrations:
    """One service's Alembic scripts (`folder`), its version table and its PostgreSQL lock key."""

    def __init__(self, folder: Path, version_table: str, lock_key: int):
        self.folder, self.version_table, self.lock_key = Path(folder), version_table, lock_key

    def _config(self, connection: Connection) -> Config:
        cfg = Config()
        cfg.set_main_option("script_location", str(self.folder))
        cfg.attributes["connection"] = connection
        cfg.attributes["version_table"] = self.version_table
        return cfg

    def _run(self, engine: Engine, run: Callable[[Config], None]) -> None:
        with engine.begin() as conn:  # one transaction (BEGIN IMMEDIATE on SQLite): migrations serialize
            if engine.dialect.name == "postgresql":
                conn.execute(sa.text("SELECT pg_advisory_xact_lock(:k)"), {"k": self.lock_key})
            run(self._config(conn))

    def upgrade(self, engine: Engine, revision: str = "head") -> None:
        self._run(engine, lambda cfg: command.upgrade(cfg, revision))

    def downgrade(self, engine: Engine, revision: str = "base") -> None:
        self._run(engine, lambda cfg: command.downgrade(cfg, revision))

    def current(self, engine: Engine) -> str | None:
        from alembic.runtime.migration import MigrationContext

        with engine.connect() as conn:
            return MigrationContext.configure(conn, opts={"version_table": self.version_table}).get_current_revision()


def run_env(context) -> None:
    """The body of a service's migrations/env.py: on the connection the caller passes (its own
    transaction), or, from the alembic CLI, on `sqlalchemy.url`."""
    config = context.config
    connection = config.attributes.get("connection")
    table = config.attributes.get("version_table", "alembic_version")
    if context.is_offline_mode():
        context.configure(url=config.get_main_option("sqlalchemy.url"), literal_binds=True, version_table=table)
        with context.begin_transaction():
            context.run_migrations()
    elif connection is not None:
        context.configure(connection=connection, version_table=table)
        with context.begin_transaction():
            context.run_migrations()
    else:
        engine = sa.create_engine(config.get_main_option("sqlalchemy.url"))
        with engine.begin() as conn:
            context.configure(connection=conn, version_table=table)
            with context.begin_transaction():
                context.run_migrations()
        engine.dispose()


def check_url(url: str, flag: str = "--store") -> str:
    """Refuse, in one line naming the flag and the URL, a database URL that is not one, names a
    database this project does not use, or cannot be reached; the URL otherwise."""
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError, SQLAlchemyError

    allowed = "sqlite:///FILE or postgresql+psycopg://USER@HOST[:PORT]/DB"
    try:
        parsed = make_url(url)
    except (ArgumentError, ValueError, TypeError):
        raise ValueError(f"{flag} {url!r} is not a database URL; expected {allowed}") from None
    shown = parsed.render_as_string(hide_password=True)
    if parsed.get_backend_name() not in ("sqlite", "postgresql"):
        raise ValueError(f"{flag} {shown}: database {parsed.get_backend_name()!r} is not supported; expected {allowed}")
    if parsed.get_backend_name() == "sqlite" and parsed.database not in (None, "", ":memory:"):
        folder = Path(parsed.database).parent
        if not folder.is_dir():
            raise ValueError(f"{flag} {shown}: folder {folder} does not exist; create it or give another path")
        if Path(parsed.database).is_dir():
            raise ValueError(f"{flag} {shown}: {parsed.database} is a folder, not a database file")
    try:
        engine = sa.create_engine(parsed, **({"connect_args": {"connect_timeout": 5}}
                                              if parsed.get_backend_name() == "postgresql" else {}))
    except (ArgumentError, ImportError, SQLAlchemyError) as e:
        raise ValueError(f"{flag} {shown}: cannot use this URL ({' '.join(str(e).split())[:200]}); "
                         f"expected {allowed}") from None
    try:
        with engine.connect() as conn:
            conn.exec_driver_sql("SELECT 1" if parsed.get_backend_name() == "postgresql"
                                 else "PRAGMA schema_version")
    except (SQLAlchemyError, OSError) as e:
        first = str(getattr(e, "orig", None) or e).strip().splitlines()
        raise ValueError(f"{flag} {shown}: cannot reach the database ({first[0] if first else type(e).__name__}); "
                         "check that it runs and the URL is right") from None
    finally:
        engine.dispose()
    return url
