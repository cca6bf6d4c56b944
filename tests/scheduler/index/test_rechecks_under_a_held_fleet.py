"""Re-checks under a held fleet: the answers checked, the records brought up to date later.

When a strict head above holds every cluster a queue may use, a visit of that queue reads
capacity only as whether each demand has room anywhere (``HeldForGang`` if so,
``NoClusterCapacity`` if not) and, for a reserving queue, through its head's
reservation. The held-fleet re-check reads just that after a completion
(``index.view.counts``' ``held_rechecks_settled``), and leaves where each fit found room
for a later full check: the
changed clusters join the queue's ``stale`` set, and the next full check takes them as
changed. These cases pin that down against the plain loop
(``Scheduler(incremental=False)``): same admissions, same reasons, step by step.

Five clusters ``c0`` to ``c4`` of two 16-CPU nodes each, filled by queue ``fill``
(critical, ten node-sized actions ``F0`` to ``F9``). Queue ``hold`` (high, strict) has a
head ``H`` that wants a whole cluster (two nodes): it finds no room, and holds all five.
Below it four medium queues, one per algorithm (``g`` greedy, ``s`` strict, ``b``
backfill, ``e`` easy), wait with small, half-node and whole-node actions.
"""

from __future__ import annotations

from collections.abc import Callable
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
from headway.scheduler.index.view import (
    Counts,
    all_held,
    counts,
    holds,
    kept_room_list,
    room_anywhere,
    room_list,
    room_list_afresh,
)
from headway.scheduler.resources import Pod

from ..helpers import apply_op, submitter

GI = 2**30
NODE = Pod(cpu=16_000, memory=64 * GI)
HALF = Pod(cpu=8_000, memory=32 * GI)
SMALL = Pod(cpu=2_000, memory=8 * GI)
BELOW = {"g": Algorithm.greedy, "s": Algorithm.strict, "b": Algorithm.backfill, "e": Algorithm.easy}

# Ops, each followed by a pass: ("finish", action, t), ("cancel", action, t),
# ("submit", queue, action, pod, t), ("tick", t) (a pass at a later time, nothing else).
Op = tuple[Any, ...]

CASES = [
    pytest.param(
        [("finish", "F0", 1.0), ("finish", "F3", 2.0), ("finish", "F6", 3.0)], True,
        id="completions-free-nodes-below-a-held-fleet-every-answer-stays-held"),
    pytest.param(
        [("finish", "F0", 1.0), ("finish", "F1", 2.0), ("finish", "F4", 3.0)], True,
        id="a-cluster-empties-the-held-head-may-now-start-there"),
    pytest.param(
        [("finish", "F2", 1.0), ("finish", "F5", 2.0), ("cancel", "H", 3.0)], True,
        id="the-hold-goes-after-stale-records-built-up-the-full-check-reads-them-again"),
    pytest.param(
        [("finish", "F0", 1.0), ("finish", "F3", 2.0), ("tick", 8.0), ("finish", "F7", 9.0),
         ("tick", 30.0)], True,
        id="the-clock-passes-estimated-ends-while-held-reservations-move"),
    pytest.param(
        [("finish", "F1", 1.0), ("submit", "g", "G9", NODE, 2.0),
         ("submit", "e", "E9", SMALL, 2.0), ("finish", "F8", 3.0), ("cancel", "H", 4.0)], True,
        id="new-actions-below-a-held-fleet-are-decided-on-top-of-stale-records"),
    pytest.param(
        [("finish", "F9", 1.0), ("cancel", "S0", 2.0), ("finish", "F5", 3.0),
         ("cancel", "H", 4.0), ("finish", "F0", 5.0)], True,
        id="a-queue-below-changes-then-the-hold-goes"),
    pytest.param(
        [("cancel", "H", 1.0), ("finish", "F0", 2.0)], False,
        id="no-hold-no-held-check-the-plain-check-as-before"),
]  # fmt: skip


