"""A class's answer given without making the fit again.

After an admission, the plain walk makes every class's fit again. An admission takes
capacity on one cluster and moves the gates' counters, nothing else: a class whose fit
found no room on that cluster, and whose gates answer as before, keeps its answer.

While reservations stand, classes differ by estimate too, and each makes its own fit.
An action's estimate enters its fit only where a reservation is read: a fit that read
none is the answer of every class alike but for the estimate.

These tests count the fits made (``index.view.counts``' ``fits``), check the answers against the plain loop where either
shortcut would be wrong (the admission took the room the class's fit had found; a gate
closed; the fit read a reservation), and check that the records a visit keeps
are the ones the walk made without the shortcuts.
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
    core,
)
from headway.scheduler.index.view import counts, reservations
from headway.scheduler.resources import Pod

GI = 2**30
CPU_NODE = Pod(cpu=64_000, memory=256 * GI)
GPU_NODE = Pod(cpu=32_000, memory=128 * GI, gpu=4, gpu_type="H200")
SMALL = Pod(cpu=4_000, memory=8 * GI)
GPU = Pod(cpu=4_000, memory=8 * GI, gpu=1, gpu_type="H200")


class _NoCarry(Scheduler):
    """The walk as it was: every fit made again after an admission, and by each class.
    (The one reach into private names left here: the core has no public switch for
    these two shortcuts, and adding one would be a change of behaviour, not a read.)"""

    _SHARE_ALIKE = False

    def _carry(self, *args: Any) -> None:
        return None


def _fleet(cls: type[Scheduler] = Scheduler, **q: Any) -> Scheduler:
    """A CPU cluster with room for eight ``SMALL``, a GPU cluster taken by a filler,
    and queue ``q`` (greedy unless told) below the filler's queue."""
    s = cls(
        [
            ClusterSpec("cpu", (NodeGroup("n", 1, CPU_NODE),)),
            ClusterSpec("gpu", (NodeGroup("n", 1, GPU_NODE),)),
        ],
        [
            QueueSpec("fill", priority=Priority.critical, algorithm=Algorithm.greedy),
            QueueSpec("q", priority=Priority.medium, **{"algorithm": Algorithm.greedy, **q}),
        ],
    )
    assert s.submit(ActionSpec("f", "fill", (GPU_NODE,), seq=0, estimate=1e6), 0.0) is None
    assert len(s.schedule(0.0)) == 1
    return s


def _interleaved(s: Scheduler, n: int) -> None:
    """``g0, s0, g1, s1, ...``: GPU actions (no room anywhere) between small ones."""
    for k in range(n):
        for kind, pod in (("g", GPU), ("s", SMALL)):
            a = ActionSpec(f"{kind}{k}", "q", (pod,), submit=1.0, seq=10 + 2 * k + (kind == "s"))
            assert s.submit(a, 1.0) is None


def test_a_class_without_room_is_not_fitted_again_after_each_admission() -> None:
    """Each small action admitted takes room on ``cpu``, where the GPU class found none:
    its answer stands, and its fit is made once, not once per admission."""
    s = _fleet()
    _interleaved(s, 8)
    before = counts(s).fits
    adm = s.schedule(1.0)
    assert sorted(a.action_id for a in adm) == sorted(f"s{k}" for k in range(8))
    # One fit per small action admitted, and one for the whole GPU class.
    assert counts(s).fits - before == 1 + 8
    assert {s.reason(f"g{k}") for k in range(8)} == {"NoClusterCapacity"}


def test_the_records_are_the_plain_walks() -> None:
    """The records a visit keeps of its fits (how each ended, and the actions
    of every fit the walk would have made) are the same as without carrying."""
    got = []
    for cls in (Scheduler, _NoCarry):
        s = _fleet(cls)
        _interleaved(s, 8)
        s.schedule(1.0)
        q = s.queues["q"]
        assert q.mixed
        got.append(
            [
                (e.dkey, e.blocked, e.first, str(e.reason), [a.id for a in e.acts], e.blind)
                for e in q.evals
            ]
        )
    assert got[0] == got[1]
    assert [a for *_, acts, _b in got[0] for a in acts] == [f"g{k}" for k in range(8)]


