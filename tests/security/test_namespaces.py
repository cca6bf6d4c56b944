"""Tenants isolated by namespace: the tenant -> namespace mapping is configured once (a
config file every component reads), each tenant's control plane runs in its namespace,
and the proxy grants each API key its namespaces (as Temporal Cloud's namespace-scoped
keys do), so a client of team-a cannot list, update or submit to team-b's queues.

A cluster worker serves exactly the tenants it is given, in their namespaces; an
admission or a capacity report for another tenant is refused and logged."""

from __future__ import annotations

import asyncio
import json
import logging
import subprocess
import uuid
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from headway import protocol
from headway.connection import ConnectionOptions
from headway.protocol import CapacityReport, DispatchRequest, GangKind, PodSpec
from headway.scheduler.model import ClusterSpec
from headway.worker.cluster import (
    DEFAULT_SIM_CLUSTER,
    _send_report,
    make_backend,
    run_cluster_worker,
)
from temporalio import workflow
from temporalio.client import WorkflowFailureError
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError, ApplicationError
from temporalio.service import RPCError, RPCStatusCode
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker
from waiting import eventually

from .conftest import FLEET, KEY_A, KEY_ALL, KEY_B, Rig, clean_env, components, headway

pytestmark = pytest.mark.integration


def config_file(rig: Rig, d: Path) -> Path:
    """The one place the mapping is configured (plus the proxy and its CA)."""
    path = d / "headway.yaml"
    path.write_text(
        f"address: {rig.proxies['apikey'].address}\n"
        f"tls-ca-path: {rig.pki.ca}\n"
        "tenant-namespaces:\n  team-a: hw-a\n  team-b: hw-b\n"
    )
    return path


