"""The narrow I/O seam between the cluster activities and a cluster.

A :class:`ClusterBackend` is to the cluster worker what a transport is to an HTTP client:
the activities decide *what* to do (create a gang idempotently, follow its events, report
capacity), the backend decides *how* it reaches a cluster (an in-process simulation, or a
Kubernetes API server). Both backends report the same :class:`~headway.protocol.ActionEvent`
vocabulary, so nothing above this seam can tell them apart.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import re
from collections.abc import AsyncIterator, Iterator
from typing import Protocol, runtime_checkable

from headway.protocol import ActionEvent, CapacityReport, DispatchRequest

__all__ = [
    "ACTION_ANNOTATION",
    "ACTION_LABEL",
    "ROLE_LABEL",
    "TENANT_LABEL",
    "ChangeSignal",
    "ClusterBackend",
    "EventHub",
    "label_value",
    "pod_name",
    "sanitize_dns1123",
]

#: Label selecting every pod Headway created (value: the sanitized action id).
ACTION_LABEL = "headway.io/action"
TENANT_LABEL = "headway.io/tenant"
ROLE_LABEL = "headway.io/role"
#: Label values are capped at 63 characters of a narrow alphabet; the annotation keeps the
#: action id verbatim so events map back to the exact id the control plane knows.
ACTION_ANNOTATION = "headway.io/action-id"

_DNS_MAX = 63
_NOT_DNS = re.compile(r"[^a-z0-9-]+")
_NOT_LABEL = re.compile(r"[^A-Za-z0-9_.-]+")


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:8]


def sanitize_dns1123(text: str, max_len: int = _DNS_MAX) -> str:
    """A DNS-1123 label from arbitrary text: lowercase alphanumerics and '-', at most
    ``max_len`` characters, starting and ending alphanumeric.

    Whenever the text has to be changed, a digest of the original is appended so that two
    different inputs never collapse onto the same name (pods are adopted by name).
    """
    clean = _NOT_DNS.sub("-", text.lower()).strip("-")
    if clean == text and len(clean) <= max_len and clean:
        return clean
    suffix = _digest(text)
    head = clean[: max_len - len(suffix) - 1].strip("-")
    return f"{head}-{suffix}" if head else f"x{suffix}"


def label_value(text: str) -> str:
    """A valid label value (<= 63 chars of ``[A-Za-z0-9_.-]``, alphanumeric at both ends)."""
    clean = _NOT_LABEL.sub("-", text).strip("-_.")
    if clean == text and len(clean) <= _DNS_MAX:
        return clean
    suffix = _digest(text)
    head = clean[: _DNS_MAX - len(suffix) - 1].strip("-_.")
    return f"{head}-{suffix}" if head else suffix


def pod_name(action_id: str, role: str, index: int) -> str:
    """The deterministic pod name ``hw-<action_id>-<role>-<index>``, DNS-1123 sanitized.

    Deterministic names are what makes creation idempotent: a retried activity or a
    restarted worker asks for the same names and adopts what a predecessor created.
    """
    return sanitize_dns1123(f"hw-{action_id}-{role}-{index}")


class ChangeSignal:
    """A version counter that waiters can block on (level-triggered, never loses a bump)."""

    def __init__(self) -> None:
        self.version = 0
        self._event = asyncio.Event()

    def bump(self) -> None:
        """Record a change and wake every waiter."""
        self.version += 1
        self._event.set()
        self._event = asyncio.Event()

    async def wait(self, since: int) -> int:
        """Wait until the version moves past ``since``; return the new version."""
        while self.version <= since:
            await self._event.wait()
        return self.version


class EventHub:
    """Fan-out of backend events to any number of subscribers (one queue each)."""

    def __init__(self) -> None:
        self._subscribers: set[asyncio.Queue[ActionEvent]] = set()

    def publish(self, event: ActionEvent) -> None:
        """Deliver ``event`` to every current subscriber without blocking."""
        for queue in self._subscribers:
            queue.put_nowait(event)

    @contextlib.contextmanager
    def subscribe(self) -> Iterator[asyncio.Queue[ActionEvent]]:
        """A queue receiving every event published while the context is open."""
        queue: asyncio.Queue[ActionEvent] = asyncio.Queue()
        self._subscribers.add(queue)
        try:
            yield queue
        finally:
            self._subscribers.discard(queue)

    async def stream(self) -> AsyncIterator[ActionEvent]:
        """Every event published from now on, until the consumer stops iterating."""
        with self.subscribe() as queue:
            while True:
                yield await queue.get()


@runtime_checkable
class ClusterBackend(Protocol):
    """How the cluster activities reach one cluster.

    Implementations must make :meth:`create_pods` idempotent (adopt what exists, create the
    rest) and :meth:`delete_pods` idempotent (deleting nothing is fine).
    """

    #: The cluster's name, as the control plane knows it.
    name: str

    async def start(self) -> None:
        """Begin watching the cluster (informers); called once by the worker."""
        ...

    async def close(self) -> None:
        """Stop watching and release connections."""
        ...

    async def create_pods(self, req: DispatchRequest) -> list[str]:
        """Create the action's pods, adopting any that already exist; return all names."""
        ...

    async def delete_pods(self, action_id: str, namespace: str = "default") -> int:
        """Delete whatever is left of the action's pods; return how many were deleted."""
        ...

    def subscribe(self) -> contextlib.AbstractContextManager[asyncio.Queue[ActionEvent]]:
        """A queue of every ActionEvent (all actions) published while it is open."""
        ...

    def events(self) -> AsyncIterator[ActionEvent]:
        """Every ActionEvent, for all actions, from now on."""
        ...

    async def current_events(self, action_id: str) -> list[ActionEvent]:
        """The latest known event of each of the action's pods (what a late subscriber
        missed: an adopted pod may have been scheduled or finished long ago)."""
        ...

    async def capacity(self) -> CapacityReport:
        """The cluster's capacity as of now (``nodes=None`` when unknown)."""
        ...

    async def wait_capacity_change(self, since: int) -> int:
        """Block until capacity may have changed after version ``since``; return the
        current version (start with 0)."""
        ...
