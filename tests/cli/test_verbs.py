"""The read and cancel verbs (issue #24) through CliRunner, without a server: the
scheduler's queries are answered from a real scheduler core's state, and Temporal's side
(visibility, an action's workflow) from the data those calls return. Every format, the
80-column tables, and each error path."""

from __future__ import annotations

import json
from typing import Any

import pytest
import yaml
from click.testing import CliRunner, Result
from headway.cli._common import free_port
from headway.cli.main import cli
from headway.protocol import ActionEvent, ActionEventKind, DemandRequest, SubmitRequest
from headway.scheduler import (
    ActionSpec,
    Algorithm,
    ClusterSpec,
    NodeGroup,
    Pod,
    QueueSpec,
    Scheduler,
)
from headway.scheduler.resources import Quota
from headway.workflows import client as hw
from headway.workflows.action import SA, ActionResult, ActionStatus
from temporalio.client import WorkflowExecutionStatus
from temporalio.common import SearchAttributePair, TypedSearchAttributes
from temporalio.service import RPCError, RPCStatusCode

NOWHERE = f"127.0.0.1:{free_port()}"
GiB = 2**30

CLUSTERS = [
    ClusterSpec("gpu-h200", (NodeGroup("h200", 2, Pod(96_000, 2 * 2**40, 2**41, 8, "H200")),)),
    ClusterSpec("cpu", (NodeGroup("c64", 4, Pod(64_000, 256 * GiB, 500 * GiB, 0, None)),)),
]


def live() -> Scheduler:
    """A tenant's scheduler: `train` runs one action and holds two behind its action cap;
    `idle` holds nothing."""
    s = Scheduler(
        CLUSTERS,
        [
            QueueSpec(
                "train",
                algorithm=Algorithm.greedy,
                action_concurrency=1,
                depth=50,
                max_resources=Quota(cpu=64_000, memory=None, eph=None, gpu=16, gpu_type="H200"),
                clusters=("gpu-h200",),
            ),
            QueueSpec("idle"),
        ],
    )
    demand = (Pod(4000, 64 * GiB, 0, 8, "H200"),)
    for i in range(3):
        spec = ActionSpec(f"a{i}", "train", demand, run="r1", seq=i, estimate=100.0)
        assert s.submit(spec, 0.0) is None
    s.schedule(0.0)
    return s


class Fake:
    """What the scheduler workflow and Temporal answer, recorded calls included."""

    def __init__(self) -> None:
        self.sched = live()
        self.updates: list[tuple[str, dict[str, Any]]] = []
        self.by: list[Any] = []
        self.cancelled: list[str] = []
        self.down: list[str] = []

    def fleet(self) -> dict[str, Any]:
        capacity = {
            "gpu-h200": {
                "known": True,
                "nodes": 2,
                "free_gpu": 8,
                "free_cpu_m": 188_000,
                "sequence": 7,
                "incarnation": "abc123def456",
                "observed_at": 1.0,
            },
            "cpu": {"known": False, "nodes": None, "sequence": 3, "observed_at": 1.0},
        }
        return {
            "fleet": [c.to_dict() for c in CLUSTERS],
            "clusters": sorted(c.name for c in CLUSTERS),
            "capacity": capacity,
            "down": self.down,
        }


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> Fake:
    f = Fake()

    async def connect(cfg: Any) -> Any:
        return object()

    async def get_queues(client: Any, tenant: str) -> dict[str, Any]:
        return f.sched.queue_stats()

    async def get_snapshot(client: Any, tenant: str) -> dict[str, Any]:
        return {"now": 0.0, "snapshot": f.sched.to_snapshot()}

    async def get_fleet(client: Any, tenant: str) -> dict[str, Any]:
        return f.fleet()

    async def update_queue(
        client: Any, tenant: str, name: str, changes: dict[str, Any], *, by: Any = None
    ) -> Any:
        f.updates.append((name, changes))
        f.by.append(by)
        return f.sched.update_queue(name, changes).to_dict()

    async def why(client: Any, tenant: str, action_id: str) -> dict[str, Any]:
        from headway.scheduler.insight import explain

        state = f.sched.state(action_id)
        if state is None:
            return {"action_id": action_id, "state": None, "message": "not in the window"}
        ex = explain(f.sched, action_id, 0.0)
        return {
            "action_id": action_id,
            "state": state,
            "reason": f.sched.reason(action_id),
            "reasons": f.sched.reasons(action_id),
            "message": ex.message,
            "details": ex.details,
            "unblock": ex.unblock,
        }

    monkeypatch.setattr("headway.cli._common.connect", connect)
    for name, fn in (
        ("get_queues", get_queues),
        ("get_snapshot", get_snapshot),
        ("get_fleet", get_fleet),
        ("update_queue", update_queue),
        ("why", why),
    ):
        monkeypatch.setattr(hw, name, fn)
    return f


