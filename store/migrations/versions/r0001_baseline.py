"""The baseline: the schema the store made before it had migrations.

Revision ID: r0001
Revises:
Create Date: 2026-12-02

Every table and index with ``if_not_exists``: a database made by the store's
``create_all`` (no version table) goes through this revision like an empty one, keeps
what it has and gains any index added to the code after it was made.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "r0001"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# As in the models: SQLite autoincrements only an INTEGER PRIMARY KEY.
_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    op.create_table(
        "headway_leases",
        sa.Column("id", _ID, primary_key=True, autoincrement=True),
        sa.Column("tenant", sa.String(200), nullable=False),
        sa.Column("action_id", sa.String(400), nullable=False),
        sa.Column("queue", sa.String(200), nullable=False),
        sa.Column("workflow_id", sa.String(600), nullable=False),
        sa.Column("spec", sa.Text(), nullable=False),
        sa.Column("submitted_at", sa.Float(), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("claim", sa.String(200), nullable=True),
        sa.Column("done", sa.String(16), nullable=True),
        sa.Column("done_claim", sa.String(200), nullable=True),
        sa.UniqueConstraint("tenant", "action_id", name="uq_headway_leases_tenant_action"),
        if_not_exists=True,
    )
    for name, cols in (
        ("ix_headway_leases_pending", ["tenant", "status", "queue", "id"]),
        ("ix_headway_leases_claim", ["tenant", "claim"]),
        ("ix_headway_leases_done", ["tenant", "done_claim"]),
        ("ix_headway_leases_ended", ["tenant", "done"]),
    ):
        op.create_index(name, "headway_leases", cols, if_not_exists=True)
    op.create_table(
        "headway_shard_flags",
        sa.Column("tenant", sa.String(200), primary_key=True),
        sa.Column("channel", sa.String(210), primary_key=True),
        sa.Column("dirty", sa.Boolean(), nullable=False),
        if_not_exists=True,
    )
    op.create_table(
        "headway_admissions",
        sa.Column("tenant", sa.String(200), primary_key=True),
        sa.Column("action_id", sa.String(400), primary_key=True),
        sa.Column("admission", sa.Text(), nullable=False),
        if_not_exists=True,
    )


def downgrade() -> None:
    op.drop_table("headway_admissions")
    op.drop_table("headway_shard_flags")
    op.drop_table("headway_leases")
