"""The audit's checks on made-up records: each defect it must catch, caught; a clean
record, clean. Without these a fault run that "found nothing" could mean the checks
never looked."""

from __future__ import annotations

import dataclasses
import itertools
import json
import random
from pathlib import Path

import pytest
from headway.scheduler.model import QueueSpec
from headway.scheduler.resources import Quota

from .audit import Dispatch, History, PodLine, Report, audit, parse_pod_log
from .procs import Supervisor
from .run import _nondeterminism
from .workload import GI, Planned, PodRes, make_workload, plan_faults

pytestmark = pytest.mark.faults

NODES = {("c", "n-0"): PodRes(8000, 64 * GI, 8), ("c", "n-1"): PodRes(8000, 64 * GI, 8)}
QUEUES = {
    "q": QueueSpec("q", action_concurrency=2, run_concurrency=2, max_resources=Quota(gpu=8)),
}


def planned(action_id: str, replicas: int = 1, gpu: int = 2, run: str = "r1") -> Planned:
    return Planned(action_id, "q", run, PodRes(1000, GI, gpu), replicas, None, 1.0)


def history(action_id: str, *spans: tuple[float, float], **kw: object) -> History:
    fields: dict[str, object] = {
        "executions": 1,
        "status": "COMPLETED",
        "state": "succeeded",
        "reason": "Succeeded",
        "closed_at": max((e for _, e in spans), default=0.0) + 0.1,
        "releases": 1,
        "dispatches": [Dispatch("c", s, e, 1, "completed") for s, e in spans],
    }
    fields.update(kw)
    return History(action_id=action_id, **fields)  # type: ignore[arg-type]


def pod(
    action: str,
    index: int,
    created: float,
    ended: float | None,
    node: str = "n-0",
    gpu: int = 2,
    dispatch: str = "d1",
    outcome: str = "Succeeded",
) -> list[PodLine]:
    name = f"hw-{action}-main-{index}"

    def line(t: float, event: str, out: str | None = None, at: str | None = node) -> PodLine:
        return PodLine(t, "c", action, name, at, event, 1000, GI, gpu, out, "inc-1", dispatch)

    lines = [line(created, "created", at=None), line(created + 0.01, "bound")]
    if ended is not None:
        lines.append(line(ended, "ended", outcome))
    return lines


def run_audit(plans: list[Planned], hists: list[History], lines: list[PodLine]) -> Report:
    return audit(
        plans,
        {h.action_id: h for h in hists},
        lines,
        queues=QUEUES,
        nodes=NODES,
    )


def kinds(report: Report) -> list[str]:
    return sorted({f.kind for f in report.findings})


def test_a_clean_run_has_no_findings() -> None:
    plans = [planned("a"), planned("b", replicas=2, gpu=1)]
    hists = [history("a", (0.0, 5.0)), history("b", (1.0, 6.0))]
    lines = pod("a", 0, 0.5, 4.0) + pod("b", 0, 1.5, 5.0, node="n-1", gpu=1)
    lines += pod("b", 1, 1.5, 5.5, node="n-1", gpu=1)
    report = run_audit(plans, hists, lines)
    assert report.findings == []
    assert report.ended_once == 2 and report.pods_created == 3
    assert report.states == {"succeeded": 2}


def test_a_pod_created_twice_in_one_dispatch_is_run_twice() -> None:
    plans = [planned("a")]
    hists = [history("a", (0.0, 10.0))]
    lines = pod("a", 0, 0.5, 3.0) + pod("a", 0, 4.0, 7.0)
    report = run_audit(plans, hists, lines)
    assert report.twice == ["a"]
    assert "run-twice" in kinds(report)


def test_two_dispatches_may_each_create_the_pod_once() -> None:
    # A queue retry policy dispatching the action again: a new attempt, not a rerun.
    plans = [planned("a")]
    hists = [history("a", (0.0, 3.5), (4.0, 8.0))]
    lines = pod("a", 0, 0.5, 3.0, outcome="NodeLost") + pod("a", 0, 4.5, 7.0, dispatch="d2")
    report = run_audit(plans, hists, lines)
    assert report.findings == []


def test_a_handed_back_action_runs_its_next_attempt_once() -> None:
    # Attempt 1 dispatched to a cluster that created nothing and handed it back (its
    # lease released), attempt 2 (``a~2``, requeued) ran: one action, ended once.
    plans = [planned("a")]
    hists = [history("a", (0.0, 3.5), (5.0, 9.0), releases=2, attempt_releases=[1, 1])]
    lines = pod("a~2", 0, 5.5, 8.0, dispatch="d2")
    report = run_audit(plans, hists, lines)
    assert report.findings == []
    assert report.ended_once == 1 and report.pods_created == 1


