"""Headway: store. Pending leases of every shard in SQL (SQLite by default, PostgreSQL by URL)."""

from __future__ import annotations

from .leases import (
    DEFAULT_DATABASE_URL,
    DONE_CHANNEL,
    WANTS_ENDS_CHANNEL,
    LeaseStore,
    Nudge,
    SyncResult,
    queue_channel,
)
from .models import AdmissionRow, Base, LeaseRow, ShardFlag

__all__ = [
    "DEFAULT_DATABASE_URL",
    "DONE_CHANNEL",
    "WANTS_ENDS_CHANNEL",
    "AdmissionRow",
    "Base",
    "LeaseRow",
    "LeaseStore",
    "Nudge",
    "ShardFlag",
    "SyncResult",
    "queue_channel",
]
