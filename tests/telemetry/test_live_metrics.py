"""The metrics of issue #26 live: a real Temporal dev server, the control-plane worker and
a simulated cluster worker (each its own process, each serving ``--metrics-port``), a
scripted run through the CLI, and the metrics read back the way Prometheus reads them: an
HTTP scrape of ``/metrics``.

The script, on one cluster of two 8-GPU nodes and a strict queue:

* ``filler`` (1 pod, 8 GPUs) runs for a few seconds;
* ``gang`` (2 pods of 8 GPUs) cannot fit beside it: the blocked head (NoClusterCapacity);
* ``small`` (1 GPU) would fit, but the strict queue holds the room for the gang
  (HeldForGang); once the gang runs, no room is left at all (NoClusterCapacity);
* ``oom`` ends OOMKilled (the cluster worker's informer event);
* a submission to a queue that does not exist is rejected (UnknownQueue);
* ``ghostly`` goes to a fleet cluster whose worker never reported: admitted to unknown
  capacity ("unknown means open"), which is counted and logged.
"""

from __future__ import annotations

import json
import os
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import pytest
from click.testing import CliRunner
from headway.cli._common import free_port
from headway.cli._stack import Stack, _headway
from headway.cli.main import cli
from prometheus_client.parser import text_string_to_metric_families
from temporalio.testing import WorkflowEnvironment
from waiting import eventually

pytestmark = pytest.mark.integration

T = TypeVar("T")

FLEET = """
clusters:
  - name: gpu-a
    node_groups:
      - {name: h100, count: 2, shape: {cpu: 96, memory: 1Ti, gpu: "H100:8"}}
  - name: ghost
    reports_capacity: false
    node_groups:
      - {name: c8, count: 1, shape: {cpu: 8, memory: 32Gi}}
queues:
  - {name: train, priority: high, algorithm: strict, clusters: [gpu-a], max_resources: {gpu: 24}}
  - {name: ghostq, priority: low, algorithm: backfill, clusters: [ghost]}
"""


@dataclass
class Live:
    stack: Stack
    tenant: str
    control: str  # the control plane's scrape URL
    cluster: str  # the gpu-a cluster worker's scrape URL


@pytest.fixture(scope="module")
def live(
    temporal_env: WorkflowEnvironment, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Live]:
    address = temporal_env.client.service_client.config.target_host
    data_dir = tmp_path_factory.mktemp("metrics")
    fleet_file = data_dir / "fleet.yaml"
    fleet_file.write_text(FLEET)
    # A tenant of its own: the Temporal server is shared with the other live tests.
    tenant = f"obs-{uuid.uuid4().hex[:8]}"
    s = Stack(data_dir, address, None)
    ports = free_port(), free_port()
    env = {"HEADWAY_METRICS_INTERVAL_S": "0.3"}
    try:
        common = ["--address", address, "--tenant", tenant]
        s.spawn(
            "control-plane",
            _headway(
                *common,
                "worker",
                "control-plane",
                "--fleet",
                str(fleet_file),
                "--database-url",
                f"sqlite:///{data_dir / 'headway.db'}",
                "--metrics-port",
                str(ports[0]),
            ),
            env=env,
        )
        s.spawn(
            "cluster-gpu-a",
            _headway(*common, "worker", "cluster", "--name", "gpu-a", "--fleet", str(fleet_file)),
            env={"HEADWAY_METRICS_PORT": str(ports[1])},  # the env var, not the flag
        )
        live = Live(
            s,
            tenant,
            f"http://127.0.0.1:{ports[0]}/metrics",
            f"http://127.0.0.1:{ports[1]}/metrics",
        )

        # The control plane starts the scheduler with the whole fleet (ghost too); then
        # gpu-a must have reported its capacity before work is submitted.
        def ready() -> bool | None:
            if s.failed() is not None:
                raise AssertionError(s.failed().tail())  # type: ignore[union-attr]
            code, out = hw(live, "get", "clusters", "-o", "json")
            status = {c["name"]: c["status"] for c in json.loads(out)} if code == 0 else {}
            return True if status.get("gpu-a") == "Ready" and "ghost" in status else None

        eventually(ready, "gpu-a reporting, ghost known")
        yield live
    finally:
        s.stop()


def hw(live: Live, *args: str) -> tuple[int, str]:
    result = CliRunner().invoke(
        cli, ["--address", live.stack.address, "--tenant", live.tenant, *args]
    )
    return result.exit_code, result.output


