"""Action commands: ``headway get actions``, ``describe action ID``, ``cancel``.

Lists come from Temporal's visibility (the search attributes every action workflow
keeps: HeadwayState, HeadwayQueue, HeadwayRun, ...), so listing costs no workflow
anything. ``describe`` asks the action's workflow (its history and its ``state`` query)
and, while it waits, the shard scheduler (``why``, and its state for the position and a
start forecast run on a copy).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import asdict
from typing import TYPE_CHECKING, Any

import click

from ._common import Settings, check_id, check_name, settings, with_client, workflow_url
from ._groups import describe, get
from ._output import (
    Block,
    age,
    duration,
    emit_structured,
    fmt_cpu,
    fmt_gpu,
    fmt_memory,
    iso,
    output_option,
    render_table,
    runtime_option,
    wall_times,
)
from .completion import complete_actions, complete_in_flight, complete_queues

if TYPE_CHECKING:
    from headway.scheduler import Scheduler
    from headway.workflows.client import ActionDetails, ActionRow, CancelOutcome
    from temporalio.client import Client

__all__ = ["cancel", "describe_action", "get_actions"]

#: The states ``--state`` takes (``headway.workflows.client.ACTION_STATES``; spelled out
#: here so ``headway --help`` needs no Temporal import).
STATES = ("submitting", "waiting", "running", "succeeded", "failed", "cancelled", "rejected")
#: Pod roles per demand kind: the first pod's, then the others' (as the action creates
#: them, ``headway.workflows.action``).
_ROLES = {
    "single": ("main", "main"),
    "replicas": ("worker", "worker"),
    "ray": ("ray-head", "ray-worker"),
    "spark": ("spark-driver", "spark-executor"),
}


#: After this long, ``cancel`` says what it is waiting for.
PATIENCE_S = 3.0
#: Informer event kinds after which a pod is gone (``protocol.TERMINAL_EVENTS``).
_TERMINAL = (
    "Succeeded",
    "Failed",
    "OOMKilled",
    "Preempted",
    "Evicted",
    "NodeLost",
    "ImagePullFailed",
)


def _not_found(cfg: Settings, action_id: str) -> click.ClickException:
    return click.ClickException(
        f"action {action_id!r} not found in tenant {cfg.tenant!r} (see `headway get actions`)"
    )


async def _check_queue_exists(client: Client, cfg: Settings, queue: str) -> None:
    """Nothing listed for ``--queue``: a typo'd queue is an error, not an empty list (a
    deleted queue's actions are still listed: asked only when none is)."""
    from .queues import fetch_queues

    queues = await fetch_queues(client, cfg.tenant)
    if queue not in queues:
        known = ", ".join(sorted(queues)) or "none"
        raise click.ClickException(f"--queue: queue {queue!r} does not exist (queues: {known})")


# --- get actions ----------------------------------------------------------------------------


