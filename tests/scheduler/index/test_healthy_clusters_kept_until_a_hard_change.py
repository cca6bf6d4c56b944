"""``index.view.healthy_clusters``: a selector's healthy clusters are kept from visit to visit
and pass to pass, until a hard change (health, the fleet) makes them again.

Clusters ``a`` and ``b`` of one node (16 CPU, 64Gi) each; queues ``p`` and ``q``
(greedy) both select ``a`` and ``b``.
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
from headway.scheduler.index.view import healthy_clusters
from headway.scheduler.resources import Pod

GI = 2**30
NODE = Pod(cpu=16_000, memory=64 * GI)


def _fleet() -> Scheduler:
    return Scheduler(
        [ClusterSpec(n, (NodeGroup("g", 1, NODE),)) for n in ("a", "b")],
        [
            QueueSpec(n, priority=Priority.medium, algorithm=Algorithm.greedy, clusters=("a", "b"))
            for n in ("p", "q")
        ],
    )


def test_queues_of_one_selector_read_one_list_until_a_hard_change() -> None:
    s = _fleet()
    first = healthy_clusters(s, "p")
    assert [c.name for c in first] == ["a", "b"]
    assert healthy_clusters(s, "q") is first
    s.set_cluster_health("a", False)
    down = healthy_clusters(s, "q")
    assert [c.name for c in down] == ["b"]
    assert healthy_clusters(s, "p") is down
    # Every cluster of the selector, healthy or not, is never the kept list.
    assert [c.name for c in healthy_clusters(s, "p", healthy_only=False)] == ["a", "b"]
    assert healthy_clusters(s, "p") is down


def test_a_cluster_down_takes_no_work_and_back_up_takes_it() -> None:
    s = _fleet()
    s.schedule(0.0)
    s.set_cluster_health("a", False)
    s.submit(ActionSpec("x", "p", (NODE,), seq=1), 1.0)
    (adm,) = s.schedule(1.0)
    assert adm.cluster == "b"
    s.submit(ActionSpec("y", "q", (NODE,), seq=2), 2.0)
    assert s.schedule(2.0) == []
    s.set_cluster_health("a", True)
    (adm,) = s.schedule(3.0)
    assert (adm.action_id, adm.cluster) == ("y", "a")


def test_a_restored_scheduler_keeps_a_down_cluster_out() -> None:
    s = _fleet()
    s.set_cluster_health("a", False)
    r = Scheduler.from_snapshot(s.to_snapshot())
    assert [c.name for c in healthy_clusters(r, "p")] == ["b"]
