"""The record of what ran: one row per finished action (``headway_finished``).

Written by the control plane's ``finish_lease`` activity, once per action: the row is
keyed by tenant and action id and inserted with "on conflict do nothing", so a retried
activity, a replayed workflow or a restarted worker never writes an action twice, and
the first end written stands. Read back by ``headway export workload`` and ``headway
review`` (``headway.history``), which replay it through the scheduler core.

Retention: rows whose action ended longer ago than the retention period are deleted
(``prune``); the control-plane worker prunes at most every ``PRUNE_EVERY_S`` as it
records (``HEADWAY_HISTORY_RETENTION``, default ``DEFAULT_RETENTION``).
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, cast

from sqlalchemy import Table, delete, func, select

from .leases import LeaseStore
from .models import FinishedRow

__all__ = [
    "DEFAULT_RETENTION",
    "OUTCOMES",
    "PRUNE_EVERY_S",
    "RETENTION_ENV",
    "Finished",
    "HistoryStore",
    "history_retention",
    "parse_duration",
    "row_values",
]

#: How long a finished action is kept, unless ``HEADWAY_HISTORY_RETENTION`` says.
DEFAULT_RETENTION = "30d"
RETENTION_ENV = "HEADWAY_HISTORY_RETENTION"
#: The worker deletes expired rows at most this often (seconds).
PRUNE_EVERY_S = 600.0
OUTCOMES = ("succeeded", "failed", "cancelled", "rejected")

_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 7 * 86400.0}
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw]?)\s*$")


def parse_duration(value: str, field_name: str) -> float:
    """``"7d"``, ``"12h"``, ``"30m"``, ``"90s"`` or ``"90"`` (seconds) -> seconds.

    Raises:
        ValueError: naming ``field_name`` and the value.
    """
    m = _DURATION.match(value)
    if m is None:
        raise ValueError(
            f"{field_name}: {value!r} is not a duration (a number with s, m, h, d or w: 7d)"
        )
    return float(m.group(1)) * _UNITS[m.group(2) or "s"]


def history_retention(value: str | None = None) -> float | None:
    """The retention period in seconds: ``value``, else ``$HEADWAY_HISTORY_RETENTION``,
    else ``DEFAULT_RETENTION``; ``"forever"`` keeps every row (None).

    Raises:
        ValueError: naming the setting and the value.
    """
    text = value if value is not None else os.environ.get(RETENTION_ENV) or DEFAULT_RETENTION
    if text.strip().lower() == "forever":
        return None
    secs = parse_duration(text, RETENTION_ENV if value is None else "--history-retention")
    if secs <= 0:
        raise ValueError(f"{RETENTION_ENV}: {text!r} must be more than 0 (or 'forever')")
    return secs


@dataclass(frozen=True)
class Finished:
    """One finished action as it ran (times: seconds since the epoch)."""

    action_id: str
    queue: str
    submitted_at: float
    ended_at: float
    outcome: str
    reason: str = ""
    run: str = ""
    task: str = ""
    cluster: str | None = None
    admitted_at: float | None = None
    reasons: list[str] = field(default_factory=list)
    kind: str = "single"
    pods: list[dict[str, Any]] = field(default_factory=list)
    demand: dict[str, Any] = field(default_factory=dict)
    estimate: float | None = None
    environment: str | None = None

    @property
    def wait(self) -> float | None:
        """Seconds from submission to admission (None: it never ran)."""
        return None if self.admitted_at is None else self.admitted_at - self.submitted_at

    @property
    def duration(self) -> float | None:
        """Seconds it ran (admission to end; None: it never ran)."""
        return None if self.admitted_at is None else self.ended_at - self.admitted_at

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @staticmethod
    def from_dict(d: Mapping[str, Any]) -> Finished:
        return Finished(
            action_id=str(d["action_id"]),
            queue=str(d["queue"]),
            submitted_at=float(d["submitted_at"]),
            ended_at=float(d["ended_at"]),
            outcome=str(d["outcome"]),
            reason=str(d.get("reason") or ""),
            run=str(d.get("run") or ""),
            task=str(d.get("task") or ""),
            cluster=d.get("cluster"),
            admitted_at=None if d.get("admitted_at") is None else float(d["admitted_at"]),
            reasons=[str(r) for r in d.get("reasons") or []],
            kind=str(d.get("kind") or "single"),
            pods=[dict(p) for p in d.get("pods") or []],
            demand=dict(d.get("demand") or {}),
            estimate=None if d.get("estimate") is None else float(d["estimate"]),
            environment=d.get("environment"),
        )


class HistoryStore:
    """Finished actions, in the database (and transactions) of a lease store."""

    def __init__(self, store: LeaseStore) -> None:
        self.store = store

    def record(self, tenant: str, rec: Finished) -> bool:
        """Write ``rec`` unless the action has a row already; whether this wrote it.

        (The control plane writes records in its group commits instead, as a ``record``
        op of ``LeaseStore.apply`` with ``row_values``: same row, same idempotence.)
        """
        with self.store._tx() as conn:
            return self.store._insert_ignore(conn, FinishedRow, row_values(tenant, rec))

    def window(self, tenant: str, since: float, until: float | None = None) -> list[Finished]:
        """The tenant's actions submitted at or after ``since`` (and before ``until``),
        in submission order (then action id)."""
        cond = (FinishedRow.tenant == tenant) & (FinishedRow.submitted_at >= since)
        if until is not None:
            cond = cond & (FinishedRow.submitted_at < until)
        with self.store._tx() as conn:
            rows = conn.execute(
                select(*cast(Table, FinishedRow.__table__).columns)
                .where(cond)
                .order_by(FinishedRow.submitted_at, FinishedRow.action_id)
            ).all()
        return [_from_row(r) for r in rows]

    def count(self, tenant: str) -> int:
        with self.store._tx() as conn:
            return int(
                conn.execute(select(func.count()).where(FinishedRow.tenant == tenant)).scalar_one()
            )

    def prune(self, before: float) -> int:
        """Delete every action (all tenants) that ended before ``before``; how many."""
        with self.store._tx() as conn:
            res = conn.execute(delete(FinishedRow).where(FinishedRow.ended_at < before))
            return int(res.rowcount or 0)


def row_values(tenant: str, rec: Finished) -> dict[str, Any]:
    """``rec`` as a row of ``headway_finished`` (every column).

    Raises:
        ValueError: an outcome that is not one of ``OUTCOMES``.
    """
    if rec.outcome not in OUTCOMES:
        raise ValueError(f"outcome: {rec.outcome!r} is not one of {', '.join(OUTCOMES)}")
    return {
        "tenant": tenant,
        "action_id": rec.action_id,
        "queue": rec.queue,
        "run": rec.run or rec.action_id,
        "task": rec.task or rec.action_id,
        "cluster": rec.cluster,
        "submitted_at": rec.submitted_at,
        "admitted_at": rec.admitted_at,
        "ended_at": rec.ended_at,
        "outcome": rec.outcome,
        "reason": rec.reason or rec.outcome,
        "reasons": json.dumps(list(rec.reasons)),
        "kind": rec.kind,
        "pod_count": len(rec.pods),
        "pods": json.dumps(rec.pods, sort_keys=True),
        "demand": json.dumps(rec.demand, sort_keys=True),
        "estimate": rec.estimate,
        "environment": rec.environment,
    }


def _from_row(r: Any) -> Finished:
    return Finished(
        action_id=r.action_id,
        queue=r.queue,
        submitted_at=r.submitted_at,
        ended_at=r.ended_at,
        outcome=r.outcome,
        reason=r.reason,
        run=r.run,
        task=r.task,
        cluster=r.cluster,
        admitted_at=r.admitted_at,
        reasons=json.loads(r.reasons),
        kind=r.kind,
        pods=json.loads(r.pods),
        demand=json.loads(r.demand),
        estimate=r.estimate,
        environment=r.environment,
    )
