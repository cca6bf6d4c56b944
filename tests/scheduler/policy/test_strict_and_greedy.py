"""``strict`` holds clusters for its blocked head; ``greedy`` lets what fits go by.

The table runs against both engines (``engine``: the reference pass and the
incremental core)."""

from __future__ import annotations

import pytest

from ..helpers import job, make_cluster, make_queue, scenario
from .cases import C1, HFG, NCC, Case, S, check, h

STRICT = [
    # Strict hold vs queue priority. x (low, 4 GPU) runs 0-100. g (strict medium, 8 GPU,
    # t=10): NoClusterCapacity, holds c1. hp (high, 2 GPU, t=20): higher priority still
    # dispatches on the held cluster -> 20 (ends 220). lp (the other queue, at equal or
    # lower priority, 2 GPU, t=30): room (2 free) but held -> HeldForGang. t=100: free 6,
    # g no. t=220: free 8 -> g 220-320; lp no room. t=320: lp starts.
    *[
        Case(
            f"strict-head-holds-cluster-{prio}-priority-work-waits-HeldForGang-higher-dispatches",
            scenario(
                C1,
                [
                    make_queue("sq", "medium", "strict"),
                    make_queue("hq", "high"),
                    make_queue("oq", prio),
                ],
                [
                    job("x", "oq", 0, 100, gpu=h(4)),
                    job("g", "sq", 10, 100, gpu=h(8)),
                    job("hp", "hq", 20, 200, gpu=h(2)),
                    job("lp", "oq", 30, 100, gpu=h(2)),
                ],
            ),
            {
                "g": S(220, 320, reasons=[NCC]),
                "hp": S(20, 220, reasons=[]),
                "lp": S(320, 420, reasons=[HFG, NCC]),
            },
        )
        for prio in ("medium", "low")
    ],
    # The hold covers only clusters whose node shapes could hold the head: c2 has no
    # GPU. lp (CPU only) finds c1 held and goes to c2 at once.
    Case(
        "strict-hold-only-on-clusters-that-could-hold-the-head",
        scenario(
            [make_cluster("c1"), make_cluster("c2", gpus=None)],
            [make_queue("sq", "medium", "strict"), make_queue("oq", "low")],
            [
                job("x", "oq", 0, 100, gpu=h(4)),
                job("g", "sq", 10, 100, gpu=h(8)),
                job("lp", "oq", 30, 100, cpu=2),
            ],
        ),
        {"x": S(0, 100, "c1"), "g": S(100, 200, "c1", [NCC]), "lp": S(30, 130, "c2", [])},
    ),
    # A head stopped by a GATE blocks the rest of its strict queue (reason HeldForGang:
    # room exists) but holds no cluster: oq's o starts at once.
    Case(
        "strict-gate-blocked-head-blocks-own-queue-only",
        scenario(
            C1,
            [make_queue("sq", "medium", "strict", per_run_concurrency=1), make_queue("oq", "low")],
            [
                job("a", "sq", 0, 100, run="R1", gpu=h(1)),
                job("b", "sq", 1, 50, run="R1", gpu=h(1)),
                job("c", "sq", 2, 10, run="R2", gpu=h(1)),
                job("o", "oq", 3, 10, gpu=h(1)),
            ],
        ),
        {
            "b": S(100, 150, reasons=["PerRunConcurrency"]),
            "c": S(100, 110, reasons=[HFG]),
            "o": S(3, 13, reasons=[]),
        },
    ),
    # Greedy: the blocked 8-GPU head holds nothing; later small work starts past it.
    Case(
        "greedy-places-everything-that-fits-nothing-held",
        scenario(
            C1,
            [make_queue("q", algorithm="greedy")],
            [
                job("x", "q", 0, 100, gpu=h(4)),
                job("g", "q", 10, 100, gpu=h(8)),
                job("s", "q", 20, 500, gpu=h(2)),
            ],
        ),
        {"s": S(20, 520, reasons=[]), "g": S(520, 620, reasons=[NCC])},
    ),
]


@pytest.mark.parametrize("case", [c.param() for c in STRICT])
def test_a_blocked_head_holds_under_strict_and_not_under_greedy(case: Case, engine: str) -> None:
    check(case, engine)
