"""Cluster workers that die and come back, on a real Temporal dev server.

The simulated cluster's worker is a real ``headway worker cluster`` process killed with
SIGKILL in the middle of an action; the Kubernetes one is an in-process worker stopped
and started again while its pod's node disappears from the fake API server. In both, the
restarted worker's retried ``run_action`` must never create the pod again: the pod log
(``HEADWAY_POD_LOG``, the backend's own audit trail) shows each pod created once.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from click.testing import CliRunner
from headway.activities.backends.base import POD_LOG_ENV
from headway.activities.backends.kubernetes import KubernetesBackend
from headway.cli.main import cli
from headway.protocol import (
    ACTION_EVENT_SIGNAL,
    RUN_ACTION_ACTIVITY,
    ActionEvent,
    CapacityReport,
    DispatchRequest,
    GangKind,
    PodSpec,
    cluster_task_queue,
    scheduler_workflow_id,
)
from headway.protocol import ActionEventKind as K
from headway.worker.cluster import Incarnation, make_backend, run_cluster_worker
from kubernetes import client as k8s
from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import UnsandboxedWorkflowRunner, Worker

from .fake_kube import FakeKube
from .helpers import GI, pod_of
from .test_kubernetes import NS, RUNNING, SCHEDULED, add_node, patch_pod
from .test_worker import FakeScheduler

QUEUE = "cluster-restart-test"
#: The worker heartbeats every 5 s by default: a dead one is noticed after this.
HEARTBEAT_TIMEOUT = timedelta(seconds=10)

FLEET = """\
clusters:
  - name: {name}
    node_groups:
      - {{name: cpu, count: 2, shape: {{cpu: 4, memory: 16Gi}}}}
queues:
  - name: default
"""


@workflow.defn(name="RetriedAction")
class RetriedAction:
    """An action workflow reduced to its run_action: retried as the real one is."""

    def __init__(self) -> None:
        self.events: list[ActionEvent] = []

    @workflow.signal(name=ACTION_EVENT_SIGNAL)
    def event(self, event: ActionEvent) -> None:
        self.events.append(event)

    @workflow.query
    def kinds(self) -> list[str]:
        return [str(e.kind) for e in self.events]

    @workflow.run
    async def run(self, req: DispatchRequest) -> ActionEvent:
        result: ActionEvent = await workflow.execute_activity(
            RUN_ACTION_ACTIVITY,
            req,
            task_queue=cluster_task_queue(req.cluster),
            start_to_close_timeout=timedelta(minutes=5),
            heartbeat_timeout=HEARTBEAT_TIMEOUT,
            retry_policy=RetryPolicy(
                initial_interval=timedelta(milliseconds=200),
                backoff_coefficient=1.0,
                maximum_attempts=10,
            ),
            result_type=ActionEvent,
        )
        return result


@pytest_asyncio.fixture
async def action_worker(temporal_env: WorkflowEnvironment) -> AsyncIterator[Worker]:
    async with Worker(
        temporal_env.client,
        task_queue=QUEUE,
        workflows=[RetriedAction, FakeScheduler],
        workflow_runner=UnsandboxedWorkflowRunner(),
    ) as w:
        yield w


def pod_lines(path: Path, action: str) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [
        line
        for line in (json.loads(x) for x in path.read_text().splitlines() if x.strip())
        if line["action"] == action
    ]


async def run_attempts(env: WorkflowEnvironment, workflow_id: str) -> list[int]:
    """The attempt numbers of every run_action start in the workflow's history."""
    attempts = []
    async for event in env.client.get_workflow_handle(workflow_id).fetch_history_events():
        if event.HasField("activity_task_started_event_attributes"):
            attempts.append(event.activity_task_started_event_attributes.attempt)
    return attempts


