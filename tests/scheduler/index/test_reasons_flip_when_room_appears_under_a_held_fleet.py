"""A demand finds room under a held fleet: its fits' reasons flip without a full check.

When every cluster a queue may use is held from above, a visit reads capacity only as
whether each demand has room anywhere. A completion that gives a demand
its first room anywhere moves the answer of every fit of it from ``NoClusterCapacity``
to ``HeldForGang``, in every queue below the hold: the core changes those reasons in
place (``index.view.counts``' ``held_flips``) (a strict head's holds go, a reserving head that now has room gives its
reservation to the next action with none) instead of checking each queue in full.

Pinned down here, event by event, against a full pass on a copy (``invalidate``) and
against ``Scheduler(incremental=False)``: same admissions, same reasons.

Six clusters ``c0`` to ``c5``, each of two CPU nodes and two GPU nodes, every node taken
by one action of a critical queue pinned to its cluster. Queue ``hold`` (high, strict)
has a head that wants both GPU nodes of one cluster: it holds all six. Below it, queues
of every algorithm, some pinned to part of the fleet, wait with small, GPU, half-node
and both-GPU-nodes demands, none of which has room at first.
"""

from __future__ import annotations

import copy
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
from headway.scheduler.core import Admitted
from headway.scheduler.index.view import counts, holds
from headway.scheduler.model import replicas_demand
from headway.scheduler.resources import Pod

from ..helpers import apply_op, submitter

GI = 2**30
CPU_NODE = Pod(cpu=16_000, memory=64 * GI)
GPU_NODE = Pod(cpu=32_000, memory=256 * GI, gpu=8, gpu_type="H100")
SMALL = (Pod(cpu=2_000, memory=8 * GI),)
GPU1 = (Pod(cpu=4_000, memory=16 * GI, gpu=1, gpu_type="H100"),)
HALF = (Pod(cpu=8_000, memory=32 * GI),)
BOTH_GPU = replicas_demand(GPU_NODE, 2)
N_CLUSTERS = 6
ALGOS = [Algorithm.greedy, Algorithm.strict, Algorithm.backfill, Algorithm.easy]
SELECTORS: list[tuple[str, ...] | None] = [None, None, ("c0", "c1", "c2"), ("c3", "c4")]
# The demands each queue below the hold waits with, in queue order: a reserving queue's
# head is the GPU one until it finds room, then the small one, then the gang.
DEMANDS = [GPU1, SMALL, HALF, BOTH_GPU, SMALL, GPU1, HALF, SMALL, BOTH_GPU, GPU1]

Op = tuple[Any, ...]


