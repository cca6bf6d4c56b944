"""The record of what ran: one row per finished action.

Revision ID: r0005
Revises: r0004
Create Date: 2026-12-03

Nothing kept a finished action beyond Temporal's own history (issue #28), so no one
could replay last week's work under another queue layout. ``headway_finished`` holds,
per tenant and action, its submit, admission and end times, queue, run, task, demand
(declared and per pod), cluster, reasons and outcome, written once as the action ends
and deleted after the control plane's retention period.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "r0005"
down_revision: str | None = "r0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "headway_finished",
        sa.Column("tenant", sa.String(200), primary_key=True),
        sa.Column("action_id", sa.String(400), primary_key=True),
        sa.Column("queue", sa.String(200), nullable=False),
        sa.Column("run", sa.String(400), nullable=False),
        sa.Column("task", sa.String(400), nullable=False),
        sa.Column("cluster", sa.String(200), nullable=True),
        sa.Column("submitted_at", sa.Float(), nullable=False),
        sa.Column("admitted_at", sa.Float(), nullable=True),
        sa.Column("ended_at", sa.Float(), nullable=False),
        sa.Column("outcome", sa.String(16), nullable=False),
        sa.Column("reason", sa.String(200), nullable=False),
        sa.Column("reasons", sa.Text(), nullable=False),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("pod_count", sa.Integer(), nullable=False),
        sa.Column("pods", sa.Text(), nullable=False),
        sa.Column("demand", sa.Text(), nullable=False),
        sa.Column("estimate", sa.Float(), nullable=True),
        sa.Column("environment", sa.String(200), nullable=True),
    )
    op.create_index("ix_headway_finished_ended", "headway_finished", ["tenant", "ended_at"])
    op.create_index("ix_headway_finished_age", "headway_finished", ["ended_at"])


def downgrade() -> None:
    op.drop_index("ix_headway_finished_age", table_name="headway_finished")
    op.drop_index("ix_headway_finished_ended", table_name="headway_finished")
    op.drop_table("headway_finished")
