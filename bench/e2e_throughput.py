"""End-to-end throughput: bare Temporal vs. Headway, side by side.

Bare: N workflows, each running one no-op activity on an activity worker of its own task
queue, as Headway's action runs its activity on its cluster's worker. Headway: N actions
through the shard scheduler workflow to a simulated cluster with room (a fake
``RUN_ACTION_ACTIVITY`` that succeeds at once). ``ratio`` is Headway over that bare side.

Also measured, for transparency: "bare eager", the same workflow with its activity on the
workflow's own task queue, which the SDK runs eagerly (no activity task through matching,
no activity poll; measured here at ~10 ms less CPU per workflow). Headway cannot take
that shortcut (cluster workers are other processes, on other task queues), so it is not
the like-for-like baseline; ``ratio_vs_eager`` reports it anyway. And "bare
unsandboxed": the bare workflow on a worker without the SDK's sandbox, as Headway's
workflows run (``ratio_vs_unsandboxed``). The sandbox is the SDK's default, so ``ratio``
keeps the workflow as a user writes it, but the sandbox costs that side ~3 ms of worker
CPU per workflow, which Headway's workflows do not pay.

And "lifecycle floor" (``ratio_vs_lifecycle_floor``, ``lifecycle_floor_vs_bare``): the
bare workflow plus the Temporal operations an action's lifecycle needs for its guarantees,
without Headway's logic: a local activity before the activity (the durable lease write
and admission wait), one after it (the durable release), two search-attribute writes
(the state at admission and at the end, for the Web UI), a memo at start, unsandboxed.
``lifecycle_floor_vs_bare`` is what those operations cost on this server, so it bounds
``ratio`` for this lifecycle; ``ratio_vs_lifecycle_floor`` is what Headway's own work
(payloads, store, scheduler workflow, dispatch) costs on top.

The SDK fast path (``headway.worker.sdk_fastpath``: no payload walks without a codec)
is process-wide: every side runs with it, bare included (``sdk_fastpath`` in the JSON).
So is the worker process's garbage-collector setting (``headway.worker.gc_tuning``:
objects alive at startup frozen, ``gc_frozen``; the young generation collected every
7,000 net allocations, ``gc_young_threshold``).

All sides run on one dev server this script starts, in 100 concurrent workflows each,
after a warm-up round. In each round every side runs twice, N/2 each time, in mirrored
order: bare eager / bare unsandboxed / lifecycle floor / bare / headway, then headway /
bare / lifecycle floor / ...; a side's rate in the round is N over its two times. The
server slows as its in-memory store fills during a run, and the machine's load drifts; in
one fixed order that drift counted against the side run last (Headway), mirrored a linear
drift cancels, and with bare and Headway next to each other (bare, headway, headway, bare
in the middle of each round) the two sides of ``ratio`` see the same load. Prints one JSON
line last (see ``/work/shared/specs/benchmarks.md``), with ``calib_us`` (the machine's
calibration before the server starts and after it stops, and their mean; see
``bench/_common.py``) and ``normalized``: the rates (``*_per_s``, scaled ``r * calib /
100``) and times (``enqueue_to_admit_ms``, ``cpu_ms_per_workflow``, ``t * 100 / calib``)
as on a 100 us machine. Rates here are set by the CPU of two processes (worker and
server) on two cores, so their normalized values are a rough guide; ratios need none.

With ``--control-planes 2`` the Headway side is served by two control-plane workers:
this process's and one ``headway worker control-plane`` process beside it, on the same
server and the same store (``--database-url``, e.g. PostgreSQL; default a SQLite file
both share), as a scaled-out control plane runs (``control_planes`` in the JSON).

    python bench/e2e_throughput.py [--n 300] [--rounds 5] [--control-planes 2]
        [--database-url postgresql+psycopg://...]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Coroutine
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from headway import protocol
from headway.protocol import DemandRequest, SubmitRequest
from headway.store import LeaseStore
from headway.worker import sdk_fastpath
from headway.worker.control_plane import WORKER_TUNING, build_control_plane_worker
from headway.worker.gc_tuning import freeze_startup, set_young_threshold
from headway.workflows import client as hw
from temporalio.client import Client
from temporalio.worker import PollerBehaviorAutoscaling, UnsandboxedWorkflowRunner, Worker

BARE_QUEUE = "bench-bare"
#: The same bare workflow on a worker without the SDK's sandbox, as Headway's run.
BARE_UNSANDBOXED_QUEUE = "bench-bare-unsandboxed"
#: The bare workflow's activity worker (Headway's counterpart: the cluster worker).
BARE_ACTIVITY_QUEUE = "bench-bare-activity"
#: The lifecycle floor: an action's Temporal operations without Headway's logic.
LIFECYCLE_QUEUE = "bench-lifecycle"


async def gather_limited(coros: list[Coroutine[Any, Any, None]], limit: int = 100) -> None:
    sem = asyncio.Semaphore(limit)

    async def one(c: Coroutine[Any, Any, None]) -> None:
        async with sem:
            await c

    await asyncio.gather(*(one(c) for c in coros))


def side_workers(client: Client, store: LeaseStore, fleet: list[Any]) -> list[Worker]:
    """The workers of every side: bare (sandboxed and not), the lifecycle floor, the bare
    activity worker, Headway's control plane and its simulated cluster's worker."""
    from _activities import instant_delete, instant_run  # type: ignore[import-not-found]
    from _bare import (  # type: ignore[import-not-found]
        BareWorkflow,
        LifecycleWorkflow,
        noop,
        noop_local,
    )

    return [
        # Same slot tuning as the control-plane worker (fair comparison).
        Worker(
            client,
            task_queue=BARE_QUEUE,
            workflows=[BareWorkflow],
            activities=[noop],
            **WORKER_TUNING,
        ),
        Worker(
            client,
            task_queue=BARE_UNSANDBOXED_QUEUE,
            workflows=[BareWorkflow],
            workflow_runner=UnsandboxedWorkflowRunner(),
            **WORKER_TUNING,
        ),
        Worker(
            client,
            task_queue=LIFECYCLE_QUEUE,
            workflows=[LifecycleWorkflow],
            activities=[noop_local],
            **WORKER_TUNING,
        ),
        Worker(
            client,
            task_queue=BARE_ACTIVITY_QUEUE,
            activities=[noop],
            max_concurrent_activities=500,
            activity_task_poller_behavior=PollerBehaviorAutoscaling(),
        ),
        build_control_plane_worker(client, store, fleet),
        Worker(
            client,
            task_queue=protocol.cluster_task_queue(fleet[0].name),
            activities=[instant_run, instant_delete],
            max_concurrent_activities=500,
            activity_task_poller_behavior=PollerBehaviorAutoscaling(),  # as worker/cluster.py
        ),
    ]


async def bare_round(
    client: Client,
    n: int,
    tag: str,
    activity_queue: str | None,
    queue: str = BARE_QUEUE,
    lifecycle: bool = False,
) -> float:
    """N bare workflows on the worker of ``queue``; ``activity_queue`` None runs their
    activity eagerly (see above). ``lifecycle``: the lifecycle floor's workflow instead,
    started with a memo like an action's."""
    from _bare import BareWorkflow, LifecycleWorkflow  # type: ignore[import-not-found]

    t0 = time.perf_counter()

    async def one(i: int) -> None:
        wid = f"bare-{tag}-{i}"
        if lifecycle:
            memo = {"action_id": wid, "queue": "bench", "tenant": "bench", "run": None}
            h = await client.start_workflow(
                LifecycleWorkflow.run, activity_queue, id=wid, task_queue=queue, memo=memo
            )
        else:
            h = await client.start_workflow(
                BareWorkflow.run, activity_queue, id=wid, task_queue=queue
            )
        await h.result()

    await gather_limited([one(i) for i in range(n)])
    return n / (time.perf_counter() - t0)


