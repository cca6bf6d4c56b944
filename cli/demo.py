"""``headway demo``: the whole system on a real Temporal server, in about a minute.

It brings up the embedded default (server, control plane, one simulated cluster worker per
cluster of the bundled fleet) on a fresh data directory, creates two queues, submits a
mixed workload that includes a multi-node gang, shows the backlog draining, and exits 0
once every action has finished, with a per-queue wait summary. Then (``--no-story`` skips
it) it tells the seed story live (``demo_story``): a backfill burst under a naive layout,
the queue settings that fix it, both side by side from the record of what ran, and the
review of the naive act written as ``review.html`` in the data directory.
"""

from __future__ import annotations

import asyncio
import signal
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any

import click
from headway.connection import ConnectionOptions
from headway.sdk.client import Action, Resources, Task
from headway.sdk.client import Client as HeadwayClient

from ._common import default_database_url, load_fleet, settings
from ._specs import queue_from_entry
from ._stack import Stack, running_stack, wait_ready

if TYPE_CHECKING:
    from rich.console import Console

__all__ = ["demo"]

#: The demo's queues, in the file notation: production goes first and reserves capacity
#: for a gang that doesn't fit yet; backfill yields to it and is capped so it can never
#: take the fleet.
QUEUES: list[dict[str, Any]] = [
    {"name": "production", "priority": "high", "algorithm": "backfill"},
    {
        "name": "backfill",
        "priority": "low",
        "algorithm": "backfill",
        "action_concurrency": 6,
        "max_resources": {"gpu": 8},
    },
]


@dataclass(frozen=True)
class Batch:
    """``count`` actions of ``task`` on ``queue``."""

    queue: str
    task: Task
    count: int


#: Backfill first, so it is already running when production arrives: production's gang
#: then waits for whole nodes while priority keeps later backfill from taking them.
WORKLOAD = [
    Batch(
        "backfill",
        Task("sweep", Resources(cpu=4, memory="16Gi", gpu=1), duration=5, estimate=5),
        16,
    ),
    Batch(
        "production",
        Task(
            "train-gang",
            Resources(cpu=32, memory="256Gi", gpu="H100:8"),
            replicas=2,
            duration=12,
            estimate=12,
        ),
        1,
    ),
    Batch(
        "production",
        Task("serve", Resources(cpu=8, memory="64Gi", gpu="H200:4"), duration=6, estimate=6),
        4,
    ),
    Batch("production", Task("etl", Resources(cpu=16, memory="32Gi"), duration=4, estimate=4), 6),
]


@click.command()
@click.option(
    "--data-dir",
    default=None,
    help="Where the demo's server keeps its state. [default: a fresh temporary directory]",
)
@click.option("--port", default=7233, show_default=True, help="Temporal gRPC port.")
@click.option("--ui-port", default=8233, show_default=True, help="Web UI port.")
@click.option(
    "--timeout",
    "timeout_s",
    default=300.0,
    show_default=True,
    help="Give up (non-zero exit) if the workload has not finished by then (seconds).",
)
@click.option(
    "--hold", is_flag=True, help="Keep everything running after the summary, until Ctrl-C."
)
@click.option(
    "--story/--no-story",
    default=True,
    show_default=True,
    help="Then tell the seed story live: a backfill burst under a naive layout, then the"
    " queue settings that fix it, and the review of it (an HTML report).",
)
@click.pass_context
def demo(
    ctx: click.Context,
    data_dir: str | None,
    port: int,
    ui_port: int,
    timeout_s: float,
    hold: bool,
    story: bool,
) -> None:
    """Run the end-to-end demo on a real Temporal server; exit 0 when all work is done."""
    from rich.console import Console

    cfg = settings(ctx)
    console = Console(highlight=False)
    directory = Path(data_dir or tempfile.mkdtemp(prefix="headway-demo-")).resolve()
    directory.mkdir(parents=True, exist_ok=True)
    fleet = load_fleet(None)
    interrupted: list[int] = []

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        interrupted.append(signum)
        raise KeyboardInterrupt

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        console.print(f"[bold]Headway demo[/] (state in {directory})")
        console.print("Starting Temporal, the control plane and 3 simulated cluster workers...")
        # The store in the data directory, as `headway up --data-dir` reads it again.
        database_url = default_database_url(directory)
        with running_stack(
            directory, port=port, ui_port=ui_port, tenant=cfg.tenant, database_url=database_url
        ) as stack:
            asyncio.run(wait_ready(stack, fleet, tenant=cfg.tenant, namespace=cfg.namespace))
            console.print(
                f"Up. Temporal Web UI: {stack.ui_url}/namespaces/{cfg.namespace}/workflows"
            )
            ok = asyncio.run(_scenario(stack, cfg.namespace, cfg.tenant, console, timeout_s))
            if ok and story:
                from .demo_story import run_story

                report = directory / "review.html"
                ok = asyncio.run(
                    run_story(
                        stack, database_url, report, cfg.namespace, cfg.tenant, console, timeout_s
                    )
                )
            if hold and ok:
                console.print("Everything keeps running; Ctrl-C stops it.")
                while True:
                    time.sleep(1)
            console.print("Stopping...")
    except KeyboardInterrupt:
        if not interrupted:
            raise
        raise click.ClickException("interrupted") from None
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
    console.print(f"Stopped. See this run again in the Web UI: headway up --data-dir {directory}")
    if not ok:
        raise click.ClickException("not every action succeeded (see above)")


