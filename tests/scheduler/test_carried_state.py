"""What the core carries (its snapshot, across continue-as-new) is bounded by what is
live, not by how many actions it has ever seen."""

from __future__ import annotations

import json

import pytest
from headway.scheduler import (
    ActionSpec,
    ClusterSpec,
    NodeGroup,
    OrgLimits,
    Pod,
    QueueSpec,
    Reason,
    Scheduler,
    truth,
)

POD = Pod(cpu=1000, memory=2**30)


def make_core(max_actions_per_run: int | None) -> Scheduler:
    return Scheduler(
        [ClusterSpec("c", (NodeGroup("n", 4, POD),))],
        [QueueSpec("q")],
        org=OrgLimits(max_actions_per_run=max_actions_per_run),
    )


def run_through(s: Scheduler, ids: list[str], run: str, t0: float) -> list[Reason | None]:
    """Submit, admit and finish each action in turn; the submission answers."""
    answers = []
    for k, aid in enumerate(ids):
        t = t0 + k
        answers.append(s.submit(ActionSpec(aid, "q", (POD,), run=run, submit=t), t))
        for a in s.schedule(t):
            s.finish(a.action_id, t)
    return answers


@pytest.mark.parametrize("cap", [None, 2], ids=["no-fan-out-limit", "fan-out-limit-of-2"])
def test_actions_without_a_run_leave_nothing_behind(cap: int | None) -> None:
    s = make_core(cap)
    assert run_through(s, [f"a{i}" for i in range(10)], "", 0.0) == [None] * 10
    size = len(json.dumps(s.to_snapshot()))
    assert run_through(s, [f"b{i}" for i in range(500)], "", 100.0) == [None] * 500
    snap = s.to_snapshot()
    # Before: one ``run_accepted`` entry per action ever accepted (636 KB carried after a
    # 40k-action backlog drained), and one ``history`` entry per action ever finished.
    assert snap["run_accepted"] == (
        {} if cap is None else {f"b{i}": 1 for i in range(500)} | {f"a{i}": 1 for i in range(10)}
    )
    assert len(snap["history"]) == 510  # every one ended, none evicted yet (under the bound)
    assert size > 0


def test_runtime_history_keeps_the_tasks_that_ended_last(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(truth, "MAX_HISTORY_TASKS", 100)
    s = make_core(None)
    run_through(s, [f"a{i}" for i in range(50)], "", 0.0)
    size = len(json.dumps(s.to_snapshot()))
    run_through(s, [f"b{i}" for i in range(1000)], "", 100.0)
    snap = s.to_snapshot()
    assert snap["run_accepted"] == {}
    assert list(snap["history"]) == [f"b{i}" for i in range(900, 1000)]
    assert len(json.dumps(snap)) < 2 * size
    # A task that runs again moves to the end and keeps its last two runs.
    s.submit(ActionSpec("again", "q", (POD,), task="b900", submit=2000.0), 2000.0)
    for a in s.schedule(2000.0):
        s.finish(a.action_id, 2005.0)
    assert list(s.history)[-1] == "b900" and s.history["b900"] == [0.0, 5.0]
    assert s.estimate("b900", None) == 2.5


def test_a_runs_fan_out_still_counts_all_time() -> None:
    s = make_core(2)
    assert run_through(s, ["r1", "r2"], "R", 0.0) == [None, None]  # both ended since
    assert run_through(s, ["r3"], "R", 10.0) == [Reason.FanOutExceeded]
    assert run_through(s, ["s1"], "S", 20.0) == [None]
    assert Scheduler.from_snapshot(s.to_snapshot()).run_accepted == {"R": 2, "S": 1}
