"""The visiting order, kept up to date queue by queue, is the order sorted afresh.

Queues are visited by priority, then by whose next action was submitted first, then by
name. ``Scheduler._reorder`` keeps that order between passes and puts back only the
queues whose head may have changed (an admission, a submission to an empty queue or
ahead of a queue's tail, a cancelled head); a policy change (a priority, a queue added
or removed) sorts every queue again. Random events over a small fleet: after each
cycle the kept order equals a fresh sort of the queues that have work waiting, and the
decisions equal those of a scheduler that sorts afresh before every pass.
"""

from __future__ import annotations

import random
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
NODE = Pod(cpu=8_000, memory=32 * GI)
HALF = Pod(cpu=4_000, memory=16 * GI)
ALGOS = [Algorithm.greedy, Algorithm.strict, Algorithm.backfill, Algorithm.easy]


def fresh_order(s: Scheduler) -> list[str]:
    """The visiting order by the rule itself."""
    return [
        q.spec.name
        for q in sorted(
            (q for q in s.queues.values() if q.waiting),
            key=lambda q: (-q.spec.priority, q.waiting[0].submit, q.spec.name),
        )
    ]


def resort_always(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every pass sorts every queue afresh (the order as it was kept before)."""
    real = Scheduler._reorder

    def spy(self: Scheduler) -> None:
        self._qdirty = None
        real(self)

    monkeypatch.setattr(Scheduler, "_reorder", spy)


def run_events(seed: int) -> tuple[list[Any], int]:
    """Sixty events; the log of admissions and reasons, and how many times the kept
    order was checked against a fresh sort."""
    rng = random.Random(seed)
    clusters = [ClusterSpec(f"c{i}", (NodeGroup("n", 2, NODE),)) for i in range(3)]
    names = [f"q{i}" for i in range(6)]
    s = Scheduler(
        clusters,
        [
            QueueSpec(n, priority=Priority(rng.randrange(5)), algorithm=ALGOS[i % 4])
            for i, n in enumerate(names)
        ],
    )
    seq = 0
    t = 0.0
    running: list[str] = []
    waiting: list[str] = []
    log: list[Any] = []
    checked = 0
    for i in range(60):
        t += rng.choice([0.0, 1.0, 5.0])
        kind = rng.random()
        if kind < 0.45 or not (running or waiting):
            seq += 1
            # Now and then submitted earlier than the queue's tail: it may be the new head.
            submit = max(0.0, t - rng.choice([0.0, 0.0, 3.0, 20.0]))
            pod = rng.choice([NODE, HALF])
            a = ActionSpec(
                f"a{seq}", rng.choice(names), (pod,), submit=submit, seq=seq, estimate=10.0
            )
            if s.submit(a, t) is None:
                waiting.append(a.id)
        elif kind < 0.75 and running:
            s.finish(running.pop(rng.randrange(len(running))), t)
        elif kind < 0.85 and waiting:
            aid = waiting.pop(rng.randrange(len(waiting)))
            assert s.cancel(aid, t)
        elif kind < 0.93:
            q = rng.choice(names)
            s.update_queue(q, {"priority": Priority(rng.randrange(5)).name})
        else:
            # A queue added, or an empty one removed.
            extra = f"x{i}"
            s.upsert_queue(QueueSpec(extra, priority=Priority(rng.randrange(5))))
            names.append(extra)
            empty = [n for n in names if not s.queues[n].waiting and not s.queues[n].running]
            if empty:
                gone = rng.choice(empty)
                s.remove_queue(gone)
                names.remove(gone)
        adm = s.schedule(t)
        for x in adm:
            waiting.remove(x.action_id)
            running.append(x.action_id)
        if s._qdirty is not None:
            assert [q.spec.name for q in s._qorder] == fresh_order(s)
            checked += 1
        log.append(sorted((x.action_id, x.cluster) for x in adm))
        log.append(sorted((a, s.reason(a)) for a in waiting))
    return log, checked


@pytest.mark.parametrize(
    "seed",
    [
        pytest.param(1, id="submissions-ahead-of-the-tail-and-cancelled-heads"),
        pytest.param(2, id="priorities-changed-queues-added-and-removed"),
        pytest.param(3, id="admissions-across-strict-and-backfill-queues"),
        pytest.param(4, id="another-mix-of-the-same"),
    ],
)
def test_the_kept_order_is_a_fresh_sort(monkeypatch: pytest.MonkeyPatch, seed: int) -> None:
    kept, checked = run_events(seed)
    assert checked > 40
    resort_always(monkeypatch)
    again, _ = run_events(seed)
    assert kept == again


LATE_CASES = [
    pytest.param(1.0, "a", id="submitted-before-every-head-its-queue-goes-first"),
    pytest.param(7.0, "b", id="submitted-between-the-heads-the-order-stands"),
]


def _late_fleet(cls: type[Scheduler]) -> Scheduler:
    """Queues ``a`` (head submitted at 10) and ``b`` (at 5), equal priority, on a cluster
    of one node that ``fill`` takes first: ``b`` is ahead."""
    s = cls(
        [ClusterSpec("c", (NodeGroup("n", 1, NODE),))],
        [
            QueueSpec("fill", priority=Priority.critical, algorithm=Algorithm.greedy),
            QueueSpec("a", algorithm=Algorithm.greedy),
            QueueSpec("b", algorithm=Algorithm.greedy),
        ],
    )
    assert s.submit(ActionSpec("f", "fill", (NODE,), seq=0, estimate=100.0), 0.0) is None
    assert s.submit(ActionSpec("a1", "a", (NODE,), submit=10.0, seq=1), 10.0) is None
    assert s.submit(ActionSpec("b1", "b", (NODE,), submit=5.0, seq=2), 10.0) is None
    assert [x.action_id for x in s.schedule(10.0)] == ["f"]
    return s


@pytest.mark.parametrize(("late_submit", "first"), LATE_CASES)
def test_a_submission_ahead_of_its_queues_head_moves_the_queue(
    late_submit: float, first: str, engine: str
) -> None:
    """An action submitted to ``a`` with an earlier time than ``a``'s head becomes that
    head, and ``a`` goes first if it is now the older: its queue takes the freed node."""
    s = _late_fleet(scheduler_class(engine))
    assert s.submit(ActionSpec("a0", "a", (NODE,), submit=late_submit, seq=3), 11.0) is None
    assert s.schedule(11.0) == []
    s.finish("f", 12.0)
    # The queue visited first takes the node.
    assert [x.action_id for x in s.schedule(12.0)] == ["a0" if first == "a" else "b1"]


@pytest.mark.parametrize(("late_submit", "first"), LATE_CASES)
def test_a_new_head_puts_its_queue_back_in_the_kept_order(late_submit: float, first: str) -> None:
    """The incremental core's kept order (``_qorder``) follows the new head at once."""
    s = _late_fleet(Scheduler)
    assert [q.spec.name for q in s._qorder] == ["b", "a"]
    assert s.submit(ActionSpec("a0", "a", (NODE,), submit=late_submit, seq=3), 11.0) is None
    assert s.schedule(11.0) == []
    assert [q.spec.name for q in s._qorder] == fresh_order(s)
    assert s._qorder[0].spec.name == first
