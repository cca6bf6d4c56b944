"""Differential tests for the shortcuts a fleet-sized pass takes (``bench/core_pass.py``).

A walk over the clusters with room for a demand skips the ones a hold of this pass
names; the placement order and the clusters with room for each
demand are carried from one capacity to the next by re-placing only the clusters that
changed. Each must decide exactly as the plain loop (``Scheduler(incremental=False)``):
same admissions, same clusters and nodes, same reasons.

The narrative table sets up holds and reservations in a known order of clusters; the
seeded runs are a small copy of the benchmark's fleet (many clusters and selectors, a
full fleet, strict heads holding, reserving heads, completions one by one and in
bursts, arrivals, forced full passes and a snapshot round trip).
"""

from __future__ import annotations

import random
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
from headway.scheduler.index.view import effects
from headway.scheduler.model import replicas_demand
from headway.scheduler.resources import Pod

GI = 2**30
NODE = Pod(cpu=16_000, memory=64 * GI)
ALGOS = [Algorithm.strict, Algorithm.greedy, Algorithm.backfill, Algorithm.easy]


def _why(s: Scheduler) -> list[tuple[str, str | None, tuple[str, ...]]]:
    return sorted((a.id, a.last, tuple(a.reasons)) for a in s.actions.values())


# --- the walk past held clusters ---------------------------------------------------
#
# Clusters a and b, two nodes each, one node of each taken by a filler (ending at 1000 on
# a, at 100 on b). A strict queue's gang of two nodes blocks and holds the clusters it is
# pinned to; a backfill queue's gang reserves its cluster (b: the filler there ends
# first). A greedy queue's one-node actions then walk a then b (equal free capacity: by
# name): held or reserved, a short action backfills past a reservation, a long one does
# not; the first cluster in the walk gives the reason. Then the strict head is cancelled.

WALK_CASES = [
    pytest.param(("a", "b"), None, {"L": ["HeldForGang"], "S": ["HeldForGang"]}, [], ["L", "S"],
                 id="every-cluster-with-room-held-the-first-gives-HeldForGang"),
    pytest.param(("a",), ("b",), {"L": ["HeldForGang"], "S": []}, ["S"], ["L"],
                 id="held-first-then-reserved-a-short-action-backfills-on-the-second"),
    pytest.param(("b",), ("a",), {"L": ["BackfillWindow", "HeldForGang"], "S": []}, ["S"], ["L"],
                 id="reserved-first-then-held-the-reservation-gives-the-reason"),
    pytest.param(("a",), None, {"L": [], "S": ["HeldForGang"]}, ["L"], ["S"],
                 id="held-first-then-open-the-first-action-starts-on-the-second"),
    pytest.param(None, ("b",), {"L": [], "S": []}, ["L", "S"], [],
                 id="no-hold-the-open-cluster-and-the-backfill-take-both"),
]  # fmt: skip


def _walk_run(
    strict_on: tuple[str, ...] | None, backfill_on: tuple[str, ...] | None, incremental: bool
) -> list[Any]:
    clusters = [ClusterSpec(n, (NodeGroup("g", 2, NODE),)) for n in ("a", "b")]
    queues = [
        QueueSpec("fill-a", priority=Priority.critical, clusters=("a",)),
        QueueSpec("fill-b", priority=Priority.critical, clusters=("b",)),
        QueueSpec("g", priority=Priority.medium, algorithm=Algorithm.greedy),
    ]
    if strict_on is not None:
        queues.append(
            QueueSpec("s", priority=Priority.high, algorithm=Algorithm.strict, clusters=strict_on)
        )
    if backfill_on is not None:
        queues.append(
            QueueSpec(
                "u", priority=Priority.high, algorithm=Algorithm.backfill, clusters=backfill_on
            )
        )
    s = Scheduler(clusters, queues, incremental=incremental)
    s.submit(ActionSpec("FA", "fill-a", (NODE,), submit=0.0, seq=0, estimate=1000.0), 0.0)
    s.submit(ActionSpec("FB", "fill-b", (NODE,), submit=0.0, seq=1, estimate=100.0), 0.0)
    log: list[Any] = [s.schedule(0.0)]
    seq = 10
    if strict_on is not None:
        s.submit(ActionSpec("G", "s", replicas_demand(NODE, 2), submit=1.0, seq=seq), 1.0)
        seq += 1
    if backfill_on is not None:
        s.submit(
            ActionSpec("H", "u", replicas_demand(NODE, 2), submit=1.0, seq=seq, estimate=10.0),
            1.0,
        )
        seq += 1
    s.submit(ActionSpec("L", "g", (NODE,), submit=2.0, seq=seq, estimate=1000.0), 2.0)
    s.submit(ActionSpec("S", "g", (NODE,), submit=2.0, seq=seq + 1, estimate=10.0), 2.0)
    log.append(s.schedule(2.0))
    log.append(_why(s))
    if strict_on is not None:
        s.cancel("G", 3.0)
    log.append(s.schedule(3.0))
    log.append(_why(s))
    return log


