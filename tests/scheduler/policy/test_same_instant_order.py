"""What happens at one instant, in order: completions, events, submissions, the pass.

The table runs against both engines (``engine``: the reference pass and the
incremental core)."""

from __future__ import annotations

import pytest

from ..helpers import job, make_queue, scenario
from .cases import C1, NCC, REJ, Case, Q, S, check, h

TIME = [
    # Zero duration: a starts 0 and its completion is a new event at the same instant,
    # after the pass that started it: b then starts at 0 too, having waited a pass.
    Case(
        "zero-duration-completion-is-a-new-event-same-instant",
        scenario(C1, Q, [job("a", "q", 0, 0, gpu=h(8)), job("b", "q", 0, 100, gpu=h(8))]),
        {"a": S(0, 0, "c1", []), "b": S(0, 100, "c1", [NCC])},
        summary={"mean_wait": 0.0, "makespan": 100.0},
    ),
    # Completions before submissions: depth 1, a ends at 100 and b is submitted at 100.
    Case(
        "same-instant-completion-before-submission",
        scenario(
            C1,
            [make_queue("q", depth=1)],
            [job("a", "q", 0, 100, gpu=h(8)), job("b", "q", 100, 10, gpu=h(8))],
        ),
        {"b": S(100, 110, "c1", [])},
    ),
    # Events before submissions: the queue reopens at 100, b submitted at 100 accepted.
    Case(
        "same-instant-event-before-submission",
        scenario(
            C1,
            [make_queue("q", status="draining")],
            [job("b", "q", 100, 10)],
            events=[{"at": 100, "update_queue": {"name": "q", "status": "active"}}],
        ),
        {"b": S(100, 110, "c1", [])},
    ),
    # Submissions (in file order) before the pass: depth 1, a and b both at t=0 - the
    # pass has not run yet when b arrives, so q holds a -> b rejected.
    Case(
        "same-instant-all-submissions-before-the-pass",
        scenario(C1, [make_queue("q", depth=1)], [job("a", "q", 0, 10), job("b", "q", 0, 10)]),
        {"a": S(0, 10), "b": REJ("QueueDepthExceeded")},
    ),
    # cluster_down and a submission at the same instant: the pass sees the cluster down.
    Case(
        "same-instant-cluster-down-before-pass",
        scenario(
            C1,
            Q,
            [job("b", "q", 100, 10)],
            events=[{"at": 100, "cluster_down": "c1"}, {"at": 200, "cluster_up": "c1"}],
        ),
        {"b": S(200, 210, "c1", [NCC])},
    ),
]


@pytest.mark.parametrize("case", [c.param() for c in TIME])
def test_what_happens_at_one_instant_happens_in_order(case: Case, engine: str) -> None:
    check(case, engine)
