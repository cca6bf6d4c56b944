"""Cancelling an action whose cluster worker took the dispatch, said it runs, and then
went silent (frozen, cut off): the run activity cannot hear the cancel and ends by its
heartbeat timeout. The action ends ``cancelled``, as asked, not failed ``ClusterError``,
and the delete of its pods waits the cluster silence interval, not ten minutes (patch
``cancel-lost-worker``); its history, with the patch's marker, replays.

Live: a real dev server and control-plane worker; cluster ``c1``'s worker answers the
dispatch with a ``Running`` event and then never heartbeats or answers again.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio
from headway import protocol
from headway.protocol import ActionEvent, ActionEventKind, DispatchRequest
from headway.store import LeaseStore
from headway.worker.control_plane import build_control_plane_worker
from headway.workflows import client as hw
from headway.workflows import shared
from headway.workflows.action import (
    CANCEL_LOST_WORKER_PATCH,
    DELETE_WITHIN_S,
    ActionWorkflow,
)
from headway.workflows.scheduler import SchedulerWorkflow
from temporalio import activity
from temporalio.client import Client
from temporalio.worker import Replayer, Worker

from .conftest import fleet
from .test_lifecycle import eventually, req

pytestmark = pytest.mark.integration

SILENT_S = 6.0


def frozen_cluster(client: Client) -> Worker:
    """Cluster ``c1``'s worker: it says the pods run, then goes silent for good."""

    @activity.defn(name=protocol.RUN_ACTION_ACTIVITY)
    async def run(req: DispatchRequest) -> ActionEvent:
        running = ActionEvent(req.action_id, ActionEventKind.RUNNING, req.cluster, pod="p-0")
        await client.get_workflow_handle(req.workflow_id).signal(
            protocol.ACTION_EVENT_SIGNAL, running
        )
        await asyncio.sleep(3600)  # no heartbeat: the cancel never reaches it
        raise AssertionError("unreachable")

    @activity.defn(name=protocol.DELETE_ACTION_ACTIVITY)
    async def delete(req: DispatchRequest) -> int:
        await asyncio.sleep(3600)
        raise AssertionError("unreachable")

    return Worker(client, task_queue=protocol.cluster_task_queue("c1"), activities=[run, delete])


@pytest_asyncio.fixture
async def lost_worker_plane(
    client: Client, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[Client]:
    """The control plane (silence interval ``SILENT_S``) and the frozen cluster worker."""
    monkeypatch.setattr(shared.HEALTH, "cluster_silent_s", SILENT_S)
    store = LeaseStore(f"sqlite:///{tmp_path / 'leases.db'}")
    workers = [build_control_plane_worker(client, store, fleet()), frozen_cluster(client)]
    tasks = [asyncio.create_task(w.run()) for w in workers]
    try:
        yield client
    finally:
        for w in workers:
            await w.shutdown()
        for t in tasks:
            with contextlib.suppress(Exception):
                await t
        store.close()


async def test_cancelling_an_action_whose_worker_spoke_then_went_silent_ends_it_cancelled(
    lost_worker_plane: Client, tenant: str
) -> None:
    client = lost_worker_plane
    await hw.upsert_queue(client, tenant, {"name": "default"}, fleet())
    handle = await hw.submit(client, req(tenant, "spoke", duration_s=600))
    await eventually(lambda: _heard_running(client, tenant, "spoke"), timeout=30)
    loop = asyncio.get_running_loop()
    asked = loop.time()
    await hw.cancel_action(client, tenant, "spoke", wait=False)
    # The run activity's heartbeat timeout (30 s), then the delete for SILENT_S. Before
    # the patch: ended failed ClusterError ("Activity task timed out"), pods not deleted.
    res = await asyncio.wait_for(hw.wait_result(handle), timeout=30 + SILENT_S + 30)
    took = loop.time() - asked
    assert (res.state, res.reason) == ("cancelled", "Cancelled"), res
    assert took < DELETE_WITHIN_S / 5, took

    history = await handle.fetch_history()
    patches = [
        str(e.marker_recorded_event_attributes.details)
        for e in history.events
        if e.marker_recorded_event_attributes.marker_name == "core_patch"
    ]
    assert any(CANCEL_LOST_WORKER_PATCH in p for p in patches), patches
    deletes = [
        e.activity_task_scheduled_event_attributes
        for e in history.events
        if e.activity_task_scheduled_event_attributes.activity_type.name
        == protocol.DELETE_ACTION_ACTIVITY
    ]
    assert [d.schedule_to_close_timeout.ToSeconds() for d in deletes] == [int(SILENT_S)]
    replayer = Replayer(
        workflows=[ActionWorkflow, SchedulerWorkflow], data_converter=protocol.data_converter()
    )
    result = await replayer.replay_workflow(history, raise_on_replay_failure=True)
    assert result.replay_failure is None


async def _heard_running(client: Client, tenant: str, action_id: str) -> bool:
    st = await hw.action_state(client, tenant, action_id)
    return st.state == "running" and any(e.kind == ActionEventKind.RUNNING for e in st.events)
