"""The scheduler's vocabulary: queues, org limits, clusters, environments and actions.

These are plain immutable specs. The mutable state the pass works on lives in
``scheduler.core``. Every spec round-trips through ``to_dict``/``from_dict`` (plain JSON
types) so the scheduler workflow can carry it across continue-as-new.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from enum import IntEnum, StrEnum
from typing import Any

from .resources import Pod, Quota, parse_memory

__all__ = [
    "LIMIT_KNOBS",
    "MAX_LIMIT",
    "QUEUE_KNOBS",
    "ActionSpec",
    "Algorithm",
    "ClusterSpec",
    "DemandKind",
    "EnvironmentSpec",
    "Knob",
    "KnobKind",
    "NodeGroup",
    "OrgLimits",
    "Priority",
    "QueueSpec",
    "QueueStatus",
    "RateLimit",
    "RetryPolicy",
    "check_count",
    "check_limits",
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


_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def parse_seconds(value: Any, field: str) -> float:
    """A duration: a non-negative number of seconds, or text such as ``90``, ``90s``,
    ``10m``, ``2h``, ``1d``. ValueError names ``field`` and the value."""
    v: Any = value
    if isinstance(value, str):
        text = value.strip().lower()
        unit = _UNITS.get(text[-1:]) if text else None
        try:
            v = float(text[:-1] if unit is not None else text) * (unit or 1.0)
        except ValueError:
            raise ValueError(
                f"{field}: {value!r} is not a duration (seconds, or e.g. 90s, 10m, 2h, 1d)"
            ) from None
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
        raise ValueError(f"{field}: {value!r} is not a duration (seconds, or e.g. 90s, 10m, 2h)")
    if v < 0:
        raise ValueError(f"{field}: {value!r} must be >= 0")
    return float(v)


#: The largest concurrency limit, depth or retry count: past it, 'unlimited' is meant.
#: Checked wherever one enters (the CLI, files, the scheduler workflow's own validation):
#: the store keeps them as 64-bit integers, and a larger one, once applied, failed its
#: write on every retry and wedged the tenant's scheduler.
MAX_LIMIT = 1_000_000_000


def check_count(value: Any, field: str) -> int:
    """``value`` if it is a whole number from 0 to :data:`MAX_LIMIT`; else ValueError
    naming ``field`` and the value."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{field}: {value!r} must be a non-negative integer")
    if value > MAX_LIMIT:
        shown = str(value) if len(str(value)) <= 30 else f"{str(value)[:27]}..."
        raise ValueError(
            f"{field}: {shown} is more than {MAX_LIMIT:,} (use 'unlimited' for no limit)"
        )
    return value


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """What a queue does when one of its actions fails, by failure class (issue #23).

    Every attempt after the first is a new lease for the same action (its id suffixed
    ``~N``, see ``headway.workflows.action``), admitted by the same pass as any other,
    with the action's first submit time, so it waits at the head of its queue. The
    defaults retry nothing: a queue opts in (``headway update queue Q --retry-oom 2``).

    Attributes:
        oom: retries after ``OOMKilled``; each raises every pod's memory by
            ``oom_factor``, up to ``oom_max_memory`` bytes (None: no cap but the retries).
        lost: requeues after the work was lost through no fault of its own
            (``Preempted``, ``Evicted``, ``NodeLost``, ``PodLost``): at the head at once.
        failed: retries after an application failure (non-zero exit), the first after
            ``backoff`` seconds, each next one after twice the last.
        ready_timeout: seconds after its dispatch by which every pod of an attempt must
            run (None: no limit); past it the pods are deleted, the reservation released
            and the attempt ends ``NotReady`` with the latest Kubernetes message.
        not_ready: retries after ``NotReady``, after ``backoff`` as ``failed``.
    """

    oom: int = 0
    oom_factor: float = 2.0
    oom_max_memory: int | None = None
    lost: int = 0
    failed: int = 0
    backoff: float = 30.0
    ready_timeout: float | None = None
    not_ready: int = 2

    def to_dict(self) -> dict[str, Any]:
        return {
            "oom": self.oom,
            "oom_factor": self.oom_factor,
            "oom_max_memory": self.oom_max_memory,
            "lost": self.lost,
            "failed": self.failed,
            "backoff": self.backoff,
            "ready_timeout": self.ready_timeout,
            "not_ready": self.not_ready,
        }

    @staticmethod
    def parse(value: Any, field: str = "retry") -> RetryPolicy:
        """A policy from its JSON or file form (memory as bytes or ``64Gi``, backoff as
        seconds or ``30s``); keys left out keep their defaults, None is the default policy.
        ValueError names ``field.key`` and the value."""
        if value is None:
            return RetryPolicy()
        if isinstance(value, RetryPolicy):
            return value
        if not isinstance(value, Mapping):
            raise ValueError(f"{field}: {value!r} is not a mapping of retry settings")
        known = RetryPolicy().to_dict()
        unknown = sorted(str(k) for k in value if k not in known)
        if unknown:
            raise ValueError(
                f"{field}.{unknown[0]}: not a retry setting (one of {', '.join(known)})"
            )
        out: dict[str, Any] = {}
        for key in ("oom", "lost", "failed", "not_ready"):
            if key in value:
                out[key] = check_count(value[key], f"{field}.{key}")
        if "oom_factor" in value:
            f = value["oom_factor"]
            ok = isinstance(f, int | float) and not isinstance(f, bool) and math.isfinite(f)
            if not ok or f < 1:
                raise ValueError(f"{field}.oom_factor: {f!r} must be a number >= 1")
            out["oom_factor"] = float(f)
        cap = value.get("oom_max_memory")
        if cap is not None:
            out["oom_max_memory"] = parse_memory(cap, f"{field}.oom_max_memory")
        for key in ("backoff", "ready_timeout"):
            if value.get(key) is not None:
                out[key] = parse_seconds(value[key], f"{field}.{key}")
        return RetryPolicy(**out)


