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
from temporalio.common import SearchAttributeKey


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


@activity.defn(name="bench.noop_local")
async def noop_local(x: str) -> str:
    return x


def _keyword(name: str) -> SearchAttributeKey[str]:
    return SearchAttributeKey.for_keyword(name)


@workflow.defn(name="BenchLifecycleWorkflow", sandboxed=False)
class LifecycleWorkflow:
    """The Temporal operations of Headway's action lifecycle, without Headway's logic.

    What an action does besides the bare workflow's one activity: a local activity before
    it (Headway's lease write and admission wait), one after it (the release), and two
    search-attribute writes (state at admission, state at the end); started with a memo,
    unsandboxed, as Headway's action is. Its rate is the ceiling of any design that keeps
    those guarantees (a durable lease and release, the state visible in the Web UI).
    """

    @workflow.run
    async def run(self, activity_queue: str) -> None:
        await workflow.execute_local_activity(
            "bench.noop_local", "put", start_to_close_timeout=timedelta(seconds=30)
        )
        workflow.upsert_search_attributes(
            [
                _keyword("HeadwayState").value_set("running"),
                _keyword("HeadwayReason").value_set("Admitted"),
                _keyword("HeadwayQueue").value_set("bench"),
                _keyword("HeadwayTenant").value_set("bench"),
                _keyword("HeadwayRun").value_set(workflow.info().workflow_id),
                _keyword("HeadwayCluster").value_set("sim"),
            ]
        )
        await workflow.execute_activity(
            "bench.noop", task_queue=activity_queue, start_to_close_timeout=timedelta(seconds=30)
        )
        await workflow.execute_local_activity(
            "bench.noop_local", "finish", start_to_close_timeout=timedelta(seconds=30)
        )
        workflow.upsert_search_attributes(
            [
                _keyword("HeadwayState").value_set("succeeded"),
                _keyword("HeadwayReason").value_set("Succeeded"),
            ]
        )
