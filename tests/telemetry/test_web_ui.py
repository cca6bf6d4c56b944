"""What a person sees of an action in the Temporal Web UI, read back the way the Web UI
reads it: the Temporal server's HTTP API.

Live: a Temporal dev server of its own (started with its HTTP API on a known port), the
control-plane worker and a simulated cluster worker as processes, driven through the
CLI. A gang is blocked by a running action and a small action is held for the gang; while
they wait, their current reason reaches the Web UI (current details and ``HeadwayReason``);
once they ran, the summary says what they were, where they ran, after how long and what
they waited for, the activities say what they did, and the reasons stay searchable.
"""

from __future__ import annotations

import base64
import json
import urllib.parse
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

import pytest
from click.testing import CliRunner
from headway import protocol
from headway.cli._common import free_port
from headway.cli._stack import Stack, _headway, start_server
from headway.cli.main import cli
from headway.cli.server import server_argv
from waiting import eventually

pytestmark = pytest.mark.integration

T = TypeVar("T")

FLEET = """
clusters:
  - name: gpu-a
    node_groups:
      - {name: h100, count: 2, shape: {cpu: 96, memory: 1Ti, gpu: "H100:8"}}
queues:
  - {name: train, priority: high, algorithm: strict, clusters: [gpu-a]}
"""


@dataclass
class Live:
    stack: Stack
    tenant: str
    api: str  # the server's HTTP API, http://127.0.0.1:PORT/api/v1/namespaces/default


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Live]:
    data_dir = tmp_path_factory.mktemp("webui")
    fleet_file = data_dir / "fleet.yaml"
    fleet_file.write_text(FLEET)
    port, http = free_port(), free_port()
    tenant = f"ui-{uuid.uuid4().hex[:6]}"
    s = Stack(data_dir, f"127.0.0.1:{port}", None)
    try:
        argv = [*server_argv(data_dir, port=port, headless=True), "--http-port", str(http)]
        start_server(s, argv, port)
        common = ["--address", s.address, "--tenant", tenant]
        # The poller that tells waiting actions their reason runs every 0.3 s here.
        env = {"HEADWAY_METRICS_INTERVAL_S": "0.3"}
        db = f"sqlite:///{data_dir / 'headway.db'}"
        s.spawn(
            "control-plane",
            _headway(
                *common, "worker", "control-plane", "--fleet", str(fleet_file), "--database-url", db
            ),
            env=env,
        )
        s.spawn(
            "cluster-gpu-a",
            _headway(*common, "worker", "cluster", "--name", "gpu-a", "--fleet", str(fleet_file)),
        )
        live = Live(s, tenant, f"http://127.0.0.1:{http}/api/v1/namespaces/default")

        def ready() -> bool | None:
            if s.failed() is not None:
                raise AssertionError(s.failed().tail())  # type: ignore[union-attr]
            code, out = hw(live, "get", "clusters", "-o", "json")
            status = {c["name"]: c["status"] for c in json.loads(out)} if code == 0 else {}
            return True if status.get("gpu-a") == "Ready" else None

        eventually(ready, "gpu-a reporting")
        yield live
    finally:
        s.stop()


def hw(live: Live, *args: str) -> tuple[int, str]:
    result = CliRunner().invoke(
        cli, ["--address", live.stack.address, "--tenant", live.tenant, *args]
    )
    return result.exit_code, result.output


def api(live: Live, path: str, body: dict[str, Any] | None = None) -> Any:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(live.api + path, data=data, method="POST" if data else "GET")
    with urllib.request.urlopen(req, timeout=10) as resp:
        return json.loads(resp.read())


def value(payload: Any) -> Any:
    """A payload as the HTTP API renders it: the value itself, or base64 data."""
    if isinstance(payload, dict) and "data" in payload and "metadata" in payload:
        return json.loads(base64.b64decode(payload["data"]))
    return payload


def wf(live: Live, action: str) -> str:
    return urllib.parse.quote(protocol.action_workflow_id(live.tenant, action), safe="")


def described(live: Live, action: str) -> dict[str, Any]:
    return api(live, f"/workflows/{wf(live, action)}")  # type: ignore[no-any-return]


def search_attribute(live: Live, action: str, name: str) -> Any:
    fields = described(live, action)["workflowExecutionInfo"]["searchAttributes"]["indexedFields"]
    return value(fields[name]) if name in fields else None