class WorkerProcess:
    """``headway worker cluster`` as its own process (killed by pid, never by name)."""

    def __init__(self, tmp: Path, address: str, cluster: str, pod_log: Path) -> None:
        self.tmp = tmp
        self.pod_log = pod_log
        fleet = tmp / "fleet.yaml"
        fleet.write_text(FLEET.format(name=cluster))
        #: The tenant the worker serves (the requests' own).
        self.tenant = f"t-{uuid.uuid4().hex[:6]}"
        self.argv = [
            sys.executable,
            "-m",
            "headway.cli",
            "--address",
            address,
            "--tenant",
            self.tenant,
            "worker",
            "cluster",
            "--name",
            cluster,
            "--backend",
            "sim",
            "--fleet",
            str(fleet),
            "--state-dir",
            str(tmp / "state"),
            "--time-scale",
            "0.1",
        ]
        self.procs: list[subprocess.Popen[bytes]] = []

    def start(self) -> None:
        log = (self.tmp / f"worker-{len(self.procs)}.log").open("ab")
        try:
            self.procs.append(
                subprocess.Popen(
                    self.argv,
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    env={**os.environ, POD_LOG_ENV: str(self.pod_log)},
                )
            )
        finally:
            log.close()

    def kill(self) -> None:
        proc = self.procs[-1]
        os.kill(proc.pid, signal.SIGKILL)
        assert proc.wait(timeout=10) == -signal.SIGKILL

    def stop_all(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(timeout=5)

    def logs(self) -> str:
        return "\n".join(
            p.read_text(errors="replace") for p in sorted(self.tmp.glob("worker-*.log"))
        )


@pytest.fixture
def worker_process(tmp_path: Path, temporal_env: WorkflowEnvironment) -> Iterator[WorkerProcess]:
    address = temporal_env.client.service_client.config.target_host
    wp = WorkerProcess(tmp_path, address, f"k9-{uuid.uuid4().hex[:6]}", tmp_path / "pods.jsonl")
    try:
        yield wp
    finally:
        wp.stop_all()


@pytest.mark.parametrize(
    ("runs_s", "wait_until_ended"),
    [
        # The pod outlives the dead worker's heartbeat timeout: the retry adopts it running.
        (20.0, False),
        # The pod should have ended while no worker ran: the restarted cluster ends it at
        # once with its outcome, and the retry adopts that.
        (2.0, True),
    ],
    ids=["adopts-running", "ended-while-down"],
)
async def test_sigkilled_sim_worker_is_adopted_without_a_second_creation(
    temporal_env: WorkflowEnvironment,
    action_worker: Worker,
    worker_process: WorkerProcess,
    runs_s: float,
    wait_until_ended: bool,
) -> None:
    wp = worker_process
    cluster = wp.argv[wp.argv.index("--name") + 1]
    action = f"k9-{uuid.uuid4().hex[:6]}"
    req = DispatchRequest(
        tenant=wp.tenant,
        action_id=action,
        workflow_id=f"wf-{action}",
        cluster=cluster,
        kind=GangKind.SINGLE,
        pods=[PodSpec(role="main", index=0, cpu_m=1000, memory=GI)],
        duration_s=runs_s * 10,  # at --time-scale 0.1
    )
    wp.start()
    handle = await temporal_env.client.start_workflow(
        RetriedAction.run, req, id=req.workflow_id, task_queue=QUEUE
    )
    async with asyncio.timeout(60):
        while not any(x["event"] == "bound" for x in pod_lines(wp.pod_log, action)):
            await asyncio.sleep(0.05)
    wp.kill()  # mid-action: the pod is bound and running
    state = json.loads((wp.tmp / "state" / f"sim-{cluster}.json").read_text())
    (pod,) = state["pods"]
    if wait_until_ended:
        async with asyncio.timeout(30):
            while pod["ends_at"] + 0.2 > time.time():
                await asyncio.sleep(0.1)
    wp.start()

    result = await asyncio.wait_for(handle.result(), 90)
    assert result.kind is K.SUCCEEDED, (result, wp.logs())
    lines = pod_lines(wp.pod_log, action)
    created = [x for x in lines if x["event"] == "created"]
    ended = [x for x in lines if x["event"] == "ended"]
    assert len(created) == 1, lines
    assert len(ended) == 1 and ended[0]["outcome"] == "Succeeded", lines
    assert [x["event"] for x in lines] == ["created", "bound", "ended"]
    # Ended by the restarted process, on the node it was bound to by the killed one.
    assert ended[0]["incarnation"] != created[0]["incarnation"]
    assert ended[0]["node"] == pod["node"]
    if wait_until_ended:
        assert ended[0]["t"] >= pod["ends_at"]
    # Temporal retried the activity on the new worker: the retry adopted, never created.
    attempts = await run_attempts(temporal_env, req.workflow_id)
    assert max(attempts) >= 2, attempts
    # The kill may come before the first attempt's signal; never is it scheduled twice.
    kinds = await handle.query(RetriedAction.kinds)
    assert kinds.count("Scheduled") <= 1 and kinds[-1] == "Succeeded", kinds


async def test_kubernetes_worker_restart_while_the_node_and_its_pod_disappear(
    temporal_env: WorkflowEnvironment, action_worker: Worker, kube: FakeKube, tmp_path: Path
) -> None:
    client = temporal_env.client
    cluster = f"k8s-r-{uuid.uuid4().hex[:6]}"
    pod_log = tmp_path / "pods.jsonl"
    await add_node(kube, "n1", cpu="8", memory="32Gi")

    def new_backend() -> KubernetesBackend:
        cfg = k8s.Configuration()
        cfg.host = str(kube.url).rstrip("/")
        return KubernetesBackend(
            cluster,
            namespace=NS,
            api_client=k8s.ApiClient(cfg),
            backoff_initial_s=0.05,
            backoff_max_s=0.2,
            pod_log=str(pod_log),
        )

    async def worker(stop: asyncio.Event) -> None:
        await run_cluster_worker(
            client, cluster, new_backend(), tenants=["nobody"], stop=stop, heartbeat_s=0.5
        )

    stop_a = asyncio.Event()
    first = asyncio.create_task(worker(stop_a))
    action = f"kr-{uuid.uuid4().hex[:6]}"
    req = DispatchRequest(
        tenant="nobody",  # the tenant the worker serves
        action_id=action,
        workflow_id=f"wf-{action}",
        cluster=cluster,
        kind=GangKind.SINGLE,
        pods=[PodSpec(role="main", index=0, cpu_m=1000, memory=GI)],
        namespace=NS,
    )
    handle = await client.start_workflow(
        RetriedAction.run, req, id=req.workflow_id, task_queue=QUEUE
    )
    pod = pod_of(action, tenant=req.tenant)
    async with asyncio.timeout(30):
        while not kube.live("pods"):
            await asyncio.sleep(0.05)
    await patch_pod(kube, pod, SCHEDULED)
    await patch_pod(kube, pod, RUNNING)
    async with asyncio.timeout(30):
        while "Running" not in await handle.query(RetriedAction.kinds):
            await asyncio.sleep(0.1)
    stop_a.set()  # the worker goes (a rollout); its pods stay for the successor
    await asyncio.wait_for(first, 30)
    assert [p["metadata"]["name"] for p in kube.live("pods")] == [pod]

    assert await kube.lose_node("n1") == [pod]  # ...and while nobody watches, the node goes
    stop_b = asyncio.Event()
    second = asyncio.create_task(worker(stop_b))
    try:
        result = await asyncio.wait_for(handle.result(), 60)
    finally:
        stop_b.set()
        await asyncio.wait_for(second, 30)
    assert result.kind is K.NODE_LOST, result
    assert result.pod == pod and result.node == "n1"
    # The pod's finalizer kept it, marked by the pod GC, for the successor to read.
    assert "node n1 no longer exists" in result.message
    assert kube.live("pods") == [], "its finalizer lifted once the outcome was recorded"
    posts = [r for r in list(kube) if r.method == "POST" and str(r.url).endswith("/pods")]
    assert len(posts) == 1, "created once, by the first worker"
    lines = pod_lines(pod_log, action)
    assert [(x["event"], x["outcome"]) for x in lines] == [
        ("creating", None),
        ("created", None),
        ("bound", None),
        # Its finalizer kept the pod the GC marked: the log knows how it ended.
        ("ended", "NodeLost"),
    ]
    assert lines[1]["incarnation"] != lines[3]["incarnation"]
    assert max(await run_attempts(temporal_env, req.workflow_id)) >= 2


async def test_every_capacity_report_names_its_worker_incarnation(
    temporal_env: WorkflowEnvironment, action_worker: Worker
) -> None:
    client = temporal_env.client
    tenant = f"inc-{uuid.uuid4().hex[:6]}"
    sched = await client.start_workflow(
        FakeScheduler.run, id=scheduler_workflow_id(tenant), task_queue=QUEUE
    )

    async def reports() -> list[CapacityReport]:
        got: list[CapacityReport] = await sched.query("received", result_type=list[CapacityReport])
        return got

    incarnations = [Incarnation(), Incarnation()]
    for n, me in enumerate(incarnations, start=1):
        stop = asyncio.Event()
        task = asyncio.create_task(
            run_cluster_worker(
                client,
                "inc",
                make_backend("inc", "sim", None),
                tenants=[tenant],
                stop=stop,
                incarnation=me,
                gc_interval_s=None,
            )
        )
        async with asyncio.timeout(15):
            while len({r.incarnation for r in await reports()}) < n:
                await asyncio.sleep(0.05)
        stop.set()
        await asyncio.wait_for(task, 15)
    got = await reports()
    assert [r.incarnation for r in got[:1]] == [incarnations[0].id]
    assert {r.incarnation for r in got} == {i.id for i in incarnations}
    for r in got:
        me = next(i for i in incarnations if i.id == r.incarnation)
        assert r.started_at == me.started_at
    # The restarted worker numbers from 1 again; (started_at, sequence) still orders them.
    second = [r for r in got if r.incarnation == incarnations[1].id]
    assert second[0].sequence == 1
    keys = [(r.started_at, r.sequence) for r in got]
    assert keys == sorted(keys)
    assert incarnations[0].started_at <= incarnations[1].started_at
    await sched.terminate()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["--backend", "kubernetes", "--state-dir", "x"],
            "--state-dir does not apply to --backend kubernetes",
        ),
        (["--backend", "sim", "--state-dir", "{bad}"], "state_dir: cannot resume from"),
    ],
    ids=["state-dir-on-kubernetes", "unreadable-state"],
)
def test_worker_cluster_flags_are_checked_before_connecting(tmp_path, args, message):
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "sim-local.json").write_text("{torn")
    args = [a.replace("{bad}", str(bad)) for a in args]
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text(FLEET.format(name="local"))
    result = CliRunner().invoke(
        cli,
        [
            "--address",
            "127.0.0.1:1",
            "worker",
            "cluster",
            "--name",
            "local",
            "--fleet",
            str(fleet),
            *args,
        ],
    )
    assert result.exit_code != 0
    assert message in result.output, result.output
