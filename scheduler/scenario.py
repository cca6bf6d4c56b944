"""Reading scenario and fleet files: strict, with errors that name file, line, field, value.

A scenario is the user's fleet, queues, org envelope, workload and live events (see
``shared/specs/simulate.md``). The fleet file that ``headway up`` reads uses the same
``clusters:`` (and optional ``queues:``/``org:``) sections, parsed by the same code.
The caller reads the file; this module only parses text.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import yaml

from .model import (
    LIMIT_KNOBS,
    QUEUE_KNOBS,
    ActionSpec,
    Algorithm,
    ClusterSpec,
    DemandKind,
    EnvironmentSpec,
    NodeGroup,
    OrgLimits,
    Priority,
    QueueSpec,
    QueueStatus,
    RateLimit,
    RetryPolicy,
    parse_seconds,
    ray_demand,
    replicas_demand,
    spark_demand,
)
from .resources import Pod, QuantityError, parse_pod, parse_quota
from .retry import FAILURE_KINDS, NOT_READY_KIND

__all__ = [
    "Failure",
    "Scenario",
    "ScenarioError",
    "WorkItem",
    "demand_from_request",
    "environment_from_dict",
    "load_scenario",
    "parse_fleet",
    "queue_changes",
]


class ScenarioError(ValueError):
    """Bad input. The message names the file, line, field and value."""


class _LineLoader(yaml.SafeLoader):
    pass


class _Map(dict[str, Any]):
    """A mapping that remembers the line of each key (1-based)."""

    lines: dict[str, int]
    line: int


class _Seq(list[Any]):
    lines: list[int]
    line: int


def _construct_map(loader: _LineLoader, node: yaml.MappingNode) -> _Map:
    m = _Map()
    m.lines = {}
    m.line = node.start_mark.line + 1
    for knode, vnode in node.value:
        key = loader.construct_object(knode, deep=True)
        if key in m:
            raise ScenarioError(f"line {knode.start_mark.line + 1}: duplicate key {key!r}")
        m[key] = loader.construct_object(vnode, deep=True)
        m.lines[key] = knode.start_mark.line + 1
    return m


def _construct_seq(loader: _LineLoader, node: yaml.SequenceNode) -> _Seq:
    s = _Seq(loader.construct_object(v, deep=True) for v in node.value)
    s.lines = [v.start_mark.line + 1 for v in node.value]
    s.line = node.start_mark.line + 1
    return s


_LineLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_map)
_LineLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_SEQUENCE_TAG, _construct_seq)


class _Ctx:
    """Where we are in the file, for error messages."""

    def __init__(self, source: str) -> None:
        self.source = source

    def fail(self, line: int | None, path: str, msg: str) -> ScenarioError:
        loc = f"{self.source}:{line}" if line else self.source
        return ScenarioError(f"{loc}: {path}: {msg}")

    def mapping(self, v: Any, path: str, line: int | None) -> _Map:
        if not isinstance(v, dict):
            raise self.fail(line, path, f"expected a mapping, got {v!r}")
        if not isinstance(v, _Map):
            m = _Map(v)
            m.lines = {}
            m.line = line or 0
            return m
        return v

    def seq(self, v: Any, path: str, line: int | None) -> _Seq:
        if not isinstance(v, list):
            raise self.fail(line, path, f"expected a list, got {v!r}")
        if not isinstance(v, _Seq):
            s = _Seq(v)
            s.lines = [line or 0] * len(v)
            s.line = line or 0
            return s
        return v

    def keys(self, m: _Map, path: str, allowed: set[str], required: set[str] = frozenset()) -> None:  # type: ignore[assignment]
        for k in m:
            if k not in allowed:
                raise self.fail(
                    m.lines.get(k, m.line),
                    f"{path}.{k}",
                    f"unknown field, value {_shown(m[k])}"
                    f" (expected one of {', '.join(sorted(allowed))})",
                )
        for k in sorted(required):
            if k not in m:
                raise self.fail(m.line, f"{path}.{k}", "missing required field")

    def line_of(self, m: _Map, k: str) -> int:
        return m.lines.get(k, m.line)

    def number(self, m: _Map, k: str, path: str, minimum: float = 0.0) -> float:
        v = m[k]
        if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
            raise self.fail(self.line_of(m, k), f"{path}.{k}", f"{v!r} is not a number")
        if v < minimum:
            raise self.fail(self.line_of(m, k), f"{path}.{k}", f"{v!r} must be >= {minimum:g}")
        return float(v)

    def count(
        self, m: _Map, k: str, path: str, minimum: int = 0, nullable: bool = True
    ) -> int | None:
        v = m[k]
        if v is None and nullable:
            return None
        if isinstance(v, bool) or not isinstance(v, int):
            raise self.fail(self.line_of(m, k), f"{path}.{k}", f"{v!r} is not an integer")
        if v < minimum:
            raise self.fail(self.line_of(m, k), f"{path}.{k}", f"{v!r} must be >= {minimum}")
        return v

    def string(self, m: _Map, k: str, path: str) -> str:
        v = m[k]
        if isinstance(v, bool) or not isinstance(v, str | int | float) or str(v) == "":
            raise self.fail(self.line_of(m, k), f"{path}.{k}", f"{v!r} is not a name")
        return str(v)

    def wrap(
        self, fn: Callable[[], Any], line: int | None, within: tuple[str, Any] | None = None
    ) -> Any:
        """``fn()``, its ``ValueError`` turned into a ``ScenarioError`` at ``line``.

        ``within``: the path and value ``fn`` parses. When the value is a mapping read
        from the file and the error names one of its keys, the error gets that key's own
        line (a block mapping spreads its keys over lines below ``line``).
        """
        try:
            return fn()
        except ValueError as exc:
            if isinstance(exc, ScenarioError):
                raise
            msg = str(exc)
            if isinstance(exc, QuantityError):
                head, _, tail = msg.partition(":")
                tail = tail.strip()
            else:
                head, _, tail = msg.partition(": ")
                tail = tail or msg
            if within is not None and isinstance(within[1], _Map):
                base, m = within
                key = head[len(base) + 1 :] if head.startswith(f"{base}.") else None
                if key is not None and key in m.lines:
                    line = m.lines[key]
            raise self.fail(line, head, tail) from exc


@dataclass(frozen=True)
class Failure:
    """How one attempt of a workload entry ends before the attempt that runs to its end.

    ``kind`` is an end a retry policy has a class for (``OOMKilled``, ``Preempted``,
    ``Evicted``, ``NodeLost``, ``PodLost``, ``Failed``, ``NotReady``); ``after`` is how
    long that attempt runs, or None for ``NotReady``: its pods never all run, so it ends
    when its queue's ``retry.ready_timeout`` does.
    """

    kind: str
    after: float | None = None


@dataclass
class WorkItem:
    """One workload entry: the action spec, how long it really runs, and how its
    earlier attempts end (``failures``, in order; none by default)."""

    spec: ActionSpec
    duration: float
    line: int = 0
    failures: tuple[Failure, ...] = ()


@dataclass
class Scenario:
    clusters: list[ClusterSpec]
    queues: list[QueueSpec]
    org: OrgLimits
    environments: list[EnvironmentSpec]
    workload: list[WorkItem]
    events: list[tuple[float, str, Any]] = field(default_factory=list)


# --------------------------------------------------------------------------- pieces


def _pod(ctx: _Ctx, v: Any, path: str, line: int | None) -> Pod:
    return ctx.wrap(lambda: parse_pod(v, path), line, (path, v))  # type: ignore[no-any-return]


def _shown(v: Any) -> str:
    """A value for an error message: its repr, cut short if long."""
    r = repr(v)
    return r if len(r) <= 60 else f"{r[:57]}..."


def _clusters(ctx: _Ctx, v: Any, path: str, line: int | None) -> list[ClusterSpec]:
    out: list[ClusterSpec] = []
    seen: set[str] = set()
    s = ctx.seq(v, path, line)
    for i, raw in enumerate(s):
        p = f"{path}[{i}]"
        m = ctx.mapping(raw, p, s.lines[i])
        ctx.keys(m, p, {"name", "node_groups", "reports_capacity"}, {"name"})
        name = ctx.string(m, "name", p)
        if name in seen:
            raise ctx.fail(ctx.line_of(m, "name"), f"{p}.name", f"{name!r} is defined twice")
        seen.add(name)
        groups: list[NodeGroup] = []
        if "node_groups" in m:
            gs = ctx.seq(m["node_groups"], f"{p}.node_groups", ctx.line_of(m, "node_groups"))
            for j, graw in enumerate(gs):
                gp = f"{p}.node_groups[{j}]"
                g = ctx.mapping(graw, gp, gs.lines[j])
                ctx.keys(g, gp, {"name", "count", "shape"}, {"name", "count", "shape"})
                cnt = ctx.count(g, "count", gp, 0, nullable=False)
                shape = _pod(ctx, g["shape"], f"{gp}.shape", ctx.line_of(g, "shape"))
                groups.append(NodeGroup(ctx.string(g, "name", gp), cnt or 0, shape))
        rc = m.get("reports_capacity", True)
        if not isinstance(rc, bool):
            raise ctx.fail(
                ctx.line_of(m, "reports_capacity"),
                f"{p}.reports_capacity",
                f"{rc!r} is not true/false",
            )
        out.append(ClusterSpec(name, tuple(groups), rc))
    return out


_QUEUE_FIELDS = {k.name for k in QUEUE_KNOBS}


def _queue_fields(ctx: _Ctx, m: _Map, p: str, clusters: set[str] | None) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k in m:
        line = ctx.line_of(m, k)
        v = m[k]
        if k == "name":
            out["name"] = ctx.string(m, k, p)
        elif k == "priority":
            out[k] = ctx.wrap(partial(Priority.parse, v, f"{p}.priority"), line)
        elif k == "algorithm":
            if v not in Algorithm.__members__:
                raise ctx.fail(
                    line, f"{p}.algorithm", f"{v!r} is not one of strict, greedy, backfill, easy"
                )
            out[k] = Algorithm(v)
        elif k == "status":
            if v not in QueueStatus.__members__:
                raise ctx.fail(
                    line, f"{p}.status", f"{v!r} is not one of active, draining, drained"
                )
            out[k] = QueueStatus(v)
        elif k in LIMIT_KNOBS:
            out[k] = ctx.count(m, k, p, 0)
        elif k == "submit_rate":
            out[k] = _rate(ctx, m, k, p)
        elif k == "max_queued_time":
            out[k] = (
                None
                if v is None
                else ctx.wrap(partial(parse_seconds, v, f"{p}.{k}"), line, (f"{p}.{k}", v))
            )
        elif k == "retry":
            out[k] = ctx.wrap(partial(RetryPolicy.parse, v, f"{p}.retry"), line, (f"{p}.retry", v))
        elif k == "max_resources":
            out[k] = (
                None
                if v is None
                else ctx.wrap(
                    partial(parse_quota, v, f"{p}.max_resources"), line, (f"{p}.max_resources", v)
                )
            )
        elif k == "clusters":
            if v is None:
                out[k] = None
            else:
                s = ctx.seq(v, f"{p}.clusters", line)
                names = []
                for i, n in enumerate(s):
                    if not isinstance(n, str) or not n:
                        raise ctx.fail(
                            s.lines[i], f"{p}.clusters[{i}]", f"{n!r} is not a cluster name"
                        )
                    if clusters is not None and n not in clusters:
                        raise ctx.fail(
                            s.lines[i], f"{p}.clusters[{i}]", f"{n!r} is not a cluster of the fleet"
                        )
                    names.append(n)
                out[k] = tuple(names)
    return out


def _queues(
    ctx: _Ctx, v: Any, path: str, line: int | None, clusters: set[str] | None
) -> list[QueueSpec]:
    out: list[QueueSpec] = []
    seen: set[str] = set()
    s = ctx.seq(v, path, line)
    for i, raw in enumerate(s):
        p = f"{path}[{i}]"
        m = ctx.mapping(raw, p, s.lines[i])
        ctx.keys(m, p, _QUEUE_FIELDS, {"name"})
        f = _queue_fields(ctx, m, p, clusters)
        if f["name"] in seen:
            raise ctx.fail(ctx.line_of(m, "name"), f"{p}.name", f"{f['name']!r} is defined twice")
        seen.add(f["name"])
        out.append(QueueSpec(**f))
    return out


def queue_changes(changes: Mapping[str, Any], where: str = "update_queue") -> dict[str, Any]:
    """Validate a live queue update (scenario notation) into QueueSpec field values."""
    ctx = _Ctx(where)
    m = ctx.mapping(dict(changes), where, None)
    ctx.keys(m, where, _QUEUE_FIELDS - {"name"})
    return _queue_fields(ctx, m, where, None)


def _org(ctx: _Ctx, v: Any, path: str, line: int | None) -> OrgLimits:
    if v is None:
        return OrgLimits()
    m = ctx.mapping(v, path, line)
    ctx.keys(
        m,
        path,
        {"max_concurrent_runs", "max_concurrent_actions", "max_actions_per_run", "submit_rate"},
    )
    rate = _rate(ctx, m, "submit_rate", path) if "submit_rate" in m else None
    return OrgLimits(
        ctx.count(m, "max_concurrent_runs", path) if "max_concurrent_runs" in m else None,
        ctx.count(m, "max_concurrent_actions", path) if "max_concurrent_actions" in m else None,
        ctx.count(m, "max_actions_per_run", path) if "max_actions_per_run" in m else None,
        rate,
    )


def _rate(ctx: _Ctx, m: _Map, k: str, path: str) -> RateLimit | None:
    """A token bucket's settings ``{per_second, burst}`` (null: unlimited)."""
    if m[k] is None:
        return None
    rp = f"{path}.{k}"
    r = ctx.mapping(m[k], rp, ctx.line_of(m, k))
    ctx.keys(r, rp, {"per_second", "burst"}, {"per_second", "burst"})
    return RateLimit(ctx.number(r, "per_second", rp), ctx.number(r, "burst", rp))


