"""Alembic environment of the memory store (see `specpilot.sqldb.run_env`)."""

from alembic import context

from specpilot.sqldb import run_env

run_env(context)
