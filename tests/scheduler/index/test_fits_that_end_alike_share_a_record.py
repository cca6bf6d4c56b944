"""Fits that end alike (same demand, blocked or not, first cluster with room and
reason) share one record, made as the fits come: one record made (``index.view.counts``'
``records_made``) per record kept, holding every action of the fits it stands for.

One cluster of one node (16 CPU, 64Gi), taken by a filler. Queue ``easy`` (high) has a
head that reserves; queue ``g`` (medium, greedy) has three alike one-node actions with
different estimates: with a reservation about, each is its own decision class and is
fitted on its own, and all three find no room.
"""

from __future__ import annotations

from headway.scheduler import (
    ActionSpec,
    Algorithm,
    Priority,
    QueueSpec,
    Scheduler,
)
from headway.scheduler.index.view import counts
from headway.scheduler.resources import Pod

from ..helpers import one_node_taken

GI = 2**30
NODE = Pod(cpu=16_000, memory=64 * GI)


def _fleet() -> Scheduler:
    s = one_node_taken(
        NODE,
        QueueSpec("easy", priority=Priority.high, algorithm=Algorithm.easy),
        QueueSpec("g", priority=Priority.medium, algorithm=Algorithm.greedy),
    )
    s.submit(ActionSpec("e", "easy", (NODE,), submit=1.0, seq=1, estimate=50.0), 1.0)
    for k in range(3):
        s.submit(
            ActionSpec(f"w{k}", "g", (NODE,), submit=1.0, seq=2 + k, estimate=10.0 * (k + 1)), 1.0
        )
    return s


def test_fits_that_end_alike_make_one_record() -> None:
    s = _fleet()
    before = counts(s).records_made
    assert s.schedule(1.0) == []
    (rec,) = s.queues["g"].evals
    assert [a.id for a in rec.acts] == ["w0", "w1", "w2"]
    assert rec.reason == "NoClusterCapacity" and rec.first is None
    # One record made for the three fits of ``g`` (and one for the head of ``easy``).
    assert counts(s).records_made - before == 2
    assert {s.reason(f"w{k}") for k in range(3)} == {"NoClusterCapacity"}
