"""The pass's fit memo: one answer per (cluster, demand) at one capacity version.

The core keeps, for the pass, whether a cluster has room for a demand, keyed by
(cluster, demand key) and the cluster's capacity version; the re-checks of queues
skipped after a completion share the clusters with room per demand and changed set.
Equal demands waiting at the heads of many queues are so asked about once per capacity, and an admission between two asks (a new version) makes the
second ask again. These cases pin that down against the plain loop
(``Scheduler(incremental=False)``): same admissions, same reasons.

One cluster ``a`` of ``nodes`` nodes (16 CPU, 64Gi each). Queue ``first`` (high
priority) holds action A, queue ``second`` (medium) holds B1 (and B2 if given), all
greedy and single-pod. One pass at t=0; then A ends and a second pass runs at t=1.
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
NODE = Pod(cpu=16_000, memory=64 * GI)
BIG = Pod(cpu=12_000, memory=32 * GI)
SMALL = Pod(cpu=4_000, memory=16 * GI)

CASES = [
    pytest.param(1, NODE, [NODE], ["A"], {"B1": ["NoClusterCapacity"]}, ["B1"],
                 id="the-first-queue-takes-the-last-node-the-same-shape-behind-it-finds-no-room"),
    pytest.param(2, NODE, [NODE], ["A", "B1"], {"B1": []}, [],
                 id="room-for-both-the-second-ask-at-the-new-version-still-finds-room"),
    pytest.param(1, BIG, [SMALL], ["A", "B1"], {"B1": []}, [],
                 id="a-smaller-shape-fits-beside-the-first-on-the-same-node"),
    pytest.param(1, BIG, [BIG], ["A"], {"B1": ["NoClusterCapacity"]}, ["B1"],
                 id="the-same-shape-twice-on-one-node-the-second-ask-finds-no-room"),
    pytest.param(2, NODE, [NODE, NODE], ["A", "B1"], {"B1": [], "B2": ["NoClusterCapacity"]},
                 ["B2"],
                 id="room-then-none-within-one-queue-each-admission-asks-again"),
    pytest.param(1, NODE, [SMALL, NODE], ["A"],
                 {"B1": ["NoClusterCapacity"], "B2": ["NoClusterCapacity"]}, ["B1"],
                 id="no-room-for-two-shapes-a-completion-frees-room-for-the-first-only"),
]  # fmt: skip


def _run(nodes: int, first: Pod, second: list[Pod], incremental: bool) -> list[Any]:
    clusters = [ClusterSpec("a", (NodeGroup("g", nodes, NODE),))]
    queues = [
        QueueSpec("first", priority=Priority.high, algorithm=Algorithm.greedy),
        QueueSpec("second", priority=Priority.medium, algorithm=Algorithm.greedy),
    ]
    s = Scheduler(clusters, queues, incremental=incremental)
    s.submit(ActionSpec("A", "first", (first,), submit=0.0, seq=0, estimate=10.0), 0.0)
    for i, pod in enumerate(second):
        s.submit(
            ActionSpec(f"B{i + 1}", "second", (pod,), submit=0.0, seq=1 + i, estimate=10.0), 0.0
        )
    log: list[Any] = [sorted(x.action_id for x in s.schedule(0.0))]
    log.append({f"B{i + 1}": [str(r) for r in s.reasons(f"B{i + 1}")] for i in range(len(second))})
    s.finish("A", 1.0)
    log.append(sorted(x.action_id for x in s.schedule(1.0)))
    log.append(sorted((a.id, a.last, tuple(a.reasons)) for a in s.actions.values()))
    return log


@pytest.mark.parametrize(("nodes", "first", "second", "started", "reasons", "then"), CASES)
def test_the_fit_memo_asks_again_at_each_capacity(
    nodes: int,
    first: Pod,
    second: list[Pod],
    started: list[str],
    reasons: dict[str, list[str]],
    then: list[str],
) -> None:
    fast = _run(nodes, first, second, True)
    assert fast == _run(nodes, first, second, False)
    assert fast[0] == started
    assert fast[1] == reasons
    assert fast[2] == then
