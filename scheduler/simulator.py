"""``headway simulate``: the scheduling review, on a simulated clock.

The simulator is a discrete-event loop around the very same ``Scheduler`` the scheduler
workflow runs; nothing here decides anything. At each instant it applies, in order:
completions, retries due, environment expiries, ``events:`` entries (file order),
submissions (file order), waiting actions past their queue's ``max_queued_time`` rejected
(``QueuedTooLong``), then a scheduling cycle; zero-duration actions started by that cycle
complete at the same instant, in a new round after it.

Failures (a workload entry's ``failures:``) end its attempts one by one before the attempt
that runs its ``duration``. Each failed attempt is retried as the live action workflow
retries it, by the same rule (``retry.next_attempt`` over the queue's policy as it is at
that instant): the next attempt is submitted past the door with the action's first submit
time, as ``ACTION~N``, at once (OOM with raised memory; a lost attempt) or after its
backoff (an application failure; ``NotReady``, which ends ``retry.ready_timeout`` after
its start). A failure the policy does not retry, or a retry the core refuses, is the
action's end: status ``failed``.
"""

from __future__ import annotations

import heapq
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from .core import Scheduler
from .model import ActionSpec, ClusterSpec, NodeGroup, OrgLimits, QueueSpec
from .reasons import Reason
from .resources import Pod
from .retry import NOT_READY_KIND, attempt_id, next_attempt
from .scenario import Scenario, WorkItem

__all__ = ["SimResult", "load_swf", "render_json", "simulate", "summary_text"]


class _Rec:
    # A plain class, not a dataclass: one is made per action of a trace, and a
    # dataclass's generated ``__init__`` (with a default factory) costs more.
    __slots__ = (
        "attempts",
        "cluster",
        "end",
        "item",
        "next",
        "reasons",
        "start",
        "status",
        "used",
    )

    def __init__(self, item: WorkItem) -> None:
        self.item = item
        self.start: float | None = None
        self.end: float | None = None
        self.cluster: str | None = None
        self.status = "pending"
        self.reasons: list[str] = []
        # Only for an entry with failures: each attempt's record, the retries used so
        # far by class (``retry.next_attempt``), and the next attempt's spec from its
        # making until its admission.
        self.attempts: list[dict[str, Any]] = []
        self.used: dict[str, int] = {}
        self.next: ActionSpec | None = None


class _Attempt:
    """The attempt running now of an action: its spec and how it will end."""

    __slots__ = ("kind", "rec", "spec")

    def __init__(self, rec: _Rec, spec: ActionSpec, kind: str) -> None:
        self.rec, self.spec, self.kind = rec, spec, kind


@dataclass
class SimResult:
    """The result document (see simulate.md, "Result (JSON)")."""

    doc: dict[str, Any]


def _percentile(xs: Sequence[float], p: float) -> float:
    s = sorted(xs)
    h = (len(s) - 1) * p
    lo = math.floor(h)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (h - lo) * (s[hi] - s[lo])


