"""A regular dispatch whose control-plane worker died mid-batch (kill -9: no result, no
more heartbeats) is retried after the heartbeat timeout, not the attempt's whole
start-to-close timeout: the admissions it carried wait seconds, not a minute.

Live: a real dev server, the real control-plane worker and scheduler workflow; the
worker's first regular dispatch hangs without heartbeats, as a dead worker's would.
"""

from __future__ import annotations

import asyncio
from datetime import timedelta

import pytest
from headway import protocol
from headway.activities import dispatch as dispatch_module
from headway.activities.dispatch import DispatchActivities
from headway.workflows import client as hw
from headway.workflows.scheduler import REMOTE_DISPATCH_HEARTBEAT_S, REMOTE_DISPATCH_TIMEOUT_S
from headway.workflows.shared import DISPATCH_ACTIVITY, DispatchBatch, DispatchResult
from temporalio import activity
from temporalio.api.enums.v1 import TimeoutType

from .conftest import Plane
from .test_lifecycle import eventually, req, setup_queue

pytestmark = pytest.mark.integration


async def test_a_dispatch_lost_with_its_worker_is_retried_after_the_heartbeat_timeout(
    plane: Plane, tenant: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = DispatchActivities._dispatch
    attempts: list[list[str]] = []
    release = asyncio.Event()

    async def first_one_dies(self: DispatchActivities, batch: DispatchBatch) -> DispatchResult:
        if activity.info().is_local or not batch.admissions:
            return await real(self, batch)
        attempts.append([a.admission.action_id for a in batch.admissions])
        if len(attempts) == 1:
            # The worker "died" here: this attempt never answers (released at teardown).
            await release.wait()
            return DispatchResult()
        return await real(self, batch)

    async def dead_worker_sends_no_heartbeat(every_s: float) -> None:
        await asyncio.Event().wait()

    monkeypatch.setattr(DispatchActivities, "_dispatch", first_one_dies)
    monkeypatch.setattr(dispatch_module, "_beating", dead_worker_sends_no_heartbeat)
    try:
        await setup_queue(plane, tenant, action_concurrency=1)
        plane.cluster.gate = asyncio.Event()
        first = await hw.submit(plane.client, req(tenant, "d0"))
        await eventually(lambda: len(plane.cluster.running) == 1)
        second = await hw.submit(plane.client, req(tenant, "d1"))
        await eventually(lambda: _reason(plane, tenant, "d1", "ActionConcurrency"))
        # d0 ends: d1 is admitted, long after its first task stopped waiting, so its
        # admission goes by a regular dispatch: the one that dies.
        plane.cluster.gate.set()
        res = await asyncio.wait_for(hw.wait_result(second), REMOTE_DISPATCH_TIMEOUT_S)
        assert res.state == "succeeded", res
        assert (await hw.wait_result(first)).state == "succeeded"
        assert attempts[:2] == [["d1"], ["d1"]], attempts  # the lost batch, then its retry
        # The server gave up on the lost attempt for its silence (the heartbeat timeout
        # the scheduler set), not at the end of its start-to-close timeout.
        assert await _retried_for(plane, tenant) == [
            (timedelta(seconds=REMOTE_DISPATCH_HEARTBEAT_S), TimeoutType.TIMEOUT_TYPE_HEARTBEAT)
        ]
    finally:
        release.set()


async def _retried_for(plane: Plane, tenant: str) -> list[tuple[timedelta, int]]:
    """Of the scheduler's regular dispatches: each retried one's heartbeat timeout and
    why its last attempt failed."""
    handle = plane.client.get_workflow_handle(protocol.scheduler_workflow_id(tenant))
    scheduled: dict[int, timedelta] = {}
    out: list[tuple[timedelta, int]] = []
    async for e in handle.fetch_history_events():
        if e.HasField("activity_task_scheduled_event_attributes"):
            a = e.activity_task_scheduled_event_attributes
            if a.activity_type.name == DISPATCH_ACTIVITY:
                scheduled[e.event_id] = a.heartbeat_timeout.ToTimedelta()
        elif e.HasField("activity_task_started_event_attributes"):
            s = e.activity_task_started_event_attributes
            if s.scheduled_event_id in scheduled and s.attempt > 1:
                failure = s.last_failure.timeout_failure_info.timeout_type
                out.append((scheduled[s.scheduled_event_id], int(failure)))
    return out


async def _reason(plane: Plane, tenant: str, action_id: str, reason: str) -> bool:
    why = await hw.why(plane.client, tenant, action_id)
    return bool(why.get("reason") == reason)