@get.command("actions")
@click.option(
    "--queue", default=None, help="Only actions of this queue.", shell_complete=complete_queues
)
@click.option(
    "--state", type=click.Choice(STATES), default=None, help="Only actions in this state."
)
@click.option("--run", default=None, help="Only actions of this run.")
@click.option(
    "--limit",
    type=click.IntRange(min=0),
    default=100,
    show_default=True,
    help="At most this many, newest first (0: all).",
)
@runtime_option
@output_option
@click.pass_context
def get_actions(
    ctx: click.Context,
    queue: str | None,
    state: str | None,
    run: str | None,
    limit: int,
    default_runtime: float,
    output: str,
) -> None:
    """List the tenant's actions, newest first (from Temporal's visibility, which lags
    the actions by a moment; a waiting action's reason, place in its queue and forecast
    start are the scheduler's). wide adds the run, start and end times and the workflow."""
    cfg = settings(ctx)
    if queue is not None:
        check_name(queue, "--queue")
    if run is not None:
        check_id(run, "--run")

    async def go(client: Client) -> list[ActionRow]:
        from headway.workflows import client as hw

        from .queues import fetch_snapshot_or_none

        rows = await hw.list_actions(
            client, cfg.tenant, queue=queue, state=state, run=run, limit=limit or None
        )
        if not rows and queue is not None:
            await _check_queue_exists(client, cfg, queue)
        if any(r.state in ("submitting", "waiting") for r in rows):
            # Visibility says only "Waiting" until an admission: the reason of each
            # waiting action comes from the scheduler's state (one query for them all).
            live = await fetch_snapshot_or_none(client, cfg.tenant)
            actions = live[0].actions if live is not None else {}
            for r in rows:
                a = actions.get(r.action_id)
                if r.state in ("submitting", "waiting") and a is not None and a.state == "waiting":
                    r.state, r.reason = "waiting", a.last or r.reason
            if live is not None:
                _place_waiting(rows, *live, default_runtime)
        return rows

    rows = with_client(cfg, go)
    if emit_structured([asdict(r) for r in rows], output):
        return
    if not rows:
        click.echo("No actions found.")
        return
    headers = ["name", "queue", "state", "reason", "cluster", "age"]
    if output == "wide":
        headers += ["pos", "starts in", "run", "started", "ended", "workflow"]
    table = []
    for r in rows:
        line: list[Any] = [
            r.action_id,
            r.queue,
            r.state,
            r.reason if r.reason != r.state else None,
            r.cluster,
            age(r.started_at),
        ]
        if output == "wide":
            starts = duration(r.starts_in_s) if r.starts_in_s is not None else None
            line += [r.position, starts, r.run, iso(r.started_at), iso(r.ended_at), r.workflow_id]
        table.append(line)
    click.echo(render_table(headers, table))


def _place_waiting(
    rows: list[ActionRow], sched: Scheduler, now: float, default_runtime: float
) -> None:
    """Each waiting row's place in its queue and forecast start: one forecast (the core
    run forward on a copy, as ``describe action``) for every row."""
    from headway.scheduler.insight import forecast as run_forecast

    waiting = [r for r in rows if r.state == "waiting"]
    if not waiting:
        return
    places = {a.id: i + 1 for q in sched.queues.values() for i, a in enumerate(q.waiting)}
    starts = run_forecast(sched, now, default_runtime=default_runtime).starts
    for r in waiting:
        r.position = places.get(r.action_id)
        at = starts.get(r.action_id)
        r.starts_in_s = None if at is None else max(0.0, at - now)


# --- describe action ------------------------------------------------------------------------


async def _gather(
    client: Client, cfg: Settings, action_id: str, default_runtime: float
) -> dict[str, Any]:
    """Everything ``describe action`` shows, as plain data."""
    from headway.workflows import client as hw

    try:
        d = await hw.action_details(client, cfg.tenant, action_id)
    except hw.ActionNotFoundError as exc:
        raise _not_found(cfg, action_id) from exc
    view = _base_view(cfg, d)
    if d.execution_status == "running" and d.state in ("submitting", "waiting"):
        w = view["waiting"] = await _waiting_view(client, cfg, action_id, default_runtime)
        # The attributes say only "Waiting" until admission (the scheduler does not signal
        # each change): the scheduler's own answer is the live reason.
        if w.get("scheduler_state") == "waiting":
            # In its first task the workflow still says "submitting" while its lease
            # already waits in the queue: the scheduler knows better.
            view["state"] = "waiting"
        if w.get("reason"):
            view["reason"] = w["reason"]
        if w.get("reasons"):
            view["reasons"] = w["reasons"]
    return view


