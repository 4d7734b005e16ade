"""rounds (one row per queued run: its deployment, state, lease and the round's state document)
and round_events (what happened, in order, for the dashboard's live view).

Revision ID: 0001_rounds
Revises:
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001_rounds"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "rounds",
        sa.Column("id", sa.String(64), primary_key=True),
        sa.Column("deployment", sa.Text(), nullable=False),
        sa.Column("rounds", sa.Integer(), nullable=False),
        sa.Column("agents", sa.Text(), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("doc", sa.Text(), nullable=True),
        sa.Column("run_dir", sa.Text(), nullable=False),
        sa.Column("cancel_requested", sa.Boolean(), nullable=False),
        sa.Column("lease_owner", sa.String(200), nullable=True),
        sa.Column("lease_until", sa.Float(), nullable=True),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.Column("updated_at", sa.Float(), nullable=False),
    )
    op.create_index("ix_rounds_state", "rounds", ["state"])
    op.create_table(
        "round_events",
        sa.Column("seq", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("round_id", sa.String(64), nullable=False),
        sa.Column("at", sa.Float(), nullable=False),
        sa.Column("kind", sa.String(32), nullable=False),
        sa.Column("data", sa.Text(), nullable=False),
    )
    op.create_index("ix_round_events_round", "round_events", ["round_id", "seq"])


def downgrade() -> None:
    op.drop_table("round_events")
    op.drop_table("rounds")
