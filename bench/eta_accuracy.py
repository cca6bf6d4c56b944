"""How good are start estimates? Predicted at submission, scored against the actual start.

Replays Parallel Workloads Archive traces (KTH-SP2, and a Lublin model trace) through the
scheduler core, the very code ``headway simulate --swf`` and the scheduler workflow run
(EASY backfilling on one cluster of the trace's processors, the scheduler deciding with
the users' requested times, jobs really ending at their recorded runtimes). At each
sampled job's submission, its start is predicted from the state then, by running the same
core forward on a copy of that state (``Scheduler.from_snapshot``), the way ``headway
forecast`` does, under two assumptions about when work ends:

* ``squeue``: every job runs for its requested time: the plain shadow-schedule projection
  from requested times that ``squeue --start`` gives;
* ``history``: every job runs for the mean of its user's last two recorded runtimes
  (capped by its requested time; its requested time while the user has none), and a
  running job already past that is expected to run to its requested time (it is not a
  typical run; its limit is the one bound known).

Both let the copy decide with the requested times, as the real scheduler does: only the
ends differ. The p90 of ``history`` adds the 90th percentile of the errors of the jobs
already started when the prediction is made (online, nothing from the future).

A trace without requested times (the Lublin model's) gets the partition's limit for
every job, the longest runtime in the trace, as Slurm uses a partition's MaxTime for
jobs that ask for none.

Figures per trace and predictor, over the sampled jobs (and over those that waited):
``median_abs_error_s``, ``within_25pct`` (the share whose predicted wait is within
+-25 % of the actual wait; a job that did not wait counts only if predicted not to) and
``within_10min`` (the share whose predicted start is within 10 minutes), and for the
p90 its coverage (the share that started by it).

    python bench/eta_accuracy.py [--samples 400] [--lublin PATH] [--kth PATH]
"""

from __future__ import annotations

import argparse
import bisect
import dataclasses
import heapq
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import calib_us, calibration  # type: ignore[import-not-found]
from headway.scheduler.core import Scheduler
from headway.scheduler.scenario import Scenario, WorkItem
from headway.scheduler.simulator import load_swf

REPO = Path(__file__).resolve().parent.parent
KTH = REPO / "tests" / "scheduler" / "data" / "KTH-SP2-1996-2.1-cln.swf"
#: The project's shared traces sit beside the repository (as in CI).
LUBLIN = REPO.parent / "shared" / "traces" / "lublin_256.swf"

#: Forward steps of one projection before giving up (the job counts as never predicted).
MAX_STEPS = 20_000


@dataclasses.dataclass
class Job:
    id: str
    user: str
    submit: float
    runtime: float
    requested: float


def load(path: Path) -> tuple[Scenario, dict[str, Job]]:
    """The trace as a scenario whose estimates are the requested times (the partition's
    limit where the trace has none), and its jobs."""
    text = path.read_text()
    sc, _skipped = load_swf(text, "easy", estimates="history", source=str(path))
    requested: dict[str, float] = {}
    for line in text.splitlines():
        f = line.split()
        if f and not line.lstrip().startswith(";") and len(f) >= 18:
            requested[f[0]] = float(f[8])
    limit = max(w.duration for w in sc.workload)
    jobs: dict[str, Job] = {}
    work: list[WorkItem] = []
    for w in sc.workload:
        req = requested.get(w.spec.id, -1.0)
        req = max(req, w.duration) if req > 0 else limit
        jobs[w.spec.id] = Job(w.spec.id, w.spec.task, w.spec.submit, w.duration, req)
        work.append(dataclasses.replace(w, spec=dataclasses.replace(w.spec, estimate=req)))
    return dataclasses.replace(sc, workload=work), jobs


class History:
    """Each user's recorded runtimes, as the jobs end."""

    def __init__(self) -> None:
        self.runs: dict[str, list[float]] = {}

    def record(self, job: Job) -> None:
        self.runs.setdefault(job.user, []).append(job.runtime)

    def expected(self, job: Job) -> float:
        last = self.runs.get(job.user, [])[-2:]
        return min(sum(last) / len(last), job.requested) if last else job.requested


def project(
    sched: Scheduler,
    now: float,
    target: str,
    runtime: Callable[[str], float],
    started: dict[str, float],
    jobs: dict[str, Job],
) -> float | None:
    """When ``target`` starts if every job runs ``runtime(id)``: the core forward on a copy."""
    sim = Scheduler.from_snapshot(sched.to_snapshot())
    ends: list[tuple[float, int, str]] = []
    for a in sim.actions.values():
        if a.state == "running":
            end = started[a.id] + runtime(a.id)
            if end <= now:
                # Past what was expected, it is not a typical run: it may go to its limit.
                end = max(now, started[a.id] + jobs[a.id].requested)
            heapq.heappush(ends, (end, a.seq, a.id))
    t = now
    for _ in range(MAX_STEPS):
        for adm in sim.schedule(t):
            if adm.action_id == target:
                return t
            act = sim.actions[adm.action_id]
            heapq.heappush(ends, (t + runtime(adm.action_id), act.seq, act.id))
        if not ends:
            return None
        t = ends[0][0]
        while ends and ends[0][0] <= t:
            _, _, aid = heapq.heappop(ends)
            sim.finish(aid, t)
    return None


