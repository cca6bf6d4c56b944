"""Retries by failure class, live (issue #23): a queue's ``retry`` policy turns an
OOMKilled action into a new attempt with more memory, a preempted one into an attempt
requeued at the head of its queue, and an application failure into up to N attempts
after a backoff, then the failure.

On the real dev server with the real control-plane worker in-process (SQLite store) and
a real cluster worker (``run_cluster_worker``) over the simulated backend: the pods, their
OOM kills and preemptions are the sim's, reported by its informers.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from click.testing import CliRunner
from headway import protocol
from headway.activities.backends.sim import SimBackend
from headway.cli.main import cli
from headway.protocol import ActionEventKind, DemandRequest, SubmitRequest
from headway.scheduler.model import ClusterSpec, NodeGroup
from headway.scheduler.resources import Pod
from headway.store import LeaseStore
from headway.store.history import HistoryStore
from headway.worker.cluster import run_cluster_worker
from headway.worker.control_plane import build_control_plane_worker
from headway.workflows import client as hw
from headway.workflows.action import ActionWorkflow
from temporalio.client import Client, WorkflowHandle
from temporalio.worker import Replayer

from .test_lifecycle import _queue_idle, eventually

pytestmark = pytest.mark.integration

GI = 2**30


@dataclass
class SimPlane:
    client: Client
    store: LeaseStore
    fleet: list[ClusterSpec]
    backend: SimBackend
    cluster: str


@pytest_asyncio.fixture
async def sim_plane(client: Client, tmp_path: Path, tenant: str) -> AsyncIterator[SimPlane]:
    """Control plane + one sim cluster worker (a cluster of its own name per test)."""
    async with _plane(client, tmp_path, tenant, cpu=8000) as p:
        yield p


@pytest_asyncio.fixture
async def blind_plane(client: Client, tmp_path: Path, tenant: str) -> AsyncIterator[SimPlane]:
    """As ``sim_plane``, but the cluster's nodes are 1-core where the fleet file says 8,
    and its worker reports no capacity (unknown means open): the scheduler admits a
    2-core pod that the cluster can never start."""
    async with _plane(client, tmp_path, tenant, cpu=1000) as p:
        yield p


@contextlib.asynccontextmanager
async def _plane(client: Client, tmp_path: Path, tenant: str, cpu: int) -> AsyncIterator[SimPlane]:
    name = f"sim-{uuid.uuid4().hex[:8]}"
    fl = [ClusterSpec(name, (NodeGroup("cpu", 2, Pod(cpu=8000, memory=32 * GI)),))]
    store = LeaseStore(f"sqlite:///{tmp_path / 'leases.db'}")
    real = (
        fl[0]
        if cpu == 8000
        else ClusterSpec(
            name, (NodeGroup("cpu", 2, Pod(cpu=cpu, memory=32 * GI)),), reports_capacity=False
        )
    )
    backend = SimBackend(real, startup_s=0.05)
    stop = asyncio.Event()
    control = build_control_plane_worker(client, store, fl)
    control_task = asyncio.create_task(control.run())
    cluster_task = asyncio.create_task(
        run_cluster_worker(client, name, backend, tenants=[tenant], stop=stop, heartbeat_s=1.0)
    )
    try:
        yield SimPlane(client, store, fl, backend, name)
    finally:
        stop.set()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(cluster_task, 10)
        await control.shutdown()
        with contextlib.suppress(Exception):
            await control_task
        store.close()


def req(
    tenant: str,
    action_id: str,
    *,
    memory: str = "1Gi",
    duration_s: float = 0.2,
    inject: str | None = None,
    queue: str = "default",
) -> SubmitRequest:
    return SubmitRequest(
        action_id=action_id,
        queue=queue,
        demand=DemandRequest(resources={"cpu": "1", "memory": memory}),
        tenant=tenant,
        duration_s=duration_s,
        inject=inject,
    )


async def queue(p: SimPlane, tenant: str, **spec: object) -> None:
    await hw.upsert_queue(p.client, tenant, {"name": "default", **spec}, p.fleet)


async def test_an_oom_killed_action_is_retried_with_more_memory(
    sim_plane: SimPlane, tenant: str
) -> None:
    # The work needs 3Gi; asked with 1Gi it is OOMKilled, retried with 2Gi (OOMKilled
    # again), then 4Gi, which runs.
    p = sim_plane
    await queue(p, tenant, retry={"oom": 3, "oom_factor": 2})
    sub = await hw.submit_action(p.client, req(tenant, "oom1", inject="oom-below:3Gi"))
    res = await hw.wait_result(sub.handle, action_id="oom1")
    assert (res.state, res.reason) == ("succeeded", "Succeeded"), res
    st = await hw.action_state(p.client, tenant, "oom1")
    got = [(a.action_id, a.outcome) for a in st.attempts]
    assert got == [("oom1", "OOMKilled"), ("oom1~2", "OOMKilled"), ("oom1~3", "Succeeded")]
    assert "memory 1Gi -> 2Gi" in st.attempts[0].retry
    assert "memory 2Gi -> 4Gi" in st.attempts[1].retry
    # Each attempt's end is in the action's history of events, by its own id.
    ends = [(e.action_id, e.kind) for e in st.events if e.kind is not ActionEventKind.RUNNING]
    assert ("oom1", ActionEventKind.OOM_KILLED) in ends
    assert ("oom1~3", ActionEventKind.SUCCEEDED) in ends
    await eventually(lambda: _queue_idle(p.client, tenant, "default"))
    await eventually(lambda: p.store.held_count(tenant, "default") == 0)
    await _replays(sub.handle)
    # The record of what ran (issue #28) holds the action once, as it ended at last.
    history = HistoryStore(p.store)
    (rec,) = history.window(tenant, 0.0)
    assert (rec.action_id, rec.outcome, rec.reason) == ("oom1", "succeeded", "Succeeded")
    # As a user sees it: `headway describe action` lists the attempts.
    out = await _cli(p, tenant, "describe", "action", "oom1")
    assert "Attempts (3)" in out
    assert "oom1~2" in out and "memory 1Gi -> 2Gi" in out
    print("\n" + out)


async def _replays(handle: WorkflowHandle[Any, Any]) -> None:
    """The action's recorded history replays with today's code (deterministic)."""
    history = await handle.fetch_history()
    replayer = Replayer(workflows=[ActionWorkflow], data_converter=protocol.data_converter())
    result = await replayer.replay_workflow(history, raise_on_replay_failure=False)
    assert result.replay_failure is None, result.replay_failure


async def _cli(p: SimPlane, tenant: str, *args: str) -> str:
    """The ``headway`` command against the test server (in a thread: it runs its own
    event loop)."""
    addr = p.client.service_client.config.target_host
    argv = ["--address", addr, "--tenant", tenant, *args]
    res = await asyncio.to_thread(CliRunner().invoke, cli, argv, terminal_width=200)
    assert res.exit_code == 0, res.output
    return res.output


@pytest.mark.parametrize(
    ("retry", "memory", "attempts", "message"),
    [
        pytest.param({}, "1Gi", ["OOMKilled"], "OOMKilled", id="no-policy-the-oom-stands"),
        pytest.param(
            {"oom": 5, "oom_max_memory": "2Gi"},
            "1Gi",
            ["OOMKilled", "OOMKilled"],
            "OOMKilled",
            id="the-memory-cap-ends-the-retries",
        ),
        pytest.param(
            {"oom": 1},
            "20Gi",
            ["OOMKilled", "Unschedulable"],
            "OOMKilled; its retry was refused: Unschedulable: ",
            id="a-retry-no-node-can-hold-is-refused-and-the-oom-stands",
        ),
    ],
)
async def test_an_oom_without_room_to_grow_fails(
    sim_plane: SimPlane,
    tenant: str,
    retry: dict[str, object],
    memory: str,
    attempts: list[str],
    message: str,
) -> None:
    # The nodes have 32Gi; the work needs 64Gi.
    p = sim_plane
    await queue(p, tenant, retry=retry)
    r = req(tenant, "oom2", memory=memory, inject="oom-below:64Gi")
    sub = await hw.submit_action(p.client, r)
    res = await hw.wait_result(sub.handle, action_id="oom2")
    assert (res.state, res.reason) == ("failed", "OOMKilled"), res
    assert res.message.startswith(message), res.message
    st = await hw.action_state(p.client, tenant, "oom2")
    assert [a.outcome for a in st.attempts] == attempts
    await _replays(sub.handle)
    print("\n", res.reason, "-", res.message)
    await eventually(lambda: p.store.held_count(tenant, "default") == 0)


async def test_a_preempted_action_is_requeued_at_the_head_of_its_queue(
    sim_plane: SimPlane, tenant: str
) -> None:
    # One action at a time: "first" runs, "second" and "third" wait behind it. "first"
    # is preempted; its next attempt goes ahead of both, and runs to its end.
    p = sim_plane
    await queue(p, tenant, action_concurrency=1, retry={"lost": 1})
    first = await hw.submit_action(p.client, req(tenant, "first", duration_s=30))
    await eventually(lambda: _running(p, tenant, "first"))
    others = [
        await hw.submit_action(p.client, req(tenant, a, duration_s=0.2))
        for a in ("second", "third")
    ]
    assert p.backend.preempt("first")
    await eventually(lambda: _running(p, tenant, "first~2"))
    # `why first` answers for its latest attempt, which it names.
    why = await hw.why(p.client, tenant, "first")
    assert (why["action_id"], why["state"]) == ("first~2", "running"), why
    # The head of the queue: admitted before the two that waited all along.
    for a in ("second", "third"):
        assert (await hw.action_state(p.client, tenant, a)).state == "waiting"
    assert p.backend.preempt("first~2")  # its one requeue is used: this end stands
    res = await hw.wait_result(first.handle, action_id="first")
    assert (res.state, res.reason) == ("failed", "Preempted"), res
    st = await hw.action_state(p.client, tenant, "first")
    assert [(a.action_id, a.outcome) for a in st.attempts] == [
        ("first", "Preempted"),
        ("first~2", "Preempted"),
    ]
    assert "requeued at the head (retry 1 of 1)" in st.attempts[0].retry
    for sub, a in zip(others, ("second", "third"), strict=True):
        assert (await hw.wait_result(sub.handle, action_id=a)).state == "succeeded"
    await eventually(lambda: p.store.held_count(tenant, "default") == 0)


async def _running(p: SimPlane, tenant: str, attempt: str) -> bool:
    action = attempt.split("~")[0]
    st = await hw.action_state(p.client, tenant, action)
    return any(e.action_id == attempt and e.kind is ActionEventKind.RUNNING for e in st.events)


async def test_an_application_failure_is_retried_n_times_with_backoff_then_fails(
    sim_plane: SimPlane, tenant: str
) -> None:
    p = sim_plane
    await queue(p, tenant)
    # Set as a user would, on the queue as it is.
    out = await _cli(
        p, tenant, "update", "queue", "default", "--retry-failed", "2", "--retry-backoff", "1s"
    )
    assert "default" in out
    policy = (await hw.get_queues(p.client, tenant))["default"]["spec"]["retry"]
    assert (policy["failed"], policy["backoff"]) == (2, 1.0)
    shown = await _cli(p, tenant, "describe", "queue", "default")
    assert "failed 2, backoff 1s" in shown, shown
    sub = await hw.submit_action(p.client, req(tenant, "app1", inject="fail"))
    res = await hw.wait_result(sub.handle, action_id="app1")
    assert (res.state, res.reason, res.exit_code) == ("failed", "Failed", 1), res
    st = await hw.action_state(p.client, tenant, "app1")
    assert [(a.action_id, a.outcome) for a in st.attempts] == [
        ("app1", "Failed"),
        ("app1~2", "Failed"),
        ("app1~3", "Failed"),
    ]
    # The backoff doubles: 1 s, then 2 s (read from the policy's note, not the clock).
    assert "retried after 1s (retry 1 of 2)" in st.attempts[0].retry
    assert "retried after 2s (retry 2 of 2)" in st.attempts[1].retry
    assert st.attempts[2].retry == ""
    await eventually(lambda: p.store.held_count(tenant, "default") == 0)
    await eventually(lambda: _queue_idle(p.client, tenant, "default"))


async def test_a_pod_that_never_starts_is_requeued_then_fails_not_ready(
    blind_plane: SimPlane, tenant: str
) -> None:
    # Ready within 1 s of dispatch, or deleted and requeued (once, after 0.5 s).
    p = blind_plane
    await queue(p, tenant, retry={"ready_timeout": "1s", "not_ready": 1, "backoff": 0.5})
    r = req(tenant, "never")
    r.demand = DemandRequest(resources={"cpu": "2", "memory": "1Gi"})
    sub = await hw.submit_action(p.client, r)
    res = await hw.wait_result(sub.handle, action_id="never")
    assert (res.state, res.reason) == ("failed", "NotReady"), res
    # The latest word of the cluster is the reason's detail.
    assert res.message.startswith("0/1 pods running 1s after dispatch: 0/2 nodes are available")
    assert "Insufficient cpu" in res.message
    st = await hw.action_state(p.client, tenant, "never")
    assert [(a.action_id, a.outcome) for a in st.attempts] == [
        ("never", "NotReady"),
        ("never~2", "NotReady"),
    ]
    assert st.attempts[0].retry == "retried after 0.5s (retry 1 of 1)"
    await _replays(sub.handle)
    # Pods deleted, reservation released.
    assert p.backend.pods("never") == {} and p.backend.pods("never~2") == {}
    await eventually(lambda: p.store.held_count(tenant, "default") == 0)
    await eventually(lambda: _queue_idle(p.client, tenant, "default"))
    print("\nready timeout:", res.reason, "-", res.message)


async def test_an_action_cancelled_while_it_backs_off_ends_cancelled_holding_nothing(
    sim_plane: SimPlane, tenant: str
) -> None:
    p = sim_plane
    await queue(p, tenant, retry={"failed": 3, "backoff": "1h"})
    sub = await hw.submit_action(p.client, req(tenant, "app2", inject="fail"))

    async def backing_off() -> bool:
        st = await hw.action_state(p.client, tenant, "app2")
        return st.reason == "Retrying"

    await eventually(backing_off)
    why = await hw.why(p.client, tenant, "app2")
    assert why["reason"] == "Retrying", why
    assert why["message"] == "attempt 1 ended Failed: retried after 3600s (retry 1 of 3)"
    await eventually(lambda: p.store.held_count(tenant, "default") == 0)  # released
    await hw.cancel(p.client, tenant, "app2")
    res = await hw.wait_result(sub.handle, action_id="app2")
    assert res.state == "cancelled", res
    st = await hw.action_state(p.client, tenant, "app2")
    assert [(a.action_id, a.outcome) for a in st.attempts] == [("app2", "Failed")]
    assert p.store.held_count(tenant, "default") == 0
    await eventually(lambda: _queue_idle(p.client, tenant, "default"))


async def test_the_readme_retry_commands_run_as_written(sim_plane: SimPlane, tenant: str) -> None:
    p = sim_plane
    for line in (
        "create queue backfill --priority low --run-concurrency 10"
        " --action-concurrency 200 --depth 10000 --max-gpu 8",
        "update queue backfill --retry-oom 2 --retry-oom-max-memory 64Gi"
        " --retry-lost 3 --retry-failed 1 --retry-backoff 1m",
        "update queue backfill --retry-ready-timeout 10m",
    ):
        await _cli(p, tenant, *line.split())
    got = (await hw.get_queues(p.client, tenant))["backfill"]["spec"]["retry"]
    assert got == {
        "oom": 2,
        "oom_factor": 2.0,
        "oom_max_memory": 64 * GI,
        "lost": 3,
        "failed": 1,
        "backoff": 60.0,
        "ready_timeout": 600.0,
        "not_ready": 2,
    }
    shown = await _cli(p, tenant, "describe", "queue", "backfill")
    # (wrapped at 80 columns)
    assert "retry:               oom 2 (memory x2, up to 64Gi), lost 3 (at the head)," in shown
    assert "failed 1, ready within 10m00s (2 requeues), backoff 1m00s" in shown, shown
    # 'unlimited' unsets the ready timeout.
    await _cli(p, tenant, "update", "queue", "backfill", "--retry-ready-timeout", "unlimited")
    got = (await hw.get_queues(p.client, tenant))["backfill"]["spec"]["retry"]
    assert got["ready_timeout"] is None
