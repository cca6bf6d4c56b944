"""Shared helpers of the Headway benchmarks (dev server, fake cluster, statistics)."""

from __future__ import annotations

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


async def start_server() -> WorkflowEnvironment:
    """A dev server on free ports, with Headway's search attributes registered."""
    return await WorkflowEnvironment.start_local(
        dev_server_existing_path=str(TEMPORAL),
        search_attributes=[SearchAttributeKey.for_keyword(n) for n in protocol.SEARCH_ATTRIBUTES],
        dev_server_log_level="error",
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
