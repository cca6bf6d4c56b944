"""Starter-side helpers the CLI and the SDK call. Stable API; all async.

Every helper takes a connected ``temporalio.client.Client``. Scheduler calls address the
tenant's scheduler workflow by ``protocol.scheduler_workflow_id(tenant)``; config calls
start it if absent (``ensure_scheduler``).
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from headway import protocol
from headway.protocol import SubmitRequest
from headway.scheduler import demand_from_request
from headway.scheduler.model import ClusterSpec
from headway.workflows.action import (
    SA,
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
    WorkflowExecutionStatus,
    WorkflowFailureError,
    WorkflowHandle,
)
from temporalio.common import WorkflowIDConflictPolicy, WorkflowIDReusePolicy
from temporalio.exceptions import (
    ApplicationError,
    CancelledError,
    TerminatedError,
    WorkflowAlreadyStartedError,
)
from temporalio.exceptions import (
    TimeoutError as TemporalTimeoutError,
)
from temporalio.service import RPCError, RPCStatusCode

__all__ = [
    "ActionConflictError",
    "Submission",
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
    "submit_action",
    "update_queue",
    "upsert_queue",
    "wait_result",
    "why",
]


#: Fields that do not make two submissions of one id different: the code path revision
#: is stamped by the client library (``ACTION_REVISION``), not chosen by the user, and a
#: newer client resubmitting an older action's id is still the same submission.
_NOT_COMPARED = frozenset({"revision"})


@dataclass
class Submission:
    """What :func:`submit_action` answers.

    Attributes:
        handle: the action's workflow (the new one, or the one that already had the id).
        created: True when this call started the action; False when the id existed with
            the same submission, so nothing new was started (like ``kubectl apply`` of an
            unchanged object).
        state: the action's state now: ``submitting`` for a new one, else the existing
            action's (``waiting``, ``running``, ``succeeded``, ``failed``, ...).
        result: how the existing action ended, when it has.
    """

    handle: WorkflowHandle[ActionWorkflow, ActionResult]
    created: bool
    state: str
    result: ActionResult | None = None


class ActionConflictError(Exception):
    """The action id exists already with a different submission; nothing was changed.

    ``differences`` lists ``(field, existing value, submitted value)``; ``state`` is the
    existing action's state. The message names the tenant, the id and each field.
    """

    def __init__(
        self,
        tenant: str,
        action_id: str,
        state: str,
        differences: Sequence[tuple[str, Any, Any]],
        detail: str = "",
    ) -> None:
        self.tenant = tenant
        self.action_id = action_id
        self.state = state
        self.differences = list(differences)
        what = detail or "; ".join(
            f"{name}: {old!r} there, {new!r} here" for name, old, new in self.differences
        )
        super().__init__(
            f"action {action_id!r} (tenant {tenant!r}) already exists ({state}) with a "
            f"different submission: {what}. It was left as it is; submit under a new id"
        )


async def submit(
    client: Client, req: SubmitRequest
) -> WorkflowHandle[ActionWorkflow, ActionResult]:
    """Start an action's workflow (id ``protocol.action_workflow_id(tenant, action_id)``);
    idempotent by id, see :func:`submit_action` (this returns its ``handle``).

    Raises:
        ActionConflictError: the id exists with a different submission.
    """
    return (await submit_action(client, req)).handle


async def submit_action(client: Client, req: SubmitRequest) -> Submission:
    """Start an action's workflow, or answer with the action that already has its id.

    The workflow enqueues itself with its shard scheduler (starting it if needed). The
    request is stamped with today's ``protocol.ACTION_REVISION`` unless it names one.

    Idempotent by action id, for as long as the namespace retains the workflow: an id is
    never started twice, whether its action still runs or has ended. A second run of an
    ended id would write a lease the store and the scheduler already consider done, and
    wait for an admission that never comes; so the start rejects duplicates, and the
    existing action is compared with this request instead. The same submission (every
    field but ``revision``; the demand compared as parsed, so ``cpu="1"`` equals
    ``cpu=1``) answers with that action, ``created=False``; a different one raises.

    Raises:
        ActionConflictError: the id exists with a different submission (or belongs to a
            workflow that is not an action); nothing was started or changed.
    """
    if req.revision == 0:
        req = dataclasses.replace(req, revision=protocol.ACTION_REVISION)
    sa, memo = start_attributes(req)
    workflow_id = protocol.action_workflow_id(req.tenant, req.action_id)
    for attempt in range(3):
        try:
            handle = await client.start_workflow(
                ActionWorkflow.run,
                req,
                id=workflow_id,
                task_queue=protocol.CONTROL_TASK_QUEUE,
                search_attributes=sa,
                memo=memo,
                priority=protocol.tenant_priority(req.tenant),
                id_reuse_policy=WorkflowIDReusePolicy.REJECT_DUPLICATE,
            )
            return Submission(handle, created=True, state="submitting")
        except WorkflowAlreadyStartedError as err:
            existing = client.get_workflow_handle_for(
                ActionWorkflow.run, workflow_id, run_id=err.run_id
            )
        try:
            return await _existing(client, existing, req)
        except RPCError as err:
            # Gone between the start and the look (its retention ran out): start again.
            if err.status != RPCStatusCode.NOT_FOUND or attempt == 2:
                raise
    raise AssertionError("unreachable")


async def _existing(
    client: Client, handle: WorkflowHandle[ActionWorkflow, ActionResult], req: SubmitRequest
) -> Submission:
    """The action that already has ``req``'s id, if it is the same submission."""
    desc = await handle.describe()
    if desc.workflow_type != protocol.ACTION_WORKFLOW:
        status = desc.status.name.lower() if desc.status is not None else "unknown"
        raise ActionConflictError(
            req.tenant,
            req.action_id,
            status,
            [],
            f"its workflow {handle.id!r} is a {desc.workflow_type}, not an action",
        )
    result: ActionResult | None = None
    if desc.status == WorkflowExecutionStatus.RUNNING:
        state = desc.typed_search_attributes.get(SA["HeadwayState"]) or "submitting"
    else:
        result = await wait_result(handle, action_id=req.action_id)
        state = result.state
    before = await _started_request(client, handle)
    if before is None:
        raise ActionConflictError(
            req.tenant, req.action_id, state, [], "its submission could not be read back"
        )
    differences = _differences(before, req)
    if differences:
        raise ActionConflictError(req.tenant, req.action_id, state, differences)
    return Submission(handle, created=False, state=state, result=result)


