"""Shared helpers of the Headway benchmarks (dev server, fake cluster, statistics)."""

from __future__ import annotations

import os
import statistics
import sys
from collections.abc import Sequence
from pathlib import Path

from headway import protocol
from headway.protocol import ActionEvent, ActionEventKind, DispatchRequest
from headway.scheduler.model import ClusterSpec, NodeGroup
from headway.scheduler.resources import Pod
from temporalio import activity
from temporalio.common import SearchAttributeKey
from temporalio.testing import WorkflowEnvironment

TEMPORAL = Path(sys.executable).parent / "temporal"
GI = 2**30


async def start_server(metrics_port: int | None = None) -> WorkflowEnvironment:
    """A dev server on free ports, with Headway's search attributes registered.

    ``metrics_port``: serve the server's Prometheus metrics there (``/metrics``).
    """
    extra = [a for kv in protocol.SERVER_DYNAMIC_CONFIG for a in ("--dynamic-config-value", kv)]
    if metrics_port is not None:
        extra += ["--metrics-port", str(metrics_port)]
    return await WorkflowEnvironment.start_local(
        dev_server_existing_path=str(TEMPORAL),
        search_attributes=[SearchAttributeKey.for_keyword(n) for n in protocol.SEARCH_ATTRIBUTES],
        dev_server_log_level="error",
        dev_server_extra_args=extra,
        data_converter=protocol.data_converter(),
    )


def big_fleet(name: str = "sim") -> list[ClusterSpec]:
    """A simulated cluster with room for everything the benchmarks submit."""
    return [ClusterSpec(name, (NodeGroup("cpu", 1000, Pod(cpu=64000, memory=256 * GI)),))]


@activity.defn(name=protocol.RUN_ACTION_ACTIVITY)
async def instant_run(req: DispatchRequest) -> ActionEvent:
    """The simulated cluster with room: every action succeeds at once."""
    return ActionEvent(req.action_id, ActionEventKind.SUCCEEDED, req.cluster, exit_code=0)


@activity.defn(name=protocol.DELETE_ACTION_ACTIVITY)
async def instant_delete(req: DispatchRequest) -> int:
    return 0


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