def _environments(ctx: _Ctx, v: Any, path: str, line: int | None) -> list[EnvironmentSpec]:
    out: list[EnvironmentSpec] = []
    s = ctx.seq(v, path, line)
    seen: set[str] = set()
    for i, raw in enumerate(s):
        p = f"{path}[{i}]"
        m = ctx.mapping(raw, p, s.lines[i])
        ctx.keys(
            m,
            p,
            {"name", "resources", "replicas", "concurrency", "idle_ttl"},
            {"name", "resources"},
        )
        name = ctx.string(m, "name", p)
        if name in seen:
            raise ctx.fail(ctx.line_of(m, "name"), f"{p}.name", f"{name!r} is defined twice")
        seen.add(name)
        out.append(
            EnvironmentSpec(
                name,
                _pod(ctx, m["resources"], f"{p}.resources", ctx.line_of(m, "resources")),
                (ctx.count(m, "replicas", p, 1, nullable=False) or 1) if "replicas" in m else 1,
                (ctx.count(m, "concurrency", p, 1, nullable=False) or 1)
                if "concurrency" in m
                else 1,
                ctx.number(m, "idle_ttl", p) if "idle_ttl" in m else 0.0,
            )
        )
    return out


def _demand(ctx: _Ctx, m: _Map, p: str) -> tuple[DemandKind, tuple[Pod, ...]]:
    forms = [k for k in ("resources", "ray", "spark") if k in m]
    if len(forms) != 1:
        raise ctx.fail(
            m.line,
            p,
            "exactly one of resources, ray, spark is required"
            + (f" (got {', '.join(forms)})" if forms else ""),
        )
    form = forms[0]
    if "replicas" in m and form != "resources":
        raise ctx.fail(ctx.line_of(m, "replicas"), f"{p}.replicas", "goes only beside resources")
    line = ctx.line_of(m, form)
    if form == "resources":
        pod = _pod(ctx, m["resources"], f"{p}.resources", line)
        if "replicas" in m:
            n = ctx.count(m, "replicas", p, 1, nullable=False) or 1
            return DemandKind.replicas, replicas_demand(pod, n)
        return DemandKind.single, (pod,)
    if form == "ray":
        rp = f"{p}.ray"
        r = ctx.mapping(m["ray"], rp, line)
        ctx.keys(r, rp, {"head", "worker_groups"}, {"head"})
        head = _pod(ctx, r["head"], f"{rp}.head", ctx.line_of(r, "head"))
        groups: list[tuple[int, Pod]] = []
        if "worker_groups" in r:
            gs = ctx.seq(r["worker_groups"], f"{rp}.worker_groups", ctx.line_of(r, "worker_groups"))
            for i, graw in enumerate(gs):
                gp = f"{rp}.worker_groups[{i}]"
                g = ctx.mapping(graw, gp, gs.lines[i])
                ctx.keys(g, gp, {"replicas", "resources", "name"}, {"replicas", "resources"})
                n = ctx.count(g, "replicas", gp, 0, nullable=False) or 0
                groups.append(
                    (n, _pod(ctx, g["resources"], f"{gp}.resources", ctx.line_of(g, "resources")))
                )
        return DemandKind.ray, ray_demand(head, groups)
    sp = f"{p}.spark"
    s = ctx.mapping(m["spark"], sp, line)
    ctx.keys(s, sp, {"driver", "executor", "executors"}, {"driver", "executor", "executors"})
    n = ctx.count(s, "executors", sp, 0, nullable=False) or 0
    return DemandKind.spark, spark_demand(
        _pod(ctx, s["driver"], f"{sp}.driver", ctx.line_of(s, "driver")),
        _pod(ctx, s["executor"], f"{sp}.executor", ctx.line_of(s, "executor")),
        n,
    )


