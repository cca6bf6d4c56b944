"""What the door takes in or rejects at submission (queue status, depth, rate,
fan-out, what could ever fit), and in which order it checks.

The table runs against both engines (``engine``: the reference pass and the
incremental core)."""

from __future__ import annotations

import pytest

from ..helpers import job, make_cluster, make_queue, scenario
from .cases import C1, NCC, REJ, Case, Q, S, check, h

SUBMISSION = [
    # Queue status draining (and drained): every submission is rejected QueueDraining.
    Case(
        "draining-queue-rejects-QueueDraining",
        scenario(C1, [make_queue("q", status="draining")], [job("a", "q", 0, 10)]),
        {"a": REJ("QueueDraining")},
        queues={"q": {"admitted": 0, "rejected": 1}},
    ),
    Case(
        "drained-queue-rejects-QueueDraining",
        scenario(C1, [make_queue("q", status="drained")], [job("a", "q", 0, 10)]),
        {"a": REJ("QueueDraining")},
    ),
    # Checks run in order: draining AND depth 0 -> the first, QueueDraining.
    Case(
        "draining-checked-before-depth",
        scenario(C1, [make_queue("q", status="draining", depth=0)], [job("a", "q", 0, 10)]),
        {"a": REJ("QueueDraining")},
    ),
    # depth 2, one 8-GPU node. a runs 0-100, b waits (q holds 2) -> c (t=2) rejected.
    # t=100: a completes first, then d is submitted: q holds b only -> accepted.
    # b starts 100 (ends 200), d starts 200 (ends 300).
    Case(
        "depth-counts-waiting-plus-running-QueueDepthExceeded",
        scenario(
            C1,
            [make_queue("q", depth=2)],
            [
                job("a", "q", 0, 100, gpu=h(8)),
                job("b", "q", 1, 100, gpu=h(8)),
                job("c", "q", 2, 100, gpu=h(8)),
                job("d", "q", 100, 100, gpu=h(8)),
            ],
        ),
        {
            "a": S(0, 100),
            "b": S(100, 200, reasons=[NCC]),
            "c": REJ("QueueDepthExceeded"),
            "d": S(200, 300, reasons=[NCC]),
        },
        queues={"q": {"admitted": 3, "rejected": 1, "pending": 0}},
    ),
    # Token bucket: burst 2, 0.5 token/s, starts full. t=0: a, b spend both; c
    # RateLimited. t=1: 0.5 tokens -> d RateLimited. t=2: 1.0 -> e accepted (0 left).
    # t=100: refilled, capped at burst 2 -> f, g accepted, h RateLimited.
    Case(
        "token-bucket-starts-full-refills-on-event-clock-capped-at-burst-RateLimited",
        scenario(
            C1,
            Q,
            [
                job("a", "q", 0, 1),
                job("b", "q", 0, 1),
                job("c", "q", 0, 1),
                job("d", "q", 1, 1),
                job("e", "q", 2, 1),
                job("f", "q", 100, 1),
                job("g", "q", 100, 1),
                job("h", "q", 100, 1),
            ],
            org={"submit_rate": {"per_second": 0.5, "burst": 2}},
        ),
        {
            "a": S(0),
            "b": S(0),
            "c": REJ("RateLimited"),
            "d": REJ("RateLimited"),
            "e": S(2),
            "f": S(100),
            "g": S(100),
            "h": REJ("RateLimited"),
        },
    ),
    # A token is spent only when the rate check passes: burst 2, no refill, depth 1.
    # a (0-100) spends one; b (t=1) fails depth first and spends none; c (t=200) takes
    # the last token; d (t=300) RateLimited. (Had b spent one, c would be RateLimited.)
    Case(
        "depth-checked-before-rate-no-token-spent-on-earlier-failure",
        scenario(
            C1,
            [make_queue("q", depth=1)],
            [
                job("a", "q", 0, 100),
                job("b", "q", 1, 10),
                job("c", "q", 200, 10),
                job("d", "q", 300, 10),
            ],
            org={"submit_rate": {"per_second": 0, "burst": 2}},
        ),
        {"a": S(0), "b": REJ("QueueDepthExceeded"), "c": S(200), "d": REJ("RateLimited")},
    ),
    # A queue's own bucket (burst 2, 1 token/s), the org unlimited: at t=0 a and b take
    # both tokens, c RateLimited; t=0.5: half a token, d RateLimited; t=1: one, e in.
    # Queue p has no rate: its burst of three all go in at t=0.
    Case(
        "queue-submit-rate-is-its-own-bucket-RateLimited",
        scenario(
            [make_cluster("c1")],
            [make_queue("q", submit_rate={"per_second": 1, "burst": 2}), make_queue("p")],
            [
                job("a", "q", 0, 1),
                job("b", "q", 0, 1),
                job("c", "q", 0, 1),
                job("d", "q", 0.5, 1),
                job("e", "q", 1, 1),
                job("x", "p", 0, 1),
                job("y", "p", 0, 1),
                job("z", "p", 0, 1),
            ],
        ),
        {
            "a": S(0),
            "b": S(0),
            "c": REJ("RateLimited"),
            "d": REJ("RateLimited"),
            "e": S(1),
            "x": S(0),
            "y": S(0),
            "z": S(0),
        },
        queues={
            "q": {"admitted": 3, "rejected": 2, "pending": 0},
            "p": {"admitted": 3, "rejected": 0, "pending": 0},
        },
    ),
    # Both buckets apply, a token taken from each only together: the org's (burst 3,
    # no refill) and q's (burst 1, 1/s). t=0: a in (org 2, q 0); b RateLimited by q, the
    # org keeps its token; t=1: c in (org 1); t=1: p's d in (org 0); t=5: e RateLimited
    # by the org although q's bucket is full again.
    Case(
        "queue-and-org-buckets-take-a-token-only-together",
        scenario(
            [make_cluster("c1")],
            [make_queue("q", submit_rate={"per_second": 1, "burst": 1}), make_queue("p")],
            [
                job("a", "q", 0, 1),
                job("b", "q", 0, 1),
                job("c", "q", 1, 1),
                job("d", "p", 1, 1),
                job("e", "q", 5, 1),
            ],
            org={"submit_rate": {"per_second": 0, "burst": 3}},
        ),
        {
            "a": S(0),
            "b": REJ("RateLimited"),
            "c": S(1),
            "d": S(1),
            "e": REJ("RateLimited"),
        },
    ),
    # max_queued_time 50 s on q (one node, 8 GPUs; each job takes all 8). a runs 0-100;
    # b (t=1) would start at 100 but its time is up at 51: QueuedTooLong then, and c
    # (t=60) starts at 100 in its place (40 s of its 50). d (t=70) would start at 200
    # and is QueuedTooLong at 120. Queue p has no limit: e (t=2) waits and starts at
    # 200, after c, whatever it waited (p is the lower priority).
    Case(
        "max-queued-time-rejects-the-waiting-QueuedTooLong-and-frees-its-place",
        scenario(
            C1,
            [make_queue("q", max_queued_time=50), make_queue("p", priority="low")],
            [
                job("a", "q", 0, 100, gpu=h(8)),
                job("b", "q", 1, 100, gpu=h(8)),
                job("e", "p", 2, 100, gpu=h(8)),
                job("c", "q", 60, 100, gpu=h(8)),
                job("d", "q", 70, 100, gpu=h(8)),
            ],
        ),
        {
            "a": S(0, 100),
            "b": REJ("QueuedTooLong"),
            "c": S(100, 200, reasons=[NCC]),
            "d": REJ("QueuedTooLong"),
            "e": S(200, 300, reasons=[NCC]),
        },
        queues={
            "q": {"admitted": 2, "rejected": 2, "pending": 0},
            "p": {"admitted": 1, "rejected": 0, "pending": 0},
        },
    ),
    # A limit of 0 with a duration notation ("0s"): what cannot start at its submission
    # is rejected at once; what can, starts.
    Case(
        "max-queued-time-zero-starts-now-or-never",
        scenario(
            C1,
            [make_queue("q", max_queued_time="0s")],
            [job("a", "q", 0, 10, gpu=h(8)), job("b", "q", 0, 10, gpu=h(8))],
        ),
        {"a": S(0, 10), "b": REJ("QueuedTooLong")},
    ),
    # Fan-out counts the run's ACCEPTED actions, all time. max 2 per run, depth 1:
    # a (R, 0-100) accepted (1); b (R, t=1) rejected by depth (not counted); c (R, t=200)
    # accepted (2; a has ended but still counts); d (R, t=300) FanOutExceeded;
    # e (other run) accepted.
    Case(
        "fan-out-counts-accepted-actions-all-time-FanOutExceeded",
        scenario(
            C1,
            [make_queue("q", depth=1)],
            [
                job("a", "q", 0, 100, run="R"),
                job("b", "q", 1, 10, run="R"),
                job("c", "q", 200, 10, run="R"),
                job("d", "q", 300, 10, run="R"),
                job("e", "q", 400, 10, run="R2"),
            ],
            org={"max_actions_per_run": 2},
        ),
        {
            "a": S(0),
            "b": REJ("QueueDepthExceeded"),
            "c": S(200),
            "d": REJ("FanOutExceeded"),
            "e": S(400),
        },
    ),
    # Fan-out is checked before Unschedulable: R already has 1 (max 1); d is also far too
    # big for the quota -> FanOutExceeded.
    Case(
        "fan-out-checked-before-unschedulable",
        scenario(
            C1,
            [make_queue("q", max_resources={"gpu": 4})],
            [job("a", "q", 0, 10, run="R"), job("d", "q", 1, 10, run="R", gpu=h(8))],
            org={"max_actions_per_run": 1},
        ),
        {"a": S(0), "d": REJ("FanOutExceeded")},
    ),
    # The demand alone exceeds max_resources {gpu: 4}: 8 GPU -> Unschedulable, at once.
    Case(
        "demand-over-quota-Unschedulable",
        scenario(C1, [make_queue("q", max_resources={"gpu": 4})], [job("a", "q", 0, 10, gpu=h(8))]),
        {"a": REJ("Unschedulable")},
    ),
    # A typed quota counts that type only: an A100 demand passes an H200 quota.
    Case(
        "typed-quota-ignores-other-types-at-submission",
        scenario(
            [make_cluster("c1", gpu_type="A100")],
            [make_queue("q", max_resources={"gpu": h(4)})],
            [job("a", "q", 0, 10, gpu="A100:8")],
        ),
        {"a": S(0, 10, "c1", [])},
    ),
    # A 16-GPU pod on 8-GPU nodes: no node shape holds it, even empty (two such nodes,
    # 16 GPU in total, do not help: a pod lives on one node).
    Case(
        "pod-larger-than-any-node-Unschedulable",
        scenario(
            [make_cluster("c1", nodes=2)],
            Q,
            [job("a", "q", 0, 10, gpu=h(16)), job("b", "q", 0, 10, gpu=h(8), replicas=2)],
        ),
        {"a": REJ("Unschedulable"), "b": S(0, 10, "c1", [])},
    ),
    # A gang goes on ONE cluster: 3 x 4 GPU = 12 fits neither 8-GPU cluster, though the
    # fleet has 16.
    Case(
        "gang-larger-than-any-one-cluster-Unschedulable",
        scenario(
            [make_cluster("c1"), make_cluster("c2")],
            Q,
            [job("g", "q", 0, 10, gpu=h(4), replicas=3)],
        ),
        {"g": REJ("Unschedulable")},
    ),
    # A typed GPU demand never fits bare-count GPU nodes; a bare demand fits typed nodes.
    Case(
        "typed-demand-on-bare-count-nodes-Unschedulable-bare-demand-fits-typed",
        scenario(
            [make_cluster("bare", gpu_type=None), make_cluster("typed", gpu_type="A100")],
            [make_queue("qb", clusters=["bare"]), make_queue("qt", clusters=["typed"])],
            [
                job("t", "qb", 0, 10, gpu=h(1)),
                job("b", "qb", 0, 10, gpu=1),
                job("x", "qt", 0, 10, gpu=2),
            ],
        ),
        {"t": REJ("Unschedulable"), "b": S(0, 10, "bare", []), "x": S(0, 10, "typed", [])},
    ),
    # Only clusters the queue may use count: q pinned to the CPU-only c1; c2 has GPUs.
    Case(
        "selector-without-gpu-cluster-Unschedulable",
        scenario(
            [make_cluster("c1", gpus=None), make_cluster("c2")],
            [make_queue("q", clusters=["c1"])],
            [job("a", "q", 0, 10, gpu=h(1))],
        ),
        {"a": REJ("Unschedulable")},
    ),
    # "healthy or not": c2 (the only GPU cluster) is down at t=0 (events before
    # submissions) - a is still accepted, waits NoClusterCapacity, starts at cluster_up.
    Case(
        "unhealthy-but-allowed-cluster-counts-for-submission",
        scenario(
            [make_cluster("c1", gpus=None), make_cluster("c2")],
            Q,
            [job("a", "q", 0, 10, gpu=h(4))],
            events=[{"at": 0, "cluster_down": "c2"}, {"at": 50, "cluster_up": "c2"}],
        ),
        {"a": S(50, 60, "c2", [NCC])},
    ),
]


@pytest.mark.parametrize("case", [c.param() for c in SUBMISSION])
def test_a_submission_is_taken_in_or_rejected_by_the_first_check_it_fails(
    case: Case, engine: str
) -> None:
    check(case, engine)
