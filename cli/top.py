"""``headway top``: a live view of the tenant's queues, what waits and why, the blocked
heads (gangs first), and the clusters' free capacity, refreshing in place.

Each refresh asks the tenant's scheduler three queries (``queues``, ``fleet``,
``snapshot``), the same ones ``get queues``, ``get queue`` and ``get clusters`` ask, and
redraws one screen that fits 80 columns. On a terminal it runs until Ctrl-C (or
``--iterations``); piped, it prints one screen and exits (``--once`` does so anywhere).
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import click

from ._common import Settings, connect, no_tenant, rpc_error, settings
from ._output import duration, render_table

if TYPE_CHECKING:
    from temporalio.client import Client

__all__ = ["top"]


async def _gather(client: Client, tenant: str) -> dict[str, Any]:
    """One refresh's data: each queue's view, each cluster's, and the blocked heads."""
    from headway.workflows import client as hw

    from .clusters import cluster_views
    from .queues import fetch_queues, fetch_snapshot_or_none, queue_view

    queues = await fetch_queues(client, tenant)
    if not queues:
        raise _NoTenant
    fleet = await hw.get_fleet(client, tenant)
    live = await fetch_snapshot_or_none(client, tenant)
    views = [queue_view(name, stats, live) for name, stats in queues.items()]
    heads = []
    for v in views:
        head = v["blocked_head"]
        if head is None:
            continue
        pods = 1
        if live is not None:
            a = live[0].actions.get(head["action"])
            spec = getattr(a, "spec", None)
            pods = len(spec.pods) if spec is not None else 1
        heads.append({"queue": v["name"], "pods": pods, **head})
    # Gangs first (they are what holds a queue longest), then the longest waiting.
    heads.sort(key=lambda h: (h["pods"] == 1, -(h["waiting_s"] or 0.0)))
    return {
        "queues": views,
        "clusters": cluster_views(fleet, live, tenant),
        "blocked": heads,
    }


class _NoTenant(Exception):
    """The tenant has no scheduler (no queue was ever created or used under it)."""


def _top_reason(reasons: Mapping[str, int]) -> str:
    if not reasons:
        return "-"
    reason, n = max(reasons.items(), key=lambda kv: (kv[1], kv[0]))
    return f"{reason} ({n})" if len(reasons) == 1 else f"{reason} ({n}) +{len(reasons) - 1}"


def _ratio(free: Any, total: Any) -> str:
    return f"{'?' if free is None else free}/{total}"


def _count(gpu: Any) -> Any:
    text = str(gpu)
    return text.partition(":")[2] if ":" in text else text


def render(data: Mapping[str, Any], cfg: Settings, every: float | None, error: str = "") -> str:
    """One screen of ``top`` as plain text (at most 80 columns but for long names)."""
    now = time.strftime("%H:%M:%S", time.gmtime())
    refresh = f", every {every:g}s" if every else ""
    out = [f"headway top - tenant {cfg.tenant} at {cfg.address} - {now} UTC{refresh}"]
    if error:
        out.append(f"! {error} (showing the last answer)")
    views = data["queues"]
    waiting = sum(v["waiting"] for v in views)
    running = sum(v["running"] for v in views)
    out.append(f"Queues: {len(views)}, waiting {waiting}, running {running}")
    out.append("")
    rows = [
        [
            v["name"],
            v["priority"],
            v["status"],
            v["waiting"],
            v["running"],
            duration(v["wait_p95_s"]),
            _top_reason(v["waiting_by_reason"]),
        ]
        for v in views
    ]
    out.append(render_table(["queue", "prio", "status", "wait", "run", "p95", "top reason"], rows))
    out.append("")
    totals: dict[str, int] = {}
    for v in views:
        for reason, n in v["waiting_by_reason"].items():
            totals[reason] = totals.get(reason, 0) + n
    out.append("Waiting by reason:")
    if totals:
        for reason, n in sorted(totals.items(), key=lambda kv: (-kv[1], kv[0])):
            out.append(f"  {reason:<24} {n}")
    else:
        out.append("  (nothing waits)")
    out.append("")
    out.append("Blocked heads:")
    if data["blocked"]:
        for h in data["blocked"][:5]:
            what = f"gang of {h['pods']}" if h["pods"] > 1 else "1 pod"
            why = h["reason"] or "?"
            out.append(
                f"  {h['queue']}: {h['action']} ({what}) {why}, for {duration(h['waiting_s'])}"
            )
        if len(data["blocked"]) > 5:
            out.append(f"  ... and {len(data['blocked']) - 5} more")
    else:
        out.append("  (none)")
    out.append("")
    crow = []
    for c in data["clusters"]:
        free, total, rep = c["free"], c["allocatable"], c["last_report"]
        crow.append(
            [
                c["name"],
                c["status"],
                _ratio(_count(free["gpu"]), _count(total["gpu"])),
                _ratio(free["cpu"], total["cpu"]),
                _ratio(free["memory"], total["memory"]),
                "never" if rep is None else f"{duration(rep['age_s'])} ago",
            ]
        )
    out.append(
        render_table(["cluster", "status", "free gpu", "free cpu", "free memory", "reported"], crow)
    )
    return "\n".join(out)


@click.command("top")
@click.option(
    "--interval",
    type=click.FloatRange(min=0.2),
    default=2.0,
    show_default=True,
    help="Seconds between refreshes.",
)
@click.option("--once", is_flag=True, help="Print one screen and exit (the default when piped).")
@click.option(
    "--iterations",
    type=click.IntRange(min=1),
    default=None,
    help="Stop after N screens. [default: until Ctrl-C]",
)
@click.pass_context
def top(ctx: click.Context, interval: float, once: bool, iterations: int | None) -> None:
    """A live view of the tenant: queues (waiting, running, p95 wait, the commonest
    reason), waiting by reason, blocked heads (gangs first), and the clusters' free
    capacity, refreshing in place until Ctrl-C."""
    cfg = settings(ctx)
    if once or not sys.stdout.isatty():
        iterations = 1
        interval = 0.0
    with contextlib.suppress(KeyboardInterrupt):  # Ctrl-C is how a live view ends
        asyncio.run(_run(cfg, interval, iterations))


async def _run(cfg: Settings, interval: float, iterations: int | None) -> None:
    from temporalio.client import WorkflowQueryFailedError
    from temporalio.service import RPCError

    client = await connect(cfg)

    async def fetch() -> dict[str, Any]:
        try:
            return await _gather(client, cfg.tenant)
        except _NoTenant:
            raise no_tenant(cfg) from None
        except WorkflowQueryFailedError as exc:
            raise click.ClickException(f"query failed: {exc}") from exc
        except RPCError as exc:
            raise rpc_error(cfg, exc) from exc

    data = await fetch()  # the first answer, or the one-line error of any command
    if iterations == 1:
        click.echo(render(data, cfg, None))
        return
    from rich.console import Console
    from rich.live import Live
    from rich.text import Text

    console = Console()
    shown = 0
    with Live(console=console, screen=True, auto_refresh=False) as live:
        while True:
            error = ""
            if shown:
                try:
                    data = await fetch()
                except click.ClickException as exc:
                    error = exc.message  # keep showing the last answer, say why
            live.update(Text(render(data, cfg, interval, error)), refresh=True)
            shown += 1
            if iterations is not None and shown >= iterations:
                break
            await asyncio.sleep(interval)
