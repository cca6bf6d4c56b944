"""The embedded default backend: a simulated cluster built from a ``ClusterSpec``.

It behaves like a small Kubernetes cluster seen through informers: pods bind to nodes
(best fit), report Scheduled, Running and a terminal event, stay Pending with an
Unschedulable reason when nothing fits, and hold their requests on a node until they end.
Faults are injected per action (``DispatchRequest.inject``) or from the outside
(:meth:`SimBackend.kill_node`, :meth:`SimBackend.preempt`) so demos and tests can show
OOM kills, preemptions and lost nodes being attributed to the exact action.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

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
from headway.scheduler.resources import Pod

from .base import ChangeSignal, EventHub, pod_name

__all__ = ["DEFAULT_DURATION_S", "INJECTABLE_FAULTS", "SimBackend"]

#: How long a simulated pod runs when the request does not say.
DEFAULT_DURATION_S = 3.0
INJECTABLE_FAULTS = frozenset({"oom", "preempt", "node-lost", "image-pull", "fail"})

_K = ActionEventKind


@dataclass
class _Node:
    name: str
    shape: Pod
    order: int
    alive: bool = True


@dataclass
class _SimPod:
    name: str
    action_id: str
    namespace: str
    spec: PodSpec
    created: int  # creation order, so pending pods bind first-come first-served
    inject: str | None = None
    duration_s: float = DEFAULT_DURATION_S
    node: str | None = None
    last: ActionEvent | None = None
    holds: bool = False  # whether its requests count against its node
    task: asyncio.Task[None] | None = field(default=None, repr=False)

    @property
    def terminal(self) -> bool:
        return self.last is not None and self.last.kind in TERMINAL_EVENTS


def _fits(spec: PodSpec, node: _Node, free: Pod) -> bool:
    if spec.gpu and spec.gpu_type is not None and node.shape.gpu_type != spec.gpu_type:
        return False
    return (
        spec.cpu_m <= free.cpu
        and spec.memory <= free.memory
        and spec.ephemeral_storage <= free.eph
        and spec.gpu <= free.gpu
    )


class SimBackend:
    """A simulated cluster: nodes from ``spec.node_groups``, pods that run for a while.

    Args:
        spec: The cluster's node groups; ``reports_capacity=False`` makes every
            capacity report unknown (``nodes=None``).
        time_scale: Multiplies every simulated delay (0.01 makes a 3 s pod take 30 ms).
        clock: Wall clock for ``observed_at`` stamps.
        startup_s: Simulated image pull + container start, between Scheduled and Running.
        node_recovery_s: How long a node lost by injection stays away before it returns.
    """

    def __init__(
        self,
        spec: ClusterSpec,
        *,
        time_scale: float = 1.0,
        clock: Callable[[], float] = time.time,
        startup_s: float = 0.2,
        node_recovery_s: float = 5.0,
    ) -> None:
        self.name = spec.name
        self.spec = spec
        self.time_scale = time_scale
        self.clock = clock
        self.startup_s = startup_s
        self.node_recovery_s = node_recovery_s
        self._nodes: dict[str, _Node] = {}
        order = 0
        for group in spec.node_groups:
            for i in range(group.count):
                name = f"{group.name}-{i}"
                self._nodes[name] = _Node(name, group.shape, order)
                order += 1
        self._pods: dict[str, _SimPod] = {}
        self._created = 0
        self._hub = EventHub()
        self._changes = ChangeSignal()
        self._sequence = 0
        self._background: set[asyncio.Task[None]] = set()

    # --- lifecycle ----------------------------------------------------------------------

    async def start(self) -> None:
        """Nothing to connect to; present for the ClusterBackend protocol."""

    async def close(self) -> None:
        """Stop every simulated pod's clock."""
        tasks = [p.task for p in self._pods.values() if p.task is not None]
        tasks += list(self._background)
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task

    # --- pods ---------------------------------------------------------------------------

    async def create_pods(self, req: DispatchRequest) -> list[str]:
        """Create the action's pods; pods that already exist by name are adopted."""
        names: list[str] = []
        target = self._fault_target(req)
        for spec in req.pods:
            name = pod_name(req.action_id, spec.role, spec.index)
            names.append(name)
            if name in self._pods:
                continue
            self._created += 1
            self._pods[name] = _SimPod(
                name=name,
                action_id=req.action_id,
                namespace=req.namespace,
                spec=spec,
                created=self._created,
                inject=req.inject if name == target else None,
                duration_s=req.duration_s if req.duration_s is not None else DEFAULT_DURATION_S,
            )
        self._bind_pending()
        return names

    async def delete_pods(self, action_id: str, namespace: str = "default") -> int:
        """Delete the action's pods (running or not); idempotent."""
        doomed = [p for p in self._pods.values() if p.action_id == action_id]
        for pod in doomed:
            del self._pods[pod.name]
            if pod.task is not None and pod.task is not asyncio.current_task():
                pod.task.cancel()
        if doomed:
            self._changed()
        return len(doomed)

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
        """
        n = self._nodes[node]
        n.alive = False
        lost = [p for p in self._pods.values() if p.node == node and not p.terminal]
        for pod in lost:
            if pod.task is not None and pod.task is not asyncio.current_task():
                pod.task.cancel()
            pod.holds = False
            self._emit(pod, _K.NODE_LOST, message=f"node {node} was lost")
        self._changed()
        if recover_after_s is not None:
            task = asyncio.get_running_loop().create_task(self._recover(node, recover_after_s))
            self._background.add(task)
            task.add_done_callback(self._background.discard)
        return [p.name for p in lost]

    def restore_node(self, node: str) -> None:
        """Bring a lost node back (empty) and bind pending pods onto it."""
        self._nodes[node].alive = True
        self._changed()
        self._bind_pending()

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
        return bool(victims)

    async def _recover(self, node: str, after_s: float) -> None:
        await asyncio.sleep(after_s * self.time_scale)
        self.restore_node(node)

    @staticmethod
    def _fault_target(req: DispatchRequest) -> str | None:
        if not req.inject or not req.pods:
            return None
        if req.inject not in INJECTABLE_FAULTS:
            raise ValueError(
                f"inject: {req.inject!r} is not a fault (one of {', '.join(sorted(INJECTABLE_FAULTS))})"
            )
        first = req.pods[0]
        return pod_name(req.action_id, first.role, first.index)

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
            if pod.node is not None and pod.holds:
                u = used[pod.node]
                u[0] += pod.spec.cpu_m
                u[1] += pod.spec.memory
                u[2] += pod.spec.ephemeral_storage
                u[3] += pod.spec.gpu
        return {
            name: Pod(
                n.shape.cpu - used[name][0],
                n.shape.memory - used[name][1],
                n.shape.eph - used[name][2],
                n.shape.gpu - used[name][3],
                n.shape.gpu_type,
            )
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
            )
            for name, n in self._nodes.items()
            if n.alive
        ]
        # An action is reflected only when every live pod of it is counted on a node: a
        # half-bound gang is left to the scheduler's own reservation, which over-counts
        # rather than under-counts.
        live: dict[str, bool] = {}
        for pod in self._pods.values():
            if pod.terminal and not pod.holds:
                continue
            live[pod.action_id] = live.get(pod.action_id, True) and pod.holds
        reflected = sorted(a for a, ok in live.items() if ok)
        return CapacityReport(self.name, nodes, reflected, self._sequence, now)

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
        )
        pod.last = event
        self._hub.publish(event)

    def _end(
        self,
        pod: _SimPod,
        kind: ActionEventKind,
        *,
        exit_code: int | None = None,
        message: str = "",
        keep_holding: bool = False,
    ) -> None:
        pod.holds = keep_holding
        self._emit(pod, kind, exit_code=exit_code, message=message)
        self._changed()
        if not keep_holding:
            self._bind_pending()

    def _bind_pending(self) -> None:
        """Bind every pending pod that fits, oldest first (like the kube-scheduler queue)."""
        free = self._free()
        bound = False
        pending = sorted(
            (p for p in self._pods.values() if p.node is None and not p.terminal),
            key=lambda p: p.created,
        )
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
            self._emit(pod, _K.SCHEDULED, message=f"bound to {node.name}")
            pod.task = asyncio.get_running_loop().create_task(self._run(pod))
        if bound:
            self._changed()

    def _best_fit(self, spec: PodSpec, free: dict[str, Pod]) -> _Node | None:
        # Least free GPU, then least free CPU, then node order: keeps big nodes whole for
        # the big pods still to come, as the scheduler's projection assumes.
        candidates = [
            self._nodes[name] for name, f in free.items() if _fits(spec, self._nodes[name], f)
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
        scale = self.time_scale
        await asyncio.sleep(self.startup_s * scale)
        if pod.inject == "image-pull":
            # A pod that cannot pull stays bound and Pending, holding its requests until
            # someone deletes it, exactly as on Kubernetes.
            self._end(
                pod,
                _K.IMAGE_PULL_FAILED,
                message=f'Back-off pulling image "{pod.spec.image}"',
                keep_holding=True,
            )
            return
        self._emit(pod, _K.RUNNING)
        if pod.inject in ("oom", "preempt", "node-lost", "fail"):
            await asyncio.sleep(pod.duration_s * scale / 2)
            if pod.inject == "oom":
                self._end(pod, _K.OOM_KILLED, exit_code=137, message="OOMKilled")
            elif pod.inject == "fail":
                self._end(pod, _K.FAILED, exit_code=1, message="Error")
            elif pod.inject == "preempt":
                self._end(pod, _K.PREEMPTED, message="preempted by a higher-priority pod")
            else:
                assert pod.node is not None
                self.kill_node(pod.node, recover_after_s=self.node_recovery_s)
            return
        await asyncio.sleep(pod.duration_s * scale)
        self._end(pod, _K.SUCCEEDED, exit_code=0, message="Completed")