@pytest.mark.parametrize(("strict_on", "backfill_on", "reasons", "first", "then"), WALK_CASES)
def test_the_walk_past_held_clusters_matches_the_plain_loop(
    strict_on: tuple[str, ...] | None,
    backfill_on: tuple[str, ...] | None,
    reasons: dict[str, list[str]],
    first: list[str],
    then: list[str],
) -> None:
    fast = _walk_run(strict_on, backfill_on, True)
    assert fast == _walk_run(strict_on, backfill_on, False)
    got = {i: [str(r) for r in rs] for i, _, rs in fast[2]}
    assert {k: got[k] for k in reasons} == reasons
    assert sorted(a.action_id for a in fast[1]) == first
    assert sorted(a.action_id for a in fast[3]) == then


# --- a small copy of the benchmark's fleet -------------------------------------------


SHAPES = [
    Pod(cpu=32_000, memory=128 * GI),
    Pod(cpu=96_000, memory=1024 * GI, gpu=8, gpu_type="H100"),
    Pod(cpu=64_000, memory=1024 * GI),
]
DEMANDS: list[tuple[Pod, ...]] = [
    (Pod(cpu=2_000, memory=8 * GI),),
    (Pod(cpu=8_000, memory=64 * GI, gpu=1, gpu_type="H100"),),
    replicas_demand(Pod(cpu=32_000, memory=256 * GI, gpu=8, gpu_type="H100"), 2),
    (Pod(cpu=16_000, memory=512 * GI),),
    (Pod(cpu=30_000, memory=100 * GI),),
]


def _fleet(
    seed: int, hold: bool = False
) -> tuple[list[ClusterSpec], list[QueueSpec], list[ActionSpec]]:
    """``hold``: a strict queue first in every pass, whose gangs hold every cluster
    until one of them starts (the benchmark's fleet, where every cluster is held)."""
    rng = random.Random(seed)
    n_cl = rng.randint(4, 9)
    names = [f"c{i}" for i in range(n_cl)]
    clusters = [
        ClusterSpec(
            n, tuple(NodeGroup(f"g{j}", rng.randint(1, 2), s) for j, s in enumerate(SHAPES))
        )
        for n in names
    ]
    queues: list[QueueSpec] = []
    actions: list[ActionSpec] = []
    seq = 0
    for c in clusters:
        # A pinned filler per cluster takes every node, largest shapes first.
        qn = f"fill-{c.name}"
        queues.append(
            QueueSpec(
                qn, priority=Priority.critical, algorithm=Algorithm.greedy, clusters=(c.name,)
            )
        )
        for g in sorted(c.node_groups, key=lambda g: (-g.shape.gpu, -g.shape.memory)):
            for _ in range(g.count):
                seq += 1
                est = rng.choice([None, 20.0, 200.0, 2000.0]) if rng.random() < 0.5 else 2000.0
                actions.append(
                    ActionSpec(f"f{seq}", qn, (g.shape,), submit=0.0, seq=seq, estimate=est)
                )
    for k in range(rng.randint(6, 12)):
        sel = None
        if rng.random() < 0.4:
            sel = tuple(sorted(rng.sample(names, rng.randint(1, n_cl))))
        queues.append(
            QueueSpec(
                f"q{k:02d}",
                priority=Priority(rng.randint(0, 4)),
                algorithm=ALGOS[k % 4] if k < 4 else rng.choice(ALGOS),
                action_concurrency=rng.choice([None, None, 3]),
                clusters=sel,
            )
        )
    n_q = len(queues) - n_cl
    if hold:
        queues.append(QueueSpec("hold", priority=Priority.critical, algorithm=Algorithm.strict))
        for k in range(3):
            seq += 1
            gang = replicas_demand(SHAPES[0], rng.randint(2, 4))
            actions.append(ActionSpec(f"h{k}", "hold", gang, submit=0.0, seq=seq, estimate=50.0))
    for _ in range(rng.randint(40, 120)):
        seq += 1
        actions.append(_pending(rng, seq, n_q, 0.0))
    return clusters, queues, actions