def _held_from_above(
    below: list[QueueSpec], incremental: bool, fill_end: Callable[[int], float]
) -> tuple[Scheduler, Any]:
    """Five 2-node clusters filled by ``fill`` (10 one-node actions, the i-th estimated
    to end at ``fill_end(i)``) and held by ``hold``'s two-node strict head; ``below``
    queues at medium priority, empty. Returns the scheduler and its submitter."""
    clusters = [ClusterSpec(f"c{i}", (NodeGroup("n", 2, NODE),)) for i in range(5)]
    queues = [
        QueueSpec("fill", priority=Priority.critical, algorithm=Algorithm.greedy),
        QueueSpec("hold", priority=Priority.high, algorithm=Algorithm.strict),
        *below,
    ]
    s = Scheduler(clusters, queues, incremental=incremental)
    add = submitter(s)
    for i in range(10):
        add("fill", f"F{i}", (NODE,), fill_end(i))
    add("hold", "H", (NODE, NODE), 50.0)
    return s, add


def _build(incremental: bool) -> Scheduler:
    below = [QueueSpec(n, priority=Priority.medium, algorithm=a) for n, a in BELOW.items()]
    # Estimated ends spread out, so that the clock passes some of them.
    s, add = _held_from_above(below, incremental, lambda i: 5.0 + 3 * i)
    for name in BELOW:
        p = name.upper()
        for k, pod in enumerate([SMALL, HALF, NODE, SMALL, HALF, NODE, SMALL]):
            add(name, f"{p}{k}", (pod,), 10.0 * (k % 3 + 1))
    return s


def _state(s: Scheduler) -> list[Any]:
    return sorted((a.id, a.state, a.cluster, a.last, tuple(a.reasons)) for a in s.actions.values())


def _run(ops: list[Op], incremental: bool) -> tuple[list[Any], int, int]:
    """The log of every pass, how many re-checks took the held path, and the largest
    ``stale`` set seen after a pass."""
    s = _build(incremental)
    log: list[Any] = [sorted(x.action_id for x in s.schedule(0.0)), _state(s)]
    before = counts(s).held_rechecks_settled
    most_stale = 0
    for op in ops:
        t = apply_op(s, op, 1000 + len(log))
        log.append(sorted(x.action_id for x in s.schedule(t)))
        log.append(_state(s))
        most_stale = max([most_stale, *(len(q.stale or ()) for q in s.queues.values())])
    return log, counts(s).held_rechecks_settled - before, most_stale


@pytest.mark.parametrize(("ops", "takes_held_path"), CASES)
def test_a_held_fleet_rechecks_as_the_plain_loop_decides(
    ops: list[Op], takes_held_path: bool
) -> None:
    fast, held, most_stale = _run(ops, True)
    plain, plain_held, _ = _run(ops, False)
    assert fast == plain
    assert plain_held == 0
    if takes_held_path:
        assert held > 0
        assert most_stale > 0
    else:
        assert held == 0


def test_the_held_path_leaves_records_stale_and_the_hold_going_refreshes_them() -> None:
    """After completions under the hold, a queue below keeps the clusters it did not
    bring up to date; once the hold goes, its next check reads them (or it is visited),
    and nothing stays stale."""
    s = _build(True)
    s.schedule(0.0)
    where = {aid: s.actions[aid].cluster for aid in ("F0", "F3", "F6")}
    s.finish("F0", 1.0)
    s.schedule(1.0)
    s.finish("F3", 2.0)
    s.schedule(2.0)
    s.finish("F6", 2.5)
    s.schedule(2.5)
    stale = {n: set(q.stale or ()) for n, q in s.queues.items() if q.stale}
    assert stale, "no queue took the held path"
    # Each is the clusters changed since the queue's last full check: those of the
    # last completions, the first of them only if that one took the held path too.
    assert all(
        v in ({where["F3"], where["F6"]}, {where["F0"], where["F3"], where["F6"]})
        for v in stale.values()
    ), (stale, where)
    s.cancel("H", 3.0)
    s.schedule(3.0)
    assert not any(q.stale for q in s.queues.values())


