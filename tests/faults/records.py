"""Reading the run's independent records: Temporal's action histories, the pod log, the
scheduler's and the store's view at the end."""

from __future__ import annotations

import asyncio
import json
import sqlite3
from collections import defaultdict
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

from headway import protocol
from headway.workflows import client as hw
from headway.workflows.shared import FINISH_LEASE_ACTIVITY, REQUEUE_LEASE_ACTIVITY
from temporalio.api.enums.v1 import EventType
from temporalio.api.history.v1 import HistoryEvent
from temporalio.client import Client

from .audit import Dispatch, History, PodLine, parse_pod_log

__all__ = [
    "read_histories",
    "read_pod_logs",
    "replay_failures",
    "retrying",
    "scheduler_view",
    "store_leases",
    "store_rows",
]

T = TypeVar("T")


async def retrying(call: Callable[[], Awaitable[T]], *, timeout_s: float = 60.0) -> T:
    """``call()`` until it answers: the server may be restarting under a fault, and a
    query may find the scheduler's worker gone for a moment."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while True:
        try:
            return await call()
        except Exception:
            if loop.time() >= deadline:
                raise
            await asyncio.sleep(0.5)


def _ts(e: HistoryEvent) -> float:
    return e.event_time.seconds + e.event_time.nanos / 1e9


def _payload(payloads: Any) -> Any:
    if not payloads:
        return None
    try:
        return json.loads(payloads[0].data)
    except ValueError:
        return None


_CLOSED = {
    EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED: ("completed", "activity_task_completed"),
    EventType.EVENT_TYPE_ACTIVITY_TASK_FAILED: ("failed", "activity_task_failed"),
    EventType.EVENT_TYPE_ACTIVITY_TASK_TIMED_OUT: ("timed_out", "activity_task_timed_out"),
    EventType.EVENT_TYPE_ACTIVITY_TASK_CANCELED: ("canceled", "activity_task_canceled"),
}


def parse_history(action_id: str, executions: int, events: Sequence[HistoryEvent]) -> History:
    """One action's record from its (latest) workflow history."""
    prefix = protocol.cluster_task_queue("")
    scheduled: dict[int, tuple[str, float]] = {}
    attempts: dict[int, int] = {}
    closed: dict[int, tuple[float, str]] = {}
    # Releases per attempt: a hand-back or a retry requeues the action as its next
    # attempt (a requeue marker), each attempt's lease released at most once, the last
    # exactly once.
    releases = [0]
    status, state, reason, closed_at = "RUNNING", None, None, None
    for e in events:
        et = e.event_type
        if et == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
            a = e.activity_task_scheduled_event_attributes
            if a.activity_type.name == protocol.RUN_ACTION_ACTIVITY:
                scheduled[e.event_id] = (a.task_queue.name.removeprefix(prefix), _ts(e))
        elif et == EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED:
            s = e.activity_task_started_event_attributes
            attempts[s.scheduled_event_id] = s.attempt
        elif et in _CLOSED:
            outcome, field = _CLOSED[et]
            closed[getattr(e, f"{field}_event_attributes").scheduled_event_id] = (_ts(e), outcome)
        elif et == EventType.EVENT_TYPE_MARKER_RECORDED:
            m = e.marker_recorded_event_attributes
            data = _payload(m.details["data"].payloads) if "data" in m.details else None
            kind = data.get("activity_type") if isinstance(data, dict) else None
            if kind == FINISH_LEASE_ACTIVITY:
                releases[-1] += 1
            elif kind == REQUEUE_LEASE_ACTIVITY:
                releases.append(0)
        elif et == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_COMPLETED:
            res = _payload(e.workflow_execution_completed_event_attributes.result.payloads)
            status, closed_at = "COMPLETED", _ts(e)
            if isinstance(res, dict):
                state, reason = res.get("state"), res.get("reason")
        elif et == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_FAILED:
            f = e.workflow_execution_failed_event_attributes.failure
            details = _payload(f.application_failure_info.details.payloads)
            status, closed_at = "FAILED", _ts(e)
            if isinstance(details, dict):
                state, reason = details.get("state"), details.get("reason")
            else:
                state, reason = "failed", f.message
        elif et == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_CANCELED:
            status, state, reason, closed_at = "CANCELED", "cancelled", "Cancelled", _ts(e)
        elif et == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_TERMINATED:
            status, closed_at = "TERMINATED", _ts(e)
            reason = e.workflow_execution_terminated_event_attributes.reason
        elif et == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_TIMED_OUT:
            status, closed_at = "TIMED_OUT", _ts(e)
    dispatches = []
    for sid, (cluster, t) in sorted(scheduled.items()):
        end = closed.get(sid)
        dispatches.append(
            Dispatch(
                cluster=cluster,
                scheduled=t,
                closed=end[0] if end else None,
                attempts=attempts.get(sid, 0),
                outcome=end[1] if end else "open",
            )
        )
    return History(
        action_id=action_id,
        executions=executions,
        status=status,
        state=state,
        reason=reason,
        closed_at=closed_at,
        releases=sum(releases),
        attempt_releases=releases,
        dispatches=dispatches,
    )


