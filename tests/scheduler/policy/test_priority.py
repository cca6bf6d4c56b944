"""Which queue goes first: priority, then the oldest waiting action, then the name.

The table runs against both engines (``engine``: the reference pass and the
incremental core)."""

from __future__ import annotations

import pytest

from ..helpers import job, make_queue, scenario
from .cases import C1, NCC, Case, Q, S, check, h

PRIORITY = [
    # x holds the node 0-100. lo (low, t=1) and hi (high, t=10) wait; at 100 hi goes
    # first (priority), lo after it.
    Case(
        "higher-priority-queue-dispatches-first",
        scenario(
            C1,
            [make_queue("lo", "low"), make_queue("hi", "high")],
            [
                job("x", "lo", 0, 100, gpu=h(8)),
                job("lo1", "lo", 1, 100, gpu=h(8)),
                job("hi1", "hi", 10, 100, gpu=h(8)),
            ],
        ),
        {"hi1": S(100, 200, reasons=[NCC]), "lo1": S(200, 300, reasons=[NCC])},
    ),
    # Priority never preempts: lo's long action keeps the node; hi waits until it ends.
    Case(
        "priority-never-preempts-running-work",
        scenario(
            C1,
            [make_queue("lo", "lowest"), make_queue("hi", "critical")],
            [job("x", "lo", 0, 1000, gpu=h(8)), job("y", "hi", 10, 10, gpu=h(8))],
        ),
        {"x": S(0, 1000), "y": S(1000, 1010, reasons=[NCC])},
    ),
    # Equal priority: the queue whose next action was submitted first goes first, even
    # against name order: qb's b (t=1) before qa's a (t=2).
    Case(
        "equal-priority-oldest-next-action-first",
        scenario(
            C1,
            [make_queue("qa"), make_queue("qb")],
            [
                job("x", "qa", 0, 100, gpu=h(8)),
                job("b", "qb", 1, 100, gpu=h(8)),
                job("a", "qa", 2, 100, gpu=h(8)),
            ],
        ),
        {"b": S(100, 200), "a": S(200, 300)},
    ),
    # Equal priority and the next actions submitted at the same time: "then queue name".
    # qb's b is earlier in the file, but both were submitted at t=1: qa goes first.
    Case(
        "equal-priority-same-submit-time-then-queue-name",
        scenario(
            C1,
            [make_queue("qb"), make_queue("qa")],
            [
                job("x", "qa", 0, 100, gpu=h(8)),
                job("b", "qb", 1, 100, gpu=h(8)),
                job("a", "qa", 1, 100, gpu=h(8)),
            ],
        ),
        {"a": S(100, 200), "b": S(200, 300)},
    ),
    # Within a queue: oldest by submit time (not file order), then file order.
    Case(
        "within-queue-oldest-submit-then-file-order",
        scenario(
            C1,
            Q,
            [
                job("x", "q", 0, 100, gpu=h(8)),
                job("late", "q", 5, 100, gpu=h(8)),
                job("early", "q", 3, 100, gpu=h(8)),
                job("tie1", "q", 7, 100, gpu=h(8)),
                job("tie2", "q", 7, 100, gpu=h(8)),
            ],
        ),
        {"early": S(100), "late": S(200), "tie1": S(300), "tie2": S(400)},
    ),
]


@pytest.mark.parametrize("case", [c.param() for c in PRIORITY])
def test_queues_are_visited_by_priority_then_oldest_head(case: Case, engine: str) -> None:
    check(case, engine)