def test_all_held_counts_only_healthy_clusters_of_the_selector() -> None:
    """A cluster that is down is no cluster the queue may use: the rest held is all.
    (``H``'s queue pinned to four clusters: it holds those four; ``g`` and ``s`` below,
    empty, hold nothing.)"""
    below = [QueueSpec(n, priority=Priority.medium, algorithm=BELOW[n]) for n in ("g", "s")]
    s, _ = _held_from_above(below, True, lambda i: 100.0)
    s.schedule(0.0)
    assert all_held(s, "g")
    s.upsert_queue(
        QueueSpec(
            "hold",
            priority=Priority.high,
            algorithm=Algorithm.strict,
            clusters=("c0", "c1", "c2", "c3"),
        )
    )
    s.schedule(0.5)
    assert sorted(holds(s)) == ["c0", "c1", "c2", "c3"]
    assert not all_held(s, "g")
    s.set_cluster_health("c4", False)
    s.schedule(0.6)
    assert sorted(holds(s)) == ["c0", "c1", "c2", "c3"]
    assert all_held(s, "g")
    assert all_held(s, "s")


# ``index.view.room_anywhere`` answers from the last list of clusters with room and the capacity log
# since (without making the list again): pinned against the list made afresh. Each case:
# the actions that end first (their nodes freed), the selector asked about, the pod.
ROOM_CASES = [
    pytest.param([], None, NODE, id="nothing-moved-the-list-as-it-was-no-room"),
    pytest.param(["F0"], None, NODE, id="a-node-freed-a-moved-cluster-now-has-room"),
    pytest.param(["F0"], ("c3", "c4"), NODE,
                 id="a-node-freed-outside-the-selector-does-not-count"),
    pytest.param(["F0", "F1"], None, Pod(cpu=32_000, memory=64 * GI),
                 id="a-shape-no-node-holds-never-has-room"),
    pytest.param(["F0", "F2", "F4"], ("c0", "c1"), SMALL,
                 id="several-clusters-moved-one-of-them-in-the-selector"),
    pytest.param(["F0"], None, SMALL, id="room-before-room-after-an-unmoved-cluster-vouches"),
]  # fmt: skip


@pytest.mark.parametrize(("ends", "sel", "pod"), ROOM_CASES)
def test_any_room_from_the_log_matches_the_list_made_afresh(
    ends: list[str], sel: tuple[str, ...] | None, pod: Pod
) -> None:
    s = _build(True)
    s.schedule(0.0)
    pods = (pod,)
    # The list as a walk made it before the completions.
    room_list(s, sel, pods)
    for i, aid in enumerate(ends):
        s.finish(aid, 1.0 + i)
    got = room_anywhere(s, sel, pods)
    # With completions, the answer came from the log: the list is left out of date
    # when some cluster has room, and brought up to date (empty) when none has.
    kept = kept_room_list(s, sel, pods)
    assert kept is not None
    assert kept.current == (not ends or not got)
    fresh = room_list_afresh(s, sel, pods)
    assert got == bool(fresh.clusters)
    if ends and not got:
        assert kept.clusters == fresh.clusters == ()


def test_any_room_a_cluster_that_moved_and_lost_its_room_does_not_vouch() -> None:
    """The only cluster with room when the list was made takes work since: none left."""
    s = _build(True)
    s.schedule(0.0)
    s.finish("F0", 1.0)
    s.schedule(1.0)
    sel = ("c0", "c1", "c2", "c3", "c4")  # asked by no queue: no walk remakes it
    pods = (NODE,)
    assert room_list(s, sel, pods).clusters, "the freed node is room"
    s.submit(ActionSpec("F10", "fill", (NODE,), submit=2.0, seq=999, estimate=5.0), 2.0)
    assert [x.action_id for x in s.schedule(2.0)] == ["F10"]
    kept = kept_room_list(s, sel, pods)
    assert kept is not None and not kept.current
    assert room_anywhere(s, sel, pods) is False
    assert not room_list_afresh(s, sel, pods).clusters


