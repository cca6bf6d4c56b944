"""The result's fields: waits, percentiles, slowdown, utilization, makespan.

The table runs against both engines (``engine``: the reference pass and the
incremental core)."""

from __future__ import annotations

import pytest

from ..helpers import job, make_cluster, make_queue, node_group, scenario
from .cases import C1, PEND, REJ, Case, Q, S, check, h
from .engines import run_on

RESULT = [
    # Five 8-GPU actions, all submitted at t=5 on one 8-GPU node, run one after another:
    # a 5-15, b 15-25, c 25-35, d 35-105, e 105-107 -> waits [0, 10, 20, 30, 100].
    # p50 = 20; p95: h = 4 x 0.95 = 3.8 -> 30 + 0.8 x 70 = 86; max 100; mean 32.
    # bounded slowdown: a 10/10 = 1; b 20/10 = 2; c 30/10 = 3; d 100/70; e (100 + 2) /
    # max(2, 10) = 10.2 -> mean (16.2 + 10/7) / 5.
    # makespan 107 - 5 = 102. Utilization: GPU 8 x 102 / (8 x 102) = 1; CPU 1 x 102 /
    # (64 x 102) = 1/64; memory 1/512; ephemeral storage: the fleet has none -> null.
    # stuck (action_concurrency 0) stays pending; closed (drained) rejects: they count in
    # summary.actions (7) but in no mean.
    Case(
        "result-waits-percentiles-slowdown-utilization-makespan",
        scenario(
            C1,
            [
                Q[0],
                make_queue("stuck", action_concurrency=0),
                make_queue("closed", status="drained"),
            ],
            [
                job("a", "q", 5, 10, gpu=h(8)),
                job("b", "q", 5, 10, gpu=h(8)),
                job("c", "q", 5, 10, gpu=h(8)),
                job("d", "q", 5, 70, gpu=h(8)),
                job("e", "q", 5, 2, gpu=h(8)),
                job("p", "stuck", 50, 10),
                job("r", "closed", 60, 10),
            ],
        ),
        {
            "e": S(105, 107, "c1"),
            "p": PEND(["ActionConcurrency"]),
            "r": REJ("QueueDraining"),
        },
        summary={
            "actions": 7,
            "skipped": 0,
            "first_submit": 5.0,
            "last_end": 107.0,
            "makespan": 102.0,
            "mean_wait": 32.0,
            "wait_max": 100.0,
            "mean_bounded_slowdown": (16.2 + 10 / 7) / 5,
            "unknown_capacity_passes": 0,
        },
        queues={
            "q": {
                "admitted": 5,
                "rejected": 0,
                "pending": 0,
                "wait_p50": 20.0,
                "wait_p95": 86.0,
                "wait_max": 100.0,
            },
            "stuck": {"admitted": 0, "pending": 1, "rejected": 0},
            "closed": {"admitted": 0, "rejected": 1, "pending": 0},
        },
        utilization={"gpu": 1.0, "cpu": 1 / 64, "memory": 1 / 512},
    ),
    # A CPU-only fleet: utilization gpu is null (and ephemeral storage counts when present:
    # 10Gi x 50 s / (100Gi x 50 s) = 0.1).
    Case(
        "result-utilization-null-for-absent-resources",
        scenario(
            [make_cluster("c1", groups=[node_group("n", 1, cpu=4, memory="8Gi", eph="100Gi")])],
            Q,
            [
                job(
                    "a",
                    "q",
                    0,
                    50,
                    cpu=2,
                    resources={"cpu": 2, "memory": "4Gi", "ephemeral_storage": "10Gi"},
                )
            ],
        ),
        {"a": S(0, 50, "c1", [])},
        utilization={"cpu": 0.5, "memory": 0.5, "ephemeral_storage": 0.1},
    ),
]


@pytest.mark.parametrize("case", [c.param() for c in RESULT])
def test_the_result_reports_what_happened(case: Case, engine: str) -> None:
    check(case, engine)


def test_gpu_utilization_is_null_on_a_cpu_only_fleet(engine: str) -> None:
    doc = run_on(engine, scenario([make_cluster("c1", gpus=None)], Q, [job("a", "q", 0, 10)]))
    assert doc["utilization"]["gpu"] is None
    assert doc["utilization"]["ephemeral_storage"] is None
    assert doc["utilization"]["cpu"] == pytest.approx(1 / 64)


def test_an_action_that_never_started_has_null_times(engine: str) -> None:
    doc = run_on(engine, scenario(C1, [make_queue("q", status="drained")], [job("a", "q", 3, 10)]))
    a = doc["actions"][0]
    assert set(a) >= {
        "id",
        "run",
        "queue",
        "submit",
        "start",
        "end",
        "cluster",
        "status",
        "reasons",
    }
    assert a["run"] == "a"  # run defaults to the id
    assert doc["queues"]["q"]["wait_p50"] is None
    s = doc["summary"]
    assert s["actions"] == 1
    assert s["mean_wait"] is None and s["wait_max"] is None and s["mean_bounded_slowdown"] is None
