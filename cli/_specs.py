"""Between the human notation of files and flags (``cpu: 500m``, ``gpu: "H200:8"``,
``priority: high``) and the scheduler core's canonical specs.

Parsing goes through the core's own parsers, so a value the CLI accepts is one the
scheduler accepts, and every error names the field and the value.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from headway.scheduler.model import (
    MAX_LIMIT,
    QUEUE_KNOBS,
    KnobKind,
    QueueSpec,
    RetryPolicy,
    check_count,
)
from headway.scheduler.resources import Quota

__all__ = [
    "MAX_LIMIT",
    "QUEUE_FIELDS",
    "UNSET_WORDS",
    "check_limit",
    "format_cpu",
    "format_memory",
    "knob",
    "parse_limit",
    "queue_from_entry",
    "queue_to_entry",
    "quota_to_entry",
    "retry_to_entry",
]

#: The fields of a queue in the human notation, in display order (the knob registry's).
QUEUE_FIELDS = tuple(k.name for k in QUEUE_KNOBS)


#: Words that unset a knob on the command line.
UNSET_WORDS = ("none", "unlimited")


def knob(value: Any) -> Any:
    """A knob as typed on the command line: ``"10"`` -> 10, ``"unlimited"`` -> None; any
    other text stays as typed so the parser's error quotes it."""
    if isinstance(value, str):
        if value.lower() in UNSET_WORDS:
            return None
        text = value.strip()
        # Negative numbers too, so the parser says "must be >= 0" rather than "not an
        # integer" about "-5".
        if text.removeprefix("-").isdigit():
            return int(text)
    return value


def parse_limit(value: Any, field: str) -> int | None:
    """A concurrency/depth knob: a non-negative integer, or None/"none"/"unlimited"."""
    value = knob(value)
    if value is None:
        return None
    if isinstance(value, bool):
        raise ValueError(f"{field}: {value!r} is not a non-negative integer")
    if not isinstance(value, int):
        raise ValueError(f"{field}: {value!r} is not a non-negative integer (or 'unlimited')")
    if value < 0:
        raise ValueError(f"{field}: {value} must be >= 0")
    check_limit(value, field)
    return value


def check_limit(value: Any, field: str) -> None:
    """A whole number above :data:`MAX_LIMIT` is refused, named (ValueError): the core's
    rule (``check_count``), for flags read before the core sees them."""
    if isinstance(value, int) and not isinstance(value, bool) and value > MAX_LIMIT:
        check_count(value, field)


def queue_from_entry(entry: Mapping[str, Any], where: str = "queue") -> QueueSpec:
    """A queue in the file notation (fleet files, ``--edit``) as a :class:`QueueSpec`,
    checked by the scheduler core's own parser (errors read ``field: value ...``)."""
    from headway.scheduler.scenario import ScenarioError, queue_changes

    name = entry.get("name")
    if not isinstance(name, str) or not name:
        raise ValueError(f"{where}.name: {name!r} is not a queue name")
    try:
        fields = queue_changes({k: v for k, v in entry.items() if k != "name"}, where)
    except ScenarioError as exc:
        # "queue: queue.priority: 'x' ..." -> "priority: 'x' ...": the caller names the thing.
        raise ValueError(str(exc).removeprefix(f"{where}: ").removeprefix(f"{where}.")) from None
    return QueueSpec(name=name, **fields)


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
    return {k.name: _HUMAN[k.kind](getattr(spec, k.name)) for k in QUEUE_KNOBS}


# Each knob kind in the human notation (quantities in Kubernetes units).
_HUMAN: dict[KnobKind, Any] = {
    KnobKind.name: lambda v: v,
    KnobKind.priority: lambda v: v.name,
    KnobKind.algorithm: lambda v: v.value,
    KnobKind.limit: lambda v: v,
    KnobKind.quota: quota_to_entry,
    KnobKind.clusters: lambda v: list(v) if v is not None else None,
    KnobKind.status: lambda v: v.value,
    KnobKind.rate: lambda v: v.to_dict() if v is not None else None,
    KnobKind.seconds: lambda v: (int(v) if v == int(v) else v) if v is not None else None,
    KnobKind.retry: lambda v: retry_to_entry(v),
}


def retry_to_entry(policy: RetryPolicy) -> dict[str, Any]:
    """A retry policy in the human notation (memory cap in Kubernetes units)."""
    out = policy.to_dict()
    if policy.oom_max_memory is not None:
        out["oom_max_memory"] = format_memory(policy.oom_max_memory)
    for key in ("backoff", "ready_timeout"):
        v = out[key]
        out[key] = int(v) if v is not None and v == int(v) else v
    return out
