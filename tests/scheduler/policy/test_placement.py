"""Where a gang goes: the cluster in placement order, best fit on its nodes, all or
nothing on one cluster (gangs, Ray, Spark, GPU types, selectors).

The table runs against both engines (``engine``: the reference pass and the
incremental core)."""

from __future__ import annotations

import pytest

from ..helpers import job, make_cluster, make_queue, res, scenario
from .cases import C1, NCC, REJ, Case, Q, S, check, h

PLACEMENT = [
    # Most free GPU first, though the name sorts later.
    Case(
        "placement-most-free-gpu-first",
        scenario(
            [make_cluster("ca", gpus=4), make_cluster("cb", gpus=8)],
            Q,
            [job("a", "q", 0, 10, gpu=1)],
        ),
        {"a": S(0, 10, "cb", [])},
    ),
    # GPU tie -> most free CPU.
    Case(
        "placement-gpu-tie-most-free-cpu",
        scenario(
            [make_cluster("ca", cpu=32), make_cluster("cb", cpu=64)],
            Q,
            [job("a", "q", 0, 10)],
        ),
        {"a": S(0, 10, "cb", [])},
    ),
    # Full tie -> name ascending (not file order).
    Case(
        "placement-full-tie-cluster-name",
        scenario([make_cluster("cz"), make_cluster("ca")], Q, [job("a", "q", 0, 10)]),
        {"a": S(0, 10, "ca", [])},
    ),
    # Free capacity is what counts, not size: cb is bigger but busy.
    Case(
        "placement-by-free-not-total",
        scenario(
            [make_cluster("ca", gpus=8), make_cluster("cb", gpus=8, nodes=2)],
            Q,
            [job("x", "q", 0, 100, gpu=h(8), replicas=2), job("a", "q", 1, 10, gpu=h(1))],
        ),
        {"x": S(0, 100, "cb"), "a": S(1, 11, "ca", [])},
    ),
    # Undeclared environment name: prefer the cluster where an action of that
    # environment runs now. e1 (warm, 4) -> c1; x (1) -> c2 (8 > 4); e2 (warm, 1) -> c1
    # (4 free < 7 on c2, but warm runs there). y (no env) -> c2.
    Case(
        "undeclared-environment-prefers-its-cluster",
        scenario(
            [make_cluster("c1"), make_cluster("c2")],
            Q,
            [
                job("e1", "q", 0, 100, gpu=h(4), environment="warm"),
                job("x", "q", 1, 100, gpu=h(1)),
                job("e2", "q", 2, 10, gpu=h(1), environment="warm"),
                job("y", "q", 3, 10, gpu=h(1)),
            ],
        ),
        {"e1": S(0, 100, "c1"), "x": S(1, 101, "c2"), "e2": S(2, 12, "c1"), "y": S(3, 13, "c2")},
    ),
    # Spark demand = driver + executors, counted against max_resources (cpu 14):
    # 2 + 3 x 4 = 14 fits the quota exactly; the next 1-CPU action -> MaxResources.
    # Nodes 2 x 8 CPU: executors 4,4 -> n0, 4 -> n1, driver 2 -> n1: the gang fits.
    Case(
        "spark-demand-driver-plus-executors-against-quota",
        scenario(
            [make_cluster("c1", gpus=None, cpu=8, nodes=2)],
            [make_queue("q", max_resources={"cpu": 14})],
            [
                job(
                    "sp",
                    "q",
                    0,
                    100,
                    resources=None,
                    spark={"driver": res(2), "executor": res(4), "executors": 3},
                ),
                job("one", "q", 1, 10, cpu=1),
            ],
        ),
        {"sp": S(0, 100, "c1", []), "one": S(100, 110, reasons=["MaxResources"])},
    ),
    # Ray demand = head + every worker group at its replica count: 1 + 2 x 2 = 5 GPU >
    # quota 4 -> Unschedulable; with a quota of 5 it starts.
    *[
        Case(
            f"ray-demand-head-plus-workers-quota-{quota}",
            scenario(
                C1,
                [make_queue("q", max_resources={"gpu": quota})],
                [
                    job(
                        "ray",
                        "q",
                        0,
                        10,
                        resources=None,
                        ray={
                            "head": res(1, gpu=h(1)),
                            "worker_groups": [{"replicas": 2, "resources": res(1, gpu=h(2))}],
                        },
                    )
                ],
            ),
            {"ray": expect},
        )
        for quota, expect in ((4, REJ("Unschedulable")), (5, S(0, 10, "c1", [])))
    ],
    # A gang is admitted whole: 2 x 8 GPU on a 2-node cluster with one node busy waits
    # (NoClusterCapacity) - no pod starts alone - and starts when both nodes are free.
    Case(
        "gang-admitted-whole-or-not-at-all",
        scenario(
            [make_cluster("c1", nodes=2)],
            Q,
            [job("x", "q", 0, 100, gpu=h(8)), job("g", "q", 1, 10, gpu=h(8), replicas=2)],
        ),
        {"g": S(100, 110, "c1", [NCC])},
    ),
]


@pytest.mark.parametrize("case", [c.param() for c in PLACEMENT])
def test_a_gang_is_placed_whole_by_best_fit_in_placement_order(case: Case, engine: str) -> None:
    check(case, engine)
