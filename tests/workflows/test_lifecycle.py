"""End-to-end lifecycle on a real dev server: submit -> admit -> run -> finish, and more."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections.abc import Callable
from typing import Any

import pytest
from headway import protocol
from headway.protocol import DemandRequest, SubmitRequest
from headway.store import WANTS_ENDS_CHANNEL
from headway.worker.control_plane import build_control_plane_worker
from headway.workflows import client as hw
from temporalio.client import Client, WorkflowUpdateFailedError

from .conftest import Plane

pytestmark = pytest.mark.integration


def req(tenant: str, action_id: str, queue: str = "default", **kw: object) -> SubmitRequest:
    demand = kw.pop("demand", None) or DemandRequest(resources={"cpu": "1", "memory": "1Gi"})
    return SubmitRequest(action_id=action_id, queue=queue, demand=demand, tenant=tenant, **kw)  # type: ignore[arg-type]


async def eventually(pred: Callable[[], object], timeout: float = 20.0) -> None:
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while not await _call(pred):
        if loop.time() > end:
            raise AssertionError("condition not reached")
        await asyncio.sleep(0.1)


async def _call(pred: Callable[[], object]) -> object:
    r = pred()
    if asyncio.iscoroutine(r):
        return await r
    return r


async def setup_queue(plane: Plane, tenant: str, **spec: object) -> dict[str, object]:
    return await hw.upsert_queue(plane.client, tenant, {"name": "default", **spec}, plane.fleet)


async def test_submit_admit_run_finish(plane: Plane, tenant: str) -> None:
    await setup_queue(plane, tenant)
    h = await hw.submit(plane.client, req(tenant, "a1", duration_s=0.1))
    res = await hw.wait_result(h)
    assert res.state == "succeeded", res
    assert res.cluster == "c1"
    assert plane.cluster.finished == ["a1"]
    st = await hw.action_state(plane.client, tenant, "a1")
    assert st.state == "succeeded"
    assert st.queue == "default"
    assert [e.kind for e in st.events][-1] == protocol.ActionEventKind.SUCCEEDED
    desc = await h.describe()
    sa = desc.typed_search_attributes
    from headway.workflows.action import SA

    assert sa.get(SA["HeadwayState"]) == "succeeded"
    assert sa.get(SA["HeadwayCluster"]) == "c1"
    assert sa.get(SA["HeadwayQueue"]) == "default"
    assert sa.get(SA["HeadwayTenant"]) == tenant
    # The release reached the scheduler: nothing waits or runs, the store is empty.
    await eventually(
        lambda: _queue_idle(plane.client, tenant, "default"),
    )
    await eventually(lambda: plane.store.pending_count(tenant) == 0)


async def _queue_idle(client: Client, tenant: str, queue: str) -> bool:
    q = (await hw.get_queues(client, tenant))[queue]
    return bool(q["waiting"] == 0 and q["running"] == 0)


async def test_oom_is_attributed(plane: Plane, tenant: str) -> None:
    await setup_queue(plane, tenant)
    h = await hw.submit(plane.client, req(tenant, "oom1", inject="oom"))
    res = await hw.wait_result(h)
    assert res.state == "failed"
    assert res.reason == "OOMKilled"
    assert res.exit_code == 137
    await eventually(lambda: _queue_idle(plane.client, tenant, "default"))


@pytest.mark.parametrize(
    ("revision", "state", "reason"),
    [(protocol.ACTION_REVISION, "succeeded", "Succeeded"), (2, "failed", "PodLost")],
    ids=["the-first-outcome-heard-stands", "revision-2-took-the-result-as-it-came"],
)
async def test_a_retry_finding_the_pods_deleted_after_success_does_not_fail_the_action(
    plane: Plane, tenant: str, revision: int, state: str, reason: str
) -> None:
    await setup_queue(plane, tenant)
    r = req(tenant, f"lost{revision}", inject="lost-after-success", revision=revision)
    res = await hw.wait_result(await hw.submit(plane.client, r))
    assert (res.state, res.reason) == (state, reason)


async def test_rejections(plane: Plane, tenant: str) -> None:
    await setup_queue(plane, tenant, status="draining")
    r1 = await hw.wait_result(await hw.submit(plane.client, req(tenant, "r1")))
    assert (r1.state, r1.reason) == ("rejected", "QueueDraining")
    r2 = await hw.wait_result(await hw.submit(plane.client, req(tenant, "r2", queue="nope")))
    assert (r2.state, r2.reason) == ("rejected", "UnknownQueue")
    bad = req(tenant, "r3", demand=DemandRequest(resources={"cpu": "lots"}))
    r3 = await hw.wait_result(await hw.submit(plane.client, bad))
    assert r3.state == "rejected"
    assert "cpu" in r3.message and "lots" in r3.message
    await eventually(lambda: plane.store.pending_count(tenant) == 0)


async def test_bad_queue_config_is_rejected_with_field(plane: Plane, tenant: str) -> None:
    await setup_queue(plane, tenant)
    with pytest.raises(WorkflowUpdateFailedError) as exc:
        await hw.upsert_queue(plane.client, tenant, {"name": "q2", "action_concurrency": -3})
    assert "action_concurrency" in str(exc.value.cause) and "-3" in str(exc.value.cause)
    with pytest.raises(WorkflowUpdateFailedError) as exc:
        await hw.update_queue(plane.client, tenant, "missing", {"depth": 3})
    assert "missing" in str(exc.value.cause)
    with pytest.raises(WorkflowUpdateFailedError) as exc:
        await hw.set_org(plane.client, tenant, {"max_concurrent_actions": "x"})
    assert "max_concurrent_actions" in str(exc.value.cause)
    queues = await hw.get_queues(plane.client, tenant)
    assert set(queues) == {"default"}


async def test_a_limit_past_the_bound_is_refused_by_the_shard_not_applied_and_wedged(
    plane: Plane, tenant: str
) -> None:
    # Sent straight to the scheduler workflow, as a client other than the CLI could: a
    # depth of 10**23 was once applied, then failed the store's 64-bit write on every
    # retry, and the tenant admitted nothing after it.
    await setup_queue(plane, tenant)
    huge = 10**23
    with pytest.raises(WorkflowUpdateFailedError) as exc:
        await hw.update_queue(plane.client, tenant, "default", {"depth": huge})
    assert "depth" in str(exc.value.cause) and "1,000,000,000" in str(exc.value.cause)
    with pytest.raises(WorkflowUpdateFailedError) as exc:
        await hw.set_org(plane.client, tenant, {"max_concurrent_actions": huge})
    assert "max_concurrent_actions" in str(exc.value.cause)
    with pytest.raises(WorkflowUpdateFailedError) as exc:
        await hw.upsert_queue(plane.client, tenant, {"name": "q2", "retry": {"failed": huge}})
    assert "retry.failed" in str(exc.value.cause)
    queues = await hw.get_queues(plane.client, tenant)
    assert set(queues) == {"default"}
    assert queues["default"]["spec"]["depth"] is None
    res = await hw.wait_result(await hw.submit(plane.client, req(tenant, "after")))
    assert res.state == "succeeded", res


async def test_cancel_while_waiting(plane: Plane, tenant: str) -> None:
    await setup_queue(plane, tenant, action_concurrency=0)
    h = await hw.submit(plane.client, req(tenant, "w1"))
    await eventually(lambda: _state_is(plane, tenant, "w1", "waiting"))
    await eventually(lambda: _why_state(plane, tenant, "w1", "waiting"))
    why = await hw.why(plane.client, tenant, "w1")
    assert why["reason"] == "ActionConcurrency"
    await h.cancel()
    res = await hw.wait_result(h)
    assert res.state == "cancelled", res
    assert plane.cluster.started == []
    await eventually(lambda: _why_state(plane, tenant, "w1", None))
    await eventually(lambda: _queue_idle(plane.client, tenant, "default"))
    await eventually(lambda: plane.store.pending_count(tenant) == 0)


async def test_cancel_while_running(plane: Plane, tenant: str) -> None:
    await setup_queue(plane, tenant)
    plane.cluster.gate = asyncio.Event()
    h = await hw.submit(plane.client, req(tenant, "run1"))
    await eventually(lambda: "run1" in plane.cluster.running)
    await eventually(lambda: _state_is(plane, tenant, "run1", "running"))
    await h.cancel()
    res = await hw.wait_result(h)
    assert res.state == "cancelled"
    assert plane.cluster.cancelled == ["run1"]
    assert plane.cluster.deleted == ["run1"]
    await eventually(lambda: _queue_idle(plane.client, tenant, "default"))
    await eventually(lambda: plane.store.pending_count(tenant) == 0)


async def test_live_queue_update_keeps_inflight(plane: Plane, tenant: str) -> None:
    await setup_queue(plane, tenant)
    plane.cluster.gate = asyncio.Event()
    handles = [await hw.submit(plane.client, req(tenant, f"l{i}")) for i in range(3)]
    await eventually(lambda: len(plane.cluster.running) == 3)
    spec = await hw.update_queue(plane.client, tenant, "default", {"action_concurrency": 1})
    assert spec["action_concurrency"] == 1
    more = await hw.submit(plane.client, req(tenant, "l3"))
    await eventually(lambda: _why_state(plane, tenant, "l3", "waiting"))
    assert (await hw.why(plane.client, tenant, "l3"))["reason"] == "ActionConcurrency"
    assert len(plane.cluster.running) == 3  # nothing in flight was touched
    plane.cluster.gate.set()
    results = [await hw.wait_result(h) for h in [*handles, more]]
    assert [r.state for r in results] == ["succeeded"] * 4
    assert sorted(plane.cluster.finished) == ["l0", "l1", "l2", "l3"]


async def test_scheduler_keeps_wants_ends_while_work_waits(plane: Plane, tenant: str) -> None:
    """Ends nudge at once only while work waits; the scheduler keeps the store told."""
    await setup_queue(plane, tenant, action_concurrency=1)
    plane.cluster.gate = asyncio.Event()
    first = await hw.submit(plane.client, req(tenant, "w0"))
    await eventually(lambda: len(plane.cluster.running) == 1)
    assert not plane.store.flag(tenant, WANTS_ENDS_CHANNEL)  # nothing waits yet
    second = await hw.submit(plane.client, req(tenant, "w1"))
    await eventually(lambda: plane.store.flag(tenant, WANTS_ENDS_CHANNEL))
    plane.cluster.gate.set()
    assert [(await hw.wait_result(h)).state for h in (first, second)] == ["succeeded"] * 2
    # w1's end comes lazily, and its sync says that nothing waits any more.
    await eventually(lambda: _queue_idle(plane.client, tenant, "default"))
    await eventually(lambda: not plane.store.flag(tenant, WANTS_ENDS_CHANNEL))


@pytest.mark.parametrize(
    ("admit_wait_s", "signals"),
    [
        pytest.param(None, 0, id="admission-handed-over-in-the-first-task"),
        pytest.param(0.0, 1, id="admit-wait-0-admission-comes-by-signal"),
    ],
)
async def test_admit_wait_is_the_workers_choice(
    plane: Plane, tenant: str, admit_wait_s: float | None, signals: int
) -> None:
    await plane.stop_control()
    worker = build_control_plane_worker(
        plane.client, plane.store, plane.fleet, admit_wait_s=admit_wait_s
    )
    async with worker:
        await setup_queue(plane, tenant)
        h = await hw.submit(plane.client, req(tenant, "aw"))
        assert (await hw.wait_result(h)).state == "succeeded"
        events = [e async for e in h.fetch_history_events()]
    admits = [
        e
        for e in events
        if e.HasField("workflow_execution_signaled_event_attributes")
        and e.workflow_execution_signaled_event_attributes.signal_name == protocol.ADMIT_SIGNAL
    ]
    assert len(admits) == signals


async def _state_is(plane: Plane, tenant: str, action_id: str, state: str) -> bool:
    try:
        st = await hw.action_state(plane.client, tenant, action_id)
    except Exception:
        return False
    return st.state == state


async def _why_state(plane: Plane, tenant: str, action_id: str, state: str | None) -> bool:
    try:
        w = await hw.why(plane.client, tenant, action_id)
    except Exception:
        return False
    return bool(w["state"] == state)


async def test_scheduler_started_by_config_call_learns_fleet_from_worker(
    plane: Plane, tenant: str
) -> None:
    await hw.upsert_queue(plane.client, tenant, {"name": "default"})  # no fleet given
    res = await hw.wait_result(await hw.submit(plane.client, req(tenant, "f1")))
    assert (res.state, res.cluster) == ("succeeded", "c1")
    fleet = await hw.get_fleet(plane.client, tenant)
    assert fleet["clusters"] == ["c1"]


async def test_capacity_report_reconciles_reservations(plane: Plane, tenant: str) -> None:
    """A report that already counts a running action's pods must not count them twice."""
    await setup_queue(plane, tenant)
    plane.cluster.gate = asyncio.Event()
    eight = DemandRequest(resources={"cpu": "8", "memory": "1Gi"})
    a = await hw.submit(plane.client, req(tenant, "cap-a", demand=eight))
    await eventually(lambda: "cap-a" in plane.cluster.running)
    sched = plane.client.get_workflow_handle(protocol.scheduler_workflow_id(tenant))
    gi = 2**30
    node = protocol.NodeCapacity(
        "cpu-0", cpu_m=16000, memory=64 * gi, free_cpu_m=8000, free_memory=63 * gi
    )
    # The worker sees cap-a's pod on cpu-0 (8 of 16 cores free) and says so.
    await sched.signal(
        protocol.CAPACITY_SIGNAL,
        protocol.CapacityReport("c1", [node], reflected_actions=["cap-a"], sequence=1),
    )
    b = await hw.submit(plane.client, req(tenant, "cap-b", demand=eight))
    await eventually(lambda: "cap-b" in plane.cluster.running)  # not double counted
    c = await hw.submit(plane.client, req(tenant, "cap-c", demand=eight))
    await eventually(lambda: _why_state(plane, tenant, "cap-c", "waiting"))
    assert (await hw.why(plane.client, tenant, "cap-c"))["reason"] == "NoClusterCapacity"
    # A report of unknown capacity (the worker cannot read nodes) opens the gate.
    await sched.signal(protocol.CAPACITY_SIGNAL, protocol.CapacityReport("c1", None, sequence=2))
    await eventually(lambda: "cap-c" in plane.cluster.running)
    plane.cluster.gate.set()
    for h in (a, b, c):
        assert (await hw.wait_result(h)).state == "succeeded"
    await eventually(lambda: _queue_idle(plane.client, tenant, "default"))