# --- records found at more than one capacity never take the held path -----------------
#
# A queue whose last visit admitted work keeps records found at more than one capacity
# (``_Queue.mixed``): each answer at the capacity its admissions before it left. Such
# records are re-checked in full (with its care for class members decided on their
# own), never by the held-fleet re-check, which reads only whether each demand
# has room anywhere and leaves the rest stale. Queue ``m`` (medium) admits ``M0`` on a
# freed node; its gangs ``M1`` to ``M3`` (a whole cluster each) find no room. Then a
# strict head ``H`` above holds the fleet, and more nodes free, one per cluster: ``m``
# has changed clusters under a held fleet, its records are mixed, and the check must
# be the full one. Decisions and reasons step by step as the plain loop's.
MIXED_CASES = [
    pytest.param(a, id=f"a-{a.value}-queue-that-admitted-is-rechecked-in-full-under-a-held-fleet")
    for a in (Algorithm.greedy, Algorithm.backfill, Algorithm.easy)
]


def _mixed_run(algo: Algorithm, incremental: bool) -> tuple[list[Any], Counts]:
    """The log of every pass, and the work counts of the run (``index.view.counts``:
    mixed records re-checked by the held path, and in full under a held fleet)."""
    clusters = [ClusterSpec(f"c{i}", (NodeGroup("n", 2, NODE),)) for i in range(5)]
    queues = [
        QueueSpec("fill", priority=Priority.critical, algorithm=Algorithm.greedy),
        QueueSpec("hold", priority=Priority.high, algorithm=Algorithm.strict),
        QueueSpec("m", priority=Priority.medium, algorithm=algo),
    ]
    s = Scheduler(clusters, queues, incremental=incremental)
    add = submitter(s)
    for i in range(10):
        add("fill", f"F{i}", (NODE,), 5.0 + 3 * i)
    add("m", "M0", (NODE,), 20.0)
    for k in range(1, 4):
        add("m", f"M{k}", (NODE, NODE), 30.0)
    log: list[Any] = [sorted(x.action_id for x in s.schedule(0.0)), _state(s)]
    ops: list[Op] = [
        ("finish", "F0", 1.0),  # M0 starts on c0: m's records are mixed
        ("submit", "hold", "H", (NODE, NODE), 2.0),  # H holds the fleet
        ("finish", "F2", 3.0),  # c1: one node free, no room for a gang
        ("finish", "F4", 4.0),  # c2 likewise
        ("cancel", "H", 5.0),  # the hold goes: the records are read in full
        ("finish", "F3", 6.0),  # c1 empties: a gang starts
    ]
    for op in ops:
        t = apply_op(s, op, 1000 + len(log), 40.0)
        log.append(sorted(x.action_id for x in s.schedule(t)))
        log.append(_state(s))
    return log, counts(s)


@pytest.mark.parametrize("algo", MIXED_CASES)
def test_mixed_records_under_a_held_fleet_are_rechecked_in_full(algo: Algorithm) -> None:
    fast, seen = _mixed_run(algo, True)
    plain, plain_seen = _mixed_run(algo, False)
    assert fast == plain
    assert plain_seen.full_rechecks_mixed_under_held_fleet == 0
    assert plain_seen.held_rechecks_mixed == 0
    assert fast[2] == ["M0"], "M0 starts on the freed node: m's records are mixed"
    assert seen.full_rechecks_mixed_under_held_fleet > 0, (
        "the scenario must check mixed records under a held fleet"
    )
    assert seen.held_rechecks_mixed == 0, "mixed records went through the held path"


