"""End to end on a real Temporal dev server: actions submitted through the CLI (and the
SDK) run on the control plane and the simulated cluster workers, and complete; their
history is visible with ``temporal workflow show``."""

from __future__ import annotations

import asyncio
import json
import subprocess
import time
from collections.abc import Iterator

import pytest
from click.testing import CliRunner
from headway import protocol
from headway.cli._common import load_fleet, temporal_binary
from headway.cli._stack import Stack, _headway, wait_ready
from headway.cli.main import cli
from headway.sdk import Client, Resources, Task
from temporalio.testing import WorkflowEnvironment

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def stack(
    temporal_env: WorkflowEnvironment, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Stack]:
    """The control-plane worker and one simulated cluster worker per bundled fleet cluster,
    as `headway worker ...` child processes on the session's dev server."""
    address = temporal_env.client.service_client.config.target_host
    data_dir = tmp_path_factory.mktemp("e2e")
    fleet = load_fleet(None)
    s = Stack(data_dir, address, None)
    try:
        common = ["--address", address]
        s.spawn(
            "control-plane",
            _headway(
                *common,
                "worker",
                "control-plane",
                "--database-url",
                f"sqlite:///{data_dir / 'headway.db'}",
            ),
        )
        for c in fleet.clusters:
            s.spawn(f"cluster-{c.name}", _headway(*common, "worker", "cluster", "--name", c.name))
        asyncio.run(wait_ready(s, fleet))
        yield s
    finally:
        s.stop()


def hw(stack: Stack, *args: str, env: dict[str, str] | None = None) -> tuple[int, str]:
    result = CliRunner().invoke(cli, ["--address", stack.address, *args], env=env)
    return result.exit_code, result.output


