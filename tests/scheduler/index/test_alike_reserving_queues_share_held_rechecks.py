"""Reserving queues below a held fleet share their re-checks when their records are alike.

The held-fleet re-check asks, for a reserving queue, whether its head's reservation
would be made where it was, and reads the horizons that answer holds until. That answer
depends only on the record (demand, algorithm, where and when it reserved, which
clusters it held instead), the changed clusters, the selector, and capacity: queues
whose records are alike share it within a pass (``index.view.counts``: fewer
``reservation_answers`` than ``held_rechecks``). These cases pin the shared answers down against the plain loop
(``Scheduler(incremental=False)``): same admissions, same reasons, step by step.

Four clusters ``c0`` to ``c3`` of two 16-CPU nodes each, filled by queue ``fill``
(critical, eight node-sized actions ``F0`` to ``F7`` with spread estimated ends). Queue
``hold`` (high, strict) has a head ``H`` that wants a whole cluster: it finds no room and
holds all four. Below it, reserving queues (``e1``-``e3`` easy, ``b1``-``b2``
backfill, two with a selector) wait with alike whole-cluster heads (which find room
nowhere while any node is taken, and reserve) and node-sized and small actions behind.
"""

from __future__ import annotations

from typing import Any

import pytest
from headway.scheduler import (
    Algorithm,
    ClusterSpec,
    NodeGroup,
    Priority,
    QueueSpec,
    Scheduler,
)
from headway.scheduler.index.view import counts, held_summary_current, reservations
from headway.scheduler.resources import Pod

from ..helpers import apply_op, submitter

GI = 2**30
NODE = Pod(cpu=16_000, memory=64 * GI)
SMALL = Pod(cpu=2_000, memory=8 * GI)
BELOW = {
    "e1": (Algorithm.easy, None),
    "e2": (Algorithm.easy, None),
    "e3": (Algorithm.easy, ("c1", "c2")),
    "b1": (Algorithm.backfill, None),
    "b2": (Algorithm.backfill, ("c1", "c2")),
}

Op = tuple[Any, ...]

CASES = [
    pytest.param(
        [("finish", "F0", 1.0), ("finish", "F3", 2.0), ("finish", "F5", 3.0)],
        id="completions-below-a-held-fleet-alike-reservations-share-one-answer"),
    pytest.param(
        [("finish", "F1", 1.0), ("tick", 9.0), ("finish", "F6", 10.0), ("tick", 26.0)],
        id="the-clock-passes-estimated-ends-shared-horizons-expire-per-queue"),
    pytest.param(
        [("finish", "F4", 1.0), ("finish", "F5", 2.0), ("tick", 6.0), ("finish", "F2", 7.0),
         ("tick", 12.0), ("finish", "F7", 14.0), ("tick", 20.0)],
        id="overdue-ends-move-the-shared-reservations-with-the-clock"),
    pytest.param(
        [("finish", "F2", 1.0), ("finish", "F3", 2.0), ("cancel", "E10", 3.0),
         ("finish", "F4", 4.0)],
        id="a-reserved-cluster-empties-its-reservation-moves-for-every-alike-queue"),
    pytest.param(
        [("finish", "F0", 1.0), ("submit", "e2", "E29", NODE, 2.0), ("finish", "F7", 3.0),
         ("cancel", "H", 4.0)],
        id="a-queue-below-changes-then-the-hold-goes-and-full-checks-take-over"),
    pytest.param(
        [("finish", "F0", 1.0), ("finish", "F4", 2.0), ("finish", "F1", 3.0), ("finish", "F5", 4.0),
         ("submit", "e1", "E19", SMALL, 5.0), ("finish", "F2", 6.0)],
        id="reasons-change-in-place-as-clusters-empty-the-summaries-follow"),
    pytest.param(
        [("finish", "F2", 1.0), ("finish", "F6", 2.0), ("finish", "F3", 3.0),
         ("finish", "F7", 4.0)],
        id="a-whole-cluster-empties-the-heads-below-would-not-reserve"),
]  # fmt: skip


def _build(incremental: bool) -> Scheduler:
    clusters = [ClusterSpec(f"c{i}", (NodeGroup("n", 2, NODE),)) for i in range(4)]
    queues = [
        QueueSpec("fill", priority=Priority.critical, algorithm=Algorithm.greedy),
        QueueSpec("hold", priority=Priority.high, algorithm=Algorithm.strict),
        *(
            QueueSpec(n, priority=Priority.medium, algorithm=a, clusters=sel)
            for n, (a, sel) in BELOW.items()
        ),
    ]
    s = Scheduler(clusters, queues, incremental=incremental)
    add = submitter(s)

    for i in range(8):
        add("fill", f"F{i}", (NODE,), 5.0 + 4 * i)
    add("hold", "H", (NODE, NODE), 50.0)
    for name in BELOW:
        p = name.upper()
        for k, pods in enumerate([(NODE, NODE), (SMALL,), (NODE,), (SMALL,)]):
            add(name, f"{p}{k}", pods, 10.0 * (k % 2 + 1))
    return s


def _state(s: Scheduler) -> list[Any]:
    """Every action's state and reasons, and the pass's reservations (which a held
    fleet hides from the reasons below it until the hold goes)."""
    resv = reservations(s)
    acts = sorted((a.id, a.state, a.cluster, a.last, tuple(a.reasons)) for a in s.actions.values())
    return [resv, acts]


def _run(ops: list[Op], incremental: bool) -> tuple[list[Any], int, int]:
    """The log of every pass, how many reserving queues the held path re-checked, and
    how many answers it worked out for them."""
    s = _build(incremental)
    log: list[Any] = [sorted(x.action_id for x in s.schedule(0.0)), _state(s)]
    before = counts(s)
    for op in ops:
        t = apply_op(s, op, 1000 + len(log))
        log.append(sorted(x.action_id for x in s.schedule(t)))
        log.append(_state(s))
        _summaries_are_current(s)
    after = counts(s)
    asked = after.held_rechecks - before.held_rechecks
    worked = after.reservation_answers - before.reservation_answers
    return log, asked, worked


def _summaries_are_current(s: Scheduler) -> None:
    """A kept held summary (made again in the pass that changed reasons in place) is
    the one made afresh from the fits' reasons now."""
    for name in s.queues:
        assert held_summary_current(s, name) is not False, name


@pytest.mark.parametrize("ops", CASES)
def test_shared_reservation_rechecks_decide_as_the_plain_loop(ops: list[Op]) -> None:
    fast, asked, _ = _run(ops, True)
    plain, plain_asked, _ = _run(ops, False)
    assert fast == plain
    assert asked > 0  # the held path re-checked reserving queues
    assert plain_asked == 0


def test_alike_records_are_worked_out_once_per_pass() -> None:
    _, asked, worked = _run([("finish", "F0", 1.0), ("finish", "F3", 2.0)], True)
    assert asked > worked > 0
