"""Scheduler workflow costs: history per action, carried state, a 1M backlog, isolation.

* ``scheduler_events_per_action``: N actions through a simulated cluster with room;
  history events of every run of the scheduler workflow divided by admissions.
* ``continue_as_new_payload_bytes``: what continue-as-new would carry with 10k and 100k
  pending leases in one queue (nothing admitted): bounded by the in-memory window.
* ``pending_leases_1m``: 1M pending leases in the store (SQLite): the refill sync of a
  window plus one core pass over it, and the carried state of a scheduler over it.
* ``isolation``: completion latency of a 5-action run in tenant A, idle vs. while tenant B
  ingests a 10k backlog (bulk-loaded leases flowing through B's scheduler). Each round
  times five runs of A idle, then five while B drains (the first right after B is
  nudged); the round's ratio is median busy / median idle; the figure is the median of
  the rounds' ratios. Before the next round's idle runs, B drains completely: nothing
  pending in the store, nothing waiting or running in its scheduler (``backlog_drain_s``).
  ``action_hops_ms`` splits A's actions' time, from their histories, into waits for a
  worker to take a task and the workers' own time, idle and under the backlog.

``calib_us``: the machine's calibration at the start (before the 1M bulk load) and at the
end (after the server stopped), and their mean (``bench/_common.py``); ``normalized``:
the times (the 1M pass and its parts, the isolation runs, drains and hops) as on a 100 us
machine (``t * 100 / calib``). Counts, bytes and ratios need no normalizing.

    python bench/scheduler_history.py [--n 500] [--rounds 5] [--million 1000000]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from headway import protocol
from headway.protocol import DemandRequest, SubmitRequest
from headway.scheduler import Scheduler
from headway.scheduler.model import ActionSpec, QueueSpec
from headway.store import LeaseStore
from headway.worker.control_plane import build_control_plane_worker
from headway.worker.gc_tuning import freeze_startup, set_young_threshold
from headway.workflows import client as hw
from headway.workflows.scheduler import WINDOW
from temporalio.client import Client
from temporalio.worker import Worker

#: Runs of tenant A timed per round, idle and under B's backlog.
#: Five, not three: a run takes ~0.2-0.3 s and single runs vary by +-30% on a shared
#: 2-core machine, so three per side let one slow run move a round's ratio by 0.2.
SAMPLES = 5

DEMAND = DemandRequest(resources={"cpu": "100m", "memory": "64Mi"})
SPEC_POD = [{"cpu": 100, "memory": 64 * 2**20}]


def lease_rows(prefix: str, queue: str, n: int):  # type: ignore[no-untyped-def]
    for i in range(n):
        aid = f"{prefix}{i}"
        yield (
            aid,
            queue,
            f"headway-action-none-{aid}",
            {"id": aid, "queue": queue, "pods": SPEC_POD, "kind": "single"},
            float(i),
        )


async def run_actions(client: Client, tenant: str, tag: str, n: int) -> float:
    t0 = time.perf_counter()

    async def one(i: int) -> None:
        h = await hw.submit(client, SubmitRequest(f"{tag}-{i}", "q", DEMAND, tenant))
        r = await hw.wait_result(h)
        assert r.state == "succeeded", r

    sem = asyncio.Semaphore(100)

    async def lim(i: int) -> None:
        async with sem:
            await one(i)

    await asyncio.gather(*(lim(i) for i in range(n)))
    return (time.perf_counter() - t0) * 1000


#: Where an action's time goes, from its history: each key sums the gaps that end in
#: the named event types (the first event's time is the start).
HOPS: dict[str, tuple[str, ...]] = {
    "workflow_task_wait": ("WORKFLOW_TASK_STARTED",),
    "workflow_task_run": ("WORKFLOW_TASK_COMPLETED",),
    "cluster_task_wait": ("ACTIVITY_TASK_STARTED",),
    "cluster_task_run": ("ACTIVITY_TASK_COMPLETED",),
}


async def hops(client: Client, tenant: str, tags: list[str], acc: dict[str, list[float]]) -> None:
    """Add the hop times (ms, see ``HOPS``) of runs ``tags``' actions to ``acc``."""
    from temporalio.api.enums.v1 import EventType

    for tag in tags:
        for i in range(5):
            wid = protocol.action_workflow_id(tenant, f"{tag}-{i}")
            events = (await client.get_workflow_handle(wid).fetch_history()).events
            ms = [e.event_time.ToMicroseconds() / 1000 for e in events]
            kinds = [EventType.Name(e.event_type).removeprefix("EVENT_TYPE_") for e in events]
            for key, ends in HOPS.items():
                acc.setdefault(key, []).append(
                    sum(ms[k] - ms[k - 1] for k in range(1, len(ms)) if kinds[k] in ends)
                )
            acc.setdefault("total", []).append(ms[-1] - ms[0])