async def headway_round(
    client: Client, n: int, tenant: str, tag: str, lat: list[float], meter: Any = None
) -> tuple[float, tuple[float, float]]:
    """N actions at once; their rate, and ``meter``'s reading when the last one ended
    (before the latency sampling below, whose queries replay closed workflows)."""
    demand = DemandRequest(resources={"cpu": "100m", "memory": "64Mi"})
    t0 = time.perf_counter()

    async def one(i: int) -> None:
        h = await hw.submit(client, SubmitRequest(f"{tag}-{i}", "bench", demand, tenant))
        res = await hw.wait_result(h)
        assert res.state == "succeeded", res

    await gather_limited([one(i) for i in range(n)])
    rate = n / (time.perf_counter() - t0)
    reading = meter.read() if meter is not None else (0.0, 0.0)
    # Enqueue -> admission, from the actions' own records (workflow clock), sampled.
    for i in range(0, n, max(1, n // 100)):
        st = await hw.action_state(client, tenant, f"{tag}-{i}")
        if st.admitted_at is not None:
            lat.append((st.admitted_at - st.submitted_at) * 1000)
    return rate, reading


#: The bench's cluster as a fleet file, for the extra control planes (no queues: they
#: seed nothing; the bench creates its tenant's queue itself).
FLEET_YAML = """\
clusters:
  - name: sim
    node_groups:
      - {name: cpu, count: 1000, shape: {cpu: 64, memory: 256Gi}}
"""


def start_control_planes(n: int, address: str, database_url: str, tmp: str) -> list[Any]:
    """``n`` control-plane worker processes beside this one (same server and store)."""
    fleet = Path(tmp) / "bench-fleet.yaml"
    fleet.write_text(FLEET_YAML)
    procs = []
    for i in range(n):
        log = open(Path(tmp) / f"control-plane-{i + 2}.log", "wb")  # noqa: SIM115
        argv = [sys.executable, "-m", "headway.cli", "--address", address, "--tenant", "bench"]
        argv += ["worker", "control-plane", "--fleet", str(fleet), "--database-url", database_url]
        procs.append(
            subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=dict(os.environ))
        )
    return procs


async def wait_control_pollers(client: Client, n: int, timeout_s: float = 120.0) -> None:
    """Until ``n`` distinct workers poll the control plane's workflow task queue."""
    from temporalio.api.enums.v1 import TaskQueueType
    from temporalio.api.taskqueue.v1 import TaskQueue
    from temporalio.api.workflowservice.v1 import DescribeTaskQueueRequest

    deadline = time.monotonic() + timeout_s
    while True:
        resp = await client.workflow_service.describe_task_queue(
            DescribeTaskQueueRequest(
                namespace=client.namespace,
                task_queue=TaskQueue(name=protocol.CONTROL_TASK_QUEUE),
                task_queue_type=TaskQueueType.TASK_QUEUE_TYPE_WORKFLOW,
            )
        )
        if len({p.identity for p in resp.pollers}) >= n:
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"fewer than {n} control-plane workers poll after {timeout_s}s")
        await asyncio.sleep(0.5)


