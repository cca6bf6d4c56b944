"""Projections shared between demands and between backfill and EASY queues.

The core sums a cluster's free totals as its running work ends once per release list,
for every demand projected there, and answers a backfill queue's projection from an EASY
queue's of the same demand (same time, no extra). The work is read through
``index.view.counts``, the kept answers through ``index.view``.
These pin both down: the answers are the ones worked out by hand, and the shared work
is done once.

One cluster of four nodes (16 CPU, 64Gi each), each taken by a filler action that ends
at t=100, 200, 300 and 400 by its estimate. Queue ``easy`` (high) and queue
``backfill`` (medium) each hold a head needing ``n`` whole nodes, which fits once
``n`` fillers ended: at t=100 * n.
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
from headway.scheduler.index.view import counts, kept_projection, release_steps
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


def _projections(s: Scheduler) -> int:
    return counts(s).projections


@pytest.mark.parametrize("n", [2, 3])
def test_a_backfill_queue_takes_the_easy_queues_projection_of_its_demand(n: int) -> None:
    s = _fleet(
        [
            QueueSpec("easy", priority=Priority.high, algorithm=Algorithm.easy),
            QueueSpec("backfill", priority=Priority.medium, algorithm=Algorithm.backfill),
        ]
    )
    s.submit(_head("e", "easy", n, 10), 1.0)
    s.submit(_head("b", "backfill", n, 11), 1.0)
    before = _projections(s)
    assert s.schedule(1.0) == []
    # One projection for both queues: EASY's (its time, and its extra).
    assert _projections(s) - before == 1
    assert kept_projection(s, "a", "e", easy=True) == (100.0 * n, True)
    assert kept_projection(s, "a", "b") == (100.0 * n, False)
    assert s.reason("e") == "NoClusterCapacity"
    assert s.reason("b") == "NoClusterCapacity"


def test_a_backfill_queue_alone_projects_the_same_time() -> None:
    s = _fleet([QueueSpec("backfill", priority=Priority.medium, algorithm=Algorithm.backfill)])
    s.submit(_head("b", "backfill", 3, 11), 1.0)
    before = _projections(s)
    s.schedule(1.0)
    assert _projections(s) - before == 1
    assert kept_projection(s, "a", "b") == (300.0, False)


def test_demands_projected_on_one_cluster_share_its_release_steps() -> None:
    s = _fleet(
        [
            QueueSpec("easy", priority=Priority.high, algorithm=Algorithm.easy),
            QueueSpec("backfill", priority=Priority.medium, algorithm=Algorithm.backfill),
        ]
    )
    s.submit(_head("e", "easy", 2, 10), 1.0)
    s.submit(_head("b", "backfill", 3, 11), 1.0)
    before = counts(s)
    s.schedule(1.0)
    after = counts(s)
    assert after.projections - before.projections == 2
    assert kept_projection(s, "a", "e", easy=True) == (200.0, True)
    assert kept_projection(s, "a", "b") == (300.0, False)
    # Both demands read one list of totals, summed once.
    assert after.release_steps_read - before.release_steps_read == 2
    assert after.release_steps_summed - before.release_steps_summed == 1
    steps = release_steps(s, "a")
    assert [st[:2] for st in steps] == [(100.0, 1), (200.0, 2), (300.0, 3), (400.0, 4)]
    assert [st[2] for st in steps] == [16_000, 32_000, 48_000, 64_000]
