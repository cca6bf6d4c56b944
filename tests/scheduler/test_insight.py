"""What would unblock it, when will it start, and what if: answers from the same core."""

from __future__ import annotations

from headway.scheduler import (
    ActionSpec,
    Algorithm,
    ClusterSpec,
    NodeGroup,
    Pod,
    QueueSpec,
    Quota,
    Scheduler,
)
from headway.scheduler.insight import explain, forecast, what_if
from headway.scheduler.model import Priority


def make_cluster(name: str = "c1", gpus: int = 8, nodes: int = 1) -> ClusterSpec:
    return ClusterSpec(
        name, (NodeGroup("n", nodes, Pod(cpu=64_000, memory=2**38, gpu=gpus, gpu_type="H200")),)
    )


def act(
    aid: str,
    queue: str,
    gpu: int,
    t: float,
    est: float | None = 100.0,
    seq: int = 0,
    replicas: int = 1,
) -> ActionSpec:
    return ActionSpec(
        aid,
        queue,
        (Pod(cpu=1000, memory=2**30, gpu=gpu, gpu_type="H200"),) * replicas,
        submit=t,
        seq=seq,
        estimate=est,
    )


def test_forecast_runs_the_same_pass_forward_by_estimates() -> None:
    s = Scheduler([make_cluster()], [QueueSpec("q", algorithm=Algorithm.greedy)])
    for i, (g, est) in enumerate([(8, 100.0), (4, 50.0), (4, 30.0), (8, 10.0)]):
        assert s.submit(act(f"a{i}", "q", g, 0.0, est, seq=i), 0.0) is None
    assert [x.action_id for x in s.schedule(0.0)] == ["a0"]
    f = forecast(s, 0.0)
    # a0 ends at 100 -> a1 and a2 start; a2 ends at 130, a1 at 150 -> a3 at 150.
    assert f.starts == {"a1": 100.0, "a2": 100.0, "a3": 150.0}
    assert f.clusters["a3"] == "c1"
    # The forecast did not touch the live scheduler.
    assert s.state("a1") == "waiting" and s.running_count("q") == 1


def test_forecast_expires_what_would_wait_past_max_queued_time() -> None:
    # The same greedy stream with a 120 s limit: a3 would start at 150, 150 s after its
    # submission, so it is rejected at 120 instead, and what-if shows the limit's effect.
    s = Scheduler(
        [make_cluster()], [QueueSpec("q", algorithm=Algorithm.greedy, max_queued_time=120.0)]
    )
    for i, (g, est) in enumerate([(8, 100.0), (4, 50.0), (4, 30.0), (8, 10.0)]):
        assert s.submit(act(f"a{i}", "q", g, 0.0, est, seq=i), 0.0) is None
    assert [x.action_id for x in s.schedule(0.0)] == ["a0"]
    f = forecast(s, 0.0)
    assert f.starts == {"a1": 100.0, "a2": 100.0, "a3": None}
    assert f.expires == {"a3": 120.0}
    assert s.state("a3") == "waiting"  # the live scheduler is untouched
    diff = what_if(s, 0.0, [("q", {"max_queued_time": "1h"})])
    assert diff["a3"] == {"before": None, "after": 150.0, "delta": None}


def test_explain_max_resources_names_dimension_and_needed_raise() -> None:
    s = Scheduler(
        [make_cluster(gpus=8, nodes=2)],
        [QueueSpec("q", algorithm=Algorithm.greedy, max_resources=Quota(gpu=8))],
    )
    s.submit(act("big", "q", 6, 0.0, seq=0), 0.0)
    s.submit(act("next", "q", 4, 0.0, seq=1), 0.0)
    s.schedule(0.0)
    ex = explain(s, "next", 0.0)
    assert ex.reason == "MaxResources"
    assert any("GPU: 6 in flight + 4 requested > 8" in u and "to 10" in u for u in ex.unblock)


def test_explain_no_capacity_gives_projected_fit_time() -> None:
    s = Scheduler([make_cluster()], [QueueSpec("q", algorithm=Algorithm.backfill)])
    s.submit(act("r", "q", 6, 0.0, est=500.0, seq=0), 0.0)
    s.schedule(0.0)
    s.submit(act("g", "q", 2, 10.0, est=100.0, seq=1, replicas=2), 10.0)
    s.schedule(10.0)
    ex = explain(s, "g", 10.0)
    assert ex.reason == "NoClusterCapacity"
    assert ex.details["clusters"]["c1"]["fits_at"] == 500.0
    assert "fits on c1 at t=500" in ex.unblock[0]


def test_explain_held_for_gang_names_the_head() -> None:
    s = Scheduler(
        [make_cluster()],
        [
            QueueSpec("gang", priority=Priority.high, algorithm=Algorithm.strict),
            QueueSpec("small", algorithm=Algorithm.greedy),
        ],
    )
    s.submit(act("run", "small", 4, 0.0, seq=0), 0.0)
    s.schedule(0.0)
    s.submit(act("g", "gang", 6, 1.0, seq=1), 1.0)
    s.submit(act("s", "small", 2, 2.0, seq=2), 2.0)
    s.schedule(2.0)
    ex = explain(s, "s", 2.0)
    assert ex.reason == "HeldForGang"
    assert ex.details["held_by"] == {"c1": "g"}


def test_what_if_raising_a_cap_moves_start_earlier() -> None:
    s = Scheduler(
        [make_cluster(gpus=8, nodes=2)],
        [QueueSpec("q", algorithm=Algorithm.greedy, action_concurrency=1)],
    )
    for i in range(3):
        s.submit(act(f"a{i}", "q", 2, 0.0, est=100.0, seq=i), 0.0)
    s.schedule(0.0)
    w = what_if(s, 0.0, [("q", {"action_concurrency": 3})])
    assert w["a1"] == {"before": 100.0, "after": 0.0, "delta": -100.0}
    assert w["a2"]["before"] == 200.0 and w["a2"]["after"] == 0.0
    # Not applied to the live scheduler.
    assert s.queues["q"].spec.action_concurrency == 1