async def _scenario(
    stack: Stack, namespace: str, tenant: str, console: Console, timeout_s: float
) -> bool:
    # The demo's own local server: plain, whatever the shell's connection settings say.
    hw = await HeadwayClient.connect(
        tenant=tenant,
        ui_url=stack.ui_url,
        connection=ConnectionOptions(stack.address, namespace),
    )
    await _create_queues(hw, console)
    actions = await _submit_workload(hw, console)
    results = await _follow(stack, hw, actions, console, timeout_s)
    if results is None:
        return False
    return await _summarize(hw, actions, results, console)


async def _create_queues(hw: HeadwayClient, console: Console) -> None:
    from headway.workflows import client as hw_client

    for entry in QUEUES:
        spec = queue_from_entry(entry)
        await hw_client.upsert_queue(hw.temporal, hw.tenant, spec.to_dict())
        console.print(f"Created queue [bold]{spec.name}[/]: {_policy(entry)}")


async def _submit_workload(hw: HeadwayClient, console: Console) -> list[Action]:
    """Submit the demo's workload as one run, and print each action's Web UI link."""
    run = hw.with_runcontext(run=f"demo-{int(time.time())}")
    actions: list[Action] = []
    for batch in WORKLOAD:
        for _ in range(batch.count):
            actions.append(await run.submit(batch.task.override(queue=batch.queue)))
    console.print(f"Submitted {len(actions)} actions. Each one in the Temporal Web UI:")
    width = max(len(a.id) for a in actions)
    for a in actions:
        # One line per action, never wrapped, so every link stays clickable.
        console.print(
            f"  {a.id:<{width}}  {a.queue:<10}  {a.ui_url}  ({_demand(a)})",
            soft_wrap=True,
            markup=False,
        )
    return actions


async def _follow(
    stack: Stack, hw: HeadwayClient, actions: list[Action], console: Console, timeout_s: float
) -> dict[str, Any] | None:
    """Each action's result, with a progress bar per queue meanwhile; None when a
    process of the stack died or the workload did not finish in ``timeout_s``."""
    from headway.workflows import client as hw_client
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    queues = [q["name"] for q in QUEUES]
    totals = {q: sum(1 for a in actions if a.queue == q) for q in queues}
    results: dict[str, Any] = {}

    async def follow(a: Action) -> None:
        results[a.id] = await a.result()

    tasks = [asyncio.create_task(follow(a)) for a in actions]
    deadline = asyncio.get_running_loop().time() + timeout_s
    with Progress(
        TextColumn("{task.fields[queue]:<11}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[detail]}"),
        TimeElapsedColumn(),
        console=console,
    ) as progress:
        bars = {q: progress.add_task("", total=totals[q], queue=q, detail="") for q in queues}
        while len(results) < len(actions):
            dead = stack.failed()
            if dead is not None:
                console.print(f"[red]{dead.name} exited[/]; its log ends with:\n{dead.tail()}")
                return None
            if asyncio.get_running_loop().time() > deadline:
                console.print(f"[red]not finished after {timeout_s:.0f}s[/]")
                return None
            stats = await hw_client.get_queues(hw.temporal, hw.tenant)
            for q in queues:
                s = stats.get(q, {})
                done = sum(1 for a in actions if a.queue == q and a.id in results)
                blocked = " [yellow]head blocked[/]" if s.get("blocked_head") else ""
                progress.update(
                    bars[q],
                    completed=done,
                    detail=f"waiting {s.get('waiting', 0):>2}  running {s.get('running', 0):>2}"
                    + blocked,
                )
            await asyncio.sleep(0.5)
        for q in queues:
            progress.update(bars[q], completed=totals[q], detail="done")
    await asyncio.gather(*tasks)
    return results


async def _summarize(
    hw: HeadwayClient, actions: list[Action], results: dict[str, Any], console: Console
) -> bool:
    """The per-queue waits table, and whether every action succeeded."""
    from headway.workflows import client as hw_client
    from rich.table import Table

    # Waits as the action workflows themselves recorded them (admitted - submitted).
    states = {a.id: await hw_client.action_state(hw.temporal, hw.tenant, a.id) for a in actions}
    summary = Table(title="Per-queue waits (seconds from submit to admission)")
    for col in ("queue", "actions", "succeeded", "wait p50", "wait max", "clusters"):
        summary.add_column(col)
    all_ok = True
    for q in [q["name"] for q in QUEUES]:
        mine = [a for a in actions if a.queue == q]
        ok = [a for a in mine if getattr(results[a.id], "state", None) == "succeeded"]
        all_ok = all_ok and len(ok) == len(mine)
        waits = [
            st.admitted_at - st.submitted_at
            for a in mine
            if (st := states[a.id]).admitted_at is not None
        ]
        clusters = sorted({st.cluster for a in mine if (st := states[a.id]).cluster})
        summary.add_row(
            q,
            str(len(mine)),
            str(len(ok)),
            f"{statistics.median(waits):.1f}" if waits else "-",
            f"{max(waits):.1f}" if waits else "-",
            ", ".join(clusters),
        )
    console.print(summary)
    for a in actions:
        r = results[a.id]
        if getattr(r, "state", None) != "succeeded":
            console.print(f"[red]{a.id}[/]: {r}")
    if all_ok:
        console.print(f"[green]All {len(actions)} actions finished.[/]")
    return all_ok


def _policy(entry: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v}" for k, v in entry.items() if k != "name")


def _demand(a: Action) -> str:
    res = a.request.demand.resources or {}
    shape = " ".join(f"{k}={v}" for k, v in res.items())
    n = a.request.demand.replicas
    return f"{n} x {{{shape}}}" if n else shape
