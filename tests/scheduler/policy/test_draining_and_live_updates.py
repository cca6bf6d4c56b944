"""Queue status (draining, drained, reopened) and live changes of a queue's knobs.

The table runs against both engines (``engine``: the reference pass and the
incremental core)."""

from __future__ import annotations

import pytest
from headway.scheduler import ActionSpec, ClusterSpec, NodeGroup, Pod, QueueSpec
from headway.scheduler.model import QueueStatus

from ..helpers import job, make_cluster, make_queue, scenario
from .cases import C1, NCC, REJ, Case, Q, S, check, h
from .engines import scheduler_class

LIVE = [
    # draining: rejects new work; waiting work still starts; drained once empty;
    # update_queue to active reopens. a 0-100; b waits (t=1). t=10 draining. c (t=20)
    # rejected. t=100: b starts (ends 200). d (t=150) rejected. t=200 b ends -> drained.
    # e (t=250) rejected. t=300: update_queue active (events before submissions) -> f
    # (t=300) accepted, starts 300.
    Case(
        "draining-then-drained-then-reopened",
        scenario(
            C1,
            Q,
            [
                job("a", "q", 0, 100, gpu=h(8)),
                job("b", "q", 1, 100, gpu=h(8)),
                job("c", "q", 20, 10),
                job("d", "q", 150, 10),
                job("e", "q", 250, 10),
                job("f", "q", 300, 10),
            ],
            events=[
                {"at": 10, "update_queue": {"name": "q", "status": "draining"}},
                {"at": 300, "update_queue": {"name": "q", "status": "active"}},
            ],
        ),
        {
            "b": S(100, 200, reasons=[NCC]),
            "c": REJ("QueueDraining"),
            "d": REJ("QueueDraining"),
            "e": REJ("QueueDraining"),
            "f": S(300, 310, reasons=[]),
        },
    ),
    # update_queue with null unsets a knob: action_concurrency 1 -> null at t=50.
    Case(
        "update-queue-null-unsets-knob",
        scenario(
            C1,
            [make_queue("q", action_concurrency=1)],
            [job("a", "q", 0, 100), job("b", "q", 1, 10)],
            events=[{"at": 50, "update_queue": {"name": "q", "action_concurrency": None}}],
        ),
        {"b": S(50, 60, reasons=["ActionConcurrency"])},
    ),
    # update_queue replaces only the fields given, from that instant's pass: at t=100
    # (with x's completion) lo becomes critical and goes before hi.
    Case(
        "update-queue-priority-applies-from-that-instants-pass",
        scenario(
            C1,
            [make_queue("lo", "low"), make_queue("hi", "high")],
            [
                job("x", "hi", 0, 100, gpu=h(8)),
                job("l", "lo", 1, 100, gpu=h(8)),
                job("hh", "hi", 2, 100, gpu=h(8)),
            ],
            events=[{"at": 100, "update_queue": {"name": "lo", "priority": "critical"}}],
        ),
        {"l": S(100, 200), "hh": S(200, 300)},
    ),
    # Live selector change: q pinned to c1 (busy), re-pinned to [c2] at t=50.
    Case(
        "update-queue-clusters-repins-live",
        scenario(
            [make_cluster("c1"), make_cluster("c2")],
            [make_queue("q", clusters=["c1"])],
            [job("x", "q", 0, 1000, gpu=h(8)), job("a", "q", 1, 10, gpu=h(8))],
            events=[{"at": 50, "update_queue": {"name": "q", "clusters": ["c2"]}}],
        ),
        {"x": S(0, 1000, "c1"), "a": S(50, 60, "c2", [NCC])},
    ),
]


@pytest.mark.parametrize("case", [c.param() for c in LIVE])
def test_a_queue_change_applies_from_the_next_pass(case: Case, engine: str) -> None:
    check(case, engine)


def test_draining_queue_becomes_drained_once_empty_and_reopens(engine: str) -> None:
    """Scheduler directly: draining -> drained when it holds nothing; active reopens."""
    s = scheduler_class(engine)(
        [ClusterSpec("c1", (NodeGroup("n", 1, Pod(cpu=1000, memory=2**30)),))], [QueueSpec("q")]
    )
    a = ActionSpec("a", "q", (Pod(cpu=1000),))
    b = ActionSpec("b", "q", (Pod(cpu=1000),), seq=1)
    assert s.submit(a, 0) is None and s.submit(b, 0) is None
    assert [x.action_id for x in s.schedule(0)] == ["a"]
    s.update_queue("q", {"status": "draining"})
    assert s.submit(ActionSpec("c", "q", (Pod(cpu=1000),), seq=2), 1) == "QueueDraining"
    s.finish("a", 10)
    assert [x.action_id for x in s.schedule(10)] == ["b"]  # waiting work still starts
    assert s.queues["q"].spec.status.value == "draining"  # b still runs
    s.finish("b", 20)
    s.schedule(20)
    assert s.queues["q"].spec.status is QueueStatus.drained
    assert s.submit(ActionSpec("d", "q", (Pod(cpu=1000),), seq=3), 21) == "QueueDraining"
    s.update_queue("q", {"status": "active"})
    assert s.submit(ActionSpec("e", "q", (Pod(cpu=1000),), seq=4), 22) is None
    assert [x.action_id for x in s.schedule(22)] == ["e"]


def test_an_idle_queue_set_draining_is_drained_by_the_next_pass(engine: str) -> None:
    """A queue that holds nothing when set draining becomes drained at the next pass,
    also after passes made before the change (``schedule`` keeps the draining queues
    from one policy change to the next); one still running work stays draining."""
    s = scheduler_class(engine)(
        [ClusterSpec("c1", (NodeGroup("n", 1, Pod(cpu=1000, memory=2**30)),))],
        [QueueSpec("q"), QueueSpec("p")],
    )
    assert s.submit(ActionSpec("a", "p", (Pod(cpu=1000),)), 0) is None
    assert [x.action_id for x in s.schedule(0)] == ["a"]

    def status(name: str) -> QueueStatus:
        return s.queues[name].spec.status

    s.schedule(1)
    s.update_queue("q", {"status": "draining"})
    s.update_queue("p", {"status": "draining"})
    s.schedule(2)
    assert status("q") is QueueStatus.drained
    assert status("p") is QueueStatus.draining
    s.update_queue("q", {"status": "active"})
    s.schedule(3)
    s.update_queue("q", {"status": "draining"})
    s.schedule(4)
    assert status("q") is QueueStatus.drained
    s.finish("a", 5)
    assert status("p") is QueueStatus.drained
