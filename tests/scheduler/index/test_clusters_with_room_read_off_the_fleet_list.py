"""A selector's clusters with room, read off the whole fleet's list for the demand.

The core keeps, per (selector, demand), the clusters with room in
placement order. When a selector's list is too far behind the capacity log to be brought
up to date by the clusters that moved (more admissions since than a quarter of its
clusters), it is made again from the whole fleet's list for the same demand (selector
None), itself brought up to date by what moved, instead of asking each cluster of the
selector again: after a completion, dozens of selectors ask of the same few clusters
(``index.view.counts``' ``fleet_list_reads``).

Ten clusters of two shapes (CPU nodes, GPU nodes), queues pinned to overlapping
selectors of six to eight clusters, and events that admit several actions at once
(completions of whole-node work, new submissions). Each case runs the same events with
and without the incremental path (``Scheduler(incremental=False)``) and compares every
pass.
"""

from __future__ import annotations

import random
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
from headway.scheduler.index.view import counts
from headway.scheduler.resources import Pod

from ..helpers import apply_op, submitter

GI = 2**30
CPU_NODE = Pod(cpu=16_000, memory=64 * GI)
GPU_NODE = Pod(cpu=32_000, memory=256 * GI, gpu=4, gpu_type="H100")
SMALL = Pod(cpu=4_000, memory=16 * GI)
GPU_ONE = Pod(cpu=8_000, memory=32 * GI, gpu=1, gpu_type="H100")
ALGOS = [Algorithm.greedy, Algorithm.backfill, Algorithm.easy, Algorithm.strict]


def make_fleet(incremental: bool, seed: int) -> tuple[Scheduler, random.Random]:
    """The fleet above with its queues and a first backlog; the scheduler and its RNG."""
    rng = random.Random(seed)
    names = [f"c{i}" for i in range(10)]
    clusters = [
        ClusterSpec(n, (NodeGroup("cpu", 2, CPU_NODE), NodeGroup("gpu", 1 + i % 2, GPU_NODE)))
        for i, n in enumerate(names)
    ]
    queues = [QueueSpec("any", priority=Priority.low, algorithm=Algorithm.greedy)]
    for i in range(6):
        sel = tuple(sorted(rng.sample(names, rng.choice([6, 7, 8]))))
        queues.append(
            QueueSpec(f"q{i}", priority=Priority(i % 3), algorithm=ALGOS[i % 4], clusters=sel)
        )
    s = Scheduler(clusters, queues, incremental=incremental)
    add = submitter(s)
    for i in range(40):
        q = rng.choice([f"q{k}" for k in range(6)] + ["any"])
        add(q, f"A{i}", (rng.choice([CPU_NODE, SMALL, GPU_ONE, GPU_NODE]),), rng.choice([5, 30]))
    return s, rng


def run_events(incremental: bool, seed: int) -> tuple[list[Any], int]:
    """Forty events (completions, and submissions of small and whole-node work); the log
    of every pass's admissions and every action's state and reasons after it, and how
    many selector lists were made from the fleet's."""
    s, rng = make_fleet(incremental, seed)
    before = counts(s).fleet_list_reads
    first = sorted(x.action_id for x in s.schedule(0.0))
    running = list(first)
    log: list[Any] = [first]
    t = 0.0
    for i in range(40):
        t += rng.choice([1.0, 3.0])
        if i % 4 == 3 or not running:
            q = rng.choice([f"q{k}" for k in range(6)] + ["any"])
            pod = rng.choice([SMALL, GPU_ONE, CPU_NODE])
            apply_op(s, ("submit", q, f"N{i}", pod, t), 10_000 + i, float(rng.choice([5, 40])))
        else:
            for _ in range(min(len(running), rng.choice([1, 3]))):
                apply_op(s, ("finish", running.pop(rng.randrange(len(running))), t), 0)
        adm = s.schedule(t)
        running += [x.action_id for x in adm]
        log.append(sorted((x.action_id, x.cluster) for x in adm))
        log.append(
            sorted((a.id, a.state, a.cluster, a.last, tuple(a.reasons)) for a in s.actions.values())
        )
    return log, counts(s).fleet_list_reads - before


@pytest.mark.parametrize(
    "seed",
    [
        pytest.param(1, id="overlapping-selectors-several-admissions-per-event"),
        pytest.param(2, id="other-selectors-and-estimates-lists-fall-far-behind"),
        pytest.param(3, id="gpu-and-cpu-demands-interleaved-across-six-selectors"),
    ],
)
def test_a_selector_list_made_from_the_fleets_is_the_plain_loops(seed: int) -> None:
    fast, shared = run_events(True, seed)
    assert shared > 0  # the fleet's list was what answered
    assert fast == run_events(False, seed)[0]
