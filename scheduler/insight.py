"""Answers beyond "why": what would unblock an action, when will it start, and what if.

All three read the same state the pass decides over, and the forecast *runs* the same
pass forward on a copy (runtime estimates standing in for durations), so an answer can
never disagree with what the scheduler will actually do given those estimates.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from .core import Scheduler
from .model import QueueSpec
from .reasons import Reason, describe
from .resources import Quota, Usage
from .truth import _Action, _Queue

__all__ = ["Explanation", "Forecast", "explain", "forecast", "what_if"]


@dataclass
class Explanation:
    """Why an action waits, in numbers, and what would unblock it."""

    action_id: str
    state: str | None
    queue: str | None = None
    reason: str | None = None
    message: str = ""
    reasons: list[str] = field(default_factory=list)
    details: dict[str, Any] = field(default_factory=dict)
    unblock: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "action_id": self.action_id,
            "state": self.state,
            "queue": self.queue,
            "reason": self.reason,
            "message": self.message,
            "reasons": self.reasons,
            "details": self.details,
            "unblock": self.unblock,
        }


def _fmt_usage(u: Usage) -> dict[str, int]:
    return {"cpu_m": u.cpu, "memory": u.memory, "ephemeral_storage": u.eph, "gpu": u.gpu}


def explain(s: Scheduler, action_id: str, now: float) -> Explanation:
    """Explain the last pass's reason for a waiting action, with what would unblock it.

    Reads the holds and reservations of the most recent pass; call after ``schedule``.
    """
    a = s.actions.get(action_id)
    if a is None:
        return Explanation(action_id, None, message="unknown action (finished or never submitted)")
    ex = Explanation(action_id, a.state, a.queue, a.last, reasons=list(a.reasons))
    if a.state == "running":
        ex.message = f"running on {a.cluster}"
        ex.details = {"cluster": a.cluster, "start": a.start, "estimated_end": a.est_end}
        return ex
    q = s.queues[a.queue]
    spec = q.spec
    r = a.last
    ex.message = describe(r) if r else "not yet considered by a pass"
    d = ex.details
    u = ex.unblock
    if r == Reason.ActionConcurrency:
        cap = spec.action_concurrency
        d.update(running=q.running, cap=cap)
        u.append(
            f"{q.running - (cap or 0) + 1} running action(s) of {spec.name} must finish,"
            f" or raise action_concurrency above {cap}"
        )
    elif r == Reason.RunConcurrency:
        d.update(runs=len(q.run_counts), cap=spec.run_concurrency)
        u.append(
            f"one of the {len(q.run_counts)} runs active in {spec.name} must finish, or"
            f" raise run_concurrency above {spec.run_concurrency}"
        )
    elif r == Reason.PerRunConcurrency:
        n = q.run_counts.get(a.run, 0)
        d.update(run=a.run, running=n, cap=spec.per_run_concurrency)
        u.append(
            f"one of run {a.run}'s {n} running action(s) must finish, or raise"
            f" per_run_concurrency above {spec.per_run_concurrency}"
        )
    elif r == Reason.MaxResources and spec.max_resources is not None:
        _explain_quota(q, a, spec.max_resources, d, u)
    elif r == Reason.OrgConcurrentActions:
        d.update(running=s.org_running, cap=s.org.max_concurrent_actions)
        u.append("an action of the tenant must finish, or raise max_concurrent_actions")
    elif r == Reason.OrgConcurrentRuns:
        d.update(runs=len(s.org_run_counts), cap=s.org.max_concurrent_runs)
        u.append("a run of the tenant must finish, or raise max_concurrent_runs")
    elif r == Reason.NoClusterCapacity:
        _explain_no_room(s, q, a, now, d, u)
    elif r == Reason.HeldForGang:
        held = {c.name: s._holds[c.name] for c in s._eligible(q) if c.name in s._holds}
        d.update(held_by=held, queue_head=q.blocked_head)
        if q.blocked_head and q.blocked_head != a.id and spec.algorithm == "strict":
            u.append(
                f"strict queue: waits for its head {q.blocked_head} to start, or switch"
                f" {spec.name} to backfill"
            )
        for cname, head in held.items():
            u.append(f"{cname} is held for {head} until it starts")
    elif r == Reason.BackfillWindow:
        est = s.estimate(a.task, a.spec.estimate)
        resv = {
            c.name: [{"until": rv.time, "for": rv.head} for rv in s._resv.get(c.name, [])]
            for c in s._eligible(q)
            if c.name in s._resv
        }
        d.update(estimate=est, reservations=resv)
        for cname, rs in resv.items():
            for rv in rs:
                u.append(
                    f"{cname} is reserved for {rv['for']} at t={rv['until']:.0f}: it runs in"
                    f" the gap if its estimated end (now + {est}) is no later"
                )
    elif r == Reason.EnvironmentBusy and a.env in s.envs:
        inst = s.envs[a.env]
        d.update(environment=a.env, active=inst.active, slots=inst.spec.slots)
        u.append(f"an action inside {a.env} must finish (slots {inst.active}/{inst.spec.slots})")
    return ex


def _explain_quota(q: _Queue, a: _Action, mr: Quota, d: dict[str, Any], u: list[str]) -> None:
    """``explain`` for ``MaxResources``: each dimension of the quota the action exceeds."""
    d.update(in_flight=_fmt_usage(q.usage), demand=_fmt_usage(a.usage), quota=mr.to_dict())
    for dim, used, need, cap in (
        ("cpu_m", q.usage.cpu, a.usage.cpu, mr.cpu),
        ("memory", q.usage.memory, a.usage.memory, mr.memory),
        ("ephemeral_storage", q.usage.eph, a.usage.eph, mr.eph),
    ):
        if cap is not None and used + need > cap:
            u.append(
                f"{dim}: {used} in flight + {need} requested > {cap}: free"
                f" {used + need - cap} or raise max_resources"
            )
    if mr.gpu is not None:
        used = q.usage.gpu if mr.gpu_type is None else q.usage.gpu_of(mr.gpu_type)
        need = a.usage.gpu if mr.gpu_type is None else a.usage.gpu_of(mr.gpu_type)
        if used + need > mr.gpu:
            kind = f"{mr.gpu_type} GPU" if mr.gpu_type else "GPU"
            u.append(
                f"{kind}: {used} in flight + {need} requested > {mr.gpu}: free"
                f" {used + need - mr.gpu} or raise max_resources.gpu to {used + need}"
            )


def _explain_no_room(
    s: Scheduler, q: _Queue, a: _Action, now: float, d: dict[str, Any], u: list[str]
) -> None:
    """``explain`` for ``NoClusterCapacity``: per eligible cluster, its free capacity and
    when the action would fit there by the running work's estimates."""
    per: dict[str, Any] = {}
    for c in s._eligible(q):
        if not s._could(c, a.runs, a.dkey):
            per[c.name] = {"never": "no node shape of this cluster can hold every pod"}
            continue
        fit = s._earliest_fit(c, a.runs, now, False, a.dkey)
        per[c.name] = {
            "free": {"cpu_m": c.tcpu, "memory": c.tmem, "gpu": c.tgpu},
            "fits_at": fit[0] if fit is not None else None,
        }
    d.update(need=_fmt_usage(a.usage), clusters=per)
    times = [(v["fits_at"], k) for k, v in per.items() if v.get("fits_at") is not None]
    if times:
        t, cname = min(times)
        u.append(f"fits on {cname} at t={t:.0f} when running work ends by its estimates")
    else:
        u.append(
            "running work without runtime estimates must end first; declare"
            " estimates to get a start time"
        )
    never = [k for k, v in per.items() if "never" in v]
    if never and len(never) == len(per):
        u.append("no eligible cluster can ever hold it: widen the queue's cluster selector")


