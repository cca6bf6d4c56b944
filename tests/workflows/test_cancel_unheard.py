"""Cancelling an action whose cluster worker is gone ends it ``cancelled`` after the
cluster silence interval, not after the delete's ten minutes; each history, with its
patch's marker, replays.

- Patch ``cancel-unheard``: the cluster never said a word of the action (no worker at
  all, so the dispatch and the delete are never taken up).
- Patch ``cancel-lost-worker``: the worker took the dispatch, said the pods run, then
  went silent (frozen, cut off). The run activity cannot hear the cancel and ends by its
  heartbeat timeout (30 s); the action still ends cancelled, not failed ``ClusterError``.

Live: a real dev server and control-plane worker; cluster ``c1``'s worker is absent, or
a frozen stand-in.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest
from headway import protocol
from headway.protocol import ActionEvent, ActionEventKind, DispatchRequest
from headway.store import LeaseStore
from headway.worker.control_plane import build_control_plane_worker
from headway.workflows import client as hw
from headway.workflows import shared
from headway.workflows.action import (
    CANCEL_LOST_WORKER_PATCH,
    CANCEL_UNHEARD_PATCH,
    DELETE_WITHIN_S,
    ActionResult,
    ActionWorkflow,
)
from headway.workflows.scheduler import SchedulerWorkflow
from temporalio import activity
from temporalio.client import Client, WorkflowHistory
from temporalio.worker import Replayer, Worker

from .conftest import fleet
from .test_lifecycle import eventually, req

pytestmark = pytest.mark.integration

SILENT_S = 6.0
#: The run activity's heartbeat timeout (``ActionWorkflow._start_run``).
HEARTBEAT_TIMEOUT_S = 30.0


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


@contextlib.asynccontextmanager
async def plane(
    client: Client, tmp_path: Path, cluster: Callable[[Client], Worker] | None
) -> AsyncIterator[None]:
    """The control plane (silence interval ``SILENT_S``), and ``cluster``'s worker."""
    store = LeaseStore(f"sqlite:///{tmp_path / 'leases.db'}")
    workers = [build_control_plane_worker(client, store, fleet())]
    if cluster is not None:
        workers.append(cluster(client))
    tasks = [asyncio.create_task(w.run()) for w in workers]
    try:
        yield
    finally:
        for w in workers:
            await w.shutdown()
        for t in tasks:
            with contextlib.suppress(Exception):
                await t
        store.close()


@pytest.mark.parametrize(
    ("cluster", "patch", "heard", "wait_s"),
    [
        pytest.param(None, CANCEL_UNHEARD_PATCH, False, 0.0, id="a cluster that never answered"),
        pytest.param(
            frozen_cluster,
            CANCEL_LOST_WORKER_PATCH,
            True,
            HEARTBEAT_TIMEOUT_S,
            id="a worker that said the pods run, then went silent",
        ),
    ],
)
async def test_cancelling_an_action_whose_cluster_worker_is_gone_ends_it_cancelled_soon(
    client: Client,
    tenant: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    cluster: Callable[[Client], Worker] | None,
    patch: str,
    heard: bool,
    wait_s: float,
) -> None:
    monkeypatch.setattr(shared.HEALTH, "cluster_silent_s", SILENT_S)
    async with plane(client, tmp_path, cluster):
        await hw.upsert_queue(client, tenant, {"name": "default"}, fleet())
        handle = await hw.submit(client, req(tenant, "gone", duration_s=600))
        # (Unheard, it must be seen running before the dispatch is handed back.)
        seen_s = 30.0 if heard else SILENT_S - 2
        await eventually(lambda: _running(client, tenant, "gone", heard), timeout=seen_s)
        loop = asyncio.get_running_loop()
        asked = loop.time()
        await hw.cancel_action(client, tenant, "gone", wait=False)
        # Without the patches: DELETE_WITHIN_S (600 s) for a delete no one takes; or
        # ended failed ClusterError ("activity Heartbeat timeout"), nothing deleted.
        res: ActionResult = await asyncio.wait_for(
            hw.wait_result(handle), timeout=wait_s + SILENT_S + 20
        )
        took = loop.time() - asked
        history = await handle.fetch_history()
    assert (res.state, res.reason) == ("cancelled", "Cancelled"), res
    assert took < DELETE_WITHIN_S / 5, took
    assert [patch] == [p for p in _patches(history) if p in (CANCEL_UNHEARD_PATCH, patch)]
    deletes = [
        e.activity_task_scheduled_event_attributes.schedule_to_close_timeout.ToSeconds()
        for e in history.events
        if e.activity_task_scheduled_event_attributes.activity_type.name
        == protocol.DELETE_ACTION_ACTIVITY
    ]
    assert deletes == [int(SILENT_S)], deletes
    replayer = Replayer(
        workflows=[ActionWorkflow, SchedulerWorkflow], data_converter=protocol.data_converter()
    )
    result = await replayer.replay_workflow(history, raise_on_replay_failure=True)
    assert result.replay_failure is None


def _patches(history: WorkflowHistory) -> list[str]:
    """The ids of the patches the history's markers record."""
    found = []
    for e in history.events:
        marker = e.marker_recorded_event_attributes
        if marker.marker_name == "core_patch":
            details = str(marker.details)
            found += [p for p in (CANCEL_UNHEARD_PATCH, CANCEL_LOST_WORKER_PATCH) if p in details]
    return found


async def _running(client: Client, tenant: str, action_id: str, heard: bool) -> bool:
    """Running; and with ``heard``, its worker said so."""
    st = await hw.action_state(client, tenant, action_id)
    said = any(e.kind == ActionEventKind.RUNNING for e in st.events)
    return st.state == "running" and (said or not heard)
