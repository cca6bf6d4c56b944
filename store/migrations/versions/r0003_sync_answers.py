"""Sync answers: a retried scheduler sync answers exactly as its first attempt.

Revision ID: r0003
Revises: r0002
Create Date: 2026-12-03

``headway_syncs`` keeps, by sync token, what a sync answered besides its claims (issue
#20): a workflow task lost after a sync ran is retried, and a retry that answered
otherwise (``more`` computed again) made the scheduler decide otherwise than the
decisions the lost task had already delivered.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "r0003"
down_revision: str | None = "r0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "headway_syncs",
        sa.Column("tenant", sa.String(200), primary_key=True),
        sa.Column("token", sa.String(200), primary_key=True),
        sa.Column("more", sa.Text(), nullable=False),
        sa.Column("more_done", sa.Boolean(), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("headway_syncs")
