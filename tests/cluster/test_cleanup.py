"""Cleanup that does not give up: deletes retried with capped backoff, and the worker's
garbage collection of ended actions' pods (against a real Temporal dev server)."""

from __future__ import annotations

import asyncio
import logging
import uuid
from pathlib import Path
from typing import Any

import pytest
from headway.activities.backends.base import WORKFLOW_ANNOTATION, ClusterBackend
from headway.activities.backends.kubernetes import build_pods
from headway.activities.backends.sim import SimBackend
from headway.activities.cluster import ClusterActivities
from headway.protocol import TERMINAL_EVENTS, ActionEvent
from headway.protocol import ActionEventKind as K
from headway.worker.cluster import collect_garbage, run_cluster_worker
from kubernetes import client as k8s
from temporalio import workflow
from temporalio.activity import ActivityCancellationDetails
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import UnsandboxedWorkflowRunner, Worker

from .fake_kube import FakeKube
from .helpers import Recorder, attempt_env, pod_of, request, small_cluster
from .test_kubernetes import NS, RUNNING, SCHEDULED, backend, patch_pod


class FlakyDeletes(SimBackend):
    """A simulated cluster whose API refuses the next ``failures`` deletes, as an
    overloaded API server would."""

    def __init__(self, failures: int, **opts: Any) -> None:
        super().__init__(small_cluster(), time_scale=opts.pop("time_scale", 0.01), **opts)
        self.failures = failures
        self.delete_calls = 0

    async def delete_pods(
        self, action_id: str, namespace: str = "default", *, tenant: str = ""
    ) -> int:
        self.delete_calls += 1
        if self.failures > 0:
            self.failures -= 1
            raise RuntimeError("503 Service Unavailable")
        return await super().delete_pods(action_id, namespace, tenant=tenant)


def acts(b: ClusterBackend, rec: Recorder | None = None, attempts: int = 4) -> ClusterActivities:
    return ClusterActivities(
        b,
        signaler=rec or Recorder(),
        heartbeat_s=0.05,
        delete_attempts=attempts,
        delete_backoff_s=(0.01, 0.02),
    )


def warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "headway.activities.cluster"]


@pytest.mark.parametrize(
    ("failures", "left", "waits"),
    [
        (0, {}, []),
        # Capped exponential: 0.01 s, then 0.02 s, and no more than 0.02 s after.
        (3, {}, ["again in 0.01 s", "again in 0.02 s", "again in 0.02 s"]),
        # Every try fails: the action's outcome still returns, and the pod is left to the
        # worker's garbage collection, loudly.
        (
            9,
            {pod_of("c1"): "cpu-0"},
            ["again in 0.01 s", "again in 0.02 s", "again in 0.02 s", "try 4 of 4"],
        ),
    ],
    ids=["first-try", "after-three-failures", "never"],
)
async def test_cleanup_after_the_action_retries_failed_deletes(
    caplog: pytest.LogCaptureFixture, failures: int, left: dict[str, str], waits: list[str]
) -> None:
    caplog.set_level(logging.INFO)
    b = FlakyDeletes(failures)
    try:
        result = await attempt_env().run(acts(b).run_action, request("c1"))
        assert result.kind is K.SUCCEEDED
        assert b.pods("c1") == left
        assert b.delete_calls == min(failures + 1, 4)
        got = [m for m in warnings(caplog) if "deleting the pods of c1 failed" in m]
        assert len(got) == len(waits)
        for message, wait in zip(got, waits, strict=True):
            assert wait in message and "503 Service Unavailable" in message
        if left:
            assert any("left for the worker's garbage collection" in m for m in warnings(caplog))
    finally:
        await b.close()


class LosesOutcomes(Recorder):
    """The action's workflow, reachable for progress but refusing the outcome's signal
    the first ``refusals`` times (the server down for a moment)."""

    def __init__(self, refusals: int) -> None:
        super().__init__()
        self.refusals = refusals

    async def __call__(self, workflow_id: str, event: ActionEvent) -> None:
        if event.kind in TERMINAL_EVENTS and self.refusals > 0:
            self.refusals -= 1
            raise RuntimeError("connection refused")
        await super().__call__(workflow_id, event)


