"""Store activities of the control plane: lease writes (with coalesced nudges) and sync.

All three run as *local* activities of their workflows: they are short database calls on
the control-plane worker, and a local activity costs the caller one marker event instead
of a task-queue round trip plus three events.

Submit path (``put_lease``): the action's workflow writes its lease to SQL and, only when
that flips its queue's flag from clear to set, signal-with-starts the shard scheduler
with a ``nudge``. While the scheduler has not read the queue since, further submitters
stay silent, so a million-action backfill costs the scheduler one signal per window
refill, not one per action, and the lease payloads never enter its history.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from headway import protocol
from headway.scheduler.model import ClusterSpec
from headway.store import DONE_CHANNEL, LeaseStore, queue_channel
from headway.workflows.shared import (
    FINISH_LEASE_ACTIVITY,
    FLEET_ACTIVITY,
    NUDGE_SIGNAL,
    PUT_LEASE_ACTIVITY,
    SYNC_ACTIVITY,
    FinishLeaseInput,
    PutLeaseInput,
    SchedulerInput,
    SyncInput,
    SyncOutput,
)
from temporalio import activity
from temporalio.client import Client
from temporalio.common import WorkflowIDConflictPolicy

__all__ = ["FINISH_LEASE", "PUT_LEASE", "SYNC_LEASES", "StoreActivities"]

PUT_LEASE = PUT_LEASE_ACTIVITY
FINISH_LEASE = FINISH_LEASE_ACTIVITY
SYNC_LEASES = SYNC_ACTIVITY


class StoreActivities:
    """Activities over one ``LeaseStore``; they nudge schedulers through ``client``."""

    def __init__(
        self, store: LeaseStore, client: Client, fleet: Sequence[ClusterSpec] = ()
    ) -> None:
        self.store = store
        self.client = client
        self.fleet = list(fleet)

    async def nudge(self, tenant: str, channel: str) -> None:
        """Signal-with-start the tenant's scheduler: the store has news on ``channel``."""
        await self.client.start_workflow(
            protocol.SCHEDULER_WORKFLOW,
            SchedulerInput(tenant=tenant, fleet=[c.to_dict() for c in self.fleet]),
            id=protocol.scheduler_workflow_id(tenant),
            task_queue=protocol.CONTROL_TASK_QUEUE,
            start_signal=NUDGE_SIGNAL,
            start_signal_args=[channel],
            id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
        )

    @activity.defn(name=PUT_LEASE)
    async def put_lease(self, inp: PutLeaseInput) -> bool:
        """Record a pending lease; nudge the scheduler if this flipped the queue's flag.

        Returns:
            Whether a nudge was sent.
        """
        must = await asyncio.to_thread(
            self.store.put_lease,
            inp.tenant,
            inp.action_id,
            inp.queue,
            inp.workflow_id,
            inp.spec,
            inp.submitted_at,
        )
        if must:
            await self.nudge(inp.tenant, queue_channel(inp.queue))
        return must

    @activity.defn(name=FINISH_LEASE)
    async def finish_lease(self, inp: FinishLeaseInput) -> bool:
        """Record an action's end/cancellation/rejection; nudge the scheduler if needed.

        Returns:
            Whether a nudge was sent.
        """
        must = await asyncio.to_thread(self.store.finish_lease, inp.tenant, inp.action_id, inp.kind)
        if must:
            await self.nudge(inp.tenant, DONE_CHANNEL)
        return must

    @activity.defn(name=FLEET_ACTIVITY)
    async def fleet_specs(self) -> list[dict[str, Any]]:
        """The fleet this worker was started with (``ClusterSpec.to_dict()`` each).

        A scheduler started without a fleet (e.g. by a config call) asks for it here.
        """
        return [c.to_dict() for c in self.fleet]

    @activity.defn(name=SYNC_LEASES)
    async def sync(self, inp: SyncInput) -> SyncOutput:
        """The scheduler's refill: claim new leases (up to its room) and ends."""
        r = await asyncio.to_thread(
            lambda: self.store.sync(
                inp.tenant,
                inp.token,
                inp.room,
                default_room=inp.default_room,
                max_leases=inp.max_leases,
                max_done=inp.max_done,
                forget=inp.forget,
            )
        )
        return SyncOutput(leases=r.leases, done=r.done, more=r.more, more_done=r.more_done)