def _pending(rng: random.Random, seq: int, n_q: int, now: float) -> ActionSpec:
    return ActionSpec(
        f"a{seq}",
        f"q{rng.randrange(n_q):02d}",
        rng.choice(DEMANDS),
        run=f"r{rng.randint(0, 5)}",
        task=f"t{rng.randint(0, 3)}",
        submit=now,
        seq=seq,
        estimate=rng.choice([None, 10.0, 60.0, 600.0, 3600.0]),
    )


def _drive_fleet(seed: int, incremental: bool, hold: bool = False) -> list[Any]:
    clusters, queues, actions = _fleet(seed, hold)
    rng = random.Random(seed * 7 + 1)
    s = Scheduler(clusters, queues, incremental=incremental)
    log: list[Any] = []
    for a in actions:
        log.append(("submit", a.id, s.submit(a, 0.0)))
    running = [a.action_id for a in s.schedule(0.0)]
    log.append(("why", _why(s)))
    now = 0.0
    seq = 10_000
    n_q = len(queues) - len(clusters) - hold
    for step in range(100):
        now += rng.choice([0.0, 1.0, 5.0, 30.0, 300.0])
        roll = rng.random()
        if roll < 0.5 and running:
            s.finish(running.pop(rng.randrange(len(running))), now, record=rng.random() < 0.8)
        elif roll < 0.65:
            for _ in range(rng.randint(2, 8)):
                if running:
                    s.finish(running.pop(rng.randrange(len(running))), now)
        elif roll < 0.9:
            seq += 1
            log.append(("submit", seq, s.submit(_pending(rng, seq, n_q, now), now)))
        else:
            s.invalidate()
        if step == 50:
            s = Scheduler.from_snapshot(s.to_snapshot())
            s.incremental = incremental
        adm = s.schedule(now)
        running.extend(a.action_id for a in adm)
        log.append(("adm", now, adm))
        if step % 5 == 0 or adm:
            log.append(("why", _why(s)))
    log.append(("why", _why(s)))
    return log


@pytest.mark.parametrize("seed", range(80))
def test_a_small_benchmark_fleet_matches_the_plain_loop(seed: int) -> None:
    assert _drive_fleet(700000 + seed, True) == _drive_fleet(700000 + seed, False)


@pytest.mark.parametrize("seed", range(60))
def test_a_small_benchmark_fleet_held_everywhere_matches_the_plain_loop(seed: int) -> None:
    # Reserving heads find room on a freed node of a held cluster, and the first fit
    # after them with no room reserves instead.
    assert _drive_fleet(710000 + seed, True, True) == _drive_fleet(710000 + seed, False, True)


# --- a re-check asks each estimate once --------------------------------------------
#
# Two actions of one demand wait on a full cluster behind a backfill head's reservation
# there, their fits alike; neither declares an estimate, and their tasks' histories
# differ (a short and a long run). When room comes back, the re-check must ask the
# reservation about each history: the short one backfills, the long one does not.


def _histories_run(incremental: bool) -> list[Any]:
    clusters = [
        ClusterSpec("x", (NodeGroup("g", 3, NODE),)),
        ClusterSpec("h", (NodeGroup("g", 1, NODE),)),
    ]
    queues = [
        QueueSpec("fill", priority=Priority.critical, clusters=("x",)),
        QueueSpec("hist", priority=Priority.critical, clusters=("h",)),
        QueueSpec("u", priority=Priority.high, algorithm=Algorithm.backfill, clusters=("x",)),
        QueueSpec("g", priority=Priority.medium, algorithm=Algorithm.greedy, clusters=("x",)),
    ]
    s = Scheduler(clusters, queues, incremental=incremental)
    for i, est in enumerate([40_000.0, 50_000.0, 60_000.0]):
        s.submit(ActionSpec(f"F{i}", "fill", (NODE,), submit=0.0, seq=i, estimate=est), 0.0)
    s.submit(ActionSpec("hA", "hist", (NODE,), task="tA", submit=0.0, seq=5), 0.0)
    log: list[Any] = [s.schedule(0.0)]
    s.finish("hA", 5.0)  # task tA: 5 s
    s.submit(ActionSpec("hB", "hist", (NODE,), task="tB", submit=5.0, seq=6), 5.0)
    log.append(s.schedule(5.0))
    s.finish("hB", 30_005.0)  # task tB: 30,000 s
    s.submit(
        ActionSpec("H", "u", replicas_demand(NODE, 2), submit=30_006.0, seq=7, estimate=10.0),
        30_006.0,
    )
    # B first: its answer (not allowed) must not stand for A's.
    s.submit(ActionSpec("B", "g", (NODE,), task="tB", submit=30_006.0, seq=8), 30_006.0)
    s.submit(ActionSpec("A", "g", (NODE,), task="tA", submit=30_006.0, seq=9), 30_006.0)
    log.append(s.schedule(30_006.0))  # H reserves x at 50,000; A and B find no room
    log.append(_why(s))
    s.finish("F2", 30_007.0, record=False)
    log.append(s.schedule(30_007.0))  # A ends by 50,000: it starts; B would not
    log.append(_why(s))
    return log