def run(*args: str) -> Result:
    return CliRunner().invoke(cli, list(args))


def fits_80(text: str) -> None:
    """Every line fits 80 columns, but a link alone on its line (it cannot be cut)."""
    wide = [
        line for line in text.splitlines() if len(line) > 80 and not line.strip().startswith("http")
    ]
    assert not wide, wide


# --- get queues / get queue / describe queue ----------------------------------------------


def test_get_queues_fits_80_columns_and_wide_adds_the_limits(fake: Fake) -> None:
    res = run("get", "queues")
    assert res.exit_code == 0, res.output
    fits_80(res.output)
    header, *rows = res.output.splitlines()
    assert header.split() == [
        "NAME",
        "PRIORITY",
        "ALGORITHM",
        "STATUS",
        "WAITING",
        "RUNNING",
        "CLUSTERS",
    ]
    train = next(r for r in rows if r.startswith("train")).split()
    assert train == ["train", "medium", "greedy", "active", "2", "1", "gpu-h200"]
    res = run("get", "queues", "-o", "wide")
    assert res.exit_code == 0, res.output
    assert "CONCURRENCY" in res.output and "∞/1/∞" in res.output
    assert "cpu=64,gpu=H200:16" in res.output


def test_get_queues_shortens_a_long_selector_to_fit_80_columns(fake: Fake) -> None:
    pinned = ("gpu-h200-eu-west", "gpu-h200-us-east", "cpu")
    fake.sched.upsert_queue(QueueSpec("pinned", clusters=pinned))
    res = run("get", "queues")
    assert res.exit_code == 0, res.output
    fits_80(res.output)
    row = next(r for r in res.output.splitlines() if r.startswith("pinned"))
    assert row.split()[-1] == "gpu-h200-eu-west,+2"
    res = run("get", "queues", "-o", "wide")
    assert "gpu-h200-eu-west,gpu-h200-us-east,cpu" in res.output


@pytest.mark.parametrize("fmt", [["-o", "json"], ["--json"], ["-o", "yaml"]])
def test_get_queues_structured(fake: Fake, fmt: list[str]) -> None:
    res = run("get", "queues", *fmt)
    assert res.exit_code == 0, res.output
    data = yaml.safe_load(res.output)  # JSON is YAML too
    train = next(q for q in data if q["name"] == "train")
    assert train["max_resources"] == {"cpu": 64, "gpu": "H200:16"}
    assert (train["waiting"], train["running"]) == (2, 1)


def test_get_queue_shows_in_flight_against_each_limit(fake: Fake) -> None:
    res = run("get", "queue", "train")
    assert res.exit_code == 0, res.output
    fits_80(res.output)
    lines = [" ".join(line.split()) for line in res.output.splitlines()]
    assert "Status: active" in lines and "Clusters: gpu-h200" in lines
    assert "actions 1 1" in lines  # one in flight of one allowed
    assert "per run (busiest) 1 unlimited" in lines
    assert "depth (waiting+running) 3 50" in lines
    assert "cpu 4 64" in lines and "memory 64Gi unlimited" in lines
    assert "gpu H200:8 H200:16" in lines
    assert "ActionConcurrency 2" in lines
    assert any(line.startswith("Wait p50/p95:") for line in lines)


def test_get_queue_json_and_yaml_carry_the_numbers(fake: Fake) -> None:
    data = json.loads(run("get", "queue", "train", "-o", "json").output)
    assert data["in_flight"]["actions"] == {"used": 1, "limit": 1}
    assert data["in_flight"]["per_run"] == {"used": 1, "limit": None}
    assert data["in_flight"]["depth"] == {"used": 3, "limit": 50}
    assert data["quota"]["gpu"] == {"used": "H200:8", "limit": "H200:16"}
    assert data["quota"]["memory"] == {"used": "64Gi", "limit": None}
    assert data["waiting_by_reason"] == {"ActionConcurrency": 2}
    assert data["wait_p50_s"] is not None and data["wait_p95_s"] >= data["wait_p50_s"]
    assert yaml.safe_load(run("get", "queue", "train", "-o", "yaml").output) == {
        **data,
        "wait_p50_s": pytest.approx(data["wait_p50_s"], abs=60),
        "wait_p95_s": pytest.approx(data["wait_p95_s"], abs=60),
    }


def test_describe_queue_lists_waiting_in_order_with_forecast(fake: Fake) -> None:
    res = run("describe", "queue", "train")
    assert res.exit_code == 0, res.output
    fits_80(res.output)
    assert "action_concurrency:  1" in res.output
    rows = [
        line.split() for line in res.output.splitlines() if line.strip().startswith(("1 ", "2 "))
    ]
    # Positions in order; each starts when the one before ends (estimates of 100 s).
    assert [r[1] for r in rows] == ["a1", "a2"]
    assert [r[4] for r in rows] == ["1m40s", "3m20s"]
    data = json.loads(run("describe", "queue", "train", "-o", "json").output)
    assert [w["starts_in_s"] for w in data["waiting_actions"]] == [100.0, 200.0]
    assert [r["action"] for r in data["running_actions"]] == ["a0"]