def _base_view(cfg: Settings, d: ActionDetails) -> dict[str, Any]:
    from headway.scheduler import demand_from_request

    req, st, res = d.request, d.status, d.result
    demand: dict[str, Any] | None = None
    if req is not None:
        try:
            kind, shapes = demand_from_request(asdict(req.demand))
        except ValueError as exc:  # it was rejected for it (InvalidDemand)
            demand = {"kind": None, "error": str(exc), "pods": []}
        else:
            first, rest = _ROLES[kind.value]
            groups: list[dict[str, Any]] = []
            for i, p in enumerate(shapes):
                row = {
                    "role": first if i == 0 else rest,
                    "cpu": fmt_cpu(p.cpu) if p.cpu else "-",
                    "memory": fmt_memory(p.memory) if p.memory else "-",
                    "gpu": fmt_gpu(p.gpu, p.gpu_type),
                    "ephemeral_storage": fmt_memory(p.eph) if p.eph else "-",
                }
                if groups and {k: v for k, v in groups[-1].items() if k != "count"} == row:
                    groups[-1]["count"] += 1
                else:
                    groups.append({**row, "count": 1})
            demand = {"kind": kind.value, "pods": groups, "total_pods": len(shapes)}
    events: list[dict[str, Any]] = [
        {
            "at": e.observed_at or None,
            "kind": str(e.kind),
            "pod": e.pod,
            "node": e.node,
            "exit_code": e.exit_code,
            "message": e.message,
        }
        for e in (st.events if st is not None else [])
    ]
    pods: dict[str, dict[str, Any]] = {}
    for e in events:
        if e["pod"]:
            pod = pods.setdefault(e["pod"], {"pod": e["pod"], "node": None})
            pod.update(last_event=e["kind"], at=e["at"], message=e["message"])
            pod["node"] = e["node"] or pod["node"]
    if d.state == "cancelled" and d.attempts:
        # The cancel path deletes the pods (the run activity's cancellation, then a delete
        # activity) before the end is recorded; no informer event says so.
        for pod in pods.values():
            if pod["last_event"] not in _TERMINAL:
                pod["last_event"] = f"{pod['last_event']}, then deleted"
    reasons = list(st.reasons) if st is not None else []
    if res is not None and not reasons:
        reasons = list(res.reasons)
    return {
        "action": d.action_id,
        "tenant": d.tenant,
        "queue": d.queue,
        "run": d.run,
        "task": req.task if req is not None else None,
        "state": d.state,
        "reason": d.reason,
        "message": res.message if res is not None else "",
        "exit_code": res.exit_code if res is not None else None,
        "cluster": d.cluster,
        "nodes": sorted({p["node"] for p in pods.values() if p["node"]}),
        "submitted_at": (st.submitted_at if st is not None else None) or d.started_at,
        "admitted_at": st.admitted_at if st is not None else None,
        "ended_at": (st.ended_at if st is not None else None) or d.ended_at,
        "demand": demand,
        "estimate_s": req.estimate_s if req is not None else None,
        "image": req.image if req is not None else None,
        "reasons": reasons,
        "waited": _waited(st, d.ended_at),
        "waiting": None,
        "retries": max(0, d.attempts - 1),
        "attempts": [asdict(a) for a in st.attempts] if st is not None else [],
        "last_failure": d.last_failure or None,
        "cancel_requested_by": d.cancel_requested_by,
        "pods": list(pods.values()),
        "events": events,
        "workflow_id": d.workflow_id,
        "ui": workflow_url(cfg, d.workflow_id),
    }


def _waited(st: Any, ended_at: float | None) -> list[dict[str, Any]]:
    """Each reason the action was told it waits for, from when it was seen and for how
    long: until the next reason, its admission or its end (None: it still waits)."""
    if st is None:
        return []
    spans = list(st.waited)
    out = []
    for i, r in enumerate(spans):
        if i + 1 < len(spans):
            until: float | None = spans[i + 1].at
        elif st.admitted_at is not None and st.admitted_at >= r.at:
            until = st.admitted_at
        else:
            until = st.ended_at or ended_at
        out.append(
            {"reason": r.reason, "at": r.at, "for_s": None if until is None else until - r.at}
        )
    return out