def simulate(sc: Scenario, seed: int = 0, skipped: int = 0) -> SimResult:
    """Run a scenario to its end and build the result document.

    ``seed`` is accepted for the CLI contract; the core is deterministic and the
    scenario fully specified, so nothing here draws random numbers.
    """
    del seed
    sched = Scheduler(sc.clusters, sc.queues, sc.org, sc.environments)
    recs = [_Rec(w) for w in sc.workload]
    by_id = {r.item.spec.id: r for r in recs}  # attempts 2+ are added as they are made
    subs = sorted(range(len(recs)), key=lambda i: (recs[i].item.spec.submit, i))
    evs = sorted(range(len(sc.events)), key=lambda i: (sc.events[i][0], i))
    si = ei = 0
    ends: list[tuple[float, int, str]] = []  # (end time, seq, id)
    seq_of = {r.item.spec.id: i for i, r in enumerate(recs)}
    retries: list[tuple[float, int, int, ActionSpec]] = []  # (due, seq, attempt, spec)
    failing: dict[str, _Attempt] = {}  # running attempts of entries with failures
    while True:
        cands = []
        if si < len(subs):
            cands.append(recs[subs[si]].item.spec.submit)
        if ei < len(evs):
            cands.append(sc.events[evs[ei]][0])
        if ends:
            cands.append(ends[0][0])
        if retries:
            cands.append(retries[0][0])
        wake = sched.next_wakeup()
        if wake is not None:
            cands.append(wake)
        if not cands:
            break
        now = min(cands)
        first = True
        while True:
            done = []
            while ends and ends[0][0] <= now:
                done.append(heapq.heappop(ends))
            for _, _, aid in done:
                sched.finish(aid, now)
                att = failing.pop(aid, None)
                if att is not None:
                    nxt = _attempt_ended(sched, att, now)
                    if nxt is not None:
                        by_id[nxt[2].id] = att.rec
                        heapq.heappush(retries, (nxt[0], seq_of[att.rec.item.spec.id], *nxt[1:]))
            while retries and retries[0][0] <= now:
                _, _, _, spec = heapq.heappop(retries)
                _retry(sched, by_id[spec.id], spec, now)
            sched.expire_environments(now)
            if first:
                while ei < len(evs) and sc.events[evs[ei]][0] <= now:
                    _apply_event(sched, sc.events[evs[ei]])
                    ei += 1
                while si < len(subs) and recs[subs[si]].item.spec.submit <= now:
                    r = recs[subs[si]]
                    si += 1
                    rej = sched.submit(r.item.spec, now)
                    if rej is not None:
                        r.status = "rejected"
                        r.reasons = [str(rej)]
            elif not done:
                break
            first = False
            for gone in sched.expire_waiting(now):
                r = by_id[gone.action_id]
                r.status = "rejected"
                r.reasons = [str(Reason.QueuedTooLong)]
            for adm in sched.schedule(now):
                r = by_id[adm.action_id]
                if r.item.failures:
                    end = _attempt_started(sched, r, adm.action_id, adm.cluster, now, failing)
                    if r.start is None:
                        r.start, r.reasons = now, list(adm.reasons)
                    r.cluster = adm.cluster
                    if end is not None:
                        heapq.heappush(ends, (end, seq_of[r.item.spec.id], adm.action_id))
                    continue
                r.start = now
                r.cluster = adm.cluster
                r.reasons = list(adm.reasons)
                r.status = "succeeded"
                r.end = now + r.item.duration
                heapq.heappush(ends, (r.end, seq_of[adm.action_id], adm.action_id))
            if not (ends and ends[0][0] <= now):
                break
    for r in recs:
        if r.status == "pending":
            r.reasons = sched.reasons(r.item.spec.id)
        elif r.status == "retrying":  # its next attempt waits
            r.status = "pending"
            assert r.next is not None
            r.reasons = sched.reasons(r.next.id)
    return SimResult(_result(sc, recs, sched, skipped))


# ------------------------------------------------------------ failures and retries


def _attempt_started(
    sched: Scheduler,
    r: _Rec,
    aid: str,
    cluster: str,
    now: float,
    failing: dict[str, _Attempt],
) -> float | None:
    """An attempt of an entry with failures was admitted: when it ends (None: never,
    a ``NotReady`` attempt on a queue that has no ``ready_timeout`` any more)."""
    spec = r.item.spec
    if r.next is not None and r.next.id == aid:
        spec, r.next = r.next, None
    k = len(r.attempts)
    if k < len(r.item.failures):
        f = r.item.failures[k]
        kind = f.kind
        took = f.after
        if kind == NOT_READY_KIND:
            took = sched.queues[spec.queue].spec.retry.ready_timeout
    else:
        kind, took = "Succeeded", r.item.duration
    end = None if took is None else now + took
    r.attempts.append(
        {"id": aid, "start": now, "end": end, "cluster": cluster, "outcome": kind, "spec": spec}
    )
    r.status, r.end = "running", None
    failing[aid] = _Attempt(r, spec, kind)
    return end


def _attempt_ended(
    sched: Scheduler, att: _Attempt, now: float
) -> tuple[float, int, ActionSpec] | None:
    """An attempt ended. Its action's end, or its next attempt (due time, number, spec)
    by the queue's retry policy as it is now."""
    r = att.rec
    if att.kind == "Succeeded":
        r.status, r.end = "succeeded", now
        return None
    policy = sched.queues[att.spec.queue].spec.retry
    retry = next_attempt(policy, att.kind, r.used, att.spec.pods)
    if retry is None:
        r.status, r.end = "failed", now
        return None
    r.used[retry.cls] = r.used.get(retry.cls, 0) + 1
    number = len(r.attempts) + 1
    nxt = replace(att.spec, id=attempt_id(r.item.spec.id, number), pods=retry.pods)
    r.attempts[-1]["retry"], r.next = retry.note, nxt
    r.status, r.end = "retrying", now
    return now + retry.delay, number, nxt


def _retry(sched: Scheduler, r: _Rec, spec: ActionSpec, now: float) -> None:
    """The next attempt's submission: past the door, at the action's first submit time."""
    rej = sched.submit(spec, now, door=False)
    if rej is not None:
        r.status = "failed"
        r.attempts[-1]["refused"] = str(rej)


def _apply_event(sched: Scheduler, ev: tuple[float, str, Any]) -> None:
    _, kind, arg = ev
    if kind == "update_queue":
        name, fields = arg
        q = sched.queues[name]
        sched.upsert_queue(q.spec.with_changes(**fields))
    elif kind == "cluster_down":
        sched.set_cluster_health(arg, False)
    elif kind == "cluster_up":
        sched.set_cluster_health(arg, True)