def test_queue_names_are_checked_before_connecting() -> None:
    for args in (
        ["get", "queue", "Bad_Name"],
        ["describe", "queue", "a" * 64],
        ["create", "queue", "bad/name:;"],
        ["create", "queue", "has space"],
        ["update", "queue", "-lead", "--depth", "3"],
        ["drain", "queue", "UPPER"],
        ["create", "queue", "ok", "--cluster", "bad cluster"],
    ):
        res = CliRunner().invoke(cli, ["--address", NOWHERE, *args])
        assert res.exit_code == 2, (args, res.output)
        assert "cannot reach" not in res.output
    res = CliRunner().invoke(cli, ["--address", NOWHERE, "create", "queue", "a" * 300])
    assert "is 300 characters long (at most 63)" in res.output
    res = CliRunner().invoke(cli, ["--address", NOWHERE, "create", "queue", "x", "--cluster", "A"])
    assert "--cluster: 'A' is not a valid name" in res.output


def test_a_missing_queue_is_named(fake: Fake) -> None:
    res = run("get", "queue", "nope")
    assert res.exit_code == 1
    assert "queue 'nope' does not exist (queues: idle, train)" in res.output


# --- drain / resume ---------------------------------------------------------------------


def test_drain_and_resume_set_the_status(fake: Fake) -> None:
    res = run("drain", "queue", "train")
    assert res.exit_code == 0, res.output
    assert res.output.strip() == "queue 'train' draining (2 waiting, 1 running)"
    assert fake.updates == [("train", {"status": "draining"})]
    res = run("drain", "queue", "train")
    assert "already draining" in res.output and len(fake.updates) == 1
    res = run("resume", "queue", "train")
    assert res.output.strip() == "queue 'train' active (was draining)"
    assert fake.updates[-1] == ("train", {"status": "active"})
    res = run("resume", "queue", "train")
    assert "already active" in res.output and len(fake.updates) == 2
    # Each change names where it came from, for its audit row.
    assert [b["source"] for b in fake.by] == ["cli", "cli"] and all(b["who"] for b in fake.by)
    res = run("drain", "queue", "nope")
    assert res.exit_code == 1 and "queue 'nope' does not exist" in res.output


# --- get clusters / describe cluster ------------------------------------------------------


def test_get_clusters_from_the_fleet_and_the_scheduler_state(fake: Fake) -> None:
    res = run("get", "clusters")
    assert res.exit_code == 0, res.output
    fits_80(res.output)
    rows = {line.split()[0]: line.split() for line in res.output.splitlines()[1:]}
    # One 8-GPU action of `train` runs on gpu-h200 (the scheduler's count).
    assert rows["gpu-h200"][:6] == ["gpu-h200", "Ready", "2", "8/16", "188/192", "4032Gi/4Ti"]
    assert rows["cpu"][:3] == ["cpu", "Unknown", "4"]  # its worker cannot read nodes
    wide = run("get", "clusters", "-o", "wide").output
    assert "H200" in wide and "abc123def456" in wide


def test_a_silent_cluster_is_down(fake: Fake) -> None:
    fake.down = ["gpu-h200"]
    data = json.loads(run("get", "clusters", "-o", "json").output)
    assert {c["name"]: c["status"] for c in data} == {"gpu-h200": "Down", "cpu": "Unknown"}


def test_describe_cluster_shows_nodes_and_who_uses_them(fake: Fake) -> None:
    res = run("describe", "cluster", "gpu-h200")
    assert res.exit_code == 0, res.output
    fits_80(res.output)
    lines = [" ".join(line.split()) for line in res.output.splitlines()]
    assert "Allocatable: cpu 192, memory 4Ti, gpu H200:16, ephemeral 4Ti" in lines
    assert "tenant default 4 64Gi H200:8 0" in lines
    assert "others 0 0 0 0" in lines
    assert "h200-0 92/96 1984Gi/2Ti 0/8 2Ti/2Ti" in lines
    assert "Running actions (1): a0" in lines
    data = yaml.safe_load(run("describe", "cluster", "gpu-h200", "-o", "yaml").output)
    assert data["last_report"]["sequence"] == 7 and data["running_actions"] == ["a0"]
    res = run("describe", "cluster", "nope")
    assert res.exit_code == 1
    assert "cluster 'nope' is not in the fleet of tenant 'default'" in res.output


# --- get actions ----------------------------------------------------------------------------


