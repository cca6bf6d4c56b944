"""A queue's ``max_queued_time``, live (issue #23): an action still waiting when its time
is up is rejected ``QueuedTooLong`` with the limit and what would let it run, its lease
released and its workflow completed as rejected (not failed); one that starts in time,
and one on a queue without the limit, are untouched.

On the real dev server with the control-plane worker in-process (SQLite store) and the
fake cluster of ``conftest``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import pytest
from headway import protocol
from headway.protocol import DemandRequest, SubmitRequest
from headway.sdk.client import QueuedTooLong, rejection
from headway.workflows import client as hw
from temporalio.client import WorkflowExecutionStatus

from .conftest import Plane
from .test_lifecycle import _queue_idle, eventually

pytestmark = pytest.mark.integration


def _idle(plane: Plane, tenant: str, queue: str) -> Callable[[], Awaitable[bool]]:
    return lambda: _queue_idle(plane.client, tenant, queue)


def req(tenant: str, action_id: str, queue: str) -> SubmitRequest:
    demand = DemandRequest(resources={"cpu": "1", "memory": "1Gi"})
    return SubmitRequest(
        action_id=action_id, queue=queue, demand=demand, tenant=tenant, duration_s=0.1
    )


async def test_an_action_waiting_past_max_queued_time_is_rejected_with_its_reason(
    plane: Plane, tenant: str
) -> None:
    # "stuck" starts nothing (action concurrency 0) and lets an action wait 2 s; "patient"
    # starts nothing either, without a limit; "quick" has the limit and room.
    for spec in (
        {"name": "stuck", "action_concurrency": 0, "max_queued_time": 2},
        {"name": "patient", "action_concurrency": 0},
        {"name": "quick", "max_queued_time": 2},
    ):
        await hw.upsert_queue(plane.client, tenant, spec, plane.fleet)
    subs = {
        a: await hw.submit_action(plane.client, req(tenant, a, q))
        for a, q in (("s1", "stuck"), ("s2", "stuck"), ("p1", "patient"), ("q1", "quick"))
    }
    for a, sub in subs.items():
        assert sub.answer is not None and sub.answer.accepted, a
    assert (await hw.wait_result(subs["q1"].handle)).state == "succeeded"
    for a in ("s1", "s2"):
        res = await hw.wait_result(subs[a].handle, action_id=a)
        assert (res.state, res.reason) == ("rejected", "QueuedTooLong"), res
        assert "in queue 'stuck' without starting; its max_queued_time is 2 s" in res.message
        assert "headway update queue stuck --max-queued-time D" in res.message
        # What an SDK task's result raises for it: its own class, exit code 3.
        err = rejection(tenant, a, "stuck", "QueuedTooLong", res.message)
        assert isinstance(err, QueuedTooLong) and err.exit_code == 3
        assert "--max-queued-time" in err.hint
        # An answer, not a crash: the workflow completed.
        desc = await subs[a].handle.describe()
        assert desc.status == WorkflowExecutionStatus.COMPLETED
    await eventually(lambda: plane.store.held_count(tenant, "stuck") == 0)
    # The queue without the limit still holds its action, waiting.
    assert (await hw.action_state(plane.client, tenant, "p1")).state == "waiting"
    assert plane.store.held_count(tenant, "patient") == 1
    print("\nmax_queued_time 2 s:", res.reason, "-", res.message)
    # The limit set live on "patient" expires its action too.
    await hw.update_queue(plane.client, tenant, "patient", {"max_queued_time": "1s"})
    res = await hw.wait_result(subs["p1"].handle, action_id="p1")
    assert (res.state, res.reason) == ("rejected", "QueuedTooLong")
    for q in ("stuck", "patient", "quick"):
        await eventually(_idle(plane, tenant, q))
    h = plane.client.get_workflow_handle(protocol.action_workflow_id(tenant, "p1"))
    assert (await h.describe()).status == WorkflowExecutionStatus.COMPLETED
