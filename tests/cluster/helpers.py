"""Shared builders for the cluster-worker tests."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Sequence
from typing import Any

from headway.activities.backends.sim import SimBackend
from headway.protocol import ActionEvent, ActionEventKind, DispatchRequest, GangKind, PodSpec
from headway.scheduler.model import ClusterSpec, NodeGroup
from headway.scheduler.resources import Pod
from temporalio.testing import ActivityEnvironment

GI = 2**30


def small_cluster(name: str = "c1", *, reports_capacity: bool = True) -> ClusterSpec:
    """Two CPU nodes (4 cores, 16Gi) and one 8 x H100 node."""
    return ClusterSpec(
        name,
        (
            NodeGroup("cpu", 2, Pod(cpu=4000, memory=16 * GI, eph=100 * GI)),
            NodeGroup(
                "gpu", 1, Pod(cpu=32000, memory=256 * GI, eph=500 * GI, gpu=8, gpu_type="H100")
            ),
        ),
        reports_capacity,
    )


def sim(spec: ClusterSpec | None = None, **opts: object) -> SimBackend:
    opts.setdefault("time_scale", 0.01)
    return SimBackend(spec or small_cluster(), **opts)  # type: ignore[arg-type]


def request(
    action_id: str,
    pods: list[PodSpec] | None = None,
    *,
    kind: GangKind = GangKind.SINGLE,
    duration_s: float | None = 1.0,
    inject: str | None = None,
    cluster: str = "c1",
) -> DispatchRequest:
    return DispatchRequest(
        tenant="t1",
        action_id=action_id,
        workflow_id=f"wf-{action_id}",
        cluster=cluster,
        kind=kind,
        pods=pods or [PodSpec(role="main", index=0, cpu_m=1000, memory=GI)],
        duration_s=duration_s,
        inject=inject,
    )


async def collect_until_terminal(
    queue: asyncio.Queue[ActionEvent], action_id: str, timeout: float = 5.0
) -> list[ActionEvent]:
    """Events of one action up to and including its first terminal event."""
    from headway.protocol import TERMINAL_EVENTS

    out: list[ActionEvent] = []
    async with asyncio.timeout(timeout):
        while True:
            ev = await queue.get()
            if ev.action_id != action_id:
                continue
            out.append(ev)
            if ev.kind in TERMINAL_EVENTS:
                return out


class Recorder:
    """Stands in for the action workflow: records every signalled event."""

    def __init__(self) -> None:
        self.events: list[tuple[str, ActionEvent]] = []
        self.changed = asyncio.Event()

    async def __call__(self, workflow_id: str, event: ActionEvent) -> None:
        self.events.append((workflow_id, event))
        self.changed.set()

    def kinds(self) -> list[ActionEventKind]:
        return [e.kind for _, e in self.events]

    async def wait_for(self, kind: ActionEventKind, timeout: float = 5.0) -> ActionEvent:
        async with asyncio.timeout(timeout):
            while True:
                for _, e in self.events:
                    if e.kind is kind:
                        return e
                self.changed.clear()
                await self.changed.wait()


def attempt_env(
    attempt: int = 1,
    details: Sequence[Any] = (),
    *,
    activity_id: str = "1",
    beats: list[Any] | None = None,
) -> ActivityEnvironment:
    """An ActivityEnvironment for one attempt of one dispatch (``activity_id``), with the
    heartbeat details an earlier attempt left; heartbeats go to ``beats``."""
    env = ActivityEnvironment()
    env.info = dataclasses.replace(
        env.info,
        attempt=attempt,
        heartbeat_details=list(details),
        activity_id=activity_id,
        workflow_id="wf",
        workflow_run_id="run-1",
    )
    if beats is not None:
        env.on_heartbeat = lambda *d: beats.append(d[0] if d else None)
    return env