def _result(sc: Scenario, recs: list[_Rec], sched: Scheduler, skipped: int) -> dict[str, Any]:
    # Keys for failures (an action's ``attempts``, a queue's ``failed``) appear only in
    # the result of a scenario that declares some, so every other result is as it was.
    failures = any(r.item.failures for r in recs)
    actions = []
    for r in recs:
        s = r.item.spec
        doc = {
            "id": s.id,
            "run": s.run_id,
            "queue": s.queue,
            "submit": s.submit,
            "start": r.start,
            "end": r.end,
            "cluster": r.cluster,
            "status": r.status,
            "reasons": r.reasons,
        }
        if r.item.failures:
            doc["attempts"] = [_attempt_doc(a) for a in r.attempts]
        actions.append(doc)
    queues: dict[str, Any] = {}
    for q in sc.queues:
        mine = [r for r in recs if r.item.spec.queue == q.name]
        waits = [r.start - r.item.spec.submit for r in mine if r.start is not None]
        queues[q.name] = {
            "admitted": len(waits),
            "rejected": sum(1 for r in mine if r.status == "rejected"),
            "pending": sum(1 for r in mine if r.status == "pending"),
            "wait_p50": _percentile(waits, 0.5) if waits else None,
            "wait_p95": _percentile(waits, 0.95) if waits else None,
            "wait_max": max(waits) if waits else None,
        }
        if failures:
            queues[q.name]["failed"] = sum(1 for r in mine if r.status == "failed")
    started = [r for r in recs if r.start is not None]
    first_submit = min((r.item.spec.submit for r in recs), default=None)
    last_end = max((r.end for r in started if r.end is not None), default=None)
    span = (last_end - first_submit) if last_end is not None and first_submit is not None else None
    totals = {"cpu": 0, "memory": 0, "gpu": 0, "ephemeral_storage": 0}
    for c in sc.clusters:
        for g in c.node_groups:
            totals["cpu"] += g.shape.cpu * g.count
            totals["memory"] += g.shape.memory * g.count
            totals["gpu"] += g.shape.gpu * g.count
            totals["ephemeral_storage"] += g.shape.eph * g.count
    used = {"cpu": 0.0, "memory": 0.0, "gpu": 0.0, "ephemeral_storage": 0.0}
    for r in started:
        for pods, d in _occupied(r):
            for p in pods:
                used["cpu"] += p.cpu * d
                used["memory"] += p.memory * d
                used["gpu"] += p.gpu * d
                used["ephemeral_storage"] += p.eph * d
    util: dict[str, float | None] = {}
    for k in ("cpu", "memory", "gpu", "ephemeral_storage"):
        if totals[k] == 0:
            util[k] = None
        elif not span:
            util[k] = 0.0
        else:
            util[k] = used[k] / (totals[k] * span)
    waits = [r.start - r.item.spec.submit for r in started if r.start is not None]
    slow = [
        max(1.0, ((r.start - r.item.spec.submit) + r.item.duration) / max(r.item.duration, 10.0))
        for r in started
        if r.start is not None
    ]
    return {
        "actions": actions,
        "queues": queues,
        "utilization": util,
        "summary": {
            "actions": len(recs),
            "skipped": skipped,
            "first_submit": first_submit,
            "last_end": last_end,
            "makespan": span,
            "mean_wait": sum(waits) / len(waits) if waits else None,
            "wait_max": max(waits) if waits else None,
            "mean_bounded_slowdown": sum(slow) / len(slow) if slow else None,
            "unknown_capacity_passes": sched.unknown_capacity_passes,
        },
    }


def _attempt_doc(a: dict[str, Any]) -> dict[str, Any]:
    keys = ("id", "start", "end", "cluster", "outcome", "retry", "refused")
    return {k: a[k] for k in keys if k in a}


def _occupied(r: _Rec) -> list[tuple[tuple[Pod, ...], float]]:
    """What an action held and for how long: each attempt that ended (an entry with
    failures), else its pods for its duration."""
    if not r.item.failures:
        return [(r.item.spec.pods, r.item.duration)]
    return [(a["spec"].pods, a["end"] - a["start"]) for a in r.attempts if a["end"] is not None]


def render_json(res: SimResult) -> str:
    """The result as JSON text: same input, byte-identical output."""
    return json.dumps(res.doc, indent=2, sort_keys=False) + "\n"