async def _waiting_view(
    client: Client, cfg: Settings, action_id: str, default_runtime: float
) -> dict[str, Any]:
    """Where a waiting action stands: the scheduler's why, its place in its queue and a
    start forecast (the scheduler run forward on a copy of its state)."""
    from headway.scheduler.insight import forecast as run_forecast
    from headway.workflows import client as hw
    from temporalio.service import RPCError, RPCStatusCode

    from .queues import fetch_snapshot_or_none

    out: dict[str, Any] = {"in_window": False}
    try:
        why = await hw.why(client, cfg.tenant, action_id)
    except RPCError as exc:
        if exc.status != RPCStatusCode.NOT_FOUND:
            raise
        return out
    if why.get("state") is None:
        out["message"] = why.get("message")
        return out
    if why["state"] != "waiting":  # admitted a moment ago; the workflow has not seen it
        out.update(in_window=True, scheduler_state=why["state"], message="admitted, starting")
        return out
    out.update(
        in_window=True,
        scheduler_state="waiting",
        reason=why.get("reason"),
        reasons=list(why.get("reasons") or []),
        message=why.get("message"),
        unblock=list(why.get("unblock") or []),
        details=why.get("details") or {},
    )
    live = await fetch_snapshot_or_none(client, cfg.tenant)
    if live is None:
        return out
    sched, now = live
    # A retried action waits as its latest attempt (why answers for it, by its id).
    action_id = str(why.get("action_id") or action_id)
    a = sched.actions.get(action_id)
    q = sched.queues.get(a.queue) if a is not None else None
    if a is None or q is None or a.state != "waiting":
        return out
    ids = [w.id for w in q.waiting]
    if action_id in ids:
        out.update(position=ids.index(action_id) + 1, of=len(ids))
    f = run_forecast(sched, now, default_runtime=default_runtime)
    start = f.starts.get(action_id)
    p50 = None if start is None else max(0.0, start - now)
    out.update(
        starts_in_s=p50,
        starts_in_p90_s=await hw.start_p90(client, cfg.tenant, a.queue, p50),
        forecast_cluster=f.clusters.get(action_id),
    )
    return out


def _render_waiting(b: Block, w: dict[str, Any], queue: str) -> None:
    """Where a waiting action stands: its place, why, when it may start, what would
    unblock it."""
    b.section("Waiting")
    if w.get("scheduler_state") != "waiting":
        b.field(
            "Where",
            w.get("message") or "not yet in the scheduler's window (queued in the store)",
            indent=2,
        )
    else:
        if "position" in w:
            b.field("Position", f"{w['position']} of {w['of']} in queue {queue}", 2)
        why = w.get("reason") or "-"
        b.field("Why", f"{why}: {w['message']}" if w.get("message") else why, 2)
        if "starts_in_s" in w:
            if w["starts_in_s"] is None:
                starts = "not within the forecast"
            else:
                where = f" on {w['forecast_cluster']}" if w.get("forecast_cluster") else ""
                starts = f"~{duration(w['starts_in_s'])}{where} (forecast by estimates)"
                if w.get("starts_in_p90_s") is not None:
                    starts += f"; p90 {duration(w['starts_in_p90_s'])}"
            b.field("Starts in", starts, 2)
        for i, u in enumerate(w.get("unblock") or []):
            b.field("Unblock" if i == 0 else "", wall_times(str(u)), 2)


