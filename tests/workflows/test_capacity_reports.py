"""Capacity reports on a real dev server: a restarted worker's reports win, stale ones and
reports of clusters outside the tenant's fleet are ignored and counted."""

from __future__ import annotations

from typing import Any

import pytest
from headway import protocol
from headway.workflows import client as hw

from .conftest import Plane
from .test_lifecycle import eventually, setup_queue

pytestmark = pytest.mark.integration

GI = 2**30


def report(
    free_gpu: int, sequence: int, incarnation: str, started_at: float, cluster: str = "c1"
) -> protocol.CapacityReport:
    node = protocol.NodeCapacity(
        "gpu-0", cpu_m=64000, memory=256 * GI, gpu=8, free_cpu_m=64000,
        free_memory=256 * GI, free_gpu=free_gpu,
    )  # fmt: skip
    return protocol.CapacityReport(
        cluster, [node], sequence=sequence, incarnation=incarnation, started_at=started_at
    )


async def _view(plane: Plane, tenant: str) -> dict[str, Any]:
    fleet = await hw.get_fleet(plane.client, tenant)
    return fleet


async def _free_gpu_is(plane: Plane, tenant: str, want: int) -> bool:
    view = (await _view(plane, tenant))["capacity"].get("c1", {})
    return bool(view.get("free_gpu") == want)


async def _ignored(plane: Plane, tenant: str) -> int:
    h = plane.client.get_workflow_handle(protocol.scheduler_workflow_id(tenant))
    stats: dict[str, Any] = await h.query("stats")
    return int(stats["capacity_ignored"])


async def test_a_restarted_worker_numbering_from_one_again_wins(plane: Plane, tenant: str) -> None:
    await setup_queue(plane, tenant)
    sched = plane.client.get_workflow_handle(protocol.scheduler_workflow_id(tenant))
    # The old process got far: sequence 40, 2 GPUs free.
    await sched.signal(protocol.CAPACITY_SIGNAL, report(2, 40, "old", 1000.0))
    await eventually(lambda: _free_gpu_is(plane, tenant, 2))
    # It restarts (a crash, a rollout) and numbers from 1: its view replaces the old one.
    await sched.signal(protocol.CAPACITY_SIGNAL, report(8, 1, "new", 2000.0))
    await eventually(lambda: _free_gpu_is(plane, tenant, 8))
    # Within the new incarnation, a reordered older report is ignored.
    await sched.signal(protocol.CAPACITY_SIGNAL, report(3, 5, "new", 2000.0))
    await sched.signal(protocol.CAPACITY_SIGNAL, report(4, 4, "new", 2000.0))
    await eventually(lambda: _free_gpu_is(plane, tenant, 3))
    # The old process, still alive for a moment during a rollout, does not win back.
    await sched.signal(protocol.CAPACITY_SIGNAL, report(0, 41, "old", 1000.0))
    await sched.signal(protocol.CAPACITY_SIGNAL, report(6, 6, "new", 2000.0))
    await eventually(lambda: _free_gpu_is(plane, tenant, 6))
    assert await _ignored(plane, tenant) == 2
    view = (await _view(plane, tenant))["capacity"]["c1"]
    assert (view["incarnation"], view["sequence"]) == ("new", 6)


async def test_a_report_of_a_cluster_outside_the_fleet_is_ignored(
    plane: Plane, tenant: str
) -> None:
    await setup_queue(plane, tenant)
    sched = plane.client.get_workflow_handle(protocol.scheduler_workflow_id(tenant))
    await sched.signal(protocol.CAPACITY_SIGNAL, report(8, 1, "x", 1.0, cluster="rogue"))
    await sched.signal(protocol.CAPACITY_SIGNAL, report(5, 1, "w", 1.0))
    await eventually(lambda: _free_gpu_is(plane, tenant, 5))
    fleet = await _view(plane, tenant)
    assert fleet["clusters"] == ["c1"]
    assert "rogue" not in fleet["capacity"]
    assert await _ignored(plane, tenant) == 1


async def test_a_report_arriving_before_the_fleet_is_learned_is_applied_after(
    plane: Plane, tenant: str
) -> None:
    # Started without a fleet, the scheduler learns it from the control-plane worker in
    # its first task; a report delivered with the start comes before that.
    from headway.workflows.scheduler import SchedulerWorkflow
    from headway.workflows.shared import SchedulerInput

    await plane.client.start_workflow(
        SchedulerWorkflow.run,
        SchedulerInput(tenant=tenant, fleet=[]),
        id=protocol.scheduler_workflow_id(tenant),
        task_queue=protocol.CONTROL_TASK_QUEUE,
        start_signal=protocol.CAPACITY_SIGNAL,
        start_signal_args=[report(7, 1, "w", 1.0)],
    )
    await eventually(lambda: _free_gpu_is(plane, tenant, 7))
    assert (await _view(plane, tenant))["clusters"] == ["c1"]
    assert await _ignored(plane, tenant) == 0


async def test_a_cluster_whose_worker_goes_silent_takes_no_work_until_it_reports_again(
    plane: Plane, tenant: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    import asyncio

    from headway.workflows import scheduler as sched_mod

    from .test_lifecycle import req

    # The workflows run unsandboxed in this process: a short silence for the test.
    monkeypatch.setattr(sched_mod, "CLUSTER_SILENT_S", 1.0)
    await setup_queue(plane, tenant)
    sched = plane.client.get_workflow_handle(protocol.scheduler_workflow_id(tenant))
    await sched.signal(protocol.CAPACITY_SIGNAL, report(8, 1, "w", 1.0))
    await eventually(lambda: _free_gpu_is(plane, tenant, 8))
    plane.cluster.gate = asyncio.Event()
    first = await hw.submit(plane.client, req(tenant, "runs-on"))
    await eventually(lambda: "runs-on" in plane.cluster.running)

    async def down() -> bool:
        return bool((await _view(plane, tenant))["down"] == ["c1"])

    await eventually(down)
    late = await hw.submit(plane.client, req(tenant, "late"))
    await eventually(lambda: _waiting_for(plane, tenant, "late"))
    assert "late" not in plane.cluster.started
    # The worker is back: the cluster is up and the waiting action goes there.
    await sched.signal(protocol.CAPACITY_SIGNAL, report(8, 2, "w", 1.0))
    plane.cluster.gate.set()
    assert (await hw.wait_result(late)).state == "succeeded"
    assert (await hw.wait_result(first)).state == "succeeded"
    assert (await _view(plane, tenant))["down"] == []
    h = plane.client.get_workflow_handle(protocol.scheduler_workflow_id(tenant))
    assert (await h.query("stats"))["clusters_down"] >= 1


async def _waiting_for(plane: Plane, tenant: str, action_id: str) -> bool:
    return bool((await hw.why(plane.client, tenant, action_id)).get("state") == "waiting")
