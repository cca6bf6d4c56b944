"""Warm environments: their footprint, slots and idle_ttl.

The table runs against both engines (``engine``: the reference pass and the
incremental core)."""

from __future__ import annotations

import pytest

from ..helpers import job, make_queue, res, scenario
from .cases import C1, NCC, REJ, Case, S, check, h

ENVIRONMENTS = [
    # idle_ttl 0: the environment goes away at its last action's end, handled right
    # after that instant's completions: o (8 GPU, waiting) starts at 100.
    Case(
        "environment-idle-ttl-zero-goes-away-at-last-end",
        scenario(
            C1,
            [make_queue("app", "high"), make_queue("o", "low")],
            [
                job("e1", "app", 0, 100, environment="pool"),
                job("o1", "o", 10, 100, gpu=h(8)),
            ],
            environments=[{"name": "pool", "resources": res(4, gpu=h(2)), "replicas": 2}],
        ),
        {"e1": S(0, 100, "c1", []), "o1": S(100, 200, "c1", [NCC])},
    ),
    # idle_ttl expiry is an event of its own and triggers a pass: e1 ends 100, the pool
    # (idle_ttl 50) goes at 150 with nothing else happening then -> o1 starts 150.
    Case(
        "environment-expiry-is-its-own-event",
        scenario(
            C1,
            [make_queue("app", "high"), make_queue("o", "low")],
            [
                job("e1", "app", 0, 100, environment="pool"),
                job("o1", "o", 10, 100, gpu=h(8)),
            ],
            environments=[
                {"name": "pool", "resources": res(4, gpu=h(2)), "replicas": 2, "idle_ttl": 50}
            ],
        ),
        {"o1": S(150, 250, "c1", [NCC])},
    ),
    # The footprint of an environment not yet placed is what max_resources sees:
    # footprint 2 x 2 = 4 GPU > quota 2 -> Unschedulable at submission ...
    Case(
        "environment-footprint-over-quota-Unschedulable",
        scenario(
            C1,
            [make_queue("app", max_resources={"gpu": 2})],
            [job("e1", "app", 0, 100, environment="pool", gpu=h(1))],
            environments=[{"name": "pool", "resources": res(4, gpu=h(2)), "replicas": 2}],
        ),
        {"e1": REJ("Unschedulable")},
    ),
    # ... and in the gate: quota 4, x (2 GPU) runs 0-100; e1's pool (4) -> 2 + 4 > 4 ->
    # MaxResources until x ends.
    Case(
        "environment-footprint-in-MaxResources-gate",
        scenario(
            C1,
            [make_queue("app", max_resources={"gpu": 4})],
            [
                job("x", "app", 0, 100, gpu=h(2)),
                job("e1", "app", 1, 100, environment="pool", gpu=h(1)),
            ],
            environments=[{"name": "pool", "resources": res(4, gpu=h(2)), "replicas": 2}],
        ),
        {"e1": S(100, 200, "c1", ["MaxResources"])},
    ),
    # Slots = replicas x concurrency = 1 x 1: e2 waits EnvironmentBusy. At 100 e1 ends;
    # idle_ttl 0: the pool goes away right after that completion and e2 places it anew
    # on c1 (the only cluster) in the same instant's pass.
    Case(
        "environment-slots-EnvironmentBusy",
        scenario(
            C1,
            [make_queue("app")],
            [
                job("e1", "app", 0, 100, environment="pool"),
                job("e2", "app", 1, 100, environment="pool"),
            ],
            environments=[{"name": "pool", "resources": res(4, gpu=h(2))}],
        ),
        {"e1": S(0, 100, "c1", []), "e2": S(100, 200, "c1", ["EnvironmentBusy"])},
    ),
]


@pytest.mark.parametrize("case", [c.param() for c in ENVIRONMENTS])
def test_a_warm_environment_is_placed_shared_and_let_go(case: Case, engine: str) -> None:
    check(case, engine)