def per_item(a: tuple[float, float], b: tuple[float, float], n: int) -> tuple[float, float]:
    """CPU ms per workflow between two meter readings."""
    return ((b[0] - a[0]) * 1000 / n, (b[1] - a[1]) * 1000 / n)


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=300)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument(
        "--control-planes",
        type=int,
        default=1,
        help="control-plane workers serving the Headway side (this process's and N-1 others)",
    )
    ap.add_argument("--database-url", default=None, help="the store (default: a SQLite file)")
    args = ap.parse_args()
    from _common import (  # type: ignore[import-not-found]
        CpuMeter,
        big_fleet,
        calib_us,
        calibration,
        normalize,
        pct,
        start_server,
        summary,
    )

    calib_start = calib_us()  # before the server and the workers load the machine
    # Before any worker exists, so every side runs alike (building Headway's worker
    # would install it anyway, for the whole process).
    fastpath = sdk_fastpath.install()
    env = await start_server()
    meter = CpuMeter()
    client = env.client
    tmp = tempfile.mkdtemp()
    database_url = args.database_url or f"sqlite:///{tmp}/bench.db"
    store = LeaseStore(database_url)
    fleet = big_fleet()
    tenant = "bench"
    address = client.service_client.config.target_host
    others = start_control_planes(args.control_planes - 1, address, database_url, tmp)
    try:
        async with contextlib.AsyncExitStack() as stack:
            for w in side_workers(client, store, fleet):
                await stack.enter_async_context(w)
            # As a worker process does once it is up (``headway.worker.gc_tuning``):
            # process-wide, so every side runs with it.
            frozen = freeze_startup()
            young = set_young_threshold()
            await wait_control_pollers(client, args.control_planes)
            await hw.upsert_queue(client, tenant, {"name": "bench"}, fleet)
            await bare_round(client, args.n // 2, "warm", BARE_ACTIVITY_QUEUE)
            await bare_round(client, args.n // 2, "warm-eager", None)
            await bare_round(
                client, args.n // 2, "warm-unsb", BARE_ACTIVITY_QUEUE, BARE_UNSANDBOXED_QUEUE
            )
            await bare_round(
                client, args.n // 2, "warm-life", BARE_ACTIVITY_QUEUE, LIFECYCLE_QUEUE, True
            )
            await headway_round(client, args.n // 2, tenant, "warm", [])
            # Where each bare-side workflow runs: (activity queue, workflow queue, floor?).
            # In running order: bare last, so that it runs next to Headway (see above).
            bare_sides: dict[str, tuple[str | None, str, bool]] = {
                "eager": (None, BARE_QUEUE, False),
                "unsb": (BARE_ACTIVITY_QUEUE, BARE_UNSANDBOXED_QUEUE, False),
                "life": (BARE_ACTIVITY_QUEUE, LIFECYCLE_QUEUE, True),
                "bare": (BARE_ACTIVITY_QUEUE, BARE_QUEUE, False),
            }
            sides = [*bare_sides, "head"]
            lat: list[float] = []

            async def run_side(side: str, n: int, tag: str) -> tuple[float, tuple[float, float]]:
                """Seconds ``side`` took for ``n``, and the CPU it cost (s: process, server)."""
                c0 = meter.read()
                if side == "head":
                    rate, c1 = await headway_round(client, n, tenant, tag, lat, meter)
                else:
                    aq, wq, floor = bare_sides[side]
                    rate = await bare_round(client, n, tag, aq, wq, floor)
                    c1 = meter.read()
                return n / rate, (c1[0] - c0[0], c1[1] - c0[1])

            rates: dict[str, list[float]] = {s: [] for s in sides}
            # CPU ms per workflow / action: [worker+client process, dev server].
            cpu: dict[str, list[tuple[float, float]]] = {s: [] for s in sides}
            half = args.n // 2
            for r in range(args.rounds):
                # Each side runs twice a round, n/2 each time, in mirrored order (... bare,
                # headway, then headway, bare ...): the server slows as its in-memory
                # store fills over a run, and with one fixed order that drift would count
                # against whichever side runs last; mirrored, a linear drift cancels, and
                # next to each other bare and headway see the same load.
                secs = dict.fromkeys(sides, 0.0)
                used = {s: (0.0, 0.0) for s in sides}
                for leg, order in (("a", sides), ("b", sides[::-1])):
                    for side in order:
                        dt, dc = await run_side(side, half, f"r{r}{leg}-{side}")
                        secs[side] += dt
                        used[side] = (used[side][0] + dc[0], used[side][1] + dc[1])
                for side in sides:
                    rates[side].append(2 * half / secs[side])
                    cpu[side].append(per_item((0.0, 0.0), used[side], 2 * half))
                e, u, lf, b, h = (rates[s][-1] for s in sides)
                print(
                    f"round {r}: bare {b:.1f} wf/s (eager {e:.1f}, unsandboxed {u:.1f},"
                    f" lifecycle floor {lf:.1f}), headway {h:.1f} actions/s, ratio {h / b:.2f}"
                    f" (vs eager {h / e:.2f}, vs unsandboxed {h / u:.2f},"
                    f" vs lifecycle floor {h / lf:.2f}; floor vs bare {lf / b:.2f})"
                )
            eager, unsb, life, bare, head = (rates[s] for s in sides)
            ratio = [x / y for x, y in zip(head, bare, strict=True)]
            ratio_eager = [x / y for x, y in zip(head, eager, strict=True)]
            ratio_unsb = [x / y for x, y in zip(head, unsb, strict=True)]
            ratio_life = [x / y for x, y in zip(head, life, strict=True)]
            sched = client.get_workflow_handle(protocol.scheduler_workflow_id(tenant))
            stats = await sched.query("stats")
    finally:
        for proc in others:
            proc.terminate()
            proc.wait(timeout=30)
        store.close()
        await env.shutdown()
    calib = calibration(calib_start, calib_us())
    out: dict[str, Any] = {
        "n": args.n,
        "rounds": args.rounds,
        "calib_us": calib,
        "bare_wf_per_s": summary(bare),
        "headway_actions_per_s": summary(head),
        "ratio": summary(ratio),
        "bare_eager_wf_per_s": summary(eager),
        "ratio_vs_eager": summary(ratio_eager),
        "bare_unsandboxed_wf_per_s": summary(unsb),
        "ratio_vs_unsandboxed": summary(ratio_unsb),
        "lifecycle_floor_wf_per_s": summary(life),
        "ratio_vs_lifecycle_floor": summary(ratio_life),
        "lifecycle_floor_vs_bare": summary([x / y for x, y in zip(life, bare, strict=True)]),
        "enqueue_to_admit_ms": {
            "p50": round(pct(lat, 50), 1),
            "p99": round(pct(lat, 99), 1),
        },
        "cpu_ms_per_workflow": {
            side: {
                "python": round(statistics.median(c[0] for c in cs), 2),
                "server": round(statistics.median(c[1] for c in cs), 2),
            }
            for side, cs in (
                ("bare", cpu["bare"]),
                ("bare_eager", cpu["eager"]),
                ("bare_unsandboxed", cpu["unsb"]),
                ("lifecycle_floor", cpu["life"]),
                ("headway", cpu["head"]),
            )
        },
        "clusters": 1,
        "control_planes": args.control_planes,
        "store": database_url.split(":", 1)[0],
        "sdk_fastpath": fastpath,
        "gc_frozen": frozen,
        "gc_young_threshold": young,
        "scheduler": {k: stats[k] for k in ("passes", "syncs", "dispatches", "admitted")},
    }
    out["normalized"] = normalize(
        {
            k: out[k]
            for k in (
                "bare_wf_per_s",
                "headway_actions_per_s",
                "bare_eager_wf_per_s",
                "bare_unsandboxed_wf_per_s",
                "lifecycle_floor_wf_per_s",
                "enqueue_to_admit_ms",
                "cpu_ms_per_workflow",
            )
        },
        calib["mean"],
    )
    print(json.dumps(out))


if __name__ == "__main__":
    asyncio.run(main())
