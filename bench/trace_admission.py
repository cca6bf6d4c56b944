"""Where the time between a submission and its admission goes (issue #26).

Runs only the Headway side of ``bench/e2e_throughput.py`` (the same workers, N actions
at once, at most 100 in flight) and times each action's steps on the way to its
admission, on this process's wall clock (the dev server, the worker and the client are
all on this machine):

* ``submit``: the client's update-with-start call; ``put``: the lease written by the
  action's first task (``put_lease_wait``), and whether that write nudged the scheduler;
* ``claimed``: the scheduler's sync that took the lease in (its start and end);
* ``sent``: the admission signalled to the action (or handed to its first task's
  waiter) by a dispatch;
* ``admitted``: the action's own clock at admission (``admitted_at``: the start of the
  workflow task that took the admission).

and, from the scheduler workflow's history, what each of its workflow tasks waited for
(the gap between being scheduled and started, and between a sync and the next one).
Prints per-step percentiles and one JSON line last. Measurement only: the steps are
timed by wrapping the store's and the dispatch activity's inner calls in this process.

``--ab`` runs a second tenant, ``bench-head``, as before issue #26's changes (its
scheduler delivers as before patch ``hand-over-first``: its loop awaits a local dispatch
that signals the batch; it is started with its actions' priority, not
``scheduler_priority``; its actions' first task waits 0.25 s for the admission, not
``ANSWER_WAIT_S``), round by round in mirrored order with ``bench``, on the same server
and workers:
``rate_new_over_head`` is the median of the per-round rate ratios. ``--timeline FILE``
writes every timed event (activity calls, nudges, the schedulers' history events) and
each action's steps, in time order.

    python bench/trace_admission.py [--n 150] [--rounds 3] [--ab] [--timeline FILE]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import json
import statistics
import sys
import tempfile
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from headway import protocol
from headway.activities import store as store_acts
from headway.protocol import DemandRequest, SubmitRequest
from headway.store import LeaseStore
from headway.worker import sdk_fastpath
from headway.worker.gc_tuning import freeze_startup, set_young_threshold
from headway.workflows import client as hw
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowHandle

#: action id -> step -> wall time (s)
STEPS: dict[str, dict[str, float]] = defaultdict(dict)
#: (start, end, [action ids claimed], ends collected, tenant) per sync of the store
SYNCS: list[tuple[float, float, list[str], int, str]] = []
#: (time, channel, tenant) per nudge sent
NUDGES: list[tuple[float, str, str]] = []
#: (time, what) of the worker's activity calls and the scheduler's history, for --timeline
EVENTS: list[tuple[float, str]] = []


def _wrap_activity(cls: Any, name: str, label: Any) -> None:
    """Time the activity method ``cls.name`` (keeping its Temporal definition)."""
    orig = getattr(cls, name)

    async def timed(self: Any, inp: Any) -> Any:
        t0 = time.time()
        res = await orig(self, inp)
        EVENTS.append((t0, f"{name} start {label(inp)}"))
        EVENTS.append((time.time(), f"{name} end   {label(inp)} -> {_short(res)}"))
        return res

    timed.__temporal_activity_definition = orig.__temporal_activity_definition  # type: ignore[attr-defined]
    setattr(cls, name, timed)


def _short(res: Any) -> str:
    if hasattr(res, "leases"):
        return f"{len(res.leases)} leases, {len(res.done)} ends, more={res.more}"
    if hasattr(res, "gone"):
        return f"gone {len(res.gone)}"
    return ""


def _instrument() -> None:
    """Wrap the store's and dispatch's inner calls with timestamps (this process only)."""
    from headway.activities.dispatch import DispatchActivities

    _wrap_activity(
        DispatchActivities,
        "dispatch",
        lambda b: (
            f"{len(b.admissions)} admissions {len(b.rejections)} rejections {len(b.probe)} probes"
        ),
    )
    _wrap_activity(
        store_acts.StoreActivities, "sync", lambda i: f"{i.tenant} room={sum(i.room.values())}"
    )
    put = store_acts.StoreActivities._put

    async def timed_put(self: Any, inp: Any) -> Any:
        STEPS[inp.action_id]["put_start"] = time.time()
        res = await put(self, inp)
        STEPS[inp.action_id]["put"] = time.time()
        STEPS[inp.action_id]["nudged"] = float(bool(res.nudge))
        return res

    store_acts.StoreActivities._put = timed_put  # type: ignore[method-assign]

    nudge = store_acts.StoreActivities.nudge

    async def timed_nudge(self: Any, tenant: str, channel: str) -> None:
        await nudge(self, tenant, channel)
        NUDGES.append((time.time(), channel, tenant))
        EVENTS.append((time.time(), f"nudge sent {tenant} {channel}"))

    store_acts.StoreActivities.nudge = timed_nudge  # type: ignore[method-assign]

    sync = LeaseStore.sync

    def timed_sync(self: Any, tenant: str, *args: Any, **kwargs: Any) -> Any:
        t0 = time.time()
        r = sync(self, tenant, *args, **kwargs)
        ids = [d["id"] for d in r.leases]
        SYNCS.append((t0, time.time(), ids, len(r.done), tenant))
        for i in ids:
            STEPS[i]["claim_start"] = t0
            STEPS[i]["claimed"] = time.time()
        return r

    LeaseStore.sync = timed_sync  # type: ignore[method-assign]

    take = store_acts.AdmissionWaiters.take

    def timed_take(self: Any, tenant: str, admission: Any) -> bool:
        ok: bool = take(self, tenant, admission)
        if ok:
            STEPS[admission.action_id]["sent"] = time.time()
            STEPS[admission.action_id]["handed"] = 1.0
        return ok

    store_acts.AdmissionWaiters.take = timed_take  # type: ignore[method-assign]

    signal = WorkflowHandle.signal

    async def timed_signal(self: Any, sig: Any, arg: Any = None, **kw: Any) -> None:
        if sig == protocol.ADMIT_SIGNAL:
            STEPS[arg.action_id]["send_start"] = time.time()
        await signal(self, sig, arg, **kw)
        if sig == protocol.ADMIT_SIGNAL:
            STEPS[arg.action_id]["sent"] = time.time()

    WorkflowHandle.signal = timed_signal  # type: ignore[method-assign,assignment]


#: The first task's wait for its admission when the submitter waits for the answer,
#: before issue #26's change (``headway.workflows.action.ANSWER_WAIT_S`` was 0.25 s).
HEAD_ANSWER_WAIT_S = 0.25


def _set_wait(waits: dict[str, float]) -> None:
    """Measurement only: the first task of the actions of each tenant in ``waits`` waits
    that long for its admission in-process (``put_lease_wait``), whatever the action
    asked for (0: it asked not to wait, and does not)."""
    cls = store_acts.StoreActivities
    orig = cls.put_lease_wait

    async def waits_longer(self: Any, inp: Any) -> Any:
        if inp.tenant in waits and inp.wait_s > 0:
            inp.wait_s = waits[inp.tenant]
        return await orig(self, inp)

    waits_longer.__temporal_activity_definition = orig.__temporal_activity_definition  # type: ignore[attr-defined]
    cls.put_lease_wait = waits_longer  # type: ignore[method-assign]


def _head_side() -> None:
    """Measurement only: tenants named ``*-head`` get the delivery of the commit before
    ``hand-over-first`` (the loop awaits a local dispatch that signals its batch), for a
    side-by-side comparison on one server."""
    from headway.workflows.scheduler import SchedulerWorkflow

    init = SchedulerWorkflow.__init__

    @functools.wraps(init)  # keeps the SDK's mark of a @workflow.init
    def head_init(self: Any, inp: Any) -> None:
        init(self, inp)
        if inp.tenant.endswith("-head"):
            self._hand_over = False

    SchedulerWorkflow.__init__ = head_init  # type: ignore[method-assign]


async def _start_head_scheduler(client: Client, tenant: str, fleet: Any) -> None:
    """The head side's scheduler, started as before ``protocol.scheduler_priority``: with
    its actions' priority (the tenant's fairness key alone)."""
    from headway.workflows.scheduler import SchedulerWorkflow
    from headway.workflows.shared import SchedulerInput
    from temporalio.common import WorkflowIDConflictPolicy

    await client.start_workflow(
        SchedulerWorkflow.run,
        SchedulerInput(tenant=tenant, fleet=[c.to_dict() for c in fleet]),
        id=protocol.scheduler_workflow_id(tenant),
        task_queue=protocol.CONTROL_TASK_QUEUE,
        id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
        priority=protocol.tenant_priority(tenant),
    )


def pct(xs: list[float], p: float) -> float:
    if not xs:
        return float("nan")
    s = sorted(xs)
    return s[min(len(s) - 1, round(p / 100 * (len(s) - 1)))]


async def headway_round(client: Client, n: int, tenant: str, tag: str) -> float:
    from e2e_throughput import gather_limited  # type: ignore[import-not-found]

    demand = DemandRequest(resources={"cpu": "100m", "memory": "64Mi"})
    t0 = time.perf_counter()

    async def one(i: int) -> None:
        aid = f"{tag}-{i}"
        STEPS[aid]["submit"] = time.time()
        h = await hw.submit(client, SubmitRequest(aid, "bench", demand, tenant))
        STEPS[aid]["answered"] = time.time()
        res = await hw.wait_result(h)
        STEPS[aid]["ended"] = time.time()
        assert res.state == "succeeded", res

    await gather_limited([one(i) for i in range(n)])
    rate = n / (time.perf_counter() - t0)
    for i in range(n):
        aid = f"{tag}-{i}"
        st = await hw.action_state(client, tenant, aid)
        STEPS[aid]["wf_submitted"] = st.submitted_at
        if st.admitted_at is not None:
            STEPS[aid]["admitted"] = st.admitted_at
    return rate


async def scheduler_tasks(client: Client, tenant: str, since: float) -> dict[str, Any]:
    """What the scheduler's workflow tasks waited for, from its history (after ``since``)."""
    h = client.get_workflow_handle(protocol.scheduler_workflow_id(tenant))
    kinds: Counter[str] = Counter()
    sched_to_start: list[float] = []
    start_to_done: list[float] = []
    scheduled: float | None = None
    started: float | None = None
    async for ev in h.fetch_history_events():
        t = ev.event_time.ToDatetime().timestamp()
        if t < since:
            continue
        name = EventType.Name(ev.event_type).removeprefix("EVENT_TYPE_")
        kinds[name] += 1
        what = name
        if ev.HasField("workflow_execution_signaled_event_attributes"):
            what += " " + ev.workflow_execution_signaled_event_attributes.signal_name
        EVENTS.append((t, f"scheduler {tenant} history: {what}"))
        if ev.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_SCHEDULED:
            scheduled = t
        elif ev.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_STARTED and scheduled:
            started = t
            sched_to_start.append((t - scheduled) * 1000)
        elif ev.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED and started:
            start_to_done.append((t - started) * 1000)
    return {
        "events": dict(kinds),
        "task_schedule_to_start_ms": _p(sched_to_start),
        "task_start_to_complete_ms": _p(start_to_done),
    }


