"""The bare-Temporal side of bench/e2e_throughput.py: one workflow, one no-op activity.

Its own tiny module so the sandbox (default runner, as Headway's workflows use) imports
nothing but temporalio for it.
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
    async def run(self) -> None:
        await workflow.execute_activity("bench.noop", start_to_close_timeout=timedelta(seconds=30))
