"""Room under a held fleet: what the re-checks keep from pass to pass, against the plain loop.

Two things the re-checks below a held fleet keep, pinned down here against
``Scheduler(incremental=False)`` (same admissions, same reasons, step by step):

- the list of clusters with room for a demand that "room anywhere?" reads
  (``index.view.room_anywhere``, ``kept_room_list``): when a question finds no room
  anywhere, the list is brought up to date as empty, so the next question
  looks only at the clusters that moved after it (a demand with no room anywhere is
  asked after every completion); and a cluster of the list that has not moved since
  (by the log position of its latest change) vouches for room without a
  read of the log;
- each cluster's placement order key, kept for the free state (and the ``known`` flag)
  it was made from.

Five one-node clusters ``c0`` to ``c4`` (16 CPUs each), each filled by four
quarter-node actions of queue ``fill`` (critical). Queue ``hold`` (high, strict) has a
head ``H`` that wants a whole node: it finds no room, and holds all five. Below it,
medium queues of every algorithm (two greedy ones alike) wait with three-quarter-node
actions (room only where three quarters of a node are free) and small ones.
"""

from __future__ import annotations

from typing import Any

import pytest
from headway.scheduler import (
    Algorithm,
    ClusterSpec,
    NodeGroup,
    Priority,
    QueueSpec,
    Scheduler,
)
from headway.scheduler.index.view import (
    RoomList,
    holds,
    kept_room_list,
    placement_key,
    room_anywhere,
)
from headway.scheduler.resources import Pod

from ..helpers import apply_op, submitter

GI = 2**30
NODE = Pod(cpu=16_000, memory=64 * GI)
QUARTER = Pod(cpu=4_000, memory=16 * GI)
THREE = Pod(cpu=12_000, memory=48 * GI)
SMALL = Pod(cpu=1_000, memory=4 * GI)
BELOW = {
    "g1": Algorithm.greedy,
    "g2": Algorithm.greedy,
    "s": Algorithm.strict,
    "b": Algorithm.backfill,
    "e": Algorithm.easy,
}

# Ops, each followed by a pass: ("end", cluster, t) ends the first fill action still
# running on that cluster; ("unknown", cluster, t) is a report that cannot read nodes;
# and ``helpers.apply_op``'s ("finish" | "cancel", action, t), ("submit", queue, action,
# pod, t), ("tick", t).
Op = tuple[Any, ...]

CASES = [
    pytest.param(
        [("end", "c0", 1.0), ("end", "c1", 2.0), ("end", "c2", 3.0), ("end", "c0", 4.0),
         ("end", "c3", 5.0), ("end", "c0", 6.0), ("end", "c4", 7.0), ("end", "c1", 8.0),
         ("cancel", "H", 9.0)],
        id="no-room-anywhere-asked-after-every-completion-until-a-node-has-room"),
    pytest.param(
        [("end", "c0", 1.0), ("end", "c0", 2.0), ("end", "c0", 3.0), ("end", "c1", 4.0),
         ("submit", "fill", "F99", THREE, 5.0), ("end", "c2", 6.0), ("end", "c3", 7.0),
         ("end", "c2", 8.0), ("end", "c2", 9.0), ("end", "c4", 10.0), ("cancel", "H", 11.0)],
        id="room-comes-is-taken-from-above-and-comes-again-elsewhere"),
    pytest.param(
        [("end", "c1", 1.0), ("end", "c3", 2.0), ("tick", 12.0), ("end", "c1", 13.0),
         ("end", "c1", 14.0), ("tick", 30.0), ("end", "c4", 31.0), ("cancel", "H", 32.0)],
        id="the-clock-passes-estimated-ends-between-completions"),
    pytest.param(
        [("end", "c2", 1.0), ("end", "c2", 2.0), ("end", "c0", 3.0), ("unknown", "c1", 4.0),
         ("end", "c3", 5.0), ("cancel", "H", 6.0), ("end", "c4", 7.0)],
        id="a-cluster-turns-unknown-its-place-in-the-order-moves-without-a-new-version"),
    pytest.param(
        [("end", "c0", 1.0), ("end", "c1", 2.0), ("cancel", "G10", 3.0), ("end", "c0", 4.0),
         ("end", "c1", 5.0), ("end", "c0", 6.0), ("end", "c1", 7.0), ("end", "c2", 8.0)],
        id="queues-held-alike-part-ways-then-both-find-room"),
]  # fmt: skip


def _build(incremental: bool, pinned: bool = False) -> Scheduler:
    """The fleet above; ``pinned``: also queue ``a`` (medium, greedy, on ``c1`` and
    ``c2`` only, first of the medium queues by name) with three-quarter-node actions."""
    clusters = [ClusterSpec(f"c{i}", (NodeGroup("n", 1, NODE),)) for i in range(5)]
    queues = [
        QueueSpec("fill", priority=Priority.critical, algorithm=Algorithm.greedy),
        QueueSpec("hold", priority=Priority.high, algorithm=Algorithm.strict),
        *(QueueSpec(n, priority=Priority.medium, algorithm=a) for n, a in BELOW.items()),
    ]
    if pinned:
        queues.append(
            QueueSpec(
                "a", priority=Priority.medium, algorithm=Algorithm.greedy, clusters=("c1", "c2")
            )
        )
    s = Scheduler(clusters, queues, incremental=incremental)
    add = submitter(s)
    for i in range(20):
        # Estimated ends spread out, so that the clock passes some of them.
        add("fill", f"F{i}", (QUARTER,), 10.0 + 2 * i)
    add("hold", "H", (NODE,), 50.0)
    for name in BELOW:
        p = name.upper()
        for k, pod in enumerate([THREE, SMALL, THREE, SMALL, THREE]):
            add(name, f"{p}{k}", (pod,), 10.0 * (k % 3 + 1))
    if pinned:
        for k in range(3):
            add("a", f"A{k}", (THREE,), 10.0)
    return s


