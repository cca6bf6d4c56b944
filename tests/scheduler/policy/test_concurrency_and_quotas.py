"""The gates before any fit: action, run and per-run concurrency, ``max_resources``
and the org's envelope, the first that fails being the action's reason.

The table runs against both engines (``engine``: the reference pass and the
incremental core)."""

from __future__ import annotations

import pytest

from ..helpers import job, make_cluster, make_queue, node_group, scenario
from .cases import C1, Case, Q, S, check, h

GATES = [
    # action_concurrency 1: b waits for a.
    Case(
        "action-concurrency-ActionConcurrency",
        scenario(
            C1,
            [make_queue("q", action_concurrency=1)],
            [job("a", "q", 0, 100), job("b", "q", 1, 10)],
        ),
        {"a": S(0, 100), "b": S(100, 110, reasons=["ActionConcurrency"])},
    ),
    # run_concurrency 1: b is of run R1, which already runs -> passes (starts 1). c (R2)
    # -> RunConcurrency until no R1 action runs (b ends 51, a ends 100) -> 100.
    Case(
        "run-concurrency-action-of-running-run-passes-RunConcurrency",
        scenario(
            C1,
            [make_queue("q", run_concurrency=1)],
            [
                job("a", "q", 0, 100, run="R1"),
                job("b", "q", 1, 50, run="R1"),
                job("c", "q", 2, 10, run="R2"),
            ],
        ),
        {"a": S(0), "b": S(1, 51, reasons=[]), "c": S(100, 110, reasons=["RunConcurrency"])},
    ),
    # per_run_concurrency 1: b (R1) waits for a; c (R2) starts at once.
    Case(
        "per-run-concurrency-PerRunConcurrency",
        scenario(
            C1,
            [make_queue("q", per_run_concurrency=1)],
            [
                job("a", "q", 0, 100, run="R1"),
                job("b", "q", 1, 10, run="R1"),
                job("c", "q", 2, 10, run="R2"),
            ],
        ),
        {"b": S(100, 110, reasons=["PerRunConcurrency"]), "c": S(2, 12, reasons=[])},
    ),
    # Gate order: action_concurrency 1 and run_concurrency 1 both fail for b (run R2)
    # -> the first, ActionConcurrency.
    Case(
        "action-concurrency-checked-before-run-concurrency",
        scenario(
            C1,
            [make_queue("q", action_concurrency=1, run_concurrency=1)],
            [job("a", "q", 0, 100, run="R1"), job("b", "q", 1, 10, run="R2")],
        ),
        {"b": S(100, 110, reasons=["ActionConcurrency"])},
    ),
    # A bare GPU quota counts every type: H200 node + A100 node, max {gpu: 8}.
    # a (H200:6) runs; b (A100:4): 6 + 4 > 8 -> MaxResources until a ends at 100.
    Case(
        "bare-gpu-quota-counts-every-type-MaxResources",
        scenario(
            [
                make_cluster(
                    "c1", groups=[node_group("h", 1, gpu=h(8)), node_group("a", 1, gpu="A100:8")]
                )
            ],
            [make_queue("q", max_resources={"gpu": 8})],
            [job("a", "q", 0, 100, gpu=h(6)), job("b", "q", 1, 10, gpu="A100:4")],
        ),
        {"a": S(0, 100), "b": S(100, 110, reasons=["MaxResources"])},
    ),
    # A typed quota (H200:8) counts H200 only: b (A100:4) starts at once; c (H200:4):
    # 6 + 4 > 8 -> MaxResources until a ends.
    Case(
        "typed-gpu-quota-counts-its-type-only-MaxResources",
        scenario(
            [
                make_cluster(
                    "c1", groups=[node_group("h", 2, gpu=h(8)), node_group("a", 1, gpu="A100:8")]
                )
            ],
            [make_queue("q", max_resources={"gpu": h(8)})],
            [
                job("a", "q", 0, 100, gpu=h(6)),
                job("b", "q", 1, 10, gpu="A100:4"),
                job("c", "q", 2, 10, gpu=h(4)),
            ],
        ),
        {"b": S(1, 11, reasons=[]), "c": S(100, 110, reasons=["MaxResources"])},
    ),
    # CPU quota: 4 cores. a (3) runs; b (2) -> MaxResources; c (1) fits the quota and,
    # greedy, starts past b.
    Case(
        "cpu-quota-MaxResources-greedy-passes-smaller",
        scenario(
            C1,
            [make_queue("q", max_resources={"cpu": 4})],
            [
                job("a", "q", 0, 100, cpu=3),
                job("b", "q", 1, 10, cpu=2),
                job("c", "q", 2, 10, cpu="1000m"),
            ],
        ),
        {"b": S(100, 110, reasons=["MaxResources"]), "c": S(2, 12, reasons=[])},
    ),
    # Org envelope across queues: max_concurrent_actions 1.
    Case(
        "org-concurrent-actions-across-queues-OrgConcurrentActions",
        scenario(
            C1,
            [make_queue("q1"), make_queue("q2")],
            [job("a", "q1", 0, 100), job("b", "q2", 1, 10)],
            org={"max_concurrent_actions": 1},
        ),
        {"b": S(100, 110, reasons=["OrgConcurrentActions"])},
    ),
    # max_concurrent_runs 1: b is of run R1 (running) -> passes; c (R2) waits.
    Case(
        "org-concurrent-runs-running-run-passes-OrgConcurrentRuns",
        scenario(
            C1,
            [make_queue("q1"), make_queue("q2")],
            [
                job("a", "q1", 0, 100, run="R1"),
                job("b", "q2", 1, 10, run="R1"),
                job("c", "q2", 2, 10, run="R2"),
            ],
            org={"max_concurrent_runs": 1},
        ),
        {"b": S(1, 11, reasons=[]), "c": S(100, 110, reasons=["OrgConcurrentRuns"])},
    ),
    # Gates come before capacity: the cluster is full AND the org is at 1 action ->
    # OrgConcurrentActions (not NoClusterCapacity).
    Case(
        "gates-checked-before-capacity",
        scenario(
            C1,
            Q,
            [job("a", "q", 0, 100, gpu=h(8)), job("b", "q", 1, 10, gpu=h(8))],
            org={"max_concurrent_actions": 1},
        ),
        {"b": S(100, 110, reasons=["OrgConcurrentActions"])},
    ),
]


@pytest.mark.parametrize("case", [c.param() for c in GATES])
def test_a_waiting_action_is_held_by_the_first_gate_it_fails(case: Case, engine: str) -> None:
    check(case, engine)
