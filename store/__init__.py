"""Headway: store. Pending leases of every shard in SQL (SQLite by default, PostgreSQL by URL)."""

from __future__ import annotations

from .leases import (
    DEFAULT_DATABASE_URL,
    DONE_CHANNEL,
    WANTS_ENDS_CHANNEL,
    LeaseStore,
    Nudge,
    Put,
    SyncResult,
    queue_channel,
)
from .models import AdmissionRow, Base, DoorRow, LeaseRow, ShardFlag

__all__ = [
    "DEFAULT_DATABASE_URL",
    "DONE_CHANNEL",
    "WANTS_ENDS_CHANNEL",
    "AdmissionRow",
    "Base",
    "DoorRow",
    "LeaseRow",
    "LeaseStore",
    "Nudge",
    "Put",
    "ShardFlag",
    "SyncResult",
    "queue_channel",
]
