"""Shared builders for the cluster-worker tests."""

from __future__ import annotations

import asyncio

from headway.activities.backends.sim import SimBackend
from headway.protocol import ActionEvent, DispatchRequest, GangKind, PodSpec
from headway.scheduler.model import ClusterSpec, NodeGroup
from headway.scheduler.resources import Pod

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