ROWS = [
    hw.ActionRow(
        action_id="train-7f3a9c1e",
        tenant="default",
        queue="train",
        run="run-1",
        state="running",
        reason="Admitted",
        cluster="gpu-h200",
        workflow_id="headway-action-default-train-7f3a9c1e",
        status="running",
        started_at=1.0,
    ),
    hw.ActionRow(
        action_id="score-1",
        tenant="default",
        queue="default",
        run="score-1",
        state="waiting",
        reason="Waiting",
        cluster=None,
        workflow_id="headway-action-default-score-1",
        status="running",
        started_at=2.0,
    ),
]


def test_get_actions_passes_the_filters_and_prints_every_format(
    fake: Fake, monkeypatch: pytest.MonkeyPatch
) -> None:
    asked: list[dict[str, Any]] = []

    async def list_actions(client: Any, tenant: str, **kw: Any) -> list[hw.ActionRow]:
        asked.append({"tenant": tenant, **kw})
        return ROWS

    monkeypatch.setattr(hw, "list_actions", list_actions)
    res = run("get", "actions", "--queue", "train", "--state", "running", "--run", "run-1")
    assert res.exit_code == 0, res.output
    assert asked[-1] == {
        "tenant": "default",
        "queue": "train",
        "state": "running",
        "run": "run-1",
        "limit": 100,
    }
    fits_80(res.output)
    assert res.output.splitlines()[0].split() == [
        "NAME",
        "QUEUE",
        "STATE",
        "REASON",
        "CLUSTER",
        "AGE",
    ]
    wide = run("get", "actions", "-o", "wide", "--limit", "0").output
    assert "headway-action-default-score-1" in wide and asked[-1]["limit"] is None
    data = json.loads(run("get", "actions", "--json").output)
    assert [d["action_id"] for d in data] == ["train-7f3a9c1e", "score-1"]
    assert yaml.safe_load(run("get", "actions", "-o", "yaml").output) == data


def test_get_actions_gives_a_waiting_action_the_schedulers_reason(
    fake: Fake, monkeypatch: pytest.MonkeyPatch
) -> None:
    first_task = hw.ActionRow(
        "a1", "default", "train", "r1", "submitting", None, None, "w1", "running"
    )
    listed = hw.ActionRow(
        "a2", "default", "train", "r1", "waiting", "Waiting", None, "w2", "running"
    )

    async def list_actions(client: Any, tenant: str, **kw: Any) -> list[hw.ActionRow]:
        return [listed, first_task]

    monkeypatch.setattr(hw, "list_actions", list_actions)
    rows = json.loads(run("get", "actions", "-o", "json").output)
    assert [(r["action_id"], r["state"], r["reason"]) for r in rows] == [
        ("a2", "waiting", "ActionConcurrency"),
        ("a1", "waiting", "ActionConcurrency"),
    ]


def test_get_actions_rejects_bad_filters_before_connecting() -> None:
    for args, named in (
        (["--state", "paused"], "'paused' is not one of"),
        (["--queue", "Bad Queue"], "--queue: 'Bad Queue' is not a valid name"),
        (["--run", "a b"], "--run: 'a b' is not a valid id"),
        (["--limit", "-1"], "-1 is not in the range x>=0"),
    ):
        res = CliRunner().invoke(cli, ["--address", NOWHERE, "get", "actions", *args])
        assert res.exit_code == 2 and named in res.output, res.output


def test_the_visibility_filter_of_a_listing() -> None:
    q = hw.actions_query("t1", queue="q1", run="r1")
    # Actions in their first task have no attributes yet: listed by memo, see list_actions.
    assert q == (
        "WorkflowType = 'ActionWorkflow' AND ((HeadwayTenant = 't1' AND HeadwayQueue = 'q1'"
        " AND HeadwayRun = 'r1') OR ((HeadwayTenant IS NULL AND ExecutionStatus = 'Running')))"
    )
    assert hw.actions_query("t1", state="waiting", in_flight=True) == (
        "WorkflowType = 'ActionWorkflow' AND (HeadwayTenant = 't1' AND HeadwayState = 'waiting'"
        " AND ExecutionStatus = 'Running')"
    )
    # Ended states: by the attributes, or by how the workflow was closed.
    assert "ExecutionStatus = 'Canceled'" in hw.actions_query("t1", state="cancelled")
    assert "ExecutionStatus = 'Terminated'" in hw.actions_query("t1", state="failed")
    assert "IS NULL" not in hw.actions_query("t1", state="succeeded")
    assert hw.actions_query("t1", state="submitting").endswith(
        "((HeadwayTenant IS NULL AND ExecutionStatus = 'Running'))"
    )
    assert "\\'" in hw.actions_query("t'1")  # quoted, whatever the caller passes
    with pytest.raises(ValueError, match="state: 'paused'"):
        hw.actions_query("t1", state="paused")


def _sa(**values: str) -> TypedSearchAttributes:
    return TypedSearchAttributes([SearchAttributePair(SA[k], v) for k, v in values.items()])