def _reserving(s: Scheduler) -> Scheduler:
    """``_fleet``'s scheduler with a reservation from above: queue ``up``'s head needs a
    whole GPU node, which the filler holds, and reserves it. Then GPU actions of queue
    ``q`` in three estimates (three classes), no room for any."""
    s.upsert_queue(QueueSpec("up", priority=Priority.high, algorithm=Algorithm.backfill))
    assert s.submit(ActionSpec("h", "up", (GPU_NODE,), seq=1, estimate=10.0), 0.0) is None
    for k in range(12):
        est = (5.0, 50.0, 500.0)[k % 3]
        a = ActionSpec(f"g{k}", "q", (GPU,), submit=1.0, seq=10 + k, estimate=est)
        assert s.submit(a, 1.0) is None
    return s


def test_classes_alike_but_for_the_estimate_share_a_fit_that_read_no_reservation() -> None:
    """No room for the GPU actions anywhere: no reservation read, so the first class's
    answer is the other two's, without a fit of their own."""
    s = _reserving(_fleet())
    before = counts(s).fits
    assert s.schedule(1.0) == []
    assert reservations(s)
    # One fit for the head of ``up`` (which reserves), one for the first GPU class.
    assert counts(s).fits - before == 1 + 1
    assert {s.reason(f"g{k}") for k in range(12)} == {"NoClusterCapacity"}


def test_shared_answers_are_recorded_as_the_fits_were() -> None:
    """The record of the GPU actions' fit names one action per class, as when each class
    made its fit."""
    got = []
    for cls in (Scheduler, _NoCarry):
        s = _reserving(_fleet(cls))
        s.schedule(1.0)
        got.append([(str(e.reason), [a.id for a in e.acts], e.blind) for e in s.queues["q"].evals])
    assert got[0] == got[1] == [("NoClusterCapacity", ["g0", "g1", "g2"], False)]


def _plain_reasons(build: Any) -> list[tuple[str, tuple[str, ...]]]:
    """Every action's reasons after a cycle from ``build()``'s scheduler: the same with
    the shortcuts as with the plain loop."""
    out = []
    for inc in (True, False):
        old = core.INCREMENTAL
        core.INCREMENTAL = inc
        try:
            s = build()
        finally:
            core.INCREMENTAL = old
        s.schedule(1.0)
        out.append(sorted((a.id, tuple(a.reasons)) for a in s.actions.values()))
    assert out[0] == out[1]
    return out[0]


def test_an_admission_that_takes_the_room_a_fit_found_is_not_carried() -> None:
    """A reservation from above turns long actions away on the one cluster with room
    (``BackfillWindow``); short ones start there under it until the room is gone. The
    long class found room on the cluster each admission took: its answer is made again,
    and becomes ``NoClusterCapacity`` once the room is gone. (The cycle's second pass
    gives every action left ``NoClusterCapacity``.)"""

    def build() -> Scheduler:
        node = Pod(cpu=16_000, memory=64 * GI)
        s = Scheduler(
            [ClusterSpec("a", (NodeGroup("n", 1, node),))],
            [
                QueueSpec("fill", priority=Priority.critical, algorithm=Algorithm.greedy),
                QueueSpec("up", priority=Priority.high, algorithm=Algorithm.backfill),
                QueueSpec("q", priority=Priority.medium, algorithm=Algorithm.greedy),
            ],
        )
        half = Pod(cpu=8_000, memory=32 * GI)
        quarter = Pod(cpu=4_000, memory=16 * GI)
        assert s.submit(ActionSpec("f", "fill", (half,), seq=0, estimate=100.0), 0.0) is None
        assert len(s.schedule(0.0)) == 1
        # Needs the whole node: reserves it for when the filler ends (t=100).
        assert (
            s.submit(ActionSpec("h", "up", (node,), submit=1.0, seq=1, estimate=50.0), 1.0) is None
        )
        for k in range(4):
            for kind, est in (("l", 1000.0), ("s", 10.0)):
                a = ActionSpec(
                    f"{kind}{k}",
                    "q",
                    (quarter,),
                    submit=1.0,
                    seq=10 + 2 * k + (kind == "s"),
                    estimate=est,
                )
                assert s.submit(a, 1.0) is None
        return s

    why = dict(_plain_reasons(build))
    assert why["l0"] == why["l1"] == ("BackfillWindow", "NoClusterCapacity")
    assert why["l2"] == why["l3"] == ("NoClusterCapacity",)
    assert why["s0"] == why["s1"] == ()


