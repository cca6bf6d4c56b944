"""``backfill`` and ``easy``: a blocked head reserves the earliest time it would fit,
and later work starts in the gap only if it is gone by then (or, EASY, fits in what
the head's projected placement leaves).

The table runs against both engines (``engine``: the reference pass and the
incremental core)."""

from __future__ import annotations

import pytest

from ..helpers import job, make_cluster, make_queue, scenario
from .cases import BFW, C1, HFG, NCC, Case, S, check, h

BACKFILL = [
    # A running action with no estimate: the reservation cannot be computed; the head
    # holds c1 as under strict. sh (est end 30) would fit and end long before anything,
    # but is held -> HeldForGang; at 1000 r1 ends: h (6) and sh (2) both start.
    Case(
        "backfill-running-action-without-estimate-holds-as-strict-HeldForGang",
        scenario(
            C1,
            [make_queue("b", algorithm="backfill")],
            [
                job("r1", "b", 0, 1000, gpu=h(4)),
                job("h", "b", 10, 100, gpu=h(6), estimate=100),
                job("sh", "b", 20, 10, gpu=h(2), estimate=10),
            ],
        ),
        {"h": S(1000, 1100, reasons=[NCC]), "sh": S(1000, 1010, reasons=[HFG])},
    ),
    # Same with r1's estimate given: reservation R = 1000; sh (20 + 10 <= 1000) backfills.
    Case(
        "backfill-short-action-backfills-before-reservation",
        scenario(
            C1,
            [make_queue("b", algorithm="backfill")],
            [
                job("r1", "b", 0, 1000, gpu=h(4), estimate=1000),
                job("h", "b", 10, 100, gpu=h(6), estimate=100),
                job("sh", "b", 20, 10, gpu=h(2), estimate=10),
            ],
        ),
        {"h": S(1000, 1100, reasons=[NCC]), "sh": S(20, 30, reasons=[])},
    ),
    # Estimates from task history, "last two completed, in completion order".
    # t=0: t1 (300 s), t2 (100 s), t3 (50 s) of task T, u1 (40 s) of task U, 1 GPU each.
    # Completion order: t3 (50), u1 (40), t2 (100), t1 (300) -> T's last two = [100, 300]
    # -> estimate 200 (file order would give (100+50)/2 = 75); U's only one -> 40.
    # t=1000 r (4 GPU, est 500) starts; t=1001 h (8 GPU): no room, reservation R = 1500.
    # t=1350 c (task T, no estimate): 1350 + 200 = 1550 > 1500 -> BackfillWindow.
    # t=1400 u2 (task U): 1400 + 40 = 1440 <= 1500 -> starts 1400, ends 1410.
    # t=1420 v (task V, no history): no estimate -> never backfilled: BackfillWindow.
    # t=1500 r ends: h 1500-1510, c and v no room. t=1510: c, v start.
    Case(
        "backfill-estimate-from-last-two-completed-in-completion-order",
        scenario(
            C1,
            [make_queue("b", algorithm="backfill")],
            [
                job("t1", "b", 0, 300, gpu=h(1), task="T"),
                job("t2", "b", 0, 100, gpu=h(1), task="T"),
                job("t3", "b", 0, 50, gpu=h(1), task="T"),
                job("u1", "b", 0, 40, gpu=h(1), task="U"),
                job("r", "b", 1000, 500, gpu=h(4), estimate=500),
                job("h", "b", 1001, 10, gpu=h(8), estimate=10),
                job("c", "b", 1350, 10, gpu=h(1), task="T"),
                job("u2", "b", 1400, 10, gpu=h(1), task="U"),
                job("v", "b", 1420, 10, gpu=h(1), task="V"),
            ],
        ),
        {
            "h": S(1500, 1510, reasons=[NCC]),
            "c": S(1510, 1520, reasons=[BFW, NCC]),
            "u2": S(1400, 1410, reasons=[]),
            "v": S(1510, 1520, reasons=[BFW, NCC]),
        },
    ),
    # A running action past its estimate is assumed to end "now". r (4 GPU) estimates 100
    # but runs 1000. h (8 GPU) waits. t=200: r is past its estimate -> R = now = 200;
    # s (est 0) ends by 200 <= 200 -> starts 200. t=300: R = 300; s2 (est 1): 301 > 300
    # -> BackfillWindow. t=1000: r ends, h 1000-1010; s2 no room. t=1010: s2.
    Case(
        "backfill-running-past-estimate-ends-now",
        scenario(
            C1,
            [make_queue("b", algorithm="backfill")],
            [
                job("r", "b", 0, 1000, gpu=h(4), estimate=100),
                job("h", "b", 10, 10, gpu=h(8), estimate=10),
                job("s", "b", 200, 5, gpu=h(1), estimate=0),
                job("s2", "b", 300, 5, gpu=h(1), estimate=1),
            ],
        ),
        {
            "h": S(1000, 1010, reasons=[NCC]),
            "s": S(200, 205, reasons=[]),
            "s2": S(1010, 1015, reasons=[BFW, NCC]),
        },
    ),
    # Other clusters are unrestricted, and the reservation's cluster is chosen by
    # earliest time, ties by placement order. c1, c2 (8 GPU each). r1 (4) -> c1 (tie ->
    # name); r2 (6) -> c2 (8 > 4). h (6): no room; both free up at 1000 -> tie -> most
    # free GPU now: c1 (4 vs 2) -> R(c1) = 1000. lg (2 GPU, est 5000): c1 is first in
    # order but reserved and 5020 > 1000; c2 is unrestricted and fits -> starts 20 on c2.
    Case(
        "backfill-reservation-on-one-cluster-other-clusters-unrestricted",
        scenario(
            [make_cluster("c1"), make_cluster("c2")],
            [make_queue("b", algorithm="backfill")],
            [
                job("r1", "b", 0, 1000, gpu=h(4), estimate=1000),
                job("r2", "b", 1, 999, gpu=h(6), estimate=999),
                job("h", "b", 10, 100, gpu=h(6), estimate=100),
                job("lg", "b", 20, 5000, gpu=h(2), estimate=5000),
            ],
        ),
        {
            "r1": S(0, 1000, "c1"),
            "r2": S(1, 1000, "c2"),
            "h": S(1000, 1100, "c1", [NCC]),
            "lg": S(20, 5020, "c2", []),
        },
    ),
    # The reservation binds lower-priority queues too: lo's long action (est 5000) fits
    # now on c1 but would end after R = 1000 -> BackfillWindow; its short one backfills.
    Case(
        "backfill-reservation-binds-lower-priority-queue-BackfillWindow",
        scenario(
            C1,
            [make_queue("b", "high", "backfill"), make_queue("lo", "low", "greedy")],
            [
                job("r1", "b", 0, 1000, gpu=h(4), estimate=1000),
                job("h", "b", 10, 100, gpu=h(6), estimate=100),
                job("long", "lo", 20, 5000, gpu=h(2), estimate=5000),
                job("short", "lo", 30, 50, gpu=h(2), estimate=50),
            ],
        ),
        {
            "h": S(1000, 1100, reasons=[NCC]),
            "long": S(1000, 6000, reasons=[BFW]),
            "short": S(30, 80, reasons=[]),
        },
    ),
    # An action stopped by a gate reserves nothing: b (R1) fails PerRunConcurrency; c
    # (R2, est 5000) starts at once though b could not fit either.
    Case(
        "backfill-gate-stopped-action-restricts-nothing",
        scenario(
            C1,
            [make_queue("b", algorithm="backfill", per_run_concurrency=1)],
            [
                job("a", "b", 0, 1000, run="R1", gpu=h(4), estimate=1000),
                job("bb", "b", 1, 10, run="R1", gpu=h(8), estimate=10),
                job("c", "b", 2, 5000, run="R2", gpu=h(2), estimate=5000),
            ],
        ),
        {"c": S(2, 5002, reasons=[]), "bb": S(5002, 5012)},
    ),
    # EASY extra. One node of 8. r1 (4, est 1000); h (6) -> R = 1000, projected: h takes
    # 6 of 8 at 1000, extra 2. n (2, NO estimate, t=20): fits now, but an action with no
    # estimate may not use the extra -> BackfillWindow. lg (2, est 5000, t=30): fits now
    # and in the extra -> starts 30, uses it up. m (2, est 5000, t=35): fits now (2
    # free), extra gone -> BackfillWindow. ed (2, est 960, t=40): ends 1000 <= R ->
    # starts 40 (needs no extra). t=1000: r1, ed end: free 6 -> h 1000-1100; n, m no
    # room. t=1100: n and m start.
    Case(
        "easy-extra-nodes-used-up-no-estimate-never-uses-extra",
        scenario(
            C1,
            [make_queue("e", algorithm="easy")],
            [
                job("r1", "e", 0, 1000, gpu=h(4), estimate=1000),
                job("h", "e", 10, 100, gpu=h(6), estimate=100),
                job("n", "e", 20, 10, gpu=h(2)),
                job("lg", "e", 30, 5000, gpu=h(2), estimate=5000),
                job("m", "e", 35, 5000, gpu=h(2), estimate=5000),
                job("ed", "e", 40, 960, gpu=h(2), estimate=960),
            ],
        ),
        {
            "h": S(1000, 1100, reasons=[NCC]),
            "n": S(1100, 1110, reasons=[BFW, NCC]),
            "lg": S(30, 5030, reasons=[]),
            "m": S(1100, 6100, reasons=[BFW, NCC]),
            "ed": S(40, 1000, reasons=[]),
        },
    ),
    # The same workload under backfill: no extra -> lg waits too (BackfillWindow); the
    # 2 GPU left free go to ed (t=40). At 1000: free 8 -> h (6), n (2). t=1100: lg, m.
    Case(
        "backfill-same-workload-no-extra",
        scenario(
            C1,
            [make_queue("e", algorithm="backfill")],
            [
                job("r1", "e", 0, 1000, gpu=h(4), estimate=1000),
                job("h", "e", 10, 100, gpu=h(6), estimate=100),
                job("n", "e", 20, 10, gpu=h(2)),
                job("lg", "e", 30, 5000, gpu=h(2), estimate=5000),
                job("m", "e", 35, 5000, gpu=h(2), estimate=5000),
                job("ed", "e", 40, 960, gpu=h(2), estimate=960),
            ],
        ),
        {
            "h": S(1000, 1100, reasons=[NCC]),
            "n": S(1000, 1010, reasons=[BFW]),
            "lg": S(1010, 6010, reasons=[BFW, NCC]),
            "m": S(1100, 6100, reasons=[BFW, NCC]),
            "ed": S(40, 1000, reasons=[]),
        },
    ),
]


@pytest.mark.parametrize("case", [c.param() for c in BACKFILL])
def test_a_reserving_head_lets_only_what_fits_its_window_go_by(case: Case, engine: str) -> None:
    check(case, engine)
