"""The scheduler's vocabulary: queues, org limits, clusters, environments and actions.

These are plain immutable specs. The mutable state the pass works on lives in
``scheduler.core``. Every spec round-trips through ``to_dict``/``from_dict`` (plain JSON
types) so the scheduler workflow can carry it across continue-as-new.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from enum import IntEnum, StrEnum
from typing import Any

from .resources import Pod, Quota

__all__ = [
    "ActionSpec",
    "Algorithm",
    "ClusterSpec",
    "DemandKind",
    "EnvironmentSpec",
    "NodeGroup",
    "OrgLimits",
    "Priority",
    "QueueSpec",
    "QueueStatus",
    "RateLimit",
    "ray_demand",
    "replicas_demand",
    "spark_demand",
]


class Priority(IntEnum):
    """Named priority levels; higher dispatches first and never preempts."""

    lowest = 0
    low = 1
    medium = 2
    high = 3
    critical = 4

    @classmethod
    def parse(cls, value: Any, field: str = "priority") -> Priority:
        if isinstance(value, Priority):
            return value
        if isinstance(value, str) and value.lower() in cls.__members__:
            return cls[value.lower()]
        raise ValueError(
            f"{field}: {value!r} is not a priority (one of {', '.join(cls.__members__)})"
        )


class Algorithm(StrEnum):
    """What a queue does when its head doesn't fit."""

    strict = "strict"
    greedy = "greedy"
    backfill = "backfill"
    easy = "easy"


class QueueStatus(StrEnum):
    active = "active"
    draining = "draining"
    drained = "drained"


class DemandKind(StrEnum):
    single = "single"
    replicas = "replicas"
    ray = "ray"
    spark = "spark"


@dataclass(frozen=True, slots=True)
class QueueSpec:
    """A named backlog with a policy attached. Absent knobs (None) are unlimited."""

    name: str
    priority: Priority = Priority.medium
    algorithm: Algorithm = Algorithm.backfill
    run_concurrency: int | None = None
    action_concurrency: int | None = None
    per_run_concurrency: int | None = None
    depth: int | None = None
    max_resources: Quota | None = None
    clusters: tuple[str, ...] | None = None  # None: any healthy cluster
    status: QueueStatus = QueueStatus.active

    def with_changes(self, **changes: Any) -> QueueSpec:
        return replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "priority": self.priority.name,
            "algorithm": self.algorithm.value,
            "run_concurrency": self.run_concurrency,
            "action_concurrency": self.action_concurrency,
            "per_run_concurrency": self.per_run_concurrency,
            "depth": self.depth,
            "max_resources": self.max_resources.to_dict() if self.max_resources else None,
            "clusters": list(self.clusters) if self.clusters is not None else None,
            "status": self.status.value,
        }

    @staticmethod
    def from_dict(d: Mapping[str, Any]) -> QueueSpec:
        mr = d.get("max_resources")
        cl = d.get("clusters")
        return QueueSpec(
            name=d["name"],
            priority=Priority.parse(d.get("priority", "medium")),
            algorithm=Algorithm(d.get("algorithm", "backfill")),
            run_concurrency=d.get("run_concurrency"),
            action_concurrency=d.get("action_concurrency"),
            per_run_concurrency=d.get("per_run_concurrency"),
            depth=d.get("depth"),
            max_resources=Quota.from_dict(mr) if mr else None,
            clusters=tuple(cl) if cl is not None else None,
            status=QueueStatus(d.get("status", "active")),
        )


@dataclass(frozen=True, slots=True)
class RateLimit:
    per_second: float
    burst: float


@dataclass(frozen=True, slots=True)
class OrgLimits:
    """The per-tenant safety envelope wrapping every queue. None is unlimited."""

    max_concurrent_runs: int | None = None
    max_concurrent_actions: int | None = None
    max_actions_per_run: int | None = None
    submit_rate: RateLimit | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "max_concurrent_runs": self.max_concurrent_runs,
            "max_concurrent_actions": self.max_concurrent_actions,
            "max_actions_per_run": self.max_actions_per_run,
            "submit_rate": (
                {"per_second": self.submit_rate.per_second, "burst": self.submit_rate.burst}
                if self.submit_rate
                else None
            ),
        }

    @staticmethod
    def from_dict(d: Mapping[str, Any] | None) -> OrgLimits:
        if not d:
            return OrgLimits()
        sr = d.get("submit_rate")
        return OrgLimits(
            d.get("max_concurrent_runs"),
            d.get("max_concurrent_actions"),
            d.get("max_actions_per_run"),
            RateLimit(float(sr["per_second"]), float(sr["burst"])) if sr else None,
        )


