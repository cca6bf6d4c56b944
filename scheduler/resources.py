"""Resource quantities, pod shapes and demand, in the units that actually run out.

Canonical units are integers so that sums are exact and deterministic: CPU in millicores,
memory and ephemeral storage in bytes, GPUs as a count with an optional type. Parsing
accepts Kubernetes quantity notation (``500m``, ``64Gi``, ``1e3``) and GPU notation
(``"H200:8"`` or a bare ``8``).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from typing import Any

__all__ = [
    "MAX_PODS",
    "MAX_POD_CPU",
    "MAX_POD_EPH",
    "MAX_POD_GPU",
    "MAX_POD_MEMORY",
    "Pod",
    "QuantityError",
    "Quota",
    "Usage",
    "check_pod_count",
    "parse_cpu",
    "parse_demand",
    "parse_gpu",
    "parse_memory",
    "parse_pod",
    "parse_quota",
]


class QuantityError(ValueError):
    """A quantity string could not be read. The message names the field and the value."""


class _TooLarge(QuantityError):
    """A quantity past 10**30: no machine or fleet has it."""


_SUFFIX = {
    "": Decimal(1),
    "m": Decimal("0.001"),
    "k": Decimal(10) ** 3,
    "K": Decimal(10) ** 3,
    "M": Decimal(10) ** 6,
    "G": Decimal(10) ** 9,
    "T": Decimal(10) ** 12,
    "P": Decimal(10) ** 15,
    "E": Decimal(10) ** 18,
    "Ki": Decimal(2) ** 10,
    "Mi": Decimal(2) ** 20,
    "Gi": Decimal(2) ** 30,
    "Ti": Decimal(2) ** 40,
    "Pi": Decimal(2) ** 50,
    "Ei": Decimal(2) ** 60,
}
#: Quantities past 10**30 (times their suffix) are refused as too large, whatever they are.
_MAX_EXPONENT = 30
_QUANTITY = re.compile(r"^\s*([+]?[0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([a-zA-Z]{0,2})\s*$")


def _quantity(value: Any, field: str) -> Decimal:
    if isinstance(value, bool):
        raise QuantityError(f"{field}: {value!r} is not a quantity")
    if isinstance(value, int | float):
        if value != value or value in (float("inf"), float("-inf")):
            raise QuantityError(f"{field}: {value!r} is not a finite quantity")
        if value < 0:
            raise QuantityError(f"{field}: {value!r} is negative")
        if value > 10**_MAX_EXPONENT:
            raise _TooLarge(f"{field}: {_short(value)} is too large a quantity")
        return Decimal(str(value))
    if not isinstance(value, str):
        raise QuantityError(f"{field}: {value!r} is not a quantity")
    m = _QUANTITY.match(value)
    if not m or m.group(2) not in _SUFFIX:
        raise QuantityError(
            f"{field}: {value!r} is not a Kubernetes quantity (e.g. '500m', '4', '64Gi')"
        )
    try:
        number = Decimal(m.group(1))
    except InvalidOperation as exc:  # pragma: no cover - the regex admits only numbers
        raise QuantityError(f"{field}: {value!r} is not a number") from exc
    # Beyond any machine or fleet by far; a huge exponent ('1e999999') would otherwise
    # cost minutes and memory as an integer, or overflow the decimal context.
    if number and number.adjusted() > _MAX_EXPONENT:
        raise _TooLarge(f"{field}: {_short(value)} is too large a quantity")
    # And with its suffix: '99999999999999999999Ti' is 1.1e32, past the same bound.
    quantity = number * _SUFFIX[m.group(2)]
    if quantity and quantity.adjusted() > _MAX_EXPONENT:
        raise _TooLarge(f"{field}: {_short(value)} is too large a quantity")
    return quantity


def parse_cpu(value: Any, field: str = "cpu") -> int:
    """CPU in millicores: ``"500m"`` -> 500, ``2`` -> 2000, ``"1.5"`` -> 1500."""
    q = _quantity(value, field) * 1000
    return int(q.to_integral_value(rounding="ROUND_CEILING"))


def parse_memory(value: Any, field: str = "memory") -> int:
    """Bytes: ``"64Gi"`` -> 68719476736; a bare number is bytes."""
    q = _quantity(value, field)
    return int(q.to_integral_value(rounding="ROUND_CEILING"))


_GPU = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._\-]*)\s*:\s*([0-9]+)\s*$")


def parse_gpu(value: Any, field: str = "gpu") -> tuple[int, str | None]:
    """GPUs: ``"H200:8"`` -> (8, "H200"); ``8`` or ``"8"`` -> (8, None) (any type)."""
    if isinstance(value, bool):
        raise QuantityError(f"{field}: {value!r} is not a GPU count")
    if isinstance(value, int):
        if value < 0:
            raise QuantityError(f"{field}: {value!r} is negative")
        if value > 10**_MAX_EXPONENT:
            raise _TooLarge(f"{field}: {_short(value)} is too large a GPU count")
        return value, None
    if isinstance(value, str):
        s = value.strip()
        m = _GPU.match(s)
        digits = s if s.isdigit() else m.group(2) if m else ""
        if len(digits.lstrip("0")) > _MAX_EXPONENT:
            raise _TooLarge(f"{field}: {_short(value)} is too large a GPU count")
        if s.isdigit():
            return int(s), None
        if m:
            return int(m.group(2)), m.group(1)
    raise QuantityError(f"{field}: {value!r} is not a GPU request (e.g. 'H200:8' or 8)")


@dataclass(frozen=True, slots=True)
class Pod:
    """The shape of one pod (or one node's capacity): what must fit on a single node.

    ``gpu_type`` None on a pod means any GPU type; on a node it means bare-count GPUs,
    which a typed pod never fits.
    """

    cpu: int = 0  # millicores
    memory: int = 0  # bytes
    eph: int = 0  # bytes of ephemeral storage
    gpu: int = 0
    gpu_type: str | None = None

    def sort_key(self) -> tuple[int, int, int, int]:
        """Largest first: by GPU, then CPU, memory, ephemeral storage."""
        return (self.gpu, self.cpu, self.memory, self.eph)

    def scaled(self, n: int) -> Pod:
        return Pod(self.cpu * n, self.memory * n, self.eph * n, self.gpu * n, self.gpu_type)

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"cpu": self.cpu, "memory": self.memory}
        if self.eph:
            d["eph"] = self.eph
        if self.gpu:
            d["gpu"] = self.gpu
            if self.gpu_type is not None:
                d["gpu_type"] = self.gpu_type
        return d

    @staticmethod
    def from_dict(d: Mapping[str, Any]) -> Pod:
        return Pod(
            int(d.get("cpu", 0)),
            int(d.get("memory", 0)),
            int(d.get("eph", 0)),
            int(d.get("gpu", 0)),
            d.get("gpu_type"),
        )


_POD_KEYS = ("cpu", "memory", "gpu", "ephemeral_storage")


def parse_pod(spec: Any, field: str = "resources") -> Pod:
    """A pod shape from ``{cpu, memory, gpu, ephemeral_storage}`` (all optional)."""
    if spec is None:
        return Pod()
    if not isinstance(spec, Mapping):
        raise QuantityError(f"{field}: expected a mapping of {', '.join(_POD_KEYS)}, got {spec!r}")
    for k in spec:
        if k not in _POD_KEYS:
            raise QuantityError(
                f"{field}.{k}: unknown resource (expected one of {', '.join(_POD_KEYS)})"
            )
    gpu, gtype = parse_gpu(spec["gpu"], f"{field}.gpu") if "gpu" in spec else (0, None)
    return Pod(
        cpu=parse_cpu(spec["cpu"], f"{field}.cpu") if "cpu" in spec else 0,
        memory=parse_memory(spec["memory"], f"{field}.memory") if "memory" in spec else 0,
        eph=parse_memory(spec["ephemeral_storage"], f"{field}.ephemeral_storage")
        if "ephemeral_storage" in spec
        else 0,
        gpu=gpu,
        gpu_type=gtype if gpu else None,
    )


#: The most one pod may ask for, and the most pods one action may have. They are checked
#: where a demand is declared (``headway submit``'s flags, the SDK's ``Resources`` and
#: environments), so a typo's extra zeros or ``1e400`` is refused there, named, instead of
#: travelling to the scheduler as a number no node will ever fit. Each is above the
#: largest machine sold, and the largest pod times the most pods stays far from a 64-bit
#: integer's end (256 Ti x 10,000 < 2**62), which the store's sums are kept in. Node
#: shapes and queue quotas are not bounded by them.
MAX_POD_CPU = 10_000 * 1000  # millicores: 10,000 cores
MAX_POD_MEMORY = 256 * 2**40  # 256Ti
MAX_POD_EPH = 256 * 2**40  # 256Ti
MAX_POD_GPU = 1024
MAX_PODS = 10_000


def parse_demand(
    *,
    cpu: Any = None,
    memory: Any = None,
    gpu: Any = None,
    ephemeral_storage: Any = None,
    prefix: str = "",
) -> Pod:
    """One pod's demand as a user declares it (None: not asked for), checked against the
    bounds above; typed GPUs must be at least one (``H100:0`` asks for nothing).

    Raises:
        QuantityError: a value is not a quantity, or out of bounds (named, with its value).
    """
    pod = Pod()
    if cpu is not None:
        millis = _bounded(parse_cpu, cpu, MAX_POD_CPU, f"{prefix}cpu", "10000 cores")
        pod = Pod(millis, pod.memory, pod.eph, pod.gpu, pod.gpu_type)
    if memory is not None:
        n = _bounded(parse_memory, memory, MAX_POD_MEMORY, f"{prefix}memory", "256Ti")
        pod = Pod(pod.cpu, n, pod.eph, pod.gpu, pod.gpu_type)
    if ephemeral_storage is not None:
        field = f"{prefix}ephemeral_storage"
        n = _bounded(parse_memory, ephemeral_storage, MAX_POD_EPH, field, "256Ti")
        pod = Pod(pod.cpu, pod.memory, n, pod.gpu, pod.gpu_type)
    if gpu is not None:
        try:
            count, gtype = parse_gpu(gpu, f"{prefix}gpu")
        except _TooLarge:
            raise _over(f"{prefix}gpu", gpu, str(MAX_POD_GPU)) from None
        if count > MAX_POD_GPU:
            raise _over(f"{prefix}gpu", gpu, str(MAX_POD_GPU))
        if gtype is not None and count == 0:
            raise QuantityError(
                f"{prefix}gpu: {gpu!r} asks for no GPUs of type {gtype}: ask for at least one"
                f" ('{gtype}:1'), or leave gpu out"
            )
        pod = Pod(pod.cpu, pod.memory, pod.eph, count, gtype if count else None)
    return pod


def _bounded(
    parse: Callable[[Any, str], int], value: Any, most: int, field: str, shown: str
) -> int:
    try:
        n = parse(value, field)
    except _TooLarge:
        raise _over(field, value, shown) from None
    if n > most:
        raise _over(field, value, shown)
    return n


def _over(field: str, value: Any, shown: str) -> QuantityError:
    return QuantityError(
        f"{field}: {_short(value)} is more than one pod may ask for (at most {shown})"
    )


def _short(value: Any) -> str:
    r = repr(value)
    return r if len(r) <= 40 else f"{r[:37]}..."


def check_pod_count(n: Any, field: str = "replicas", least: int = 1) -> int:
    """A number of pods: a whole number from ``least`` to :data:`MAX_PODS`.

    Raises:
        ValueError: it is not (named, with its value).
    """
    if isinstance(n, bool) or not isinstance(n, int) or n < least:
        raise ValueError(f"{field}: {_short(n)} must be a whole number, at least {least}")
    if n > MAX_PODS:
        raise ValueError(
            f"{field}: {_short(n)} is more pods than one action may have (at most {MAX_PODS})"
        )
    return n


@dataclass(frozen=True, slots=True)
class Quota:
    """``max_resources``: caps on the summed demand of a queue's in-flight work.

    A None field is unlimited. ``gpu_type`` None caps every GPU type together; a typed cap
    (``"H200:16"``) counts demand of that type only.
    """

    cpu: int | None = None
    memory: int | None = None
    eph: int | None = None
    gpu: int | None = None
    gpu_type: str | None = None

    def exceeded_by(self, usage: Usage, extra: Usage) -> bool:
        """Would ``usage`` plus ``extra`` exceed this quota?"""
        if self.cpu is not None and usage.cpu + extra.cpu > self.cpu:
            return True
        if self.memory is not None and usage.memory + extra.memory > self.memory:
            return True
        if self.eph is not None and usage.eph + extra.eph > self.eph:
            return True
        if self.gpu is not None:
            if self.gpu_type is None:
                return usage.gpu + extra.gpu > self.gpu
            return usage.gpu_of(self.gpu_type) + extra.gpu_of(self.gpu_type) > self.gpu
        return False

    def to_dict(self) -> dict[str, Any]:
        return {
            "cpu": self.cpu,
            "memory": self.memory,
            "eph": self.eph,
            "gpu": self.gpu,
            "gpu_type": self.gpu_type,
        }

    @staticmethod
    def from_dict(d: Mapping[str, Any]) -> Quota:
        return Quota(d.get("cpu"), d.get("memory"), d.get("eph"), d.get("gpu"), d.get("gpu_type"))


def parse_quota(spec: Any, field: str = "max_resources") -> Quota | None:
    """``max_resources`` from ``{cpu, memory, gpu, ephemeral_storage}``; None if absent."""
    if spec is None:
        return None
    pod = parse_pod(spec, field)
    return Quota(
        cpu=pod.cpu if "cpu" in spec else None,
        memory=pod.memory if "memory" in spec else None,
        eph=pod.eph if "ephemeral_storage" in spec else None,
        gpu=pod.gpu if "gpu" in spec else None,
        gpu_type=pod.gpu_type if "gpu" in spec else None,
    )


class Usage:
    """A mutable sum of pods: what a queue, a run or a gang holds.

    GPUs are kept in total and per declared type, so both a bare and a typed quota can be
    checked against the same sum.
    """

    __slots__ = ("cpu", "eph", "gpu", "gpu_by_type", "memory")

    def __init__(self) -> None:
        self.cpu = 0
        self.memory = 0
        self.eph = 0
        self.gpu = 0
        self.gpu_by_type: dict[str, int] = {}

    @staticmethod
    def of(pods: Iterable[Pod]) -> Usage:
        u = Usage()
        if isinstance(pods, tuple) and len(pods) >= 8 and all(p is pods[0] for p in pods):
            # One pod object repeated (an SWF job): add it once, scaled.
            u.add_pod(pods[0].scaled(len(pods)))
            return u
        for p in pods:
            u.add_pod(p)
        return u

    def add_pod(self, p: Pod, sign: int = 1) -> None:
        self.cpu += sign * p.cpu
        self.memory += sign * p.memory
        self.eph += sign * p.eph
        if p.gpu:
            self.gpu += sign * p.gpu
            if p.gpu_type is not None:
                self.gpu_by_type[p.gpu_type] = self.gpu_by_type.get(p.gpu_type, 0) + sign * p.gpu

    def add(self, other: Usage, sign: int = 1) -> None:
        self.cpu += sign * other.cpu
        self.memory += sign * other.memory
        self.eph += sign * other.eph
        self.gpu += sign * other.gpu
        for t, n in other.gpu_by_type.items():
            self.gpu_by_type[t] = self.gpu_by_type.get(t, 0) + sign * n

    def gpu_of(self, gpu_type: str) -> int:
        return self.gpu_by_type.get(gpu_type, 0)

    def is_zero(self) -> bool:
        return not (self.cpu or self.memory or self.eph or self.gpu)

    def __repr__(self) -> str:
        return (
            f"Usage(cpu={self.cpu}m, memory={self.memory}, eph={self.eph}, gpu={self.gpu},"
            f" by_type={self.gpu_by_type})"
        )


def total(pods: Sequence[Pod]) -> Usage:
    """The summed demand of a gang."""
    return Usage.of(pods)
