"""The dispatch activity: deliver a batch of scheduler decisions to action workflows.

The scheduler workflow could signal each admitted action itself, but every outbound
signal is a command plus two history events in the scheduler and counts against the
2,000 pending outbound operations; measured, that ran at ~0.4x bare Temporal. Instead
one activity call per batch signals many action workflows from the worker, concurrently,
and the scheduler pays three events per batch.

Admissions of actions still waiting in their first workflow task on this worker
(``AdmissionWaiters``) are recorded in the store and handed over in-process instead of
signalled: the action then needs no workflow task of its own for the admission. A batch
marked ``hand_over_only`` does only that (a local activity the scheduler's loop awaits:
milliseconds) and returns the rest unsent, for a regular dispatch to signal while the
loop goes on.
"""

from __future__ import annotations

import asyncio
from dataclasses import asdict

from headway import protocol
from headway.activities.fairness import ShardFairness
from headway.activities.store import AdmissionWaiters
from headway.store import LeaseStore
from headway.workflows.shared import DISPATCH_ACTIVITY, REJECT_SIGNAL, DispatchBatch, DispatchResult
from temporalio import activity
from temporalio.client import Client, WorkflowExecutionStatus
from temporalio.service import RPCError, RPCStatusCode

__all__ = ["DISPATCH", "DispatchActivities"]

DISPATCH = DISPATCH_ACTIVITY

#: Share of a dispatch attempt's start-to-close timeout that contention pacing may use.
PACE_SHARE = 0.5
#: A regular dispatch heartbeats this often once it has run this long (a batch of a few
#: signals ends before its first beat and costs the server nothing more), so a worker
#: killed mid-batch is noticed within the scheduler's heartbeat timeout rather than the
#: attempt's whole start-to-close timeout.
DISPATCH_HEARTBEAT_EVERY_S = 2.0


class DispatchActivities:
    """Signals admissions and rejections through ``client``."""

    def __init__(
        self,
        client: Client,
        concurrency: int = 8,
        *,
        store: LeaseStore | None = None,
        waiters: AdmissionWaiters | None = None,
        fairness: ShardFairness | None = None,
    ) -> None:
        self.client = client
        # One budget for the whole worker, shared by every tenant's batches (FIFO): a
        # shard admitting a bulk backlog gets no more of the server than this many
        # signals in flight, so other shards' actions keep their latency. Measured
        # (bench/scheduler_history.py isolation): 64 per batch slowed a 5-action run in
        # another shard 1.6-2.4x while a 10k backlog drained; 8 shared, ~1.0-1.4x, and
        # the drain took as long (its pace is set by the refill windows, not signals).
        self._sem = asyncio.Semaphore(concurrency)
        self.store = store
        self.waiters = waiters
        # Paces a shard's signals while another shard has interactive work here (see
        # ``headway.activities.fairness``); shared with the store activities.
        self.fairness = fairness

    @activity.defn(name=DISPATCH)
    async def dispatch(self, batch: DispatchBatch) -> DispatchResult:
        """Signal every admission and rejection of ``batch``.

        Idempotent: action workflows ignore a repeated admission, so a retried batch is
        harmless. An action whose workflow no longer runs is reported ``gone`` so the
        scheduler releases what it reserved for it. Heartbeats while it runs when its
        caller set a heartbeat timeout (a regular activity; see ``_beating``).
        """
        info = activity.info()
        if info.is_local or not info.heartbeat_timeout:
            return await self._dispatch(batch)
        beat = asyncio.create_task(_beating(DISPATCH_HEARTBEAT_EVERY_S))
        try:
            return await self._dispatch(batch)
        finally:
            beat.cancel()

    async def _dispatch(self, batch: DispatchBatch) -> DispatchResult:
        if batch.hand_over_only and (batch.rejections or batch.probe):
            raise ValueError(
                f"hand_over_only: a batch with {len(batch.rejections)} rejection(s) and "
                f"{len(batch.probe)} probe(s); it carries admissions only"
            )
        sem = self._sem
        gone: list[str] = []
        admissions = batch.admissions
        waiters, store = self.waiters, self.store
        if waiters is not None and store is not None:
            local = [a for a in admissions if waiters.waiting(batch.tenant, a.admission.action_id)]
            if local:
                # Durable first (a retried first task reads it back), then hand over.
                await asyncio.to_thread(
                    store.record_admissions,
                    batch.tenant,
                    {a.admission.action_id: asdict(a.admission) for a in local},
                )
                handed = {
                    a.admission.action_id for a in local if waiters.take(batch.tenant, a.admission)
                }
                admissions = [a for a in admissions if a.admission.action_id not in handed]
        if batch.hand_over_only:
            return DispatchResult(unsent=[a.admission.action_id for a in admissions])

        fair = self.fairness
        pace_until: float | None = None
        if fair is not None:
            # Pacing takes at most half the attempt's time: the rest of the batch then
            # goes at full speed rather than time out and start over.
            timeout = activity.info().start_to_close_timeout
            if timeout is not None:
                pace_until = fair.now() + timeout.total_seconds() * PACE_SHARE

        async def send(workflow_id: str, action_id: str, name: str, arg: object) -> None:
            if fair is not None:  # outside the budget: a paced shard holds no slot
                await fair.pace(batch.tenant, pace_until)
            async with sem:
                try:
                    await self.client.get_workflow_handle(workflow_id).signal(name, arg)
                except RPCError as err:
                    if err.status != RPCStatusCode.NOT_FOUND:
                        raise
                    gone.append(action_id)

        async def probe(workflow_id: str, action_id: str) -> None:
            async with sem:
                try:
                    desc = await self.client.get_workflow_handle(workflow_id).describe()
                except RPCError as err:
                    if err.status != RPCStatusCode.NOT_FOUND:
                        raise
                    gone.append(action_id)
                    return
                if desc.status != WorkflowExecutionStatus.RUNNING:
                    gone.append(action_id)

        await asyncio.gather(
            *(probe(wf, a) for a, wf in batch.probe),
            *(
                send(a.workflow_id, a.admission.action_id, protocol.ADMIT_SIGNAL, a.admission)
                for a in admissions
            ),
            *(
                send(r.workflow_id, r.rejection.action_id, REJECT_SIGNAL, r.rejection)
                for r in batch.rejections
            ),
        )
        return DispatchResult(gone=sorted(gone))


async def _beating(every_s: float) -> None:
    """Heartbeat the current activity every ``every_s``, from ``every_s`` on, until
    cancelled: the attempt's worker is alive (the SDK sends at most one per 80 % of the
    heartbeat timeout)."""
    while True:
        await asyncio.sleep(every_s)
        activity.heartbeat()
