"""The door: per-queue and per-tenant submission settings and token buckets.

Revision ID: r0002
Revises: r0001
Create Date: 2026-12-02

``headway_doors`` holds what ``put_lease`` decides each submission against (issue #23);
``ix_headway_leases_held`` lets it count a queue's leases not yet ended, bounded by the
queue's depth, without reading the rest of its backlog.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "r0002"
down_revision: str | None = "r0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "headway_doors",
        sa.Column("tenant", sa.String(200), primary_key=True),
        sa.Column("queue", sa.String(200), primary_key=True),
        sa.Column("status", sa.String(16), nullable=True),
        sa.Column("depth", sa.BigInteger(), nullable=True),
        sa.Column("rate", sa.Float(), nullable=True),
        sa.Column("burst", sa.Float(), nullable=True),
        sa.Column("tokens", sa.Float(), nullable=True),
        sa.Column("token_time", sa.Float(), nullable=False),
    )
    op.create_index("ix_headway_leases_held", "headway_leases", ["tenant", "queue", "done"])


def downgrade() -> None:
    op.drop_index("ix_headway_leases_held", table_name="headway_leases")
    op.drop_table("headway_doors")
