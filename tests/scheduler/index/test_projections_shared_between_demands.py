"""Projections shared between demands and between backfill and EASY queues.

``Scheduler._steps`` sums a cluster's free totals as its running work ends once per
release list, for every demand projected there; ``_earliest_fit`` answers a backfill
queue's projection from an EASY queue's of the same demand (same time, no extra).
These pin both down: the answers are the ones worked out by hand, and the shared work
is done once.

One cluster of four nodes (16 CPU, 64Gi each), each taken by a filler action that ends
at t=100, 200, 300 and 400 by its estimate. Queue ``easy`` (high) and queue
``backfill`` (medium) each hold a head needing ``n`` whole nodes, which fits once
``n`` fillers ended: at t=100 * n.
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
from headway.scheduler.model import DemandKind, replicas_demand
from headway.scheduler.resources import Pod

GI = 2**30
NODE = Pod(cpu=16_000, memory=64 * GI)


def _fleet(queues: list[QueueSpec]) -> Scheduler:
    s = Scheduler(
        [ClusterSpec("a", (NodeGroup("g", 4, NODE),))],
        [QueueSpec("fill", priority=Priority.critical, algorithm=Algorithm.greedy), *queues],
    )
    for k in range(4):
        assert (
            s.submit(ActionSpec(f"f{k}", "fill", (NODE,), seq=k, estimate=100.0 * (k + 1)), 0.0)
            is None
        )
    assert len(s.schedule(0.0)) == 4
    return s


def _head(aid: str, queue: str, n: int, seq: int) -> ActionSpec:
    return ActionSpec(
        aid, queue, replicas_demand(NODE, n), submit=1.0, seq=seq, estimate=50.0,
        kind=DemandKind.replicas,
    )  # fmt: skip


def _counting(s: Scheduler, name: str, monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    got: list[Any] = []
    inner = getattr(s, name)

    def wrapped(*args: Any) -> Any:
        r = inner(*args)
        got.append(r)
        return r

    monkeypatch.setattr(s, name, wrapped)
    return got


@pytest.mark.parametrize("n", [2, 3])
def test_a_backfill_queue_takes_the_easy_queues_projection_of_its_demand(
    n: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    s = _fleet(
        [
            QueueSpec("easy", priority=Priority.high, algorithm=Algorithm.easy),
            QueueSpec("backfill", priority=Priority.medium, algorithm=Algorithm.backfill),
        ]
    )
    s.submit(_head("e", "easy", n, 10), 1.0)
    s.submit(_head("b", "backfill", n, 11), 1.0)
    projected = _counting(s, "_project", monkeypatch)
    assert s.schedule(1.0) == []
    # One projection for both queues: EASY's (its time, and its extra).
    assert len(projected) == 1
    assert projected[0] is not None and projected[0][0] == 100.0 * n
    assert projected[0][1] is not None
    a = s.clusters["a"]
    dkey = s.actions["b"].dkey
    assert s._fit_cache[(a.index, dkey, False)][4] == (100.0 * n, None)
    assert s.reason("e") == "NoClusterCapacity"
    assert s.reason("b") == "NoClusterCapacity"


def test_a_backfill_queue_alone_projects_the_same_time(monkeypatch: pytest.MonkeyPatch) -> None:
    s = _fleet([QueueSpec("backfill", priority=Priority.medium, algorithm=Algorithm.backfill)])
    s.submit(_head("b", "backfill", 3, 11), 1.0)
    projected = _counting(s, "_project", monkeypatch)
    s.schedule(1.0)
    assert projected == [(300.0, None)]


def test_demands_projected_on_one_cluster_share_its_release_steps(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    s = _fleet(
        [
            QueueSpec("easy", priority=Priority.high, algorithm=Algorithm.easy),
            QueueSpec("backfill", priority=Priority.medium, algorithm=Algorithm.backfill),
        ]
    )
    s.submit(_head("e", "easy", 2, 10), 1.0)
    s.submit(_head("b", "backfill", 3, 11), 1.0)
    steps = _counting(s, "_steps", monkeypatch)
    projected = _counting(s, "_project", monkeypatch)
    s.schedule(1.0)
    assert [p[0] for p in projected if p is not None] == [200.0, 300.0]
    # Both demands read one list of totals, summed once.
    assert len(steps) == 2 and steps[0] is steps[1]
    assert [st[:2] for st in steps[0]] == [(100.0, 1), (200.0, 2), (300.0, 3), (400.0, 4)]
    assert [st[2] for st in steps[0]] == [16_000, 32_000, 48_000, 64_000]
