"""Cluster-local activities: run one admitted action's pods and report what happens.

These run on a cluster worker (``protocol.cluster_task_queue(cluster)``), next to the
cluster, so the control plane never needs credentials into it. ``run_action`` creates the
gang, relays informer events to the action's workflow by signal as they happen,
heartbeats while the pods live, and returns the terminal event.

Exactly once on the cluster. One ``run_action`` activity (all of its attempts) is one
*dispatch*, named by ``workflow id / run id / activity id`` (:func:`dispatch_key`). Only
its first attempt creates pods. A retried attempt (a timed-out or restarted worker, or a
worker adopting another's work) learns what earlier attempts created from two records:

- the heartbeat details its predecessor left with Temporal: the very first heartbeat,
  sent the moment the pods were created, says ``{"created": [names], ...}``, and later
  ones add each pod's node and latest kind;
- the cluster's own record (:meth:`ClusterBackend.dispatch_record`): the simulated
  cluster's state file, or the pods on the API server, which carry their dispatch.

When either shows that pods were created, the attempt creates nothing: it adopts the
pods that exist and reports every pod that is gone as a terminal event: the outcome an
earlier attempt recorded when the pod had ended before it vanished, ``NodeLost`` when
its node is gone too, else :data:`POD_LOST`. The action workflow then applies the
queue's retry policy; the work is never silently run a second time. A retried attempt
with no record at all of a creation (its predecessor died before creating anything)
creates the pods. On Kubernetes one window remains: pods created, the worker killed
before its first heartbeat reached Temporal, and every pod deleted before the retry.

Cleanup retries: deleting an ended action's pods is retried with capped exponential
backoff inside the activity, each failure logged; ``delete_action`` raises after its
last try so Temporal retries it; and the cluster worker deletes pods of ended actions at
start and periodically (``headway.worker.cluster.collect_garbage``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from headway import telemetry
from headway.protocol import (
    ACTION_EVENT_SIGNAL,
    DELETE_ACTION_ACTIVITY,
    RUN_ACTION_ACTIVITY,
    TERMINAL_EVENTS,
    ActionEvent,
    ActionEventKind,
    DispatchRequest,
)
from headway.scheduler.resources import Pod
from temporalio import activity
from temporalio.client import Client

from .arbiter import Verdict, larger_than_shapes, misfit
from .backends.base import ClusterBackend, PodRecord

__all__ = [
    "POD_LOST",
    "ClusterActivities",
    "GangTracker",
    "PriorAttempt",
    "Signaler",
    "dispatch_key",
]

log = logging.getLogger(__name__)

#: Sends one event to the action workflow: ``(workflow_id, event)``.
Signaler = Callable[[str, ActionEvent], Awaitable[None]]

#: The kind reported for a pod an earlier attempt created that is gone, its node still
#: there: an infrastructure loss, never a failure of the user's code, and never a second
#: creation. The event's message starts with "PodLost:".
POD_LOST = ActionEventKind.POD_LOST


#: Tries of a terminal signal that failed, before an ended gang's pods are left to the
#: garbage collection (``ClusterActivities._clean_up``).
SIGNAL_TRIES = 4


def dispatch_key(info: activity.Info) -> str:
    """The dispatch an activity attempt belongs to: the same for every attempt of one
    ``run_action``, different for any other (another scheduling of the action by its
    workflow, a continued or reset workflow run)."""
    return f"{info.workflow_id}/{info.workflow_run_id}/{info.activity_id}"


@dataclass
class PodNote:
    """One pod as an earlier attempt last reported it in its heartbeat details."""

    kind: ActionEventKind | None = None
    node: str | None = None


@dataclass
class PriorAttempt:
    """What earlier attempts of this dispatch told Temporal through heartbeat details."""

    created: list[str] = field(default_factory=list)
    pods: dict[str, PodNote] = field(default_factory=dict)

    @classmethod
    def parse(cls, details: Sequence[Any]) -> PriorAttempt:
        """Read the last heartbeat details of an earlier attempt (tolerantly: details of
        another shape, or of an older worker, yield what can be read)."""
        last = next((d for d in reversed(list(details)) if isinstance(d, dict)), None)
        if last is None:
            return cls()
        if "created" not in last:
            # Older workers heartbeated {pod: kind}: every pod named there existed.
            notes = {str(p): PodNote(_kind(k)) for p, k in last.items() if isinstance(k, str)}
            return cls(sorted(notes), notes)
        created = [str(n) for n in last.get("created") or []]
        notes = {}
        for name, note in (last.get("pods") or {}).items():
            if isinstance(note, dict):
                node = note.get("node")
                notes[str(name)] = PodNote(_kind(note.get("kind")), str(node) if node else None)
        return cls(created, notes)


def _kind(value: Any) -> ActionEventKind | None:
    try:
        return ActionEventKind(value)
    except ValueError:
        return None


class GangTracker:
    """Folds per-pod events into what the action workflow should hear.

    A gang is all of its pods: it has succeeded when every pod has, and it has failed at
    the first pod failure (the other pods are torn down). Non-terminal pod events pass
    through once per change, so the workflow sees Scheduled/Running/Unschedulable as they
    happen; terminal kinds are reported once, for the gang as a whole.
    """

    def __init__(
        self, action_id: str, cluster: str, pods: list[str], *, dispatch: str = ""
    ) -> None:
        self.action_id = action_id
        self.cluster = cluster
        self.pods = list(pods)
        self.dispatch = dispatch
        self.nodes: dict[str, str] = {}
        self._latest: dict[str, tuple[ActionEventKind, str]] = {}
        self._succeeded: set[str] = set()
        self._outputs: dict[str, str] = {}
        self.terminal: ActionEvent | None = None
        # Whether the workflow has heard ``terminal`` (its signal was recorded).
        self.terminal_told = False

    def observe(self, event: ActionEvent) -> list[ActionEvent]:
        """Take one backend event; return the events to report (possibly none).

        Args:
            event: Any backend event; events of other actions or unknown pods are ignored.

        Returns:
            Zero or more events for the workflow; the last one is terminal when the gang
            just ended (``self.terminal`` is then set).
        """
        if self.terminal is not None or event.action_id != self.action_id:
            return []
        if event.pod is not None and event.pod not in self.pods:
            return []
        key = event.pod or ""
        if event.pod is not None and event.node:
            self.nodes[event.pod] = event.node
        if key in self._succeeded:
            # A finished pod's node going away later is not a failure of the action.
            return []
        state = (event.kind, event.message)
        if self._latest.get(key) == state:
            return []
        self._latest[key] = state
        if event.kind not in TERMINAL_EVENTS:
            return [event]
        if event.kind is not ActionEventKind.SUCCEEDED:
            self.terminal = event
            return [event]
        self._succeeded.add(key)
        if event.output is not None:
            self._outputs[key] = event.output
        if event.pod is None or self._succeeded >= set(self.pods):
            self.terminal = (
                event
                if len(self.pods) <= 1
                else ActionEvent(
                    action_id=self.action_id,
                    kind=ActionEventKind.SUCCEEDED,
                    cluster=self.cluster,
                    exit_code=0,
                    message=f"all {len(self.pods)} pods succeeded",
                    observed_at=event.observed_at,
                    # A gang's output is its first pod's (rank 0, the Ray head, the
                    # Spark driver), as an SDK task returns one value.
                    output=self._outputs.get(self.pods[0]),
                )
            )
            return [self.terminal]
        return []

    def details(self) -> dict[str, Any]:
        """The heartbeat details (visible in the Temporal UI): which pods this dispatch
        created, and each one's node and latest kind, so a retried attempt knows what to
        adopt and what was lost."""
        return {
            "dispatch": self.dispatch,
            "created": list(self.pods),
            "pods": {
                pod: {
                    "kind": str(self._latest[pod][0]) if pod in self._latest else None,
                    "node": self.nodes.get(pod),
                }
                for pod in self.pods
            },
        }


class ClusterActivities:
    """The activities of one cluster worker, bound to its backend.

    Args:
        backend: How this worker reaches its cluster.
        client: Temporal client used to signal action workflows; defaults to the client
            of the worker running the activity.
        heartbeat_s: Heartbeat period while pods live; keep it well under the heartbeat
            timeout the workflow sets, so a dead worker is noticed and a live one is not.
        cleanup: Delete an action's pods once it is over (the gang's survivors after a
            failure must go anyway; finished pods would only clutter the namespace).
        signaler: Override how events reach the workflow (tests, other transports).
        delete_attempts: Tries of one pod deletion inside an activity before giving up.
        delete_backoff_s: ``(first, cap)`` of the exponential wait between those tries.
        shapes: The node shapes the fleet declares for this cluster: what a dispatch is
            checked against while the backend cannot see its nodes (capacity unknown).
        refresh: Sends the given tenant's scheduler a fresh capacity report at once (the
            worker's reporter); called after a hand-back.

    Raises:
        ValueError: ``delete_attempts`` below 1 or a negative backoff (named).
    """

    def __init__(
        self,
        backend: ClusterBackend,
        client: Client | None = None,
        *,
        heartbeat_s: float = 5.0,
        cleanup: bool = True,
        signaler: Signaler | None = None,
        delete_attempts: int = 6,
        delete_backoff_s: tuple[float, float] = (0.5, 8.0),
        shapes: Sequence[Pod] = (),
        refresh: Callable[[str], Awaitable[None]] | None = None,
    ) -> None:
        if delete_attempts < 1:
            raise ValueError(f"delete_attempts: {delete_attempts!r} must be at least 1")
        if min(delete_backoff_s) < 0:
            raise ValueError(f"delete_backoff_s: {delete_backoff_s!r} must not be negative")
        self.backend = backend
        self.client = client
        self.heartbeat_s = heartbeat_s
        self.cleanup = cleanup
        self.delete_attempts = delete_attempts
        self.delete_backoff_s = delete_backoff_s
        self.shapes = tuple(shapes)
        self._refresh = refresh
        self._signaler = signaler
        self._arbiter = asyncio.Lock()

    async def _signal(self, workflow_id: str, event: ActionEvent) -> bool:
        """Signal ``event`` to the action's workflow; whether the server recorded it."""
        # A span of the action's trace (this activity's context): what the informer saw.
        with telemetry.tracer().start_as_current_span(
            f"informer {event.kind}",
            attributes={"headway.cluster": event.cluster, "headway.event": str(event.kind)},
        ):
            return await self._signal_now(workflow_id, event)

    async def _signal_now(self, workflow_id: str, event: ActionEvent) -> bool:
        try:
            if self._signaler is not None:
                await self._signaler(workflow_id, event)
                return True
            client = self.client or activity.client()
            await client.get_workflow_handle(workflow_id).signal(ACTION_EVENT_SIGNAL, event)
            # Attribution, as a metric: which cluster saw what, and how long it took the
            # action's workflow to hear of it.
            telemetry.get().record_event(event.cluster, str(event.kind), event.observed_at)
        except Exception as exc:
            # The returned terminal event is authoritative; a lost progress signal must not
            # fail (and so re-run) the action.
            log.warning("signal %s to %s failed: %s", event.kind, workflow_id, exc)
            return False
        return True

    @activity.defn(name=RUN_ACTION_ACTIVITY)
    async def run_action(self, req: DispatchRequest) -> ActionEvent:
        """Create (or adopt) the action's pods, relay their events, return the outcome.

        Args:
            req: The admitted action as the control plane dispatched it.

        Returns:
            The terminal ActionEvent (kind in ``protocol.TERMINAL_EVENTS``). For a retried
            attempt whose predecessor's pods are gone: their recorded outcome, NodeLost
            or :data:`POD_LOST` (never a second creation).

        Raises:
            asyncio.CancelledError: When the activity is cancelled; the pods are deleted
                first unless the cancellation is the worker shutting down or the attempt
                timing out, in which case a successor adopts them.
        """
        info = activity.info()
        dispatch = dispatch_key(info)
        retried = info.attempt > 1 or bool(info.heartbeat_details)
        prior = PriorAttempt.parse(info.heartbeat_details) if retried else PriorAttempt()
        if info.attempt > 1:
            # A retry: the worker running an earlier attempt was lost (or timed out).
            telemetry.get().record_retry(req.cluster)
        # Subscribe before creating, so no event can fall between creation and listening.
        with self.backend.subscribe() as queue:
            heartbeat: asyncio.Task[None] | None = None
            try:
                records: dict[str, PodRecord] = {}
                if retried:
                    records = await self.backend.dispatch_record(req.action_id, dispatch)
                adopt_only = bool(prior.created or records)
                if retried and not adopt_only:
                    log.info(
                        "%s: attempt %d finds no pods an earlier attempt created; creating",
                        req.action_id,
                        info.attempt,
                    )
                arbitrate = req.handback and not adopt_only
                verdict: Verdict | None = None
                # One check-and-create at a time: two dispatches checked before either
                # created would both count the same free room.
                async with self._arbiter if arbitrate else contextlib.nullcontext():
                    if arbitrate:
                        verdict = await self._arbitrate(req)
                    if verdict is None:
                        with telemetry.tracer().start_as_current_span(
                            f"{'adopt' if adopt_only else 'create'} {len(req.pods)} pods"
                            f" on {req.cluster}",
                            attributes={
                                "headway.cluster": req.cluster,
                                "headway.action": req.action_id,
                            },
                        ):
                            names = await self.backend.create_pods(
                                req, dispatch=dispatch, adopt_only=adopt_only
                            )
                if verdict is not None:
                    return await self._hand_back(req, verdict)
                tracker = GangTracker(req.action_id, self.backend.name, names, dispatch=dispatch)
                for name, note in prior.pods.items():
                    if note.node:
                        tracker.nodes[name] = note.node
                for name, rec in records.items():
                    if rec.node:
                        tracker.nodes[name] = rec.node
                # At once: the first heartbeat is the one Temporal keeps for a successor
                # even if this worker dies in the next instant.
                activity.heartbeat(tracker.details())
                heartbeat = asyncio.create_task(self._heartbeat(tracker))
                # What was queued while creating is summed up by current_events (each pod's
                # latest state, read after the drain, so nothing is lost); dropping it keeps
                # out what a stale pod of the same name said before it was replaced. An
                # adopted gang may have progressed (or ended) while nobody watched:
                # current_events says where it is.
                while not queue.empty():
                    queue.get_nowait()
                for event in await self.backend.current_events(req.action_id):
                    await self._relay(req, tracker, event)
                if adopt_only:
                    for event in await self._gone(req, names, dispatch, prior, records):
                        await self._relay(req, tracker, event)
                while tracker.terminal is None:
                    await self._relay(req, tracker, await queue.get())
                if self.cleanup:
                    await self._clean_up(req, tracker)
            except asyncio.CancelledError:
                if self._should_delete_on_cancel():
                    with contextlib.suppress(Exception):
                        await asyncio.shield(self._delete(req, "cancelled", raise_last=False))
                raise
            finally:
                if heartbeat is not None:
                    heartbeat.cancel()
        terminal = tracker.terminal
        assert terminal is not None  # the loop above exits only once the gang has ended
        return terminal

    async def _arbitrate(self, req: DispatchRequest) -> Verdict | None:
        """Whether the admitted pods fit the cluster as this worker sees it now (see
        ``headway.activities.arbiter``); None when they do."""
        view = await self.backend.live_view(req)
        if view is None:
            return larger_than_shapes(req.pods, self.shapes)
        nodes, pending = view
        return misfit(req.pods, nodes, pending)

    async def _hand_back(self, req: DispatchRequest, verdict: Verdict) -> ActionEvent:
        """Create nothing; the admission goes back to the action's workflow, which
        requeues it at its place (``CapacityChanged``) or, when no waiting can make it
        fit this cluster, ends it ``Unschedulable``. The tenant's scheduler gets a fresh
        report at once, so its next pass decides on what this worker saw."""
        kind = (
            ActionEventKind.UNSCHEDULABLE if verdict.permanent else ActionEventKind.CAPACITY_CHANGED
        )
        log.warning("%s: handed back (%s): %s", req.action_id, kind, verdict.message)
        telemetry.get().record_handback(req.cluster, str(kind))
        if self._refresh is not None:
            try:
                await self._refresh(req.tenant)
            except Exception as exc:  # the periodic report comes anyway
                log.warning("fresh capacity report to %s failed: %s", req.tenant, exc)
        return ActionEvent(
            action_id=req.action_id,
            kind=kind,
            cluster=self.backend.name,
            message=f"its cluster worker created nothing: {verdict.message}",
            observed_at=time.time(),
        )

    async def _relay(self, req: DispatchRequest, tracker: GangTracker, event: ActionEvent) -> None:
        for out in tracker.observe(event):
            activity.heartbeat(tracker.details())
            told = await self._signal(req.workflow_id, out)
            if out is tracker.terminal:
                tracker.terminal_told = told

    async def _clean_up(self, req: DispatchRequest, tracker: GangTracker) -> None:
        """Delete the ended gang's pods, once its workflow has heard the outcome.

        The pods are the only record of the outcome on a Kubernetes cluster: deleted
        before the outcome is recorded anywhere, a retry of this activity (this worker
        killed before its result reached Temporal) would find them gone and report the
        work lost. The terminal signal, once the server took it, is that record (the
        workflow keeps the first outcome it hears). Not taken after a few tries: the pods
        stay for the garbage collection, which deletes them once the workflow closed.
        """
        assert tracker.terminal is not None
        delay, cap = self.delete_backoff_s
        for _ in range(SIGNAL_TRIES):
            if tracker.terminal_told:
                break
            await asyncio.sleep(delay)
            delay = min(delay * 2, cap)
            tracker.terminal_told = await self._signal(req.workflow_id, tracker.terminal)
        if not tracker.terminal_told:
            log.warning(
                "%s: its workflow has not heard the outcome; the pods are left for the"
                " garbage collection",
                req.action_id,
            )
            return
        # Still heartbeating: retries of a failing delete take a while.
        await self._delete(req, "cleanup", raise_last=False)

    async def _gone(
        self,
        req: DispatchRequest,
        names: list[str],
        dispatch: str,
        prior: PriorAttempt,
        records: dict[str, PodRecord],
    ) -> list[ActionEvent]:
        """Terminal events for the pods an earlier attempt created that no longer exist:
        recorded outcomes first (a pod that ended and was then removed), then losses."""
        live = await self.backend.live_pods(req.action_id, dispatch)
        ended: list[ActionEvent] = []
        lost: list[ActionEvent] = []
        now = time.time()
        for name in names:
            if name in live:
                continue
            rec = records.get(name)
            note = prior.pods.get(name)
            node = (rec.node if rec is not None else None) or (note.node if note else None)
            outcome = rec.outcome if rec is not None else None
            if outcome is None and note is not None and note.kind in TERMINAL_EVENTS:
                outcome = note.kind
            if outcome is not None:
                ended.append(
                    ActionEvent(
                        action_id=req.action_id,
                        kind=outcome,
                        cluster=self.backend.name,
                        pod=name,
                        node=node,
                        exit_code=0 if outcome is ActionEventKind.SUCCEEDED else None,
                        message=f"{outcome} (recorded before the pod was removed)",
                        observed_at=now,
                    )
                )
                continue
            node_gone = node is not None and await self.backend.node_exists(node) is False
            if node_gone:
                kind, message = (
                    ActionEventKind.NODE_LOST,
                    f"node {node} is gone, and with it pod {name}, created by an earlier"
                    " attempt (not created again)",
                )
            elif rec is not None or name in prior.created:
                where = f" from node {node}" if node else ""
                kind, message = (
                    POD_LOST,
                    f"PodLost: pod {name}, created by an earlier attempt, is gone{where}"
                    " (not created again)",
                )
            else:
                # The earlier attempt created some of the gang and then stopped: whether
                # it got to this pod cannot be known, so it is not created (it might be
                # a second copy).
                kind, message = (
                    POD_LOST,
                    f"PodLost: pod {name} is missing from a gang an earlier attempt began"
                    " creating (not created, in case it ran already)",
                )
            log.warning("%s: %s", req.action_id, message)
            lost.append(
                ActionEvent(
                    action_id=req.action_id,
                    kind=kind,
                    cluster=self.backend.name,
                    pod=name,
                    node=node,
                    message=message,
                    observed_at=now,
                )
            )
        return ended + lost

    @staticmethod
    def _should_delete_on_cancel() -> bool:
        details = activity.cancellation_details()
        if activity.is_worker_shutdown():
            return False
        if details is None:
            return True
        # Timing out means this attempt lost contact; the retry adopts the running pods.
        return not (details.worker_shutdown or details.timed_out or details.paused)

    async def _heartbeat(self, tracker: GangTracker) -> None:
        while True:
            activity.heartbeat(tracker.details())
            await asyncio.sleep(self.heartbeat_s)

    def _namespace(self, req: DispatchRequest) -> str:
        """Where the action's pods are: a backend that maps queues to namespaces says."""
        namespace_of = getattr(self.backend, "namespace_of", None)
        return str(namespace_of(req)) if namespace_of is not None else req.namespace

    async def _delete(self, req: DispatchRequest, why: str, *, raise_last: bool) -> int:
        """Delete the action's pods, retrying with capped exponential backoff.

        Every failure is logged. After the last try the error is raised (``raise_last``)
        or logged as left to the worker's garbage collection, which deletes the pods of
        ended actions.
        """
        delay, cap = self.delete_backoff_s
        for attempt in range(1, self.delete_attempts + 1):
            try:
                return await self.backend.delete_pods(
                    req.action_id, self._namespace(req), tenant=req.tenant
                )
            except Exception as exc:
                last = attempt == self.delete_attempts
                log.warning(
                    "%s: deleting the pods of %s failed (try %d of %d)%s: %s",
                    why,
                    req.action_id,
                    attempt,
                    self.delete_attempts,
                    "" if last else f"; again in {delay:g} s",
                    exc,
                )
                if last:
                    if raise_last:
                        raise
                    log.error(
                        "%s: the pods of %s are left for the worker's garbage collection",
                        why,
                        req.action_id,
                    )
                    return 0
                await asyncio.sleep(delay)
                delay = min(delay * 2, cap)
        raise AssertionError("unreachable")  # the loop returns or raises

    @activity.defn(name=DELETE_ACTION_ACTIVITY)
    async def delete_action(self, req: DispatchRequest) -> int:
        """Delete whatever is left of the action's pods (idempotent).

        Tries ``delete_attempts`` times with backoff, then raises so that Temporal
        retries the activity.

        Returns:
            How many pods were deleted (0 when nothing was left).
        """
        return await self._delete(req, "delete_action", raise_last=True)

    def activities(self) -> list[Callable[..., Any]]:
        """The activity callables to register on the cluster worker."""
        return [self.run_action, self.delete_action]
