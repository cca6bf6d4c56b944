"""Between the human notation of files and flags (``cpu: 500m``, ``gpu: "H200:8"``,
``priority: high``) and the scheduler core's canonical specs.

Parsing goes through the core's own parsers, so a value the CLI accepts is one the
scheduler accepts, and every error names the field and the value.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from headway.scheduler.model import (
    Algorithm,
    ClusterSpec,
    NodeGroup,
    OrgLimits,
    Priority,
    QueueSpec,
    QueueStatus,
    RateLimit,
)
from headway.scheduler.resources import Quota, parse_pod, parse_quota

__all__ = [
    "QUEUE_FIELDS",
    "cluster_from_entry",
    "format_cpu",
    "format_memory",
    "org_from_entry",
    "org_to_entry",
    "parse_enum",
    "parse_limit",
    "queue_from_entry",
    "queue_to_entry",
    "quota_to_entry",
]

#: The fields of a queue in the human notation, in display order.
QUEUE_FIELDS = (
    "name",
    "priority",
    "algorithm",
    "run_concurrency",
    "action_concurrency",
    "per_run_concurrency",
    "depth",
    "max_resources",
    "clusters",
    "status",
)
_LIMITS = ("run_concurrency", "action_concurrency", "per_run_concurrency", "depth")
_ORG_FIELDS = (
    "max_concurrent_runs",
    "max_concurrent_actions",
    "max_actions_per_run",
    "submit_rate",
)


def parse_enum(kind: Any, value: Any, field: str) -> Any:
    """``kind(value)`` for a StrEnum, or a ValueError naming the field and the choices."""
    try:
        return kind(value)
    except ValueError:
        choices = ", ".join(m.value for m in kind)
        raise ValueError(f"{field}: {value!r} is not one of {choices}") from None


def parse_limit(value: Any, field: str) -> int | None:
    """A concurrency/depth knob: a non-negative integer, or None/"none"/"unlimited"."""
    if value is None or (isinstance(value, str) and value.lower() in ("none", "unlimited")):
        return None
    if isinstance(value, bool):
        raise ValueError(f"{field}: {value!r} is not a non-negative integer")
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value)
    if not isinstance(value, int) or value < 0:
        raise ValueError(f"{field}: {value!r} is not a non-negative integer (or 'unlimited')")
    return value


def cluster_from_entry(entry: Mapping[str, Any], where: str = "cluster") -> ClusterSpec:
    """A fleet file's cluster entry as a :class:`ClusterSpec` (canonical units)."""
    name = entry.get("name")
    if not isinstance(name, str) or not name:
        raise ValueError(f"{where}.name: missing")
    unknown = set(entry) - {"name", "node_groups", "reports_capacity"}
    if unknown:
        raise ValueError(f"{where}: unknown field(s) {', '.join(sorted(unknown))}")
    groups = []
    for j, g in enumerate(entry.get("node_groups") or []):
        gw = f"{where}.node_groups[{j}]"
        if not isinstance(g, Mapping):
            raise ValueError(f"{gw}: expected a mapping")
        count = g.get("count")
        if not isinstance(count, int) or isinstance(count, bool) or count < 0:
            raise ValueError(f"{gw}.count: {count!r} is not a non-negative integer")
        groups.append(
            NodeGroup(
                str(g.get("name", f"group-{j}")), count, parse_pod(g.get("shape"), f"{gw}.shape")
            )
        )
    reports = entry.get("reports_capacity", True)
    if not isinstance(reports, bool):
        raise ValueError(f"{where}.reports_capacity: {reports!r} is not true or false")
    return ClusterSpec(name, tuple(groups), reports)


