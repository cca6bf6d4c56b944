"""Store activities of the control plane: lease writes (with coalesced nudges) and sync.

All three run as *local* activities of their workflows: they are short database calls on
the control-plane worker, and a local activity costs the caller one marker event instead
of a task-queue round trip plus three events.

Submit path (``put_lease``): the action's workflow writes its lease to SQL and, only when
that flips its queue's flag from clear to set, signals the shard scheduler (starting it
if it does not run) with a ``nudge``. While the scheduler has not read the queue since,
further submitters stay silent, so a million-action backfill costs the scheduler one
signal per window refill, not one per action, and the lease payloads never enter its
history.

Admission in the first workflow task (``put_lease_wait``): the action's local activity
writes the lease, nudges, then waits briefly (``wait_s``) on an in-process
``AdmissionWaiters`` entry. When this worker's dispatch activity admits it meanwhile, it
records the admission in the store (durable: a retried first task reads it back) and
hands it to the waiter instead of signalling, so the action schedules its cluster
activity in the same workflow task: 2 workflow tasks per action instead of 3. Any other
case (timeout, dispatch on another worker, too many waiters) falls back to the signal.

The door: ``put_lease`` decides each submission (``headway.scheduler.door``) in the
transaction that would write its lease; a refused one writes nothing, nudges no one and
waits for nothing, and ``put_lease_wait`` answers with the rejection at once. The
scheduler keeps the door's settings in the store up to date (``set_door``). When the
shard has work waiting (``wants-ends``), ``put_lease_wait`` does not wait for the
admission either: it would rarely come within the wait, and the action's submitter is
waiting for the answer, which its workflow can only give once this activity returned.

Ends (``finish_lease``): the finisher that flips the ``done`` flag nudges at once only
while the scheduler has work waiting (``Nudge.NOW``). Otherwise (``Nudge.SOON``) this
worker nudges within ``LAZY_END_NUDGE_S``, and not at all if it sends the tenant another
nudge meanwhile (that nudge's sync collects the end): under a steady stream of
submissions, ends then cost no signal of their own. A lazy nudge lost with its worker
only leaves the end for the next sync to collect; no decision waits on it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from typing import Any

from headway import protocol
from headway.activities.fairness import ShardFairness
from headway.protocol import Admission
from headway.scheduler.door import QueueDoor
from headway.scheduler.model import ClusterSpec, QueueStatus, RateLimit, RetryPolicy
from headway.store import DONE_CHANNEL, LeaseStore, Nudge, Put, queue_channel
from headway.store.config import ConfigStore
from headway.store.history import PRUNE_EVERY_S, Finished, HistoryStore, row_values
from headway.workflows.shared import (
    CONFIG_ACTIVITY,
    CONFIG_HISTORY_ACTIVITY,
    FINISH_LEASE_ACTIVITY,
    FLEET_ACTIVITY,
    NUDGE_SIGNAL,
    PUT_LEASE_ACTIVITY,
    PUT_LEASE_WAIT_ACTIVITY,
    REQUEUE_LEASE_ACTIVITY,
    RETRY_POLICY_ACTIVITY,
    SET_DOOR_ACTIVITY,
    SYNC_ACTIVITY,
    DoorInput,
    FinishLeaseInput,
    PutLeaseInput,
    PutLeaseOutput,
    Rejection,
    RequeueLeaseInput,
    SchedulerInput,
    SyncInput,
    SyncOutput,
)
from temporalio import activity
from temporalio.client import Client
from temporalio.common import WorkflowIDConflictPolicy
from temporalio.exceptions import ApplicationError
from temporalio.service import RPCError, RPCStatusCode

__all__ = [
    "FINISH_LEASE",
    "PUT_LEASE",
    "PUT_LEASE_WAIT",
    "SET_DOOR",
    "SYNC_LEASES",
    "AdmissionWaiters",
    "StoreActivities",
]

PUT_LEASE = PUT_LEASE_ACTIVITY
FINISH_LEASE = FINISH_LEASE_ACTIVITY
SYNC_LEASES = SYNC_ACTIVITY
PUT_LEASE_WAIT = PUT_LEASE_WAIT_ACTIVITY
SET_DOOR = SET_DOOR_ACTIVITY

#: Longest delay of a lazy nudge (an end no waiting work needs).
LAZY_END_NUDGE_S = 1.0

log = logging.getLogger(__name__)


class _GroupCommit:
    """Queue ``put_lease`` / ``finish_lease`` calls; one thread call commits them all.

    Under load, one transaction (one lock hold, one commit, few GIL hand-offs) takes
    every call that queued while the previous one ran, instead of each call waiting for
    the store's lock in its own thread. A batch that can commit without waiting
    (``LeaseStore.apply_nowait``) commits on the event loop itself.
    """

    MAX_OPS = 256
    #: The largest batch committed on the event loop (~0.15 ms an op with SQLite).
    INLINE_MAX = 8

    def __init__(self, store: LeaseStore) -> None:
        self.store = store
        #: Batches that had to go to a thread (the store was busy, or not SQLite).
        self.threaded = 0
        self._queue: list[tuple[tuple[str, tuple[Any, ...]], asyncio.Future[Nudge | Put]]] = []
        self._task: asyncio.Task[None] | None = None

    async def submit(self, kind: str, args: tuple[Any, ...]) -> Nudge | Put:
        fut: asyncio.Future[Nudge | Put] = asyncio.get_running_loop().create_future()
        self._queue.append(((kind, args), fut))
        if self._task is None:
            self._task = asyncio.create_task(self._drain())
        return await fut

    async def _drain(self) -> None:
        try:
            while self._queue:
                batch = self._queue[: self.MAX_OPS]
                del self._queue[: self.MAX_OPS]
                ops = [op for op, _ in batch]
                try:
                    # A small batch commits inline when nothing can make it wait (SQLite,
                    # uncontended): cheaper than the trip to a thread and back. A big one
                    # (a burst of submissions) goes to a thread, which shares the GIL
                    # with the loop instead of holding the loop for its whole length.
                    res = self.store.apply_nowait(ops) if len(ops) <= self.INLINE_MAX else None
                    if res is None:
                        self.threaded += 1
                        res = await asyncio.to_thread(self.store.apply, ops)
                except Exception as err:  # every caller's attempt fails (and is retried)
                    for _, f in batch:
                        if not f.done():
                            f.set_exception(err)
                    continue
                for (_, f), r in zip(batch, res, strict=True):
                    if not f.done():
                        f.set_result(r)
        finally:
            self._task = None


class AdmissionWaiters:
    """Actions waiting in ``put_lease_wait`` on this worker, by (tenant, action_id).

    Shared by the store and dispatch activities of one worker; all access happens on
    the worker's event loop, so ``take`` and a waiter's own removal never race.
    """

    def __init__(self, limit: int = 256) -> None:
        self.limit = limit
        self._waiting: dict[tuple[str, str], asyncio.Future[Admission]] = {}

    def add(self, tenant: str, action_id: str) -> asyncio.Future[Admission] | None:
        """Register a waiter; None if too many wait already (fall back to the signal)."""
        key = (tenant, action_id)
        if len(self._waiting) >= self.limit or key in self._waiting:
            return None
        fut: asyncio.Future[Admission] = asyncio.get_running_loop().create_future()
        self._waiting[key] = fut
        return fut

    def remove(self, tenant: str, action_id: str) -> None:
        self._waiting.pop((tenant, action_id), None)

    def waiting(self, tenant: str, action_id: str) -> bool:
        return (tenant, action_id) in self._waiting

    def take(self, tenant: str, admission: Admission) -> bool:
        """Hand ``admission`` to its waiter; False if none waits (signal it instead)."""
        fut = self._waiting.pop((tenant, admission.action_id), None)
        if fut is None or fut.done():
            return False
        fut.set_result(admission)
        return True


class StoreActivities:
    """Activities over one ``LeaseStore``; they nudge schedulers through ``client``."""

    def __init__(
        self,
        store: LeaseStore,
        client: Client,
        fleet: Sequence[ClusterSpec] = (),
        waiters: AdmissionWaiters | None = None,
        admit_wait_s: float | None = None,
        fairness: ShardFairness | None = None,
        history_retention_s: float | None = None,
    ) -> None:
        """Activities over ``store``.

        Args:
            store: the lease store.
            client: connected client (nudges).
            fleet: clusters a scheduler started by a nudge is given.
            waiters: shared with this worker's dispatch activity.
            admit_wait_s: how long ``put_lease_wait`` waits for its admission here;
                None: as long as the action asks (``ADMIT_WAIT_S``), 0: not at all.
            fairness: told of every lease write and end (a shard's interactive work);
                shared with the dispatch activity, which paces other shards meanwhile.
            history_retention_s: how long the record of a finished action is kept
                (``headway.store.history``); None: for ever.
        """
        self.store = store
        self.config = ConfigStore(store)
        self.client = client
        self.fleet = list(fleet)
        self.waiters = waiters if waiters is not None else AdmissionWaiters()
        if admit_wait_s is not None and not admit_wait_s >= 0:
            raise ValueError(f"admit_wait_s: {admit_wait_s!r} is not a number of seconds >= 0")
        self.admit_wait_s = admit_wait_s
        self.fairness = fairness
        self.history = HistoryStore(store)
        self.history_retention_s = history_retention_s
        self._pruned_at: float | None = None
        self._pruning: asyncio.Task[int] | None = None
        self._commit = _GroupCommit(store)
        # Per tenant: nudges started so far; the lazy nudge pending (if any), and the
        # count at the latest end it stands for.
        self._sent: dict[str, int] = {}
        self._lazy: dict[str, asyncio.Task[None]] = {}
        self._lazy_at: dict[str, int] = {}

    async def nudge(self, tenant: str, channel: str) -> None:
        """Signal the tenant's scheduler that the store has news on ``channel``.

        A plain signal first: the scheduler almost always runs, and signal-with-start
        costs the server a start attempt on top of the signal. Only a scheduler that
        does not run (first use of a tenant, or it ended) is signal-with-started.
        """
        self._sent[tenant] = self._sent.get(tenant, 0) + 1
        try:
            await self.client.get_workflow_handle(protocol.scheduler_workflow_id(tenant)).signal(
                NUDGE_SIGNAL, channel
            )
            return
        except RPCError as err:
            if err.status != RPCStatusCode.NOT_FOUND:
                raise
        await self.client.start_workflow(
            protocol.SCHEDULER_WORKFLOW,
            SchedulerInput(tenant=tenant, fleet=[c.to_dict() for c in self.fleet]),
            id=protocol.scheduler_workflow_id(tenant),
            task_queue=protocol.CONTROL_TASK_QUEUE,
            start_signal=NUDGE_SIGNAL,
            start_signal_args=[channel],
            id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
            priority=protocol.scheduler_priority(tenant),
        )

    async def _put(self, inp: PutLeaseInput) -> Put:
        """Decide at the door and write the lease; nudge the scheduler if that flipped
        the queue's flag."""
        if self.fairness is not None:
            self.fairness.touch(inp.tenant)
        put = await self._commit.submit(
            "put",
            (inp.tenant, inp.action_id, inp.queue, inp.workflow_id, inp.spec, inp.submitted_at),
        )
        assert isinstance(put, Put)
        if put.nudge:
            await self.nudge(inp.tenant, queue_channel(inp.queue))
        return put

    @activity.defn(name=PUT_LEASE)
    async def put_lease(self, inp: PutLeaseInput) -> bool:
        """Record a pending lease; nudge the scheduler if this flipped the queue's flag.

        Returns:
            Whether a nudge was sent.

        Raises:
            ApplicationError: the door refused the submission (type: the reason); only
                workflows recorded before ``put_lease_wait`` call this, and a door
                refuses nothing to a tenant whose scheduler never pushed its settings.
        """
        put = await self._put(inp)
        if put.refused is not None:
            raise ApplicationError(
                put.refused.detail, type=str(put.refused.reason), non_retryable=True
            )
        return put.nudge

    @activity.defn(name=PUT_LEASE_WAIT)
    async def put_lease_wait(self, inp: PutLeaseInput) -> PutLeaseOutput:
        """``put_lease``, then wait up to ``inp.wait_s`` for the admission in-process.

        Returns:
            Whether a nudge was sent, and the admission if it was handed over (or had
            been, by an earlier attempt of this call); or the door's rejection.
        """
        wait_s = inp.wait_s if self.admit_wait_s is None or inp.wait_s <= 0 else self.admit_wait_s
        fut = self.waiters.add(inp.tenant, inp.action_id) if wait_s > 0 else None
        try:
            put = await self._put(inp)
            if put.refused is not None:
                d = put.refused
                reason = str(d.reason)
                return PutLeaseOutput(
                    rejection=Rejection(
                        inp.action_id, reason, d.detail, inp.submitted_at, d.retry_after
                    )
                )
            nudged = put.nudge
            if put.busy and fut is not None and not fut.done():
                # Work waits in the shard: an admission within the wait is unlikely, and
                # the submitter waits for this answer. (One dispatched from now on finds
                # no waiter and goes by signal.)
                self.waiters.remove(inp.tenant, inp.action_id)
                fut = None
            if not nudged and fut is None:
                return PutLeaseOutput(nudged=False)
            if fut is not None:
                await asyncio.wait({fut}, timeout=wait_s)
                self.waiters.remove(inp.tenant, inp.action_id)
                if fut.done() and not fut.cancelled():
                    return PutLeaseOutput(nudged=nudged, admission=fut.result())
            # A retried attempt: the admission may have been handed to its predecessor.
            stored = await asyncio.to_thread(self.store.admission, inp.tenant, inp.action_id)
            adm = Admission(**stored) if stored is not None else None
            return PutLeaseOutput(nudged=nudged, admission=adm)
        finally:
            self.waiters.remove(inp.tenant, inp.action_id)

    @activity.defn(name=SET_DOOR)
    async def set_door(self, inp: DoorInput) -> None:
        """Replace the tenant's door settings (``LeaseStore.set_door``)."""
        rate = RateLimit(**inp.rate) if inp.rate else None
        queues = {
            name: QueueDoor(
                QueueStatus(q["status"]),
                q.get("depth"),
                RateLimit(**q["rate"]) if q.get("rate") else None,
            )
            for name, q in inp.queues.items()
        }
        await asyncio.to_thread(self.store.set_door, inp.tenant, rate, queues)
        if inp.config is not None:
            await asyncio.to_thread(
                self.config.save,
                inp.tenant,
                inp.config.get("queues") or {},
                inp.config.get("org"),
                inp.audit,
                clusters=inp.config.get("clusters"),
                environments=inp.config.get("environments"),
            )

    @activity.defn(name=CONFIG_ACTIVITY)
    async def load_config(self, tenant: str) -> dict[str, Any]:
        """The tenant's stored configuration, for its scheduler starting afresh."""
        return await asyncio.to_thread(self.config.load, tenant)

    @activity.defn(name=CONFIG_HISTORY_ACTIVITY)
    async def config_history(self, req: dict[str, Any]) -> list[dict[str, Any]]:
        """The audit trail of a queue (``kind`` "queue") or of the org limits ("org")."""
        return await asyncio.to_thread(
            self.config.history,
            str(req["tenant"]),
            str(req["kind"]),
            str(req.get("name") or ""),
            int(req.get("limit") or 50),
        )

    @activity.defn(name=FINISH_LEASE)
    async def finish_lease(self, inp: FinishLeaseInput) -> bool:
        """Record an action's end/cancellation/rejection; nudge the scheduler if needed.

        Returns:
            Whether a nudge was sent.
        """
        if inp.kind not in ("finished", "cancelled", "rejected"):  # fail alone, not the batch
            raise ValueError(f"kind: {inp.kind!r} is not one of finished, cancelled, rejected")
        if self.fairness is not None:
            self.fairness.touch(inp.tenant)
        finish = self._commit.submit("finish", (inp.tenant, inp.action_id, inp.kind))
        if inp.record is None:
            must = await finish
        else:
            # The record of what ran goes in the same group commit as the end (one more
            # insert in a transaction that commits anyway). A failure fails both, and the
            # retried activity writes both again: the finish is idempotent, the record
            # keyed by tenant and action (the first written stands).
            row = row_values(inp.tenant, Finished.from_dict(inp.record))
            must, _ = await asyncio.gather(finish, self._commit.submit("record", (row,)))
            self._prune_now_and_then()
        if must is Nudge.NOW:
            await self.nudge(inp.tenant, DONE_CHANNEL)
        elif must is Nudge.SOON:
            self._nudge_soon(inp.tenant)
        return must is not Nudge.NONE

    def _prune_now_and_then(self) -> None:
        """Delete expired records, at most every ``PRUNE_EVERY_S``, off the event loop."""
        keep = self.history_retention_s
        now = time.monotonic()
        if keep is None or (self._pruned_at is not None and now - self._pruned_at < PRUNE_EVERY_S):
            return
        self._pruned_at = now
        task = asyncio.create_task(asyncio.to_thread(self.history.prune, time.time() - keep))
        self._pruning = task  # kept referenced until it is done
        task.add_done_callback(_log_prune_failure)

    @activity.defn(name=REQUEUE_LEASE_ACTIVITY)
    async def requeue_lease(self, inp: RequeueLeaseInput) -> bool:
        """End attempt ``inp.ended``'s lease and put the next attempt's, in one
        transaction past the door (``LeaseStore.requeue``); nudge the scheduler if needed.

        Returns:
            Whether a nudge was sent.
        """
        lease = inp.lease
        if self.fairness is not None:
            self.fairness.touch(lease.tenant)
        put = await asyncio.to_thread(
            self.store.requeue,
            lease.tenant,
            inp.ended,
            lease.action_id,
            lease.queue,
            lease.workflow_id,
            lease.spec,
            lease.submitted_at,
        )
        if put.nudge:
            await self.nudge(lease.tenant, queue_channel(lease.queue))
        return put.nudge

    @activity.defn(name=RETRY_POLICY_ACTIVITY)
    async def retry_policy(self, req: dict[str, str]) -> dict[str, Any]:
        """The retry policy of queue ``req["queue"]`` of ``req["tenant"]``, as its
        scheduler last stored it (the default policy for a queue not stored)."""
        config = await asyncio.to_thread(self.config.load, req["tenant"])
        for q in config["queues"]:
            if q.get("name") == req["queue"]:
                return RetryPolicy.parse(q.get("retry")).to_dict()
        return RetryPolicy().to_dict()

    def _nudge_soon(self, tenant: str) -> None:
        """A ``done`` nudge within ``LAZY_END_NUDGE_S``, unless another goes out first."""
        # One pending per tenant stands for every end since: the latest sets the mark.
        self._lazy_at[tenant] = self._sent.get(tenant, 0)
        if tenant not in self._lazy:
            self._lazy[tenant] = asyncio.create_task(self._lazy_nudge(tenant))

    async def _lazy_nudge(self, tenant: str) -> None:
        try:
            await asyncio.sleep(LAZY_END_NUDGE_S)
            # A nudge started after the latest end was recorded leads to a sync that
            # collects every one of them.
            if self._sent.get(tenant, 0) == self._lazy_at.get(tenant):
                await self.nudge(tenant, DONE_CHANNEL)
        except asyncio.CancelledError:
            raise
        except Exception:  # the next sync collects the end anyway
            log.warning("lazy nudge of %s failed", tenant, exc_info=True)
        finally:
            self._lazy.pop(tenant, None)
            self._lazy_at.pop(tenant, None)

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
                wants_ends=inp.wants_ends,
                keep=inp.keep_claims,
            )
        )
        return SyncOutput(leases=r.leases, done=r.done, more=r.more, more_done=r.more_done)


def _log_prune_failure(task: asyncio.Task[int]) -> None:
    # The next prune deletes what this one did not; the records themselves are written.
    if not task.cancelled() and task.exception() is not None:
        log.warning("pruning the record of finished actions failed", exc_info=task.exception())
