"""Metrics and traces: reasons become counters, waits histograms, heads gauges."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from headway import telemetry
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from temporalio import workflow
from temporalio.client import Client
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker


def points(reader: InMemoryMetricReader, name: str) -> list[tuple[dict[str, Any], Any]]:
    data = reader.get_metrics_data()
    out = []
    for rm in data.resource_metrics if data else []:
        for sm in rm.scope_metrics:
            for m in sm.metrics:
                if m.name == name:
                    for p in m.data.data_points:
                        value: Any = getattr(p, "value", None)
                        if value is None:
                            value = (getattr(p, "count", None), getattr(p, "sum", None))
                        out.append((dict(p.attributes or {}), value))
    return out


def test_admissions_reasons_and_waits_are_recorded_per_queue_and_cluster() -> None:
    reader = InMemoryMetricReader()
    t = telemetry.setup("test", readers=[reader], exporter="none")
    t.record_admission("acme", "prod", "gpu-h200", 12.5, ["NoClusterCapacity", "HeldForGang"])
    t.record_admission("acme", "prod", "gpu-h200", 0.0, [])
    t.record_rejection("acme", "prod", "QueueDepthExceeded")
    adm = points(reader, "headway.admissions")
    assert adm == [({"tenant": "acme", "queue": "prod", "cluster": "gpu-h200"}, 2)]
    reasons = dict((p[0]["reason"], p[1]) for p in points(reader, "headway.reasons"))
    assert reasons == {"NoClusterCapacity": 1, "HeldForGang": 1}
    waits = {p[0]["reason"]: p[1] for p in points(reader, "headway.admission.wait")}
    assert waits["NoClusterCapacity"] == (1, 12.5) and waits["None"] == (1, 0.0)
    assert points(reader, "headway.rejections")[0][1] == 1


def test_requeues_hand_backs_and_ready_timeouts_are_counted_by_class() -> None:
    reader = InMemoryMetricReader()
    t = telemetry.setup("test", readers=[reader], exporter="none")
    t.record_requeue("acme", "train", "oom")
    t.record_requeue("acme", "train", "oom")
    t.record_requeue("acme", "train", "lost")
    t.record_handback("gpu-a", "CapacityChanged")
    t.record_ready_timeout("acme", "train", "gpu-a")
    requeues = {p[0]["class"]: p[1] for p in points(reader, "headway.action.requeues")}
    assert requeues == {"oom": 2, "lost": 1}
    assert points(reader, "headway.action.handbacks") == [
        ({"cluster": "gpu-a", "kind": "CapacityChanged"}, 1)
    ]
    assert points(reader, "headway.action.ready_timeouts")[0][1] == 1


def test_queue_gauges_and_blocked_head_duration() -> None:
    reader = InMemoryMetricReader()
    t = telemetry.setup("test", readers=[reader], exporter="none")
    stats = {
        "train": {
            "waiting": 5,
            "running": 2,
            "blocked_head": "gang-1",
            "waiting_by_reason": {"NoClusterCapacity": 1, "HeldForGang": 4},
        }
    }
    t.update_queue_stats("acme", stats, now=1000.0)
    t.update_fleet("acme", {"c1": {"known": True, "free": {"gpu": 4}}, "c2": {"known": False}})
    waiting = {p[0]["reason"]: p[1] for p in points(reader, "headway.queue.waiting")}
    assert waiting == {"NoClusterCapacity": 1, "HeldForGang": 4}
    blocked = points(reader, "headway.queue.blocked_head_seconds")
    assert blocked[0][0]["head"] == "gang-1" and blocked[0][1] > 0
    unknown = {p[0]["cluster"]: p[1] for p in points(reader, "headway.cluster.unknown_capacity")}
    assert unknown == {"c1": 0, "c2": 1}
    # The head started: the gauge goes away.
    t.update_queue_stats("acme", {"train": {"waiting": 4, "running": 3, "blocked_head": None}})
    assert points(reader, "headway.queue.blocked_head_seconds") == []


def test_action_events_count_by_kind_with_attribution_latency() -> None:
    import time

    reader = InMemoryMetricReader()
    t = telemetry.setup("test", readers=[reader], exporter="none")
    t.record_event("gpu-h100", "OOMKilled", time.time() - 0.25)
    ev = points(reader, "headway.action.events")
    assert ev == [({"cluster": "gpu-h100", "kind": "OOMKilled"}, 1)]
    ((_attrs, (count, total)),) = points(reader, "headway.action.event.latency")
    assert count == 1 and 0.2 < total < 30


def test_bad_exporter_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="HEADWAY_OTEL_EXPORTER: 'zipkin'"):
        telemetry.setup("test", exporter="zipkin")


@workflow.defn(name="TracedHello")
class TracedHello:
    @workflow.run
    async def run(self, name: str) -> str:
        return f"hello {name}"


@pytest.mark.asyncio
async def test_workflows_are_traced_through_the_client_interceptor(
    temporal_env: WorkflowEnvironment,
) -> None:
    spans = InMemorySpanExporter()
    telemetry.setup("test", span_processors=[SimpleSpanProcessor(spans)], exporter="none")
    base = temporal_env.client
    client = Client(
        base.service_client, namespace=base.namespace, interceptors=telemetry.interceptors()
    )
    tq = f"traced-{uuid.uuid4().hex[:6]}"
    async with Worker(client, task_queue=tq, workflows=[TracedHello]):
        out = await client.execute_workflow(
            TracedHello.run, "x", id=f"traced-{uuid.uuid4().hex}", task_queue=tq
        )
    assert out == "hello x"
    names = [s.name for s in spans.get_finished_spans()]
    telemetry.setup("test", exporter="none")  # no exporter holding the session's spans
    assert "StartWorkflow:TracedHello" in names and "RunWorkflow:TracedHello" in names


@pytest.mark.asyncio
async def test_poller_feeds_gauges_from_the_scheduler_queries(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import asyncio

    from headway.workflows import client as hw

    reader = InMemoryMetricReader()
    telemetry.setup("test", readers=[reader], exporter="none")
    stop = asyncio.Event()

    async def get_queues(client: object, tenant: str) -> dict[str, Any]:
        return {
            "q": {
                "waiting": 3,
                "running": 1,
                "blocked_head": "g",
                "waiting_by_reason": {"HeldForGang": 3},
            }
        }

    async def get_fleet(client: object, tenant: str) -> dict[str, Any]:
        stop.set()
        return {
            "capacity": {
                "c1": {"known": True, "free_gpu": 4, "free_cpu_m": 8000},
                "c2": {"known": False},
            }
        }

    monkeypatch.setattr(hw, "get_queues", get_queues)
    monkeypatch.setattr(hw, "get_fleet", get_fleet)
    await asyncio.wait_for(
        telemetry.poll_schedulers(object(), tenants=["acme"], interval_s=0.01, stop=stop), 5
    )
    assert points(reader, "headway.queue.running") == [({"tenant": "acme", "queue": "q"}, 1)]
    free = {
        (p[0]["cluster"], p[0]["resource"]): p[1] for p in points(reader, "headway.cluster.free")
    }
    assert free == {("c1", "gpu"): 4, ("c1", "cpu"): 8}


def test_unknown_capacity_admissions_count_and_warn_once_per_cluster_and_hour(
    caplog: pytest.LogCaptureFixture,
) -> None:
    reader = InMemoryMetricReader()
    t = telemetry.setup("test", readers=[reader], exporter="none")
    fleet = {
        "fleet": [{"name": "ghost", "reports_capacity": False}, {"name": "c1"}],
        "clusters": ["c1", "ghost"],
        "capacity": {"c1": {"known": True, "free_gpu": 8, "free_cpu_m": 1000}},
        "unknown_capacity_admissions": {"ghost": 1},
    }
    with caplog.at_level("WARNING", logger="headway.telemetry"):
        t.update_fleet("acme", telemetry.fleet_gauges(fleet))
        fleet["unknown_capacity_admissions"] = {"ghost": 3}
        t.update_fleet("acme", telemetry.fleet_gauges(fleet))
        # The scheduler started afresh: its count went down, and what it counts is new.
        fleet["unknown_capacity_admissions"] = {"ghost": 1}
        t.update_fleet("acme", telemetry.fleet_gauges(fleet))
    counted = points(reader, "headway.cluster.unknown_capacity.admissions")
    assert counted == [({"tenant": "acme", "cluster": "ghost"}, 4)]
    unknown = {p[0]["cluster"]: p[1] for p in points(reader, "headway.cluster.unknown_capacity")}
    assert unknown == {"c1": 0, "ghost": 1}
    warned = [r.getMessage() for r in caplog.records if "unknown capacity" in r.getMessage()]
    assert len(warned) == 1 and "cluster ghost" in warned[0], warned


@pytest.mark.parametrize(
    ("args", "env", "error"),
    [
        pytest.param(
            ["--metrics-port", "abc"], {}, "'--metrics-port': 'abc'", id="flag-not-a-number"
        ),
        pytest.param(
            ["--metrics-port", "70000"], {}, "'--metrics-port': 70000", id="flag-too-high"
        ),
        pytest.param(
            [], {"HEADWAY_METRICS_PORT": "http"}, "'--metrics-port': 'http'", id="env-not-a-number"
        ),
    ],
)
def test_a_bad_metrics_port_is_refused_naming_the_flag_and_value(
    args: list[str], env: dict[str, str], error: str
) -> None:
    from click.testing import CliRunner
    from headway.cli.main import cli

    for command in (["worker", "control-plane"], ["worker", "cluster", "--name", "gpu-h100"]):
        result = CliRunner().invoke(cli, [*command, *args], env=env)
        assert result.exit_code == 2, result.output
        assert error in result.output and "Traceback" not in result.output


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        pytest.param(None, 10.0, id="unset-is-ten-seconds"),
        pytest.param("0.5", 0.5, id="half-a-second"),
        pytest.param("0", None, id="zero-is-refused"),
        pytest.param("soon", None, id="words-are-refused"),
    ],
)
def test_the_poll_interval_comes_from_the_environment(
    monkeypatch: pytest.MonkeyPatch, raw: str | None, expected: float | None
) -> None:
    if raw is None:
        monkeypatch.delenv(telemetry.METRICS_INTERVAL_ENV, raising=False)
    else:
        monkeypatch.setenv(telemetry.METRICS_INTERVAL_ENV, raw)
    if expected is None:
        with pytest.raises(ValueError, match=f"HEADWAY_METRICS_INTERVAL_S: '{raw}'"):
            telemetry.metrics_interval()
    else:
        assert telemetry.metrics_interval() == expected


def test_the_console_exporter_writes_to_stderr_leaving_stdout_to_the_command() -> None:
    # A process of its own: the exporter is read once per process, at its first span.
    import os
    import subprocess
    import sys

    code = (
        "from headway import telemetry\n"
        "with telemetry.tracer().start_as_current_span('console-probe'):\n"
        "    pass\n"
        "telemetry.flush()\n"
    )
    env = {**os.environ, "HEADWAY_OTEL_EXPORTER": "console"}
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == ""  # `headway submit --json | jq` keeps working
    assert '"name": "console-probe"' in done.stderr
