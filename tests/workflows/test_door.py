"""Admission at the door, live (issue #23): every submission is answered in the submit
call itself (update-with-start), the queue's depth counts its whole backlog, the tenant's
submit rate is measured at each submission's time, and a refusal leaves nothing behind
(no lease, no waiting workflow: the workflow completed as rejected).

On the real dev server with the control-plane worker in-process (SQLite store) and the
fake cluster of ``conftest``. The depth test runs depth 60 / 70 submissions; with
``HEADWAY_DOOR_DEPTH=600`` it runs the issue's depth 600 / 700 submissions.
"""

from __future__ import annotations

import asyncio
import os
import re
import time
from collections.abc import Sequence

import pytest
from headway import protocol
from headway.protocol import DemandRequest, SubmitRequest
from headway.scheduler.reasons import Reason
from headway.sdk import Client as SdkClient
from headway.sdk import Resources, Task
from headway.sdk.client import (
    QueueDraining,
    QueueFull,
    RateLimited,
    SubmissionRejected,
    UnknownQueue,
)
from headway.workflows import client as hw
from temporalio.client import WorkflowExecutionStatus

from .conftest import Plane
from .test_lifecycle import _queue_idle, eventually

pytestmark = pytest.mark.integration

DEPTH = int(os.environ.get("HEADWAY_DOOR_DEPTH", "60"))
TASK = Task("t", Resources(cpu=1, memory="1Gi"), duration=0.1)


def req(tenant: str, action_id: str, queue: str) -> SubmitRequest:
    demand = DemandRequest(resources={"cpu": "1", "memory": "1Gi"})
    return SubmitRequest(action_id=action_id, queue=queue, demand=demand, tenant=tenant)


async def submit_all(
    sdk: SdkClient, queue: str, ids: Sequence[str], parallel: int = 16
) -> dict[str, SubmissionRejected | None]:
    """Submit every id (``parallel`` at a time); each one's answer, from its call."""
    out: dict[str, SubmissionRejected | None] = {}
    gate = asyncio.Semaphore(parallel)

    async def one(action_id: str) -> None:
        async with gate:
            try:
                action = await sdk.submit(TASK, queue=queue, id=action_id)
            except SubmissionRejected as err:
                out[action_id] = err
                return
            assert action.created and action.state in ("waiting", "running")
            out[action_id] = None

    await asyncio.gather(*(one(i) for i in ids))
    return out


async def left_behind(plane: Plane, tenant: str, ids: Sequence[str]) -> list[str]:
    """Of ``ids``, those with a lease or a workflow that is not a completed rejection."""
    bad: list[str] = []
    for action_id in ids:
        h = plane.client.get_workflow_handle(protocol.action_workflow_id(tenant, action_id))
        desc = await h.describe()
        res = await hw.wait_result(h, action_id=action_id)
        if desc.status != WorkflowExecutionStatus.COMPLETED or res.state != "rejected":
            bad.append(f"{action_id}: {desc.status} {res.state}")
    with plane.store.engine.connect() as conn:
        from headway.store import LeaseRow
        from sqlalchemy import select

        leased = {
            r[0]
            for r in conn.execute(
                select(LeaseRow.action_id).where(
                    (LeaseRow.tenant == tenant) & LeaseRow.action_id.in_(list(ids))
                )
            )
        }
    return bad + [f"{a}: lease" for a in sorted(leased)]


