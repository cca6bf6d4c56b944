"""Cluster-local activities: run one admitted action's pods and report what happens.

These run on a cluster worker (``protocol.cluster_task_queue(cluster)``), next to the
cluster, so the control plane never needs credentials into it. ``run_action`` creates the
gang idempotently, relays informer events to the action's workflow by signal as they
happen, heartbeats while the pods live, and returns the terminal event. A retried attempt,
on this worker or a restarted one, finds the pods by their deterministic names and adopts
them instead of starting the work twice.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
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
from temporalio import activity
from temporalio.client import Client

from .backends.base import ClusterBackend

__all__ = ["ClusterActivities", "GangTracker", "Signaler"]

log = logging.getLogger(__name__)

#: Sends one event to the action workflow: ``(workflow_id, event)``.
Signaler = Callable[[str, ActionEvent], Awaitable[None]]


class GangTracker:
    """Folds per-pod events into what the action workflow should hear.

    A gang is all of its pods: it has succeeded when every pod has, and it has failed at
    the first pod failure (the other pods are torn down). Non-terminal pod events pass
    through once per change, so the workflow sees Scheduled/Running/Unschedulable as they
    happen; terminal kinds are reported once, for the gang as a whole.
    """

    def __init__(self, action_id: str, cluster: str, pods: list[str]) -> None:
        self.action_id = action_id
        self.cluster = cluster
        self.pods = list(pods)
        self._latest: dict[str, tuple[ActionEventKind, str]] = {}
        self._succeeded: set[str] = set()
        self.terminal: ActionEvent | None = None

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
                )
            )
            return [self.terminal]
        return []

    def summary(self) -> dict[str, str]:
        """Pod -> latest kind, as heartbeat details (visible in the Temporal UI)."""
        return {pod: str(kind) for pod, (kind, _) in self._latest.items()}


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
    """

    def __init__(
        self,
        backend: ClusterBackend,
        client: Client | None = None,
        *,
        heartbeat_s: float = 5.0,
        cleanup: bool = True,
        signaler: Signaler | None = None,
    ) -> None:
        self.backend = backend
        self.client = client
        self.heartbeat_s = heartbeat_s
        self.cleanup = cleanup
        self._signaler = signaler

    async def _signal(self, workflow_id: str, event: ActionEvent) -> None:
        try:
            if self._signaler is not None:
                await self._signaler(workflow_id, event)
                return
            client = self.client or activity.client()
            await client.get_workflow_handle(workflow_id).signal(ACTION_EVENT_SIGNAL, event)
            # Attribution, as a metric: which cluster saw what, and how long it took the
            # action's workflow to hear of it.
            telemetry.get().record_event(event.cluster, str(event.kind), event.observed_at)
        except Exception as exc:
            # The returned terminal event is authoritative; a lost progress signal must not
            # fail (and so re-run) the action.
            log.warning("signal %s to %s failed: %s", event.kind, workflow_id, exc)

    @activity.defn(name=RUN_ACTION_ACTIVITY)
    async def run_action(self, req: DispatchRequest) -> ActionEvent:
        """Create (or adopt) the action's pods, relay their events, return the outcome.

        Args:
            req: The admitted action as the control plane dispatched it.

        Returns:
            The terminal ActionEvent (kind in ``protocol.TERMINAL_EVENTS``).

        Raises:
            asyncio.CancelledError: When the activity is cancelled; the pods are deleted
                first unless the cancellation is the worker shutting down or the attempt
                timing out, in which case a successor adopts them.
        """
        # Subscribe before creating, so no event can fall between creation and listening.
        with self.backend.subscribe() as queue:
            tracker: GangTracker | None = None
            heartbeat: asyncio.Task[None] | None = None
            try:
                names = await self.backend.create_pods(req)
                tracker = GangTracker(req.action_id, self.backend.name, names)
                heartbeat = asyncio.create_task(self._heartbeat(tracker))
                # An adopted gang may have progressed (or ended) while nobody watched.
                for event in await self.backend.current_events(req.action_id):
                    for out in tracker.observe(event):
                        await self._signal(req.workflow_id, out)
                while tracker.terminal is None:
                    event = await queue.get()
                    for out in tracker.observe(event):
                        activity.heartbeat(tracker.summary())
                        await self._signal(req.workflow_id, out)
            except asyncio.CancelledError:
                if self._should_delete_on_cancel():
                    with contextlib.suppress(Exception):
                        await asyncio.shield(self.backend.delete_pods(req.action_id, req.namespace))
                raise
            finally:
                if heartbeat is not None:
                    heartbeat.cancel()
        terminal = tracker.terminal
        assert terminal is not None  # the loop above exits only once the gang has ended
        if self.cleanup:
            try:
                await self.backend.delete_pods(req.action_id, req.namespace)
            except Exception as exc:
                log.warning("cleanup of %s failed: %s", req.action_id, exc)
        return terminal

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
            activity.heartbeat(tracker.summary())
            await asyncio.sleep(self.heartbeat_s)

    @activity.defn(name=DELETE_ACTION_ACTIVITY)
    async def delete_action(self, req: DispatchRequest) -> int:
        """Delete whatever is left of the action's pods (idempotent).

        Returns:
            How many pods were deleted (0 when nothing was left).
        """
        return await self.backend.delete_pods(req.action_id, req.namespace)

    def activities(self) -> list[Callable[..., Any]]:
        """The activity callables to register on the cluster worker."""
        return [self.run_action, self.delete_action]