def test_an_admission_that_closes_a_gate_is_not_carried() -> None:
    """``action_concurrency`` 2: after the second admission every action's answer is
    the gate's, the GPU class's too (its fit never read ``cpu``)."""
    why = dict(_plain_reasons(lambda: _with_tail(_fleet(action_concurrency=2), 4)))
    assert [why[f"g{k}"] for k in range(4)] == [
        ("NoClusterCapacity", "ActionConcurrency"),
        ("NoClusterCapacity", "ActionConcurrency"),
        ("ActionConcurrency",),
        ("ActionConcurrency",),
    ]


def _with_tail(s: Scheduler, n: int) -> Scheduler:
    _interleaved(s, n)
    return s


def _random_fleet(seed: int, cls: type[Scheduler]) -> list[Any]:
    """Several clusters of two shapes, partly taken; queues of every algorithm with many
    actions of a few demands and estimates; passes after completions, each recording
    the admissions, every action's reasons and every queue's records."""
    rng = random.Random(seed)
    shapes = [Pod(cpu=32_000, memory=128 * GI), GPU_NODE]
    n_cl = rng.randint(2, 5)
    clusters = [
        ClusterSpec(f"c{i}", tuple(NodeGroup(f"g{j}", 2, p) for j, p in enumerate(shapes)))
        for i in range(n_cl)
    ]
    algos = [Algorithm.greedy, Algorithm.strict, Algorithm.backfill, Algorithm.easy]
    queues = [QueueSpec("fill", priority=Priority.critical, algorithm=Algorithm.greedy)]
    for k in range(rng.randint(2, 5)):
        queues.append(
            QueueSpec(
                f"q{k}",
                priority=rng.choice(list(Priority)[1:4]),
                algorithm=algos[(seed + k) % 4] if k < 4 else rng.choice(algos),
                action_concurrency=rng.choice([None, None, 3, 8]),
            )
        )
    s = cls(clusters, queues)
    seq = 0
    for _ in range(n_cl):
        for p in shapes:
            if rng.random() < 0.7:
                seq += 1
                a = ActionSpec(f"f{seq}", "fill", (p,), seq=seq, estimate=1e6)
                assert s.submit(a, 0.0) is None
    running = [a.action_id for a in s.schedule(0.0)]
    palette = [(SMALL,), (GPU,), (Pod(cpu=16_000, memory=64 * GI),), (SMALL, SMALL)]
    for _ in range(rng.randint(20, 60)):
        seq += 1
        a = ActionSpec(
            f"a{seq}",
            rng.choice(queues[1:]).name,
            rng.choice(palette),
            submit=1.0,
            seq=seq,
            estimate=rng.choice([5.0, 50.0, 5000.0]),
        )
        s.submit(a, 1.0)
    log: list[Any] = []
    now = 1.0
    for _ in range(8):
        adm = s.schedule(now)
        running.extend(a.action_id for a in adm)
        log.append(sorted((a.action_id, a.cluster, a.nodes) for a in adm))
        log.append(sorted((a.id, a.last, tuple(a.reasons)) for a in s.actions.values()))
        for qs in s.queues.values():
            log.append(
                [
                    (e.dkey, e.blocked, e.first, str(e.reason), sorted(x.id for x in e.acts))
                    for e in qs.evals
                ]
            )
        now += rng.choice([1.0, 10.0])
        for _ in range(rng.randint(1, 3)):
            if running:
                s.finish(running.pop(rng.randrange(len(running))), now)
        if rng.random() < 0.5:
            s.invalidate()
    return log


@pytest.mark.parametrize("seed", range(40))
def test_random_fleets_decide_and_record_as_the_plain_walk(seed: int) -> None:
    assert _random_fleet(seed, Scheduler) == _random_fleet(seed, _NoCarry)
