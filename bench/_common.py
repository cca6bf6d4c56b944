"""Shared helpers of the Headway benchmarks: calibration, statistics, dev server, fleet.

Importing this module imports nothing of Temporal (``start_server`` does, when called;
the simulated cluster's activities are in ``bench/_activities.py``): ``bench/core_pass.py``
times the core in a process whose heap its calibration import leaves as it was.

Calibration (``/work/shared/specs/benchmarks.md``): machines here differ by 2-3x in
single-core speed from one session to the next, so every benchmark measures ``calib_us``
(``python -m timeit "sum(range(10000))"``, its best of 5 repeats, in microseconds per
loop) at its start and at its end, reports both and their mean, and prints each time also
normalized to a 100 us machine (``time * 100 / calib_us``, with the mean) under a key
``normalized``: see ``calib_us``, ``calibration`` and ``normalize``.
"""

from __future__ import annotations

import os
import re
import statistics
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from headway.scheduler.model import ClusterSpec, NodeGroup
from headway.scheduler.resources import Pod

if TYPE_CHECKING:
    from temporalio.testing import WorkflowEnvironment

TEMPORAL = Path(sys.executable).parent / "temporal"
GI = 2**30


async def start_server(metrics_port: int | None = None) -> WorkflowEnvironment:
    """A dev server on free ports, with Headway's search attributes registered.

    ``metrics_port``: serve the server's Prometheus metrics there (``/metrics``).
    """
    from headway import protocol
    from headway.workflows.action import SEARCH_ATTRIBUTE_KEYS
    from temporalio.testing import WorkflowEnvironment

    extra = [a for kv in protocol.SERVER_DYNAMIC_CONFIG for a in ("--dynamic-config-value", kv)]
    if metrics_port is not None:
        extra += ["--metrics-port", str(metrics_port)]
    return await WorkflowEnvironment.start_local(
        dev_server_existing_path=str(TEMPORAL),
        search_attributes=SEARCH_ATTRIBUTE_KEYS,
        dev_server_log_level="error",
        dev_server_extra_args=extra,
        data_converter=protocol.data_converter(),
    )


def big_fleet(name: str = "sim") -> list[ClusterSpec]:
    """A simulated cluster with room for everything the benchmarks submit."""
    return [ClusterSpec(name, (NodeGroup("cpu", 1000, Pod(cpu=64000, memory=256 * GI)),))]


def _ticks(pid: int | str) -> float:
    """User+system CPU seconds of a process, from /proc (Linux only; 0 elsewhere)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _children(pid: int) -> list[int]:
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                ppid = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            if ppid == pid:
                out.append(int(d.name))
    return out


class CpuMeter:
    """CPU seconds spent by this process and by the dev server (its child) over a span.

    Both sides share two cores, so throughput is really CPU per workflow: this says
    whose CPU it is.
    """

    def __init__(self) -> None:
        self.server = _children(os.getpid())

    def read(self) -> tuple[float, float]:
        return _ticks("self"), sum(_ticks(p) for p in self.server)


def summary(xs: Sequence[float]) -> dict[str, float]:
    return {
        "median": round(statistics.median(xs), 3),
        "min": round(min(xs), 3),
        "max": round(max(xs), 3),
    }


def pct(xs: Sequence[float], p: float) -> float:
    if not xs:
        return 0.0
    s = sorted(xs)
    return float(s[min(len(s) - 1, round(p / 100 * (len(s) - 1)))])


#: The calibration loop of ``/work/shared/specs/benchmarks.md``.
CALIB_STMT = "sum(range(10000))"
#: The reference machine's calibration: a time ``t`` reads as ``t * 100 / calib_us`` there.
REFERENCE_US = 100.0
_TIMEIT = re.compile(r"best of \d+: ([0-9.]+) (nsec|usec|msec|sec) per loop")
_UNIT_US = {"nsec": 1e-3, "usec": 1.0, "msec": 1e3, "sec": 1e6}


def calib_us() -> float:
    """``python -m timeit "sum(range(10000))"`` in this environment's Python: the best of
    its 5 repeats, in microseconds per loop (lower is faster; the reference machine is
    100 us). Run as a process of its own, so the caller's heap and threads do not
    count, and it leaves nothing behind in the caller."""
    out = subprocess.run(
        [sys.executable, "-m", "timeit", "-r", "5", CALIB_STMT],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    m = _TIMEIT.search(out)
    if m is None:
        raise RuntimeError(f"unexpected timeit output: {out!r}")
    return round(float(m.group(1)) * _UNIT_US[m.group(2)], 2)


def calibration(start: float, end: float) -> dict[str, float]:
    """The ``calib_us`` key: the calibration at the start and at the end, and their mean."""
    return {"start": start, "end": end, "mean": round((start + end) / 2, 2)}


def _scaled(x: float, factor: float) -> float:
    y = x * factor
    return round(y) if abs(y) >= 1000 else round(y, 4)


def normalize(figures: Mapping[str, Any], calib: float) -> dict[str, Any]:
    """``figures`` as on a 100 us machine, for a run whose calibration (mean) was
    ``calib``: every number ``t`` becomes ``t * 100 / calib``, in nested mappings and
    lists alike, except under a key naming a rate (containing ``per_s``), which scales
    the other way (``r * calib / 100``). Non-numbers (None, strings, booleans) stay.

    Pass only the figures that are times or rates: counts, sizes and ratios do not
    depend on the machine's speed."""
    return {k: _norm(v, calib, rate="per_s" in k) for k, v in figures.items()}


def _norm(v: Any, calib: float, rate: bool) -> Any:
    if isinstance(v, Mapping):
        return {k: _norm(x, calib, rate or "per_s" in k) for k, x in v.items()}
    if isinstance(v, list | tuple):
        return [_norm(x, calib, rate) for x in v]
    if isinstance(v, bool) or not isinstance(v, int | float):
        return v
    return _scaled(v, calib / REFERENCE_US if rate else REFERENCE_US / calib)