@pytest.mark.parametrize(
    "attempt_releases",
    [
        pytest.param([2, 1], id="an attempt released twice before its requeue"),
        pytest.param([1, 0], id="the last attempt never released"),
        pytest.param([0, 2], id="the last attempt released twice"),
    ],
)
def test_a_release_count_off_for_any_attempt_is_ended_twice(attempt_releases: list[int]) -> None:
    plans = [planned("a")]
    hists = [
        history(
            "a",
            (0.0, 3.5),
            (5.0, 9.0),
            releases=sum(attempt_releases),
            attempt_releases=attempt_releases,
        )
    ]
    lines = pod("a~2", 0, 5.5, 8.0, dispatch="d2")
    assert "ended-twice" in kinds(run_audit(plans, hists, lines))


def test_queue_over_its_caps_is_an_overshoot_in_both_records() -> None:
    plans = [planned("a", run="r1"), planned("b", run="r2"), planned("c", run="r3")]
    hists = [history("a", (0.0, 5.0)), history("b", (1.0, 5.0)), history("c", (2.0, 5.0))]
    lines = pod("a", 0, 0.5, 4.0) + pod("b", 0, 1.5, 4.0, node="n-1")
    lines += pod("c", 0, 2.5, 4.0, node="n-1")
    report = run_audit(plans, hists, lines)
    what = " ".join(f.detail for f in report.queue_overshoots)
    assert "action_concurrency 3 > 2" in what and "run_concurrency 3 > 2" in what
    assert "(pod log)" in what and "(histories)" in what


def test_gpu_quota_overshoot_counts_whole_gangs() -> None:
    plans = [planned("a", replicas=2, gpu=3), planned("b", replicas=1, gpu=3)]
    hists = [history("a", (0.0, 5.0)), history("b", (1.0, 5.0))]
    lines = pod("a", 0, 0.5, 4.0, gpu=3) + pod("a", 1, 0.5, 4.0, gpu=3, node="n-1")
    lines += pod("b", 0, 1.5, 4.0, gpu=3, node="n-1")
    report = run_audit(plans, hists, lines)
    assert any("max_resources.gpu(any) 9 > 8" in f.detail for f in report.queue_overshoots)


def test_an_end_and_a_start_at_the_same_instant_do_not_overlap() -> None:
    plans = [planned("a", run="r1"), planned("b", run="r2"), planned("c", run="r3")]
    hists = [history("a", (0.0, 4.0)), history("b", (0.0, 9.0)), history("c", (4.0, 9.0))]
    lines = pod("a", 0, 0.5, 3.0) + pod("b", 0, 0.5, 8.0, node="n-1")
    lines += pod("c", 0, 4.5, 8.0)
    report = run_audit(plans, hists, lines)
    assert report.queue_overshoots == []


def test_a_node_over_its_allocatable_is_an_overshoot() -> None:
    queues = {"q": QueueSpec("q")}
    plans = [planned("a", gpu=6), planned("b", gpu=6)]
    hists = [history("a", (0.0, 5.0)), history("b", (0.0, 5.0))]
    lines = pod("a", 0, 0.5, 4.0, gpu=6) + pod("b", 0, 1.0, 4.5, gpu=6)
    report = audit(plans, {h.action_id: h for h in hists}, lines, queues=queues, nodes=NODES)
    assert [f.subject for f in report.node_overshoots] == ["c/n-0"]
    assert "gpu 12 > 8" in report.node_overshoots[0].detail


def test_lost_and_unended_and_twice_ended_actions() -> None:
    plans = [planned("gone"), planned("stuck"), planned("twice")]
    hists = [
        history("stuck", (0.0, 1.0), status="RUNNING", state=None, closed_at=None),
        history("twice", (0.0, 5.0), executions=2),
    ]
    lines = pod("twice", 0, 0.5, 4.0)
    report = run_audit(plans, hists, lines)
    assert report.lost == ["gone", "stuck"]
    assert "ended-twice" in kinds(report)
    assert report.ended_once == 0


def test_pods_outside_their_dispatch_unended_or_split_are_found() -> None:
    plans = [planned("late", replicas=2), planned("open")]
    hists = [history("late", (0.0, 5.0)), history("open", (0.0, 5.0))]
    # One gang member created 30 s after the other had ended, by no dispatch at all.
    lines = pod("late", 0, 0.5, 2.0) + pod("late", 1, 32.0, 35.0)
    lines += pod("open", 0, 0.5, None, node="n-1")
    report = run_audit(plans, hists, lines)
    found = kinds(report)
    assert "pod-outside-dispatch" in found
    assert "pod-never-ended" in found
    assert "missing-pods" in found  # the succeeded gang's dispatch made one pod of two


def test_a_gang_whose_member_starts_after_another_ended_is_split() -> None:
    plans = [planned("g", replicas=2)]
    hists = [history("g", (0.0, 40.0))]
    lines = pod("g", 0, 0.5, 2.0) + pod("g", 1, 32.0, 35.0)
    assert "gang-split" in kinds(run_audit(plans, hists, lines))


