"""Durability: continue-as-new with pending work, and a control-plane worker killed mid-run."""

from __future__ import annotations

import asyncio

import pytest
from headway import protocol
from headway.activities.store import LAZY_END_NUDGE_S
from headway.workflows import client as hw
from headway.workflows.action import ActionWorkflow
from headway.workflows.scheduler import SchedulerWorkflow
from headway.workflows.shared import DISPATCH_ACTIVITY, SYNC_ACTIVITY, SchedulerInput
from temporalio.client import WorkflowQueryFailedError
from temporalio.worker import Replayer

from .conftest import Plane
from .test_lifecycle import _queue_idle, eventually, req

pytestmark = pytest.mark.integration


async def start_scheduler_continuing_often(plane: Plane, tenant: str) -> None:
    """A scheduler that continues as new every 30 events, over a 3-at-a-time queue."""
    await plane.client.start_workflow(
        SchedulerWorkflow.run,
        SchedulerInput(tenant=tenant, fleet=[c.to_dict() for c in plane.fleet], max_history=30),
        id=protocol.scheduler_workflow_id(tenant),
        task_queue=protocol.CONTROL_TASK_QUEUE,
    )
    await hw.upsert_queue(plane.client, tenant, {"name": "default", "action_concurrency": 3})


async def test_continue_as_new_with_pending_work_loses_nothing(plane: Plane, tenant: str) -> None:
    # A low history cap forces several continue-as-new while work waits and runs.
    await start_scheduler_continuing_often(plane, tenant)
    first = await plane.client.get_workflow_handle(
        protocol.scheduler_workflow_id(tenant)
    ).describe()
    handles = [
        await hw.submit(plane.client, req(tenant, f"c{i}", duration_s=0.2)) for i in range(15)
    ]
    results = [await hw.wait_result(h) for h in handles]
    assert [r.state for r in results] == ["succeeded"] * 15
    assert sorted(plane.cluster.finished) == sorted(f"c{i}" for i in range(15))
    assert len(plane.cluster.started) == 15  # admitted exactly once each
    h = plane.client.get_workflow_handle(protocol.scheduler_workflow_id(tenant))
    # A query that lands just as a run continues as new is answered by the closing run's
    # replay and can fail; the next one reaches the new run. (Every run's history replays
    # cleanly: see test_every_scheduler_run_replays.)
    for attempt in range(20):
        try:
            stats = await h.query("stats")
            break
        except WorkflowQueryFailedError:
            if attempt == 19:
                raise
            await asyncio.sleep(0.2)
    assert stats["continued"], stats
    assert stats["run_id"] != first.run_id
    # The queue config survived, and nothing is left reserved.
    queues = await hw.get_queues(plane.client, tenant)
    assert queues["default"]["spec"]["action_concurrency"] == 3
    await eventually(lambda: _queue_idle(plane.client, tenant, "default"))


async def test_control_plane_worker_killed_mid_run(plane: Plane, tenant: str) -> None:
    await hw.upsert_queue(
        plane.client, tenant, {"name": "default", "action_concurrency": 4}, plane.fleet
    )
    handles = [
        await hw.submit(plane.client, req(tenant, f"k{i}", duration_s=0.5)) for i in range(12)
    ]
    await eventually(lambda: len(plane.cluster.started) >= 2)
    await plane.stop_control()  # the control plane goes away with work waiting and running
    await asyncio.sleep(1.0)
    await plane.start_control()
    results = [await hw.wait_result(h) for h in handles]
    assert [r.state for r in results] == ["succeeded"] * 12
    # Every action ran to completion exactly once on the cluster.
    assert sorted(plane.cluster.finished) == sorted(f"k{i}" for i in range(12))
    assert len(plane.cluster.started) == 12
    await eventually(lambda: _queue_idle(plane.client, tenant, "default"))
    await eventually(lambda: plane.store.pending_count(tenant) == 0)


