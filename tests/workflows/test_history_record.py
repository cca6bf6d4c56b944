"""The record of what ran (issue #28), live: every finished action is written once,
with its times, cluster, demand and outcome, through a control-plane worker restart."""

from __future__ import annotations

import asyncio

import pytest
from headway.store import LeaseStore
from headway.store.history import HistoryStore
from headway.workflows import client as hw

from .conftest import Plane
from .test_lifecycle import _queue_idle, eventually, req, setup_queue

pytestmark = pytest.mark.integration


async def test_every_finished_action_is_recorded_once_through_a_worker_restart(
    plane: Plane, tenant: str, tmp_path: object
) -> None:
    # Two at a time, so most of them wait: their admission times differ from their
    # submissions, and the restart lands with work waiting and running.
    await setup_queue(plane, tenant, action_concurrency=2)
    ids = [f"h{i}" for i in range(8)]
    handles = [
        await hw.submit(
            plane.client,
            req(
                tenant,
                aid,
                run="r1",
                task="t",
                duration_s=0.4,
                inject="oom" if aid == "h5" else None,
            ),
        )
        for aid in ids
    ]
    await eventually(lambda: len(plane.cluster.started) >= 2)
    await plane.stop_control()
    await asyncio.sleep(1.0)
    await plane.start_control()
    states = {}
    for aid, h in zip(ids, handles, strict=True):
        try:
            states[aid] = (await hw.wait_result(h)).state
        except Exception:  # the OOM: its workflow fails with the attributed reason
            states[aid] = "failed"
    await eventually(lambda: _queue_idle(plane.client, tenant, "default"))

    # Read through a store opened afresh: the record is in the database, not in memory.
    url = str(plane.store.engine.url)
    store = LeaseStore(url)
    try:
        history = HistoryStore(store)
        rows = history.window(tenant, 0.0)
        assert history.count(tenant) == len(ids)
    finally:
        store.close()
    assert sorted(r.action_id for r in rows) == ids  # each once
    by_id = {r.action_id: r for r in rows}
    assert {a: r.outcome for a, r in by_id.items()} == states
    assert by_id["h5"].reason == "OOMKilled"
    assert by_id["h0"].reason == "Succeeded"
    for r in rows:
        assert r.queue == "default" and r.run == "r1" and r.task == "t"
        assert r.cluster == "c1"
        assert r.admitted_at is not None
        assert r.submitted_at <= r.admitted_at <= r.ended_at
        assert r.pods == [{"cpu": 1000, "memory": 2**30}]
        assert r.demand == {"resources": {"cpu": "1", "memory": "1Gi"}}
    # Two ran at a time: the later ones waited for room, and the record says so.
    assert max(r.wait or 0.0 for r in rows) > 0.3


async def test_an_action_cancelled_while_waiting_is_recorded_as_never_run(
    plane: Plane, tenant: str
) -> None:
    await setup_queue(plane, tenant, action_concurrency=1)
    plane.cluster.gate = asyncio.Event()  # the first holds the only slot until let go
    first = await hw.submit(plane.client, req(tenant, "busy"))
    await eventually(lambda: "busy" in plane.cluster.started)
    waiting = await hw.submit(plane.client, req(tenant, "gives-up"))
    await hw.cancel(plane.client, tenant, "gives-up")
    assert (await hw.wait_result(waiting)).state == "cancelled"
    plane.cluster.gate.set()
    await hw.wait_result(first)
    history = HistoryStore(plane.store)
    await eventually(lambda: history.count(tenant) == 2)
    rec = {r.action_id: r for r in history.window(tenant, 0.0)}
    assert rec["gives-up"].outcome == "cancelled"
    assert rec["gives-up"].admitted_at is None and rec["gives-up"].cluster is None
    assert rec["busy"].outcome == "succeeded"
