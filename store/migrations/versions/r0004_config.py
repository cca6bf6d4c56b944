"""Configuration in SQL: the tenant list, queues and org limits, and their audit trail.

Revision ID: r0004
Revises: r0003
Create Date: 2026-12-03

Until now a tenant's queues and org limits lived only in its scheduler workflow's
state, and no record said who changed what (issue #24). ``headway_configs`` holds them
as the scheduler last applied them, ``headway_config_audit`` one row per change, and
``headway_tenants`` the tenants a starting control plane restores.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "r0004"
down_revision: str | None = "r0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# As in the models: SQLite autoincrements only an INTEGER PRIMARY KEY.
_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    op.create_table(
        "headway_tenants",
        sa.Column("tenant", sa.String(200), primary_key=True),
        sa.Column("created_at", sa.Float(), nullable=False),
    )
    op.create_table(
        "headway_configs",
        sa.Column("tenant", sa.String(200), primary_key=True),
        sa.Column("kind", sa.String(16), primary_key=True),
        sa.Column("name", sa.String(200), primary_key=True),
        sa.Column("spec", sa.Text(), nullable=False),
        sa.Column("updated_at", sa.Float(), nullable=False),
    )
    op.create_table(
        "headway_config_audit",
        sa.Column("id", _ID, primary_key=True, autoincrement=True),
        sa.Column("tenant", sa.String(200), nullable=False),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("name", sa.String(200), nullable=False),
        sa.Column("change", sa.String(16), nullable=False),
        sa.Column("who", sa.String(200), nullable=False),
        sa.Column("source", sa.String(32), nullable=False),
        sa.Column("at", sa.Float(), nullable=False),
        sa.Column("old", sa.Text(), nullable=True),
        sa.Column("new", sa.Text(), nullable=True),
        sa.Column("token", sa.String(200), nullable=False),
        sa.UniqueConstraint("tenant", "token", name="uq_headway_config_audit_token"),
    )
    op.create_index(
        "ix_headway_config_audit_name", "headway_config_audit", ["tenant", "kind", "name", "id"]
    )


def downgrade() -> None:
    op.drop_index("ix_headway_config_audit_name", table_name="headway_config_audit")
    op.drop_table("headway_config_audit")
    op.drop_table("headway_configs")
    op.drop_table("headway_tenants")
