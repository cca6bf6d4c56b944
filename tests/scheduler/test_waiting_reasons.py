"""What the Web UI is told of waiting actions (``Scheduler.waiting_reasons``)."""

from __future__ import annotations

from headway.scheduler import ActionSpec, ClusterSpec, NodeGroup, QueueSpec, Scheduler
from headway.scheduler.resources import Pod


def test_each_queue_tells_the_reasons_of_its_first_waiting_actions_only() -> None:
    one = Pod(1000)
    s = Scheduler([ClusterSpec("c", (NodeGroup("n", 1, one),))], [QueueSpec("q"), QueueSpec("r")])
    ids = {q: [f"{q}{i}" for i in range(5)] for q in ("q", "r")}
    for i in range(5):
        for k, q in enumerate(("q", "r")):
            assert s.submit(ActionSpec(ids[q][i], q, (one,), seq=2 * i + k), 0.0) is None
    started = {a.action_id for a in s.schedule(0.0)}
    assert len(started) == 1  # one node of one CPU
    waiting = {q: [a for a in ids[q] if a not in started] for q in ids}
    told = s.waiting_reasons(per_queue=2)
    assert sorted(told) == sorted(waiting["q"][:2] + waiting["r"][:2])
    assert {reason for reason, _ in told.values()} == {"NoClusterCapacity"}
    assert sorted(s.waiting_reasons()) == sorted(waiting["q"] + waiting["r"])  # 9 of 10