def test_a_recheck_asks_the_reservation_about_each_history() -> None:
    fast = _histories_run(True)
    assert fast == _histories_run(False)
    assert [a.action_id for a in fast[4]] == ["A"]
    # B was turned away by the reservation, then found no room (A took the node).
    assert {i: [str(r) for r in rs] for i, _, rs in fast[5]}["B"] == [
        "NoClusterCapacity",
        "BackfillWindow",
    ]


# --- a reserving head finds room where it is held -----------------------------------
#
# Clusters a and b, two nodes each, all taken by fillers (a's end at 1000, b's at 500).
# A strict queue's gang of two nodes holds the clusters it is pinned to. A reserving
# queue waits below it: H (one node) heads it and reserves; a gang X of two nodes and a
# one-node S follow. A filler on a ends: H now has room on a. Held there, H no longer
# reserves (it is turned away, HeldForGang), and the first action after it that finds no
# room at all (X) reserves instead, without a visit of the queue (``_new_head``). Not
# held there, H starts (a visit). Then the strict gang is cancelled and a filler on b
# ends: the records left by the re-check must answer as the plain loop does. ``skipped``:
# the queues skipped in the passes after the first filler ends (H starting makes two).

HEAD_CASES = [
    pytest.param(("a", "b"), Algorithm.backfill, 2, [], 2,
                 {"H": ["NoClusterCapacity", "HeldForGang"], "X0": ["NoClusterCapacity"],
                  "X1": ["NoClusterCapacity"], "S": ["NoClusterCapacity", "HeldForGang"]},
                 id="held-where-it-has-room-the-first-gang-after-it-reserves-instead"),
    pytest.param(("a", "b"), Algorithm.easy, 1, [], 2,
                 {"H": ["NoClusterCapacity", "HeldForGang"], "X0": ["NoClusterCapacity"],
                  "S": ["NoClusterCapacity", "HeldForGang"]},
                 id="easy-held-where-it-has-room-the-gang-after-it-reserves-instead"),
    pytest.param(("a", "b"), Algorithm.backfill, 0, [], 1,
                 {"H": ["NoClusterCapacity", "HeldForGang"],
                  "S": ["NoClusterCapacity", "HeldForGang"]},
                 id="held-where-it-has-room-no-action-left-to-reserve-a-visit"),
    pytest.param(("b",), Algorithm.backfill, 1, ["H"], 3,
                 {"H": ["NoClusterCapacity"], "X0": ["NoClusterCapacity"],
                  "S": ["NoClusterCapacity"]},
                 id="room-where-nothing-holds-the-head-starts-a-visit"),
]  # fmt: skip