async def test_every_scheduler_run_replays(plane: Plane, tenant: str) -> None:
    """Several continue-as-new runs with work in flight; each run's history replays."""
    await start_scheduler_continuing_often(plane, tenant)
    handles = [
        await hw.submit(plane.client, req(tenant, f"r{i}", duration_s=0.2)) for i in range(15)
    ]
    for h in handles:
        assert (await hw.wait_result(h)).state == "succeeded"
    wid = protocol.scheduler_workflow_id(tenant)
    runs = [w async for w in plane.client.list_workflows(f"WorkflowId = '{wid}'")]
    assert len(runs) >= 2
    replayer = Replayer(
        workflows=[ActionWorkflow, SchedulerWorkflow], data_converter=protocol.data_converter()
    )
    replayed = 0
    for w in runs:
        hist = await plane.client.get_workflow_handle(wid, run_id=w.run_id).fetch_history()
        if not any(e.HasField("workflow_task_completed_event_attributes") for e in hist.events):
            # A run continued into a moment ago, its first task not yet done (its history
            # can be the started event alone): nothing to replay, and the replayer would
            # wait for a task that is not there.
            continue
        res = await replayer.replay_workflow(hist, raise_on_replay_failure=False)
        assert res.replay_failure is None, (w.run_id, res.replay_failure)
        replayed += 1
    assert replayed >= 2


