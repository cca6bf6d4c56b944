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
import json
import logging
import os
import re
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from headway.protocol import (
    ActionEvent,
    ActionEventKind,
    CapacityReport,
    DispatchRequest,
    NodeCapacity,
    PodSpec,
)

__all__ = [
    "ACTION_ANNOTATION",
    "ACTION_LABEL",
    "DISPATCH_ANNOTATION",
    "POD_LOG_ENV",
    "ROLE_LABEL",
    "TENANT_LABEL",
    "WORKFLOW_ANNOTATION",
    "ChangeSignal",
    "ClusterBackend",
    "EventHub",
    "HeadwayPods",
    "PodLog",
    "PodRecord",
    "label_value",
    "pod_name",
    "sanitize_dns1123",
    "service_name",
]

log = logging.getLogger(__name__)

#: Label selecting every pod Headway created (value: the sanitized action id).
ACTION_LABEL = "headway.io/action"
TENANT_LABEL = "headway.io/tenant"
ROLE_LABEL = "headway.io/role"
#: Label values are capped at 63 characters of a narrow alphabet; the annotation keeps the
#: action id verbatim so events map back to the exact id the control plane knows.
ACTION_ANNOTATION = "headway.io/action-id"
#: Which dispatch (one ``run_action`` activity, all its attempts) created the pod: a retry
#: adopts only its own dispatch's pods, and a new dispatch replaces a stale one's.
DISPATCH_ANNOTATION = "headway.io/dispatch"
#: The action workflow's id, verbatim, so a worker can ask Temporal whether the action
#: has ended (labels are sanitized; deriving the id from them could name another one).
WORKFLOW_ANNOTATION = "headway.io/workflow-id"
#: Environment variable naming the pod log (see the module docstring).
POD_LOG_ENV = "HEADWAY_POD_LOG"

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


def pod_name(action_id: str, role: str, index: int, tenant: str = "") -> str:
    """The deterministic pod name of one pod of ``tenant``'s action, DNS-1123 sanitized.

    Deterministic names are what makes creation idempotent: a retried activity or a
    restarted worker asks for the same names and adopts what a predecessor created.
    Action ids are a tenant's own, so the name carries the tenant:
    ``hw-<tenant>-<action_id>-<role>-<index>-<digest>``, where the digest of the tenant
    and the id apart tells ``a`` + ``b-c`` from ``a-b`` + ``c``; long names keep their
    head and end in a digest of the whole (63 characters at most: the name is also the
    pod's hostname, a DNS label). ``tenant`` empty: the name before tenants were part of
    it, ``hw-<action_id>-<role>-<index>``, which a worker still adopts (a pod created
    under it by a worker since upgraded keeps it).
    """
    if not tenant:
        return sanitize_dns1123(f"hw-{action_id}-{role}-{index}")
    return sanitize_dns1123(
        f"hw-{tenant}-{action_id}-{role}-{index}-{_owner_digest(tenant, action_id)}"
    )


def service_name(action_id: str, tenant: str = "") -> str:
    """The headless Service giving a gang's pods stable DNS names (``tenant`` as in
    :func:`pod_name`; empty: the name before tenants were part of it)."""
    if not tenant:
        return sanitize_dns1123(f"hw-{action_id}")
    return sanitize_dns1123(f"hw-{tenant}-{action_id}-{_owner_digest(tenant, action_id)}")


def _owner_digest(tenant: str, action_id: str) -> str:
    # (NUL cannot occur in either, so the pair is unambiguous.)
    return _digest(f"{tenant}\0{action_id}")[:6]


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


@dataclass
class PodRecord:
    """What the cluster remembers of one pod a dispatch created.

    ``outcome`` is the pod's terminal kind once it ended (kept after the pod is deleted
    where the backend can keep it), else None.
    """

    name: str
    node: str | None = None
    outcome: ActionEventKind | None = None


