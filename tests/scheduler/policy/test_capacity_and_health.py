"""Clusters of unknown capacity (open) and unhealthy clusters (skipped).

The table runs against both engines (``engine``: the reference pass and the
incremental core)."""

from __future__ import annotations

import pytest

from ..helpers import job, make_cluster, scenario
from .cases import C1, NCC, Case, Q, S, check, h

CAPACITY = [
    # Unknown means open; known clusters with room are preferred. a -> k (known, room).
    # b: k is full -> u (unknown passes). c: 100 GPU, no node could hold it, but u's
    # capacity is unknown -> accepted and placed on u. Two admissions onto u.
    Case(
        "unknown-capacity-passes-known-preferred-counted",
        scenario(
            [make_cluster("u", reports_capacity=False), make_cluster("k", gpus=8)],
            Q,
            [
                job("a", "q", 0, 100, gpu=h(8)),
                job("b", "q", 1, 100, gpu=h(8)),
                job("c", "q", 2, 100, gpu=h(100)),
            ],
        ),
        {"a": S(0, 100, "k", []), "b": S(1, 101, "u", []), "c": S(2, 102, "u", [])},
        summary={"unknown_capacity_passes": 2},
    ),
    # cluster_down: running work runs on to its end; new work waits; cluster_up reopens.
    Case(
        "cluster-down-running-work-continues-new-work-waits-until-up",
        scenario(
            C1,
            Q,
            [job("a", "q", 0, 1000, gpu=h(4)), job("b", "q", 20, 10, gpu=h(1))],
            events=[{"at": 10, "cluster_down": "c1"}, {"at": 500, "cluster_up": "c1"}],
        ),
        {"a": S(0, 1000, "c1"), "b": S(500, 510, "c1", [NCC])},
    ),
    # A down cluster is skipped in placement: b goes to c2 though c1 sorts first.
    Case(
        "cluster-down-work-goes-elsewhere",
        scenario(
            [make_cluster("c1"), make_cluster("c2")],
            Q,
            [job("b", "q", 20, 10, gpu=h(1))],
            events=[{"at": 10, "cluster_down": "c1"}],
        ),
        {"b": S(20, 30, "c2", [])},
    ),
]


@pytest.mark.parametrize("case", [c.param() for c in CAPACITY])
def test_unknown_capacity_is_open_and_an_unhealthy_cluster_takes_nothing(
    case: Case, engine: str
) -> None:
    check(case, engine)
