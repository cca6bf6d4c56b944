"""What the Temporal server does per workflow: bare, the lifecycle floor, Headway.

A companion of ``bench/e2e_throughput.py``. Rates on a shared 2-core machine move with
its load; the server's own counts do not. This runs the same three sides as that bench
(bare: one activity on its own worker; the lifecycle floor: bare plus the Temporal
operations an action's lifecycle needs, see ``bench/_bare.py``; Headway: actions through
the shard scheduler to a simulated cluster with room), N each, twice, one side at a time,
and reads the dev server's Prometheus metrics before and after each: frontend requests
by API, persistence requests by operation, history and visibility tasks by type. Each
count is divided by N. ``headway_minus_floor`` is what Headway asks of the server beyond
the floor (its scheduler's share: nudge signals, its workflow tasks and their updates).

Counts only: no figure here depends on time, so the numbers hold on a loaded machine.
``calib_us`` (the machine's calibration at the start and at the end, and their mean; see
``bench/_common.py``) is printed all the same, as every benchmark does, and
``normalized`` is empty: there is no time to normalize.

    python bench/e2e_ops.py [--n 300]
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import json
import re
import socket
import sys
import tempfile
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from headway.protocol import DemandRequest, SubmitRequest
from headway.store import LeaseStore
from headway.worker import sdk_fastpath
from headway.workflows import client as hw
from temporalio.client import Client

#: Metric families counted, as ``family:operation`` (``operation`` label, or task type).
FAMILIES = (
    "service_requests",
    "persistence_requests",
    "visibility_persistence_requests",
    "task_requests",
)
_LINE = re.compile(r"^(\w+)\{(.*)\} ([0-9.e+-]+)$")
_LABEL = re.compile(r'(\w+)="([^"]*)"')


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def scrape(port: int) -> dict[str, float]:
    """Counters of ``FAMILIES`` by operation, summed over their other labels."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        text = r.read().decode()
    out: collections.defaultdict[str, float] = collections.defaultdict(float)
    for line in text.splitlines():
        m = _LINE.match(line)
        if m is None or m.group(1) not in FAMILIES:
            continue
        op = dict(_LABEL.findall(m.group(2))).get("operation", "")
        out[f"{m.group(1)}:{op}"] += float(m.group(3))
    return out


async def headway_side(client: Client, n: int, tag: str) -> None:
    from e2e_throughput import gather_limited  # type: ignore[import-not-found]

    demand = DemandRequest(resources={"cpu": "100m", "memory": "64Mi"})

    async def one(i: int) -> None:
        h = await hw.submit(client, SubmitRequest(f"{tag}-{i}", "bench", demand, "bench"))
        res = await hw.wait_result(h)
        assert res.state == "succeeded", res

    await gather_limited([one(i) for i in range(n)])


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=300)
    args = ap.parse_args()
    from _common import (  # type: ignore[import-not-found]
        big_fleet,
        calib_us,
        calibration,
        start_server,
    )
    from e2e_throughput import (
        BARE_ACTIVITY_QUEUE,
        LIFECYCLE_QUEUE,
        bare_round,
        side_workers,
    )

    calib_start = calib_us()  # before the server and the workers load the machine
    sdk_fastpath.install()
    port = free_port()
    env = await start_server(metrics_port=port)
    client = env.client
    tmp = tempfile.mkdtemp()
    store = LeaseStore(f"sqlite:///{tmp}/bench.db")
    fleet = big_fleet()
    n = args.n
    per: dict[str, list[dict[str, float]]] = {"bare": [], "floor": [], "headway": []}
    try:
        async with contextlib.AsyncExitStack() as stack:
            for w in side_workers(client, store, fleet):
                await stack.enter_async_context(w)
            await hw.upsert_queue(client, "bench", {"name": "bench"}, fleet)
            # Warm-up: task queues loaded, the scheduler running.
            await bare_round(client, n // 3, "warm", BARE_ACTIVITY_QUEUE)
            await bare_round(client, n // 3, "warm-f", BARE_ACTIVITY_QUEUE, LIFECYCLE_QUEUE, True)
            await headway_side(client, n // 3, "warm")
            for r in range(2):
                for side in per:
                    # Let the last side's background work (lazy end nudges, timers)
                    # settle before and after, so it is counted where it belongs.
                    await asyncio.sleep(2)
                    before = scrape(port)
                    tag = f"r{r}-{side}"
                    if side == "bare":
                        await bare_round(client, n, tag, BARE_ACTIVITY_QUEUE)
                    elif side == "floor":
                        await bare_round(client, n, tag, BARE_ACTIVITY_QUEUE, LIFECYCLE_QUEUE, True)
                    else:
                        await headway_side(client, n, tag)
                    await asyncio.sleep(2)
                    after = scrape(port)
                    per[side].append({k: (v - before.get(k, 0.0)) / n for k, v in after.items()})
    finally:
        store.close()
        await env.shutdown()
    calib = calibration(calib_start, calib_us())
    # Per side, the mean of its two runs.
    mean = {
        side: {k: sum(run.get(k, 0.0) for run in runs) / len(runs) for k in set().union(*runs)}
        for side, runs in per.items()
    }
    keys = sorted(
        k
        for k in set().union(*mean.values())
        if max(abs(m.get(k, 0.0)) for m in mean.values()) >= 0.01
    )
    print(f"{'per workflow':62s} {'bare':>8s} {'floor':>8s} {'headway':>8s} {'hw-floor':>9s}")
    for k in keys:
        b, f, h = (mean[s].get(k, 0.0) for s in ("bare", "floor", "headway"))
        print(f"{k:62s} {b:8.2f} {f:8.2f} {h:8.2f} {h - f:+9.2f}")
    print(
        json.dumps(
            {
                "n": n,
                "runs_per_side": 2,
                "calib_us": calib,
                # Counts only: no time to normalize (the key is here as the spec asks).
                "normalized": {},
                "ops_per_workflow": {
                    side: {k: round(m.get(k, 0.0), 3) for k in keys} for side, m in mean.items()
                },
                "headway_minus_floor": {
                    k: round(mean["headway"].get(k, 0.0) - mean["floor"].get(k, 0.0), 3)
                    for k in keys
                    if abs(mean["headway"].get(k, 0.0) - mean["floor"].get(k, 0.0)) >= 0.01
                },
            }
        )
    )


if __name__ == "__main__":
    asyncio.run(main())