async def test_depth_counts_the_whole_backlog_each_answered_at_submit(
    plane: Plane, tenant: str
) -> None:
    # Nothing is admitted (action concurrency 0): the queue only fills, and what it holds
    # is far beyond the scheduler's in-memory window once DEPTH > 500.
    await hw.upsert_queue(
        plane.client,
        tenant,
        {"name": "deep", "depth": DEPTH, "action_concurrency": 0},
        plane.fleet,
    )
    sdk = SdkClient(plane.client, tenant=tenant)
    n = DEPTH + DEPTH // 6
    ids = [f"d{i}" for i in range(n)]
    t0 = time.monotonic()
    answers = await submit_all(sdk, "deep", ids)
    took = time.monotonic() - t0
    rejected = [a for a, e in answers.items() if e is not None]
    print(f"\ndepth {DEPTH}: {n} submissions, {len(rejected)} rejected, {took:.1f} s")
    assert len(rejected) == n - DEPTH
    for action_id in rejected:
        err = answers[action_id]
        assert isinstance(err, QueueFull), err
        assert err.reason == Reason.QueueDepthExceeded
        assert err.detail == (
            f"queue 'deep' holds {DEPTH} actions (waiting + running); its depth is {DEPTH}"
        )
    assert plane.store.held_count(tenant, "deep") == DEPTH
    assert await left_behind(plane, tenant, rejected[:20]) == []
    # Let the queue run dry, so that nothing of this tenant outlives the test.
    await hw.update_queue(plane.client, tenant, "deep", {"action_concurrency": None})
    await eventually(lambda: plane.store.held_count(tenant, "deep") == 0, timeout=120)
    await eventually(lambda: _queue_idle(plane.client, tenant, "deep"))


async def test_a_steady_stream_under_the_rate_is_never_rejected_and_a_burst_is_cut(
    plane: Plane, tenant: str
) -> None:
    await hw.upsert_queue(plane.client, tenant, {"name": "default"}, plane.fleet)
    await hw.set_org(plane.client, tenant, {"submit_rate": {"per_second": 10, "burst": 10}})
    sdk = SdkClient(plane.client, tenant=tenant)

    # 5/s for 10 s, each submission answered before the next one is sent.
    steady: dict[str, SubmissionRejected | None] = {}
    for i in range(50):
        started = asyncio.get_running_loop().time()
        steady.update(await submit_all(sdk, "default", [f"s{i}"]))
        await asyncio.sleep(max(0.0, 0.2 - (asyncio.get_running_loop().time() - started)))
    assert [a for a, e in steady.items() if e is not None] == []

    # Let the bucket fill, then 30/s for a second: each sent 1/30 s after the last,
    # without waiting for the answers.
    await asyncio.sleep(1.5)
    burst: dict[str, SubmissionRejected | None] = {}

    async def send(i: int) -> None:
        burst.update(await submit_all(sdk, "default", [f"b{i}"]))

    tasks = []
    for i in range(30):
        tasks.append(asyncio.create_task(send(i)))
        await asyncio.sleep(1 / 30)
    await asyncio.gather(*tasks)
    rejected = sorted(a for a, e in burst.items() if e is not None)
    accepted = 30 - len(rejected)
    print(
        f"\nrate 10/s burst 10: steady 5/s x 50 -> 0 rejected; 30/s x 30 -> {accepted} "
        f"accepted, {len(rejected)} rejected"
    )
    # At most the burst's 10 plus the refill between the first and the last decision:
    # each is at its submission's own time (its workflow's first task), not at a sync.
    times = [(await hw.action_state(plane.client, tenant, f"b{i}")).submitted_at for i in range(30)]
    span = max(times) - min(times)
    print(f"the burst's decisions spanned {span:.2f} s")
    assert 10 <= accepted <= 10 + int(10 * span) + 1, (accepted, span)
    assert rejected
    for action_id in rejected:
        err = burst[action_id]
        assert isinstance(err, RateLimited), err
        assert err.retry_after is not None and 0 < err.retry_after <= 0.1 + 1e-9
    assert await left_behind(plane, tenant, rejected) == []
    # The rate-limited id, resubmitted after its wait, goes in (same id: a retry).
    await asyncio.sleep(1.0)
    again = await sdk.submit(TASK, queue="default", id=rejected[0])
    assert again.created and again.state in ("waiting", "running")
    # Everything taken in runs to its end.
    taken = [a for a, e in {**steady, **burst}.items() if e is None] + [rejected[0]]
    for action_id in taken:
        h = plane.client.get_workflow_handle(protocol.action_workflow_id(tenant, action_id))
        assert (await hw.wait_result(h, action_id=action_id)).state == "succeeded"
    await eventually(lambda: _queue_idle(plane.client, tenant, "default"))