@pytest.mark.parametrize(
    ("refusals", "deleted"),
    [(0, True), (2, True), (9, False)],
    ids=["heard-at-once", "heard-on-the-third-try", "never-heard-pods-stay-for-gc"],
)
async def test_pods_are_deleted_only_once_the_workflow_heard_the_outcome(
    refusals: int, deleted: bool
) -> None:
    """Deleted first, the pods (the outcome's only record on Kubernetes) would make a
    retry of this activity report success as PodLost (issue #20)."""
    b = FlakyDeletes(0)
    rec = LosesOutcomes(refusals)
    try:
        result = await attempt_env().run(acts(b, rec).run_action, request("o1"))
        assert result.kind is K.SUCCEEDED
        assert (K.SUCCEEDED in rec.kinds()) is deleted
        assert (b.pods("o1") == {}) is deleted
    finally:
        await b.close()


async def test_delete_action_retries_then_raises_for_temporal_to_retry() -> None:
    b = FlakyDeletes(2, time_scale=1.0)
    try:
        req = request("d1", duration_s=60)
        await b.create_pods(req)
        assert await attempt_env().run(acts(b).delete_action, req) == 1
        assert b.delete_calls == 3
        await b.create_pods(req)
        b.failures = 9
        with pytest.raises(RuntimeError, match="503"):
            await attempt_env().run(acts(b).delete_action, req)
        assert b.delete_calls == 3 + 4
        assert list(b.pods("d1")) == [pod_of("d1")], "still there: Temporal retries it"
    finally:
        await b.close()


async def test_a_cancelled_action_s_pods_are_deleted_despite_failures() -> None:
    b = FlakyDeletes(2, time_scale=1.0)
    try:
        rec = Recorder()
        env = attempt_env()
        task = asyncio.create_task(env.run(acts(b, rec).run_action, request("x1", duration_s=60)))
        await rec.wait_for(K.RUNNING)
        env.cancel(ActivityCancellationDetails(cancel_requested=True))
        with pytest.raises(asyncio.CancelledError):
            await task
        assert b.pods("x1") == {}
        assert b.delete_calls == 3
    finally:
        await b.close()


