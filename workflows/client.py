"""Starter-side helpers the CLI and the SDK call. Stable API; all async.

Every helper takes a connected ``temporalio.client.Client``. Scheduler calls address the
tenant's scheduler workflow by ``protocol.scheduler_workflow_id(tenant)``; config calls
start it if absent (``ensure_scheduler``).
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Sequence
from typing import Any

from headway import protocol
from headway.protocol import SubmitRequest
from headway.scheduler.model import ClusterSpec
from headway.workflows.action import (
    ActionResult,
    ActionStatus,
    ActionWorkflow,
    start_attributes,
)
from headway.workflows.scheduler import SchedulerWorkflow
from headway.workflows.shared import NUDGE_SIGNAL, SchedulerInput
from temporalio.api.enums.v1 import IndexedValueType
from temporalio.api.operatorservice.v1 import AddSearchAttributesRequest
from temporalio.client import (
    Client,
    WorkflowFailureError,
    WorkflowHandle,
)
from temporalio.common import WorkflowIDConflictPolicy
from temporalio.exceptions import ApplicationError, CancelledError
from temporalio.service import RPCError, RPCStatusCode

__all__ = [
    "action_state",
    "cancel",
    "ensure_scheduler",
    "ensure_search_attributes",
    "get_fleet",
    "get_org",
    "get_queues",
    "nudge_scheduler",
    "set_org",
    "submit",
    "update_queue",
    "upsert_queue",
    "wait_result",
    "why",
]


async def submit(
    client: Client, req: SubmitRequest
) -> WorkflowHandle[ActionWorkflow, ActionResult]:
    """Start an action's workflow (id ``protocol.action_workflow_id(tenant, action_id)``).

    The workflow enqueues itself with its shard scheduler (starting it if needed). The
    request is stamped with today's ``protocol.ACTION_REVISION`` unless it names one.
    """
    if req.revision == 0:
        req = dataclasses.replace(req, revision=protocol.ACTION_REVISION)
    sa, memo = start_attributes(req)
    return await client.start_workflow(
        ActionWorkflow.run,
        req,
        id=protocol.action_workflow_id(req.tenant, req.action_id),
        task_queue=protocol.CONTROL_TASK_QUEUE,
        search_attributes=sa,
        memo=memo,
        priority=protocol.tenant_priority(req.tenant),
    )


async def ensure_scheduler(
    client: Client, tenant: str, fleet: Sequence[ClusterSpec] = ()
) -> WorkflowHandle[SchedulerWorkflow, None]:
    """Start the tenant's scheduler workflow if it is not running; return its handle."""
    return await client.start_workflow(
        SchedulerWorkflow.run,
        SchedulerInput(tenant=tenant, fleet=[c.to_dict() for c in fleet]),
        id=protocol.scheduler_workflow_id(tenant),
        task_queue=protocol.CONTROL_TASK_QUEUE,
        id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
        priority=protocol.tenant_priority(tenant),
    )


async def _update(
    client: Client, tenant: str, name: str, arg: Any, fleet: Sequence[ClusterSpec] = ()
) -> dict[str, Any]:
    """Execute a scheduler update, retrying when it raced a continue-as-new.

    An update that reaches a run in the very task that continues it as new is aborted
    by the server ("aborted by closing workflow"); the same update against the workflow
    id then lands on the new run.
    """
    for attempt in range(10):
        h = await ensure_scheduler(client, tenant, fleet)
        try:
            out: dict[str, Any] = await h.execute_update(name, arg)
            return out
        except RPCError as err:
            if err.status != RPCStatusCode.NOT_FOUND or attempt == 9:
                raise
        await asyncio.sleep(0.05 * (attempt + 1))
    raise AssertionError("unreachable")


async def upsert_queue(
    client: Client, tenant: str, spec: dict[str, Any], fleet: Sequence[ClusterSpec] = ()
) -> dict[str, Any]:
    """Create or replace a queue (``QueueSpec.to_dict()`` notation); returns it as applied.

    Raises:
        temporalio.client.WorkflowUpdateFailedError: invalid spec (message names the field).
    """
    return await _update(client, tenant, protocol.UPSERT_QUEUE_UPDATE, spec, fleet)


async def update_queue(
    client: Client, tenant: str, name: str, changes: dict[str, Any]
) -> dict[str, Any]:
    """Change knobs of a queue live (scenario-file notation; None unsets). Returns the spec."""
    return await _update(
        client, tenant, protocol.UPDATE_QUEUE_UPDATE, {"name": name, "changes": changes}
    )