@dataclass(frozen=True)
class HeadwayPods:
    """One action that has Headway pods (or records) on the cluster, for garbage
    collection: whose workflow to ask, and where its pods live. ``exact`` is False when
    the workflow id had to be derived (a sanitized label may name another workflow).
    ``tenant`` is the action's ("" not known): another tenant's action of the same id is
    another action, with pods of its own."""

    action_id: str
    workflow_id: str
    namespace: str
    exact: bool = True
    tenant: str = ""


class PodLog:
    """The append-only audit file of pod events (format in the module docstring).

    Args:
        path: The file; created when missing.
        cluster: The cluster whose lines this writer appends (and reads back to skip
            lines an earlier incarnation already wrote).
    """

    def __init__(self, path: str, cluster: str) -> None:
        self.path = path
        self.cluster = cluster
        self.incarnation = ""
        self._seen: set[tuple[str, str, str]] = set()
        # Pods earlier incarnations logged as created or bound but never as ended.
        self._unended: dict[tuple[str, str], dict[str, Any]] = {}
        self._fd: int | None = None

    @classmethod
    def from_env(cls, cluster: str, path: str | None = None) -> PodLog | None:
        """The pod log named by ``path`` or else ``$HEADWAY_POD_LOG``, opened (so a bad
        path fails when the backend is built, not at its first pod); None when neither.

        Raises:
            ValueError: The file cannot be opened for appending (path and reason named).
        """
        chosen = path if path is not None else os.environ.get(POD_LOG_ENV) or None
        if not chosen:
            return None
        log = cls(chosen, cluster)
        log.open()
        return log

    def open(self) -> None:
        """Open for appending and read back what this cluster's earlier lines recorded.

        Raises:
            ValueError: The file cannot be opened (path and reason named).
        """
        if self._fd is not None:
            return
        try:
            self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        except OSError as exc:
            raise ValueError(
                f"{POD_LOG_ENV}: cannot append to {self.path!r}: {exc.strerror}"
            ) from exc
        tail = b""
        with open(self.path, "rb") as fh:
            for raw in fh:
                tail = raw
                try:
                    line = json.loads(raw)
                except ValueError:
                    continue  # a partial line left by a kill in the middle of a write
                if isinstance(line, dict) and line.get("cluster") == self.cluster:
                    dispatch, pod = str(line.get("dispatch", "")), str(line.get("pod"))
                    event = str(line.get("event"))
                    self._seen.add((dispatch, pod, event))
                    if event == "ended":
                        self._unended.pop((dispatch, pod), None)
                    elif event != "creating":
                        # (An intent alone is no pod: its create call may never have
                        # reached the API server. One that did is seen, and logged, by
                        # whoever watches next.)
                        self._unended[(dispatch, pod)] = line
        if tail and not tail.endswith(b"\n"):
            # Start a fresh line after a partial one, so the next line parses.
            os.write(self._fd, b"\n")

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def unended_before(self) -> list[dict[str, Any]]:
        """Lines (the latest of each pod) of pods that earlier incarnations logged as
        created or bound and never as ended, as read at :meth:`open`."""
        return [
            line
            for (dispatch, pod), line in self._unended.items()
            if (dispatch, pod, "ended") not in self._seen
        ]

    def end_vanished(self, t: float, exists: Callable[[str, str], bool]) -> int:
        """Write an "ended" line (outcome "Deleted", time ``t``) for each pod an earlier
        incarnation left unended that no longer exists: it went while no worker
        watched. ``exists(dispatch, pod)`` says whether it does.

        Returns:
            How many lines were written.
        """
        written = 0
        for line in self.unended_before():
            dispatch, pod = str(line.get("dispatch", "")), str(line.get("pod"))
            if exists(dispatch, pod):
                continue
            spec = PodSpec(
                role="",
                index=0,
                cpu_m=int(line.get("cpu_m") or 0),
                memory=int(line.get("mem") or 0),
                gpu=int(line.get("gpu") or 0),
            )
            written += self.append(
                "ended",
                t=t,
                action=str(line.get("action")),
                pod=pod,
                node=line.get("node"),
                spec=spec,
                dispatch=dispatch,
                outcome="Deleted",
            )
        return written

    def logged(self, dispatch: str, pod: str, event: str) -> bool:
        """Whether this line was written already (by any incarnation)."""
        return (dispatch, pod, event) in self._seen

    def append(
        self,
        event: str,
        *,
        t: float,
        action: str,
        pod: str,
        node: str | None,
        spec: PodSpec,
        dispatch: str,
        outcome: str | None = None,
    ) -> bool:
        """Append one line (flushed and fsync'd) unless it was written before.

        Returns:
            Whether a line was written.
        """
        key = (dispatch, pod, event)
        if key in self._seen:
            return False
        self.open()
        assert self._fd is not None
        line = {
            "t": t,
            "cluster": self.cluster,
            "action": action,
            "pod": pod,
            "node": node,
            "event": event,
            "cpu_m": spec.cpu_m,
            "mem": spec.memory,
            "gpu": spec.gpu,
            "outcome": outcome,
            "incarnation": self.incarnation,
            "dispatch": dispatch,
        }
        data = (json.dumps(line, separators=(",", ":")) + "\n").encode()
        try:
            os.write(self._fd, data)  # one write on O_APPEND: lines of writers never mix
            os.fsync(self._fd)
        except OSError as exc:
            # The audit trail must not take the cluster worker down with it.
            log.error("pod log %s: cannot append: %s", self.path, exc)
            return False
        self._seen.add(key)
        return True


