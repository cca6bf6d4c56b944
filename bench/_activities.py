"""The simulated cluster with room, as Temporal activities (bench/e2e_throughput.py,
bench/scheduler_history.py): every action succeeds at once.

A module of their own so that ``bench/_common.py`` imports nothing of Temporal: a
benchmark of the core alone (``bench/core_pass.py``) keeps the heap it always had.
"""

from __future__ import annotations

from headway import protocol
from headway.protocol import ActionEvent, ActionEventKind, DispatchRequest
from temporalio import activity


@activity.defn(name=protocol.RUN_ACTION_ACTIVITY)
async def instant_run(req: DispatchRequest) -> ActionEvent:
    """The simulated cluster with room: every action succeeds at once."""
    return ActionEvent(req.action_id, ActionEventKind.SUCCEEDED, req.cluster, exit_code=0)


@activity.defn(name=protocol.DELETE_ACTION_ACTIVITY)
async def instant_delete(req: DispatchRequest) -> int:
    return 0
