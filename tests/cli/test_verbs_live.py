"""The verbs of issue #24 live: a real Temporal dev server, the control-plane worker and
one simulated cluster worker per fleet cluster, driven through the CLI.

`describe action` on a waiting, a running, a rejected and a finished action; `cancel` of
a waiting and a running action (the pods deleted, per the clusters' pod log; the queue's
running back to 0; the end recorded as cancelled); `cancel --run`; `drain`/`resume`;
`get clusters` against the simulated fleet.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest
from click.testing import CliRunner
from headway.cli._common import load_fleet
from headway.cli._stack import Stack, _headway, wait_ready
from headway.cli.main import cli
from temporalio.testing import WorkflowEnvironment
from waiting import eventually

pytestmark = pytest.mark.integration

T = TypeVar("T")


@pytest.fixture(scope="module")
def stack(
    temporal_env: WorkflowEnvironment, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Stack]:
    address = temporal_env.client.service_client.config.target_host
    data_dir = tmp_path_factory.mktemp("verbs")
    fleet = load_fleet(None)
    s = Stack(data_dir, address, None)
    # Every pod the simulated clusters create, bind and end is logged here (with how it
    # ended: "Deleted" for a pod deleted before it finished).
    pod_log = {"HEADWAY_POD_LOG": str(data_dir / "pods.jsonl")}
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
            s.spawn(
                f"cluster-{c.name}",
                _headway(*common, "worker", "cluster", "--name", c.name),
                env=pod_log,
            )
        asyncio.run(wait_ready(s, fleet))
        yield s
    finally:
        s.stop()


def hw(stack: Stack, *args: str) -> tuple[int, str]:
    result = CliRunner().invoke(cli, ["--address", stack.address, *args])
    return result.exit_code, result.output


def hw_json(stack: Stack, *args: str) -> Any:
    code, out = hw(stack, *args, "-o", "json")
    assert code == 0, out
    return json.loads(out)


def fits_80(text: str) -> None:
    wide = [ln for ln in text.splitlines() if len(ln) > 80 and not ln.strip().startswith("http")]
    assert not wide, wide


def pod_lines(stack: Stack, action_id: str) -> list[dict[str, Any]]:
    path = Path(stack.data_dir) / "pods.jsonl"
    if not path.exists():
        return []
    lines = []
    for raw in path.read_text().splitlines():
        try:
            line = json.loads(raw)
        except ValueError:
            continue
        if line.get("action") == action_id:
            lines.append(line)
    return lines


def test_get_clusters_against_the_simulated_fleet(stack: Stack) -> None:
    def reported() -> list[dict[str, Any]] | None:
        views = hw_json(stack, "get", "clusters")
        return views if all(v["status"] == "Ready" for v in views) else None

    views = {v["name"]: v for v in eventually(reported, "every cluster to report")}
    assert set(views) == {"gpu-h100", "gpu-h200", "cpu"}
    assert [views[n]["nodes"] for n in ("gpu-h100", "gpu-h200", "cpu")] == [2, 2, 4]
    assert views["gpu-h100"]["allocatable"]["gpu"] == "H100:16"
    assert views["gpu-h200"]["allocatable"]["memory"] == "4Ti"
    assert views["cpu"]["allocatable"] == {
        "cpu": "256",
        "memory": "1Ti",
        "gpu": "0",
        "ephemeral_storage": "2000Gi",
    }
    for v in views.values():
        assert v["last_report"]["incarnation"] and v["last_report"]["capacity_known"]
    code, out = hw(stack, "get", "clusters")
    assert code == 0, out
    fits_80(out)
    assert out.splitlines()[0].split()[:3] == ["NAME", "STATUS", "NODES"]
    code, out = hw(stack, "describe", "cluster", "gpu-h200")
    assert code == 0, out
    fits_80(out)
    assert "Status:      Ready" in out and "h200-1" in out
    code, out = hw(stack, "describe", "cluster", "gpu-x")
    assert code == 1 and "cluster 'gpu-x' is not in the fleet" in out


def test_describe_a_finished_and_a_rejected_action(stack: Stack) -> None:
    code, out = hw(
        stack,
        "submit",
        "--cpu",
        "1",
        "--memory",
        "1Gi",
        "--duration",
        "1",
        "--id",
        "v-fin-1",
        "--wait",
    )
    assert code == 0, out
    d = hw_json(stack, "describe", "action", "v-fin-1")
    assert (d["state"], d["queue"], d["run"]) == ("succeeded", "default", "v-fin-1")
    assert d["exit_code"] == 0 and d["cluster"] in ("gpu-h100", "gpu-h200", "cpu")
    assert len(d["nodes"]) == 1 and d["ended_at"] >= d["submitted_at"]
    assert d["demand"]["pods"] == [
        {
            "role": "main",
            "cpu": "1",
            "memory": "1Gi",
            "gpu": "-",
            "ephemeral_storage": "-",
            "count": 1,
        }
    ]
    assert [e["kind"] for e in d["events"]][-1] == "Succeeded"
    assert d["ui"].endswith("/namespaces/default/workflows/headway-action-default-v-fin-1")
    code, out = hw(stack, "describe", "action", "v-fin-1")
    assert code == 0, out
    fits_80(out)
    assert "State:     succeeded" in out

    # (`submit` itself may say so at once, with an exit code of its own: not tested here.)
    code, out = hw(stack, "submit", "--queue", "no-such-queue", "--cpu", "1", "--id", "v-rej-1")
    assert "Traceback" not in out, out
    d = eventually(
        lambda: (
            v
            if (v := hw_json(stack, "describe", "action", "v-rej-1"))["state"] == "rejected"
            else None
        ),
        "v-rej-1 to be rejected",
    )
    assert d["reason"] == "UnknownQueue" and d["reasons"] == ["UnknownQueue"]
    assert d["cluster"] is None and d["retries"] == 0
    code, out = hw(stack, "describe", "action", "v-rej-1")
    assert code == 0 and "State:     rejected (UnknownQueue)" in out

    code, out = hw(stack, "describe", "action", "never-submitted")
    assert code == 1 and "action 'never-submitted' not found in tenant 'default'" in out


def test_waiting_and_running_actions_described_then_cancelled(stack: Stack) -> None:
    code, out = hw(stack, "create", "queue", "one-slot", "--action-concurrency", "1")
    assert code == 0, out
    gpu = ["--queue", "one-slot", "--gpu", "H100:8", "--cpu", "8", "--memory", "64Gi"]
    code, out = hw(
        stack, "submit", *gpu, "--duration", "600", "--estimate", "600", "--id", "v-run-1"
    )
    assert code == 0, out
    code, out = hw(stack, "submit", *gpu, "--duration", "1", "--estimate", "5", "--id", "v-wait-1")
    assert code == 0, out

    def running() -> dict[str, Any] | None:
        d = hw_json(stack, "describe", "action", "v-run-1")
        on = d["state"] == "running" and d["nodes"]
        return d if on and {p["last_event"] for p in d["pods"]} == {"Running"} else None

    d = eventually(running, "v-run-1 to run on a node")
    assert d["cluster"] == "gpu-h100" and d["nodes"][0].startswith("h100-")
    assert d["demand"]["pods"][0]["gpu"] == "H100:8" and d["waiting"] is None

    def waiting() -> dict[str, Any] | None:
        d = hw_json(stack, "describe", "action", "v-wait-1")
        w = d["waiting"] or {}
        return d if w.get("reason") == "ActionConcurrency" and "position" in w else None

    d = eventually(waiting, "v-wait-1 to wait behind the action cap")
    assert d["state"] == "waiting" and d["reason"] == "ActionConcurrency"
    w = d["waiting"]
    assert (w["position"], w["of"]) == (1, 1)
    assert 0 < w["starts_in_s"] <= 600 and w["forecast_cluster"] == "gpu-h100"
    assert any("action_concurrency" in u for u in w["unblock"])
    code, out = hw(stack, "describe", "action", "v-wait-1")
    assert code == 0, out
    fits_80(out)
    assert "Position:  1 of 1 in queue one-slot" in out

    q = hw_json(stack, "get", "queue", "one-slot")
    assert (q["waiting"], q["running"]) == (1, 1)
    assert q["in_flight"]["actions"] == {"used": 1, "limit": 1}
    assert q["quota"]["gpu"]["used"] == "8" and q["waiting_by_reason"] == {"ActionConcurrency": 1}
    code, out = hw(stack, "get", "queue", "one-slot")
    assert code == 0, out
    fits_80(out)

    def listed() -> list[dict[str, Any]] | None:
        rows = hw_json(stack, "get", "actions", "--queue", "one-slot")
        return rows if {r["action_id"] for r in rows} == {"v-run-1", "v-wait-1"} else None

    rows = {r["action_id"]: r for r in eventually(listed, "visibility to list both")}
    assert (rows["v-run-1"]["state"], rows["v-wait-1"]["state"]) == ("running", "waiting")
    rows = hw_json(stack, "get", "actions", "--queue", "one-slot", "--state", "running")
    assert [r["action_id"] for r in rows] == ["v-run-1"]

    # Cancel: the waiting one leaves the queue, the running one's pods are deleted.
    code, out = hw(stack, "cancel", "v-wait-1", "v-run-1")
    assert code == 0, out
    # (Less the note on stderr that it is waiting, should the pods take a while.)
    assert [ln for ln in out.splitlines() if not ln.startswith("waiting for")] == [
        "action 'v-wait-1' cancelled (was waiting)",
        "action 'v-run-1' cancelled (was running on gpu-h100)",
    ]
    ended = [ln for ln in pod_lines(stack, "v-run-1") if ln["event"] == "ended"]
    assert ended and {ln["outcome"] for ln in ended} == {"Deleted"}
    assert pod_lines(stack, "v-wait-1") == []  # never had a pod

    def idle() -> dict[str, Any] | None:
        q = hw_json(stack, "get", "queue", "one-slot")
        return q if (q["waiting"], q["running"]) == (0, 0) else None

    q = eventually(idle, "one-slot to hold nothing")
    assert q["quota"]["gpu"]["used"] == "0"
    for action_id in ("v-run-1", "v-wait-1"):
        d = hw_json(stack, "describe", "action", action_id)
        assert (d["state"], d["reason"]) == ("cancelled", "Cancelled")
        assert d["cancel_requested_by"]
    # Once: a second cancel finds it ended and changes nothing.
    code, out = hw(stack, "cancel", "v-run-1")
    assert code == 0 and out.strip() == "action 'v-run-1' had already ended: cancelled"

    # The GPUs are free again on the cluster (the worker's report, as the scheduler sees it).
    def freed() -> bool | None:
        views = {v["name"]: v for v in hw_json(stack, "get", "clusters")}
        return True if views["gpu-h100"]["free"]["gpu"] == "H100:16" else None

    eventually(freed, "gpu-h100's GPUs to be free")


def test_cancel_a_run(stack: Stack) -> None:
    code, out = hw(stack, "create", "queue", "held", "--action-concurrency", "0")
    assert code == 0, out
    for i in range(3):
        args = ["submit", "--queue", "held", "--cpu", "1", "--run", "batch-7", "--id", f"v-b7-{i}"]
        code, out = hw(stack, *args)
        assert code == 0, out
    code, out = hw(stack, "submit", "--queue", "held", "--cpu", "1", "--id", "v-other-1")
    assert code == 0, out

    def all_listed() -> list[dict[str, Any]] | None:
        rows = hw_json(stack, "get", "actions", "--run", "batch-7")
        return rows if len(rows) == 3 else None

    # Visibility is written a moment after a start; an action still in its first task
    # (no attributes yet) is found by its memo, so the state may still be "submitting".
    assert {r["state"] for r in eventually(all_listed, "the run's actions")} <= {
        "submitting",
        "waiting",
    }
    code, out = hw(stack, "cancel", "--run", "batch-7")
    assert code == 0, out
    lines = sorted(out.splitlines())
    assert len(lines) == 3, out
    for i, line in enumerate(lines):
        assert line in (
            f"action 'v-b7-{i}' cancelled (was submitting)",
            f"action 'v-b7-{i}' cancelled (was waiting)",
        ), line
    rows = hw_json(stack, "get", "actions", "--run", "batch-7", "--state", "cancelled")
    assert {r["action_id"] for r in rows} <= {"v-b7-0", "v-b7-1", "v-b7-2"}
    d = hw_json(stack, "describe", "action", "v-other-1")
    assert d["state"] in ("submitting", "waiting")  # another run: untouched
    code, out = hw(stack, "cancel", "v-other-1")
    assert code == 0, out
    code, out = hw(stack, "cancel", "--run", "batch-7")
    assert code == 0 and out.strip() == "No action of run 'batch-7' is in flight."


def test_drain_and_resume_a_queue(stack: Stack) -> None:
    code, out = hw(stack, "create", "queue", "drainable")
    assert code == 0, out
    code, out = hw(stack, "drain", "queue", "drainable")
    assert code == 0, out
    assert out.startswith("queue 'drainable' ")
    assert hw_json(stack, "get", "queue", "drainable")["status"] in ("draining", "drained")
    code, out = hw(
        stack, "submit", "--queue", "drainable", "--cpu", "1", "--id", "v-late-1", "--wait"
    )
    assert code != 0, out
    d = hw_json(stack, "describe", "action", "v-late-1")
    assert (d["state"], d["reason"]) == ("rejected", "QueueDraining")
    code, out = hw(stack, "resume", "queue", "drainable")
    assert code == 0 and "active (was drain" in out, out
    code, out = hw(
        stack, "submit", "--queue", "drainable", "--cpu", "1", "--duration", "0", "--id", "v-ok-1"
    )
    assert code == 0, out
    code, out = hw(stack, "get", "queues")
    assert code == 0, out
    fits_80(out)
    assert any(
        ln.split()[:4] == ["drainable", "medium", "backfill", "active"] for ln in out.splitlines()
    )


def test_a_queue_that_drains_by_itself_has_the_schedulers_audit_row(stack: Stack) -> None:
    code, out = hwt(stack, "create", "queue", "settles")
    assert code == 0, out
    code, out = hwt(
        stack, "submit", "--queue", "settles", "--cpu", "1", "--duration", "2", "--id", "v-set-1"
    )
    assert code == 0, out
    code, out = hwt(stack, "drain", "queue", "settles")
    assert code == 0, out

    def drained() -> bool | None:
        code, out = hwt(stack, "get", "queue", "settles", "-o", "json")
        return True if code == 0 and json.loads(out)["status"] == "drained" else None

    eventually(drained, "the queue drained once its action ended")

    def rows() -> list[tuple[str, str, Any, Any]] | None:
        got = [
            (r["change"], r["who"], (r["old"] or {}).get("status"), (r["new"] or {}).get("status"))
            for r in history(stack, "queue", "settles")
        ]
        return got if len(got) == 3 else None

    got = eventually(rows, "the scheduler's row")
    assert got[2] == ("update", "scheduler", "draining", "drained"), got
    assert got[1][2:] == ("active", "draining"), got


def test_delete_a_queue_only_once_it_holds_nothing(stack: Stack) -> None:
    code, out = hw(stack, "create", "queue", "doomed", "--action-concurrency", "0")
    assert code == 0, out
    code, out = hw(stack, "submit", "--queue", "doomed", "--cpu", "1", "--id", "v-doomed-1")
    assert code == 0, out
    eventually(
        lambda: True if hw_json(stack, "get", "queue", "doomed")["waiting"] == 1 else None,
        "the action waiting in the queue",
    )
    code, out = hw(stack, "delete", "queue", "doomed")
    assert code == 1, out
    assert "still holds 1 action(s)" in out and "drain queue doomed" in out, out
    assert "Traceback" not in out
    code, out = hw(stack, "cancel", "v-doomed-1")
    assert code == 0, out
    code, out = hw(stack, "delete", "queue", "doomed")
    assert (code, out.strip()) == (0, "queue 'doomed' deleted")
    code, out = hw(stack, "delete", "queue", "doomed")
    assert code == 1 and "does not exist" in out, out
    # The door knows too: a submission to the deleted queue is refused at once.
    code, out = hw(stack, "submit", "--queue", "doomed", "--cpu", "1", "--id", "v-doomed-2")
    assert code == 3 and "UnknownQueue" in out, out


# --- configuration in SQL: audit trail, --edit, reload after a restart -----------------

CFG_TENANT = "audit24"


def hwt(stack: Stack, *args: str, env: dict[str, str] | None = None) -> tuple[int, str]:
    """``hw`` for the tenant of the configuration tests (its queues are its own)."""
    result = CliRunner().invoke(
        cli, ["--address", stack.address, "--tenant", CFG_TENANT, *args], env=env
    )
    return result.exit_code, result.output


def history(stack: Stack, *args: str) -> list[dict[str, Any]]:
    code, out = hwt(stack, "get", *args, "--history", "-o", "json")
    assert code == 0, out
    rows: list[dict[str, Any]] = json.loads(out)
    return rows


def test_the_audit_trail_after_three_edits(stack: Stack) -> None:
    code, out = hwt(stack, "create", "queue", "trail", "--priority", "low", "--depth", "10")
    assert code == 0, out
    code, out = hwt(stack, "update", "queue", "trail", "--depth", "20")
    assert code == 0, out
    code, out = hwt(stack, "update", "queue", "trail", "--cluster", "gpu-h200")
    assert code == 0, out
    editor = {"EDITOR": "sed -i 's/^priority:.*/priority: critical/'"}
    code, out = hwt(stack, "update", "queue", "trail", "--edit", env=editor)
    assert (code, out.strip()) == (0, "queue 'trail' updated"), out
    rows = history(stack, "queue", "trail")
    assert [(r["change"], r["source"]) for r in rows] == [
        ("create", "cli"),
        ("update", "cli"),
        ("update", "cli"),
        ("update", "cli --edit"),
    ]
    assert all(r["who"] and "@" in r["who"] for r in rows)
    assert [r["at"] for r in rows] == sorted(r["at"] for r in rows)
    assert rows[0]["old"] is None and rows[0]["new"]["depth"] == 10
    assert (rows[1]["old"]["depth"], rows[1]["new"]["depth"]) == (10, 20)
    assert (rows[2]["old"]["clusters"], rows[2]["new"]["clusters"]) == (None, ["gpu-h200"])
    assert (rows[3]["old"]["priority"], rows[3]["new"]["priority"]) == ("low", "critical")
    # The table: one line per field changed, old -> new, in 80 columns.
    code, out = hwt(stack, "get", "queue", "trail", "--history")
    assert code == 0, out
    fits_80(out)
    lines = out.splitlines()
    assert lines[0] == "Changes of queue 'trail' (oldest first):"
    assert lines[1].split() == ["WHEN", "WHO", "SOURCE", "CHANGE"]
    assert "created: priority=low, depth=10" in lines[2]
    assert lines[3].endswith("depth: 10 -> 20")
    assert lines[4].endswith("clusters: any -> [gpu-h200]")
    assert lines[5].endswith("cli --edit   priority: low -> critical")
    # A queue never changed has no history; a deleted one keeps it, ending "deleted".
    code, out = hwt(stack, "delete", "queue", "trail")
    assert code == 0, out
    assert [r["change"] for r in history(stack, "queue", "trail")][-1] == "delete"
    code, out = hwt(stack, "get", "queue", "never", "--history")
    assert code == 0 and "No recorded changes of queue 'never'" in out, out


def test_a_failed_edit_reopens_with_its_error_and_is_kept(stack: Stack, tmp_path: Path) -> None:
    code, out = hwt(stack, "create", "queue", "edited", "--depth", "5")
    assert code == 0, out
    # The editor sets depth to -3 every time it opens: the edit comes back with the
    # error on top, is closed unchanged, and is kept in a file.
    seen = tmp_path / "seen.yaml"
    editor = {"EDITOR": f'sh -c \'sed -i "s/^depth:.*/depth: -3/" "$0"; cp "$0" {seen}\''}
    code, out = hwt(stack, "update", "queue", "edited", "--edit", env=editor)
    assert code == 1, out
    assert "Traceback" not in out
    assert "--edit: not applied (depth: -3 must be >= 0); your edit is kept in " in out, out
    kept = Path(out.rsplit("kept in ", 1)[1].strip())
    text = kept.read_text()
    assert text.startswith("# ERROR: depth: -3 must be >= 0\n") and "\ndepth: -3\n" in text
    assert seen.read_text() == text  # the second opening showed the error on top
    # The YAML lists what each field accepts, and nothing was applied.
    assert "#   priority:    lowest, low, medium, high, critical" in text
    assert "#   algorithm:   strict, greedy, backfill, easy" in text
    assert "#   clusters:    null (any healthy one) or a list of: cpu, gpu-h100, gpu-h200" in text
    assert all(len(ln) <= 80 for ln in text.splitlines() if not ln.startswith("# ERROR"))
    code, out = hwt(stack, "get", "queue", "edited", "-o", "json")
    assert code == 0 and json.loads(out)["in_flight"]["depth"]["limit"] == 5, out
    assert [r["change"] for r in history(stack, "queue", "edited")] == ["create"]


def test_a_selector_naming_an_unknown_cluster_is_refused(stack: Stack) -> None:
    code, out = hwt(stack, "create", "queue", "pinned", "--cluster", "gpu-h999")
    assert code == 2, out
    assert "--cluster: 'gpu-h999' is not a cluster of the fleet" in out
    assert "--allow-unknown-cluster" in out
    code, out = hwt(stack, "create", "queue", "pinned", "--cluster", "gpu-h100")
    assert code == 0, out
    code, out = hwt(stack, "update", "queue", "pinned", "--cluster", "gpu-h999")
    assert code == 2 and "'gpu-h999' is not a cluster of the fleet" in out, out
    code, out = hwt(
        stack, "update", "queue", "pinned", "--cluster", "gpu-h999", "--allow-unknown-cluster"
    )
    assert code == 0, out


def test_configuration_is_reloaded_after_the_scheduler_is_terminated(stack: Stack) -> None:
    from headway import protocol
    from temporalio.client import Client, WorkflowExecutionStatus

    code, out = hwt(stack, "create", "queue", "kept", "--priority", "high", "--max-gpu", "H200:16")
    assert code == 0, out
    code, out = hwt(stack, "update", "org", "--max-concurrent-actions", "77")
    assert code == 0, out

    async def terminate() -> str:
        client = await Client.connect(stack.address, data_converter=protocol.data_converter())
        h = client.get_workflow_handle(protocol.scheduler_workflow_id(CFG_TENANT))
        run_id = (await h.describe()).run_id
        await h.terminate(reason="a lost scheduler (test)")
        return run_id

    async def current() -> tuple[str, WorkflowExecutionStatus | None]:
        client = await Client.connect(stack.address, data_converter=protocol.data_converter())
        d = await client.get_workflow_handle(protocol.scheduler_workflow_id(CFG_TENANT)).describe()
        return d.run_id, d.status

    old_run = asyncio.run(terminate())
    # The next change starts a fresh scheduler: it knows the queue only if it reloaded it.
    code, out = hwt(stack, "update", "queue", "kept", "--depth", "7")
    assert (code, out.strip()) == (0, "queue 'kept' updated"), out
    run_id, status = asyncio.run(current())
    assert run_id != old_run and status == WorkflowExecutionStatus.RUNNING
    view = json.loads(hwt(stack, "get", "queue", "kept", "-o", "json")[1])
    assert view["priority"] == "high" and view["in_flight"]["depth"]["limit"] == 7
    assert view["quota"]["gpu"]["limit"] == "H200:16"
    org = json.loads(hwt(stack, "get", "org", "-o", "json")[1])
    assert org["max_concurrent_actions"] == 77
    assert [r["change"] for r in history(stack, "queue", "kept")] == ["create", "update"]
    # And it schedules there: an action submitted now runs.
    code, out = hwt(stack, "submit", "--queue", "kept", "--cpu", "1", "--id", "kept-1", "--wait")
    assert code == 0 and "state=succeeded" in out, out


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        pytest.param(
            ["--node-group", "name=a,count=-1,cpu=4"],
            "--node-group: node_groups[0].count: -1 must be >= 0",
            id="negative-count",
        ),
        pytest.param(
            ["--node-group", "cpu=4"], "--node-group: 'cpu=4': name= is required", id="no-name"
        ),
        pytest.param(
            ["--node-group", "name=a,count=1,cpu=lots"],
            "node_groups[0].shape.cpu: 'lots'",
            id="bad-quantity",
        ),
        pytest.param(
            ["--node-group", "name=a,count=1,disk=4"], "is not KEY=VALUE with KEY one of", id="key"
        ),
    ],
)
def test_a_bad_cluster_registration_names_the_flag_and_value(
    stack: Stack, flags: list[str], message: str
) -> None:
    code, out = hwt(stack, "create", "cluster", "bad-one", *flags)
    assert code == 2 and message in out, out
    assert "Traceback" not in out
    # Nothing half-applied: the fleet has no such cluster.
    assert "bad-one" not in hwt(stack, "get", "clusters", "-o", "json")[1]


def test_a_registered_cluster_is_stored_audited_and_kept_after_a_restart(stack: Stack) -> None:
    from headway import protocol
    from temporalio.client import Client

    code, out = hwt(
        stack,
        "create",
        "cluster",
        "extra-a",
        "--node-group",
        "name=big,count=2,cpu=4,memory=8Gi,gpu=H100:8",
    )
    assert (code, out.strip()) == (0, "cluster 'extra-a' registered (2 nodes)"), out
    code, out = hwt(stack, "create", "cluster", "extra-a", "--node-group", "name=b,count=1")
    assert code == 1 and "--replace" in out, out

    def listed() -> dict[str, Any] | None:
        views = {v["name"]: v for v in json.loads(hwt(stack, "get", "clusters", "-o", "json")[1])}
        return views.get("extra-a")

    v = eventually(listed, "the registered cluster in get clusters")
    assert v["status"] == "NoReport" and v["nodes"] == 2
    # A queue may select it without --allow-unknown-cluster.
    code, out = hwt(stack, "create", "queue", "on-extra", "--cluster", "extra-a")
    assert code == 0, out
    code, out = hwt(
        stack, "create", "cluster", "extra-a", "--replace", "--node-group", "name=big,count=3,cpu=4"
    )
    assert code == 0, out
    code, out = hwt(stack, "describe", "cluster", "extra-a", "--history", "-o", "json")
    assert code == 0, out
    trail = json.loads(out)
    assert [r["change"] for r in trail] == ["create", "update"]
    assert trail[0]["source"] == "cli" and trail[1]["new"]["node_groups"][0]["count"] == 3
    code, out = hwt(stack, "describe", "cluster", "extra-a", "--history")
    assert code == 0 and "Changes of cluster 'extra-a'" in out and "big x3" in out, out

    async def terminate() -> None:
        client = await Client.connect(stack.address, data_converter=protocol.data_converter())
        h = client.get_workflow_handle(protocol.scheduler_workflow_id(CFG_TENANT))
        await h.terminate(reason="a lost scheduler (test)")

    asyncio.run(terminate())
    # A fresh scheduler reloads the registry from the store: the cluster, as replaced.
    code, out = hwt(stack, "update", "queue", "on-extra", "--depth", "5")
    assert code == 0, out
    v = eventually(listed, "the registered cluster after a restart")
    assert v["nodes"] == 3


def test_the_default_queue_is_seeded_and_the_workers_say_they_are_ready(stack: Stack) -> None:
    rows = hw_json(stack, "get", "queue", "default", "--history")
    assert rows[0]["change"] == "create" and rows[0]["source"] == "fleet"
    logs = {c.name: c.log.read_text() for c in stack.children}
    assert "control-plane worker ready: Temporal " in logs["control-plane"]
    assert "task queue headway-cluster-gpu-h100" in logs["cluster-gpu-h100"]


# --- headway top, under a pseudo-terminal ------------------------------------------------


class Terminal:
    """``headway top`` on a pseudo-terminal of 80x24, its output read into a VT100 screen
    (pyte), as a user sees it."""

    def __init__(self, argv: list[str]) -> None:
        import fcntl
        import os
        import pty
        import struct
        import subprocess
        import termios

        import pyte

        self.screen = pyte.Screen(80, 24)
        self.stream = pyte.ByteStream(self.screen)
        self.master, slave = pty.openpty()
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 80, 0, 0))
        env = {**os.environ, "TERM": "xterm-256color", "COLUMNS": "80", "LINES": "24"}
        self.proc = subprocess.Popen(
            argv, stdin=slave, stdout=slave, stderr=slave, env=env, start_new_session=True
        )
        os.close(slave)

    def read(self, timeout_s: float = 0.2) -> None:
        import os
        import select

        while select.select([self.master], [], [], timeout_s)[0]:
            try:
                chunk = os.read(self.master, 65536)
            except OSError:  # the child closed the terminal
                return
            if not chunk:
                return
            self.stream.feed(chunk)
            timeout_s = 0.05

    def lines(self) -> list[str]:
        return [line.rstrip() for line in self.screen.display]

    def wait_for(
        self, probe: Callable[[list[str]], bool], what: str, timeout_s: float = 30
    ) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            self.read()
            if probe(self.lines()):
                return
            if self.proc.poll() is not None:
                break
        raise AssertionError(
            f"timed out waiting for {what}; the screen:\n" + "\n".join(self.lines())
        )

    def close(self) -> None:
        import os

        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        os.close(self.master)


def test_top_refreshes_in_place_on_a_terminal(stack: Stack) -> None:
    import signal

    code, out = hwt(
        stack, "create", "queue", "topq", "--algorithm", "strict", "--cluster", "gpu-h100"
    )
    assert code == 0, out
    # One node's GPUs taken, then a gang that needs both nodes: it waits, blocking.
    one = ["--queue", "topq", "--gpu", "H100:8", "--duration", "600", "--estimate", "600"]
    code, out = hwt(stack, "submit", *one, "--id", "top-1")
    assert code == 0, out
    code, out = hwt(stack, "submit", *one, "--replicas", "2", "--id", "top-2")
    assert code == 0, out
    argv = _headway("--address", stack.address, "--tenant", CFG_TENANT, "top", "--interval", "0.5")
    term = Terminal(argv)
    try:

        def row(lines: list[str], name: str) -> list[str]:
            return next((ln.split() for ln in lines if ln.startswith(name + " ")), [])

        term.wait_for(lambda s: row(s, "topq")[3:5] == ["1", "1"], "topq: 1 waiting, 1 running")
        screen = term.lines()
        assert screen[0].startswith(f"headway top - tenant {CFG_TENANT} at {stack.address}")
        assert row(screen, "topq")[:5] == ["topq", "medium", "active", "1", "1"]
        assert "NoClusterCapacity (1)" in " ".join(row(screen, "topq"))
        assert any(ln.strip().startswith("NoClusterCapacity") for ln in screen)
        assert any(
            ln.startswith("  topq: top-2 (gang of 2) NoClusterCapacity, for ") for ln in screen
        )
        # The cluster workers report to tenant default only: here the declared fleet.
        assert row(screen, "gpu-h100")[:3] == ["gpu-h100", "NoReport", "8/16"]
        assert all(len(ln) <= 80 for ln in screen)
        # Something changes: the same screen shows it, in place (no second copy below).
        code, out = hwt(stack, "submit", "--queue", "topq", "--cpu", "1", "--id", "top-3")
        assert code == 0, out
        term.wait_for(lambda s: row(s, "topq")[3:4] == ["2"], "topq with 2 waiting")
        screen = term.lines()
        assert sum(ln.startswith("headway top - ") for ln in screen) == 1
        assert sum(ln.startswith("topq ") for ln in screen) == 1
        # Ctrl-C ends it cleanly.
        term.proc.send_signal(signal.SIGINT)
        assert term.proc.wait(timeout=15) == 0
        term.read()
        assert "Traceback" not in "\n".join(term.lines())
    finally:
        term.close()
    code, out = hwt(stack, "cancel", "top-1", "top-2", "top-3")
    assert code == 0, out


def test_top_piped_prints_one_screen(stack: Stack) -> None:
    code, out = hwt(stack, "top")
    assert code == 0, out
    fits_80(out)
    assert out.splitlines()[0].startswith(f"headway top - tenant {CFG_TENANT} at ")
    assert "Waiting by reason:" in out and "Blocked heads:" in out
    code, out = hw(stack, "--tenant", "nobody-here", "top")
    assert code == 1 and "tenant 'nobody-here' has no scheduler" in out, out