def demand_from_request(
    d: Mapping[str, Any], field: str = "demand"
) -> tuple[DemandKind, tuple[Pod, ...]]:
    """Compute an action's demand, once, from its declared infrastructure.

    ``d`` is a ``protocol.DemandRequest`` as a dict: ``resources`` (+ ``replicas``),
    ``ray`` or ``spark``, in scenario notation. Absent (None) entries are ignored.
    """
    ctx = _Ctx(field)
    m = ctx.mapping({k: v for k, v in d.items() if v is not None}, field, None)
    ctx.keys(m, field, {"resources", "replicas", "ray", "spark"})
    return _demand(ctx, m, field)


def environment_from_dict(d: Mapping[str, Any], field: str = "environment") -> EnvironmentSpec:
    """A reusable environment declared live (the SDK's ``ReusePolicy``), in the notation
    of a scenario's ``environments:`` entry: ``{name, resources, replicas, concurrency,
    idle_ttl}``.

    Raises:
        ScenarioError: a field is missing or bad (named, with its value).
    """
    ctx = _Ctx(field)
    return _environments(ctx, [d], field, None)[0]


_WORK_FIELDS = {
    "id",
    "run",
    "task",
    "queue",
    "submit",
    "duration",
    "estimate",
    "resources",
    "replicas",
    "ray",
    "spark",
    "environment",
    "failures",
}