def test_a_failure_is_a_finding_when_every_action_should_succeed() -> None:
    plans = [planned("a")]
    hists = [history("a", (0.0, 5.0), status="FAILED", state="failed", reason="PodLost")]
    lines = pod("a", 0, 0.5, 4.0, outcome="PodLost")
    report = run_audit(plans, hists, lines)
    assert "not-succeeded" in kinds(report)
    assert report.states == {"failed:PodLost": 1}


def test_a_torn_pod_log_line_is_reported_not_fatal() -> None:
    good = json.dumps(
        {
            "t": 1.0,
            "cluster": "c",
            "action": "a",
            "pod": "p",
            "node": None,
            "event": "created",
            "cpu_m": 1,
            "mem": 2,
            "gpu": 0,
            "outcome": None,
            "incarnation": "i",
        }
    )
    lines, bad = parse_pod_log([good, good[:20], ""])
    assert len(lines) == 1 and lines[0].pod == "p" and bad == [good[:20]]


def test_the_workload_and_the_fault_plan_follow_the_seed() -> None:
    a = make_workload(random.Random(7), 330)
    assert a == make_workload(random.Random(7), 330)
    assert len(a) == 330 and len({p.action_id for p in a}) == 330
    assert {p.queue for p in a} == {"train", "eval", "batch"}
    assert any(p.replicas > 1 for p in a)
    for seed in range(50):
        faults = plan_faults(
            random.Random(seed), ["x", "y", "z"], count=6, submit_s=35, window_s=75
        )
        assert len(faults) == 6
        assert {f.kind for f in faults} == {"server", "control-plane", "cluster"}
        assert sum(f.kind == "cluster" for f in faults) >= 2
        assert sum(f.during_submission for f in faults) >= 2
        assert all(b.at_s - a.at_s >= 5 for a, b in itertools.pairwise(faults))


def test_a_created_line_stamped_just_after_its_bound_line_is_the_same_pod() -> None:
    # A backend that stamps "created" when its create call returns may have logged the
    # informer's "bound" first: the same pod, not a pod nobody created.
    plans = [planned("a")]
    hists = [history("a", (0.0, 5.0))]
    lines = pod("a", 0, 0.5, 4.0)
    created, bound = lines[0], lines[1]
    lines[0] = PodLine(
        bound.t + 0.002, *[getattr(created, f) for f in PodLine.__dataclass_fields__][1:]
    )
    report = run_audit(plans, hists, lines)
    assert report.findings == [] and report.created_late == 1


def test_a_pod_seen_without_any_created_line_is_a_gap_in_the_log() -> None:
    plans = [planned("a")]
    hists = [history("a", (0.0, 5.0))]
    lines = [x for x in pod("a", 0, 0.5, 4.0) if x.event != "created"]
    report = run_audit(plans, hists, lines)
    assert any("without a created line" in f.detail for f in report.findings)
    assert report.pods_created == 1  # still counted against its queue and node


def test_a_pod_whose_created_line_a_kill_cut_off_is_its_logged_intents() -> None:
    """The Kubernetes backend logs "creating" before its create call: killed between the
    call and the "created" line, the pod it made is still one the log knows."""
    plans = [planned("a")]
    hists = [history("a", (0.0, 5.0))]
    created, *rest = pod("a", 0, 0.5, 4.0)
    report = run_audit(plans, hists, [dataclasses.replace(created, event="creating"), *rest])
    assert report.findings == [] and report.pods_created == 1


def test_a_nondeterministic_replay_in_a_worker_log_is_a_finding(tmp_path: Path) -> None:
    sup = Supervisor(tmp_path)
    sup.add("control-plane", ["true"])
    (tmp_path / "logs" / "control-plane.log").write_text(
        "ok\n\x1b[33m WARN\x1b[0m Failing workflow task \x1b[3mrun_id\x1b[0m=r-1 failure=Failure"
        ' { failure: Some(Failure { message: "[TMPRL1100] Nondeterminism error: marker x"'
        " }) }\n"
    )
    found = _nondeterminism(sup)
    assert [f.kind for f in found] == ["nondeterminism"]
    assert "r-1" in found[0].detail and "Nondeterminism error: marker x" in found[0].detail


def test_a_pod_seen_bound_and_ended_at_once_holds_its_node_for_no_time() -> None:
    # A restarted worker that finds a pod already finished logs both lines at once.
    plans = [planned("a", gpu=8), planned("b", gpu=8)]
    hists = [history("a", (0.0, 9.0)), history("b", (0.0, 9.0))]
    a = pod("a", 0, 0.5, None, gpu=8)[:1]
    bound = pod("a", 0, 3.0, 3.0, gpu=8)[1:]
    b = pod("b", 0, 4.0, 6.0, gpu=8)
    report = run_audit(
        plans, hists, a + [x.__class__(**{**x.__dict__, "t": 3.0}) for x in bound] + b
    )
    assert report.node_overshoots == [], report.node_overshoots
