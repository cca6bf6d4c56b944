"""The queues' visiting order is kept from pass to pass, and sorted again only when a
queue's head (or policy) may have changed.

A submission appended behind a queue's other actions leaves its head, and so the order,
as they were: only a queue that was empty (it joins the order) or an action that sorts
in front of the others (a new head) makes the next pass sort again. These cases pin the
kept order against the order made afresh after every pass, and the decisions against
the plain loop (``Scheduler(incremental=False)``).

One cluster of one 16-CPU node, taken by a long action of queue ``busy`` (critical), so
nothing else starts; queues ``x``, ``y`` (both medium) and ``z`` (low) wait.
"""

from __future__ import annotations

from typing import Any

import pytest
from headway.scheduler import (
    ActionSpec,
    Algorithm,
    ClusterSpec,
    NodeGroup,
    Priority,
    QueueSpec,
    Scheduler,
)
from headway.scheduler.resources import Pod

from .policy.engines import scheduler_class

GI = 2**30
NODE = Pod(cpu=16_000, memory=64 * GI)
POD = Pod(cpu=4_000, memory=8 * GI)

# Submissions, one pass after each: (queue, submit time).
CASES = [
    pytest.param([("x", 1.0), ("x", 2.0), ("x", 3.0)],
                 id="appended-behind-the-head-the-order-stays"),
    pytest.param([("x", 2.0), ("y", 1.0), ("z", 0.5)],
                 id="an-empty-queue-joins-the-order-in-its-place"),
    pytest.param([("x", 2.0), ("y", 3.0), ("y", 1.0)],
                 id="an-earlier-submission-is-the-new-head-and-moves-its-queue-up"),
    pytest.param([("y", 5.0), ("x", 5.0), ("x", 6.0), ("y", 4.0)],
                 id="equal-priority-and-head-time-by-name-then-a-new-head-breaks-the-tie"),
    pytest.param([("z", 1.0), ("x", 9.0), ("z", 2.0), ("x", 9.0), ("y", 0.0)],
                 id="priority-first-whatever-the-heads"),
]  # fmt: skip


def _fresh(s: Scheduler) -> list[str]:
    keyed = sorted(
        (-q.spec.priority, q.waiting[0].submit, q.spec.name) for q in s.queues.values() if q.waiting
    )
    return [k[2] for k in keyed]


def _run(subs: list[tuple[str, float]], incremental: bool) -> list[Any]:
    clusters = [ClusterSpec("a", (NodeGroup("g", 1, NODE),))]
    queues = [
        QueueSpec("busy", priority=Priority.critical, algorithm=Algorithm.greedy),
        QueueSpec("x", priority=Priority.medium, algorithm=Algorithm.greedy),
        QueueSpec("y", priority=Priority.medium, algorithm=Algorithm.backfill),
        QueueSpec("z", priority=Priority.low, algorithm=Algorithm.strict),
    ]
    s = Scheduler(clusters, queues, incremental=incremental)
    s.submit(ActionSpec("B", "busy", (NODE,), submit=0.0, seq=0, estimate=1e6), 0.0)
    log: list[Any] = [[x.action_id for x in s.schedule(0.0)]]
    for i, (q, t) in enumerate(subs):
        aid = f"{q}{i}"
        assert (
            s.submit(ActionSpec(aid, q, (POD,), submit=t, seq=1 + i, estimate=60.0), 10.0) is None
        )
        log.append([x.action_id for x in s.schedule(10.0 + i)])
        if incremental:
            assert [q.spec.name for q in s._qorder] == _fresh(s)
        log.append(sorted((a.id, a.state, a.last) for a in s.actions.values()))
    return log


@pytest.mark.parametrize("subs", CASES)
def test_the_kept_visiting_order_is_the_order_made_afresh(subs: list[tuple[str, float]]) -> None:
    assert _run(subs, True) == _run(subs, False)


# The same submissions, each a whole node, on either engine: when ``busy``'s action
# ends, the queue first in the visiting order (worked out by hand from the rule:
# priority, then the oldest head, then the name) takes the node, and only it.
FIRST_CASES = [
    pytest.param([("x", 1.0), ("x", 2.0), ("x", 3.0)], "x0",
                 id="appended-behind-the-head-the-first-head-starts"),
    pytest.param([("x", 2.0), ("y", 1.0), ("z", 0.5)], "y1",
                 id="the-older-head-of-equal-priority-starts-not-the-lower-priority-oldest"),
    pytest.param([("x", 2.0), ("y", 3.0), ("y", 1.0)], "y2",
                 id="an-earlier-submission-became-the-head-and-its-queue-starts"),
    pytest.param([("y", 5.0), ("x", 5.0), ("x", 6.0), ("y", 4.0)], "y3",
                 id="equal-heads-tied-then-a-new-earlier-head-wins"),
    pytest.param([("y", 5.0), ("x", 5.0)], "x1",
                 id="equal-priority-and-head-time-the-name-decides"),
    pytest.param([("z", 1.0), ("x", 9.0), ("z", 2.0), ("x", 9.0), ("y", 0.0)], "y4",
                 id="priority-first-whatever-the-heads"),
]  # fmt: skip


