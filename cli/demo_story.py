"""The demo's seed story, live: one backfill eats production, and the queue settings
that fix it (issue #28).

Two acts on the running stack, each the same workload: a burst of 8 backfill sweeps of
a whole 8-GPU node each (the fleet has 4 such nodes), then two 8-GPU production jobs a
moment later. Act 1 runs under a naive
layout (both queues at the same priority, nothing capping the backfill): the burst takes
every GPU and production waits for it. Act 2 applies the fix (production high priority;
backfill low with a GPU quota of 16, half the GPUs): production starts at once. The
summary puts both acts side by side from the record of what ran, and ``headway review``
replays act 1 with the fix as the proposal, writing its report into the demo's data
directory.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from headway.connection import ConnectionOptions
from headway.sdk.client import Action, Resources, Task
from headway.sdk.client import Client as HeadwayClient

from ._specs import queue_from_entry
from ._stack import Stack

if TYPE_CHECKING:
    from headway.review.review import Review
    from headway.store.history import Finished
    from rich.console import Console

__all__ = ["FIXED", "NAIVE", "run_story"]

#: Act 1: a slot counter's view of the world; nothing stops the burst.
NAIVE: list[dict[str, Any]] = [
    {"name": "production", "priority": "medium", "algorithm": "greedy", "max_resources": None},
    {
        "name": "backfill",
        "priority": "medium",
        "algorithm": "greedy",
        "action_concurrency": None,
        "max_resources": None,
    },
]
#: Act 2: production first; the backfill may hold half the GPUs at most.
FIXED: list[dict[str, Any]] = [
    {"name": "production", "priority": "high", "algorithm": "greedy", "max_resources": None},
    {
        "name": "backfill",
        "priority": "low",
        "algorithm": "greedy",
        "action_concurrency": None,
        "max_resources": {"gpu": 16},
    },
]

# Whole nodes: a quota of 16 GPUs then leaves two nodes whole for production (smaller
# sweeps would fragment every node under the same quota, and production would still wait).
BURST = Task("sweep-burst", Resources(cpu=8, memory="32Gi", gpu=8), duration=5, estimate=5)
PROD = Task("prod-train", Resources(cpu=16, memory="128Gi", gpu=8), duration=3, estimate=3)
BURST_COUNT = 8
PROD_COUNT = 2


@dataclass
class Act:
    name: str
    since: float
    until: float
    ids: set[str]


async def run_story(
    stack: Stack,
    database_url: str,
    report: Path,
    namespace: str,
    tenant: str,
    console: Console,
    timeout_s: float,
) -> bool:
    """Both acts, their summary, and the review of act 1 (report written to ``report``)."""
    # The demo's own local server: plain, whatever the shell's connection settings say.
    hw = await HeadwayClient.connect(
        tenant=tenant,
        ui_url=stack.ui_url,
        connection=ConnectionOptions(stack.address, namespace),
    )
    console.print()
    console.print("[bold]The seed story: one backfill eats production[/]")
    acts = []
    for name, layout in (("naive", NAIVE), ("fixed", FIXED)):
        act = await _act(hw, tenant, name, layout, console, timeout_s)
        if act is None:
            return False
        acts.append(act)
    rows = await asyncio.to_thread(_recorded, database_url, tenant, acts)
    _print_acts(console, acts, rows)
    rv = await asyncio.to_thread(_review, rows[acts[0].name])
    from headway.review.review import summary

    console.print(
        "headway review: act 1's record replayed under the naive layout (today) and the"
        " fix (proposal):"
    )
    console.print(summary(rv), markup=False, highlight=False)
    try:
        from headway.review.report import render
    except ImportError:
        console.print("(no report: matplotlib is missing; pip install 'headway[report]')")
        return True
    report.write_text(render(rv))
    console.print(f"Review report: {report}")
    return True


async def _act(
    hw: HeadwayClient,
    tenant: str,
    name: str,
    layout: list[dict[str, Any]],
    console: Console,
    timeout_s: float,
) -> Act | None:
    from headway.workflows import client as hw_client

    for entry in layout:
        await hw_client.upsert_queue(hw.temporal, tenant, queue_from_entry(entry).to_dict())
    policy = "; ".join(
        f"{e['name']}: " + ", ".join(f"{k}={_shown(v)}" for k, v in e.items() if k != "name" and v)
        for e in layout
    )
    console.print(f"Act {name}: {policy}")
    since = time.time()
    run = hw.with_runcontext(run=f"story-{name}-{int(since)}")
    actions: list[Action] = []
    for _ in range(BURST_COUNT):
        actions.append(await run.submit(BURST.override(queue="backfill")))
    await asyncio.sleep(1.0)  # production arrives just after the burst
    for _ in range(PROD_COUNT):
        actions.append(await run.submit(PROD.override(queue="production")))
    console.print(
        f"  submitted {BURST_COUNT} backfill sweeps (8 GPUs, 5 s each), then"
        f" {PROD_COUNT} production jobs (8 GPUs, 3 s each); waiting for them..."
    )
    try:
        results = await asyncio.wait_for(
            asyncio.gather(*(a.result() for a in actions)), timeout=timeout_s
        )
    except TimeoutError:
        console.print(f"[red]act {name}: not finished after {timeout_s:.0f}s[/]")
        return None
    bad = [r for r in results if getattr(r, "state", None) != "succeeded"]
    if bad:
        console.print(f"[red]act {name}: {len(bad)} actions did not succeed: {bad[0]}[/]")
        return None
    return Act(name, since, time.time(), {a.id for a in actions})


def _shown(v: Any) -> str:
    if isinstance(v, dict):
        return "{" + ", ".join(f"{k}: {x}" for k, x in v.items()) + "}"
    return str(v)


def _recorded(database_url: str, tenant: str, acts: list[Act]) -> dict[str, list[Finished]]:
    """Each act's actions as the control plane recorded them (they end before their
    workflows do, so by now every one is written)."""
    from headway.store import LeaseStore
    from headway.store.history import HistoryStore

    store = LeaseStore(database_url)
    try:
        history = HistoryStore(store)
        out: dict[str, list[Finished]] = {}
        for act in acts:
            deadline = time.monotonic() + 30
            while True:
                rows = [r for r in history.window(tenant, act.since - 1) if r.action_id in act.ids]
                if len(rows) == len(act.ids) or time.monotonic() > deadline:
                    break
                time.sleep(0.2)
            out[act.name] = rows
        return out
    finally:
        store.close()


def _print_acts(console: Console, acts: list[Act], rows: dict[str, list[Finished]]) -> None:
    from headway.review.compare import percentile
    from headway.review.units import human_duration
    from rich.table import Table

    table = Table(title="The seed story, live: waits from submit to admission (the record)")
    for col in ("act", "queue", "actions", "wait p50", "wait max"):
        table.add_column(col)
    for act in acts:
        for q in ("production", "backfill"):
            waits = [r.wait for r in rows[act.name] if r.queue == q and r.wait is not None]
            table.add_row(
                act.name,
                q,
                str(len(waits)),
                human_duration(percentile(waits, 0.5)),
                human_duration(max(waits) if waits else None),
            )
    console.print(table)


def _review(rows: list[Finished]) -> Review:
    """Act 1 replayed under the naive layout (today) and the fix (the proposal)."""
    from headway.review.review import run_review
    from headway.review.workload import Layout

    from ._common import load_fleet

    fleet = load_fleet(None)

    def layout(entries: list[dict[str, Any]]) -> Layout:
        return Layout(list(fleet.clusters), [queue_from_entry(e) for e in entries], fleet.org)

    return run_review(rows, layout(NAIVE), layout(FIXED), starved_after=5.0)
