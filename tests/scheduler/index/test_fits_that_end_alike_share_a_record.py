"""``Scheduler._eval``: fits that end alike (same demand, blocked or not, first
cluster with room and reason) share one record, made as the fits come: one ``_Eval``
per record, holding every action of the fits it stands for.

One cluster of one node (16 CPU, 64Gi), taken by a filler. Queue ``easy`` (high) has a
head that reserves; queue ``g`` (medium, greedy) has three alike one-node actions with
different estimates: with a reservation about, each is its own decision class and is
fitted on its own, and all three find no room.
"""

from __future__ import annotations

from typing import Any

import pytest
from headway.scheduler import (
    ActionSpec,
    Algorithm,
    Priority,
    QueueSpec,
    Scheduler,
)
from headway.scheduler.index import classes, records
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


def test_fits_that_end_alike_make_one_record(monkeypatch: pytest.MonkeyPatch) -> None:
    s = _fleet()
    made: list[Any] = []
    inner = records._Eval

    def counted(*args: Any) -> Any:
        e = inner(*args)
        made.append(e)
        return e

    # (made where a visit records its fits)
    monkeypatch.setattr(classes, "_Eval", counted)
    assert s.schedule(1.0) == []
    (rec,) = s.queues["g"].evals
    assert [a.id for a in rec.acts] == ["w0", "w1", "w2"]
    assert rec.reason == "NoClusterCapacity" and rec.first is None
    # One record made for the three fits of ``g`` (and one for the head of ``easy``).
    assert len(made) == 2
    assert {s.reason(f"w{k}") for k in range(3)} == {"NoClusterCapacity"}