@runtime_checkable
class ClusterBackend(Protocol):
    """How the cluster activities reach one cluster.

    Implementations must make :meth:`create_pods` idempotent (adopt what exists, create the
    rest) and :meth:`delete_pods` idempotent (deleting nothing is fine).
    """

    #: The cluster's name, as the control plane knows it.
    name: str
    #: The id of the worker process running it (stamped on pod log lines); the worker
    #: sets it before :meth:`start`.
    incarnation: str

    async def start(self) -> None:
        """Begin watching the cluster (informers); called once by the worker."""
        ...

    async def close(self) -> None:
        """Stop watching and release connections."""
        ...

    async def create_pods(
        self, req: DispatchRequest, *, dispatch: str = "", adopt_only: bool = False
    ) -> list[str]:
        """Create the action's pods, adopting any that already exist; return all names.

        Args:
            req: The admitted action.
            dispatch: The dispatch creating them (recorded on each pod); a pod of the same
                name left by another dispatch is replaced, one of this dispatch adopted.
                Empty: adopt whatever exists by name.
            adopt_only: Create nothing: an earlier attempt of this dispatch created the
                pods, so whatever is missing was lost, not never made.
        """
        ...

    async def dispatch_record(self, action_id: str, dispatch: str) -> dict[str, PodRecord]:
        """The pods the cluster knows ``dispatch`` created (name -> record); empty when
        it knows of none. Durable where the backend can keep it."""
        ...

    async def live_pods(self, action_id: str, dispatch: str = "") -> dict[str, str | None]:
        """The action's pods that exist now (name -> node, None while pending), read
        authoritatively; only ``dispatch``'s own when given."""
        ...

    async def node_exists(self, node: str) -> bool | None:
        """Whether ``node`` is part of the cluster now; None when unknown."""
        ...

    async def headway_pods(self) -> list[HeadwayPods]:
        """Every action with Headway pods (or records) on the cluster, for cleanup."""
        ...

    def forget(self, action_id: str, *, tenant: str = "") -> None:
        """Drop what the backend remembers of ``tenant``'s ended action (every tenant's
        of that id when empty), after its pods are gone."""
        ...

    async def delete_pods(
        self, action_id: str, namespace: str = "default", *, tenant: str = ""
    ) -> int:
        """Delete whatever is left of ``tenant``'s action's pods (every tenant's of that
        id when empty); return how many were deleted."""
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

    async def live_view(
        self, req: DispatchRequest
    ) -> tuple[list[NodeCapacity], list[PodSpec]] | None:
        """What the cluster worker arbitrates ``req`` against (``activities.arbiter``):
        per node, what is free now for the request's pods (every pod counted; nothing on
        a node they cannot go to, which says why in ``unusable``), and the requests of
        Headway's pods created but not yet bound. None when the backend cannot see its
        nodes (capacity unknown)."""
        ...