async def test_unknown_and_draining_queues_are_rejected_at_submit(
    plane: Plane, tenant: str
) -> None:
    await hw.upsert_queue(plane.client, tenant, {"name": "default"}, plane.fleet)
    await hw.upsert_queue(
        plane.client, tenant, {"name": "closing", "status": "draining"}, plane.fleet
    )
    sdk = SdkClient(plane.client, tenant=tenant)
    with pytest.raises(UnknownQueue) as unknown:
        await sdk.submit(TASK, queue="nope", id="u1")
    assert unknown.value.exit_code == 3
    assert "queue 'nope' does not exist" in str(unknown.value)
    assert "headway create queue nope" in unknown.value.hint
    with pytest.raises(QueueDraining) as draining:
        await sdk.submit(TASK, queue="closing", id="c1")
    # Draining, or drained already (it holds nothing): either way it takes nothing new.
    assert re.search(
        r"queue 'closing' is drain(ing|ed) and accepts no new work", str(draining.value)
    )
    assert await left_behind(plane, tenant, ["u1", "c1"]) == []
    # A queue set draining live refuses from its update's return on.
    await hw.update_queue(plane.client, tenant, "default", {"status": "draining"})
    with pytest.raises(QueueDraining):
        await sdk.submit(TASK, queue="default", id="c2")
    # The workflows API answers without raising: the answer and a completed workflow.
    sub = await hw.submit_action(plane.client, req(tenant, "c3", "default"))
    assert sub.answer is not None and not sub.answer.accepted
    assert (sub.state, sub.answer.reason) == ("rejected", "QueueDraining")
    res = await hw.wait_result(sub.handle)
    assert (res.state, res.reason) == ("rejected", "QueueDraining")
    assert re.fullmatch(r"queue 'default' is drain(ing|ed) and accepts no new work", res.message)


async def test_an_accepted_submission_is_answered_and_resubmitting_it_is_idempotent(
    plane: Plane, tenant: str
) -> None:
    await hw.upsert_queue(plane.client, tenant, {"name": "default"}, plane.fleet)
    sub = await hw.submit_action(plane.client, req(tenant, "ok1", "default"))
    assert sub.created and sub.answer is not None and sub.answer.accepted
    assert sub.state in ("waiting", "running")
    again = await hw.submit_action(plane.client, req(tenant, "ok1", "default"))
    assert not again.created and again.handle.id == sub.handle.id
    res = await hw.wait_result(sub.handle)
    assert res.state == "succeeded"
    await eventually(lambda: _queue_idle(plane.client, tenant, "default"))


async def test_the_same_submission_racing_itself_gets_the_door_answer_every_time(
    plane: Plane, tenant: str
) -> None:
    # A client retry (StartDeduped, a lost deadline) arrives while its first try is
    # still at the door: it must hear the door's answer, never "exists, waiting" for an
    # action that the door then refuses.
    await hw.upsert_queue(plane.client, tenant, {"name": "default"}, plane.fleet)
    refused = await asyncio.gather(
        *(hw.submit_action(plane.client, req(tenant, "race-x", "nowhere")) for _ in range(6))
    )
    assert [(s.state, s.answer and s.answer.reason) for s in refused] == [
        ("rejected", "UnknownQueue")
    ] * 6
    taken = await asyncio.gather(
        *(hw.submit_action(plane.client, req(tenant, "race-ok", "default")) for _ in range(6))
    )
    assert sum(s.created for s in taken) == 1
    for sub in taken:
        assert sub.answer is not None and sub.answer.accepted, sub
        assert sub.handle.id == taken[0].handle.id
    assert (await hw.wait_result(taken[0].handle)).state == "succeeded"


