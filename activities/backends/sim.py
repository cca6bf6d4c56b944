"""The embedded default backend: a simulated cluster built from a ``ClusterSpec``.

It behaves like a small Kubernetes cluster seen through informers: pods bind to nodes
(best fit), report Scheduled, Running and a terminal event, stay Pending with an
Unschedulable reason when nothing fits, and hold their requests on a node until they end.
Faults are injected per action (``DispatchRequest.inject``) or from the outside
(:meth:`SimBackend.kill_node`, :meth:`SimBackend.preempt`) so demos and tests can show
OOM kills, preemptions and lost nodes being attributed to the exact action.

A real cluster outlives its worker; with a ``state_dir`` the simulated one does too. Its
whole state (every pod: action, node, requests, when it was created, bound, starts
running and ends; the nodes that are down; which dispatch created which pods and how they
ended) is written to ``<state_dir>/sim-<cluster>.json`` atomically (temporary file,
fsync, rename) on every change, before anything is reported about that change. A
restarted worker reads it back and resumes in wall time: a pod that should have finished
while no worker ran finishes at once with its outcome, and a retried ``run_action`` finds
its dispatch's pods (or their outcome) there and adopts them instead of creating them
again. Without a ``state_dir`` the cluster dies with its worker, and a retry reports the
lost pods (see ``headway.activities.cluster``). One worker per cluster and state file.

Pod events go to the pod log when ``HEADWAY_POD_LOG`` is set (format in
``headway.activities.backends.base``); lines follow the state write they describe, and a
restarted worker appends any that a ``kill -9`` cut off (never one twice).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import os
import tempfile
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from headway.activities.arbiter import unusable_reason
from headway.protocol import (
    TERMINAL_EVENTS,
    ActionEvent,
    ActionEventKind,
    CapacityReport,
    DispatchRequest,
    NodeCapacity,
    PodSpec,
)
from headway.scheduler.model import ClusterSpec
from headway.scheduler.resources import Pod, parse_memory

from .base import (
    ChangeSignal,
    EventHub,
    HeadwayPods,
    PodLog,
    PodRecord,
    pod_name,
    sanitize_dns1123,
)
from .sim_task import is_task_command, master_port, outcome_of, run_task_process

__all__ = ["DEFAULT_DURATION_S", "INJECTABLE_FAULTS", "STATE_VERSION", "SimBackend"]

#: How long a simulated pod runs when the request does not say.
DEFAULT_DURATION_S = 3.0
INJECTABLE_FAULTS = frozenset({"oom", "preempt", "node-lost", "image-pull", "fail"})
#: ``oom-below:<memory>``: the work needs that much memory, so a pod that asks for less
#: is OOMKilled and one that asks for as much runs (the OOM retry's raised memory).
OOM_BELOW = "oom-below:"
#: Version of the state file's layout; a file of another version is refused, not guessed.
STATE_VERSION = 1
#: How long the cluster remembers what a dispatch created after its pods are gone (a
#: retry arriving later finds the outcome in the activity's heartbeat details instead).
DEFAULT_RECORD_TTL_S = 6 * 3600.0

_K = ActionEventKind


@dataclass
class _Node:
    name: str
    shape: Pod
    order: int
    alive: bool = True
    recover_at: float | None = None  # wall time a lost node comes back (None: manual)
    # What keeps new pods off a live node, as on Kubernetes (``cordon``, ``taint``,
    # ``set_ready``): pods already bound run on.
    cordoned: bool = False
    taints: list[dict[str, str]] = field(default_factory=list)
    ready: bool = True

    def unusable(self) -> str:
        """Why a new (toleration-less) pod cannot go here, "" when it can."""
        return unusable_reason(
            {
                "spec": {"unschedulable": self.cordoned, "taints": self.taints},
                "status": {"conditions": [{"type": "Ready", "status": str(self.ready)}]},
            }
        )

    def marked(self) -> bool:
        return not self.alive or self.cordoned or bool(self.taints) or not self.ready


@dataclass
class _SimPod:
    name: str
    action_id: str
    namespace: str
    spec: PodSpec
    created: int  # creation order, so pending pods bind first-come first-served
    inject: str | None = None
    duration_s: float = DEFAULT_DURATION_S
    workflow_id: str = ""
    dispatch: str = ""
    created_at: float = 0.0
    tenant: str = ""  # "" in state written before tenants were kept
    node: str | None = None
    last: ActionEvent | None = None
    holds: bool = False  # whether its requests count against its node
    ended: bool = False  # its "ended" pod-log line is due or written
    # Wall-clock deadlines, fixed at binding, so a restarted worker resumes the pod where
    # real time says it is rather than starting its clock again.
    bound_at: float | None = None
    running_at: float | None = None
    ends_at: float | None = None
    task: asyncio.Task[None] | None = field(default=None, repr=False)

    @property
    def terminal(self) -> bool:
        return self.last is not None and self.last.kind in TERMINAL_EVENTS


@dataclass
class _Record:
    """What one dispatch created, kept after its pods are deleted (tombstones)."""

    action_id: str
    workflow_id: str
    namespace: str
    at: float
    pods: dict[str, PodRecord] = field(default_factory=dict)
    tenant: str = ""  # "" in state written before tenants were kept


def _fits(spec: PodSpec, node: _Node, free: Pod) -> bool:
    if spec.gpu and spec.gpu_type is not None and node.shape.gpu_type != spec.gpu_type:
        return False
    return (
        spec.cpu_m <= free.cpu
        and spec.memory <= free.memory
        and spec.ephemeral_storage <= free.eph
        and spec.gpu <= free.gpu
    )


def _event_to_json(ev: ActionEvent) -> dict[str, Any]:
    d = dataclasses.asdict(ev)
    d["kind"] = str(ev.kind)
    return d


def _event_from_json(d: dict[str, Any]) -> ActionEvent:
    return ActionEvent(**{**d, "kind": ActionEventKind(d["kind"])})


class SimBackend:
    """A simulated cluster: nodes from ``spec.node_groups``, pods that run for a while.

    Args:
        spec: The cluster's node groups; ``reports_capacity=False`` makes every
            capacity report unknown (``nodes=None``).
        time_scale: Multiplies every simulated delay (0.01 makes a 3 s pod take 30 ms).
        clock: Wall clock for ``observed_at`` stamps and the pods' deadlines.
        startup_s: Simulated image pull + container start, between Scheduled and Running.
        node_recovery_s: How long a node lost by injection stays away before it returns.
        state_dir: Keep the cluster's state in ``<state_dir>/sim-<cluster>.json`` so it
            outlives this process (see the module docstring). None: in memory only.
        pod_log: The pod log file; None reads ``$HEADWAY_POD_LOG`` (unset: no log).
        record_ttl_s: How long what a dispatch created is remembered once its pods are
            gone.

    Raises:
        ValueError: ``time_scale`` or ``startup_s`` negative, or a state file that cannot
            be read back (named in the message).
    """

    def __init__(
        self,
        spec: ClusterSpec,
        *,
        time_scale: float = 1.0,
        clock: Callable[[], float] = time.time,
        startup_s: float = 0.2,
        node_recovery_s: float = 5.0,
        state_dir: str | os.PathLike[str] | None = None,
        pod_log: str | None = None,
        record_ttl_s: float = DEFAULT_RECORD_TTL_S,
    ) -> None:
        if time_scale < 0:
            raise ValueError(f"time_scale: {time_scale!r} must not be negative")
        if startup_s < 0:
            raise ValueError(f"startup_s: {startup_s!r} must not be negative")
        self.name = spec.name
        self.spec = spec
        self.time_scale = time_scale
        self.clock = clock
        self.startup_s = startup_s
        self.node_recovery_s = node_recovery_s
        self.record_ttl_s = record_ttl_s
        self._incarnation = ""
        self._nodes: dict[str, _Node] = {}
        order = 0
        for group in spec.node_groups:
            for i in range(group.count):
                name = f"{group.name}-{i}"
                self._nodes[name] = _Node(name, group.shape, order)
                order += 1
        self._pods: dict[str, _SimPod] = {}
        self._records: dict[str, _Record] = {}
        self._created = 0
        self._hub = EventHub()
        self._changes = ChangeSignal()
        self._sequence = 0
        self._background: set[asyncio.Task[None]] = set()
        self._pod_log = PodLog.from_env(self.name, pod_log)
        # Pod-log lines whose state change is made but not yet written to the state file:
        # they are appended only after it, and a restart appends what a kill cut off.
        self._outbox: list[dict[str, Any]] = []
        self._started = False
        self.state_path: Path | None = None
        # SDK tasks' outcome documents and logs (``sim_task``): kept with the state, so a
        # restarted worker finds what a task wrote while none ran.
        self._task_dir = (
            Path(state_dir) / f"tasks-{sanitize_dns1123(self.name)}"
            if state_dir is not None
            else Path(tempfile.gettempdir()) / f"headway-sim-{os.getpid()}-{id(self):x}"
        )
        if state_dir is not None:
            self.state_path = Path(state_dir) / f"sim-{sanitize_dns1123(self.name)}.json"
            self._load()

    @property
    def incarnation(self) -> str:
        """The worker process running this backend (stamped on pod-log lines)."""
        return self._incarnation

    @incarnation.setter
    def incarnation(self, value: str) -> None:
        self._incarnation = value
        if self._pod_log is not None:
            self._pod_log.incarnation = value

    # --- lifecycle ----------------------------------------------------------------------

    async def start(self) -> None:
        """Resume what a previous worker left: pods run on from where wall time says they
        are (finishing at once when they should have ended meanwhile), lost nodes come
        back when due, pending pods bind, and pod-log lines a kill cut off are written."""
        if self._started:
            return
        self._started = True
        if self._pod_log is not None:
            self._pod_log.open()
            # Lines a kill cut off first, so what follows sees every line that is due.
            self._persist()
            here = {(p.dispatch, p.name) for p in self._pods.values()}
            # Logged by an earlier incarnation and gone: without a state directory the
            # simulated cluster died with that worker, and its pods with it.
            self._pod_log.end_vanished(self.clock(), lambda d, pod: (d, pod) in here)
        now = self.clock()
        for node in self._nodes.values():
            if not node.alive and node.recover_at is not None:
                self._spawn(self._recover_at(node.name, node.recover_at))
        for pod in sorted(self._pods.values(), key=lambda p: p.created):
            if pod.node is None or pod.terminal:
                continue
            if pod.node not in self._nodes or not self._nodes[pod.node].alive:
                # The node went away (or the fleet file no longer has it) while no worker
                # watched: the pod went with it.
                pod.holds = False
                self._emit(pod, _K.NODE_LOST, message=f"node {pod.node} was lost")
                self._ended(pod, str(_K.NODE_LOST), now)
                continue
            pod.task = asyncio.get_running_loop().create_task(self._run(pod))
        self._bind_pending()
        self._changed()
        self._persist()

    async def close(self) -> None:
        """Stop every simulated pod's clock (the state file keeps them for a successor)."""
        tasks = [p.task for p in self._pods.values() if p.task is not None]
        tasks += list(self._background)
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self._pod_log is not None:
            self._pod_log.close()

    # --- pods ---------------------------------------------------------------------------

    async def create_pods(
        self, req: DispatchRequest, *, dispatch: str = "", adopt_only: bool = False
    ) -> list[str]:
        """Create the action's pods; pods that already exist by name are adopted.

        A pod of the same name that another dispatch created is stale (its dispatch is
        over): it is removed and this dispatch's pod created. With ``adopt_only``
        nothing is created at all. Pods are named for the tenant and the action
        (``pod_name``); a dispatch whose pods a worker named before that keeps them.
        """
        names = self._names(req, dispatch, adopt_only)
        if adopt_only:
            return names
        target = self._fault_target(req, names)
        now = self.clock()
        record = self._record(req, dispatch, now) if dispatch else None
        for spec, name in zip(req.pods, names, strict=True):
            existing = self._pods.get(name)
            if existing is not None:
                if not (dispatch and existing.dispatch and existing.dispatch != dispatch):
                    continue
                self._remove(existing, now)
            self._created += 1
            pod = _SimPod(
                name=name,
                action_id=req.action_id,
                namespace=req.namespace,
                spec=spec,
                created=self._created,
                inject=_fault_of(req.inject, spec) if name == target else None,
                duration_s=req.duration_s if req.duration_s is not None else DEFAULT_DURATION_S,
                workflow_id=req.workflow_id,
                dispatch=dispatch,
                created_at=now,
                tenant=req.tenant,
            )
            self._pods[name] = pod
            if record is not None:
                record.pods[name] = PodRecord(name)
            self._log("created", pod, now)
        self._bind_pending()
        # Written before create_pods returns and before any pod's clock ticks: once the
        # caller can know of a pod, a restarted worker knows of it too.
        self._persist()
        return names

    def _names(self, req: DispatchRequest, dispatch: str, adopt_only: bool) -> list[str]:
        """The names of the action's pods: the tenant's, unless this dispatch's pods
        exist under the names given before tenants were part of names (state an earlier
        worker kept): those are adopted by them. Another dispatch's pod of such a name
        is stale and is removed (not when only adopting: nothing changes then)."""
        legacy = [pod_name(req.action_id, spec.role, spec.index) for spec in req.pods]
        found = [
            pod
            for name in legacy
            if (pod := self._pods.get(name)) is not None
            and pod.action_id == req.action_id
            and pod.tenant in ("", req.tenant)
        ]
        ours = [p for p in found if not dispatch or not p.dispatch or p.dispatch == dispatch]
        if not adopt_only:
            now = self.clock()
            for stale in (p for p in found if p not in ours):
                self._remove(stale, now)
        if ours:
            return legacy
        return [pod_name(req.action_id, s.role, s.index, req.tenant) for s in req.pods]

    def _record(self, req: DispatchRequest, dispatch: str, now: float) -> _Record:
        record = self._records.get(dispatch)
        if record is None:
            record = _Record(req.action_id, req.workflow_id, req.namespace, now, tenant=req.tenant)
            self._records[dispatch] = record
        return record

    async def delete_pods(
        self, action_id: str, namespace: str = "default", *, tenant: str = ""
    ) -> int:
        """Delete ``tenant``'s action's pods (running or not; any tenant's when empty,
        and pods of state kept before tenants were); idempotent."""
        doomed = [
            p
            for p in self._pods.values()
            if p.action_id == action_id and (not tenant or p.tenant in ("", tenant))
        ]
        now = self.clock()
        for pod in doomed:
            self._remove(pod, now)
        if doomed:
            self._changed()
            self._bind_pending()
        self._persist()
        return len(doomed)

    def _remove(self, pod: _SimPod, now: float) -> None:
        del self._pods[pod.name]
        if pod.task is not None and pod.task is not asyncio.current_task():
            pod.task.cancel()
        pod.holds = False
        if not pod.ended:
            outcome = str(pod.last.kind) if pod.terminal and pod.last is not None else "Deleted"
            self._ended(pod, outcome, now)

    async def dispatch_record(self, action_id: str, dispatch: str) -> dict[str, PodRecord]:
        """What ``dispatch`` created here (kept in the state file when there is one)."""
        record = self._records.get(dispatch)
        if record is None or record.action_id != action_id:
            return {}
        return {name: dataclasses.replace(r) for name, r in record.pods.items()}

    async def live_pods(self, action_id: str, dispatch: str = "") -> dict[str, str | None]:
        """The action's pods that exist (name -> node); only ``dispatch``'s when given."""
        return {
            p.name: p.node
            for p in self._pods.values()
            if p.action_id == action_id
            and (not dispatch or not p.dispatch or p.dispatch == dispatch)
        }

    async def node_exists(self, node: str) -> bool | None:
        """Whether the node is part of the cluster and up."""
        n = self._nodes.get(node)
        return n is not None and n.alive

    async def headway_pods(self) -> list[HeadwayPods]:
        """Every action with pods or a dispatch record here."""
        found: dict[tuple[str, str], HeadwayPods] = {}
        for p in self._pods.values():
            found.setdefault(
                (p.action_id, p.tenant),
                HeadwayPods(p.action_id, p.workflow_id, p.namespace, tenant=p.tenant),
            )
        pods_of = {h.workflow_id for h in found.values()}
        for r in self._records.values():
            if r.workflow_id not in pods_of:
                found.setdefault(
                    (r.action_id, r.tenant),
                    HeadwayPods(r.action_id, r.workflow_id, r.namespace, tenant=r.tenant),
                )
        return [found[k] for k in sorted(found)]

    def forget(self, action_id: str, *, tenant: str = "") -> None:
        """Drop the dispatch records of ``tenant``'s ended action (any tenant's when
        empty, and records kept before tenants were)."""
        for key in [
            k
            for k, r in self._records.items()
            if r.action_id == action_id and (not tenant or r.tenant in ("", tenant))
        ]:
            del self._records[key]
        self._persist()

    @property
    def created_count(self) -> int:
        """How many pods this cluster ever created (adoption does not count)."""
        return self._created

    def pods(self, action_id: str | None = None) -> dict[str, str | None]:
        """Pod name -> node name (None while pending), for demos and tests."""
        return {
            p.name: p.node
            for p in self._pods.values()
            if action_id is None or p.action_id == action_id
        }

    # --- faults -------------------------------------------------------------------------

    def kill_node(self, node: str, *, recover_after_s: float | None = None) -> list[str]:
        """Lose ``node``: its pods end NodeLost and it leaves the capacity report.

        Args:
            node: Node name (``<group>-<index>``).
            recover_after_s: Bring it back after this many (simulated) seconds; None
                keeps it down until :meth:`restore_node`.

        Returns:
            The names of the pods that were lost.

        Raises:
            KeyError: No node of that name (the message names it).
        """
        n = self._nodes.get(node)
        if n is None:
            raise KeyError(f"node: {node!r} is not a node of cluster {self.name}")
        n.alive = False
        now = self.clock()
        n.recover_at = (
            now + recover_after_s * self.time_scale if recover_after_s is not None else None
        )
        lost = [p for p in self._pods.values() if p.node == node and not p.terminal]
        for pod in lost:
            if pod.task is not None and pod.task is not asyncio.current_task():
                pod.task.cancel()
            pod.holds = False
            self._emit(pod, _K.NODE_LOST, message=f"node {node} was lost")
            self._ended(pod, str(_K.NODE_LOST), now)
        self._changed()
        if n.recover_at is not None:
            self._spawn(self._recover_at(node, n.recover_at))
        self._persist()
        return [p.name for p in lost]

    def restore_node(self, node: str) -> None:
        """Bring a lost node back (empty) and bind pending pods onto it."""
        n = self._nodes.get(node)
        if n is None:
            raise KeyError(f"node: {node!r} is not a node of cluster {self.name}")
        n.alive = True
        n.recover_at = None
        self._changed()
        self._bind_pending()
        self._persist()

    def _node(self, node: str) -> _Node:
        n = self._nodes.get(node)
        if n is None:
            raise KeyError(f"node: {node!r} is not a node of cluster {self.name}")
        return n

    def _marked(self) -> None:
        self._changed()
        self._bind_pending()
        self._persist()

    def cordon(self, node: str, cordoned: bool = True) -> None:
        """Cordon ``node`` (``kubectl cordon``): its pods run on, no new pod binds there,
        and nothing on it counts as free. ``cordoned=False`` uncordons it."""
        self._node(node).cordoned = cordoned
        self._marked()

    def taint(self, node: str, key: str, value: str = "", effect: str = "NoSchedule") -> None:
        """Taint ``node`` (``kubectl taint``): Headway's pods tolerate no taint, so a
        ``NoSchedule`` or ``NoExecute`` one keeps them off it (pods bound before run on)."""
        n = self._node(node)
        n.taints = [t for t in n.taints if t.get("key") != key]
        n.taints.append({"key": key, "value": value, "effect": effect})
        self._marked()

    def untaint(self, node: str, key: str) -> None:
        """Remove every taint of ``key`` from ``node``."""
        n = self._node(node)
        n.taints = [t for t in n.taints if t.get("key") != key]
        self._marked()

    def set_ready(self, node: str, ready: bool) -> None:
        """Mark ``node`` NotReady (``ready=False``: no new pods bind) or Ready again."""
        self._node(node).ready = ready
        self._marked()

    async def live_view(
        self, req: DispatchRequest
    ) -> tuple[list[NodeCapacity], list[PodSpec]] | None:
        """The arbiter's view: free per live node (nothing on a cordoned, tainted or
        NotReady one), and pods created but not bound (none wait for long here: a pod
        that fits binds as it is created). None when the cluster reports no capacity."""
        if not self.spec.reports_capacity:
            return None
        report = await self.capacity()
        pending = [p.spec for p in self._pods.values() if p.node is None and not p.terminal]
        return list(report.nodes or []), pending

    def preempt(self, name: str) -> bool:
        """Preempt one pod by name, or every running pod of an action by action id."""
        victims = [
            p
            for p in self._pods.values()
            if (p.name == name or p.action_id == name) and p.node is not None and not p.terminal
        ]
        for pod in victims:
            if pod.task is not None and pod.task is not asyncio.current_task():
                pod.task.cancel()
            self._end(pod, _K.PREEMPTED, message="preempted by a higher-priority pod")
        self._persist()
        return bool(victims)

    def _spawn(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _recover_at(self, node: str, at: float) -> None:
        await self._until(at)
        self.restore_node(node)

    async def _until(self, deadline: float) -> None:
        await asyncio.sleep(max(0.0, deadline - self.clock()))

    @staticmethod
    def _fault_target(req: DispatchRequest, names: list[str]) -> str | None:
        if not req.inject or not req.pods:
            return None
        if req.inject.startswith(OOM_BELOW):
            parse_memory(req.inject.removeprefix(OOM_BELOW), "inject")
        elif req.inject not in INJECTABLE_FAULTS:
            raise ValueError(
                f"inject: {req.inject!r} is not a fault (one of {', '.join(sorted(INJECTABLE_FAULTS))})"
            )
        return names[0]

    # --- events -------------------------------------------------------------------------

    def subscribe(self) -> contextlib.AbstractContextManager[asyncio.Queue[ActionEvent]]:
        """A queue of every event published while the context is open."""
        return self._hub.subscribe()

    def events(self) -> AsyncIterator[ActionEvent]:
        """Every event, for all actions, from now on."""
        return self._hub.stream()

    async def current_events(self, action_id: str) -> list[ActionEvent]:
        """The latest event of each of the action's pods."""
        return [
            p.last for p in self._pods.values() if p.action_id == action_id and p.last is not None
        ]

    # --- capacity -----------------------------------------------------------------------

    def _free(self) -> dict[str, Pod]:
        used: dict[str, list[int]] = {n: [0, 0, 0, 0] for n in self._nodes}
        for pod in self._pods.values():
            if pod.node is not None and pod.holds and pod.node in used:
                u = used[pod.node]
                u[0] += pod.spec.cpu_m
                u[1] += pod.spec.memory
                u[2] += pod.spec.ephemeral_storage
                u[3] += pod.spec.gpu
        # A node that takes no new pods (cordoned, tainted, NotReady) has nothing free.
        return {
            name: Pod(
                n.shape.cpu - used[name][0],
                n.shape.memory - used[name][1],
                n.shape.eph - used[name][2],
                n.shape.gpu - used[name][3],
                n.shape.gpu_type,
            )
            if not n.unusable()
            else Pod(0, 0, 0, 0, n.shape.gpu_type)
            for name, n in self._nodes.items()
            if n.alive
        }

    async def capacity(self) -> CapacityReport:
        """Allocatable and free per live node, exactly from the simulated bindings."""
        self._sequence += 1
        now = self.clock()
        if not self.spec.reports_capacity:
            return CapacityReport(self.name, None, [], self._sequence, now)
        free = self._free()
        nodes = [
            NodeCapacity(
                name=name,
                cpu_m=n.shape.cpu,
                memory=n.shape.memory,
                ephemeral_storage=n.shape.eph,
                gpu=n.shape.gpu,
                gpu_type=n.shape.gpu_type,
                free_cpu_m=free[name].cpu,
                free_memory=free[name].memory,
                free_ephemeral_storage=free[name].eph,
                free_gpu=free[name].gpu,
                unusable=n.unusable(),
            )
            for name, n in self._nodes.items()
            if n.alive
        ]
        # An action is reflected only when every live pod of it is counted on a node: a
        # half-bound gang is left to the scheduler's own reservation, which over-counts
        # rather than under-counts.
        live: dict[tuple[str, str], bool] = {}
        for pod in self._pods.values():
            if pod.terminal and not pod.holds:
                continue
            key = (pod.tenant, pod.action_id)
            live[key] = live.get(key, True) and pod.holds
        reflected = sorted((a, t) for (t, a), ok in live.items() if ok)
        return CapacityReport(
            self.name,
            nodes,
            [a for a, _ in reflected],
            self._sequence,
            now,
            reflected_tenants=[t for _, t in reflected],
        )

    async def wait_capacity_change(self, since: int) -> int:
        """Block until a bind, an end or a node change after version ``since``."""
        return await self._changes.wait(since)

    # --- internals ----------------------------------------------------------------------

    def _changed(self) -> None:
        self._changes.bump()

    def _emit(
        self,
        pod: _SimPod,
        kind: ActionEventKind,
        *,
        exit_code: int | None = None,
        message: str = "",
        output: str | None = None,
    ) -> None:
        event = ActionEvent(
            action_id=pod.action_id,
            kind=kind,
            cluster=self.name,
            pod=pod.name,
            node=pod.node,
            exit_code=exit_code,
            message=message,
            observed_at=self.clock(),
            output=output,
        )
        pod.last = event
        if kind in TERMINAL_EVENTS:
            rec = self._pod_record(pod)
            if rec is not None and rec.outcome is None:
                rec.outcome = kind
        self._hub.publish(event)

    def _pod_record(self, pod: _SimPod) -> PodRecord | None:
        record = self._records.get(pod.dispatch) if pod.dispatch else None
        return record.pods.get(pod.name) if record is not None else None

    def _end(
        self,
        pod: _SimPod,
        kind: ActionEventKind,
        *,
        exit_code: int | None = None,
        message: str = "",
        keep_holding: bool = False,
        output: str | None = None,
    ) -> None:
        pod.holds = keep_holding
        self._emit(pod, kind, exit_code=exit_code, message=message, output=output)
        if not keep_holding:
            self._ended(pod, str(kind), self.clock())
        self._changed()
        if not keep_holding:
            self._bind_pending()

    def _ended(self, pod: _SimPod, outcome: str, now: float) -> None:
        if not pod.ended:
            pod.ended = True
            self._log("ended", pod, now, outcome=outcome)

    def _log(self, event: str, pod: _SimPod, t: float, outcome: str | None = None) -> None:
        if self._pod_log is not None:
            self._outbox.append(
                {
                    "event": event,
                    "t": t,
                    "action": pod.action_id,
                    "pod": pod.name,
                    "node": pod.node,
                    "spec": dataclasses.asdict(pod.spec),
                    "dispatch": pod.dispatch,
                    "outcome": outcome,
                }
            )

    def _bind_pending(self) -> None:
        """Bind every pending pod that fits, oldest first (like the kube-scheduler queue)."""
        free = self._free()
        bound = False
        pending = sorted(
            (p for p in self._pods.values() if p.node is None and not p.terminal),
            key=lambda p: p.created,
        )
        now = self.clock()
        for pod in pending:
            node = self._best_fit(pod.spec, free)
            if node is None:
                message = self._unschedulable_message(pod.spec, free)
                if pod.last is None or pod.last.message != message:
                    self._emit(pod, _K.UNSCHEDULABLE, message=message)
                continue
            f = free[node.name]
            free[node.name] = Pod(
                f.cpu - pod.spec.cpu_m,
                f.memory - pod.spec.memory,
                f.eph - pod.spec.ephemeral_storage,
                f.gpu - pod.spec.gpu,
                f.gpu_type,
            )
            pod.node = node.name
            pod.holds = True
            bound = True
            scale = self.time_scale
            pod.bound_at = now
            pod.running_at = now + self.startup_s * scale
            runs = pod.duration_s * scale
            if pod.inject in ("oom", "preempt", "node-lost", "fail"):
                runs /= 2
            pod.ends_at = pod.running_at + runs
            rec = self._pod_record(pod)
            if rec is not None:
                rec.node = node.name
            self._log("bound", pod, now)
            self._emit(pod, _K.SCHEDULED, message=f"bound to {node.name}")
            pod.task = asyncio.get_running_loop().create_task(self._run(pod))
        if bound:
            self._changed()

    def _best_fit(self, spec: PodSpec, free: dict[str, Pod]) -> _Node | None:
        # Least free GPU, then least free CPU, then node order: keeps big nodes whole for
        # the big pods still to come, as the scheduler's projection assumes.
        candidates = [
            self._nodes[name]
            for name, f in free.items()
            if not self._nodes[name].unusable() and _fits(spec, self._nodes[name], f)
        ]
        if not candidates:
            return None
        return min(candidates, key=lambda n: (free[n.name].gpu, free[n.name].cpu, n.order))

    def _unschedulable_message(self, spec: PodSpec, free: dict[str, Pod]) -> str:
        # Same shape as the kube-scheduler's FailedScheduling message, so operators read
        # one format whichever backend they run.
        reasons: dict[str, int] = {}
        for name, f in free.items():
            node = self._nodes[name]
            if node.unusable():
                reasons[node.unusable()] = reasons.get(node.unusable(), 0) + 1
                continue
            if spec.gpu and spec.gpu_type is not None and node.shape.gpu_type != spec.gpu_type:
                key = "node(s) didn't match Pod's node affinity/selector"
                reasons[key] = reasons.get(key, 0) + 1
                continue
            for want, have, what in (
                (spec.cpu_m, f.cpu, "Insufficient cpu"),
                (spec.memory, f.memory, "Insufficient memory"),
                (spec.ephemeral_storage, f.eph, "Insufficient ephemeral-storage"),
                (spec.gpu, f.gpu, "Insufficient nvidia.com/gpu"),
            ):
                if want > have:
                    reasons[what] = reasons.get(what, 0) + 1
        detail = ", ".join(f"{n} {r}" for r, n in sorted(reasons.items()))
        return (
            f"0/{len(free)} nodes are available: {detail}."
            if detail
            else (f"0/{len(free)} nodes are available.")
        )

    async def _run(self, pod: _SimPod) -> None:
        # Deadlines, not durations: a pod resumed by a restarted worker runs only what is
        # left of its time, and one that should have ended meanwhile ends at once.
        assert pod.running_at is not None and pod.ends_at is not None
        await self._until(pod.running_at)
        if pod.inject == "image-pull":
            # A pod that cannot pull stays bound and Pending, holding its requests until
            # someone deletes it, exactly as on Kubernetes.
            self._end(
                pod,
                _K.IMAGE_PULL_FAILED,
                message=f'Back-off pulling image "{pod.spec.image}"',
                keep_holding=True,
            )
            self._persist()
            return
        resumed = pod.last is not None and pod.last.kind is _K.RUNNING
        if not resumed:
            self._emit(pod, _K.RUNNING)
            self._persist()
        if is_task_command(pod.spec.command):
            await self._run_task(pod, resumed=resumed)
            self._persist()
            return
        await self._until(pod.ends_at)
        if pod.inject == "oom":
            self._end(pod, _K.OOM_KILLED, exit_code=137, message="OOMKilled")
        elif pod.inject == "fail":
            self._end(pod, _K.FAILED, exit_code=1, message="Error")
        elif pod.inject == "preempt":
            self._end(pod, _K.PREEMPTED, message="preempted by a higher-priority pod")
        elif pod.inject == "node-lost":
            assert pod.node is not None
            self.kill_node(pod.node, recover_after_s=self.node_recovery_s)
        else:
            self._end(pod, _K.SUCCEEDED, exit_code=0, message="Completed")
        self._persist()

    def _task_files(self, pod: _SimPod) -> tuple[Path, Path]:
        base = self._task_dir / sanitize_dns1123(pod.name)
        return base.with_suffix(".json"), base.with_suffix(".log")

    async def _run_task(self, pod: _SimPod, *, resumed: bool) -> None:
        """Run an SDK task's pod as a real process (see ``sim_task``); never twice: a
        pod resumed by a restarted worker ends with what its process wrote, or PodLost."""
        output, log_file = self._task_files(pod)
        if resumed:
            if output.exists():
                done = outcome_of(0, output, log_file)
            else:
                self._end(
                    pod,
                    _K.POD_LOST,
                    message="PodLost: its task process went with an earlier worker (not run again)",
                )
                return
        else:
            gang = sorted(
                (
                    p
                    for p in self._pods.values()
                    if (p.tenant, p.action_id) == (pod.tenant, pod.action_id)
                ),
                key=lambda p: p.spec.index,
            )
            env = {
                **pod.spec.env,
                "HEADWAY_ACTION_ID": pod.action_id,
                "HEADWAY_POD": pod.name,
                "HEADWAY_CLUSTER": self.name,
                "RANK": str(pod.spec.index),
                "LOCAL_RANK": "0",
                "WORLD_SIZE": str(len(gang)),
                "MASTER_ADDR": "127.0.0.1",
                "MASTER_PORT": str(
                    master_port(f"{pod.tenant}/{pod.action_id}" if pod.tenant else pod.action_id)
                ),
            }
            done = await run_task_process(pod.spec.command, env, output, log_file)
        if done.ok:
            self._end(pod, _K.SUCCEEDED, exit_code=0, message=done.message, output=done.document)
        else:
            self._end(
                pod,
                _K.FAILED,
                exit_code=done.exit_code,
                message=done.message,
                output=done.document,
            )

    # --- durable state ------------------------------------------------------------------

    def _persist(self) -> None:
        """Write the state file (when there is one), then the pod-log lines it implies."""
        if self.state_path is not None:
            self._prune_records()
            self._write_state()
        if self._pod_log is not None and self._outbox:
            for line in self._outbox:
                self._pod_log.append(
                    line["event"],
                    t=line["t"],
                    action=line["action"],
                    pod=line["pod"],
                    node=line["node"],
                    spec=PodSpec(**line["spec"]),
                    dispatch=line["dispatch"],
                    outcome=line["outcome"],
                )
            self._outbox.clear()

    def _prune_records(self) -> None:
        horizon = self.clock() - self.record_ttl_s
        live = {p.action_id for p in self._pods.values()}
        for key in [
            k for k, r in self._records.items() if r.at < horizon and r.action_id not in live
        ]:
            del self._records[key]

    def _state(self) -> dict[str, Any]:
        return {
            "version": STATE_VERSION,
            "cluster": self.name,
            "created": self._created,
            "nodes": {
                n.name: {
                    "alive": n.alive,
                    "recover_at": n.recover_at,
                    "cordoned": n.cordoned,
                    "taints": n.taints,
                    "ready": n.ready,
                }
                for n in self._nodes.values()
                if n.marked()
            },
            "pods": [
                {
                    "name": p.name,
                    "action_id": p.action_id,
                    "namespace": p.namespace,
                    "spec": dataclasses.asdict(p.spec),
                    "created": p.created,
                    "inject": p.inject,
                    "duration_s": p.duration_s,
                    "workflow_id": p.workflow_id,
                    "dispatch": p.dispatch,
                    "created_at": p.created_at,
                    "tenant": p.tenant,
                    "node": p.node,
                    "last": _event_to_json(p.last) if p.last is not None else None,
                    "holds": p.holds,
                    "ended": p.ended,
                    "bound_at": p.bound_at,
                    "running_at": p.running_at,
                    "ends_at": p.ends_at,
                }
                for p in self._pods.values()
            ],
            "records": {
                key: {
                    "action_id": r.action_id,
                    "workflow_id": r.workflow_id,
                    "namespace": r.namespace,
                    "tenant": r.tenant,
                    "at": r.at,
                    "pods": {
                        name: {"node": pr.node, "outcome": str(pr.outcome) if pr.outcome else None}
                        for name, pr in r.pods.items()
                    },
                }
                for key, r in self._records.items()
            },
            "outbox": self._outbox,
        }

    def _write_state(self) -> None:
        assert self.state_path is not None
        data = json.dumps(self._state(), separators=(",", ":")).encode()
        directory = self.state_path.parent
        fd, tmp = tempfile.mkstemp(prefix=f".{self.state_path.name}.", dir=directory)
        try:
            os.fchmod(fd, 0o644)  # readable like the pod log, for whoever audits a run
            with os.fdopen(fd, "wb") as fh:
                fh.write(data)
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, self.state_path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
        # The rename itself must be durable too, or a crash could bring the old file back.
        dfd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)

    def _load(self) -> None:
        assert self.state_path is not None
        path = self.state_path
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            raw = path.read_bytes()
        except FileNotFoundError:
            return
        except OSError as exc:
            raise ValueError(f"state_dir: cannot use {str(path.parent)!r}: {exc.strerror}") from exc
        try:
            state = json.loads(raw)
            if not isinstance(state, dict):
                raise ValueError("not a JSON object")
            if state.get("version") != STATE_VERSION:
                raise ValueError(
                    f"version {state.get('version')!r} is not {STATE_VERSION} (written by"
                    " another Headway release)"
                )
            if state.get("cluster") != self.name:
                raise ValueError(f"it is cluster {state.get('cluster')!r}'s, not {self.name!r}")
            self._created = int(state.get("created", 0))
            for name, n in (state.get("nodes") or {}).items():
                if name in self._nodes:
                    node = self._nodes[name]
                    node.alive = bool(n["alive"])
                    node.recover_at = n.get("recover_at")
                    node.cordoned = bool(n.get("cordoned", False))
                    node.taints = list(n.get("taints") or [])
                    node.ready = bool(n.get("ready", True))
            for p in state.get("pods") or []:
                pod = _SimPod(
                    name=p["name"],
                    action_id=p["action_id"],
                    namespace=p["namespace"],
                    spec=PodSpec(**p["spec"]),
                    created=int(p["created"]),
                    inject=p.get("inject"),
                    duration_s=float(p["duration_s"]),
                    workflow_id=p.get("workflow_id", ""),
                    dispatch=p.get("dispatch", ""),
                    created_at=float(p.get("created_at", 0.0)),
                    tenant=str(p.get("tenant", "")),
                    node=p.get("node"),
                    last=_event_from_json(p["last"]) if p.get("last") else None,
                    holds=bool(p.get("holds")),
                    ended=bool(p.get("ended")),
                    bound_at=p.get("bound_at"),
                    running_at=p.get("running_at"),
                    ends_at=p.get("ends_at"),
                )
                self._pods[pod.name] = pod
            for key, r in (state.get("records") or {}).items():
                self._records[key] = _Record(
                    r["action_id"],
                    r.get("workflow_id", ""),
                    r.get("namespace", "default"),
                    float(r["at"]),
                    {
                        name: PodRecord(
                            name,
                            pr.get("node"),
                            ActionEventKind(pr["outcome"]) if pr.get("outcome") else None,
                        )
                        for name, pr in (r.get("pods") or {}).items()
                    },
                    tenant=str(r.get("tenant", "")),
                )
            self._outbox = list(state.get("outbox") or [])
        except (ValueError, KeyError, TypeError) as exc:
            # Starting empty would forget running pods and let a retry create them again:
            # refuse, and say which file to look at.
            raise ValueError(f"state_dir: cannot resume from {path}: {exc}") from exc


def _fault_of(inject: str | None, spec: PodSpec) -> str | None:
    """The fault a pod of ``spec`` suffers under ``inject`` (``oom-below:`` decided by
    the pod's memory request)."""
    if inject is not None and inject.startswith(OOM_BELOW):
        need = parse_memory(inject.removeprefix(OOM_BELOW), "inject")
        return "oom" if spec.memory < need else None
    return inject
