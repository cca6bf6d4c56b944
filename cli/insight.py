"""``headway forecast`` and ``headway what-if``: start times and live what-if, client-side.

Both fetch the shard scheduler's state (its ``snapshot`` query: the core's snapshot and
the scheduler's clock) and run the very same core forward on a local copy, so they cost
the scheduler one query and can never disagree with it given the same estimates.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import click
from headway import protocol
from headway.scheduler import Scheduler
from headway.scheduler.insight import forecast as run_forecast
from headway.scheduler.insight import what_if as run_what_if
from headway.scheduler.model import QueueSpec

from ._common import check_name, settings, with_client
from ._output import emit_structured, output_option, render_table, runtime_option
from ._specs import queue_to_entry
from .completion import complete_queues
from .queues import _apply_flags, _checked, _queue_options

if TYPE_CHECKING:
    from temporalio.client import Client

__all__ = ["forecast", "what_if"]


async def fetch_snapshot(client: Client, tenant: str) -> tuple[Scheduler, float]:
    """The tenant scheduler's live state as a local ``Scheduler`` copy, and its clock."""
    from temporalio.service import RPCError, RPCStatusCode

    handle = client.get_workflow_handle(protocol.scheduler_workflow_id(tenant))
    try:
        data: dict[str, Any] = await handle.query("snapshot")
    except RPCError as exc:
        if exc.status == RPCStatusCode.NOT_FOUND:
            raise click.ClickException(
                f"tenant {tenant!r} has no scheduler yet (create a queue or submit first)"
            ) from exc
        raise
    return Scheduler.from_snapshot(data["snapshot"]), float(data["now"])


def _fmt(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    if seconds < 1:
        return "now"
    m, s = divmod(int(seconds), 60)
    h, m = divmod(m, 60)
    return f"{h}h{m:02d}m" if h else (f"{m}m{s:02d}s" if m else f"{s}s")


def _starts(row: Mapping[str, Any]) -> str:
    """When it starts; or when it is rejected QueuedTooLong instead."""
    if row["expires_in_s"] is not None:
        return f"never (QueuedTooLong in {_fmt(row['expires_in_s'])})"
    return _fmt(row["starts_in_s"])


@click.command("forecast")
@click.option("--queue", "queue", help="Only this queue's actions.")
@runtime_option
@output_option
@click.pass_context
def forecast(ctx: click.Context, queue: str | None, default_runtime: float, output: str) -> None:
    """When will each waiting action start? Runs the scheduler forward on a copy of its
    live state, with runtime estimates standing in for durations."""
    cfg = settings(ctx)
    if queue is not None:
        check_name(queue, "--queue")

    async def go(client: Client) -> tuple[Scheduler, float]:
        return await fetch_snapshot(client, cfg.tenant)

    sched, now = with_client(cfg, go)
    if queue is not None and queue not in sched.queues:
        # A typo'd queue is not a queue with nothing waiting.
        known = ", ".join(sorted(sched.queues)) or "none"
        raise click.ClickException(f"--queue: queue {queue!r} does not exist (queues: {known})")
    f = run_forecast(sched, now, default_runtime=default_runtime)
    rows: list[dict[str, Any]] = []
    for q in sched.queues.values():
        if queue is not None and q.spec.name != queue:
            continue
        for a in q.waiting:
            start = f.starts.get(a.id)
            expires = f.expires.get(a.id)
            rows.append(
                {
                    "action": a.id,
                    "queue": q.spec.name,
                    "reason": a.last,
                    "starts_in_s": None if start is None else start - now,
                    "cluster": f.clusters.get(a.id),
                    # Past its queue's max_queued_time first: rejected then, never started.
                    "expires_in_s": None if expires is None else expires - now,
                }
            )
    if emit_structured(rows, output):
        return
    if not rows:
        click.echo("nothing is waiting")
        return
    headers = ["action", "queue", "reason", "starts in", "cluster"]
    click.echo(
        render_table(
            headers,
            [[r["action"], r["queue"], r["reason"], _starts(r), r["cluster"]] for r in rows],
        )
    )


@click.command("what-if")
@click.argument("name", shell_complete=complete_queues)
@_queue_options
@click.option("--clear-cluster", is_flag=True, help="As if the queue could use any cluster.")
@runtime_option
@output_option
@click.pass_context
def what_if(
    ctx: click.Context,
    /,
    name: str,
    clear_cluster: bool,
    default_runtime: float,
    output: str,
    **flags: Any,
) -> None:
    """What if queue NAME had these settings? Forecasts every waiting action before and
    after the change (same flags as ``update queue``), without applying it."""
    cfg = settings(ctx)
    check_name(name, "NAME")
    _checked(_apply_flags({"name": name}, flags))  # bad flags fail before any round trip

    async def go(client: Client) -> tuple[Scheduler, float]:
        return await fetch_snapshot(client, cfg.tenant)

    sched, now = with_client(cfg, go)
    current = sched.queues.get(name)
    if current is None:
        raise click.ClickException(f"queue {name!r} does not exist (see `headway get queues`)")
    entry = _apply_flags(queue_to_entry(current.spec), flags)
    if clear_cluster:
        entry["clusters"] = None
    new: QueueSpec = _checked(entry)
    diff = run_what_if(sched, now, default_runtime=default_runtime, queue_specs=[new])
    rows: list[dict[str, Any]] = [
        {
            "action": aid,
            "queue": sched.actions[aid].queue,
            "before_s": None if d["before"] is None else d["before"] - now,
            "after_s": None if d["after"] is None else d["after"] - now,
        }
        for aid, d in diff.items()
    ]
    if emit_structured(rows, output):
        return
    moved = [r for r in rows if r["before_s"] != r["after_s"]]
    click.echo(f"{len(moved)} of {len(rows)} waiting actions would start at a different time")
    for r in moved:
        click.echo(
            f"  {r['action']:<28} {r['queue']:<16} {_fmt(r['before_s']):>10} ->"
            f" {_fmt(r['after_s'])}"
        )