async def history_events(client: Client, workflow_id: str) -> int:
    total = 0
    async for wf in client.list_workflows(f'WorkflowId = "{workflow_id}"'):
        hist = await client.get_workflow_handle(workflow_id, run_id=wf.run_id).fetch_history()
        total += len(hist.events)
    return total


async def carried_with_pending(client: Client, store: LeaseStore, pending: int) -> int:
    tenant = f"pending{pending}"
    await hw.upsert_queue(client, tenant, {"name": "q", "action_concurrency": 0})
    store.put_many(tenant, lease_rows("p", "q", pending))
    await hw.nudge_scheduler(client, tenant, ["q"])  # bulk loads do not nudge by themselves
    h = client.get_workflow_handle(protocol.scheduler_workflow_id(tenant))
    for _ in range(600):
        q = (await hw.get_queues(client, tenant))["q"]
        if q["waiting"] >= WINDOW:  # the window full: the most it ever carries
            break
        await asyncio.sleep(0.1)
    return int(await h.query("carried_bytes"))


def million_pass(url: str, n: int) -> dict[str, float]:
    store = LeaseStore(url)
    t0 = time.perf_counter()
    store.put_many("million", lease_rows("m", "q", n))
    load_s = time.perf_counter() - t0
    from _common import big_fleet  # type: ignore[import-not-found]

    core = Scheduler(clusters=big_fleet(), queues=[QueueSpec("q", action_concurrency=0)])
    t0 = time.perf_counter()
    res = store.sync("million", "bench:1", {"q": 500})
    sync_ms = (time.perf_counter() - t0) * 1000
    for seq, d in enumerate(res.leases):
        core.submit(ActionSpec.from_dict({**d, "seq": seq}), 0.0)
    passes = []
    for _ in range(5):
        t0 = time.perf_counter()
        core.schedule(1.0)
        passes.append((time.perf_counter() - t0) * 1000)
    snap = len(json.dumps(core.to_snapshot(), separators=(",", ":")))
    # And a pass that admits the whole window (a queue with room on the cluster).
    admit = []
    for r in range(3):
        open_core = Scheduler(clusters=big_fleet(), queues=[QueueSpec("q")])
        for seq, d in enumerate(res.leases):
            open_core.submit(ActionSpec.from_dict({**d, "seq": seq}), 0.0)
        t0 = time.perf_counter()
        n_adm = len(open_core.schedule(1.0))
        admit.append((time.perf_counter() - t0) * 1000)
        assert n_adm == len(res.leases), (r, n_adm)
    store.close()
    out: dict[str, float] = {
        "load_s": round(load_s, 1),
        "sync_ms": round(sync_ms, 1),
        "core_pass_ms": round(statistics.median(passes), 3),
        "pass_ms": 0.0,
        "snapshot_bytes": snap,
        "admit_window_pass_ms": round(statistics.median(admit), 1),
        "window": len(res.leases),
    }
    # What one refill-and-pass costs the scheduler over the 1M backlog: the store sync of
    # a window plus a core pass that admits it.
    out["pass_ms"] = round(sync_ms + out["admit_window_pass_ms"], 1)
    return out


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=500)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--million", type=int, default=1_000_000)
    ap.add_argument("--backlog", type=int, default=10_000)
    args = ap.parse_args()
    from _activities import instant_delete, instant_run  # type: ignore[import-not-found]
    from _common import (  # type: ignore[import-not-found]
        big_fleet,
        calib_us,
        calibration,
        normalize,
        start_server,
    )

    calib_start = calib_us()  # before the bulk load, the server and the workers
    tmp = tempfile.mkdtemp()
    out: dict[str, object] = {}
    m = million_pass(f"sqlite:///{tmp}/million.db", args.million)
    print("1M:", m)
    env = await start_server()
    client = env.client
    store = LeaseStore(f"sqlite:///{tmp}/bench.db")
    fleet = big_fleet()
    try:
        async with (
            build_control_plane_worker(client, store, fleet),
            Worker(
                client,
                task_queue=protocol.cluster_task_queue(fleet[0].name),
                activities=[instant_run, instant_delete],
                max_concurrent_activities=500,
            ),
        ):
            # As a worker process does once it is up (``headway.worker.gc_tuning``).
            out_frozen = freeze_startup()
            young = set_young_threshold()
            # History per action.
            tenant = "hist"
            await hw.upsert_queue(client, tenant, {"name": "q"}, fleet)
            await run_actions(client, tenant, "h", args.n)
            await asyncio.sleep(2.0)
            events = await history_events(client, protocol.scheduler_workflow_id(tenant))
            per_action = events / args.n
            print(f"scheduler history: {events} events for {args.n} actions")
            # Carried state with a pending backlog.
            c10k = await carried_with_pending(client, store, 10_000)
            c100k = await carried_with_pending(client, store, 100_000)
            print(f"carried: 10k pending {c10k} B, 100k pending {c100k} B")
            # Isolation: A's 5-action run, idle vs. while B ingests a backlog. Each round
            # times SAMPLES runs of A on an idle system, then SAMPLES runs of A while B's
            # backlog drains (the first as soon as B is nudged, the rest back to back);
            # the round's ratio is median(busy) / median(idle).
            await hw.upsert_queue(client, "iso-a", {"name": "q"}, fleet)
            await hw.upsert_queue(client, "iso-b", {"name": "q"}, fleet)
            await run_actions(client, "iso-a", "warm", 5)
            idle, busy, ratios, overlap = [], [], [], []
            hops_idle: dict[str, list[float]] = {}
            hops_busy: dict[str, list[float]] = {}
            b_tail: list[float] = []  # seconds from B's nudge until B was quiet
            for r in range(args.rounds):
                i_ms = [
                    await run_actions(client, "iso-a", f"idle{r}-{k}", 5) for k in range(SAMPLES)
                ]
                store.put_many("iso-b", lease_rows(f"b{r}-", "q", args.backlog))
                await hw.nudge_scheduler(client, "iso-b", ["q"])
                t_nudge = time.perf_counter()
                b_ms = []
                for k in range(SAMPLES):
                    b_ms.append(await run_actions(client, "iso-a", f"busy{r}-{k}", 5))
                    # Only runs that ended while B still had work count as "under backlog".
                    overlap.append(store.pending_count("iso-b") > 0)
                idle += i_ms
                busy += b_ms
                ratios.append(statistics.median(b_ms) / statistics.median(i_ms))
                print(
                    f"round {r}: idle {[round(x) for x in i_ms]} ms,"
                    f" under backlog {[round(x) for x in b_ms]} ms, ratio {ratios[-1]:.2f}"
                )
                # Let B drain before the next idle measurement: nothing pending in the
                # store, and nothing waiting or running in its scheduler (leases claimed
                # last are still being dispatched and released when the store runs dry,
                # and an "idle" run beside that tail would not be idle).
                for _ in range(900):
                    if store.pending_count("iso-b") == 0:
                        q = (await hw.get_queues(client, "iso-b"))["q"]
                        if q["waiting"] == 0 and q["running"] == 0:
                            break
                    await asyncio.sleep(0.2)
                b_tail.append(round(time.perf_counter() - t_nudge, 1))
                # Read after B drained, so the reads do not load the busy runs.
                await hops(client, "iso-a", [f"idle{r}-{k}" for k in range(SAMPLES)], hops_idle)
                await hops(client, "iso-a", [f"busy{r}-{k}" for k in range(SAMPLES)], hops_busy)
    finally:
        store.close()
        await env.shutdown()
    calib = calibration(calib_start, calib_us())
    out = {
        "actions": args.n,
        "calib_us": calib,
        "scheduler_events_per_action": round(per_action, 3),
        "continue_as_new_payload_bytes": {"pending_10k": c10k, "pending_100k": c100k},
        "pending_leases_1m": {
            "pass_ms": m["pass_ms"],
            "carried_state_bytes": m["snapshot_bytes"],
            "pending": args.million,
            "sync_ms": m["sync_ms"],
            "core_pass_ms": m["core_pass_ms"],
            "admit_window_pass_ms": m["admit_window_pass_ms"],
            "window": m["window"],
            "bulk_load_s": m["load_s"],
        },
        "isolation": {
            "idle_ms": round(statistics.median(idle), 1),
            "under_backlog_ms": round(statistics.median(busy), 1),
            "ratio": round(statistics.median(ratios), 3),
            "ratio_min": round(min(ratios), 3),
            "ratio_max": round(max(ratios), 3),
            "backlog": args.backlog,
            "run_actions": 5,
            "samples_per_round": SAMPLES,
            "busy_runs_overlapping_backlog": f"{sum(overlap)}/{len(overlap)}",
            "backlog_drain_s": b_tail,
            # Per action, median ms: where the busy runs' extra time went (waits are
            # the server's matching and the pollers, runs the workers' own time).
            "action_hops_ms": {
                k: {
                    "idle": round(statistics.median(hops_idle[k]), 1),
                    "under_backlog": round(statistics.median(hops_busy[k]), 1),
                }
                for k in hops_idle
            },
        },
        "gc_frozen": out_frozen,
        "gc_young_threshold": young,
    }
    pl = out["pending_leases_1m"]
    iso = out["isolation"]
    assert isinstance(pl, dict) and isinstance(iso, dict)
    out["normalized"] = normalize(
        {
            "pending_leases_1m": {
                k: pl[k]
                for k in (
                    "pass_ms",
                    "sync_ms",
                    "core_pass_ms",
                    "admit_window_pass_ms",
                    "bulk_load_s",
                )
            },
            "isolation": {
                k: iso[k]
                for k in ("idle_ms", "under_backlog_ms", "backlog_drain_s", "action_hops_ms")
            },
        },
        calib["mean"],
    )
    print(json.dumps(out))


if __name__ == "__main__":
    asyncio.run(main())