def _render(v: dict[str, Any], max_events: int) -> str:
    b = Block()
    b.field("Name", v["action"])
    b.field("Tenant", v["tenant"])
    b.field("Queue", v["queue"])
    b.field("Run", v["run"])
    b.field("Task", v["task"])
    state = v["state"] + (f" ({v['reason']})" if v["reason"] and v["reason"] != v["state"] else "")
    b.field("State", state)
    if v["message"]:
        b.field("Message", v["message"])
    if v["exit_code"] is not None:
        b.field("Exit code", v["exit_code"])
    if v["cancel_requested_by"]:
        b.field("Cancelled by", v["cancel_requested_by"])
    for key, label in (("submitted_at", "Submitted"), ("admitted_at", "Admitted")):
        b.field(label, _when(v[key]))
    b.field("Ended", _when(v["ended_at"]))
    b.field("Cluster", v["cluster"])
    b.field("Nodes", v["nodes"])
    demand = v["demand"]
    if demand is None:
        b.field("Demand", "(its submission could not be read)")
    elif demand.get("error"):
        b.field("Demand", f"invalid: {demand['error']}")
    else:
        n = demand["total_pods"]
        b.section(f"Demand per pod ({n} pod{'s' if n != 1 else ''}, {demand['kind']})")
        b.table(
            ["role", "pods", "cpu", "memory", "gpu", "ephemeral"],
            [
                [p["role"], p["count"], p["cpu"], p["memory"], p["gpu"], p["ephemeral_storage"]]
                for p in demand["pods"]
            ],
        )
    b.field("Estimate", duration(v["estimate_s"]) if v["estimate_s"] is not None else None)
    b.field("Reasons", v["reasons"] or "none")
    if v["waited"]:
        # When each reason was seen (the scheduler's poller tells a waiting action its
        # reason after a poll and on every change): the timeline of its wait.
        b.section("Waited for")
        b.table(
            ["reason", "seen at", "for"],
            [
                [
                    w["reason"],
                    _when(w["at"]),
                    "still waiting" if w["for_s"] is None else duration(w["for_s"]),
                ]
                for w in v["waited"]
            ],
        )
    if v["waiting"] is not None:
        _render_waiting(b, v["waiting"], v["queue"])
    b.field("Retries", v["retries"])
    if len(v["attempts"]) > 1:
        # Retries by failure class (the queue's retry policy): one lease, admission and
        # set of pods per attempt.
        b.section(f"Attempts ({len(v['attempts'])})")
        b.table(
            ["#", "as", "ended", "then"],
            [
                [a["number"], a["action_id"], a["outcome"] or "-", a["retry"] or "-"]
                for a in v["attempts"]
            ],
        )
    if v["last_failure"]:
        b.field("Last failure", v["last_failure"])
    if v["pods"]:
        b.section("Pods")
        b.table(
            ["pod", "node", "last event", "age"],
            [[p["pod"], p["node"], p["last_event"], age(p["at"])] for p in v["pods"]],
        )
    events = v["events"]
    b.section(f"Events ({len(events)})" if events else "Events")
    if events:
        shown = events[-max_events:] if max_events else events
        if len(shown) < len(events):
            b.lines(f"({len(events) - len(shown)} earlier left out; --events 0 shows all)")
        b.table(
            ["age", "kind", "pod", "node", "message"],
            [[age(e["at"]), e["kind"], e["pod"], e["node"], e["message"]] for e in shown],
        )
    else:
        b.lines("(none yet)")
    if len("Web UI: ") + len(v["ui"]) <= 80:
        b.field("Web UI", v["ui"])
    else:  # on a line of its own: a link cannot be wrapped
        b.section("Web UI")
        b.lines(v["ui"])
    return b.render()


def _when(ts: float | None) -> str:
    return "-" if not ts else f"{iso(ts)} ({age(ts)} ago)"


@describe.command("action")
@click.argument("action_id", metavar="ID", shell_complete=complete_actions)
@click.option(
    "--events",
    "max_events",
    type=click.IntRange(min=0),
    default=10,
    show_default=True,
    help="Latest events shown (0: all).",
)
@runtime_option
@output_option
@click.pass_context
def describe_action(
    ctx: click.Context, action_id: str, max_events: int, default_runtime: float, output: str
) -> None:
    """Show the action ID: state, queue, run, cluster and nodes, demand per pod, the
    reasons it waited for, its position and forecast start while it waits, retries, its
    pods and events, and its Web UI link."""
    cfg = settings(ctx)
    check_id(action_id, "ID")
    view = with_client(cfg, lambda c: _gather(c, cfg, action_id, default_runtime))
    if emit_structured(view, output):
        return
    click.echo(_render(view, max_events))