def _head_run(
    strict_on: tuple[str, ...], algo: Algorithm, gang: int, incremental: bool
) -> tuple[list[Any], int]:
    clusters = [ClusterSpec(n, (NodeGroup("g", 2, NODE),)) for n in ("a", "b")]
    queues = [
        QueueSpec("fill-a", priority=Priority.critical, clusters=("a",)),
        QueueSpec("fill-b", priority=Priority.critical, clusters=("b",)),
        QueueSpec("s", priority=Priority.high, algorithm=Algorithm.strict, clusters=strict_on),
        QueueSpec("u", priority=Priority.medium, algorithm=algo),
    ]
    s = Scheduler(clusters, queues, incremental=incremental)
    for i, (q, est) in enumerate([("a", 1000.0), ("a", 1000.0), ("b", 500.0), ("b", 500.0)]):
        s.submit(ActionSpec(f"F{i}", f"fill-{q}", (NODE,), submit=0.0, seq=i, estimate=est), 0.0)
    log: list[Any] = [s.schedule(0.0)]
    s.submit(ActionSpec("G", "s", replicas_demand(NODE, 2), submit=1.0, seq=10), 1.0)
    s.submit(ActionSpec("H", "u", (NODE,), submit=1.0, seq=11, estimate=10.0), 1.0)
    for k in range(gang):
        # Gangs of one demand (estimates apart: each makes a fit): the first reserves.
        s.submit(
            ActionSpec(
                f"X{k}",
                "u",
                replicas_demand(NODE, 2),
                submit=1.0,
                seq=12 + k,
                estimate=10.0 + 10 * k,
            ),
            1.0,
        )
    s.submit(ActionSpec("S", "u", (NODE,), submit=1.0, seq=20, estimate=10.0), 1.0)
    log.append(s.schedule(1.0))
    s.finish("F0", 2.0)
    skipped = s.skipped_visits
    log.append(s.schedule(2.0))
    skipped = s.skipped_visits - skipped
    log.append(_why(s))
    log.append(_effects(s))
    s.cancel("G", 3.0)
    log.append(s.schedule(3.0))
    log.append(_why(s))
    s.finish("F2", 4.0)
    log.append(s.schedule(4.0))
    log.append(_why(s))
    log.append(_effects(s))
    return log, skipped


def _effects(s: Scheduler) -> list[Any]:
    """The holds and reservations the last pass made, in order (who, where, when)."""
    return effects(s)


@pytest.mark.parametrize(("strict_on", "algo", "gang", "started", "skipped", "reasons"), HEAD_CASES)
def test_a_reserving_head_with_room_where_held_matches_the_plain_loop(
    strict_on: tuple[str, ...],
    algo: Algorithm,
    gang: int,
    started: list[str],
    skipped: int,
    reasons: dict[str, list[str]],
) -> None:
    fast, n_skipped = _head_run(strict_on, algo, gang, True)
    assert fast == _head_run(strict_on, algo, gang, False)[0]
    assert sorted(a.action_id for a in fast[2]) == started
    got = {i: [str(r) for r in rs] for i, _, rs in fast[3]}
    assert {k: got[k] for k in reasons} == reasons
    # The strict queue is skipped; the reserving one too where the shortcut holds.
    assert n_skipped == skipped


# The old head's reservation was read where nothing holds: cluster a has two big nodes,
# b two with more CPU and less memory (first in placement order). H (one NODE) reserves
# b (its filler ends first); the gang X of two big nodes fits only on a; S (a small
# long one) has room on b beside a filler there, and is turned away by H's reservation.
# A big filler on a ends: H has room on a, held by the strict gang there, and reserves
# nothing; X reserves a. S then starts on b: the re-check cannot tell that (a cluster
# with room is not held), so it visits.


def _read_run(incremental: bool) -> list[Any]:
    big = Pod(cpu=32_000, memory=128 * GI)
    wide = Pod(cpu=64_000, memory=64 * GI)
    half = Pod(cpu=8_000, memory=32 * GI)
    clusters = [
        ClusterSpec("a", (NodeGroup("g", 2, big),)),
        ClusterSpec("b", (NodeGroup("g", 2, wide),)),
    ]
    queues = [
        QueueSpec("fill-a", priority=Priority.critical, clusters=("a",)),
        QueueSpec("fill-b", priority=Priority.critical, clusters=("b",)),
        QueueSpec("s", priority=Priority.high, algorithm=Algorithm.strict, clusters=("a",)),
        QueueSpec("u", priority=Priority.medium, algorithm=Algorithm.backfill),
    ]
    s = Scheduler(clusters, queues, incremental=incremental)
    fill = [("a", big, 1000.0), ("a", big, 1000.0), ("b", wide, 500.0), ("b", half, 600.0)]
    for i, (q, pod, est) in enumerate(fill):
        s.submit(ActionSpec(f"F{i}", f"fill-{q}", (pod,), submit=0.0, seq=i, estimate=est), 0.0)
    log: list[Any] = [s.schedule(0.0)]
    s.submit(ActionSpec("G", "s", replicas_demand(big, 2), submit=1.0, seq=10), 1.0)
    s.submit(ActionSpec("H", "u", (NODE,), submit=1.0, seq=11, estimate=10.0), 1.0)
    s.submit(ActionSpec("X", "u", replicas_demand(big, 2), submit=1.0, seq=12, estimate=10.0), 1.0)
    s.submit(ActionSpec("S", "u", (half,), submit=1.0, seq=13, estimate=10_000.0), 1.0)
    log.append(s.schedule(1.0))
    log.append(_why(s))
    s.finish("F0", 2.0)
    log.append(s.schedule(2.0))
    log.append(_why(s))
    log.append(_effects(s))
    return log