def _state(s: Scheduler) -> list[Any]:
    return sorted((a.id, a.state, a.cluster, a.last, tuple(a.reasons)) for a in s.actions.values())


def _apply(s: Scheduler, op: Op, seq: int) -> float:
    if op[0] == "end":
        on = sorted(
            (a for a in s.actions.values() if a.queue == "fill" and a.cluster == op[1]),
            key=lambda a: a.seq,
        )
        s.finish(on[0].id, op[2])
        t: float = op[2]
        return t
    if op[0] == "unknown":
        s.report_capacity(op[1], None)
        t = op[2]
        return t
    return apply_op(s, op, seq, 20.0)


def _run(ops: list[Op], incremental: bool, pinned: bool = False) -> list[Any]:
    s = _build(incremental, pinned)
    log: list[Any] = [sorted(x.action_id for x in s.schedule(0.0)), _state(s)]
    for op in ops:
        t = _apply(s, op, 1000 + len(log))
        log.append(sorted(x.action_id for x in s.schedule(t)))
        log.append(_state(s))
    return log


@pytest.mark.parametrize("ops", CASES)
@pytest.mark.parametrize("pinned", [False, True], ids=["fleet-wide", "with-a-pinned-queue"])
def test_room_below_a_held_fleet_as_the_plain_loop_decides(ops: list[Op], pinned: bool) -> None:
    assert _run(ops, True, pinned) == _run(ops, False, pinned)


def test_held_queues_in_a_row_keep_their_own_stale_clusters() -> None:
    """Queues re-checked one after another under the hold share the ``stale`` set made
    for the last of them only if they stood alike (same set before, same changes): the
    pinned queue ``a`` sees one of two changed clusters, the fleet-wide ones both."""
    s = _build(True, pinned=True)
    s.schedule(0.0)
    _apply(s, ("end", "c0", 1.0), 0)  # small actions find room on c0
    s.schedule(1.0)
    assert s.reason("G11") == "HeldForGang"
    # (Where only the reasons moved, c0 waits in ``stale`` too: see ``_held_flip``.)
    before = {n: set(q.stale or ()) for n, q in s.queues.items()}
    assert before["a"] == set()
    _apply(s, ("end", "c1", 2.0), 0)
    _apply(s, ("end", "c3", 2.0), 0)
    s.schedule(2.0)
    stale = {n: q.stale for n, q in s.queues.items() if q.stale}
    assert stale["a"] == {"c1"}
    for n in BELOW:
        assert stale[n] == before[n] | {"c1", "c3"}, n


def test_the_setup_holds_the_fleet_and_three_quarters_find_no_room() -> None:
    """The premise of the table: every node full, all five held by ``H``."""
    s = _build(True)
    assert len(s.schedule(0.0)) == 20
    assert s.reason("H") == "NoClusterCapacity"
    assert s.reason("G10") == "NoClusterCapacity"
    assert s.reason("G11") == "NoClusterCapacity"
    assert sorted(holds(s)) == [f"c{i}" for i in range(5)]


def test_no_room_anywhere_brings_the_list_up_to_date() -> None:
    """Once a question finds no room anywhere, the list stands at the log's end, and
    the next question reads only what moved since: a node freed to room then counts."""
    s = _build(True)
    s.schedule(0.0)
    pods = (THREE,)
    ends = [("end", "c0", 1.0), ("end", "c1", 2.0)]
    for op in ends:
        _apply(s, op, 0)
        s.schedule(op[2])
    assert kept_room_list(s, None, pods) == RoomList((), current=True)
    for op in [("end", "c0", 3.0), ("end", "c0", 4.0)]:
        _apply(s, op, 0)
        s.schedule(op[2])
    # c0 has room now: the question found it among the moved clusters (the list is not
    # made again then), and finds it again after another completion elsewhere.
    assert s.reason("G10") == "HeldForGang"
    _apply(s, ("end", "c3", 5.0), 0)
    s.schedule(5.0)
    assert s.reason("G10") == "HeldForGang"
    assert room_anywhere(s, None, pods) is True


def test_order_keys_follow_free_state_and_known() -> None:
    """The kept key is the key made afresh: after admissions, completions, a report, a
    report that cannot read nodes (no new version), and on a scratch copy."""

    def fresh(c: Any) -> tuple[Any, ...]:
        k = c.known
        return (1, 0 if k else 1, -c.tgpu if k else 0, -c.tcpu if k else 0, c.name)

    s = _build(True)
    c = s.clusters["c2"]
    assert placement_key(c) == fresh(c)
    s.schedule(0.0)
    assert placement_key(c) == fresh(c)
    first = placement_key(c)
    assert placement_key(c) is first, "kept while the free state stands"
    on = [a for a in s.actions.values() if a.cluster == "c2"]
    s.finish(on[0].id, 1.0)
    assert placement_key(c) == fresh(c) != first
    x = c.clone()
    x.give(on[1].runs, on[1].nodes)
    assert placement_key(x) == fresh(x) != placement_key(c)
    version = c.version
    s.report_capacity("c2", None)
    assert c.version == version
    assert placement_key(c) == fresh(c) == (1, 1, 0, 0, "c2")