def run(config: Path, key: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = clean_env({"HEADWAY_CONFIG": str(config), "HEADWAY_TEMPORAL_API_KEY": key})
    return subprocess.run(headway(*args), capture_output=True, text=True, timeout=120, env=env)


@pytest.fixture(scope="module")
def tenants(rig: Rig, tmp_path_factory: pytest.TempPathFactory) -> Any:
    d = tmp_path_factory.mktemp("tenants")
    config = config_file(rig, d)
    fleet = d / "fleet.yaml"
    fleet.write_text(FLEET)

    def env(key: str) -> dict[str, str]:
        return clean_env({"HEADWAY_CONFIG": str(config), "HEADWAY_TEMPORAL_API_KEY": key})

    def plane(tenant: str) -> list[str]:
        return headway(
            "--tenant", tenant, "worker", "control-plane", "--fleet", str(fleet),
            "--database-url", f"sqlite:///{d / (tenant + '.db')}",
        )  # fmt: skip

    cluster = headway(
        "worker", "cluster", "--name", "c1", "--backend", "sim", "--fleet", str(fleet),
        "--serve-tenant", "team-a", "--serve-tenant", "team-b",
    )  # fmt: skip
    with components(
        [
            # Each control plane holds only its own namespace's key.
            ("control-plane-a", plane("team-a"), env(KEY_A)),
            ("control-plane-b", plane("team-b"), env(KEY_B)),
            # The shared cluster's worker is given both namespaces.
            ("cluster-c1", cluster, env(KEY_ALL)),
        ],
        d,
    ) as procs:
        for p in procs:
            eventually(
                lambda p=p: "worker ready" in p.text() or None,  # type: ignore[misc]
                f"{p.name} ready",
                90,
                show=p.text,
            )
        yield config, procs


def test_each_tenant_works_in_its_own_namespace(tenants: Any) -> None:
    config, procs = tenants
    cluster = next(p for p in procs if p.name == "cluster-c1")
    assert "namespace hw-a: team-a; namespace hw-b: team-b" in cluster.text()
    for tenant, key in (("team-a", KEY_A), ("team-b", KEY_B)):
        res = run(
            config, key, "--tenant", tenant, "submit", "--id", f"own-{tenant}",
            "--cpu", "1", "--duration", "0.2", "--wait",
        )  # fmt: skip
        assert res.returncode == 0, res.stdout + res.stderr
        # It lives in the tenant's namespace (the mapping), not in "default".
        assert f"/namespaces/hw-{tenant[-1]}/" in res.stdout, res.stdout


ACROSS = [
    pytest.param(["get", "queues"], id="list"),
    pytest.param(["update", "queue", "default", "--action-concurrency", "1"], id="update"),
    pytest.param(["submit", "--id", "sneak-1", "--cpu", "1"], id="submit"),
    pytest.param(["describe", "queue", "default"], id="describe"),
]


@pytest.mark.parametrize("args", ACROSS)
def test_a_client_of_team_a_cannot_touch_team_b(tenants: Any, args: list[str]) -> None:
    config, _ = tenants
    res = run(config, KEY_A, "--tenant", "team-b", *args)
    print(f"$ headway --tenant team-b {' '.join(args)}   (team-a's key)\n{res.stderr.strip()}")
    assert res.returncode == 1
    assert res.stderr.strip().splitlines() == [
        "Error: Temporal at "
        f"{config.read_text().split()[1]} refused namespace 'hw-b' to these credentials "
        "(Request unauthorized: API key not granted this namespace): the API key or "
        "certificate is not granted it"
    ]
    # team-b's own client sees its queue untouched and no sneaked-in action.
    own = run(config, KEY_B, "--tenant", "team-b", "get", "queues", "-o", "json")
    assert own.returncode == 0, own.stderr
    (default,) = [q for q in json.loads(own.stdout) if q["name"] == "default"]
    assert default.get("action_concurrency") != 1
    gone = run(config, KEY_B, "--tenant", "team-b", "describe", "action", "sneak-1")
    assert gone.returncode == 1


def test_a_namespace_that_is_not_the_tenants_is_a_usage_error(tenants: Any) -> None:
    config, _ = tenants
    res = run(config, KEY_A, "--tenant", "team-b", "--namespace", "hw-a", "get", "queues")
    assert res.returncode == 2
    assert (
        "--namespace: 'hw-a' is not tenant 'team-b''s namespace (it lives in 'hw-b' per "
        "tenant-namespaces)" in res.stderr
    )


async def test_the_sdk_of_team_a_cannot_submit_to_team_b(
    tenants: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from headway.sdk import Client, Resources, Task

    config, _ = tenants
    monkeypatch.setenv("HEADWAY_CONFIG", str(config))
    monkeypatch.setenv("HEADWAY_TEMPORAL_API_KEY", KEY_A)
    hw = await Client.connect(tenant="team-b")
    assert hw.temporal.namespace == "hw-b"
    with pytest.raises(RPCError) as err:
        await hw.submit(Task("sneak", Resources(cpu=1)))
    assert err.value.status == RPCStatusCode.PERMISSION_DENIED


# --- the cluster worker's guard ---------------------------------------------------------


@workflow.defn(sandboxed=False)
class ForgedAdmission:
    """Calls a cluster's run_action directly, as anyone who can reach its task queue
    could, for a tenant of their choosing."""

    @workflow.run
    async def run(self, cluster: str, req: DispatchRequest) -> Any:
        return await workflow.execute_activity(
            protocol.RUN_ACTION_ACTIVITY,
            req,
            task_queue=protocol.cluster_task_queue(cluster),
            start_to_close_timeout=timedelta(seconds=30),
            retry_policy=RetryPolicy(maximum_attempts=3),
        )


async def test_a_cluster_worker_refuses_an_admission_of_a_tenant_it_does_not_serve(
    temporal_env: WorkflowEnvironment, caplog: pytest.LogCaptureFixture
) -> None:
    client = temporal_env.client
    uid = uuid.uuid4().hex[:6]
    cluster, queue = f"guarded-{uid}", f"forger-{uid}"
    spec = ClusterSpec(cluster, DEFAULT_SIM_CLUSTER.node_groups)
    stop = asyncio.Event()
    caplog.set_level(logging.WARNING, logger="headway.worker.cluster")
    served = asyncio.create_task(
        run_cluster_worker(
            client,
            cluster,
            make_backend(cluster, "sim", spec),
            tenants=["owner"],
            stop=stop,
            gc_interval_s=None,
            refuse_other_tenants=True,
        )
    )
    req = DispatchRequest(
        tenant="intruder",
        action_id="a1",
        workflow_id=protocol.action_workflow_id("intruder", "a1"),
        cluster=cluster,
        kind=GangKind.SINGLE,
        pods=[PodSpec(role="main", index=0, cpu_m=1000)],
    )
    try:
        async with Worker(client, task_queue=queue, workflows=[ForgedAdmission]):
            with pytest.raises(WorkflowFailureError) as err:
                await client.execute_workflow(
                    ForgedAdmission.run, args=[cluster, req], id=f"forge-{uid}", task_queue=queue
                )
    finally:
        stop.set()
        await asyncio.wait_for(served, 30)
    cause = err.value.cause
    assert isinstance(cause, ActivityError)
    app = cause.cause
    assert isinstance(app, ApplicationError) and app.type == "TenantNotServed"
    assert app.non_retryable
    assert f"does not serve tenant 'intruder' in namespace '{client.namespace}'" in app.message
    assert any("refused action a1" in r.getMessage() for r in caplog.records)


async def test_a_capacity_report_for_a_tenant_not_served_is_refused_and_logged(
    temporal_env: WorkflowEnvironment, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="headway.worker.cluster")
    report = CapacityReport(cluster="c1", nodes=None)
    sent = await _send_report(temporal_env.client, "intruder", report, served=["owner"])
    assert sent is False
    assert any(
        "refused a capacity report of c1 for tenant 'intruder'" in r.getMessage()
        for r in caplog.records
    )


def test_the_connection_options_never_show_the_key() -> None:
    opts = ConnectionOptions("h:7233", api_key="hwk-secret-1234", tls_ca_path="/ca.pem")
    assert "hwk-secret-1234" not in repr(opts) + str(opts) + opts.describe()
    assert opts.describe() == "h:7233 (namespace default, TLS, API key)"