async def read_histories(
    client: Client, tenant: str, action_ids: Sequence[str], *, concurrency: int = 8
) -> dict[str, History]:
    """Temporal's record of every action id it knows among ``action_ids``."""
    runs: dict[str, int] = defaultdict(int)

    async def listing() -> None:
        runs.clear()
        async for wf in client.list_workflows(f"WorkflowType='{protocol.ACTION_WORKFLOW}'"):
            runs[wf.id] += 1

    await retrying(listing)
    wanted = {protocol.action_workflow_id(tenant, a): a for a in action_ids}
    out: dict[str, History] = {}
    gate = asyncio.Semaphore(concurrency)

    async def one(wid: str, action_id: str) -> None:
        async with gate:
            hist = await retrying(lambda: client.get_workflow_handle(wid).fetch_history())
        out[action_id] = parse_history(action_id, runs[wid], hist.events)

    await asyncio.gather(*(one(w, a) for w, a in wanted.items() if runs.get(w)))
    return out


def read_pod_logs(paths: Sequence[Path]) -> tuple[list[PodLine], list[str]]:
    """Every record of the pod log files (and the lines that are not records)."""
    lines: list[str] = []
    for path in paths:
        if path.exists():
            lines += path.read_text(errors="replace").splitlines()
    return parse_pod_log(lines)


async def scheduler_view(client: Client, tenant: str) -> dict[str, Any]:
    """The scheduler's queues (in flight, waiting, usage) and loop counters."""
    queues = await retrying(lambda: hw.get_queues(client, tenant), timeout_s=15)
    h = client.get_workflow_handle(protocol.scheduler_workflow_id(tenant))
    stats = await retrying(lambda: h.query("stats"), timeout_s=15)
    return {"queues": queues, "stats": stats}


def store_leases(db: Path, tenant: str) -> dict[str, int]:
    """Rows the store still holds for ``tenant``: leases not yet released, admissions."""
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as conn:
        leases = conn.execute(
            "SELECT count(*) FROM headway_leases WHERE tenant = ?", (tenant,)
        ).fetchone()[0]
        undone = conn.execute(
            "SELECT count(*) FROM headway_leases WHERE tenant = ? AND done IS NULL", (tenant,)
        ).fetchone()[0]
        admissions = conn.execute(
            "SELECT count(*) FROM headway_admissions WHERE tenant = ?", (tenant,)
        ).fetchone()[0]
    return {"leases": int(leases), "not_done": int(undone), "admissions": int(admissions)}


def store_rows(db: Path, tenant: str) -> list[tuple[str, str | None]]:
    """The leases the store still holds for ``tenant``: (action id, how it ended)."""
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as conn:
        rows = conn.execute(
            "SELECT action_id, done FROM headway_leases WHERE tenant = ? ORDER BY id", (tenant,)
        ).fetchall()
    return [(str(a), d) for a, d in rows]


async def replay_failures(
    client: Client, action_ids: Sequence[str], tenant: str, *, actions: int = 20
) -> list[tuple[str, str]]:
    """Replay the recorded histories with the code: every scheduler run and the first
    ``actions`` action workflows. Returns (workflow id/run id, failure) for each history
    whose replay does not take its recorded path.

    A history that does not replay wedges its workflow the moment a worker has to rebuild
    it (a restart, a cache eviction): every task fails for good. The check does not need
    a fault to have hit it, so it finds the defect in runs where luck spared the shard.
    """
    from headway.workflows.action import ActionWorkflow
    from headway.workflows.scheduler import SchedulerWorkflow
    from temporalio.worker import Replayer

    replayer = Replayer(
        workflows=[ActionWorkflow, SchedulerWorkflow], data_converter=protocol.data_converter()
    )
    targets: list[tuple[str, str | None]] = []

    async def listing() -> None:
        targets.clear()
        query = f"WorkflowType='{protocol.SCHEDULER_WORKFLOW}'"
        async for wf in client.list_workflows(query):
            targets.append((wf.id, wf.run_id))

    await retrying(listing)
    targets += [(protocol.action_workflow_id(tenant, a), None) for a in action_ids[:actions]]
    out = []
    for wid, run_id in targets:
        handle = client.get_workflow_handle(wid, run_id=run_id)
        history = await retrying(handle.fetch_history)
        result = await replayer.replay_workflow(history, raise_on_replay_failure=False)
        if result.replay_failure is not None:
            out.append((f"{wid}/{run_id or 'latest'}", str(result.replay_failure)[:500]))
    return out