async def test_control_plane_worker_killed_while_a_backlog_refills_in_bites(
    plane: Plane, tenant: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Refills by a regular sync activity survive the worker: each action runs once."""
    import headway.workflows.scheduler as sched

    monkeypatch.setattr(sched, "WINDOW", 8)  # a backlog beyond the window, in bites of 3
    monkeypatch.setattr(sched, "BITE", 3)
    await hw.upsert_queue(
        plane.client, tenant, {"name": "default", "action_concurrency": 6}, plane.fleet
    )
    n = 30
    # All at once: each submit answers only once its door decided (update-with-start), so
    # one after another they would drain as fast as they come, leaving no backlog.
    handles = await asyncio.gather(
        *(hw.submit(plane.client, req(tenant, f"r{i}", duration_s=0.2)) for i in range(n))
    )
    await eventually(lambda: len(plane.cluster.finished) >= 6)
    await plane.stop_control()
    await asyncio.sleep(1.0)
    await plane.start_control()
    results = [await hw.wait_result(h) for h in handles]
    assert [r.state for r in results] == ["succeeded"] * n
    assert sorted(plane.cluster.finished) == sorted(f"r{i}" for i in range(n))
    assert len(plane.cluster.started) == n  # admitted exactly once each
    events = [
        e
        async for e in plane.client.get_workflow_handle(
            protocol.scheduler_workflow_id(tenant)
        ).fetch_history_events()
    ]
    assert any(
        e.HasField("activity_task_scheduled_event_attributes")
        and e.activity_task_scheduled_event_attributes.activity_type.name == SYNC_ACTIVITY
        for e in events
    ), "no refill came by a regular sync activity"


async def test_continue_as_new_delivers_decisions_first_and_carries_none(
    plane: Plane, tenant: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Admissions decided but not yet dispatched are delivered before a run continues as
    new, so the carried state is the core's window, never a pile of undelivered
    decisions (up to MAX_UNDELIVERED of them, ~600 KB, measured while a paced backlog
    drained).

    The run is made to continue as new in the very task whose pass admits a backlog:
    24 actions wait behind ``action_concurrency: 0``, the history limit drops to 1 (any
    task then ends its run), and the limit on the queue is lifted. That pass admits all
    24 and one dispatch of one admission may run at a time, so 23 are undelivered when
    the run must continue. (Left to timing, as this test once was, every admission
    could be delivered by chained local activities within three tasks, before the
    history was long enough to continue at all.)
    """
    import headway.workflows.scheduler as sched

    # One admission per dispatch, one dispatch at a time: decisions queue up undelivered.
    monkeypatch.setattr(sched, "DISPATCH_BATCH", 1)
    monkeypatch.setattr(sched, "MAX_DISPATCH_INFLIGHT", 1)
    await plane.client.start_workflow(
        SchedulerWorkflow.run,
        SchedulerInput(tenant=tenant, fleet=[c.to_dict() for c in plane.fleet]),
        id=protocol.scheduler_workflow_id(tenant),
        task_queue=protocol.CONTROL_TASK_QUEUE,
    )
    await hw.upsert_queue(plane.client, tenant, {"name": "default", "action_concurrency": 0})
    n = 24
    handles = await asyncio.gather(
        *(hw.submit(plane.client, req(tenant, f"d{i}", duration_s=0.1)) for i in range(n))
    )

    async def all_waiting() -> bool:
        return bool((await hw.get_queues(plane.client, tenant))["default"]["waiting"] == n)

    await eventually(all_waiting)
    assert plane.cluster.started == []
    limit = sched.MAX_HISTORY
    monkeypatch.setattr(sched, "MAX_HISTORY", 1)
    await hw.update_queue(plane.client, tenant, "default", {"action_concurrency": None})
    # The task that took the update decided to continue; the runs after it must not
    # (they would continue at once, again and again). The next run starts only once the
    # 23 undelivered admissions went out one dispatch activity at a time.
    monkeypatch.setattr(sched, "MAX_HISTORY", limit)
    results = [await hw.wait_result(h) for h in handles]
    assert [r.state for r in results] == ["succeeded"] * n
    assert sorted(plane.cluster.started) == sorted(f"d{i}" for i in range(n))  # once each
    # Every run, newest first, by the chain of continued runs (visibility lags).
    wid = protocol.scheduler_workflow_id(tenant)
    converter = protocol.data_converter()
    delivered_first, runs, run_id = 0, 0, ""
    while True:
        hist = await plane.client.get_workflow_handle(wid, run_id=run_id or None).fetch_history()
        runs += 1
        started = hist.events[0].workflow_execution_started_event_attributes
        (inp,) = await converter.decode(started.input.payloads, [SchedulerInput])
        if inp.carried is not None:
            assert inp.carried["admit"] == [] and inp.carried["reject"] == [], run_id
        regular = [
            i
            for i, e in enumerate(hist.events)
            if e.HasField("activity_task_scheduled_event_attributes")
            and e.activity_task_scheduled_event_attributes.activity_type.name == DISPATCH_ACTIVITY
        ]
        # A continued run (not the newest) that delivered by regular activities: a serial
        # run (patch ``serial-inputs``) does so only on its way to continue as new; small
        # batches otherwise go by local ones.
        if run_id and regular:
            delivered_first += 1
        run_id = started.continued_execution_run_id
        if not run_id:
            break
    assert runs >= 2
    # The path was taken: some run continued with decisions still to deliver.
    assert delivered_first >= 1


async def test_a_lost_nudge_costs_a_safety_interval_not_the_work(
    plane: Plane, tenant: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A lease whose nudge never went out (its sender flipped the store's flag and died)
    is taken by the scheduler's own sync, a safety interval after its last."""
    import headway.workflows.scheduler as sched

    monkeypatch.setattr(sched, "SAFETY_SYNC_IDLE_S", 1.0)
    monkeypatch.setattr(sched, "SAFETY_SYNC_BUSY_S", 1.0)
    await hw.upsert_queue(plane.client, tenant, {"name": "default"}, plane.fleet)
    await hw.wait_result(await hw.submit(plane.client, req(tenant, "first", duration_s=0.1)))
    handle = plane.client.get_workflow_handle(protocol.scheduler_workflow_id(tenant))
    await asyncio.sleep(LAZY_END_NUDGE_S + 0.5)  # the end's own nudge has come and gone
    before = (await handle.query("stats"))["safety_syncs"]
    # Written as a submitter would, flag included, and then no signal.
    spec = {"id": "quiet", "queue": "default", "pods": [{"cpu": 100, "memory": 2**20}]}
    assert plane.store.put_lease(tenant, "quiet", "default", "gone-quiet", spec, 1.0).nudge
    await eventually(lambda: plane.store.pending_count(tenant) == 0, timeout=20)
    assert (await handle.query("stats"))["safety_syncs"] > before
