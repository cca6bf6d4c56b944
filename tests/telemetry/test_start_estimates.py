"""Start estimates are scored against the start the action got, including an action that
started and ended between two polls of its scheduler (its workflow says when it was
admitted). The seams are the client calls ``StartEstimates.poll`` makes; the core and its
forecast are the real ones."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, cast

import pytest
from headway import telemetry
from headway.scheduler import ActionSpec, ClusterSpec, NodeGroup, Pod, QueueSpec, Scheduler
from headway.workflows import client as hw

POD = Pod(cpu=1000, memory=2**30)


@dataclass
class FakeTelemetry:
    """What ``poll`` reads (the waiting count of the queue gauges) and records."""

    waiting: int = 1
    errors: list[tuple[str, str, float]] = field(default_factory=list)

    @property
    def _stats(self) -> dict[str, dict[str, dict[str, int]]]:
        return {"t": {"q": {"waiting": self.waiting}}}

    def record_start_estimate(self, tenant: str, queue: str, error_s: float) -> None:
        self.errors.append((tenant, queue, error_s))


@dataclass
class Plane:
    """The scheduler's snapshot as the control plane would query it, and each action's
    admission time as its workflow would answer."""

    core: Scheduler
    now: float = 0.0
    admitted: dict[str, float] = field(default_factory=dict)
    asked: list[str] = field(default_factory=list)
    told: list[dict[str, Any]] = field(default_factory=list)


@pytest.fixture
def plane(monkeypatch: pytest.MonkeyPatch) -> Plane:
    core = Scheduler([ClusterSpec("c", (NodeGroup("n", 1, POD),))], [QueueSpec("q")])
    p = Plane(core)

    async def get_snapshot(client: Any, tenant: str) -> dict[str, Any]:
        return {"snapshot": p.core.to_snapshot(), "now": p.now}

    async def action_state(client: Any, tenant: str, action_id: str) -> Any:
        p.asked.append(action_id)
        if action_id not in p.admitted:
            raise RuntimeError(f"no workflow {action_id}")
        return type("Status", (), {"admitted_at": p.admitted[action_id]})()

    async def tell_start_estimates(client: Any, tenant: str, scores: Any) -> None:
        p.told.append(scores)

    monkeypatch.setattr(hw, "get_snapshot", get_snapshot)
    monkeypatch.setattr(hw, "action_state", action_state)
    monkeypatch.setattr(hw, "tell_start_estimates", tell_start_estimates)
    return p


def submit(p: Plane, action_id: str, t: float) -> None:
    p.core.submit(ActionSpec(action_id, "q", (POD,), submit=t, estimate=10.0), t)
    for a in p.core.schedule(t):
        p.admitted[a.action_id] = t


async def test_an_action_that_started_and_ended_between_polls_is_scored(plane: Plane) -> None:
    submit(plane, "busy", 0.0)  # runs, its 10 s estimate the forecast's end
    submit(plane, "waiter", 1.0)  # waits for the one node
    est, t = telemetry.StartEstimates(), FakeTelemetry()
    plane.now = 1.0
    await est.poll(None, "t", cast(telemetry.Telemetry, t))  # waiter forecast to start at 10
    plane.core.finish("busy", 4.0)
    for a in plane.core.schedule(4.0):
        plane.admitted[a.action_id] = 4.0
    plane.core.finish("waiter", 5.0)  # all before the next poll
    plane.now, t.waiting = 6.0, 0
    await est.poll(None, "t", cast(telemetry.Telemetry, t))
    assert plane.asked == ["waiter"]
    assert t.errors == [("t", "q", -6.0)]  # started at 4, 6 s before its forecast
    assert plane.told[-1]["q"]["scored"] == 1


async def test_an_action_seen_running_is_scored_from_the_snapshot(plane: Plane) -> None:
    submit(plane, "busy", 0.0)
    submit(plane, "waiter", 1.0)
    est, t = telemetry.StartEstimates(), FakeTelemetry()
    plane.now = 1.0
    await est.poll(None, "t", cast(telemetry.Telemetry, t))
    plane.core.finish("busy", 12.0)
    plane.core.schedule(12.0)
    plane.now = 12.5
    await est.poll(None, "t", cast(telemetry.Telemetry, t))
    assert plane.asked == []  # no query: the snapshot has its start
    assert t.errors == [("t", "q", 2.0)]


async def test_an_action_that_ended_without_an_admission_is_not_scored(plane: Plane) -> None:
    submit(plane, "busy", 0.0)
    submit(plane, "waiter", 1.0)
    est, t = telemetry.StartEstimates(), FakeTelemetry()
    plane.now = 1.0
    await est.poll(None, "t", cast(telemetry.Telemetry, t))
    plane.core.cancel("waiter", 2.0)
    plane.now = 2.5
    await est.poll(None, "t", cast(telemetry.Telemetry, t))
    assert plane.asked == ["waiter"] and t.errors == [] and plane.told == []
