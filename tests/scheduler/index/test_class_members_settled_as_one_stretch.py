"""A class member decided and the members given its answer after it are settled as one
stretch (``index.view.counts``' ``stretches_settled``).

One cluster of one node (16 CPU, 64Gi), taken by a filler; queue ``q`` holds ten
alike one-node actions, so they form one decision class of ten.
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
    return one_node_taken(
        NODE, QueueSpec("q", priority=Priority.medium, algorithm=Algorithm.greedy)
    )


def test_a_class_decided_once_is_settled_once() -> None:
    """The member decided and the members given its answer after it are one stretch,
    settled at once (not the member first, then the rest)."""
    s = _fleet()
    for k in range(10):
        s.submit(ActionSpec(f"w{k}", "q", (NODE,), submit=1.0, seq=20 + k, estimate=5.0), 1.0)
    s.schedule(1.0)
    s.invalidate()
    before = counts(s)
    assert s.schedule(1.0) == []
    after = counts(s)
    assert after.fits - before.fits == 1
    assert after.stretches_settled - before.stretches_settled == 1
    assert {s.reason(f"w{k}") for k in range(10)} == {"NoClusterCapacity"}
