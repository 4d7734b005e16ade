"""Alembic environment of the controller's round records (see `specpilot.sqldb.run_env`)."""

from alembic import context

from specpilot.sqldb import run_env

run_env(context)
