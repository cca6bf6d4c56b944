"""A blocked head's hold records: the scheduler keeps the (cluster, head) pairs a visit records per head, from
pass to pass: a blocked strict head holds the same clusters every pass, and a full
pass over many such queues would otherwise make thousands of new pairs (young objects
for the collector to walk) to say the same thing.

Two clusters of one node (16 CPU, 64Gi), each taken by a filler; a strict queue's head
needs a node, so it blocks and holds both clusters.
"""

from __future__ import annotations

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
from headway.scheduler.index import reservations
from headway.scheduler.index.view import hold_records_kept
from headway.scheduler.resources import Pod

GI = 2**30
NODE = Pod(cpu=16_000, memory=64 * GI)


def _fleet(heads: int) -> Scheduler:
    s = Scheduler(
        [ClusterSpec(n, (NodeGroup("g", 1, NODE),)) for n in ("a", "b")],
        [QueueSpec("fill", priority=Priority.critical, algorithm=Algorithm.greedy)]
        + [
            QueueSpec(f"s{k}", priority=Priority.medium, algorithm=Algorithm.strict)
            for k in range(heads)
        ],
    )
    for k, n in enumerate(("a", "b")):
        assert s.submit(ActionSpec(f"f{n}", "fill", (NODE,), seq=k, estimate=100.0), 0.0) is None
    for k in range(heads):
        s.submit(ActionSpec(f"h{k}", f"s{k}", (NODE,), submit=1.0, seq=10 + k), 1.0)
    return s


def test_a_blocked_head_records_the_same_pairs_every_pass() -> None:
    s = _fleet(1)
    s.schedule(0.0)
    q = s.queues["s0"]
    first = q.last_holds
    assert sorted(first) == [("a", "h0"), ("b", "h0")]
    s.invalidate()
    s.schedule(1.0)
    again = q.last_holds
    assert again == first
    # The very pairs of the pass before, not equal new ones.
    assert all(x is y for x, y in zip(sorted(again), sorted(first), strict=True))
    assert s.reason("h0") == "NoClusterCapacity"


def test_the_pairs_kept_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(reservations, "HOLD_PAIRS_MAX", 2)
    s = _fleet(3)
    s.schedule(0.0)
    # Three heads held; the pairs of at most two are kept at any time.
    assert hold_records_kept(s) <= 2
    assert {s.reason(f"h{k}") for k in range(3)} == {"NoClusterCapacity"}
    for k in range(3):
        assert sorted(s.queues[f"s{k}"].last_holds) == [("a", f"h{k}"), ("b", f"h{k}")]
