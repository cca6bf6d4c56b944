"""The bare-Temporal side of bench/e2e_throughput.py: one workflow, one no-op activity.

Its own tiny module so the sandbox (the default runner) imports nothing but temporalio
for it.

``activity_queue`` says where the activity runs. Headway's cluster activity always runs
on the cluster's own task queue, on another worker than the action's workflow, so the
like-for-like bare workflow sends its activity to a separate activity worker too. With
``None`` the activity goes to the workflow's own task queue, where the SDK executes it
eagerly (handed back in the workflow task's response: no activity task through matching,
no poll), a shortcut a design with cluster-local workers can never take.
"""

from __future__ import annotations

from datetime import timedelta

from temporalio import activity, workflow


@activity.defn(name="bench.noop")
async def noop() -> None:
    return None


@workflow.defn(name="BenchBareWorkflow")
class BareWorkflow:
    @workflow.run
    async def run(self, activity_queue: str | None = None) -> None:
        await workflow.execute_activity(
            "bench.noop", task_queue=activity_queue, start_to_close_timeout=timedelta(seconds=30)
        )