# --- cancel ---------------------------------------------------------------------------------


@click.command()
@click.argument("action_ids", metavar="[ACTION]...", nargs=-1, shell_complete=complete_in_flight)
@click.option("--run", default=None, help="Cancel every action of this run still in flight.")
@click.option(
    "--wait/--no-wait",
    default=True,
    show_default=True,
    help="Wait until each action has ended (its pods deleted, its reservation released).",
)
@click.option(
    "--timeout",
    type=click.FloatRange(min=0.0),
    default=120.0,
    show_default=True,
    help="Seconds to wait for each action to end.",
)
@click.pass_context
def cancel(
    ctx: click.Context, action_ids: Sequence[str], run: str | None, wait: bool, timeout: float
) -> None:
    """Cancel actions: each ACTION named, and with --run every action of a run that is
    still in flight.

    A waiting action leaves its queue; a running one has its pods deleted. Either way
    its reservation is released, its end is recorded once, and it ends `cancelled`.
    An action that has already ended is left as it is. Exit code 1 if an action was not
    found or did not end within --timeout.
    """
    cfg = settings(ctx)
    if not action_ids and run is None:
        raise click.UsageError("name at least one ACTION, or --run RUN")
    for a in action_ids:
        check_id(a, "ACTION")
    if run is not None:
        check_id(run, "--run")

    async def go(client: Client) -> bool:
        from headway.workflows import client as hw

        ids = list(dict.fromkeys(action_ids))
        if run is not None:
            rows = await hw.list_actions(client, cfg.tenant, run=run, in_flight=True, limit=None)
            if not rows:
                click.echo(f"No action of run {run!r} is in flight.")
            ids += [r.action_id for r in reversed(rows) if r.action_id not in ids]
        gate = asyncio.Semaphore(16)  # many ids at once, without flooding the server

        async def one(action_id: str) -> CancelOutcome | None:
            async with gate:
                try:
                    return await hw.cancel_action(
                        client, cfg.tenant, action_id, wait=wait, timeout_s=timeout
                    )
                except hw.ActionNotFoundError:
                    return None

        async def patience() -> None:
            # A running action ends once its cluster worker has deleted the pods, which
            # it learns of at its next heartbeat to Temporal: say so rather than hang.
            await asyncio.sleep(PATIENCE_S)
            click.echo(
                "waiting for the cancelled actions to end (a running one ends once its "
                "cluster worker has deleted its pods)...",
                err=True,
            )

        notice = asyncio.create_task(patience()) if wait else None
        try:
            outcomes = await asyncio.gather(*(one(a) for a in ids))
        finally:
            if notice is not None:
                notice.cancel()
        ok = True
        for action_id, outcome in zip(ids, outcomes, strict=True):
            line, good = _cancel_line(cfg, action_id, outcome, wait, timeout)
            click.echo(line, err=not good)
            ok = ok and good
        return ok

    if not with_client(cfg, go):
        raise SystemExit(1)


def _cancel_line(
    cfg: Settings, action_id: str, o: CancelOutcome | None, wait: bool, timeout: float
) -> tuple[str, bool]:
    """One line per action, and whether it counts as done."""
    if o is None:
        return f"Error: {_not_found(cfg, action_id).message}", False
    if not o.requested:
        return f"action {action_id!r} had already ended: {o.before}", True
    if not wait:
        return f"action {action_id!r}: cancellation requested (was {o.before})", True
    if o.result is None:
        return (
            f"Error: action {action_id!r} was asked to cancel but had not ended after "
            f"{duration(timeout)} (see `headway describe action {action_id}`)"
        ), False
    res = o.result
    if res.state == "cancelled":
        where = f" on {o.cluster}" if o.cluster and o.before == "running" else ""
        return f"action {action_id!r} cancelled (was {o.before}{where})", True
    return f"action {action_id!r} ended {res.state} before the cancellation took effect", True