def _workload(
    ctx: _Ctx, v: Any, path: str, line: int | None, queues: Mapping[str, QueueSpec]
) -> list[WorkItem]:
    out: list[WorkItem] = []
    seen: set[str] = set()
    s = ctx.seq(v, path, line)
    for i, raw in enumerate(s):
        p = f"{path}[{i}]"
        m = ctx.mapping(raw, p, s.lines[i])
        ctx.keys(m, p, _WORK_FIELDS, {"id", "queue", "submit", "duration"})
        aid = ctx.string(m, "id", p)
        if aid in seen:
            raise ctx.fail(ctx.line_of(m, "id"), f"{p}.id", f"{aid!r} is not unique")
        seen.add(aid)
        q = ctx.string(m, "queue", p)
        if q not in queues:
            raise ctx.fail(
                ctx.line_of(m, "queue"), f"{p}.queue", f"{q!r} is not a queue of the scenario"
            )
        kind, pods = _demand(ctx, m, p)
        est = None
        if m.get("estimate") is not None:
            est = ctx.number(m, "estimate", p)
        env = None
        if m.get("environment") is not None:
            env = ctx.string(m, "environment", p)
        spec = ActionSpec(
            id=aid,
            queue=q,
            pods=pods,
            run=ctx.string(m, "run", p) if m.get("run") is not None else aid,
            task=ctx.string(m, "task", p) if m.get("task") is not None else aid,
            submit=ctx.number(m, "submit", p),
            seq=i,
            estimate=est,
            environment=env,
            kind=kind,
        )
        fails: tuple[Failure, ...] = ()
        if m.get("failures") is not None:
            fl = ctx.line_of(m, "failures")
            fails = _failures(ctx, m["failures"], f"{p}.failures", fl, queues[q])
        out.append(WorkItem(spec, ctx.number(m, "duration", p), s.lines[i], fails))
    return out