def test_a_new_head_where_the_old_reservation_was_read_unheld_visits() -> None:
    fast = _read_run(True)
    assert fast == _read_run(False)
    got = {i: [str(r) for r in rs] for i, _, rs in fast[2]}
    assert got["S"] == ["BackfillWindow"]
    assert [a.action_id for a in fast[3]] == ["S"]


# --- the first cluster moves up -----------------------------------------------------
#
# Clusters x and y, two nodes each, partly taken by fillers: x has more free CPU, so it
# comes first in placement order. A strict gang holds x, a backfill gang reserves y. A
# greedy one-node action L, long, is turned away at both: held at x first
# (HeldForGang). A small filler on x ends (the re-check keeps x's place in the order),
# then the others of the table: when x frees capacity it only moves up, and stays first
# unless a cluster that changed with it moved further (the re-check then compares the
# changed ones only); y overtaking gives BackfillWindow.

FIRST_CASES = [
    pytest.param(["X2"], ["HeldForGang"], id="the-first-moves-up-and-stays-first"),
    pytest.param(["X2", "Y2"], ["HeldForGang", "BackfillWindow"],
                 id="the-first-moves-up-another-changed-one-moves-past-it"),
    pytest.param(["Y2"], ["HeldForGang", "BackfillWindow"],
                 id="the-first-stays-another-moves-past-it"),
    pytest.param(["X1"], ["HeldForGang"], id="the-first-frees-a-whole-node-and-stays-first"),
]  # fmt: skip


def _first_run(done: list[str], incremental: bool) -> list[Any]:
    clusters = [ClusterSpec(n, (NodeGroup("g", 2, NODE),)) for n in ("x", "y")]
    queues = [
        QueueSpec("fill-x", priority=Priority.critical, clusters=("x",)),
        QueueSpec("fill-y", priority=Priority.critical, clusters=("y",)),
        QueueSpec("s", priority=Priority.high, algorithm=Algorithm.strict, clusters=("x",)),
        QueueSpec("u", priority=Priority.high, algorithm=Algorithm.backfill, clusters=("y",)),
        QueueSpec("g", priority=Priority.medium, algorithm=Algorithm.greedy),
    ]
    s = Scheduler(clusters, queues, incremental=incremental)
    fill = [
        ("X1", "x", 16_000),
        ("X2", "x", 8_000),
        ("X3", "x", 1_000),
        ("Y1", "y", 12_000),
        ("Y2", "y", 16_000),
    ]
    for i, (name, on, cpu) in enumerate(fill):
        pod = Pod(cpu=cpu, memory=8 * GI)
        s.submit(ActionSpec(name, f"fill-{on}", (pod,), submit=0.0, seq=i, estimate=1000.0), 0.0)
    log: list[Any] = [s.schedule(0.0)]
    log.append(sorted((a.action_id, a.cluster) for a in log[0]))
    s.submit(ActionSpec("G", "s", replicas_demand(NODE, 2), submit=1.0, seq=10), 1.0)
    s.submit(ActionSpec("H", "u", replicas_demand(NODE, 2), submit=1.0, seq=11, estimate=10.0), 1.0)
    small = Pod(cpu=2_000, memory=8 * GI)
    s.submit(ActionSpec("L", "g", (small,), submit=1.0, seq=12, estimate=5000.0), 1.0)
    log.append(s.schedule(1.0))
    # x moves up a little: a re-check finds x first again, and keeps its place.
    s.finish("X3", 1.5)
    log.append(s.schedule(1.5))
    for a in done:
        s.finish(a, 2.0)
    log.append(s.schedule(2.0))
    log.append(_why(s))
    return log


@pytest.mark.parametrize(("done", "reasons"), FIRST_CASES)
def test_the_first_cluster_moving_up_matches_the_plain_loop(
    done: list[str], reasons: list[str]
) -> None:
    fast = _first_run(done, True)
    assert fast == _first_run(done, False)
    # The fillers landed as the narrative says (x: the X ones, y: the Y ones).
    assert [c for _, c in fast[1]] == ["x", "x", "x", "y", "y"]
    assert fast[3] == fast[4] == []
    got = {i: [str(r) for r in rs] for i, _, rs in fast[5]}
    assert got["L"] == reasons