@dataclass(frozen=True, slots=True)
class NodeGroup:
    name: str
    count: int
    shape: Pod

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "count": self.count, "shape": self.shape.to_dict()}

    @staticmethod
    def from_dict(d: Mapping[str, Any]) -> NodeGroup:
        return NodeGroup(d["name"], int(d["count"]), Pod.from_dict(d["shape"]))


@dataclass(frozen=True, slots=True)
class ClusterSpec:
    """A cluster: node groups (shape x count), and whether it reports its capacity."""

    name: str
    node_groups: tuple[NodeGroup, ...] = ()
    reports_capacity: bool = True

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "node_groups": [g.to_dict() for g in self.node_groups],
            "reports_capacity": self.reports_capacity,
        }

    @staticmethod
    def from_dict(d: Mapping[str, Any]) -> ClusterSpec:
        return ClusterSpec(
            d["name"],
            tuple(NodeGroup.from_dict(g) for g in d.get("node_groups", ())),
            bool(d.get("reports_capacity", True)),
        )


@dataclass(frozen=True, slots=True)
class EnvironmentSpec:
    """A reusable environment (container pool, Ray cluster): placed once, counted once."""

    name: str
    resources: Pod
    replicas: int = 1
    concurrency: int = 1
    idle_ttl: float = 0.0

    @property
    def footprint(self) -> tuple[Pod, ...]:
        return (self.resources,) * self.replicas

    @property
    def slots(self) -> int:
        return self.replicas * self.concurrency

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "resources": self.resources.to_dict(),
            "replicas": self.replicas,
            "concurrency": self.concurrency,
            "idle_ttl": self.idle_ttl,
        }

    @staticmethod
    def from_dict(d: Mapping[str, Any]) -> EnvironmentSpec:
        return EnvironmentSpec(
            d["name"],
            Pod.from_dict(d["resources"]),
            int(d.get("replicas", 1)),
            int(d.get("concurrency", 1)),
            float(d.get("idle_ttl", 0.0)),
        )


@dataclass(frozen=True, slots=True)
class ActionSpec:
    """One action as enqueued: its demand is computed here, once, and carried with it.

    ``pods`` is the gang in declared order (Ray head / Spark driver first); a single pod
    is a gang of one. ``seq`` breaks ties between equal submit times (file order).
    """

    id: str
    queue: str
    pods: tuple[Pod, ...]
    run: str = ""
    task: str = ""
    submit: float = 0.0
    seq: int = 0
    estimate: float | None = None
    environment: str | None = None
    kind: DemandKind = DemandKind.single
    meta: Mapping[str, Any] = field(default_factory=dict)

    @property
    def run_id(self) -> str:
        return self.run or self.id

    @property
    def task_id(self) -> str:
        return self.task or self.id

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "queue": self.queue,
            "pods": [p.to_dict() for p in self.pods],
            "run": self.run,
            "task": self.task,
            "submit": self.submit,
            "seq": self.seq,
            "estimate": self.estimate,
            "environment": self.environment,
            "kind": self.kind.value,
            "meta": dict(self.meta),
        }

    @staticmethod
    def from_dict(d: Mapping[str, Any]) -> ActionSpec:
        return ActionSpec(
            id=d["id"],
            queue=d["queue"],
            pods=tuple(Pod.from_dict(p) for p in d["pods"]),
            run=d.get("run", ""),
            task=d.get("task", ""),
            submit=float(d.get("submit", 0.0)),
            seq=int(d.get("seq", 0)),
            estimate=d.get("estimate"),
            environment=d.get("environment"),
            kind=DemandKind(d.get("kind", "single")),
            meta=d.get("meta") or {},
        )


def replicas_demand(container: Pod, replicas: int) -> tuple[Pod, ...]:
    """Clustered training: replicas x container."""
    return (container,) * replicas


def ray_demand(head: Pod, worker_groups: Sequence[tuple[int, Pod]]) -> tuple[Pod, ...]:
    """A Ray cluster: the head plus every worker group at its replica count."""
    pods = [head]
    for n, pod in worker_groups:
        pods.extend([pod] * n)
    return tuple(pods)


def spark_demand(driver: Pod, executor: Pod, executors: int) -> tuple[Pod, ...]:
    """A Spark application: the driver plus its executors."""
    return (driver, *([executor] * executors))