def _failures(
    ctx: _Ctx, v: Any, path: str, line: int | None, queue: QueueSpec
) -> tuple[Failure, ...]:
    out: list[Failure] = []
    s = ctx.seq(v, path, line)
    for i, raw in enumerate(s):
        p = f"{path}[{i}]"
        m = ctx.mapping(raw, p, s.lines[i])
        ctx.keys(m, p, {"kind", "after"}, {"kind"})
        kind = ctx.string(m, "kind", p)
        if kind not in FAILURE_KINDS:
            raise ctx.fail(
                ctx.line_of(m, "kind"),
                f"{p}.kind",
                f"{kind!r} is not one of {', '.join(sorted(FAILURE_KINDS))}",
            )
        if kind == NOT_READY_KIND:
            if "after" in m:
                raise ctx.fail(
                    ctx.line_of(m, "after"),
                    f"{p}.after",
                    f"{_shown(m['after'])}: a NotReady attempt ends at its queue's "
                    "retry.ready_timeout; leave after out",
                )
            if queue.retry.ready_timeout is None:
                raise ctx.fail(
                    ctx.line_of(m, "kind"),
                    f"{p}.kind",
                    f"NotReady needs queue {queue.name!r} to set retry.ready_timeout",
                )
            out.append(Failure(kind))
            continue
        if "after" not in m:
            raise ctx.fail(m.line, f"{p}.after", f"required for kind {kind}")
        out.append(Failure(kind, ctx.number(m, "after", p)))
    return tuple(out)