async def set_org(client: Client, tenant: str, org: dict[str, Any]) -> dict[str, Any]:
    """Replace the tenant's org limits (``OrgLimits.to_dict()`` notation)."""
    return await _update(client, tenant, protocol.SET_ORG_UPDATE, org)


async def nudge_scheduler(
    client: Client, tenant: str, queues: Sequence[str], fleet: Sequence[ClusterSpec] = ()
) -> None:
    """Tell the tenant's scheduler that ``queues`` have new leases in the store.

    Actions submitted through ``submit`` nudge by themselves; call this after loading
    leases in bulk (``LeaseStore.put_many``), which writes without signalling.
    """
    h = await ensure_scheduler(client, tenant, fleet)
    for q in queues:
        await h.signal(NUDGE_SIGNAL, f"q:{q}")


async def get_org(client: Client, tenant: str) -> dict[str, Any]:
    """The tenant's current org limits (``OrgLimits.to_dict()`` notation)."""
    h = client.get_workflow_handle(protocol.scheduler_workflow_id(tenant))
    result: dict[str, Any] = await h.query("org")
    return result


async def get_queues(client: Client, tenant: str) -> dict[str, dict[str, Any]]:
    """Per queue: config and stats (waiting, running, usage, blocked head, ...)."""
    h = client.get_workflow_handle(protocol.scheduler_workflow_id(tenant))
    out: dict[str, dict[str, Any]] = await h.query("queues")
    return out


async def get_fleet(client: Client, tenant: str) -> dict[str, Any]:
    """Clusters the tenant's scheduler knows, with their last capacity reports."""
    h = client.get_workflow_handle(protocol.scheduler_workflow_id(tenant))
    out: dict[str, Any] = await h.query("fleet")
    return out


async def why(client: Client, tenant: str, action_id: str) -> dict[str, Any]:
    """Why an action is where it is, from the scheduler that decides it.

    Returns ``{"action_id", "state", "reason", "reasons", "message"}``; ``state`` None
    means the action is not in the scheduler's window (see ``action_state`` for its own
    view: queued in the store, ended, ...).
    """
    h = client.get_workflow_handle(protocol.scheduler_workflow_id(tenant))
    out: dict[str, Any] = await h.query("why", action_id)
    return out


async def action_state(client: Client, tenant: str, action_id: str) -> ActionStatus:
    """The action workflow's own ``state`` query (state, queue, cluster, reasons, events)."""
    h = client.get_workflow_handle(protocol.action_workflow_id(tenant, action_id))
    return await h.query(ActionWorkflow.state)


async def cancel(client: Client, tenant: str, action_id: str) -> None:
    """Request cancellation of an action (waiting: leaves the queue; running: pods deleted)."""
    await client.get_workflow_handle(protocol.action_workflow_id(tenant, action_id)).cancel()


async def wait_result(handle: WorkflowHandle[Any, Any]) -> ActionResult:
    """Wait for an action to end; failures, rejections and cancellation become results.

    Returns:
        ``ActionResult`` with state ``succeeded``, ``failed``, ``rejected`` or
        ``cancelled``.
    """
    try:
        res = await handle.result()
    except WorkflowFailureError as err:
        cause = err.cause
        if isinstance(cause, CancelledError):
            try:
                st: ActionStatus = await handle.query(ActionWorkflow.state)
                action_id = st.action_id
            except Exception:  # no worker to answer: fall back to the workflow id
                action_id = handle.id.rsplit("-", 1)[-1]
            return ActionResult(action_id=action_id, state="cancelled", reason="Cancelled")
        if isinstance(cause, ApplicationError) and cause.details:
            d = cause.details[0]
            if isinstance(d, dict) and "state" in d:
                return ActionResult(**d)
        raise
    if isinstance(res, ActionResult):
        return res
    return ActionResult(**res)


async def ensure_search_attributes(client: Client, namespace: str | None = None) -> None:
    """Register Headway's search attributes (idempotent; needs operator permissions)."""
    try:
        await client.operator_service.add_search_attributes(
            AddSearchAttributesRequest(
                namespace=namespace or client.namespace,
                search_attributes={
                    name: IndexedValueType.INDEXED_VALUE_TYPE_KEYWORD
                    for name in protocol.SEARCH_ATTRIBUTES
                },
            )
        )
    except Exception as err:  # already registered
        if "already" not in str(err).lower():
            raise