def _upserted(hist: Any) -> list[dict[str, str]]:
    """Each search-attribute upsert of a history, as {name: decoded value}."""
    out = []
    for e in hist.events:
        if e.HasField("upsert_workflow_search_attributes_event_attributes"):
            fields = e.upsert_workflow_search_attributes_event_attributes.search_attributes
            out.append({k: json.loads(v.data) for k, v in fields.indexed_fields.items()})
    return out


@pytest.mark.parametrize(
    ("revision", "patch_markers", "start_attrs"),
    [
        pytest.param(None, 0, False, id="submit-stamps-today's-revision-attributes-in-first-task"),
        pytest.param(1, 0, True, id="revision-1-input-starts-with-attributes-no-markers"),
        pytest.param(0, 2, True, id="revision-0-input-takes-the-patched-path"),
    ],
)
async def test_revision_decides_the_path_without_patch_markers(
    plane: Plane, tenant: str, revision: int | None, patch_markers: int, start_attrs: bool
) -> None:
    """Today's submissions skip ``workflow.patched`` (each call records a marker and
    upserts TemporalChangeVersion) and write their search attributes in the first task,
    not at start; inputs recorded by older clients still run their own paths."""
    from headway.workflows.action import ActionWorkflow, start_attributes

    await setup_queue(plane, tenant)
    r = req(tenant, f"rev{revision}")
    if revision is None:
        h = await hw.submit(plane.client, r)
    else:  # what an older client started (revision 0: no revision in the input)
        r = dataclasses.replace(r, revision=revision)
        sa, memo = start_attributes(r)
        h = await plane.client.start_workflow(
            ActionWorkflow.run,
            r,
            id=protocol.action_workflow_id(tenant, r.action_id),
            task_queue=protocol.CONTROL_TASK_QUEUE,
            search_attributes=sa,
            memo=memo,
        )
    res = await hw.wait_result(h)
    assert res.state == "succeeded", res
    hist = await h.fetch_history()
    markers = [
        e.marker_recorded_event_attributes.marker_name
        for e in hist.events
        if e.HasField("marker_recorded_event_attributes")
    ]
    assert markers.count("core_patch") == patch_markers
    started = hist.events[0].workflow_execution_started_event_attributes
    assert bool(started.search_attributes.indexed_fields) == start_attrs
    assert started.memo.fields["queue"].data  # the memo is there from the start
    upserts = [u for u in _upserted(hist) if "TemporalChangeVersion" not in u]
    # Admission and end; today's revision adds a "waiting" write first only when the
    # admission missed the first task (the in-process wait timed out).
    waited = 1 if not start_attrs and upserts[0].get("HeadwayState") == "waiting" else 0
    assert len(upserts) == 2 + waited
    assert len(_upserted(hist)) == len(upserts) + patch_markers
    if not start_attrs:
        first = upserts[0]
        assert first["HeadwayQueue"] == "default"
        assert first["HeadwayTenant"] == tenant
        assert first["HeadwayRun"] == r.action_id
    desc = await h.describe()
    from headway.workflows.action import SA

    assert desc.typed_search_attributes.get(SA["HeadwayState"]) == "succeeded"
    assert desc.typed_search_attributes.get(SA["HeadwayQueue"]) == "default"


async def test_every_workflow_of_a_tenant_carries_it_as_fairness_key(
    plane: Plane, tenant: str
) -> None:
    """Task-queue fairness by shard: actions, their scheduler, and (inherited) activities."""
    await setup_queue(plane, tenant)
    h = await hw.submit(plane.client, req(tenant, "fk"))
    assert (await hw.wait_result(h)).state == "succeeded"
    sched = plane.client.get_workflow_handle(protocol.scheduler_workflow_id(tenant))
    for handle in (h, sched):
        events = [e async for e in handle.fetch_history_events()]
        started = events[0].workflow_execution_started_event_attributes
        assert started.priority.fairness_key == tenant
    # The cluster activity inherits it (nothing set on it explicitly).
    events = [e async for e in h.fetch_history_events()]
    scheduled = [
        e.activity_task_scheduled_event_attributes
        for e in events
        if e.HasField("activity_task_scheduled_event_attributes")
    ]
    assert scheduled and all(not a.priority.fairness_key for a in scheduled)
