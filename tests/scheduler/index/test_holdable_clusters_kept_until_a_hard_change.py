"""``index.view.holdable_clusters``: where a strict head that finds no room anywhere holds (the
known clusters of its selector whose node shapes could hold its demand), worked out
once per selector and demand and kept until a hard change (health, node shapes, the
fleet).

Two clusters: ``big`` has a node that could hold ``WIDE``, ``small`` does not. Both
are full. Strict queues ``s0`` and ``s1`` each have a ``WIDE`` head, which blocks and
holds ``big`` only.
"""

from __future__ import annotations

from headway.scheduler import (
    ActionSpec,
    Algorithm,
    ClusterSpec,
    NodeGroup,
    Priority,
    QueueSpec,
    Scheduler,
)
from headway.scheduler.index.view import holdable_clusters, holds
from headway.scheduler.resources import Pod

GI = 2**30
BIG = Pod(cpu=32_000, memory=128 * GI)
SMALL = Pod(cpu=8_000, memory=32 * GI)
WIDE = Pod(cpu=24_000, memory=64 * GI)


def _fleet() -> Scheduler:
    s = Scheduler(
        [
            ClusterSpec("big", (NodeGroup("g", 1, BIG),)),
            ClusterSpec("small", (NodeGroup("g", 1, SMALL),)),
        ],
        [QueueSpec("fill", priority=Priority.critical, algorithm=Algorithm.greedy)]
        + [
            QueueSpec(f"s{k}", priority=Priority.medium, algorithm=Algorithm.strict)
            for k in range(2)
        ],
    )
    assert s.submit(ActionSpec("fb", "fill", (BIG,), seq=0, estimate=100.0), 0.0) is None
    assert s.submit(ActionSpec("fs", "fill", (SMALL,), seq=1, estimate=100.0), 0.0) is None
    for k in range(2):
        s.submit(ActionSpec(f"h{k}", f"s{k}", (WIDE,), submit=1.0, seq=10 + k), 1.0)
    return s


def test_blocked_heads_of_one_demand_read_one_list() -> None:
    s = _fleet()
    assert len(s.schedule(0.0)) == 2
    # Both heads hold ``big`` only, from one list made for the first head.
    for k in range(2):
        assert s.queues[f"s{k}"].last_holds == (("big", f"h{k}"),)
    kept = holdable_clusters(s, "s0", "h0")
    assert kept == ["big"]
    assert holdable_clusters(s, "s1", "h1") is kept
    assert holds(s) == {"big": "h0"}
    # And the list stands from pass to pass.
    s.invalidate()
    assert s.schedule(1.0) == []
    assert holdable_clusters(s, "s0", "h0") is kept
    assert s.queues["s1"].last_holds == (("big", "h1"),)


def test_a_hard_change_asks_again() -> None:
    s = _fleet()
    s.schedule(0.0)
    s.schedule(1.0)
    before = holdable_clusters(s, "s0", "h0")
    # ``big`` goes down: the heads hold nothing there now (and nothing anywhere).
    s.set_cluster_health("big", False)
    s.invalidate()
    s.schedule(2.0)
    after = holdable_clusters(s, "s0", "h0")
    assert after is not before and after == []
    for k in range(2):
        assert s.queues[f"s{k}"].last_holds == ()
    assert holds(s) == {}
    assert s.reason("h0") == "NoClusterCapacity"