def test_submit_through_the_cli_completes_and_its_history_is_visible(stack: Stack):
    code, out = hw(
        stack,
        "submit",
        "--queue",
        "default",
        "--cpu",
        "1",
        "--memory",
        "1Gi",
        "--duration",
        "1",
        "--id",
        "cli-1",
        "--wait",
    )
    assert code == 0, out
    assert "submitted cli-1 to queue 'default'" in out
    assert "/workflows/headway-action-default-cli-1" in out
    assert "cli-1: " in out and "state=succeeded" in out

    shown = subprocess.run(
        [
            temporal_binary(),
            "workflow",
            "show",
            "--address",
            stack.address,
            "-w",
            protocol.action_workflow_id("default", "cli-1"),
            "--output",
            "json",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    events = [e["eventType"] for e in json.loads(shown.stdout)["events"]]
    assert events[0] in ("EVENT_TYPE_WORKFLOW_EXECUTION_STARTED", "WorkflowExecutionStarted")
    assert events[-1] in ("EVENT_TYPE_WORKFLOW_EXECUTION_COMPLETED", "WorkflowExecutionCompleted")


def test_a_multi_node_gang_runs_whole_on_one_gpu_cluster(stack: Stack):
    code, out = hw(
        stack,
        "submit",
        "--queue",
        "default",
        "--gpu",
        "H100:8",
        "--cpu",
        "8",
        "--memory",
        "64Gi",
        "--replicas",
        "2",
        "--duration",
        "1",
        "--id",
        "gang-1",
        "--wait",
        "--json",
    )
    assert code == 0, out
    result = json.loads(out.strip().splitlines()[-1])["result"]
    assert result["state"] == "succeeded"
    assert result["cluster"] == "gpu-h100"


def test_queue_commands_round_trip(stack: Stack):
    code, out = hw(
        stack,
        "create",
        "queue",
        "team-a",
        "--priority",
        "high",
        "--algorithm",
        "strict",
        "--run-concurrency",
        "10",
        "--max-gpu",
        "H200:8",
        "--cluster",
        "gpu-h200",
    )
    assert code == 0, out
    code, out = hw(stack, "create", "queue", "team-a")
    assert code != 0 and "already exists" in out

    code, out = hw(
        stack,
        "update",
        "queue",
        "team-a",
        "--depth",
        "100",
        "--clear-cluster",
        "--run-concurrency",
        "unlimited",
        "--max-cpu",
        "64",
    )
    assert code == 0, out
    code, out = hw(stack, "get", "queues", "-o", "json")
    assert code == 0, out
    team = next(q for q in json.loads(out) if q["name"] == "team-a")
    assert team["priority"] == "high" and team["algorithm"] == "strict"
    assert team["depth"] == 100 and team["run_concurrency"] is None
    assert team["clusters"] is None
    assert team["max_resources"] == {"cpu": 64, "gpu": "H200:8"}

    # --edit: the queue as YAML in $EDITOR; what the editor saves is applied.
    editor = "sed -i -e 's/^depth: .*/depth: 7/' -e 's/^priority: .*/priority: critical/'"
    code, out = hw(stack, "update", "queue", "team-a", "--edit", env={"EDITOR": editor})
    assert code == 0, out
    code, out = hw(stack, "get", "queues", "-o", "json")
    team = next(q for q in json.loads(out) if q["name"] == "team-a")
    assert (team["depth"], team["priority"]) == (7, "critical")
    bad = "sed -i -e 's/^algorithm: .*/algorithm: fifo/'"
    code, out = hw(stack, "update", "queue", "team-a", "--edit", env={"EDITOR": bad})
    assert code != 0 and "algorithm: 'fifo'" in out

    code, out = hw(stack, "get", "queues")
    assert code == 0 and "team-a" in out and "default" in out

    code, out = hw(stack, "update", "queue", "no-such-queue", "--depth", "1")
    assert code != 0 and "does not exist" in out

    code, out = hw(
        stack,
        "submit",
        "--queue",
        "team-a",
        "--gpu",
        "H200:2",
        "--duration",
        "1",
        "--id",
        "team-a-1",
        "--wait",
        "--json",
    )
    assert code == 0, out
    assert json.loads(out.strip().splitlines()[-1])["result"]["cluster"] == "gpu-h200"


async def test_sdk_run_context_and_per_task_override(stack: Stack):
    hw_client = await Client.connect(stack.address)
    score = Task("score", Resources(cpu=1, memory="1Gi"), duration=1)
    train = Task("train", Resources(cpu=4, gpu="H100:1"), duration=1)
    code, out = await asyncio.to_thread(
        hw, stack, "create", "queue", "sdk-fast", "--priority", "high"
    )
    assert code == 0, out

    run = hw_client.with_runcontext(queue="sdk-fast")
    fast = await run.submit(score)
    slow = await run.submit(train.override(queue="default"))
    assert (fast.queue, slow.queue) == ("sdk-fast", "default")
    assert fast.request.run == slow.request.run == run.run
    for action in (fast, slow):
        result = await action.result()
        assert result.state == "succeeded", result
    assert fast.ui_url.endswith(f"/namespaces/default/workflows/{fast.workflow_id}")
    why = await fast.why()
    assert why["action_id"] == fast.id


def test_why_explains_an_action(stack: Stack):
    code, out = hw(stack, "why", "cli-1", "--json")
    assert code == 0, out
    assert json.loads(out)["action_id"] == "cli-1"


def test_update_org_limits_fan_out(stack: Stack):
    code, out = hw(stack, "update", "org", "--max-actions-per-run", "1")
    assert code == 0, out
    try:
        args = ["submit", "--queue", "default", "--cpu", "1", "--duration", "0", "--run", "fan"]
        code, out = hw(stack, *args, "--id", "fan-1", "--wait", "--json")
        assert code == 0, out
        code, out = hw(stack, *args, "--id", "fan-2", "--wait", "--json")
        # Refused by policy after it was taken in (the run's fan-out): the rejection's
        # exit code, as for a refusal at the door.
        assert code == 3 and "FanOutExceeded" in out, out
        line = json.loads(next(ln for ln in out.splitlines() if '"reason"' in ln))
        assert (line["id"], line["state"], line["reason"]) == (
            "fan-2",
            "rejected",
            "FanOutExceeded",
        )
        # `update org` merges with the current limits; `get org` reads them back.
        code, out = hw(stack, "update", "org", "--max-concurrent-actions", "500")
        assert code == 0, out
        code, out = hw(stack, "get", "org", "-o", "json")
        assert code == 0, out
        org = json.loads(out)
        assert org["max_concurrent_actions"] == 500 and org["max_actions_per_run"] == 1, org
    finally:
        code, out = hw(stack, "update", "org", "--max-actions-per-run", "unlimited")
        assert code == 0, out
        code, out = hw(stack, "update", "org", "--max-concurrent-actions", "unlimited")
        assert code == 0, out


def test_why_forecast_and_what_if_on_the_live_scheduler(stack: Stack):
    code, out = hw(stack, "create", "queue", "one-at-a-time", "--action-concurrency", "1")
    assert code == 0, out
    common = ["submit", "--queue", "one-at-a-time", "--cpu", "1", "--estimate", "20"]
    code, out = hw(stack, *common, "--duration", "20", "--id", "solo-1")
    assert code == 0, out
    code, out = hw(stack, *common, "--duration", "1", "--id", "solo-2")
    assert code == 0, out
    # solo-2 waits behind the action cap; the scheduler says what would unblock it.
    deadline = time.monotonic() + 30
    while True:
        code, out = hw(stack, "why", "solo-2", "--json")
        assert code == 0, out
        data = json.loads(out)
        if data.get("reason") == "ActionConcurrency" or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert data["reason"] == "ActionConcurrency", data
    assert any("action_concurrency" in u for u in data["unblock"]), data
    # The forecast runs the same core forward on a copy of the live state.
    code, out = hw(stack, "forecast", "--queue", "one-at-a-time", "--json")
    assert code == 0, out
    rows = {r["action"]: r for r in json.loads(out)}
    assert 0 < rows["solo-2"]["starts_in_s"] <= 20
    # And a what-if shows it would start now with a higher cap, without applying it.
    code, out = hw(stack, "what-if", "one-at-a-time", "--action-concurrency", "2", "--json")
    assert code == 0, out
    moved = {r["action"]: r for r in json.loads(out)}
    assert moved["solo-2"]["after_s"] == 0 and moved["solo-2"]["before_s"] > 0
    code, out = hw(stack, "get", "queues", "-o", "json")
    assert code == 0, out
    assert '"action_concurrency": 1' in out  # the what-if changed nothing
