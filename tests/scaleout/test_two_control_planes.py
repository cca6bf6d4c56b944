"""Scale-out: two control-plane worker processes share one Temporal server and one
PostgreSQL store and serve the same shard; one is killed with ``kill -9`` mid-run and the
other carries on. Every action ends exactly once, nothing is lost, no cap or node is
overcommitted: the fault suite's audit (``tests/faults/audit.py``) over Temporal's
histories and the clusters' pod logs.

PostgreSQL: ``HEADWAY_TEST_POSTGRES_URL`` (default the CI's local server), started with
``pg_ctlcluster`` when it is installed but down, as ``.ci/run`` does; the run gets a
fresh database of its own, dropped at the end.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from headway import protocol
from headway.cli._common import free_port
from headway.connection import ConnectionOptions
from headway.scheduler.scenario import parse_fleet
from headway.tests.faults.audit import audit, node_capacities
from headway.tests.faults.procs import Supervisor, headway_argv, server_command, start_server
from headway.tests.faults.records import read_histories, read_pod_logs, retrying
from headway.tests.faults.run import _request
from headway.tests.faults.workload import FLEET_YAML, make_workload
from headway.workflows import client as hw
from sqlalchemy import create_engine, make_url, text
from temporalio.api.enums.v1 import TaskQueueType
from temporalio.api.taskqueue.v1 import TaskQueue
from temporalio.api.workflowservice.v1 import DescribeTaskQueueRequest
from temporalio.client import Client

pytestmark = pytest.mark.integration

PG_ENV = "HEADWAY_TEST_POSTGRES_URL"
PG_DEFAULT = "postgresql+psycopg://postgres@127.0.0.1:5432/test"
TENANT = "scale"
ACTIONS = 120


def _postgres_up(url: str) -> None:
    """Start the local PostgreSQL when it is installed and down (as .ci/run does)."""
    u = make_url(url)
    host, port = u.host or "127.0.0.1", str(u.port or 5432)
    if shutil.which("pg_isready") is None:
        return
    if subprocess.run(["pg_isready", "-q", "-h", host, "-p", port], check=False).returncode == 0:
        return
    versions = os.listdir("/etc/postgresql") if os.path.isdir("/etc/postgresql") else []
    if versions:
        subprocess.run(
            ["pg_ctlcluster", "--skip-systemctl-redirect", versions[0], "main", "start"],
            check=False,
            capture_output=True,
        )
    for _ in range(30):
        ok = subprocess.run(["pg_isready", "-q", "-h", host, "-p", port], check=False)
        if ok.returncode == 0:
            return
        time.sleep(1)
    pytest.fail(f"PostgreSQL at {host}:{port} is down and could not be started")


@contextlib.contextmanager
def fresh_database() -> Iterator[str]:
    url = os.environ.get(PG_ENV) or PG_DEFAULT
    _postgres_up(url)
    name = f"hw_scale_{uuid.uuid4().hex[:12]}"
    admin = create_engine(url, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    try:
        yield make_url(url).set(database=name).render_as_string(hide_password=False)
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


async def control_pollers(client: Client) -> set[str]:
    """The identities polling the control plane's workflow task queue."""
    resp = await client.workflow_service.describe_task_queue(
        DescribeTaskQueueRequest(
            namespace=client.namespace,
            task_queue=TaskQueue(name=protocol.CONTROL_TASK_QUEUE),
            task_queue_type=TaskQueueType.TASK_QUEUE_TYPE_WORKFLOW,
        )
    )
    return {p.identity for p in resp.pollers}


async def ended(client: Client) -> tuple[int, int]:
    base = f"WorkflowType='{protocol.ACTION_WORKFLOW}'"
    total = (await client.count_workflows(base)).count
    running = (await client.count_workflows(f"{base} AND ExecutionStatus='Running'")).count
    return total, total - running