@dataclass(frozen=True, slots=True)
class RateLimit:
    """A token bucket's settings: ``per_second`` refill, up to ``burst`` tokens."""

    per_second: float
    burst: float

    def to_dict(self) -> dict[str, float]:
        return {"per_second": self.per_second, "burst": self.burst}

    @staticmethod
    def from_dict(d: Mapping[str, Any] | None) -> RateLimit | None:
        return RateLimit(float(d["per_second"]), float(d["burst"])) if d else None


@dataclass(frozen=True, slots=True)
class QueueSpec:
    """A named backlog with a policy attached. Absent knobs (None) are unlimited.

    Every field is a knob of :data:`QUEUE_KNOBS`, which is where a new one starts.
    """

    name: str
    priority: Priority = Priority.medium
    algorithm: Algorithm = Algorithm.backfill
    run_concurrency: int | None = None
    action_concurrency: int | None = None
    per_run_concurrency: int | None = None
    depth: int | None = None
    submit_rate: RateLimit | None = None  # None: only the tenant's rate applies
    max_queued_time: float | None = None  # seconds an action may wait; None: for ever
    max_resources: Quota | None = None
    clusters: tuple[str, ...] | None = None  # None: any healthy cluster
    status: QueueStatus = QueueStatus.active
    retry: RetryPolicy = RetryPolicy()

    def with_changes(self, **changes: Any) -> QueueSpec:
        return replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        return {k.name: _TO_JSON[k.kind](getattr(self, k.name)) for k in QUEUE_KNOBS}

    @staticmethod
    def from_dict(d: Mapping[str, Any]) -> QueueSpec:
        fields = {k.name: _decode(k, d[k.name]) for k in QUEUE_KNOBS if k.name in d}
        return QueueSpec(**fields)


class KnobKind(StrEnum):
    """A knob's type: how it is carried, parsed and shown (one codec per kind)."""

    name = "name"
    priority = "priority"
    algorithm = "algorithm"
    limit = "limit"  # a non-negative count, None unlimited
    quota = "quota"  # max_resources: per-resource caps
    clusters = "clusters"  # a selector: cluster names, None any
    status = "status"
    rate = "rate"  # a token bucket: per_second and burst, None unlimited
    seconds = "seconds"  # a non-negative duration in seconds, None unlimited
    retry = "retry"  # a RetryPolicy: retries by failure class


@dataclass(frozen=True, slots=True)
class Knob:
    """One queue knob: its name (the ``QueueSpec`` field, the file key, the CLI flag
    ``--name-with-dashes``), its kind, a line of help, and what in the policy reads it."""

    name: str
    kind: KnobKind
    help: str
    reads: str


