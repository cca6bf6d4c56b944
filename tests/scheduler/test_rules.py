"""Every rule of simulate.md as a small table-driven scenario.

Each case is a tiny fleet, queues and workload (YAML built by ``helpers``), and the result
expected for it, worked out BY HAND from the spec; the reasoning is in the comment above
each case. Defaults used below (see ``helpers``): ``make_cluster(name)`` is one node
``{cpu 64, 512Gi, "H200:8"}``; ``job(...)`` is one pod ``{cpu 1, 1Gi}`` plus the GPU given.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest

from .helpers import by_id, job, make_cluster, make_queue, node_group, res, run, scenario

NCC = "NoClusterCapacity"
HFG = "HeldForGang"
BFW = "BackfillWindow"


def h(n: int) -> str:
    return f"H200:{n}"


@dataclass
class Case:
    id: str
    text: str
    actions: dict[str, dict[str, Any]]
    summary: dict[str, Any] = field(default_factory=dict)
    queues: dict[str, dict[str, Any]] = field(default_factory=dict)
    utilization: dict[str, Any] = field(default_factory=dict)

    def param(self) -> Any:
        return pytest.param(self, id=self.id)


def S(
    start: float,
    end: float | None = None,
    cluster: str | None = None,
    reasons: list[str] | None = None,
) -> dict[str, Any]:
    """An action that started (status succeeded)."""
    d: dict[str, Any] = {"start": start, "status": "succeeded"}
    if end is not None:
        d["end"] = end
    if cluster is not None:
        d["cluster"] = cluster
    if reasons is not None:
        d["reasons"] = reasons
    return d


def REJ(reason: str) -> dict[str, Any]:
    return {"status": "rejected", "reasons": [reason], "start": None, "end": None, "cluster": None}


def PEND(reasons: list[str]) -> dict[str, Any]:
    return {"status": "pending", "reasons": reasons, "start": None, "end": None, "cluster": None}


C1 = [make_cluster("c1")]
Q = [make_queue("q")]


def check(case: Case) -> None:
    doc = run(case.text)
    got = by_id(doc)
    problems = []
    for aid, exp in case.actions.items():
        a = got[aid]
        for k, v in exp.items():
            if a[k] != v:
                problems.append(f"{aid}.{k}: expected {v!r}, got {a[k]!r}")
    for k, v in case.summary.items():
        if doc["summary"][k] != pytest.approx(v):
            problems.append(f"summary.{k}: expected {v!r}, got {doc['summary'][k]!r}")
    for qn, exp in case.queues.items():
        for k, v in exp.items():
            if doc["queues"][qn][k] != pytest.approx(v):
                problems.append(f"queues.{qn}.{k}: expected {v!r}, got {doc['queues'][qn][k]!r}")
    for k, v in case.utilization.items():
        if doc["utilization"][k] != pytest.approx(v):
            problems.append(f"utilization.{k}: expected {v!r}, got {doc['utilization'][k]!r}")
    assert not problems, "\n".join(problems)


# =============================================================================== submission

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


# =============================================================================== gates

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


# =============================================================================== priority

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


# =============================================================================== strict / greedy

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


# =============================================================================== backfill / easy

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


# =============================================================================== placement

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


# =============================================================================== unknown capacity, health

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


# =============================================================================== queue status & live updates

LIVE = [
    # draining: rejects new work; waiting work still starts; drained once empty;
    # update_queue to active reopens. a 0-100; b waits (t=1). t=10 draining. c (t=20)
    # rejected. t=100: b starts (ends 200). d (t=150) rejected. t=200 b ends -> drained.
    # e (t=250) rejected. t=300: update_queue active (events before submissions) -> f
    # (t=300) accepted, starts 300.
    Case(
        "draining-then-drained-then-reopened",
        scenario(
            C1,
            Q,
            [
                job("a", "q", 0, 100, gpu=h(8)),
                job("b", "q", 1, 100, gpu=h(8)),
                job("c", "q", 20, 10),
                job("d", "q", 150, 10),
                job("e", "q", 250, 10),
                job("f", "q", 300, 10),
            ],
            events=[
                {"at": 10, "update_queue": {"name": "q", "status": "draining"}},
                {"at": 300, "update_queue": {"name": "q", "status": "active"}},
            ],
        ),
        {
            "b": S(100, 200, reasons=[NCC]),
            "c": REJ("QueueDraining"),
            "d": REJ("QueueDraining"),
            "e": REJ("QueueDraining"),
            "f": S(300, 310, reasons=[]),
        },
    ),
    # update_queue with null unsets a knob: action_concurrency 1 -> null at t=50.
    Case(
        "update-queue-null-unsets-knob",
        scenario(
            C1,
            [make_queue("q", action_concurrency=1)],
            [job("a", "q", 0, 100), job("b", "q", 1, 10)],
            events=[{"at": 50, "update_queue": {"name": "q", "action_concurrency": None}}],
        ),
        {"b": S(50, 60, reasons=["ActionConcurrency"])},
    ),
    # update_queue replaces only the fields given, from that instant's pass: at t=100
    # (with x's completion) lo becomes critical and goes before hi.
    Case(
        "update-queue-priority-applies-from-that-instants-pass",
        scenario(
            C1,
            [make_queue("lo", "low"), make_queue("hi", "high")],
            [
                job("x", "hi", 0, 100, gpu=h(8)),
                job("l", "lo", 1, 100, gpu=h(8)),
                job("hh", "hi", 2, 100, gpu=h(8)),
            ],
            events=[{"at": 100, "update_queue": {"name": "lo", "priority": "critical"}}],
        ),
        {"l": S(100, 200), "hh": S(200, 300)},
    ),
    # Live selector change: q pinned to c1 (busy), re-pinned to [c2] at t=50.
    Case(
        "update-queue-clusters-repins-live",
        scenario(
            [make_cluster("c1"), make_cluster("c2")],
            [make_queue("q", clusters=["c1"])],
            [job("x", "q", 0, 1000, gpu=h(8)), job("a", "q", 1, 10, gpu=h(8))],
            events=[{"at": 50, "update_queue": {"name": "q", "clusters": ["c2"]}}],
        ),
        {"x": S(0, 1000, "c1"), "a": S(50, 60, "c2", [NCC])},
    ),
]


# =============================================================================== environments

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


# =============================================================================== time

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


# =============================================================================== result fields

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


ALL = (
    SUBMISSION
    + GATES
    + PRIORITY
    + STRICT
    + BACKFILL
    + PLACEMENT
    + CAPACITY
    + LIVE
    + ENVIRONMENTS
    + TIME
    + RESULT
)


@pytest.mark.parametrize("case", [c.param() for c in ALL])
def test_rule(case: Case) -> None:
    check(case)


def test_case_ids_unique() -> None:
    ids = [c.id for c in ALL]
    assert len(ids) == len(set(ids))


def test_utilization_gpu_null_on_cpu_only_fleet() -> None:
    doc = run(scenario([make_cluster("c1", gpus=None)], Q, [job("a", "q", 0, 10)]))
    assert doc["utilization"]["gpu"] is None
    assert doc["utilization"]["ephemeral_storage"] is None
    assert doc["utilization"]["cpu"] == pytest.approx(1 / 64)


def test_result_shape_and_nulls_for_unstarted() -> None:
    doc = run(scenario(C1, [make_queue("q", status="drained")], [job("a", "q", 3, 10)]))
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


def test_draining_queue_becomes_drained_once_empty_and_reopens() -> None:
    """Scheduler directly: draining -> drained when it holds nothing; active reopens."""
    from headway.scheduler import ActionSpec, ClusterSpec, NodeGroup, Pod, QueueSpec, Scheduler
    from headway.scheduler.model import QueueStatus

    s = Scheduler(
        [ClusterSpec("c1", (NodeGroup("n", 1, Pod(cpu=1000, memory=2**30)),))], [QueueSpec("q")]
    )
    a = ActionSpec("a", "q", (Pod(cpu=1000),))
    b = ActionSpec("b", "q", (Pod(cpu=1000),), seq=1)
    assert s.submit(a, 0) is None and s.submit(b, 0) is None
    assert [x.action_id for x in s.schedule(0)] == ["a"]
    s.update_queue("q", {"status": "draining"})
    assert s.submit(ActionSpec("c", "q", (Pod(cpu=1000),), seq=2), 1) == "QueueDraining"
    s.finish("a", 10)
    assert [x.action_id for x in s.schedule(10)] == ["b"]  # waiting work still starts
    assert s.queues["q"].spec.status.value == "draining"  # b still runs
    s.finish("b", 20)
    s.schedule(20)
    assert s.queues["q"].spec.status is QueueStatus.drained
    assert s.submit(ActionSpec("d", "q", (Pod(cpu=1000),), seq=3), 21) == "QueueDraining"
    s.update_queue("q", {"status": "active"})
    assert s.submit(ActionSpec("e", "q", (Pod(cpu=1000),), seq=4), 22) is None
    assert [x.action_id for x in s.schedule(22)] == ["e"]


def test_an_idle_queue_set_draining_is_drained_by_the_next_pass() -> None:
    """A queue that holds nothing when set draining becomes drained at the next pass,
    also after passes made before the change (``schedule`` keeps the draining queues
    from one policy change to the next); one still running work stays draining."""
    from headway.scheduler import ActionSpec, ClusterSpec, NodeGroup, Pod, QueueSpec, Scheduler
    from headway.scheduler.model import QueueStatus

    s = Scheduler(
        [ClusterSpec("c1", (NodeGroup("n", 1, Pod(cpu=1000, memory=2**30)),))],
        [QueueSpec("q"), QueueSpec("p")],
    )
    assert s.submit(ActionSpec("a", "p", (Pod(cpu=1000),)), 0) is None
    assert [x.action_id for x in s.schedule(0)] == ["a"]

    def status(name: str) -> QueueStatus:
        return s.queues[name].spec.status

    s.schedule(1)
    s.update_queue("q", {"status": "draining"})
    s.update_queue("p", {"status": "draining"})
    s.schedule(2)
    assert status("q") is QueueStatus.drained
    assert status("p") is QueueStatus.draining
    s.update_queue("q", {"status": "active"})
    s.schedule(3)
    s.update_queue("q", {"status": "draining"})
    s.schedule(4)
    assert status("q") is QueueStatus.drained
    s.finish("a", 5)
    assert status("p") is QueueStatus.drained