async def test_two_control_planes_on_postgres_survive_a_kill_9_of_one(tmp_path: Path) -> None:
    fleet_path = tmp_path / "fleet.yaml"
    fleet_path.write_text(FLEET_YAML)
    fleet = parse_fleet(FLEET_YAML, str(fleet_path))
    planned = make_workload(random.Random(27), ACTIONS, prefix="s")
    with fresh_database() as db:
        port = free_port()
        address = f"127.0.0.1:{port}"
        sup = Supervisor(tmp_path)
        sup.add("temporal-server", server_command(tmp_path, port))
        common = ["--address", address, "--tenant", TENANT]
        plane = ["worker", "control-plane", "--fleet", str(fleet_path), "--database-url", db]
        for n in (1, 2):
            sup.add(f"control-plane-{n}", headway_argv(*common, *plane))
        logs = []
        for c in fleet.clusters:
            logs.append(tmp_path / f"pods-{c.name}.jsonl")
            state = str(tmp_path / "sim" / c.name)
            sim = ["--backend", "sim", "--state-dir", state, "--fleet", str(fleet_path)]
            sup.add(
                f"cluster-{c.name}",
                headway_argv(*common, "worker", "cluster", "--name", c.name, *sim),
                env={"HEADWAY_POD_LOG": str(logs[-1])},
            )
        try:
            await asyncio.to_thread(start_server, sup, "temporal-server", port)
            for name in sup.procs:
                if name != "temporal-server":
                    sup.start(name)
            client = await retrying(lambda: ConnectionOptions(address).connect(interceptors=[]))

            async def both_poll() -> None:
                while len(await control_pollers(client)) < 2:
                    dead = [p.name for p in sup.procs.values() if not p.alive]
                    assert not dead, f"{dead} exited:\n{sup.procs[dead[0]].tail()}"
                    await asyncio.sleep(0.3)

            await asyncio.wait_for(both_poll(), 120)
            pollers = await control_pollers(client)
            await hw.ensure_scheduler(client, TENANT, list(fleet.clusters))

            async def submit_all() -> None:
                sem = asyncio.Semaphore(8)

                async def one(i: int) -> None:
                    async with sem:
                        await asyncio.sleep(i * 0.1)  # ~12 s of arrivals
                        await retrying(
                            lambda: hw.submit_action(client, _request(planned[i], TENANT))
                        )

                await asyncio.gather(*(one(i) for i in range(len(planned))))

            submitter = asyncio.create_task(submit_all())
            # Mid-run: a third of the work ended, more still to come and waiting.
            while (await ended(client))[1] < ACTIONS // 3:
                await asyncio.sleep(0.5)
            done_at_kill = (await ended(client))[1]
            victim = "control-plane-1"
            sup.kill9(victim)
            killed_at = time.monotonic()
            print(f"kill -9 {victim} with {done_at_kill}/{ACTIONS} ended", file=sys.stderr)
            await submitter

            async def all_ended() -> None:
                while (await ended(client)) != (ACTIONS, ACTIONS):
                    assert sup.procs["control-plane-2"].alive, sup.procs["control-plane-2"].tail()
                    await asyncio.sleep(1.0)

            await asyncio.wait_for(all_ended(), 300)
            recovery_s = time.monotonic() - killed_at
            after = await control_pollers(client)
            for name in list(sup.procs):
                if name.startswith("cluster-"):
                    sup.stop(name)
            histories = await read_histories(client, TENANT, [p.action_id for p in planned])
        finally:
            sup.stop_all()
    pod_lines, torn = read_pod_logs(logs)
    report = audit(
        planned,
        histories,
        pod_lines,
        queues={q.name: q for q in fleet.queues},
        nodes=node_capacities(fleet.clusters),
        torn_lines=len(torn),
    )
    figures = report.figures()
    print(
        f"two control planes on PostgreSQL: {figures} ended after the kill: "
        f"{ACTIONS - done_at_kill}, all ended {recovery_s:.1f}s after it",
        file=sys.stderr,
    )
    assert len(pollers) == 2  # both served the shard's task queue before the kill
    assert len(after) >= 1
    assert report.ok, str(report)
    assert figures["ended_once"] == ACTIONS and figures["lost"] == 0 and figures["twice"] == 0
