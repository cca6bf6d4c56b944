"""A held reserving queue whose reservation got worse where it was: found again by the walk.

Under a fleet held by a strict head above, a reserving queue's check reads its head's
reservation. When the cluster it reserved on takes more work
(the fill queue above starts something there), the reservation gets later there, and the
changed clusters alone do not tell where the next best is. The check then asks the
reservation's own walk (kept per selector and demand, so the queues below share it)
instead of visiting every reserving queue in full: a strict head whose holds move would
otherwise send each of them through a visit (``index.view.counts``'
``reservations_found_by_walk`` and ``visits``).

Five to six clusters of two 16-CPU nodes, filled by ``fill`` (critical, greedy), held by
``hold``'s whole-cluster strict head; below, medium queues cycling backfill, EASY, greedy,
strict with node and half-node actions. Events: completions, and new fill work taking
the freed nodes back. Each case runs the same events with and without the incremental
path (``Scheduler(incremental=False)``) and compares every pass.
"""

from __future__ import annotations

import random
import sys
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
from headway.scheduler.index.view import Counts, counts
from headway.scheduler.resources import Pod

from ..helpers import apply_op, submitter

GI = 2**30
NODE = Pod(cpu=16_000, memory=64 * GI)
HALF = Pod(cpu=8_000, memory=32 * GI)
ALGOS = [Algorithm.backfill, Algorithm.easy, Algorithm.greedy, Algorithm.strict]


def make_held_fleet(
    incremental: bool, queues: int, clusters: int, seed: int
) -> tuple[Scheduler, random.Random]:
    """The fleet above, full and held; returns the scheduler and its event RNG."""
    rng = random.Random(seed)
    specs = [
        QueueSpec("fill", priority=Priority.critical, algorithm=Algorithm.greedy),
        QueueSpec("hold", priority=Priority.high, algorithm=Algorithm.strict),
        *(
            QueueSpec(f"q{i}", priority=Priority.medium, algorithm=ALGOS[i % 4])
            for i in range(queues)
        ),
    ]
    s = Scheduler(
        [ClusterSpec(f"c{i}", (NodeGroup("n", 2, NODE),)) for i in range(clusters)],
        specs,
        incremental=incremental,
    )
    add = submitter(s)
    for i in range(2 * clusters):
        add("fill", f"F{i}", (NODE,), float(rng.choice([5, 20, 60])))
    add("hold", "H", (NODE, NODE), 50.0)
    for i in range(queues):
        for k in range(4):
            add(f"q{i}", f"Q{i}_{k}", (rng.choice([NODE, HALF]),), float(rng.choice([10, 30])))
    return s, rng


def run_events(
    incremental: bool, queues: int, clusters: int, seed: int
) -> tuple[list[Any], Counts]:
    """Thirty events (two completions, then new fill work, and so on); the log of
    every pass's admissions and every action's state and reasons after it, and the
    work counts of the events (``index.view.counts``, the first pass's taken off)."""
    s, rng = make_held_fleet(incremental, queues, clusters, seed)
    first = sorted(x.action_id for x in s.schedule(0.0))
    running = list(first)
    log: list[Any] = [first]
    before = counts(s)
    t = 0.0
    for i in range(30):
        t += rng.choice([1.0, 1.0, 4.0])
        if i % 3 == 2 or not running:
            est = float(rng.choice([5, 40]))
            apply_op(s, ("submit", "fill", f"N{i}", NODE, t), 10_000 + i, est)
        else:
            apply_op(s, ("finish", running.pop(rng.randrange(len(running))), t), 0)
        adm = s.schedule(t)
        running += [x.action_id for x in adm]
        log.append(sorted(x.action_id for x in adm))
        log.append(
            sorted((a.id, a.state, a.cluster, a.last, tuple(a.reasons)) for a in s.actions.values())
        )
    after = counts(s)
    return log, Counts(
        reservations_found_by_walk=after.reservations_found_by_walk
        - before.reservations_found_by_walk,
        visits=after.visits - before.visits,
    )


CASES = [
    pytest.param(6, 5, 1, id="six-queues-below-five-held-clusters-fill-work-lands-on-reservations"),
    pytest.param(6, 5, 2, id="the-same-fleet-other-estimates-reservations-move-many-times"),
    pytest.param(6, 6, 3, id="six-clusters-more-places-for-the-walk-to-find"),
]


@pytest.mark.parametrize(("queues", "clusters", "seed"), CASES)
def test_a_worse_reservation_is_found_again_as_the_plain_loop_finds_it(
    queues: int, clusters: int, seed: int
) -> None:
    fast, n = run_events(True, queues, clusters, seed)
    assert n.reservations_found_by_walk > 0  # the walk was what answered, not a visit
    assert fast == run_events(False, queues, clusters, seed)[0]


def test_without_the_walk_the_same_checks_end_in_visits(monkeypatch: pytest.MonkeyPatch) -> None:
    """The same events with the walks off (``_SCAN_MIN`` past the fleet: reservations
    made cluster by cluster, and no walk to fall back on) decide the same, with more
    visits: the fallback saves visits and changes no answer. (The bound is a private
    tuning constant with no public form; patching it is the one private reach left.)"""
    fast, with_walk = run_events(True, 6, 5, 2)
    # (every module of the core that reads the bound has its own binding of it)
    for mod in [m for n, m in sys.modules.items() if n.startswith("headway.scheduler.")]:
        if hasattr(mod, "_SCAN_MIN"):
            monkeypatch.setattr(mod, "_SCAN_MIN", 10**6)
    again, without = run_events(True, 6, 5, 2)
    assert again == fast
    assert without.visits > with_walk.visits