#: The queue's knobs, in display order: the one list from which ``QueueSpec``'s
#: JSON form, the scenario schema, the workflow's validation and the CLI's flags and
#: tables are derived (tests/scheduler/test_knobs.py keeps a new field from escaping it).
QUEUE_KNOBS: tuple[Knob, ...] = (
    Knob("name", KnobKind.name, "The queue's name.", "everything: the queue's identity"),
    Knob(
        "priority",
        KnobKind.priority,
        "critical | high | medium | low | lowest",
        "ordering: queues are visited by priority, never preempting",
    ),
    Knob(
        "algorithm",
        KnobKind.algorithm,
        "strict | greedy | backfill | easy",
        "a head that does not fit: hold (strict), skip (greedy), reserve (backfill, easy)",
    ),
    Knob(
        "run_concurrency",
        KnobKind.limit,
        "Runs in flight at once ('unlimited' unsets).",
        "gate RunConcurrency",
    ),
    Knob(
        "action_concurrency",
        KnobKind.limit,
        "Actions in flight at once.",
        "gate ActionConcurrency",
    ),
    Knob(
        "per_run_concurrency",
        KnobKind.limit,
        "Actions of one run in flight at once.",
        "gate PerRunConcurrency",
    ),
    Knob(
        "depth",
        KnobKind.limit,
        "Actions the queue holds (waiting + running).",
        "submission: QueueDepthExceeded",
    ),
    Knob(
        "submit_rate",
        KnobKind.rate,
        "Submissions per second to this queue, and their burst ('unlimited' unsets).",
        "submission: RateLimited (with when to retry), at each submission's own time",
    ),
    Knob(
        "max_queued_time",
        KnobKind.seconds,
        "How long an action may wait to start, e.g. 600, 10m, 2h ('unlimited' unsets).",
        "expiry: a waiting action past it is rejected QueuedTooLong",
    ),
    Knob(
        "max_resources",
        KnobKind.quota,
        "Quota on in-flight resources (cpu, memory, gpu, ephemeral_storage).",
        "gate MaxResources; submission: Unschedulable when a demand can never fit",
    ),
    Knob(
        "clusters",
        KnobKind.clusters,
        "Clusters this queue may dispatch to (default: any healthy one).",
        "placement: the eligible clusters",
    ),
    Knob(
        "status",
        KnobKind.status,
        "active | draining | drained",
        "submission: QueueDraining; dispatch stops when drained",
    ),
    Knob(
        "retry",
        KnobKind.retry,
        "Retries by failure class: oom (memory x oom_factor up to oom_max_memory), lost"
        " (preempted, evicted, node or pod lost: requeued at the head), failed (non-zero"
        " exit, after backoff, doubling); all 0 by default. ready_timeout: pods not all"
        " running that long after dispatch are deleted and requeued (not_ready times).",
        "the action's end: a failure of a class with retries left is requeued as a new attempt",
    ),
)

#: The knobs of kind ``limit`` (counts, None unlimited), by name.
LIMIT_KNOBS: tuple[str, ...] = tuple(k.name for k in QUEUE_KNOBS if k.kind is KnobKind.limit)


def _ident(v: Any) -> Any:
    return v


# The JSON form of each kind (what continue-as-new carries and the workflow's updates take).
_TO_JSON: dict[KnobKind, Any] = {
    KnobKind.name: _ident,
    KnobKind.priority: lambda v: v.name,
    KnobKind.algorithm: lambda v: v.value,
    KnobKind.limit: _ident,
    KnobKind.quota: lambda v: v.to_dict() if v else None,
    KnobKind.clusters: lambda v: list(v) if v is not None else None,
    KnobKind.status: lambda v: v.value,
    KnobKind.rate: lambda v: v.to_dict() if v else None,
    KnobKind.seconds: _ident,
    KnobKind.retry: lambda v: v.to_dict(),
}
_FROM_JSON: dict[KnobKind, Any] = {
    KnobKind.name: _ident,
    KnobKind.priority: Priority.parse,
    KnobKind.algorithm: Algorithm,
    KnobKind.limit: _ident,
    KnobKind.quota: lambda v: Quota.from_dict(v) if v else None,
    KnobKind.clusters: lambda v: tuple(v) if v is not None else None,
    KnobKind.status: QueueStatus,
    KnobKind.rate: RateLimit.from_dict,
    KnobKind.seconds: lambda v: None if v is None else float(v),
    KnobKind.retry: RetryPolicy.parse,
}


def _decode(k: Knob, v: Any) -> Any:
    """Knob ``k``'s value from its JSON form (a duration given as text, e.g. "10m", is
    read as the CLI and scenario files read it; a bad one names the knob)."""
    if k.kind is KnobKind.seconds and v is not None:
        return parse_seconds(v, k.name)
    return _FROM_JSON[k.kind](v)


def check_limits(spec: QueueSpec) -> None:
    """Raise ValueError naming the knob when a limit is not a non-negative integer."""
    for f in LIMIT_KNOBS:
        v = getattr(spec, f)
        if v is not None:
            check_count(v, f)
    mqt = spec.max_queued_time
    if mqt is not None and (not math.isfinite(mqt) or mqt < 0):
        raise ValueError(f"max_queued_time: {mqt!r} must be a non-negative number of seconds")
    rate = spec.submit_rate
    if rate is not None:
        for part in ("per_second", "burst"):
            v = getattr(rate, part)
            if not math.isfinite(v) or v < 0:
                raise ValueError(f"submit_rate.{part}: {v!r} must be a non-negative number")


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
            "submit_rate": self.submit_rate.to_dict() if self.submit_rate else None,
        }

    @staticmethod
    def from_dict(d: Mapping[str, Any] | None) -> OrgLimits:
        if not d:
            return OrgLimits()
        return OrgLimits(
            d.get("max_concurrent_runs"),
            d.get("max_concurrent_actions"),
            d.get("max_actions_per_run"),
            RateLimit.from_dict(d.get("submit_rate")),
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

    @property
    def queued_since(self) -> float:
        """When this spec entered its queue: ``submit``, or for a retried attempt (which
        keeps the action's first ``submit``, to wait at the head) ``meta["queued_at"]``.
        ``max_queued_time`` counts from here."""
        return float(self.meta.get("queued_at", self.submit))

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