@pytest.mark.parametrize(
    ("status", "attrs", "want"),
    [
        (WorkflowExecutionStatus.RUNNING, {}, ("submitting", None)),
        (WorkflowExecutionStatus.RUNNING, {"HeadwayState": "waiting"}, ("waiting", None)),
        (
            WorkflowExecutionStatus.TERMINATED,
            {"HeadwayState": "running", "HeadwayReason": "Admitted"},
            ("failed", "Terminated"),
        ),
        (WorkflowExecutionStatus.CANCELED, {"HeadwayState": "waiting"}, ("cancelled", "Cancelled")),
        (
            WorkflowExecutionStatus.FAILED,
            {"HeadwayState": "rejected", "HeadwayReason": "UnknownQueue"},
            ("rejected", "UnknownQueue"),
        ),
        (WorkflowExecutionStatus.COMPLETED, {}, ("succeeded", None)),
    ],
)
def test_an_actions_state_from_its_workflow(
    status: WorkflowExecutionStatus, attrs: dict[str, str], want: tuple[str, str | None]
) -> None:
    assert hw._state_of(status, _sa(**attrs)) == want


# --- describe action ------------------------------------------------------------------------


def details(action_id: str, state: str, **kw: Any) -> hw.ActionDetails:
    req = SubmitRequest(
        action_id=action_id,
        queue="train",
        demand=DemandRequest(resources={"cpu": "4", "memory": "64Gi", "gpu": "H200:8"}),
        tenant="default",
        run="r1",
        task="train",
        estimate_s=100.0,
    )
    base: dict[str, Any] = {
        "action_id": action_id,
        "tenant": "default",
        "workflow_id": f"headway-action-default-{action_id}",
        "run_id": "x",
        "state": state,
        "reason": None,
        "execution_status": "running",
        "started_at": 10.0,
        "ended_at": None,
        "queue": "train",
        "run": "r1",
        "request": req,
        "status": ActionStatus(action_id, "default", "train", state, submitted_at=10.0),
    }
    base.update(kw)
    return hw.ActionDetails(**base)


@pytest.fixture
def action(fake: Fake, monkeypatch: pytest.MonkeyPatch) -> dict[str, hw.ActionDetails]:
    known: dict[str, hw.ActionDetails] = {}

    async def action_details(client: Any, tenant: str, action_id: str) -> hw.ActionDetails:
        if action_id not in known:
            raise hw.ActionNotFoundError(tenant, action_id)
        return known[action_id]

    monkeypatch.setattr(hw, "action_details", action_details)
    return known


def test_describe_a_waiting_action_gives_its_position_and_start(
    action: dict[str, hw.ActionDetails],
) -> None:
    action["a2"] = details("a2", "waiting", reason="Waiting")
    res = run("describe", "action", "a2")
    assert res.exit_code == 0, res.output
    fits_80(res.output)
    lines = [" ".join(line.split()) for line in res.output.splitlines()]
    assert "State: waiting (ActionConcurrency)" in lines  # the scheduler's reason, live
    assert "Position: 2 of 2 in queue train" in lines
    assert "Starts in: ~3m20s on gpu-h200 (forecast by estimates)" in lines
    assert "main 1 4 64Gi H200:8 -" in lines  # demand per pod, Kubernetes units
    assert "Web UI: http://localhost:8233/namespaces/default/workflows/" in " ".join(lines)
    data = json.loads(run("describe", "action", "a2", "-o", "json").output)
    w = data["waiting"]
    assert (w["position"], w["of"], w["starts_in_s"]) == (2, 2, 200.0)
    assert data["reasons"] == ["ActionConcurrency"]
    assert any("action_concurrency" in u for u in w["unblock"])


def test_describe_a_running_action_gives_cluster_nodes_pods_and_events(
    action: dict[str, hw.ActionDetails],
) -> None:
    st = ActionStatus("a0", "default", "train", "running", cluster="gpu-h200", submitted_at=10.0)
    st.admitted_at = 11.0
    st.events = [
        ActionEvent("a0", ActionEventKind.SCHEDULED, "gpu-h200", "hw-a0-main-0", "h200-1", None),
        ActionEvent("a0", ActionEventKind.RUNNING, "gpu-h200", "hw-a0-main-0", "h200-1", None),
    ]
    action["a0"] = details("a0", "running", status=st, cluster="gpu-h200", attempts=2)
    action["a0"].last_failure = "worker lost"
    res = run("describe", "action", "a0", "--events", "1")
    assert res.exit_code == 0, res.output
    fits_80(res.output)
    lines = [" ".join(line.split()) for line in res.output.splitlines()]
    assert "Cluster: gpu-h200" in lines and "Nodes: h200-1" in lines
    assert "Retries: 1" in lines and "Last failure: worker lost" in lines
    assert any(line.startswith("hw-a0-main-0 h200-1 Running") for line in lines)
    assert "(1 earlier left out; --events 0 shows all)" in lines
    assert "Waiting:" not in lines
    data = yaml.safe_load(run("describe", "action", "a0", "-o", "yaml").output)
    assert [e["kind"] for e in data["events"]] == ["Scheduled", "Running"]


