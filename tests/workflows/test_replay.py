"""Replay the checked-in histories with today's code; an incompatible change must fail.

Any change to either workflow's command sequence must be guarded (``workflow.patched``, or
a new ``SubmitRequest.revision`` for the action) so these histories (and every running
workflow in production) still replay.
"""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest
from headway import protocol
from headway.protocol import SubmitRequest
from headway.workflows.action import ActionResult, ActionWorkflow
from headway.workflows.scheduler import SchedulerWorkflow
from temporalio import workflow
from temporalio.client import WorkflowHistory
from temporalio.worker import Replayer

HISTORIES = Path(__file__).parent / "histories"


def load(name: str) -> WorkflowHistory:
    return WorkflowHistory.from_json(f"replay-{name}", (HISTORIES / f"{name}.json").read_text())


@pytest.mark.parametrize(
    "name",
    [
        # Recorded before the patched changes (workflows started then must still replay) ...
        "action_ok",
        "action_cancelled",
        "scheduler",
        # ... and after: admit-in-first-task, lean-publish and local-dispatch paths.
        "action_ok_patched",
        "action_cancelled_patched",
        "scheduler_patched",
        # ... and revision 1 inputs (``protocol.ACTION_REVISION``): the same paths with no
        # patch markers at all.
        "action_ok_rev1",
        "action_cancelled_rev1",
        "scheduler_rev1",
        # ... and with lazy ends (``wants-ends`` kept by the scheduler): a waiting action
        # makes it sync at once to say so.
        "scheduler_lazyends",
        # ... and revision 2 inputs: no search attributes at start, written once in the
        # first task (with the state that task reached).
        "action_ok_rev2",
        "action_cancelled_rev2",
        # ... and a backlog refilled in bites, each next bite by a regular sync activity.
        "scheduler_bites",
        # ... and a shard whose pass once failed on every task: a capacity report left a
        # node overcommitted (free GPUs below zero) and fitting disagreed with itself
        # (recorded live under kill -9 faults; it ends where that task failed).
        "scheduler_overcommitted_node",
        # ... and the loop with one reader of inputs (patch ``serial-inputs``): handlers
        # only fill an inbox, the first iteration wakes after a regular door activity.
        "scheduler_serial",
        # ... and syncing of its own accord (patch ``safety-sync``).
        "scheduler_safety",
        # ... and a fresh run reading its stored configuration first (patch
        # ``config-from-store``), its changes stored with the door and audited.
        "scheduler_config",
        # ... and revision 4 (issue #23): an OOM retried as a new attempt with more
        # memory, and a pod that never started, requeued at its ready timeout, then
        # failed NotReady (``make_retry_histories``).
        "action_retry_oom_rev4",
        "action_ready_timeout_rev4",
        # ... and revision 5 (issue #22): an admission its cluster worker handed back
        # (a cordon the scheduler had not heard of), run once the node is uncordoned;
        # and a dispatch no worker took (its worker had just stopped), handed back, run
        # when a worker returned (``make_handback_histories``).
        "action_handback_rev5",
        "action_handback_dead_rev5",
        # ... and delivery that hands admissions over first (a local activity) and
        # signals the rest by regular dispatches (patch ``hand-over-first``, issue #26).
        "scheduler_handover",
    ],
)
async def test_checked_in_histories_replay(name: str) -> None:
    replayer = Replayer(
        workflows=[ActionWorkflow, SchedulerWorkflow], data_converter=protocol.data_converter()
    )
    result = await replayer.replay_workflow(load(name), raise_on_replay_failure=True)
    assert result.replay_failure is None


@workflow.defn(name=protocol.ACTION_WORKFLOW)
class IncompatibleActionWorkflow(ActionWorkflow):
    """Today's ActionWorkflow plus an unguarded timer before enqueueing."""

    @workflow.run
    async def run(self, req: SubmitRequest) -> ActionResult:
        await workflow.sleep(timedelta(seconds=1))
        return await super().run(req)


async def test_incompatible_change_fails_replay() -> None:
    replayer = Replayer(workflows=[IncompatibleActionWorkflow])
    result = await replayer.replay_workflow(load("action_ok"), raise_on_replay_failure=False)
    assert result.replay_failure is not None
    assert "nondetermin" in str(result.replay_failure).lower()


async def test_a_run_recorded_before_serial_inputs_may_not_replay() -> None:
    """Why the loop became serial (issue #20): recorded live, a control-plane worker
    killed mid-run, this history does not replay. The SDK handed the result of the sync
    at local-activity seq 124 to the workflow only in the next task, after that task's
    ``done`` nudge; so the loop synced again before its pass. On replay the result comes
    at once, the pass runs first and admits three actions: a dispatch meets a recorded
    sync marker (TMPRL1100). Runs recorded before ``serial-inputs`` replay through the
    old loop, kept as it was, so this stays so; such a run is reset to its last good
    task (docs/operations.md) and its next run is serial."""
    replayer = Replayer(workflows=[SchedulerWorkflow], data_converter=protocol.data_converter())
    result = await replayer.replay_workflow(
        load("scheduler_nondeterministic_after_kill"), raise_on_replay_failure=False
    )
    assert result.replay_failure is not None
    assert "TMPRL1100" in str(result.replay_failure)