def current_details(live: Live, action: str) -> str:
    out = api(live, f"/workflows/{wf(live, action)}/query/__temporal_workflow_metadata", {})
    result = out["queryResult"]  # Payloads, shorthand: a list of values (or of payloads)
    (meta,) = result["payloads"] if isinstance(result, dict) else result
    return str(value(meta).get("currentDetails", ""))


def test_a_blocked_gang_reads_in_the_web_ui_while_it_waits_and_after_it_ran(live: Live) -> None:
    for action_id, *flags in (
        ("filler", "--gpu", "H100:8", "--duration", "5"),
        ("gang", "--gpu", "H100:8", "--replicas", "2", "--duration", "1"),
        ("small", "--gpu", "H100:1", "--duration", "1"),
    ):
        code, out = hw(live, "submit", "--queue", "train", "--id", action_id, *flags)
        assert code == 0, out

    # While they wait: the current reason, within a few polls, in the details and in the
    # search attribute the Web UI filters by (no longer "Waiting").
    def told(action: str, reason: str) -> str | None:
        details = current_details(live, action)
        attr = search_attribute(live, action, "HeadwayReason")
        return details if attr == reason and reason in details else None

    assert eventually(lambda: told("gang", "NoClusterCapacity"), "the gang's reason") == (
        "2×H100:8 waiting in train: NoClusterCapacity"
    )
    assert eventually(lambda: told("small", "HeldForGang"), "small's reason") == (
        "1×H100:1 waiting in train: HeldForGang"
    )

    def ended(action: str) -> str | None:
        details = current_details(live, action)
        return details if details.startswith("succeeded") else None

    gang = eventually(lambda: ended("gang"), "the gang's end")
    assert gang.startswith("succeeded: 2×H100:8 on gpu-a after "), gang
    assert gang.endswith(" s: NoClusterCapacity"), gang
    small = eventually(lambda: ended("small"), "small's end")
    assert small.startswith("succeeded: 1×H100:1 on gpu-a after "), small
    assert small.endswith(" s: HeldForGang, NoClusterCapacity"), small

    # `describe action` has the wait's timeline: each reason told, when, and for how long
    # (until the next reason or the admission).
    for action, reason in (("gang", "NoClusterCapacity"), ("small", "HeldForGang")):
        code, out = hw(live, "describe", "action", action, "-o", "json")
        assert code == 0, out
        waited = json.loads(out)["waited"]
        assert reason in [w["reason"] for w in waited], waited
        assert all(w["for_s"] is not None and w["for_s"] >= 0 for w in waited), waited
    code, out = hw(live, "describe", "action", "gang")
    assert "Waited for" in out and "NoClusterCapacity" in out.split("Waited for", 1)[1], out

    # The static summary and details, as the start set them.
    meta = described(live, "gang")["executionConfig"]["userMetadata"]
    assert value(meta["summary"]) == "2×H100:8 in train"
    assert "**queue** train" in value(meta["details"]) and "2 pods, replicas" in value(
        meta["details"]
    )

    # Each activity says what it did.
    events = api(live, f"/workflows/{wf(live, 'gang')}/history")["history"]["events"]
    summaries = [
        value(e["userMetadata"]["summary"])
        for e in events
        if "activityTaskScheduledEventAttributes" in e and "userMetadata" in e
    ]
    assert summaries == ["create 2 pods on gpu-a"], summaries
    markers = [
        value(e["userMetadata"]["summary"])
        for e in events
        if "markerRecordedEventAttributes" in e and "userMetadata" in e
    ]
    assert "enqueue on train" in markers and "release the lease (finished)" in markers, markers

    # The reasons stay searchable on finished actions.
    def found(reason: str) -> list[str] | None:
        query = urllib.parse.quote(
            f"HeadwayTenant = '{live.tenant}' AND HeadwayReasons = '{reason}'"
        )
        got = api(live, f"/workflows?query={query}").get("executions", [])
        ids = sorted(e["execution"]["workflowId"].rsplit("-", 1)[-1] for e in got)
        return (
            ids
            if ids and all(e.get("status") == "WORKFLOW_EXECUTION_STATUS_COMPLETED" for e in got)
            else None
        )

    assert eventually(lambda: found("HeldForGang"), "small by its reason") == ["small"]
    assert eventually(lambda: found("NoClusterCapacity"), "both by NoClusterCapacity") == [
        "gang",
        "small",
    ]
    assert search_attribute(live, "filler", "HeadwayReasons") is None