async def test_kubernetes_cleanup_outlasts_a_failing_api_server(
    kube: FakeKube, api_client: k8s.ApiClient, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    b = await backend(api_client)
    try:
        req = request("k1")
        req.namespace = NS
        rec = Recorder()
        task = asyncio.create_task(attempt_env().run(acts(b, rec).run_action, req))
        async with asyncio.timeout(5):
            while not kube.live("pods"):
                await asyncio.sleep(0.02)
        for patch in (SCHEDULED, RUNNING, {"status": {"phase": "Succeeded"}}):
            await patch_pod(kube, pod_of("k1"), patch)
        kube.failing_deletes["pods"] = 2
        result = await asyncio.wait_for(task, 10)
        assert result.kind is K.SUCCEEDED
        assert kube.live("pods") == [] and kube.failing_deletes["pods"] == 0
        failed = [m for m in warnings(caplog) if "deleting the pods of k1 failed" in m]
        assert len(failed) == 2 and all("500" in m for m in failed)
    finally:
        await b.close()


# --- garbage collection of ended actions, against a real Temporal server ----------------

GC_QUEUE = "cluster-gc-test"


@workflow.defn(name="GcRunning")
class Running:
    @workflow.run
    async def run(self) -> None:
        await workflow.wait_condition(lambda: False)


@workflow.defn(name="GcDone")
class Done:
    @workflow.run
    async def run(self) -> str:
        return "done"


async def workflows(env: WorkflowEnvironment) -> tuple[str, str, str]:
    """Ids of a running workflow, a closed one and one that never existed."""
    tag = uuid.uuid4().hex[:8]
    running, closed = f"gc-running-{tag}", f"gc-closed-{tag}"
    await env.client.start_workflow(Running.run, id=running, task_queue=GC_QUEUE)
    await env.client.execute_workflow(Done.run, id=closed, task_queue=GC_QUEUE)
    return running, closed, f"gc-never-{tag}"


def gc_worker(env: WorkflowEnvironment) -> Worker:
    return Worker(
        env.client,
        task_queue=GC_QUEUE,
        workflows=[Running, Done],
        workflow_runner=UnsandboxedWorkflowRunner(),
    )


def for_workflow(action: str, workflow_id: str) -> Any:
    req = request(action, duration_s=600)
    req.workflow_id = workflow_id
    return req


async def test_gc_deletes_the_pods_of_ended_actions_only(temporal_env: WorkflowEnvironment) -> None:
    async with gc_worker(temporal_env):
        running, closed, never = await workflows(temporal_env)
        b = SimBackend(small_cluster())
        try:
            for action, wid in (("a-run", running), ("a-closed", closed), ("a-never", never)):
                await b.create_pods(for_workflow(action, wid), dispatch=f"{wid}/r/1")
            cleaned = await collect_garbage(temporal_env.client, b)
            assert sorted(cleaned) == ["a-closed", "a-never"]
            assert list(b.pods()) == [pod_of("a-run")], "a running action keeps its pods"
            # Its records are forgotten too; the running one's stay for its retries.
            assert [h.action_id for h in await b.headway_pods()] == ["a-run"]
        finally:
            await b.close()
        await temporal_env.client.get_workflow_handle(running).terminate()


async def test_kubernetes_gc_trusts_only_exact_workflow_ids(
    temporal_env: WorkflowEnvironment, kube: FakeKube, api_client: k8s.ApiClient
) -> None:
    async with gc_worker(temporal_env):
        running, closed, never = await workflows(temporal_env)
        bodies = []
        for action, wid in (("k-run", running), ("k-closed", closed), ("k-never", never)):
            req = for_workflow(action, wid)
            bodies += build_pods(req, NS)
        # Made before workflow ids were recorded on pods: the id is derived from the
        # tenant label, which might name another workflow; not found is not enough.
        legacy = build_pods(for_workflow("k-legacy", "x"), NS)[0]
        del legacy["metadata"]["annotations"][WORKFLOW_ANNOTATION]
        for body in [*bodies, legacy]:
            async with kube.post(f"/api/v1/namespaces/{NS}/pods", json=body) as resp:
                assert resp.status < 300
        b = await backend(api_client)
        try:
            cleaned = await collect_garbage(temporal_env.client, b)
            assert sorted(cleaned) == ["k-closed", "k-never"]
            left = sorted(p["metadata"]["name"] for p in kube.live("pods"))
            assert left == sorted([pod_of("k-legacy"), pod_of("k-run")])
        finally:
            await b.close()
        await temporal_env.client.get_workflow_handle(running).terminate()


async def test_a_starting_worker_collects_what_ended_while_it_was_down(
    temporal_env: WorkflowEnvironment, tmp_path: Path
) -> None:
    async with gc_worker(temporal_env):
        running, closed, _ = await workflows(temporal_env)
        state = tmp_path / "state"
        before = SimBackend(small_cluster(), state_dir=state)
        await before.start()
        await before.create_pods(for_workflow("s-run", running), dispatch="d1")
        await before.create_pods(for_workflow("s-closed", closed), dispatch="d2")
        await before.close()

        after = SimBackend(small_cluster(), state_dir=state)
        stop = asyncio.Event()
        worker = asyncio.create_task(
            run_cluster_worker(
                temporal_env.client,
                "c1",
                after,
                tenants=[f"gc-{uuid.uuid4().hex[:6]}"],
                stop=stop,
                gc_interval_s=None,
            )
        )
        try:
            async with asyncio.timeout(15):
                while pod_of("s-closed") in after.pods():
                    await asyncio.sleep(0.05)
            assert list(after.pods()) == [pod_of("s-run")]
        finally:
            stop.set()
            await asyncio.wait_for(worker, 15)
        await temporal_env.client.get_workflow_handle(running).terminate()