def replay(sc: Scenario, jobs: dict[str, Job], samples: int) -> list[dict[str, Any]]:
    """Replay the trace; predict each sampled job's start at its submission."""
    sched = Scheduler(sc.clusters, sc.queues, sc.org, sc.environments)
    work = sorted(sc.workload, key=lambda w: (w.spec.submit, w.spec.seq))
    every = max(1, len(work) // samples)
    sampled = {w.spec.id for w in work[::every]}
    history = History()
    started: dict[str, float] = {}
    # Errors (actual - predicted p50) of the jobs started so far, sorted: the p90 margin.
    known_errors: list[float] = []
    preds: dict[str, dict[str, Any]] = {}
    ends: list[tuple[float, int, str]] = []
    i = 0
    while i < len(work) or ends:
        now = min(
            work[i].spec.submit if i < len(work) else float("inf"),
            ends[0][0] if ends else float("inf"),
        )
        while ends and ends[0][0] <= now:
            _, _, aid = heapq.heappop(ends)
            sched.finish(aid, now)
            history.record(jobs[aid])
        batch = []
        while i < len(work) and work[i].spec.submit <= now:
            sched.submit(work[i].spec, now, door=False)
            batch.append(work[i].spec.id)
            i += 1
        for jid in batch:
            if jid not in sampled:
                continue
            # Expectations as of now: the history is read at the prediction, once per job.
            expected = {a: history.expected(jobs[a]) for a in sched.actions}
            p50 = project(sched, now, jid, lambda a, e=expected: e[a], started, jobs)  # type: ignore[misc]
            sq = project(sched, now, jid, lambda a: jobs[a].requested, started, jobs)
            margin = (
                known_errors[int(0.9 * (len(known_errors) - 1))] if len(known_errors) >= 20 else 0.0
            )
            preds[jid] = {"submit": now, "squeue": sq, "history": p50, "history_p90": None}
            if p50 is not None:
                preds[jid]["history_p90"] = p50 + max(0.0, margin)
        for adm in sched.schedule(now):
            started[adm.action_id] = now
            job = jobs[adm.action_id]
            heapq.heappush(ends, (now + job.runtime, sched.actions[adm.action_id].seq, job.id))
            p = preds.get(adm.action_id)
            if p is not None:
                p["actual"] = now
                if p["history"] is not None:
                    bisect.insort(known_errors, now - p["history"])
    return [{"id": k, **v} for k, v in preds.items() if "actual" in v]


def score(preds: list[dict[str, Any]], key: str) -> dict[str, Any]:
    errs, within25, within10 = [], 0, 0
    missing = 0
    for p in preds:
        if p[key] is None:
            missing += 1
            continue
        err = p[key] - p["actual"]
        errs.append(abs(err))
        pred_wait, wait = p[key] - p["submit"], p["actual"] - p["submit"]
        within25 += abs(pred_wait - wait) <= 0.25 * wait if wait > 0 else pred_wait <= 0
        within10 += abs(err) <= 600
    n = len(preds)
    return {
        "n": n,
        "unpredicted": missing,
        "median_abs_error_s": round(statistics.median(errs), 1) if errs else None,
        "within_25pct": round(within25 / n, 3) if n else None,
        "within_10min": round(within10 / n, 3) if n else None,
    }


def figures(preds: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for subset, ps in (("all", preds), ("waited", [p for p in preds if p["actual"] > p["submit"]])):
        cov = [p for p in ps if p["history_p90"] is not None]
        out[subset] = {
            "squeue": score(ps, "squeue"),
            "history": score(ps, "history"),
            "history_p90_coverage": round(
                sum(p["actual"] <= p["history_p90"] for p in cov) / len(cov), 3
            )
            if cov
            else None,
        }
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--samples", type=int, default=400, help="jobs predicted per trace")
    ap.add_argument("--kth", type=Path, default=KTH)
    ap.add_argument("--lublin", type=Path, default=LUBLIN)
    args = ap.parse_args()
    calib_start = calib_us()
    out: dict[str, Any] = {"samples": args.samples, "traces": {}}
    for name, path in (("KTH-SP2", args.kth), ("Lublin-256", args.lublin)):
        if not path.exists():
            print(
                f"eta_accuracy: {name}: no trace at {path} (pass --{name.split('-')[0].lower()})",
                file=sys.stderr,
            )
            sys.exit(2)
        t0 = time.perf_counter()
        sc, jobs = load(path)
        preds = replay(sc, jobs, args.samples)
        out["traces"][name] = {
            "jobs": len(jobs),
            "seconds": round(time.perf_counter() - t0, 1),
            **figures(preds),
        }
    out["calib_us"] = calibration(calib_start, calib_us())
    out["normalized"] = {}
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