def _events(
    ctx: _Ctx, v: Any, path: str, line: int | None, queues: set[str], clusters: set[str]
) -> list[tuple[float, str, Any]]:
    out: list[tuple[float, str, Any]] = []
    s = ctx.seq(v, path, line)
    for i, raw in enumerate(s):
        p = f"{path}[{i}]"
        m = ctx.mapping(raw, p, s.lines[i])
        ctx.keys(m, p, {"at", "update_queue", "cluster_down", "cluster_up"}, {"at"})
        at = ctx.number(m, "at", p)
        kinds = [k for k in ("update_queue", "cluster_down", "cluster_up") if k in m]
        if len(kinds) != 1:
            raise ctx.fail(
                m.line, p, "exactly one of update_queue, cluster_down, cluster_up is required"
            )
        k = kinds[0]
        kl = ctx.line_of(m, k)
        if k == "update_queue":
            up = ctx.mapping(m[k], f"{p}.update_queue", kl)
            ctx.keys(up, f"{p}.update_queue", _QUEUE_FIELDS, {"name"})
            name = ctx.string(up, "name", f"{p}.update_queue")
            if name not in queues:
                raise ctx.fail(
                    ctx.line_of(up, "name"),
                    f"{p}.update_queue.name",
                    f"{name!r} is not a queue of the scenario",
                )
            fields = _queue_fields(ctx, up, f"{p}.update_queue", clusters)
            fields.pop("name", None)
            out.append((at, k, (name, fields)))
        else:
            name = ctx.string(m, k, p)
            if name not in clusters:
                raise ctx.fail(kl, f"{p}.{k}", f"{name!r} is not a cluster of the fleet")
            out.append((at, k, name))
    return out