def test_describe_ended_actions(action: dict[str, hw.ActionDetails]) -> None:
    action["bad"] = details(
        "bad",
        "rejected",
        reason="UnknownQueue",
        execution_status="failed",
        result=ActionResult("bad", "rejected", reason="UnknownQueue", message="no queue 'x'"),
    )
    res = run("describe", "action", "bad")
    assert res.exit_code == 0, res.output
    assert "State:     rejected (UnknownQueue)" in res.output
    assert "Message:   no queue 'x'" in res.output
    st = ActionStatus("gone", "default", "train", "cancelled", cluster="gpu-h200")
    st.events = [
        ActionEvent("gone", ActionEventKind.RUNNING, "gpu-h200", "hw-gone-main-0", "h200-0"),
    ]
    action["gone"] = details(
        "gone",
        "cancelled",
        reason="Cancelled",
        execution_status="canceled",
        status=st,
        attempts=1,
        cancel_requested_by="4242@laptop",
    )
    res = run("describe", "action", "gone")
    assert "Cancelled by: 4242@laptop" in res.output
    assert "Running, then deleted" in res.output


def test_describe_a_missing_action(action: dict[str, hw.ActionDetails]) -> None:
    res = run("describe", "action", "nope-1")
    assert res.exit_code == 1
    assert res.output.strip() == (
        "Error: action 'nope-1' not found in tenant 'default' (see `headway get actions`)"
    )
    res = run("describe", "action", "bad id")
    assert res.exit_code == 2 and "ID: 'bad id' is not a valid id" in res.output


# --- cancel ---------------------------------------------------------------------------------


