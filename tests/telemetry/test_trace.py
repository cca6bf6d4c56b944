"""One trace per action: the CLI's submission starts it; the action workflow, its
activities, the cluster worker's pod creation and the informer's events join it.

Live: the real Temporal dev server, the real control-plane worker and a simulated
cluster worker (in this process, so one in-memory span exporter sees every span), and
``headway submit`` itself through its click entry point.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, replace
from pathlib import Path

import pytest
import pytest_asyncio
from click.testing import CliRunner
from headway import protocol, telemetry
from headway.cli.main import cli
from headway.worker.cluster import DEFAULT_SIM_CLUSTER, make_backend, run_cluster_worker
from headway.worker.control_plane import run_control_plane_worker
from headway.workflows import client as hw
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from temporalio.client import Client
from temporalio.testing import WorkflowEnvironment

pytestmark = pytest.mark.integration


@dataclass
class Plane:
    address: str
    tenant: str
    cluster: str
    spans: InMemorySpanExporter


@pytest_asyncio.fixture
async def plane(temporal_env: WorkflowEnvironment, tmp_path: Path) -> AsyncIterator[Plane]:
    spans = InMemorySpanExporter()
    telemetry.setup("test", span_processors=[SimpleSpanProcessor(spans)], exporter="none")
    base = temporal_env.client
    # The workers' client, as `headway worker` connects: the tracing interceptor on the
    # client is on every worker built from it too.
    client = await Client.connect(
        base.service_client.config.target_host,
        namespace=base.namespace,
        interceptors=telemetry.interceptors(),
        data_converter=protocol.data_converter(),
    )
    uid = uuid.uuid4().hex[:6]
    tenant, cluster = f"trace-{uid}", f"tc-{uid}"
    spec = replace(DEFAULT_SIM_CLUSTER, name=cluster)
    stop = asyncio.Event()
    ready = asyncio.Event()
    workers = [
        asyncio.create_task(
            run_control_plane_worker(
                client,
                database_url=f"sqlite:///{tmp_path / 'headway.db'}",
                fleet=[spec],
                stop=stop,
                seed_queues=[{"name": "default"}],
                seed_tenant=tenant,
                on_ready=lambda _tenants: ready.set(),
            )
        ),
        asyncio.create_task(
            run_cluster_worker(
                client, cluster, make_backend(cluster, "sim", spec), tenants=[tenant], stop=stop
            )
        ),
    ]
    try:
        await asyncio.wait_for(ready.wait(), 60)

        async def reported() -> None:
            while not (await hw.get_fleet(client, tenant)).get("capacity"):
                await asyncio.sleep(0.2)

        await asyncio.wait_for(reported(), 60)
        yield Plane(base.service_client.config.target_host, tenant, cluster, spans)
    finally:
        stop.set()
        await asyncio.gather(*workers, return_exceptions=True)
        # The rest of the session keeps no in-memory exporter (it would hold every span).
        telemetry.setup("test", exporter="none")


def _trace_of(spans: list[ReadableSpan], root: ReadableSpan) -> list[ReadableSpan]:
    assert root.context is not None
    return [
        s for s in spans if s.context is not None and s.context.trace_id == root.context.trace_id
    ]


async def test_one_action_is_one_trace_from_submit_to_its_pods(plane: Plane) -> None:
    action = f"traced-{uuid.uuid4().hex[:6]}"
    args = ["--address", plane.address, "--tenant", plane.tenant, "submit", "--id", action]
    # `headway submit` runs its own event loop: off this one.
    result = await asyncio.to_thread(
        CliRunner().invoke,
        cli,
        [*args, "--cpu", "1", "--replicas", "2", "--duration", "0.2", "--wait"],
    )
    assert result.exit_code == 0, result.output

    finished = plane.spans.get_finished_spans()
    roots = [s for s in finished if s.name == f"submit {action}"]
    assert len(roots) == 1, [s.name for s in finished]
    (root,) = roots
    assert root.parent is None
    trace = _trace_of(list(finished), root)
    names = [s.name for s in trace]
    wf = protocol.ACTION_WORKFLOW
    # Every step of the action, in this one trace.
    for expected in (
        f"StartUpdateWithStartWorkflow:{wf}",
        f"RunWorkflow:{wf}",
        f"StartActivity:{protocol.RUN_ACTION_ACTIVITY}",
        f"RunActivity:{protocol.RUN_ACTION_ACTIVITY}",
        f"create 2 pods on {plane.cluster}",
        "informer Running",
        "informer Succeeded",
        "SignalWorkflow:" + protocol.ACTION_EVENT_SIGNAL,
        "HandleSignal:" + protocol.ACTION_EVENT_SIGNAL,
        f"CompleteWorkflow:{wf}",
    ):
        assert expected in names, (expected, sorted(set(names)))
    # Every span but the root has its parent in the trace: nothing is orphaned.
    ids = {s.context.span_id for s in trace if s.context is not None}
    orphans = [
        s.name for s in trace if s is not root and (s.parent is None or s.parent.span_id not in ids)
    ]
    assert orphans == [], orphans
    # No other action's spans in it (the scheduler's, for the nudge this action sent
    # it, may be), and the order of its life: submitted, started, run on the cluster
    # (pods created, then their events), completed.
    prefix = protocol.action_workflow_id(plane.tenant, "")
    others = {
        str(s.attributes.get("temporalWorkflowID"))
        for s in trace
        if s.attributes and str(s.attributes.get("temporalWorkflowID", "")).startswith(prefix)
    } - {protocol.action_workflow_id(plane.tenant, action)}
    assert others == set(), others

    def first(name: str) -> int:
        return min(s.start_time or 0 for s in trace if s.name == name)

    order = [
        f"submit {action}",
        f"RunWorkflow:{wf}",
        f"RunActivity:{protocol.RUN_ACTION_ACTIVITY}",
        f"create 2 pods on {plane.cluster}",
        "informer Running",
        "informer Succeeded",
        f"CompleteWorkflow:{wf}",
    ]
    assert sorted(order, key=first) == order, {n: first(n) for n in order}


async def test_the_sdk_gives_a_waiting_action_its_place_and_forecast_start(
    plane: Plane, temporal_env: WorkflowEnvironment
) -> None:
    from headway.sdk.client import Client as Headway
    from headway.sdk.client import Resources, Task

    sdk = Headway(temporal_env.client, tenant=plane.tenant)
    uid = uuid.uuid4().hex[:6]
    # Both 8-GPU nodes for a few seconds, declared: the forecast knows when they free.
    gang = Task("gang", Resources(gpu=8), replicas=2, duration=3, estimate=3)
    blocker = await sdk.submit(gang, id=f"blocker-{uid}")
    first = await sdk.submit(Task("one", Resources(gpu=8), duration=0.2), id=f"first-{uid}")
    second = await sdk.submit(Task("two", Resources(gpu=8), duration=0.2), id=f"second-{uid}")
    assert blocker.state == "running" and first.state == second.state == "waiting"

    eta = await first.eta()
    assert eta is not None and eta["position"] == 1 and eta["of"] == 2, eta
    assert eta["cluster"] == plane.cluster and 0 < eta["starts_in_s"] <= 3, eta
    later = await second.eta()
    assert later is not None and later["position"] == 2 and later["starts_in_s"] <= 3, later
    await first.result()
    # Started: no longer waiting, nothing to estimate.
    assert await first.eta() is None