_TOP = {"clusters", "queues", "org", "workload", "environments", "events"}


def _load_yaml(text: str, source: str) -> _Map:
    try:
        doc = yaml.load(text, Loader=_LineLoader)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = mark.line + 1 if mark is not None else None
        raise _Ctx(source).fail(line, "yaml", str(getattr(exc, "problem", exc))) from exc
    except ScenarioError as exc:
        raise ScenarioError(f"{source}:{exc}") from exc
    return _Ctx(source).mapping(doc, "(top level)", 1)


def load_scenario(text: str, source: str = "<scenario>") -> Scenario:
    """Parse a scenario file's text. Raises ScenarioError naming file, line, field, value."""
    doc = _load_yaml(text, source)
    ctx = _Ctx(source)
    ctx.keys(doc, "(top level)", _TOP, {"clusters", "queues", "workload"})
    clusters = _clusters(ctx, doc["clusters"], "clusters", ctx.line_of(doc, "clusters"))
    cnames = {c.name for c in clusters}
    queues = _queues(ctx, doc["queues"], "queues", ctx.line_of(doc, "queues"), cnames)
    qnames = {q.name for q in queues}
    by_name = {q.name: q for q in queues}
    org = _org(ctx, doc.get("org"), "org", ctx.line_of(doc, "org"))
    envs = (
        _environments(ctx, doc["environments"], "environments", ctx.line_of(doc, "environments"))
        if doc.get("environments") is not None
        else []
    )
    work = _workload(ctx, doc["workload"], "workload", ctx.line_of(doc, "workload"), by_name)
    events = (
        _events(ctx, doc["events"], "events", ctx.line_of(doc, "events"), qnames, cnames)
        if doc.get("events") is not None
        else []
    )
    return Scenario(clusters, queues, org, envs, work, events)


@dataclass
class Fleet:
    clusters: list[ClusterSpec]
    queues: list[QueueSpec]
    org: OrgLimits
    environments: list[EnvironmentSpec]


def parse_fleet(text: str, source: str = "<fleet>") -> Fleet:
    """Parse a fleet file: ``clusters:`` and optionally ``queues:``, ``org:``, ``environments:``."""
    doc = _load_yaml(text, source)
    ctx = _Ctx(source)
    ctx.keys(doc, "(top level)", {"clusters", "queues", "org", "environments"}, {"clusters"})
    clusters = _clusters(ctx, doc["clusters"], "clusters", ctx.line_of(doc, "clusters"))
    cnames = {c.name for c in clusters}
    queues = (
        _queues(ctx, doc["queues"], "queues", ctx.line_of(doc, "queues"), cnames)
        if doc.get("queues") is not None
        else []
    )
    envs = (
        _environments(ctx, doc["environments"], "environments", ctx.line_of(doc, "environments"))
        if doc.get("environments") is not None
        else []
    )
    return Fleet(clusters, queues, _org(ctx, doc.get("org"), "org", ctx.line_of(doc, "org")), envs)