def queue_from_entry(entry: Mapping[str, Any], where: str = "queue") -> QueueSpec:
    """A queue in the human notation (files, ``--edit``) as a :class:`QueueSpec`."""
    name = entry.get("name")
    if not isinstance(name, str) or not name:
        raise ValueError(f"{where}.name: missing")
    unknown = set(entry) - set(QUEUE_FIELDS)
    if unknown:
        raise ValueError(f"{where}: unknown field(s) {', '.join(sorted(unknown))}")
    clusters = entry.get("clusters")
    if clusters is not None and (
        not isinstance(clusters, list) or not all(isinstance(c, str) for c in clusters)
    ):
        raise ValueError(f"{where}.clusters: {clusters!r} is not a list of cluster names")
    return QueueSpec(
        name=name,
        priority=Priority.parse(entry.get("priority", "medium"), f"{where}.priority"),
        algorithm=parse_enum(Algorithm, entry.get("algorithm", "backfill"), f"{where}.algorithm"),
        max_resources=parse_quota(entry.get("max_resources"), f"{where}.max_resources"),
        clusters=tuple(clusters) if clusters is not None else None,
        status=parse_enum(QueueStatus, entry.get("status", "active"), f"{where}.status"),
        **{k: parse_limit(entry.get(k), f"{where}.{k}") for k in _LIMITS},
    )


def format_cpu(millicores: int) -> str | int:
    """``2000`` -> ``2``, ``500`` -> ``"500m"``."""
    return millicores // 1000 if millicores % 1000 == 0 else f"{millicores}m"


def format_memory(n: int) -> str | int:
    """Bytes in the largest binary unit that divides them: ``68719476736`` -> ``"64Gi"``."""
    for suffix, size in (
        ("Ei", 2**60),
        ("Pi", 2**50),
        ("Ti", 2**40),
        ("Gi", 2**30),
        ("Mi", 2**20),
        ("Ki", 2**10),
    ):
        if n and n % size == 0:
            return f"{n // size}{suffix}"
    return n


def quota_to_entry(q: Quota | None) -> dict[str, Any] | None:
    """``max_resources`` in the human notation (only the capped resources)."""
    if q is None:
        return None
    out: dict[str, Any] = {}
    if q.cpu is not None:
        out["cpu"] = format_cpu(q.cpu)
    if q.memory is not None:
        out["memory"] = format_memory(q.memory)
    if q.eph is not None:
        out["ephemeral_storage"] = format_memory(q.eph)
    if q.gpu is not None:
        out["gpu"] = f"{q.gpu_type}:{q.gpu}" if q.gpu_type else q.gpu
    return out


def queue_to_entry(spec: QueueSpec) -> dict[str, Any]:
    """A :class:`QueueSpec` in the human notation; round-trips with queue_from_entry."""
    return {
        "name": spec.name,
        "priority": spec.priority.name,
        "algorithm": spec.algorithm.value,
        "run_concurrency": spec.run_concurrency,
        "action_concurrency": spec.action_concurrency,
        "per_run_concurrency": spec.per_run_concurrency,
        "depth": spec.depth,
        "max_resources": quota_to_entry(spec.max_resources),
        "clusters": list(spec.clusters) if spec.clusters is not None else None,
        "status": spec.status.value,
    }


def org_from_entry(entry: Mapping[str, Any] | None, where: str = "org") -> OrgLimits:
    """Org limits in the file notation, checked."""
    if not entry:
        return OrgLimits()
    unknown = set(entry) - set(_ORG_FIELDS)
    if unknown:
        raise ValueError(f"{where}: unknown field(s) {', '.join(sorted(unknown))}")
    rate = entry.get("submit_rate")
    limit: RateLimit | None = None
    if rate is not None:
        if not isinstance(rate, Mapping) or set(rate) != {"per_second", "burst"}:
            raise ValueError(f"{where}.submit_rate: {rate!r} needs per_second and burst")
        try:
            per_s, burst = float(rate["per_second"]), float(rate["burst"])
        except (TypeError, ValueError):
            raise ValueError(f"{where}.submit_rate: {rate!r} is not numeric") from None
        if per_s <= 0 or burst < 1:
            raise ValueError(f"{where}.submit_rate: {rate!r} needs per_second > 0, burst >= 1")
        limit = RateLimit(per_s, burst)
    return OrgLimits(
        parse_limit(entry.get("max_concurrent_runs"), f"{where}.max_concurrent_runs"),
        parse_limit(entry.get("max_concurrent_actions"), f"{where}.max_concurrent_actions"),
        parse_limit(entry.get("max_actions_per_run"), f"{where}.max_actions_per_run"),
        limit,
    )


def org_to_entry(org: OrgLimits) -> dict[str, Any]:
    """Org limits in the file notation (what ``to_dict`` gives, already human)."""
    return org.to_dict()
