"""Alembic migrations of the memory store (run programmatically by `store.upgrade`)."""