def _p(xs: list[float]) -> dict[str, float]:
    return {
        "n": len(xs),
        "p50": round(pct(xs, 50), 1),
        "p90": round(pct(xs, 90), 1),
        "p99": round(pct(xs, 99), 1),
        "sum": round(sum(xs), 1),
    }


def breakdown(ids: list[str]) -> dict[str, Any]:
    """Per step, the time from the step before (ms), over the actions of ``ids``."""
    legs = [
        ("submit", "put_start", "submit -> lease write starts (start, first task)"),
        ("put_start", "put", "lease write (group commit)"),
        ("put", "claim_start", "lease written -> the sync that takes it starts"),
        ("claim_start", "claimed", "that sync (SQL)"),
        ("claimed", "sent", "sync done -> admission sent (pass, dispatch)"),
        ("sent", "admitted", "admission sent -> the action's task takes it"),
        ("submit", "admitted", "submit -> admitted (client clock)"),
        ("wf_submitted", "admitted", "enqueue -> admission (workflow clock, as the bench)"),
    ]
    out: dict[str, Any] = {}
    for a, b, what in legs:
        xs = [(s[b] - s[a]) * 1000 for i in ids if a in (s := STEPS[i]) and b in s]
        out[f"{a}->{b}"] = {"what": what, **_p(xs)}
    out["nudged_share"] = round(sum(STEPS[i].get("nudged", 0) for i in ids) / max(len(ids), 1), 3)
    out["handed_share"] = round(sum(STEPS[i].get("handed", 0) for i in ids) / max(len(ids), 1), 3)
    return out


