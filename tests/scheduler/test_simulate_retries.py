"""Retries and the ready timeout as rules of ``headway simulate`` (issue #23): a workload
entry's ``failures:`` end its attempts one by one, and each is retried by the queue's
``retry`` policy exactly as the live action workflow retries it (``retry.next_attempt``,
the next attempt past the door at the action's first submit time, as ``ACTION~N``)."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from headway.cli.main import cli
from headway.scheduler.scenario import ScenarioError, load_scenario
from headway.scheduler.simulator import render_json, simulate

GI = 2**30


def _scenario(retry: str, workload: str, *, concurrency: int | None = None) -> str:
    conc = f"\n    action_concurrency: {concurrency}" if concurrency else ""
    return textwrap.dedent(
        """\
        clusters:
          - name: c1
            node_groups:
              - {name: n, count: 1, shape: {cpu: 8, memory: 8Gi}}
        queues:
          - name: q
            algorithm: strict
            retry: %s%s
        workload:
        %s"""
    ) % (retry, conc, textwrap.indent(textwrap.dedent(workload), ""))


def _run(text: str) -> dict[str, Any]:
    doc: dict[str, Any] = simulate(load_scenario(text, "t.yaml")).doc
    return {a["id"]: a for a in doc["actions"]}


def _attempts(a: dict[str, Any]) -> list[tuple[Any, ...]]:
    return [(t["id"], t["start"], t["end"], t["outcome"]) for t in a["attempts"]]


def test_an_oom_is_retried_with_more_memory_at_once() -> None:
    got = _run(
        _scenario(
            "{oom: 2, oom_factor: 2}",
            """\
            - id: a
              queue: q
              submit: 0
              duration: 100
              resources: {cpu: 1, memory: 2Gi}
              failures: [{kind: OOMKilled, after: 10}, {kind: OOMKilled, after: 20}]
            """,
        )
    )["a"]
    assert _attempts(got) == [
        ("a", 0, 10, "OOMKilled"),
        ("a~2", 10, 30, "OOMKilled"),
        ("a~3", 30, 130, "Succeeded"),
    ]
    assert [t.get("retry") for t in got["attempts"]] == [
        "memory 2Gi -> 4Gi (retry 1 of 2)",
        "memory 4Gi -> 8Gi (retry 2 of 2)",
        None,
    ]
    assert (got["status"], got["start"], got["end"]) == ("succeeded", 0, 130)


@pytest.mark.parametrize(
    ("retry", "failures", "status", "end"),
    [
        pytest.param("{}", "[{kind: OOMKilled, after: 10}]", "failed", 10, id="no-policy-no-retry"),
        pytest.param(
            "{failed: 1, backoff: 5}",
            "[{kind: Failed, after: 1}, {kind: Failed, after: 1}]",
            "failed",
            7,
            id="failed-retries-exhausted",
        ),
        pytest.param(
            "{oom: 3, oom_factor: 2}",
            "[{kind: OOMKilled, after: 1}, {kind: OOMKilled, after: 1}, {kind: OOMKilled, after: 1}]",
            "failed",
            3,
            id="a-retry-no-node-can-hold-is-refused",
        ),
        pytest.param(
            "{lost: 1}", "[{kind: Evicted, after: 4}]", "succeeded", 14, id="evicted-is-lost"
        ),
    ],
)
def test_how_an_action_with_failures_ends(retry: str, failures: str, status: str, end: int) -> None:
    got = _run(
        _scenario(
            retry,
            f"""\
            - id: a
              queue: q
              submit: 0
              duration: 10
              resources: {{cpu: 1, memory: 2Gi}}
              failures: {failures}
            """,
        )
    )["a"]
    assert (got["status"], got["end"]) == (status, end)


def test_a_refused_retry_says_why() -> None:
    got = _run(
        _scenario(
            "{oom: 3, oom_factor: 2}",
            """\
            - id: a
              queue: q
              submit: 0
              duration: 10
              resources: {cpu: 1, memory: 4Gi}
              failures: [{kind: OOMKilled, after: 1}, {kind: OOMKilled, after: 1}]
            """,
        )
    )["a"]
    assert got["attempts"][-1]["refused"] == "Unschedulable"
    assert got["status"] == "failed"


def test_an_application_failure_backs_off_doubling() -> None:
    got = _run(
        _scenario(
            "{failed: 2, backoff: 3}",
            """\
            - id: a
              queue: q
              submit: 0
              duration: 10
              resources: {cpu: 1}
              failures: [{kind: Failed, after: 1}, {kind: Failed, after: 1}]
            """,
        )
    )["a"]
    # Ends at 1, retried 3 s later; ends at 5, retried 6 s later; then runs its 10 s.
    assert _attempts(got) == [
        ("a", 0, 1, "Failed"),
        ("a~2", 4, 5, "Failed"),
        ("a~3", 11, 21, "Succeeded"),
    ]


def test_a_lost_attempt_is_requeued_at_the_head_of_its_queue() -> None:
    # One slot. ``x`` is preempted at 5 while y and z wait (submitted after it): its next
    # attempt carries x's first submit time, so it runs before them.
    got = _run(
        _scenario(
            "{lost: 1}",
            """\
            - {id: x, queue: q, submit: 0, duration: 10, resources: {cpu: 1},
               failures: [{kind: Preempted, after: 5}]}
            - {id: y, queue: q, submit: 1, duration: 10, resources: {cpu: 1}}
            - {id: z, queue: q, submit: 2, duration: 10, resources: {cpu: 1}}
            """,
            concurrency=1,
        )
    )
    assert _attempts(got["x"]) == [("x", 0, 5, "Preempted"), ("x~2", 5, 15, "Succeeded")]
    assert (got["y"]["start"], got["z"]["start"]) == (15, 25)


def test_a_pod_that_never_starts_ends_at_the_ready_timeout_then_retries() -> None:
    got = _run(
        _scenario(
            "{ready_timeout: 30, not_ready: 1, backoff: 5}",
            """\
            - id: a
              queue: q
              submit: 0
              duration: 10
              resources: {cpu: 1}
              failures: [{kind: NotReady}, {kind: NotReady}]
            """,
        )
    )["a"]
    assert _attempts(got) == [("a", 0, 30, "NotReady"), ("a~2", 35, 65, "NotReady")]
    assert (got["status"], got["end"]) == ("failed", 65)


def test_a_retry_still_waiting_at_the_end_is_pending_with_its_reason() -> None:
    text = _scenario(
        "{oom: 1, oom_factor: 2}",
        """\
        - {id: a, queue: q, submit: 0, duration: 10, resources: {cpu: 1, memory: 2Gi},
           failures: [{kind: OOMKilled, after: 1}]}
        """,
    )
    # The cluster goes down while the first attempt runs: its retry never finds room.
    got = _run(text + "events:\n  - {at: 0.5, cluster_down: c1}\n")["a"]
    assert [t["outcome"] for t in got["attempts"]] == ["OOMKilled"]
    assert got["status"] == "pending"
    assert got["reasons"] == ["NoClusterCapacity"]


def test_a_scenario_without_failures_has_no_failure_keys() -> None:
    text = _scenario("{oom: 1}", "- {id: a, queue: q, submit: 0, duration: 1, resources: {cpu: 1}}")
    doc = json.loads(render_json(simulate(load_scenario(text, "t.yaml"))))
    assert "attempts" not in doc["actions"][0]
    assert "failed" not in doc["queues"]["q"]


@pytest.mark.parametrize(
    ("failures", "message"),
    [
        pytest.param(
            "[{kind: Crashed, after: 1}]",
            "workload[0].failures[0].kind: 'Crashed' is not one of Evicted, Failed, NodeLost,"
            " NotReady, OOMKilled, PodLost, Preempted",
            id="unknown-kind",
        ),
        pytest.param(
            "[{kind: OOMKilled}]", "workload[0].failures[0].after: required", id="no-after"
        ),
        pytest.param(
            "[{kind: NotReady}]",
            "workload[0].failures[0].kind: NotReady needs queue 'q' to set retry.ready_timeout",
            id="not-ready-without-timeout",
        ),
        pytest.param(
            "[{kind: Failed, after: -1}]",
            "workload[0].failures[0].after: -1 must be >= 0",
            id="negative",
        ),
        pytest.param("3", "workload[0].failures: expected a list, got 3", id="not-a-list"),
    ],
)
def test_bad_failures_name_the_field_and_value(failures: str, message: str) -> None:
    text = _scenario(
        "{oom: 1}",
        f"- {{id: a, queue: q, submit: 0, duration: 1, resources: {{cpu: 1}}, failures: {failures}}}",
    )
    with pytest.raises(ScenarioError) as err:
        load_scenario(text, "t.yaml")
    assert message in str(err.value)


def test_simulate_cli_prints_the_failed_count(tmp_path: Any) -> None:
    path = tmp_path / "s.yaml"
    path.write_text(
        _scenario(
            "{}",
            "- {id: a, queue: q, submit: 0, duration: 1, resources: {cpu: 1},"
            " failures: [{kind: Failed, after: 1}]}",
        )
    )
    res = CliRunner().invoke(cli, ["simulate", str(path)])
    assert res.exit_code == 0, res.output
    header, row = res.output.splitlines()[2:4]
    assert header.split()[-1] == "FAILED"
    assert row.split()[0] == "q" and row.split()[-1] == "1"


def test_the_shipped_retries_example_shows_each_class() -> None:
    path = Path(__file__).resolve().parents[2] / "examples" / "retries.yaml"
    got = _run(path.read_text())
    outcomes = {aid: [t["outcome"] for t in a["attempts"]] for aid, a in got.items()}
    assert outcomes == {
        "finetune": ["OOMKilled", "Succeeded"],
        "pretrain": ["Preempted", "Succeeded"],
        "eval": ["NotReady", "Failed", "Succeeded"],
    }
    assert got["pretrain"]["attempts"][1]["start"] == 610  # at the head, at once