def scrape(url: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """Every sample of the endpoint: (name, labels) -> value."""
    with urllib.request.urlopen(url, timeout=10) as resp:
        text = resp.read().decode()
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, frozenset(s.labels.items()))] = s.value
    return out


def total(
    samples: dict[tuple[str, frozenset[tuple[str, str]]], float], name: str, **labels: str
) -> float | None:
    """The sum of ``name``'s samples whose labels include ``labels`` (None: no sample)."""
    want = set(labels.items())
    found = [v for (n, ls), v in samples.items() if n == name and want <= ls]
    return sum(found) if found else None


def test_a_scripted_run_is_visible_in_the_scrape(live: Live) -> None:
    t = live.tenant
    submits = [
        ("filler", "--gpu", "H100:8", "--duration", "6"),
        ("gang", "--gpu", "H100:8", "--replicas", "2", "--duration", "1"),
        ("small", "--gpu", "H100:1", "--duration", "1"),
    ]
    for action_id, *flags in submits:
        code, out = hw(live, "submit", "--queue", "train", "--id", action_id, *flags)
        assert code == 0, out

    def blocked() -> dict[Any, float] | None:
        s = scrape(live.control)
        gang = total(s, "headway_queue_blocked_gang", tenant=t, queue="train", head="gang")
        held = total(s, "headway_queue_waiting", tenant=t, queue="train", reason="HeldForGang")
        return s if gang == 2 and held == 1 else None

    # While the gang blocks the head: the gauge holds its pods, the queue's in-flight GPUs
    # stand against its quota, and the depth counts all three.
    s = eventually(blocked, "the blocked gang in the scrape")
    train = {"tenant": t, "queue": "train"}
    assert total(s, "headway_queue_blocked_head_seconds", head="gang", **train) is not None
    assert total(s, "headway_queue_waiting", reason="NoClusterCapacity", **train) == 1
    assert total(s, "headway_queue_in_flight", resource="gpu", **train) == 8
    assert total(s, "headway_queue_quota", resource="gpu", **train) == 24
    assert total(s, "headway_queue_depth_used", **train) == 3
    assert total(s, "headway_queue_running", **train) == 1
    # The same waiting actions in `get actions`: their place in the queue and a start
    # forecast (the filler declares no runtime: the forecast's default hour stands in).
    code, out = hw(live, "get", "actions", "--queue", "train", "--state", "waiting", "-o", "json")
    assert code == 0, out
    rows = {r["action_id"]: r for r in json.loads(out)}
    assert {a: rows[a]["position"] for a in rows} == {"gang": 1, "small": 2}
    assert all(r["starts_in_s"] is not None and r["starts_in_s"] > 0 for r in rows.values())

    def settled() -> dict[Any, float] | None:
        s = scrape(live.control)
        done = total(s, "headway_admissions_total", **train) == admitted
        ghost = total(s, "headway_cluster_unknown_capacity_admissions_total", cluster="ghost")
        gone = total(s, "headway_queue_blocked_head_seconds", **train) is None
        return s if done and (ghost == 1 or admitted == 3) and gone else None

    admitted = 3
    eventually(settled, "the gang's run admitted, in the scrape")
    # Then, with nothing blocked: an OOM kill, a rejection at the door and an admission to unknown capacity.
    code, out = hw(live, "submit", "--queue", "train", "--id", "oom", "--inject", "oom")
    assert code == 0, out
    code, out = hw(live, "submit", "--queue", "nope", "--id", "lost")
    assert code == 3, out
    code, out = hw(live, "submit", "--queue", "ghostq", "--id", "ghostly", "--cpu", "1")
    assert code == 0, out

    admitted = 4
    s = eventually(settled, "every admission in the scrape")
    # The gauges cleared when the gang started: no head blocks any more.
    assert total(s, "headway_queue_blocked_gang", **train) is None
    # Each admission is in the wait histogram once, under the first reason it waited for.
    waits = {
        r: total(s, "headway_admission_wait_seconds_count", reason=r, **train)
        for r in ("None", "NoClusterCapacity", "HeldForGang")
    }
    assert waits == {"None": 2, "NoClusterCapacity": 1, "HeldForGang": 1}, waits
    assert total(s, "headway_admission_wait_seconds_count", **train) == 4
    # Each reason once per action, however many passes it waited through: the gang waited
    # for capacity; small was held for the gang, then found no capacity.
    reasons = {
        r: total(s, "headway_reasons_total", cluster="gpu-a", reason=r, **train)
        for r in ("NoClusterCapacity", "HeldForGang")
    }
    assert reasons == {"NoClusterCapacity": 2, "HeldForGang": 1}, reasons
    assert total(s, "headway_rejections_total", queue="nope", reason="UnknownQueue") == 1

    # The gang and small were seen waiting, forecast, then seen running: both scored.
    def scored() -> float | None:
        n = total(scrape(live.control), "headway_start_estimate_error_seconds_count", **train)
        return n if n is not None and n >= 2 else None

    assert eventually(scored, "the start estimates scored") >= 2

    # The scores reach `get queue`, and the next waiting action's p90 with them.
    def queue_scores() -> dict[str, Any] | None:
        code, out = hw(live, "get", "queue", "train", "-o", "json")
        assert code == 0, out
        est = json.loads(out).get("start_estimates")
        return est if est and est["scored"] >= 2 else None

    est = eventually(queue_scores, "the start-estimate scores in get queue")
    assert est["median_abs_error_s"] >= 0 and 0 <= est["within_10min"] <= 1
    assert est["p90_margin_s"] >= 0
    for action_id, *flags in (
        ("filler2", "--gpu", "H100:8", "--replicas", "2", "--duration", "4"),
        ("gang2", "--gpu", "H100:8", "--replicas", "2", "--duration", "1"),
    ):
        code, out = hw(live, "submit", "--queue", "train", "--id", action_id, *flags)
        assert code == 0, out
        if action_id == "filler2":
            # Running before gang2 comes: gang2 is then first in line, not behind it.

            def running() -> bool | None:
                code, out = hw(live, "describe", "action", "filler2", "-o", "json")
                return True if code == 0 and json.loads(out)["state"] == "running" else None

            eventually(running, "filler2 running")
    code, out = hw(live, "describe", "action", "gang2", "-o", "json")
    assert code == 0, out
    waiting = json.loads(out)["waiting"]
    assert waiting["position"] == 1, waiting
    # p90: the forecast plus the queue's scored lateness (read before and after, in case
    # another score landed in between).
    margins = {est["p90_margin_s"], eventually(queue_scores, "the scores again")["p90_margin_s"]}
    assert waiting["starts_in_p90_s"] is not None, waiting
    margin = waiting["starts_in_p90_s"] - waiting["starts_in_s"]
    assert any(abs(margin - m) < 0.01 for m in margins), (waiting, margins)
    assert total(s, "headway_cluster_unknown_capacity", tenant=t, cluster="ghost") == 1
    assert total(s, "headway_cluster_unknown_capacity", tenant=t, cluster="gpu-a") == 0
    assert total(s, "headway_cluster_free", tenant=t, cluster="gpu-a", resource="gpu") is not None
    # ... and the control plane said so in its log, once.
    log = (Path(live.stack.data_dir) / "logs" / "control-plane.log").read_text()
    warned = [ln for ln in log.splitlines() if "unknown capacity" in ln and t in ln]
    assert len(warned) == 1 and "cluster ghost" in warned[0], warned

    # The cluster worker's own endpoint: the informer's events, attributed per cluster,
    # with the time each took to reach its action's workflow.
    def events() -> dict[Any, float] | None:
        c = scrape(live.cluster)
        oom = total(c, "headway_action_events_total", cluster="gpu-a", kind="OOMKilled")
        ok = total(c, "headway_action_events_total", cluster="gpu-a", kind="Succeeded")
        return c if oom == 1 and ok == 3 else None

    c = eventually(events, "the OOM kill in the cluster worker's scrape")
    latency = total(c, "headway_action_event_latency_seconds_count", cluster="gpu-a")
    assert latency is not None and latency >= 4


def test_a_metrics_port_in_use_is_refused_in_one_line(tmp_path: Path) -> None:
    import socket

    with socket.socket() as held:
        held.bind(("0.0.0.0", 0))
        held.listen()
        port = held.getsockname()[1]
        result = CliRunner().invoke(
            cli,
            ["--address", "127.0.0.1:1", "worker", "cluster", "--name", "gpu-h100"],
            env={**os.environ, "HEADWAY_METRICS_PORT": str(port)},
        )
    assert result.exit_code == 1, result.output
    assert f"cannot serve metrics on 0.0.0.0:{port}" in result.output
    assert "Traceback" not in result.output
