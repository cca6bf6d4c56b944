"""A backlog in the store drains through the scheduler in bites, each its own task."""

from __future__ import annotations

from typing import Any

import pytest
from headway import protocol
from headway.store import LeaseStore
from headway.workflows import client as hw
from headway.workflows.scheduler import BITE, WINDOW
from headway.workflows.shared import SYNC_ACTIVITY
from temporalio.api.enums.v1 import EventType

from .conftest import Plane
from .test_lifecycle import eventually, setup_queue

pytestmark = pytest.mark.integration


def bulk_rows(n: int) -> Any:
    """Leases whose workflows do not exist: each is dispatched, found gone, released."""
    for i in range(n):
        spec = {"id": f"b{i}", "queue": "default", "pods": [{"cpu": 100}], "kind": "single"}
        yield (f"b{i}", "default", f"gone-b{i}", spec, float(i))


async def drained(plane: Plane, tenant: str) -> bool:
    if plane.store.lease_count(tenant):
        return False
    q = (await hw.get_queues(plane.client, tenant))["default"]
    return bool(q["waiting"] == 0 and q["running"] == 0)


async def test_a_backlog_is_claimed_in_bites_and_refilled_by_a_regular_activity(
    plane: Plane, tenant: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    claims: list[tuple[int, int]] = []  # (max_leases asked, leases claimed) per sync
    real_sync = LeaseStore.sync

    def sync(self: LeaseStore, t: str, *a: Any, **kw: Any) -> Any:
        res = real_sync(self, t, *a, **kw)
        if t == tenant:
            claims.append((kw["max_leases"], len(res.leases)))
        return res

    monkeypatch.setattr(LeaseStore, "sync", sync)
    await setup_queue(plane, tenant)
    n = WINDOW + 2 * BITE + 30  # more than a window: refills come from the backlog
    plane.store.put_many(tenant, bulk_rows(n))
    await hw.nudge_scheduler(plane.client, tenant, ["default"])
    await eventually(lambda: drained(plane, tenant), timeout=60)

    assert sum(got for _, got in claims) == n
    assert all(asked == BITE and got <= BITE for asked, got in claims), claims
    sched = plane.client.get_workflow_handle(protocol.scheduler_workflow_id(tenant))
    events = [e async for e in sched.fetch_history_events()]
    remote = [
        e
        for e in events
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
        and e.activity_task_scheduled_event_attributes.activity_type.name == SYNC_ACTIVITY
    ]
    # Every bite after the first few came by a regular activity, not a 1 ms timer.
    assert len(remote) >= n // BITE - 2
    timers = [
        e.timer_started_event_attributes.start_to_fire_timeout.ToMilliseconds()
        for e in events
        if e.event_type == EventType.EVENT_TYPE_TIMER_STARTED
    ]
    assert all(ms > 1 for ms in timers), timers