@pytest.fixture
def cancels(fake: Fake, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """Action id -> how cancel_action answers for it (an outcome, or not found)."""
    answers: dict[str, Any] = {}
    calls: list[tuple[str, bool, float]] = []

    async def cancel_action(
        client: Any, tenant: str, action_id: str, *, wait: bool, timeout_s: float
    ) -> hw.CancelOutcome:
        calls.append((action_id, wait, timeout_s))
        if action_id not in answers:
            raise hw.ActionNotFoundError(tenant, action_id)
        out: hw.CancelOutcome = answers[action_id]
        return out

    async def list_actions(client: Any, tenant: str, **kw: Any) -> list[hw.ActionRow]:
        assert kw == {"run": "run-1", "in_flight": True, "limit": None}
        return list(reversed(ROWS))  # newest first

    monkeypatch.setattr(hw, "cancel_action", cancel_action)
    monkeypatch.setattr(hw, "list_actions", list_actions)
    answers["_calls"] = calls
    return answers


def _ended(action_id: str, state: str) -> ActionResult:
    return ActionResult(action_id, state, reason=state.capitalize())


def test_cancel_reports_each_action(cancels: dict[str, Any]) -> None:
    cancels["w1"] = hw.CancelOutcome("w1", "waiting", True, _ended("w1", "cancelled"))
    cancels["r1"] = hw.CancelOutcome("r1", "running", True, _ended("r1", "cancelled"), "c1")
    cancels["done"] = hw.CancelOutcome("done", "succeeded", False, _ended("done", "succeeded"))
    cancels["raced"] = hw.CancelOutcome("raced", "running", True, _ended("raced", "succeeded"))
    res = run("cancel", "w1", "r1", "done", "raced")
    assert res.exit_code == 0, res.output
    assert res.output.splitlines() == [
        "action 'w1' cancelled (was waiting)",
        "action 'r1' cancelled (was running on c1)",
        "action 'done' had already ended: succeeded",
        "action 'raced' ended succeeded before the cancellation took effect",
    ]
    assert cancels["_calls"][0] == ("w1", True, 120.0)


def test_cancel_fails_for_a_missing_action_or_a_timeout(cancels: dict[str, Any]) -> None:
    cancels["slow"] = hw.CancelOutcome("slow", "running", True, None)
    res = run("cancel", "slow", "ghost", "--timeout", "5")
    assert res.exit_code == 1
    assert "action 'slow' was asked to cancel but had not ended after 5s" in res.output
    assert "action 'ghost' not found in tenant 'default'" in res.output


def test_cancel_says_what_it_waits_for(
    cancels: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    import asyncio

    from headway.cli import actions

    async def slow(client: Any, tenant: str, action_id: str, **kw: Any) -> hw.CancelOutcome:
        await asyncio.sleep(0.2)
        return hw.CancelOutcome(action_id, "running", True, _ended(action_id, "cancelled"))

    monkeypatch.setattr(hw, "cancel_action", slow)
    monkeypatch.setattr(actions, "PATIENCE_S", 0.05)
    res = CliRunner().invoke(cli, ["cancel", "r9"])
    assert res.exit_code == 0, res.output
    assert res.stderr.startswith("waiting for the cancelled actions to end")
    assert res.stdout == "action 'r9' cancelled (was running)\n"


def test_cancel_without_waiting(cancels: dict[str, Any]) -> None:
    cancels["w1"] = hw.CancelOutcome("w1", "waiting", True)
    res = run("cancel", "w1", "--no-wait")
    assert res.exit_code == 0
    assert res.output.strip() == "action 'w1': cancellation requested (was waiting)"
    assert cancels["_calls"] == [("w1", False, 120.0)]


def test_cancel_a_run_cancels_what_it_has_in_flight(cancels: dict[str, Any]) -> None:
    for r in ROWS:
        cancels[r.action_id] = hw.CancelOutcome(
            r.action_id, r.state, True, _ended(r.action_id, "cancelled")
        )
    res = run("cancel", "--run", "run-1")
    assert res.exit_code == 0, res.output
    assert [c[0] for c in cancels["_calls"]] == ["train-7f3a9c1e", "score-1"]  # oldest first


def test_cancel_needs_a_target_and_valid_ids() -> None:
    res = CliRunner().invoke(cli, ["--address", NOWHERE, "cancel"])
    assert res.exit_code == 2 and "name at least one ACTION, or --run RUN" in res.output
    res = CliRunner().invoke(cli, ["--address", NOWHERE, "cancel", "ok-1", "no/slash"])
    assert res.exit_code == 2 and "ACTION: 'no/slash' is not a valid id" in res.output
    res = CliRunner().invoke(cli, ["--address", NOWHERE, "cancel", "x" * 201])
    assert res.exit_code == 2 and "(at most 200)" in res.output


# --- one line for a server that cannot answer ---------------------------------------------


@pytest.mark.parametrize(
    "args",
    [
        ["get", "queues"],
        ["get", "queue", "q1"],
        ["describe", "queue", "q1"],
        ["get", "actions"],
        ["describe", "action", "a1"],
        ["cancel", "a1"],
        ["cancel", "--run", "r1"],
        ["get", "clusters"],
        ["describe", "cluster", "c1"],
        ["drain", "queue", "q1"],
        ["resume", "queue", "q1"],
        ["get", "org"],
        ["forecast"],
    ],
)
def test_an_unreachable_server_is_one_line(args: list[str]) -> None:
    res = CliRunner().invoke(cli, ["--address", NOWHERE, *args])
    assert res.exit_code == 1
    assert res.output.splitlines() == [
        f"Error: cannot reach Temporal at {NOWHERE} (connection refused). Is it running? "
        "Start one with `headway server start` or `headway up`, or point --address "
        "(env HEADWAY_TEMPORAL_ADDRESS) at it."
    ]


def test_a_missing_namespace_or_tenant_is_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    async def connect(cfg: Any) -> Any:
        return object()

    async def no_namespace(client: Any, tenant: str) -> Any:
        raise RPCError("Namespace nope is not found.", RPCStatusCode.NOT_FOUND, b"")

    async def no_scheduler(client: Any, tenant: str) -> Any:
        raise RPCError(
            f"workflow not found for ID: headway-scheduler-{tenant}", RPCStatusCode.NOT_FOUND, b""
        )

    monkeypatch.setattr("headway.cli._common.connect", connect)
    monkeypatch.setattr(hw, "get_queues", no_namespace)
    monkeypatch.setattr(hw, "get_fleet", no_namespace)
    for args in (["get", "queues"], ["get", "clusters"]):
        res = run("--namespace", "nope", *args)
        assert res.exit_code == 1
        assert res.output.strip() == (
            "Error: namespace 'nope' does not exist on Temporal at localhost:7233 "
            "(--namespace; list them with `temporal operator namespace list`)"
        )
    monkeypatch.setattr(hw, "get_queues", no_scheduler)
    monkeypatch.setattr(hw, "get_fleet", no_scheduler)
    for args in (["get", "queue", "q1"], ["get", "clusters"]):
        res = run("--tenant", "ghost", *args)
        assert res.exit_code == 1
        assert res.output.startswith("Error: tenant 'ghost' has no scheduler on localhost:7233")
    res = run("--tenant", "Ghost/1", "get", "queues")
    assert res.exit_code == 2 and "--tenant: 'Ghost/1' is not a valid name" in res.output


# --- forecast / what-if take -o; --json stays ---------------------------------------------


def test_forecast_takes_every_format(fake: Fake, monkeypatch: pytest.MonkeyPatch) -> None:
    from headway.cli import insight

    async def snap(client: Any, tenant: str) -> tuple[Scheduler, float]:
        return Scheduler.from_snapshot(fake.sched.to_snapshot()), 0.0

    monkeypatch.setattr(insight, "fetch_snapshot", snap)
    as_json = json.loads(run("forecast", "--json").output)
    assert json.loads(run("forecast", "-o", "json").output) == as_json
    assert yaml.safe_load(run("forecast", "-o", "yaml").output) == as_json
    table = run("forecast").output
    fits_80(table)
    assert table.splitlines()[0].split() == ["ACTION", "QUEUE", "REASON", "STARTS", "IN", "CLUSTER"]
    res = run("forecast", "--json", "-o", "yaml")
    assert res.exit_code == 2 and "--json and -o yaml contradict each other" in res.output


# --- completion and --version ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("shell", "marker"),
    [("bash", "complete -o"), ("zsh", "compdef"), ("fish", "complete --no-files")],
)
def test_completion_scripts(shell: str, marker: str) -> None:
    res = run("completion", shell)
    assert res.exit_code == 0, res.output
    assert marker in res.output and "_HEADWAY_COMPLETE" in res.output


def test_completion_of_names_asks_the_server(fake: Fake, monkeypatch: pytest.MonkeyPatch) -> None:
    from click.shell_completion import ShellComplete

    async def list_actions(client: Any, tenant: str, **kw: Any) -> list[hw.ActionRow]:
        return ROWS

    async def connect(*args: Any, **kw: Any) -> Any:
        return object()

    monkeypatch.setattr("temporalio.client.Client.connect", connect)
    monkeypatch.setattr(hw, "list_actions", list_actions)

    def complete(args: list[str], incomplete: str) -> list[str]:
        comp = ShellComplete(cli, {}, "headway", "_HEADWAY_COMPLETE")
        return [c.value for c in comp.get_completions(args, incomplete)]

    assert complete(["describe", "queue"], "t") == ["train"]
    assert complete(["get", "queue"], "") == ["idle", "train"]
    assert complete(["describe", "cluster"], "gpu") == ["gpu-h200"]
    assert complete(["describe", "action"], "s") == ["score-1"]
    assert complete(["cancel"], "") == ["score-1", "train-7f3a9c1e"]
    assert complete(["get", "actions", "--queue"], "i") == ["idle"]


def test_completion_offers_nothing_when_the_server_is_away() -> None:
    from click.shell_completion import ShellComplete

    comp = ShellComplete(cli, {}, "headway", "_HEADWAY_COMPLETE")
    assert comp.get_completions(["--address", NOWHERE, "describe", "queue"], "") == []


def test_version() -> None:
    from headway import __version__

    res = run("--version")
    assert res.exit_code == 0 and res.output.strip() == f"headway, version {__version__}"


def test_help_documents_exit_codes_and_defaults() -> None:
    res = run("--help")
    assert "Exit codes:" in res.output and "2  a usage error" in res.output
    fits_80(res.output)
    for verb in ("describe", "cancel", "drain", "resume", "completion"):
        assert verb in res.output
    res = run("get", "actions", "--help")
    assert "[default: 100; x>=0]" in res.output and "table|wide|json|yaml" in res.output


# --- why ------------------------------------------------------------------------------------


@pytest.mark.parametrize("fmt", [["-o", "json"], ["--json"], ["-o", "yaml"]], ids=str)
def test_why_speaks_every_output_format_with_the_same_data(fake: Fake, fmt: list[str]) -> None:
    res = run("why", "a1", *fmt)
    assert res.exit_code == 0, res.output
    data = yaml.safe_load(res.output)  # JSON is YAML too
    assert data["state"] == "waiting" and data["reason"] == "ActionConcurrency"
    assert data["unblock"], data


def test_why_as_text_says_what_would_unblock_it(fake: Fake) -> None:
    res = run("why", "a1")
    assert res.exit_code == 0, res.output
    assert "what would unblock it:" in res.output


def test_why_as_text_shows_kubernetes_units_and_wall_clock_times(
    fake: Fake, monkeypatch: pytest.MonkeyPatch
) -> None:
    import re
    import time

    at = round(time.time() + 600)

    async def why(client: Any, tenant: str, action_id: str) -> dict[str, Any]:
        return {
            "action_id": action_id,
            "state": "waiting",
            "reason": "NoClusterCapacity",
            "details": {"need": {"cpu_m": 8500, "memory": 64 * GiB, "gpu": 8}},
            "unblock": [f"fits on gpu-h100 at t={at} when running work ends by its estimates"],
        }

    monkeypatch.setattr(hw, "why", why)
    res = run("why", "a1")
    assert res.exit_code == 0, res.output
    assert 'details: {"need": {"cpu": "8500m", "memory": "64Gi", "gpu": 8}}' in res.output
    clock = time.strftime("%H:%M:%SZ", time.gmtime(at))
    assert re.search(rf"fits on gpu-h100 at {clock} \(in (9m5\ds|10m00s)\) when", res.output)
    # json keeps the numbers as the scheduler gave them.
    data = json.loads(run("why", "a1", "-o", "json").output)
    assert data["details"]["need"] == {"cpu_m": 8500, "memory": 64 * GiB, "gpu": 8}
