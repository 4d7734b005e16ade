"""Alembic environment of the memory store.

`store.upgrade` / `store.downgrade` pass an open connection in `config.attributes["connection"]`
(the caller owns its transaction). From the alembic CLI, `sqlalchemy.url` is used instead.
"""

from __future__ import annotations

from alembic import context
from sqlalchemy import create_engine

config = context.config
connection = config.attributes.get("connection")

if context.is_offline_mode():
    context.configure(url=config.get_main_option("sqlalchemy.url"), literal_binds=True)
    with context.begin_transaction():
        context.run_migrations()
elif connection is not None:
    context.configure(connection=connection)
    with context.begin_transaction():
        context.run_migrations()
else:
    engine = create_engine(config.get_main_option("sqlalchemy.url"))
    with engine.begin() as conn:
        context.configure(connection=conn)
        with context.begin_transaction():
            context.run_migrations()
    engine.dispose()