async def _side(
    client: Client,
    tenant: str,
    since: float,
    rates: dict[str, list[float]],
    ids: dict[str, list[str]],
) -> dict[str, Any]:
    """One tenant's figures: rates, the steps of its actions, its syncs and scheduler."""
    syncs = [x for x in SYNCS if x[4] == tenant]
    sizes = [len(x[2]) for x in syncs]
    sched = client.get_workflow_handle(protocol.scheduler_workflow_id(tenant))
    return {
        "actions_per_s": [round(x, 1) for x in rates[tenant]],
        "steps_ms": breakdown(ids[tenant]),
        "syncs": {
            "count": len(syncs),
            "leases_per_sync": _p([float(x) for x in sizes]),
            "empty": sum(1 for x in sizes if x == 0),
            "sql_ms": _p([(x[1] - x[0]) * 1000 for x in syncs]),
            "gap_ms": _p([(syncs[k + 1][0] - syncs[k][1]) * 1000 for k in range(len(syncs) - 1)]),
        },
        "nudges": Counter(c.split(":")[0] for _, c, t in NUDGES if t == tenant),
        "scheduler": await scheduler_tasks(client, tenant, since),
        "scheduler_stats": await sched.query("stats"),
    }


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=150)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--timeline", default=None, help="write every timed event there")
    ap.add_argument(
        "--ab",
        action="store_true",
        help="alternate with a tenant whose scheduler delivers as before hand-over-first",
    )
    ap.add_argument(
        "--wait-s",
        type=float,
        default=None,
        help="experiment: the first task of tenant bench's actions waits this long for its"
        " admission (the action asks ANSWER_WAIT_S when its submitter waits for the answer)",
    )
    args = ap.parse_args()
    from _common import big_fleet, calib_us, start_server  # type: ignore[import-not-found]
    from e2e_throughput import side_workers, wait_control_pollers  # type: ignore[import-not-found]

    _instrument()
    waits = {} if args.wait_s is None else {"bench": args.wait_s}
    if args.ab:
        _head_side()
        waits["bench-head"] = HEAD_ANSWER_WAIT_S
    if waits:
        _set_wait(waits)
    calib_start = calib_us()
    sdk_fastpath.install()
    env = await start_server()
    client = env.client
    tmp = tempfile.mkdtemp()
    store = LeaseStore(f"sqlite:///{tmp}/bench.db")
    fleet = big_fleet()
    tenants = ["bench", "bench-head"] if args.ab else ["bench"]
    result: dict[str, Any] = {"n": args.n, "rounds": args.rounds, "sides": {}}
    try:
        async with contextlib.AsyncExitStack() as stack:
            for w in side_workers(client, store, fleet):
                await stack.enter_async_context(w)
            freeze_startup()
            set_young_threshold()
            await wait_control_pollers(client, 1)
            for tenant in tenants:
                if tenant.endswith("-head"):
                    await _start_head_scheduler(client, tenant, fleet)
                await hw.upsert_queue(client, tenant, {"name": "bench"}, fleet)
                await headway_round(client, args.n, tenant, f"{tenant}-warm")
            since = time.time()
            SYNCS.clear()
            NUDGES.clear()
            rates: dict[str, list[float]] = {t: [] for t in tenants}
            ids: dict[str, list[str]] = {t: [] for t in tenants}
            for r in range(args.rounds):
                # Mirrored order round by round: a drift of the machine's load counts
                # against neither side.
                for tenant in tenants if r % 2 == 0 else tenants[::-1]:
                    tag = f"{tenant}-r{r}"
                    rates[tenant].append(await headway_round(client, args.n, tenant, tag))
                    ids[tenant] += [f"{tag}-{i}" for i in range(args.n)]
                    print(f"round {r} {tenant}: {rates[tenant][-1]:.1f} actions/s", flush=True)
            for tenant in tenants:
                result["sides"][tenant] = await _side(client, tenant, since, rates, ids)
            if args.ab:
                ab = [x / y for x, y in zip(rates["bench"], rates["bench-head"], strict=True)]
                result["rate_new_over_head"] = {
                    "median": round(statistics.median(ab), 3),
                    "min": round(min(ab), 3),
                    "max": round(max(ab), 3),
                }
    finally:
        store.close()
        await env.shutdown()
    c_end = calib_us()
    result["calib_us"] = {
        "start": calib_start,
        "end": c_end,
        "mean": round((calib_start + c_end) / 2, 2),
    }
    for tenant, side in result["sides"].items():
        print(
            tenant,
            "actions/s",
            side["actions_per_s"],
            "handed over",
            side["steps_ms"]["handed_share"],
        )
        for k, v in side["steps_ms"].items():
            if isinstance(v, dict):
                print(
                    f"{k:28s} p50 {v['p50']:8.1f}  p90 {v['p90']:8.1f}  p99 {v['p99']:8.1f}  {v['what']}"
                )
    if args.timeline:
        with open(args.timeline, "w") as f:
            for t, what in sorted(EVENTS):
                f.write(f"{t:.3f} {what}\n")
            for aid, s in sorted(STEPS.items(), key=lambda kv: kv[1].get("submit", 0)):
                f.write(f"{aid} " + json.dumps({k: round(v, 3) for k, v in s.items()}) + "\n")
    print(json.dumps(result, default=str))


if __name__ == "__main__":
    asyncio.run(main())