def summary_text(res: SimResult) -> str:
    """A short human summary: per queue admitted and waits; utilization."""
    d = res.doc
    lines = []
    s = d["summary"]
    lines.append(
        f"{s['actions']} actions ({s['skipped']} skipped), makespan {_fmt(s['makespan'])} s,"
        f" mean wait {_fmt(s['mean_wait'])} s, mean bounded slowdown"
        f" {_fmt(s['mean_bounded_slowdown'])}"
    )
    lines.append(
        f"{'queue':<20} {'admitted':>8} {'rejected':>8} {'pending':>8} {'p50':>10} {'p95':>10} {'max':>10}"
    )
    for name, q in d["queues"].items():
        failed = f"  ({q['failed']} failed)" if q.get("failed") else ""
        lines.append(
            f"{name:<20} {q['admitted']:>8} {q['rejected']:>8} {q['pending']:>8}"
            f" {_fmt(q['wait_p50']):>10} {_fmt(q['wait_p95']):>10} {_fmt(q['wait_max']):>10}"
            + failed
        )
    u = d["utilization"]
    lines.append(
        "utilization: "
        + ", ".join(f"{k} {v:.1%}" if v is not None else f"{k} n/a" for k, v in u.items())
    )
    if s["unknown_capacity_passes"]:
        lines.append(f"unknown-capacity admissions: {s['unknown_capacity_passes']}")
    return "\n".join(lines)


def _fmt(x: float | None) -> str:
    return "-" if x is None else f"{x:.1f}"


# --------------------------------------------------------------------------- SWF


class SwfError(ValueError):
    pass


def load_swf(
    text: str, algorithm: str, estimates: str = "requested", source: str = "<swf>"
) -> tuple[Scenario, int]:
    """Build a scenario from a Standard Workload Format trace.

    Returns the scenario and the number of skipped jobs.

    Raises:
        SwfError: a bad line or option (named), or a trace with no job to simulate.
    """
    from .model import Algorithm

    if algorithm not in Algorithm.__members__:
        raise SwfError(f"--algorithm: {algorithm!r} is not one of strict, greedy, backfill, easy")
    if estimates not in ("requested", "actual", "history"):
        raise SwfError(f"--estimates: {estimates!r} is not one of requested, actual, history")
    max_procs: int | None = None
    jobs: list[tuple[int, list[str]]] = []
    for ln, line in enumerate(text.splitlines(), 1):
        s = line.strip()
        if not s:
            continue
        if s.startswith(";"):
            body = s[1:].strip()
            if body.lower().startswith("maxprocs:"):
                try:
                    max_procs = int(body.split(":", 1)[1].strip())
                except ValueError as exc:
                    raise SwfError(f"{source}:{ln}: MaxProcs: {body!r} is not an integer") from exc
            continue
        f = s.split()
        if len(f) < 18:
            raise SwfError(f"{source}:{ln}: expected 18 fields, got {len(f)}: {s[:60]!r}")
        jobs.append((ln, f))

    def num(f: list[str], i: int, ln: int) -> float:
        try:
            return float(f[i - 1])
        except ValueError as exc:
            raise SwfError(f"{source}:{ln}: field {i}: {f[i - 1]!r} is not a number") from exc

    parsed = []
    for ln, f in jobs:
        procs = int(num(f, 5, ln))
        if procs <= 0:
            procs = int(num(f, 8, ln))
        parsed.append((ln, f, procs, num(f, 4, ln)))
    if max_procs is None:
        max_procs = max((p for _, _, p, d in parsed if d >= 0 and p > 0), default=0)
    work: list[WorkItem] = []
    skipped = 0
    for ln, f, procs, dur in parsed:
        if dur < 0 or procs <= 0 or procs > max_procs:
            skipped += 1
            continue
        jid = f[0]
        req = num(f, 9, ln)
        user = f[11]
        if estimates == "requested":
            est: float | None = req if req > 0 else dur
        elif estimates == "actual":
            est = dur
        else:
            est = None
        spec = ActionSpec(
            id=jid,
            queue="swf",
            pods=(Pod(cpu=1000),) * procs,
            run=jid,
            task=f"user-{user}" if estimates == "history" else jid,
            submit=num(f, 2, ln),
            seq=len(work),
            estimate=est,
        )
        work.append(WorkItem(spec, dur, ln))
    if not jobs:
        raise SwfError(f"{source}: no jobs in it (empty, or only comments): nothing to simulate")
    if not work:
        raise SwfError(
            f"{source}: none of its {len(jobs)} jobs can run (each has a negative run time,"
            f" no processors, or more than MaxProcs {max_procs}): nothing to simulate"
        )
    cluster = ClusterSpec("swf", (NodeGroup("node", max_procs, Pod(cpu=1000)),))
    queue = QueueSpec("swf", algorithm=Algorithm(algorithm))
    return Scenario([cluster], [queue], OrgLimits(), [], work, []), skipped