async def test_a_queues_own_rate_passes_a_steady_stream_and_cuts_a_burst_at_once(
    plane: Plane, tenant: str
) -> None:
    # The queue's own bucket (10/s, burst 10), set live by an update; the tenant has no
    # rate, and queue "open" beside it none: its burst is all taken in.
    await hw.upsert_queue(plane.client, tenant, {"name": "limited"}, plane.fleet)
    await hw.upsert_queue(plane.client, tenant, {"name": "open"}, plane.fleet)
    await hw.update_queue(
        plane.client, tenant, "limited", {"submit_rate": {"per_second": 10, "burst": 10}}
    )
    door = plane.store.door(tenant)
    assert (door["limited"]["rate"], door["limited"]["burst"]) == (10.0, 10.0)
    assert door["open"]["rate"] is None and door[""]["rate"] is None
    sdk = SdkClient(plane.client, tenant=tenant)
    loop = asyncio.get_running_loop()

    # 5/s for 6 s, each submission answered before the next one is sent.
    steady: dict[str, SubmissionRejected | None] = {}
    for i in range(30):
        started = loop.time()
        steady.update(await submit_all(sdk, "limited", [f"s{i}"]))
        await asyncio.sleep(max(0.0, 0.2 - (loop.time() - started)))
    assert [a for a, e in steady.items() if e is not None] == []

    # Let the bucket fill, then 30/s for a second to each queue, without waiting for
    # the answers.
    await asyncio.sleep(1.5)
    burst: dict[str, SubmissionRejected | None] = {}

    async def send(queue: str, action_id: str) -> None:
        burst.update(await submit_all(sdk, queue, [action_id]))

    tasks = []
    for i in range(30):
        tasks.append(asyncio.create_task(send("limited", f"b{i}")))
        tasks.append(asyncio.create_task(send("open", f"o{i}")))
        await asyncio.sleep(1 / 30)
    await asyncio.gather(*tasks)
    rejected = sorted(a for a, e in burst.items() if e is not None)
    mine = [f"b{i}" for i in range(30)]
    accepted = sum(burst[a] is None for a in mine)
    times = [(await hw.action_state(plane.client, tenant, a)).submitted_at for a in mine]
    span = max(times) - min(times)
    print(
        f"\nqueue rate 10/s burst 10: steady 5/s x 30 -> 0 rejected; 30/s x 30 -> "
        f"{accepted} accepted, {30 - accepted} rejected (decisions over {span:.2f} s); "
        f"the unlimited queue beside it: 30 of 30 accepted"
    )
    assert all(a.startswith("b") for a in rejected)  # "open" took all of its burst
    assert 10 <= accepted <= 10 + int(10 * span) + 1, (accepted, span)
    assert rejected
    for action_id in rejected:
        err = burst[action_id]
        assert isinstance(err, RateLimited), err
        assert err.retry_after is not None and 0 < err.retry_after <= 0.1 + 1e-9
        assert "queue 'limited''s submit rate (10/s, burst 10) is exhausted" in str(err)
    assert await left_behind(plane, tenant, rejected) == []
    # Everything taken in runs to its end.
    for action_id in [a for a, e in {**steady, **burst}.items() if e is None]:
        h = plane.client.get_workflow_handle(protocol.action_workflow_id(tenant, action_id))
        assert (await hw.wait_result(h, action_id=action_id)).state == "succeeded"
    await eventually(lambda: _queue_idle(plane.client, tenant, "limited"))
    await eventually(lambda: _queue_idle(plane.client, tenant, "open"))


async def test_a_store_that_lost_its_door_gets_it_back_from_the_running_shard(
    plane: Plane, tenant: str
) -> None:
    # A store restored from a backup (or a new database under a running shard) has no
    # door: submissions pass it undecided and the scheduler decides them, late. The
    # first such lease makes the shard put its door again, so the next is answered at
    # the door.
    await hw.upsert_queue(plane.client, tenant, {"name": "default"}, plane.fleet)
    first = await hw.submit_action(plane.client, req(tenant, "lost-0", "nowhere"))
    assert first.answer is not None and first.answer.reason == "UnknownQueue"
    from headway.store import DoorRow
    from sqlalchemy import delete

    with plane.store.engine.begin() as conn:
        conn.execute(delete(DoorRow).where(DoorRow.tenant == tenant))
    late = await hw.submit_action(plane.client, req(tenant, "lost-1", "nowhere"))
    assert late.answer is not None and late.answer.accepted  # no door to refuse it
    res = await hw.wait_result(late.handle)
    assert (res.state, res.reason) == ("rejected", "UnknownQueue")  # the shard did

    async def door_back() -> bool:
        with plane.store.engine.connect() as conn:
            rows = conn.execute(DoorRow.__table__.select().where(DoorRow.tenant == tenant))
            return bool(rows.all())

    await eventually(door_back)
    again = await hw.submit_action(plane.client, req(tenant, "lost-2", "nowhere"))
    assert again.answer is not None and again.answer.reason == "UnknownQueue"