@pytest.mark.parametrize(("subs", "first"), FIRST_CASES)
def test_the_first_queue_in_visiting_order_takes_the_freed_node(
    subs: list[tuple[str, float]], first: str, engine: str
) -> None:
    clusters = [ClusterSpec("a", (NodeGroup("g", 1, NODE),))]
    queues = [
        QueueSpec("busy", priority=Priority.critical, algorithm=Algorithm.greedy),
        QueueSpec("x", priority=Priority.medium, algorithm=Algorithm.greedy),
        QueueSpec("y", priority=Priority.medium, algorithm=Algorithm.backfill),
        QueueSpec("z", priority=Priority.low, algorithm=Algorithm.strict),
    ]
    s = scheduler_class(engine)(clusters, queues)
    s.submit(ActionSpec("B", "busy", (NODE,), submit=0.0, seq=0, estimate=1e6), 0.0)
    assert [x.action_id for x in s.schedule(0.0)] == ["B"]
    for i, (q, t) in enumerate(subs):
        spec = ActionSpec(f"{q}{i}", q, (NODE,), submit=t, seq=1 + i, estimate=60.0)
        assert s.submit(spec, 10.0) is None
        assert s.schedule(10.0 + i) == []
    s.finish("B", 20.0)
    assert [x.action_id for x in s.schedule(20.0)] == [first]


# A skipped queue remakes its holds and reservations in the pass; where they first
# differ from the last pass's (``Scheduler._diverged``) tells the queues after it whether
# what came before them is what came before them last time. Each case: after every
# pass, the recorded point is where the two lists first differ, made afresh. Three
# clusters of two nodes, one node of each taken; strict queues ``s1`` (on a, b) and
# ``s2`` (on a, c) wait with gangs of two nodes and hold their clusters; ``r1``
# (backfill) waits likewise and reserves; ``g`` (greedy, below) waits with one node.
DIVERGE_CASES = [
    pytest.param([("cancel", "S1")], id="the-first-holder-goes-the-second-remakes-its-holds-first"),
    pytest.param([("cancel", "S2")], id="the-second-holder-goes-the-list-ends-early"),
    pytest.param([("cancel", "R1")], id="a-reservation-goes-the-list-ends-early-no-difference"),
    pytest.param([("tick",), ("cancel", "S1"), ("tick",), ("cancel", "R1")],
                 id="passes-with-nothing-new-then-each-goes"),
    pytest.param([("finish", "Ba"), ("cancel", "S2"), ("finish", "Bc")],
                 id="nodes-freed-between-the-changes"),
]  # fmt: skip


def _diverged(s: Scheduler) -> int | None:
    prev = s._prev_effects
    for i, e in enumerate(s._effects):
        if i >= len(prev) or prev[i][:5] != e[:5]:
            return i
    return None


@pytest.mark.parametrize("ops", DIVERGE_CASES)
def test_remade_holds_and_reservations_record_where_the_pass_first_differs(
    ops: list[tuple[str, ...]], request: pytest.FixtureRequest
) -> None:
    def build(incremental: bool) -> Scheduler:
        clusters = [ClusterSpec(n, (NodeGroup("g", 2, NODE),)) for n in "abc"]
        queues = [
            QueueSpec("busy", priority=Priority.critical, algorithm=Algorithm.greedy),
            QueueSpec(
                "s1", priority=Priority.high, algorithm=Algorithm.strict, clusters=("a", "b")
            ),
            QueueSpec(
                "s2", priority=Priority.high, algorithm=Algorithm.strict, clusters=("a", "c")
            ),
            QueueSpec("r1", priority=Priority.high, algorithm=Algorithm.backfill),
            QueueSpec("g", priority=Priority.medium, algorithm=Algorithm.greedy),
        ]
        s = Scheduler(clusters, queues, incremental=incremental)
        for i, (aid, q, pods) in enumerate(
            [
                ("Ba", "busy", (NODE,)),
                ("Bb", "busy", (NODE,)),
                ("Bc", "busy", (NODE,)),
                ("S1", "s1", (NODE, NODE)),
                ("S2", "s2", (NODE, NODE)),
                ("R1", "r1", (NODE, NODE)),
                ("G", "g", (NODE,)),
            ]
        ):
            spec = ActionSpec(aid, q, pods, submit=float(i), seq=i, estimate=100.0)
            assert s.submit(spec, float(i)) is None
        return s

    fast, plain = build(True), build(False)
    real = fast._pass
    checked = []

    def check(now: float, out: list[Any]) -> int:
        # After every pass (a schedule may run several): its own lists.
        n = real(now, out)
        assert fast._diverged == _diverged(fast)
        checked.append(fast._diverged)
        return n

    fast._pass = check  # type: ignore[method-assign]
    t = 10.0
    logs: list[list[Any]] = [[], []]
    for s, log in ((fast, logs[0]), (plain, logs[1])):
        log.append([x.action_id for x in s.schedule(t)])
    for op in ops:
        t += 1.0
        for s, log in ((fast, logs[0]), (plain, logs[1])):
            if op[0] == "cancel":
                assert s.cancel(op[1], t)
            elif op[0] == "finish":
                s.finish(op[1], t)
            log.append([x.action_id for x in s.schedule(t)])
            log.append(sorted((a.id, a.state, a.last) for a in s.actions.values()))
    assert logs[0] == logs[1]
    if "no-difference" not in request.node.callspec.id:
        assert any(d is not None for d in checked[1:]), "no pass differed from the one before"
