"""``ConfigHistoryWorkflow``: reads a queue's (or the org limits') audit trail from the
store for the CLI, which has no database of its own.

One short workflow per read, on the control plane's task queue, whose one activity runs
where the store is (``headway get queue NAME --history``, ``headway get org --history``).
Its id starts with ``headway-config-history-``; it never touches the scheduler's history.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from temporalio import workflow
from temporalio.common import RetryPolicy

with workflow.unsafe.imports_passed_through():
    from headway.workflows.shared import CONFIG_HISTORY_ACTIVITY

__all__ = ["ConfigHistoryWorkflow"]


@workflow.defn(name="HeadwayConfigHistory")
class ConfigHistoryWorkflow:
    """Answers the audit rows of ``{"tenant", "kind", "name", "limit"}``, oldest first."""

    @workflow.run
    async def run(self, req: dict[str, Any]) -> list[dict[str, Any]]:
        rows: list[dict[str, Any]] = await workflow.execute_activity(
            CONFIG_HISTORY_ACTIVITY,
            req,
            start_to_close_timeout=timedelta(seconds=30),
            retry_policy=RetryPolicy(maximum_attempts=3),
            result_type=list[dict[str, Any]],
        )
        return rows
