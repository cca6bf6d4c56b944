"""Cancelling an action whose cluster never said a word of it (its worker is dead) ends
it cancelled after the cluster silence interval, not the delete's ten minutes (patch
``cancel-unheard``); its history, with the patch's marker, replays.

Live: a real dev server and control-plane worker; cluster ``c1`` has no worker at all,
so the dispatch and the delete are never taken up.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio
from headway import protocol
from headway.store import LeaseStore
from headway.worker.control_plane import build_control_plane_worker
from headway.workflows import client as hw
from headway.workflows import shared
from headway.workflows.action import CANCEL_UNHEARD_PATCH, DELETE_WITHIN_S, ActionWorkflow
from headway.workflows.scheduler import SchedulerWorkflow
from temporalio.client import Client
from temporalio.worker import Replayer

from .conftest import fleet
from .test_lifecycle import eventually, req

pytestmark = pytest.mark.integration

SILENT_S = 6.0


@pytest_asyncio.fixture
async def dead_cluster_plane(
    client: Client, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[Client]:
    """The control plane, with a silence interval of ``SILENT_S``; no cluster worker."""
    monkeypatch.setattr(shared.HEALTH, "cluster_silent_s", SILENT_S)
    store = LeaseStore(f"sqlite:///{tmp_path / 'leases.db'}")
    worker = build_control_plane_worker(client, store, fleet())
    task = asyncio.create_task(worker.run())
    try:
        yield client
    finally:
        await worker.shutdown()
        with contextlib.suppress(Exception):
            await task
        store.close()


async def test_cancelling_an_action_its_dead_cluster_never_answered_ends_it_soon(
    dead_cluster_plane: Client, tenant: str
) -> None:
    client = dead_cluster_plane
    await hw.upsert_queue(client, tenant, {"name": "default"}, fleet())
    handle = await hw.submit(client, req(tenant, "silent", duration_s=60))
    await eventually(lambda: _state(client, tenant, "silent", "running"), timeout=SILENT_S - 2)
    loop = asyncio.get_running_loop()
    asked = loop.time()
    await hw.cancel_action(client, tenant, "silent", wait=False)
    # Without the patch it would wait DELETE_WITHIN_S (600 s) for a delete no one takes.
    res = await asyncio.wait_for(hw.wait_result(handle), timeout=SILENT_S + 20)
    took = loop.time() - asked
    assert res.state == "cancelled", res
    assert took < DELETE_WITHIN_S / 10, took

    history = await handle.fetch_history()
    patches = [
        str(e.marker_recorded_event_attributes.details)
        for e in history.events
        if e.marker_recorded_event_attributes.marker_name == "core_patch"
    ]
    assert len(patches) == 1 and CANCEL_UNHEARD_PATCH in patches[0], patches
    replayer = Replayer(
        workflows=[ActionWorkflow, SchedulerWorkflow], data_converter=protocol.data_converter()
    )
    result = await replayer.replay_workflow(history, raise_on_replay_failure=True)
    assert result.replay_failure is None


async def _state(client: Client, tenant: str, action_id: str, want: str) -> bool:
    st = await hw.action_state(client, tenant, action_id)
    return bool(st.state == want)