# --- the held path's stale set, shared only between queues that stood alike ------------
#
# The pass takes the commonest held re-check inline (no reservation, nothing expired,
# the verdict and the stale set already worked out for a queue before it): the set may
# be shared only if the queue's stale set before and its changed clusters are the very
# ones that answer was made from. Below ``H``'s hold, gangs of a whole cluster find no
# room anywhere, and single nodes freed leave them so: every re-check below is held.
# Each case: the queues below (name, algorithm, selector; visited in name order), the
# clusters whose first fill action ends (one pass each; a tuple: together, before one
# pass; ("cancel", action): a cancel and its pass), and each queue's stale clusters
# after them. Then the hold goes, and everything is decided as
# the plain loop decides.
STALE_CASES = [
    pytest.param(
        [("a", Algorithm.greedy, ("c1", "c2")), ("b", Algorithm.greedy, None)],
        ["c0", "c2"], {"a": {"c2"}, "b": {"c0", "c2"}},
        id="a-fleet-wide-queue-after-a-pinned-one-keeps-its-older-stale-cluster"),
    pytest.param(
        [("a", Algorithm.greedy, None), ("b", Algorithm.strict, ("c2",)),
         ("c", Algorithm.greedy, None)],
        ["c0", "c2"], {"a": {"c0", "c2"}, "b": {"c2"}, "c": {"c0", "c2"}},
        id="a-pinned-queue-between-fleet-wide-ones-gets-only-its-own-change"),
    pytest.param(
        [("a", Algorithm.greedy, None), ("b", Algorithm.greedy, None),
         ("c", Algorithm.strict, None)],
        ["c0", "c3", "c4"], {"a": {"c0", "c3", "c4"}, "b": {"c0", "c3", "c4"},
                             "c": {"c0", "c3", "c4"}},
        id="fleet-wide-queues-that-stood-alike-share-one-stale-set"),
    pytest.param(
        [("a", Algorithm.greedy, ("c0", "c1")), ("b", Algorithm.greedy, ("c3", "c4")),
         ("c", Algorithm.greedy, None)],
        ["c0", "c4", "c1"], {"a": {"c0", "c1"}, "b": {"c4"}, "c": {"c0", "c1", "c4"}},
        id="pinned-queues-each-with-its-own-changes-then-a-fleet-wide-one"),
    pytest.param(
        [("a", Algorithm.greedy, None), ("b", Algorithm.greedy, ("c2",)),
         ("c", Algorithm.greedy, None)],
        [("c0", "c2")], {"a": {"c0", "c2"}, "b": {"c2"}, "c": {"c0", "c2"}},
        id="two-ends-in-one-pass-the-pinned-queue-sees-one-the-next-fleet-wide-both"),
    pytest.param(
        [("a", Algorithm.greedy, None), ("b", Algorithm.greedy, None)],
        ["c0", ("cancel", "b2"), "c2"], {"a": {"c0", "c2"}, "b": {"c2"}},
        id="a-queue-visited-in-between-starts-afresh-beside-one-that-did-not"),
]  # fmt: skip


def _stale_run(
    below: list[tuple[str, Algorithm, tuple[str, ...] | None]],
    ends: list[Any],
    incremental: bool,
) -> tuple[list[Any], dict[str, set[str]], int]:
    """The log of every pass, each queue's stale clusters after the ends, and how many
    re-checks took the held path."""
    specs = [
        QueueSpec(n, priority=Priority.medium, algorithm=a, clusters=sel) for n, a, sel in below
    ]
    s, add = _held_from_above(specs, incremental, lambda i: 100.0)
    for n, _, _ in below:
        for k in range(3):
            add(n, f"{n}{k}", (NODE, NODE), 10.0 * (k + 1))
    log: list[Any] = [sorted(x.action_id for x in s.schedule(0.0)), _state(s)]
    before = counts(s).held_rechecks_settled
    t = 0.0
    for step in ends:
        t += 1.0
        if step[0] == "cancel":
            assert s.cancel(step[1], t)
            step = ()
        for cname in (step,) if isinstance(step, str) else step:
            fill = [a.id for a in s.actions.values() if a.cluster == cname and a.queue == "fill"]
            s.finish(min(fill), t)
        log.append(sorted(x.action_id for x in s.schedule(t)))
        log.append(_state(s))
    stale = {n: set(s.queues[n].stale or ()) for n, _, _ in below}
    s.cancel("H", t + 1.0)
    log.append(sorted(x.action_id for x in s.schedule(t + 1.0)))
    log.append(_state(s))
    return log, stale, counts(s).held_rechecks_settled - before


@pytest.mark.parametrize(("below", "ends", "want"), STALE_CASES)
def test_held_rechecks_in_a_row_keep_each_queues_own_stale_set(
    below: list[tuple[str, Algorithm, tuple[str, ...] | None]],
    ends: list[Any],
    want: dict[str, set[str]],
) -> None:
    fast, stale, held = _stale_run(below, ends, True)
    plain, _, _ = _stale_run(below, ends, False)
    assert fast == plain
    assert held > 0
    assert stale == want
