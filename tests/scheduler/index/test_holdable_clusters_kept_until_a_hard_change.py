"""``Scheduler._holdable``: where a strict head that finds no room anywhere holds (the
known clusters of its selector whose node shapes could hold its demand), worked out
once per selector and demand and kept until a hard change (health, node shapes, the
fleet).

Two clusters: ``big`` has a node that could hold ``WIDE``, ``small`` does not. Both
are full. Strict queues ``s0`` and ``s1`` each have a ``WIDE`` head, which blocks and
holds ``big`` only.
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


def _count_could(s: Scheduler, monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    calls: list[Any] = []
    inner = s._could

    def counted(c: Any, runs: Any, dkey: int) -> bool:
        calls.append(c.name)
        return inner(c, runs, dkey)

    monkeypatch.setattr(s, "_could", counted)
    return calls


def test_blocked_heads_of_one_demand_read_one_list(monkeypatch: pytest.MonkeyPatch) -> None:
    s = _fleet()
    calls = _count_could(s, monkeypatch)
    assert len(s.schedule(0.0)) == 2
    # Both heads hold ``big`` only; the clusters were asked once, for the first head.
    for k in range(2):
        assert s.queues[f"s{k}"].last_holds == (("big", f"h{k}"),)
    assert sorted(calls) == ["big", "small"]
    assert s._holds == {"big": "h0"}
    # And the list stands from pass to pass.
    s.invalidate()
    assert s.schedule(1.0) == []
    assert len(calls) == 2
    assert s.queues["s1"].last_holds == (("big", "h1"),)


def test_a_hard_change_asks_again(monkeypatch: pytest.MonkeyPatch) -> None:
    s = _fleet()
    s.schedule(0.0)
    s.schedule(1.0)
    calls = _count_could(s, monkeypatch)
    # ``big`` goes down: the heads hold nothing there now (and nothing anywhere).
    s.set_cluster_health("big", False)
    s.invalidate()
    s.schedule(2.0)
    assert calls == ["small"]
    for k in range(2):
        assert s.queues[f"s{k}"].last_holds == ()
    assert s._holds == {}
    assert s.reason("h0") == "NoClusterCapacity"
