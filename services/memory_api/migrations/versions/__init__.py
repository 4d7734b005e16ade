"""Alembic revisions of the memory store."""
