"""SWF traces: ``load_swf`` parsing (MaxProcs, skipped jobs, field 8 fallback, estimates),
small hand-computed traces, and the KTH SP2 trace (backfill beats strict by far).

KTH: strict over the whole trace takes ~20 s, so both strict and backfill are run on the
same prefix, the first 5000 jobs (about 2 s each); the full trace is parsed (not
simulated) to check the skipped-job accounting.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from headway.scheduler.simulator import SwfError, load_swf, simulate

from .helpers import HERE, shared_or_copy

KTH = shared_or_copy("traces/KTH-SP2-1996-2.1-cln.swf", HERE / "data" / "KTH-SP2-1996-2.1-cln.swf")


def swf(
    job: int,
    submit: float,
    run: float,
    procs: int,
    req_procs: int = -1,
    req_time: float = -1,
    user: int = 1,
) -> str:
    """One SWF line: 18 fields (unused ones -1)."""
    f = [
        job,
        submit,
        -1,
        run,
        procs,
        -1,
        -1,
        req_procs,
        req_time,
        -1,
        1,
        user,
        -1,
        -1,
        -1,
        -1,
        -1,
        -1,
    ]
    return " ".join(str(x) for x in f)


def trace(*lines: str, max_procs: int | None = None) -> str:
    head = ["; Version: 2.2", "; Computer: test"]
    if max_procs is not None:
        head.append(f"; MaxProcs: {max_procs}")
    head.append("; MaxNodes: 999")  # ignored
    return "\n".join(head + list(lines)) + "\n"


def actions(
    text: str, algorithm: str = "backfill", estimates: str = "requested"
) -> dict[str, dict[str, Any]]:
    sc, skipped = load_swf(text, algorithm, estimates)
    doc = simulate(sc, skipped=skipped).doc
    return {a["id"]: a for a in doc["actions"]}


# --------------------------------------------------------------------------- parsing


def test_maxprocs_header_and_skipped_jobs() -> None:
    # MaxProcs 4. j2 asks 5 > 4, j3 has run time -1, j5 has procs -1 and requested -1:
    # skipped. j4 has allocated 0 -> requested (field 8) = 3 is used.
    text = trace(
        swf(1, 10, 100, 2),
        swf(2, 11, 100, 5),
        swf(3, 12, -1, 2),
        swf(4, 13, 50, 0, req_procs=3),
        swf(5, 14, 50, -1, req_procs=-1),
        max_procs=4,
    )
    sc, skipped = load_swf(text, "strict")
    assert skipped == 3
    assert [w.spec.id for w in sc.workload] == ["1", "4"]
    assert len(sc.workload[1].spec.pods) == 3
    (cl,) = sc.clusters
    assert cl.name == "swf"
    assert sum(g.count for g in cl.node_groups) == 4
    assert all(g.shape.cpu == 1000 and g.shape.gpu == 0 for g in cl.node_groups)
    (q,) = sc.queues
    assert q.name == "swf" and q.algorithm.value == "strict"
    doc = simulate(sc, skipped=skipped).doc
    s = doc["summary"]
    # skipped jobs are not actions: actions 2, first submit 10; j1 10-110, j4 (3 procs;
    # 2 + 3 > 4) 110-160 -> makespan 150.
    assert s["skipped"] == 3
    assert s["actions"] == 2
    assert s["first_submit"] == 10
    assert s["last_end"] == 160
    assert s["makespan"] == 150


def test_skipped_job_before_first_real_submit_is_not_first_submit() -> None:
    text = trace(swf(1, 0, -1, 2), swf(2, 7, 10, 1), max_procs=2)
    sc, skipped = load_swf(text, "greedy")
    doc = simulate(sc, skipped=skipped).doc
    assert skipped == 1
    assert doc["summary"]["first_submit"] == 7
    assert doc["summary"]["makespan"] == 10


def test_maxprocs_fallback_is_largest_procs_of_valid_jobs() -> None:
    # No header: j2 (6 procs) has run time -1, so it does not count: MaxProcs = 3
    # (j3 via field 8). Then j2 is skipped (duration < 0), j4 (4 > 3) skipped.
    text = trace(
        swf(1, 0, 10, 2),
        swf(2, 0, -1, 6),
        swf(3, 0, 10, -1, req_procs=3),
        swf(4, 1, 10, 2),
    )
    sc, skipped = load_swf(text, "greedy")
    assert sum(g.count for g in sc.clusters[0].node_groups) == 3
    assert skipped == 1
    assert [w.spec.id for w in sc.workload] == ["1", "3", "4"]


def test_maxprocs_fallback_skips_larger_jobs_when_header_is_smaller() -> None:
    text = trace(swf(1, 0, 10, 8), swf(2, 0, 10, 2), max_procs=4)
    sc, skipped = load_swf(text, "greedy")
    assert skipped == 1 and [w.spec.id for w in sc.workload] == ["2"]


def test_each_job_is_a_gang_of_one_cpu_pods() -> None:
    sc, _ = load_swf(trace(swf(1, 0, 10, 3), max_procs=4), "easy")
    w = sc.workload[0]
    assert w.duration == 10 and w.spec.submit == 0
    assert len(w.spec.pods) == 3 and all(p.cpu == 1000 and p.gpu == 0 for p in w.spec.pods)


@pytest.mark.parametrize(
    ("mode", "expected"),
    [
        # requested: field 9 where > 0, else the duration
        ("requested", [300.0, 50.0]),
        # actual: the duration
        ("actual", [100.0, 50.0]),
        # history: no declared estimate (the task's history decides at run time)
        ("history", [None, None]),
    ],
)
def test_estimates(mode: str, expected: list[float | None]) -> None:
    text = trace(
        swf(1, 0, 100, 1, req_time=300, user=7), swf(2, 0, 50, 1, req_time=0, user=7), max_procs=2
    )
    sc, _ = load_swf(text, "backfill", mode)
    assert [w.spec.estimate for w in sc.workload] == expected
    if mode == "history":
        # per user (field 12) as task
        assert sc.workload[0].spec.task == sc.workload[1].spec.task


def test_bad_algorithm_and_estimates_and_fields() -> None:
    with pytest.raises(SwfError, match="fifo"):
        load_swf(trace(swf(1, 0, 1, 1)), "fifo")
    with pytest.raises(SwfError, match="guess"):
        load_swf(trace(swf(1, 0, 1, 1)), "strict", "guess")
    with pytest.raises(SwfError, match="18 fields"):
        load_swf("1 2 3\n", "strict")


# --------------------------------------------------------------------------- hand-computed runs

# MaxProcs 4. j1 (2 procs, 100 s, req 100) at 0; j2 (4 procs, 50 s) at 1 cannot start
# until j1 ends (reservation R = 100); j3 (2 procs, 10 s, req 20) at 2; j4 (1 proc,
# 500 s, req 500) at 3.
SMALL = trace(
    swf(1, 0, 100, 2, req_time=100),
    swf(2, 1, 50, 4, req_time=50),
    swf(3, 2, 10, 2, req_time=20),
    swf(4, 3, 500, 1, req_time=500),
    max_procs=4,
)


def starts(acts: dict[str, dict[str, Any]]) -> dict[str, float]:
    return {k: v["start"] for k, v in acts.items()}


def test_small_trace_backfill() -> None:
    # j3: 2 + 20 = 22 <= 100 -> backfilled at 2 (ends 12). j4 at 3: no room (j1 + j3
    # hold all 4) -> NoClusterCapacity; at 12 it fits but 12 + 500 > 100 ->
    # BackfillWindow; at 100 j2 takes all 4 -> j4 at 150.
    acts = actions(SMALL, "backfill")
    assert starts(acts) == {"1": 0, "2": 100, "3": 2, "4": 150}
    assert acts["4"]["reasons"] == ["NoClusterCapacity", "BackfillWindow"]


def test_small_trace_backfill_summary() -> None:
    sc, skipped = load_swf(SMALL, "backfill")
    s = simulate(sc, skipped=skipped).doc["summary"]
    # waits 0, 99, 0, 147; bounded slowdowns 1, 149/50, 1, 647/500
    assert s["mean_wait"] == pytest.approx((99 + 147) / 4)
    assert s["mean_bounded_slowdown"] == pytest.approx((1 + 149 / 50 + 1 + 647 / 500) / 4)
    assert s["makespan"] == 650 and s["skipped"] == 0 and s["actions"] == 4


def test_small_trace_strict() -> None:
    # strict: j3, j4 wait behind j2 (HeldForGang), then start together at 150.
    acts = actions(SMALL, "strict")
    assert starts(acts) == {"1": 0, "2": 100, "3": 150, "4": 150}
    assert acts["3"]["reasons"] == ["HeldForGang", "NoClusterCapacity"]


def test_small_trace_greedy() -> None:
    # greedy: j3 at 2 (free 0 after), j4 at 12 when j3 ends; j2 needs 4 free: only when
    # j4 ends at 512.
    acts = actions(SMALL, "greedy")
    assert starts(acts) == {"1": 0, "2": 512, "3": 2, "4": 12}


def test_small_trace_history_without_estimates_holds_like_strict() -> None:
    # history, every job a different user: no estimates at all. j1 runs with no estimate
    # -> j2's reservation cannot be computed -> hold as under strict.
    text = trace(
        swf(1, 0, 100, 2, user=1),
        swf(2, 1, 50, 4, user=2),
        swf(3, 2, 10, 2, user=3),
        max_procs=4,
    )
    assert starts(actions(text, "backfill", "history")) == {"1": 0, "2": 100, "3": 150}


def test_small_trace_history_estimate_from_same_user() -> None:
    # --estimates history: the task is the user (field 12).
    # t=0: j10 (user 9, 10 s) and j11 (user 1, 500 s) start: histories u9 [10], u1 [500].
    # t=600: j1 (user 1, 2 procs, 1000 s) starts with estimate 500 -> est end 1100.
    # t=601: j2 (4 procs) cannot fit: reservation R = 1100.
    # t=602: j3 (user 9, 2 procs): estimate 10 -> 612 <= 1100 -> backfilled (ends 612).
    # t=700: j4 (user 3, no history): no estimate -> never backfilled: BackfillWindow.
    # t=1600: j1 ends: j2 1600-1650, j4 no room; t=1650: j4.
    text = trace(
        swf(10, 0, 10, 1, user=9),
        swf(11, 0, 500, 1, user=1),
        swf(1, 600, 1000, 2, user=1),
        swf(2, 601, 50, 4, user=2),
        swf(3, 602, 10, 2, user=9),
        swf(4, 700, 10, 1, user=3),
        max_procs=4,
    )
    acts = actions(text, "backfill", "history")
    assert starts(acts) == {"10": 0, "11": 0, "1": 600, "2": 1600, "3": 602, "4": 1650}
    assert acts["3"]["reasons"] == []
    assert acts["4"]["reasons"] == ["BackfillWindow", "NoClusterCapacity"]


# --------------------------------------------------------------------------- KTH


def _prefix(text: str, n: int) -> str:
    out, jobs = [], 0
    for line in text.splitlines():
        if line.startswith(";") or not line.strip():
            out.append(line)
            continue
        if jobs >= n:
            break
        out.append(line)
        jobs += 1
    return "\n".join(out) + "\n"


@pytest.fixture(scope="module")
def kth_text() -> str:
    assert KTH.exists(), f"KTH trace missing: {KTH}"
    return Path(KTH).read_text()


def test_kth_parses_with_skipped_accounting(kth_text: str) -> None:
    sc, skipped = load_swf(kth_text, "backfill")
    jobs = [ln.split() for ln in kth_text.splitlines() if ln.strip() and not ln.startswith(";")]
    assert len(jobs) == 28476
    expected_skipped = 0
    for f in jobs:
        procs = int(f[4]) if int(f[4]) > 0 else int(f[7])
        if float(f[3]) < 0 or procs <= 0 or procs > 100:  # MaxProcs: 100
            expected_skipped += 1
    assert skipped == expected_skipped
    assert len(sc.workload) + skipped == 28476
    assert sum(g.count for g in sc.clusters[0].node_groups) == 100


def test_kth_backfill_beats_strict_on_bounded_slowdown(kth_text: str) -> None:
    text = _prefix(kth_text, 5000)
    res = {}
    for alg in ("strict", "backfill"):
        sc, skipped = load_swf(text, alg)
        s = simulate(sc, skipped=skipped).doc["summary"]
        assert s["actions"] == 5000
        res[alg] = s["mean_bounded_slowdown"]
    assert res["backfill"] * 10 <= res["strict"], res


# The SWF worked examples beside simulate.md: each expect file's rule says how it is run.
SWF_EXAMPLES = sorted(shared_or_copy("specs/examples", HERE / "examples").glob("*.swf"))
SWF_RUNS = {"31_easy_extra_busy_nodes_first": ("easy", "requested")}


def test_every_swf_example_says_how_it_is_run() -> None:
    assert SWF_EXAMPLES and {p.stem for p in SWF_EXAMPLES} <= set(SWF_RUNS)


@pytest.mark.parametrize("path", SWF_EXAMPLES, ids=lambda p: p.stem)
def test_swf_worked_example(path: Path) -> None:
    import json

    algorithm, estimates = SWF_RUNS[path.stem]
    expect = json.loads(path.with_suffix(".expect.json").read_text())
    acts = actions(path.read_text(), algorithm, estimates)
    for job, want in expect["actions"].items():
        assert {k: acts[job][k] for k in want} == want, job


def test_easy_head_takes_the_busy_nodes_so_a_free_node_stays_in_the_extra() -> None:
    # Example 31 under backfill: job 4 (ends after the reservation) waits for job 3.
    path = next(p for p in SWF_EXAMPLES if p.stem.startswith("31_"))
    assert starts(actions(path.read_text(), "backfill"))["4"] == 10
    assert starts(actions(path.read_text(), "easy"))["4"] == 5


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("", "t.swf: no jobs in it"),
        ("\n\n", "t.swf: no jobs in it"),
        (trace(max_procs=4), "t.swf: no jobs in it"),
        (trace(swf(1, 0, -1, 2), swf(2, 0, 10, 9), max_procs=4), "none of its 2 jobs can run"),
    ],
    ids=["empty", "blank-lines", "only-comments", "every-job-skipped"],
)
def test_a_trace_without_a_job_to_run_is_an_error_naming_it(text: str, says: str) -> None:
    with pytest.raises(SwfError, match=says):
        load_swf(text, "backfill", source="t.swf")