def _build(incremental: bool) -> Scheduler:
    clusters = [
        ClusterSpec(f"c{i}", (NodeGroup("cpu", 2, CPU_NODE), NodeGroup("gpu", 2, GPU_NODE)))
        for i in range(N_CLUSTERS)
    ]
    queues = [
        *(
            QueueSpec(
                f"fill{i}",
                priority=Priority.critical,
                algorithm=Algorithm.greedy,
                clusters=(f"c{i}",),
            )
            for i in range(N_CLUSTERS)
        ),
        QueueSpec("hold", priority=Priority.high, algorithm=Algorithm.strict),
        *(
            QueueSpec(
                f"q{k}",
                priority=Priority.medium if k < 6 else Priority.low,
                algorithm=ALGOS[k % 4],
                clusters=SELECTORS[(k // 2) % 4],
            )
            for k in range(8)
        ),
    ]
    s = Scheduler(clusters, queues, incremental=incremental)
    add = submitter(s)
    for i in range(N_CLUSTERS):
        # GPU nodes first, so that each action lands on a node of its own shape.
        for j in range(2):
            add(f"fill{i}", f"G{i}{j}", (GPU_NODE,), 100.0 + 10 * i + j)
        for j in range(2):
            add(f"fill{i}", f"C{i}{j}", (CPU_NODE,), 50.0 + 10 * i + j)
    add("hold", "H", BOTH_GPU, 500.0)
    for k in range(8):
        for n, pods in enumerate(DEMANDS):
            add(f"q{k}", f"Q{k}.{n}", pods, [30.0, 300.0, 3000.0][n % 3])
    return s


# Each op is followed by a pass: ("finish" | "cancel", action, t) or ("submit", queue,
# action, pods, t).
OPS: list[Op] = [
    ("finish", "C11", 1.0),  # a CPU node on c1: SMALL and HALF find room, past the heads
    ("finish", "G30", 2.0),  # a GPU node on c3: GPU1 finds room, the heads move on
    ("finish", "C31", 3.0),
    ("submit", "q2", "X1", SMALL, 4.0),
    ("finish", "C50", 5.0),  # room on c5: only the fleet-wide queues see it
    ("finish", "G31", 6.0),  # both GPU nodes of c3: the hold's head starts there
    ("finish", "G00", 7.0),
    ("cancel", "Q2.1", 8.0),
    ("finish", "C00", 9.0),
    ("finish", "G01", 10.0),
    ("submit", "hold", "H2", BOTH_GPU, 11.0),
    ("finish", "C20", 12.0),
    ("finish", "G20", 13.0),
]


def _state(s: Scheduler) -> list[Any]:
    return sorted((a.id, a.state, a.cluster, a.last, tuple(a.reasons)) for a in s.actions.values())


def _replayed(s: Scheduler) -> dict[str, Any]:
    """What a queue found unchanged makes again in the next pass, per queue: its holds,
    its head and its reservation (where, until when, for whom)."""
    return {
        n: (q.last_holds, q.blocked_head, [(c, r.time, r.head) for c, r in q.last_resv])
        for n, q in s.queues.items()
    }


def _adm(adm: list[Admitted]) -> list[Any]:
    return sorted((x.action_id, x.cluster, x.nodes, x.reasons) for x in adm)


def _apply(s: Scheduler, op: Op, seq: int) -> float:
    return apply_op(s, op, seq, estimate=60.0)


def test_the_setup_holds_the_fleet_and_nothing_below_finds_room() -> None:
    s = _build(True)
    assert len(s.schedule(0.0)) == 4 * N_CLUSTERS
    assert s.reason("H") == "NoClusterCapacity"
    assert sorted(holds(s)) == [f"c{i}" for i in range(N_CLUSTERS)]
    for k in range(8):
        assert s.reason(f"Q{k}.0") == "NoClusterCapacity"


def test_flips_under_a_held_fleet_decide_as_a_full_pass() -> None:
    """After every event: the incremental pass (reasons flipped in place) against a full pass
    on a copy taken before it; and what each queue would make again when next found
    unchanged (a strict head that found room holds nothing, a reserving head that did
    reserves no more)."""
    s = _build(True)
    s.schedule(0.0)
    before = counts(s)
    for i, op in enumerate(OPS):
        t = _apply(s, op, 1000 + i)
        full = copy.deepcopy(s)
        full.invalidate()
        assert _adm(s.schedule(t)) == _adm(full.schedule(t)), op
        assert _state(s) == _state(full), op
        assert _replayed(s) == _replayed(full), op
    # The mechanism was used, past a reserving head and where one went.
    after = counts(s)
    flips = after.held_flips - before.held_flips
    assert flips > after.held_flips_head_went - before.held_flips_head_went > 0


def test_flips_under_a_held_fleet_decide_as_the_plain_loop() -> None:
    inc, plain = _build(True), _build(False)
    assert _adm(inc.schedule(0.0)) == _adm(plain.schedule(0.0))
    for i, op in enumerate(OPS):
        t = _apply(inc, op, 1000 + i)
        _apply(plain, op, 1000 + i)
        assert _adm(inc.schedule(t)) == _adm(plain.schedule(t)), op
        assert _state(inc) == _state(plain), op


def _due(s: Scheduler) -> int:
    """How many flips wait on their queues, not yet given to the classes' members."""
    return sum(len(q.due) // 3 for q in s.queues.values())


@pytest.mark.parametrize("read_at", [None, 0, 1, 2, 4, 7])
def test_flips_given_late_decide_as_the_plain_loop(read_at: int | None) -> None:
    """A flip under a held fleet changes its fits at once and their classes' members
    only when something next reads or changes them (a queue's ``due`` list): here nothing reads
    the reasons between events (but once, after event ``read_at``), so flips wait across
    completions, submits into their queues and a cancel, and are given late: every
    member ends with the same reason, and the same reasons in the same order, as in the
    plain loop, and a member that joined its class after a flip does not take it."""
    inc, plain = _build(True), _build(False)
    assert _adm(inc.schedule(0.0)) == _adm(plain.schedule(0.0))
    waited = 0
    for i, op in enumerate(OPS):
        t = _apply(inc, op, 1000 + i)
        _apply(plain, op, 1000 + i)
        assert _adm(inc.schedule(t)) == _adm(plain.schedule(t)), op
        waited = max(waited, _due(inc))
        if i == read_at:
            assert _state(inc) == _state(plain), op
            assert _due(inc) == 0  # reading a member gives its queue's flips
    assert waited > 0, "some flips waited for a read"
    assert _state(inc) == _state(plain)


@pytest.mark.parametrize(
    "op",
    [
        ("cancel", "Q2.1", 2.0),  # the flipped fit's own action leaves its class
        ("cancel", "Q3.6", 2.0),  # one that took its answer leaves
        ("submit", "q0", "Y", SMALL, 2.0),  # one joins a class with a flip waiting
        ("submit", "q1", "Y", HALF, 2.0),
    ],
)
def test_a_class_changed_while_its_flips_wait(op: Op) -> None:
    """Right after a flip (nothing read), an action leaves or joins a class whose
    flips wait: they are given first, to the members they found."""
    inc, plain = _build(True), _build(False)
    for s in (inc, plain):
        s.schedule(0.0)
        _apply(s, OPS[0], 1000)
    assert _adm(inc.schedule(1.0)) == _adm(plain.schedule(1.0))
    q = inc.queues[op[1] if op[0] == "submit" else f"q{op[1][1]}"]
    assert q.due, "a flip waits on the queue"
    for s in (inc, plain):
        _apply(s, op, 1001)
    assert _adm(inc.schedule(2.0)) == _adm(plain.schedule(2.0))
    _apply(inc, OPS[1], 1002)
    _apply(plain, OPS[1], 1002)
    assert _adm(inc.schedule(3.0)) == _adm(plain.schedule(3.0))
    assert _state(inc) == _state(plain)
