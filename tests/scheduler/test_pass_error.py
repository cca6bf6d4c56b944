"""A pass that raises (a bug) says what it had admitted and whom it was deciding about,
so that the scheduler workflow can rebuild the core and fail that action alone."""

from __future__ import annotations

from typing import Any

import pytest
from headway.scheduler import ClusterSpec, NodeGroup, PassError, QueueSpec, Scheduler
from headway.scheduler.resources import Pod

from .helpers import submitter

GI = 2**30
NODE = Pod(cpu=8000, memory=32 * GI)
SMALL = Pod(cpu=1000, memory=GI)


def fleet() -> Scheduler:
    return Scheduler(
        [ClusterSpec("a", (NodeGroup("g", 1, NODE),))], [QueueSpec("q1"), QueueSpec("q2")]
    )


def poison(monkeypatch: pytest.MonkeyPatch, action_id: str) -> None:
    """Deciding about ``action_id`` raises, before the pass changes anything for it."""
    gate = Scheduler._gate

    def raising(self: Scheduler, q: Any, a: Any, demand: Any) -> Any:
        if a.id == action_id:
            raise RuntimeError(f"planted bug at {action_id}")
        return gate(self, q, a, demand)

    monkeypatch.setattr(Scheduler, "_gate", raising)


@pytest.mark.parametrize("incremental", [True, False], ids=["fast-path", "plain-path"])
def test_a_failing_pass_names_the_action_and_keeps_what_it_admitted(
    monkeypatch: pytest.MonkeyPatch, incremental: bool
) -> None:
    s = Scheduler.from_snapshot(fleet().to_snapshot(), incremental=incremental)
    add = submitter(s)
    add("q1", "ok", (SMALL,), 10.0)
    add("q2", "bad", (SMALL,), 10.0)
    poison(monkeypatch, "bad")
    with pytest.raises(PassError) as info:
        s.schedule(0.0)
    assert info.value.action_id == "bad"
    assert [a.action_id for a in info.value.admitted] == ["ok"]
    assert isinstance(info.value.__cause__, RuntimeError)


def test_after_the_bad_action_is_cancelled_a_rebuilt_core_schedules_the_rest(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    s = fleet()
    add = submitter(s)
    add("q1", "bad", (SMALL,), 10.0)
    add("q2", "after", (SMALL,), 10.0)
    poison(monkeypatch, "bad")
    with pytest.raises(PassError):
        s.schedule(0.0)
    rebuilt = Scheduler.from_snapshot(s.to_snapshot(), incremental=False)
    assert rebuilt.cancel("bad", 0.0)
    assert [a.action_id for a in rebuilt.schedule(0.0)] == ["after"]
    assert rebuilt.state("bad") is None