@dataclass
class Forecast:
    """Projected start (and cluster) per waiting action, by runtime estimates."""

    starts: dict[str, float | None]
    clusters: dict[str, str | None]
    horizon: float | None
    default_runtime: float
    #: Actions that would wait past their queue's ``max_queued_time`` (``QueuedTooLong``),
    #: and when: their start stays None.
    expires: dict[str, float] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "starts": self.starts,
            "clusters": self.clusters,
            "horizon": self.horizon,
            "default_runtime": self.default_runtime,
            "expires": self.expires,
        }


def forecast(
    s: Scheduler,
    now: float,
    default_runtime: float = 3600.0,
    horizon: float | None = None,
    max_events: int = 50_000,
) -> Forecast:
    """When will each waiting action start, if nothing new arrives?

    Runs the scheduler forward on a copy: running and admitted actions end at their
    estimates (``default_runtime`` where there is none; an action past its estimate
    ends now). Actions not started by ``horizon`` (or within ``max_events``) get None;
    so do those that would wait past their queue's ``max_queued_time`` (in ``expires``,
    by the same rule as the scheduler's, before each pass).
    """
    sim = Scheduler.from_snapshot(s.to_snapshot())
    waiting = [a.id for q in sim.queues.values() for a in q.waiting]
    starts: dict[str, float | None] = dict.fromkeys(waiting)
    clusters: dict[str, str | None] = dict.fromkeys(waiting)
    ends: list[tuple[float, int, str]] = []
    for a in sim.actions.values():
        if a.state == "running":
            end = a.est_end if a.est_end is not None else a.start + default_runtime
            heapq.heappush(ends, (max(end, now), a.seq, a.id))
    expires: dict[str, float] = {}
    t = now
    events = 0
    while events < max_events:
        for gone in sim.expire_waiting(t):
            expires[gone.action_id] = t
        for adm in sim.schedule(t):
            starts[adm.action_id] = t
            clusters[adm.action_id] = adm.cluster
            act = sim.actions[adm.action_id]
            est = act.est if act.est is not None else default_runtime
            heapq.heappush(ends, (t + est, act.seq, act.id))
        if not any(q.waiting for q in sim.queues.values()):
            break
        nxt = [e[0] for e in ends[:1]]
        wake = sim.next_wakeup()
        if wake is not None and wake > t:
            nxt.append(wake)
        if not nxt:
            break
        t = min(nxt)
        if horizon is not None and t > horizon:
            break
        while ends and ends[0][0] <= t:
            _, _, aid = heapq.heappop(ends)
            sim.finish(aid, t)
        events += 1
    return Forecast(starts, clusters, horizon, default_runtime, expires)


def what_if(
    s: Scheduler,
    now: float,
    queue_changes: Iterable[tuple[str, Mapping[str, Any]]] = (),
    default_runtime: float = 3600.0,
    horizon: float | None = None,
    queue_specs: Iterable[QueueSpec] = (),
) -> dict[str, Any]:
    """Forecast before and after live queue changes, without applying them.

    Changes come as ``(name, changes)`` in scenario notation, or as whole replacement
    ``queue_specs``. Returns per waiting action the projected start before and after,
    and the change.
    """
    before = forecast(s, now, default_runtime, horizon)
    alt = Scheduler.from_snapshot(s.to_snapshot())
    for name, changes in queue_changes:
        alt.update_queue(name, changes)
    for spec in queue_specs:
        alt.upsert_queue(spec)
    after = forecast(alt, now, default_runtime, horizon)
    out: dict[str, Any] = {}
    for aid, b in before.starts.items():
        a2 = after.starts.get(aid)
        out[aid] = {
            "before": b,
            "after": a2,
            "delta": (a2 - b) if a2 is not None and b is not None else None,
        }
    return out
