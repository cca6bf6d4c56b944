"""One real Temporal dev server per test session, plus helpers to run workers on it."""

from __future__ import annotations

import asyncio
import contextlib
import sys
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from headway import protocol
from headway.protocol import ActionEvent, ActionEventKind, DispatchRequest
from headway.scheduler.model import ClusterSpec, NodeGroup
from headway.scheduler.resources import Pod
from headway.store import LeaseStore
from headway.worker.control_plane import build_control_plane_worker
from headway.workflows.action import SEARCH_ATTRIBUTE_KEYS
from temporalio import activity
from temporalio.client import Client
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

GI = 2**30
TEMPORAL = Path(sys.executable).parent / "temporal"


def fleet(name: str = "c1", nodes: int = 4) -> list[ClusterSpec]:
    """One cluster of ``nodes`` 8-core / 32Gi nodes."""
    return [ClusterSpec(name, (NodeGroup("cpu", nodes, Pod(cpu=8000, memory=32 * GI)),))]


@pytest_asyncio.fixture(scope="session")
async def env() -> AsyncIterator[WorkflowEnvironment]:
    e = await WorkflowEnvironment.start_local(
        dev_server_existing_path=str(TEMPORAL),
        search_attributes=SEARCH_ATTRIBUTE_KEYS,
        dev_server_extra_args=[
            a for kv in protocol.SERVER_DYNAMIC_CONFIG for a in ("--dynamic-config-value", kv)
        ],
        data_converter=protocol.data_converter(),
    )
    try:
        yield e
    finally:
        await e.shutdown()


@pytest.fixture
def client(env: WorkflowEnvironment) -> Client:
    return env.client


@pytest.fixture
def tenant() -> str:
    return f"t{uuid.uuid4().hex[:10]}"


@dataclass
class FakeCluster:
    """Cluster-local activities under their real names: a simulated cluster with room.

    ``duration_s`` of a request makes the run last that long (heartbeating); ``inject``
    "oom" ends it OOMKilled. Every start, finish and delete is recorded.
    """

    name: str
    client: Client
    started: list[str] = field(default_factory=list)
    finished: list[str] = field(default_factory=list)
    cancelled: list[str] = field(default_factory=list)
    deleted: list[str] = field(default_factory=list)
    running: set[str] = field(default_factory=set)
    gate: asyncio.Event | None = None

    @activity.defn(name=protocol.RUN_ACTION_ACTIVITY)
    async def run_action(self, req: DispatchRequest) -> ActionEvent:
        self.started.append(req.action_id)
        self.running.add(req.action_id)
        try:
            with contextlib.suppress(Exception):
                await self.client.get_workflow_handle(req.workflow_id).signal(
                    protocol.ACTION_EVENT_SIGNAL,
                    ActionEvent(req.action_id, ActionEventKind.RUNNING, self.name, pod="p0"),
                )
            if self.gate is not None:
                while not self.gate.is_set():
                    activity.heartbeat()
                    await asyncio.sleep(0.2)
            elif req.duration_s:
                end = asyncio.get_running_loop().time() + req.duration_s
                while asyncio.get_running_loop().time() < end:
                    activity.heartbeat()
                    await asyncio.sleep(0.1)
        except asyncio.CancelledError:
            self.cancelled.append(req.action_id)
            raise
        finally:
            self.running.discard(req.action_id)
        self.finished.append(req.action_id)
        if req.inject == "lost-after-success":
            # The attempt that saw the pod succeed told the workflow, deleted the pod and
            # died; its retry finds the pod gone.
            await self.client.get_workflow_handle(req.workflow_id).signal(
                protocol.ACTION_EVENT_SIGNAL,
                ActionEvent(req.action_id, ActionEventKind.SUCCEEDED, self.name, exit_code=0),
            )
            return ActionEvent(req.action_id, ActionEventKind.POD_LOST, self.name, pod="p0")
        if req.inject == "oom":
            return ActionEvent(
                req.action_id, ActionEventKind.OOM_KILLED, self.name, pod="p0", exit_code=137
            )
        return ActionEvent(req.action_id, ActionEventKind.SUCCEEDED, self.name, exit_code=0)

    @activity.defn(name=protocol.DELETE_ACTION_ACTIVITY)
    async def delete_action(self, req: DispatchRequest) -> int:
        self.deleted.append(req.action_id)
        return 1


@dataclass
class Plane:
    client: Client
    store: LeaseStore
    fleet: list[ClusterSpec]
    cluster: FakeCluster
    start_control: Callable[[], Awaitable[None]]
    stop_control: Callable[[], Awaitable[None]]


@pytest_asyncio.fixture
async def plane(client: Client, tmp_path: Path) -> AsyncIterator[Plane]:
    """A control-plane worker (SQLite store in tmp) and a fake cluster worker for "c1"."""
    store = LeaseStore(f"sqlite:///{tmp_path / 'leases.db'}")
    fl = fleet()
    cluster = FakeCluster("c1", client)
    cluster_worker = Worker(
        client,
        task_queue=protocol.cluster_task_queue("c1"),
        activities=[cluster.run_action, cluster.delete_action],
    )
    control: dict[str, Any] = {}

    async def start_control() -> None:
        w = build_control_plane_worker(client, store, fl)
        control["w"] = w
        control["task"] = asyncio.create_task(w.run())

    async def stop_control() -> None:
        w: Worker = control.pop("w")
        await w.shutdown()
        with contextlib.suppress(Exception):
            await control.pop("task")

    await start_control()
    async with cluster_worker:
        try:
            yield Plane(client, store, fl, cluster, start_control, stop_control)
        finally:
            if "w" in control:
                await stop_control()
            store.close()