async def _started_request(
    client: Client, handle: WorkflowHandle[ActionWorkflow, ActionResult]
) -> SubmitRequest | None:
    """The request an action's workflow was started with (its first history event)."""
    async for event in handle.fetch_history_events(page_size=1):
        payloads = event.workflow_execution_started_event_attributes.input.payloads
        try:
            values = await client.data_converter.decode(payloads, [SubmitRequest])
        except Exception:  # written by something else than an action's submit
            return None
        value = values[0] if values else None
        return value if isinstance(value, SubmitRequest) else None
    return None


def _differences(before: SubmitRequest, now: SubmitRequest) -> list[tuple[str, Any, Any]]:
    """``(field, before, now)`` for each field in which two submissions differ."""
    old, new = _flat(dataclasses.asdict(before)), _flat(dataclasses.asdict(now))
    if _same_demand(before, now):
        # Spelled differently, the same pods: not a difference.
        old = {k: v for k, v in old.items() if not k.startswith("demand.")}
        new = {k: v for k, v in new.items() if not k.startswith("demand.")}
    out = []
    for name in sorted(old.keys() | new.keys()):
        if name in _NOT_COMPARED:
            continue
        a, b = old.get(name), new.get(name)
        if a != b:
            out.append((name, a, b))
    return out


def _flat(d: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested dicts as dotted keys (``demand.resources.cpu``), so a difference names the
    exact field; None values are left out (absent and None mean the same here)."""
    out: dict[str, Any] = {}
    for key, value in d.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            out.update(_flat(value, f"{name}."))
        elif value is not None:
            out[name] = value
    return out


def _same_demand(a: SubmitRequest, b: SubmitRequest) -> bool:
    """Whether two demands parse to the same pods (False if either does not parse)."""
    try:
        return demand_from_request(dataclasses.asdict(a.demand)) == demand_from_request(
            dataclasses.asdict(b.demand)
        )
    except ValueError:
        return False


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


async def wait_result(
    handle: WorkflowHandle[Any, Any], *, action_id: str | None = None
) -> ActionResult:
    """Wait for an action to end; failures, rejections, cancellation and termination
    become results.

    Args:
        handle: the action's workflow.
        action_id: the action's id (else asked of the workflow, or read from its id).

    Returns:
        ``ActionResult`` with state ``succeeded``, ``failed``, ``rejected`` or
        ``cancelled``. A workflow terminated or timed out by hand (``temporal workflow
        terminate``) is ``failed`` with reason ``Terminated`` / ``TimedOut``: it ran no
        further, and the caller gets an answer rather than an exception.
    """
    try:
        res = await handle.result()
    except WorkflowFailureError as err:
        cause = err.cause
        if isinstance(cause, CancelledError):
            return ActionResult(
                action_id=await _action_id(handle, action_id), state="cancelled", reason="Cancelled"
            )
        if isinstance(cause, TerminatedError | TemporalTimeoutError):
            reason = "Terminated" if isinstance(cause, TerminatedError) else "TimedOut"
            return ActionResult(
                action_id=await _action_id(handle, action_id),
                state="failed",
                reason=reason,
                message=cause.message,
            )
        if isinstance(cause, ApplicationError) and cause.details:
            d = cause.details[0]
            if isinstance(d, dict) and "state" in d:
                return ActionResult(**d)
        raise
    if isinstance(res, ActionResult):
        return res
    return ActionResult(**res)


async def _action_id(handle: WorkflowHandle[Any, Any], given: str | None) -> str:
    """An ended action's id: ``given``, else its memo (set at start), else its state."""
    if given is not None:
        return given
    try:
        memo = await (await handle.describe()).memo()
        found = memo.get("action_id")
        if isinstance(found, str):
            return found
        st: ActionStatus = await handle.query(ActionWorkflow.state)
        return st.action_id
    except Exception:  # nothing to ask: fall back to the workflow id's last part
        return handle.id.rsplit("-", 1)[-1]


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
