"""Starter-side helpers the CLI and the SDK call. Stable API; all async.

Every helper takes a connected ``temporalio.client.Client``. Scheduler calls address the
tenant's scheduler workflow by ``protocol.scheduler_workflow_id(tenant)``; config calls
start it if absent (``ensure_scheduler``).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import getpass
import socket
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from headway import protocol
from headway.protocol import SubmitRequest
from headway.scheduler import demand_from_request
from headway.scheduler.model import ClusterSpec
from headway.workflows.action import (
    SA,
    SUBMITTED_UPDATE,
    ActionResult,
    ActionStatus,
    ActionWorkflow,
    SubmitAnswer,
    start_attributes,
)
from headway.workflows.config import ConfigHistoryWorkflow
from headway.workflows.scheduler import SchedulerWorkflow
from headway.workflows.shared import HEALTH, NUDGE_SIGNAL, SchedulerInput
from temporalio.api.enums.v1 import IndexedValueType
from temporalio.api.operatorservice.v1 import AddSearchAttributesRequest
from temporalio.client import (
    Client,
    WithStartWorkflowOperation,
    WorkflowExecutionDescription,
    WorkflowExecutionStatus,
    WorkflowFailureError,
    WorkflowHandle,
    WorkflowUpdateFailedError,
    WorkflowUpdateRPCTimeoutOrCancelledError,
)
from temporalio.common import (
    TypedSearchAttributes,
    WorkflowIDConflictPolicy,
    WorkflowIDReusePolicy,
)
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
    "ACTION_STATES",
    "ActionConflictError",
    "ActionDetails",
    "ActionNotFoundError",
    "ActionRow",
    "CancelOutcome",
    "Submission",
    "action_details",
    "action_state",
    "actions_query",
    "cancel",
    "cancel_action",
    "changed_by",
    "config_history",
    "ensure_scheduler",
    "ensure_search_attributes",
    "get_fleet",
    "get_org",
    "get_queues",
    "get_snapshot",
    "list_actions",
    "nudge_scheduler",
    "register_cluster",
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
        state: the action's state now: ``waiting`` (or ``running``, admitted at once) for
            a new one, else the existing action's (``waiting``, ``running``,
            ``succeeded``, ``failed``, ...).
        result: how the existing action ended, when it has.
        answer: the door's answer: to a new one, to an existing one still running
            (awaited if it had not passed its door yet) and to one that was refused;
            None for an existing one that was accepted and has ended.
    """

    handle: WorkflowHandle[ActionWorkflow, ActionResult]
    created: bool
    state: str
    result: ActionResult | None = None
    answer: SubmitAnswer | None = None


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
    """Submit an action: the root span of the action's trace (see :func:`_submit_action`)."""
    from headway import telemetry

    # The CLI and the SDK both submit here: the trace starts with the submission, and
    # the client's tracing interceptor carries it into the workflow and its activities.
    with telemetry.tracer().start_as_current_span(
        f"submit {req.action_id}",
        attributes={
            "headway.tenant": req.tenant,
            "headway.queue": req.queue,
            "headway.action": req.action_id,
        },
    ):
        return await _submit_action(client, req)


def _web_metadata(req: SubmitRequest) -> tuple[str | None, str | None]:
    """The action's static summary and details in the Web UI (its queue and demand); none
    for a demand that does not parse (the workflow rejects it, saying why)."""
    from headway.scheduler import demand_from_request
    from headway.workflows import summary

    try:
        kind, pods = demand_from_request(dataclasses.asdict(req.demand))
    except ValueError:
        return None, None
    details = summary.static_details(
        tenant=req.tenant,
        queue=req.queue,
        run=req.run or req.action_id,
        task=req.task,
        kind=kind.value,
        pods=pods,
    )
    return summary.static_summary(req.queue, pods), details


async def _submit_action(client: Client, req: SubmitRequest) -> Submission:
    """Submit an action and answer once its queue's door decided, or answer with the
    action that already has its id.

    One round trip (update-with-start): the action's workflow is started together with
    its ``submitted`` update, which returns once the door (``LeaseStore.put_lease``) has
    taken the action in (its lease written, the scheduler nudged) or refused it: the
    ``answer`` (``accepted``; else ``state`` "rejected", its reason, message and
    ``retry_after``). A refused one has left nothing behind: no lease, and a workflow
    that completed at once as ``rejected`` (``wait_result`` reads it). The SDK and the
    CLI raise on a rejection (``headway.sdk.SubmissionRejected``). The request is
    stamped with today's ``protocol.ACTION_REVISION`` unless it names one.

    Idempotent by action id, for as long as the namespace retains the workflow: an id is
    never run twice, whether its action still runs or has ended. A second run of an
    ended id would write a lease the store and the scheduler already consider done, and
    wait for an admission that never comes; so the start rejects duplicates, and the
    existing action is compared with this request instead. The same submission (every
    field but ``revision``; the demand compared as parsed, so ``cpu="1"`` equals
    ``cpu=1``) answers with that action, ``created=False``; a different one raises. An
    id whose action was rejected ran nothing, and is submitted again (a rate-limited
    client retries with the same id).

    Raises:
        ActionConflictError: the id exists with a different submission (or belongs to a
            workflow that is not an action); nothing was started or changed.
    """
    if req.revision == 0:
        req = dataclasses.replace(req, revision=protocol.ACTION_REVISION)
    for attempt in range(6):
        try:
            return await _submit_once(client, req)
        except WorkflowUpdateRPCTimeoutOrCancelledError:
            # The door's answer did not come back in the RPC's time (a loaded server):
            # the workflow exists, the same submission asks it again.
            if attempt == 5:
                raise
            await asyncio.sleep(0.2 * 2**attempt)
        except RPCError as err:
            # Lost track of its own answer: a loaded server whose start outlived the
            # client's deadline answers the client's own retry "not started:
            # StartDeduped" although it started the workflow. Submission is idempotent by
            # id: the same submission again finds that action.
            # So is an update-with-start whose new workflow's first task failed (timed
            # out on a loaded worker: "Workflow Task in failed state") or whose update
            # the server aborted: the workflow exists, the same submission finds it.
            # Not a server that cannot be reached at all: the Temporal client has
            # retried the connection for ~10 s already, and six more rounds of that kept
            # the SDK and the CLI silent for a minute before they said so.
            transient = (
                "StartDeduped" in str(err)
                or "Workflow Task in failed state" in str(err)
                or "update was aborted" in str(err)
                or err.status
                in (
                    RPCStatusCode.DEADLINE_EXCEEDED,
                    RPCStatusCode.UNAVAILABLE,
                    RPCStatusCode.RESOURCE_EXHAUSTED,
                )
            ) and not _unreachable(err)
            if not transient or attempt == 5:
                raise
            await asyncio.sleep(0.2 * 2**attempt)
    raise AssertionError("unreachable")


async def _submit_once(client: Client, req: SubmitRequest) -> Submission:
    """One try of :func:`submit_action`."""
    sa, memo = start_attributes(req)
    web_summary, web_details = _web_metadata(req)
    workflow_id = protocol.action_workflow_id(req.tenant, req.action_id)
    reuse = WorkflowIDReusePolicy.REJECT_DUPLICATE
    for attempt in range(4):
        start = WithStartWorkflowOperation(
            ActionWorkflow.run,
            req,
            id=workflow_id,
            task_queue=protocol.CONTROL_TASK_QUEUE,
            id_conflict_policy=WorkflowIDConflictPolicy.FAIL,
            id_reuse_policy=reuse,
            search_attributes=sa,
            memo=memo,
            priority=protocol.tenant_priority(req.tenant),
            static_summary=web_summary,
            static_details=web_details,
        )
        try:
            answer: SubmitAnswer = await client.execute_update_with_start_workflow(
                SUBMITTED_UPDATE, start_workflow_operation=start, result_type=SubmitAnswer
            )
        except WorkflowAlreadyStartedError as err:
            _read_start_failure(start)
            existing = client.get_workflow_handle_for(
                ActionWorkflow.run, workflow_id, run_id=err.run_id
            )
        except BaseException:
            _read_start_failure(start)
            raise
        else:
            handle = await start.workflow_handle()
            return Submission(handle, created=True, state=answer.state, answer=answer)
        try:
            if await _ended_rejected(existing):
                # It ran nothing and holds nothing: this submission starts it afresh.
                reuse = WorkflowIDReusePolicy.ALLOW_DUPLICATE
                continue
            return await _existing(client, existing, req)
        except RPCError as err:
            # Gone between the start and the look (its retention ran out): start again.
            if err.status != RPCStatusCode.NOT_FOUND or attempt == 3:
                raise
    raise AssertionError("unreachable")


def _unreachable(err: RPCError) -> bool:
    """Whether ``err`` says no connection to the server could be made (nothing listens
    at the address, or the network is gone), as opposed to a server that answered it is
    unavailable for now."""
    text = err.message.lower()
    return err.status == RPCStatusCode.UNAVAILABLE and (
        "tcp connect error" in text or "connection refused" in text or "dns error" in text
    )


def _read_start_failure(start: WithStartWorkflowOperation[Any, Any]) -> None:
    """Read the failure the SDK also set on the start operation's own handle (it does
    for a refused start, a transport error or a cancelled call), so that asyncio does not
    print "Future exception was never retrieved" when the operation is dropped. The SDK
    offers no public way to look without awaiting, and awaiting a handle the SDK never
    settled (a failure before the call was sent) would wait for ever."""
    fut = getattr(start, "_workflow_handle", None)
    if isinstance(fut, asyncio.Future) and fut.done() and not fut.cancelled():
        fut.exception()


async def _ended_rejected(handle: WorkflowHandle[ActionWorkflow, ActionResult]) -> bool:
    """Whether an action's workflow has ended, and as ``rejected``."""
    desc = await handle.describe()
    if desc.workflow_type != protocol.ACTION_WORKFLOW:
        return False
    if desc.status in (None, WorkflowExecutionStatus.RUNNING):
        return False
    return (await wait_result(handle)).state == "rejected"


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
    running = desc.status == WorkflowExecutionStatus.RUNNING
    result: ActionResult | None = None
    if running:
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
    # The same submission. One still running may not have passed its door yet (a retry
    # racing its own first try): its answer is the door's, awaited like the first
    # try's, so a refusal is never reported as a run that silently never starts.
    answer = await _door_answer(handle) if running else None
    if answer is not None:
        return Submission(handle, created=False, state=answer.state, answer=answer)
    if result is None:
        result = await wait_result(handle, action_id=req.action_id)
    if result.state == "rejected":
        # Refused at its door, ended before it could say so to this call: the same
        # answer (a rejected id is submitted afresh only by a later call).
        answer = SubmitAnswer(req.action_id, False, "rejected", result.reason, result.message)
    return Submission(handle, created=False, state=result.state, result=result, answer=answer)


async def _door_answer(
    handle: WorkflowHandle[ActionWorkflow, ActionResult],
) -> SubmitAnswer | None:
    """The door's answer to a running action (at once when it has passed the door);
    None when the action ended before it could answer."""
    try:
        answer: SubmitAnswer = await handle.execute_update(
            SUBMITTED_UPDATE, result_type=SubmitAnswer
        )
        return answer
    except (RPCError, WorkflowUpdateFailedError):
        # Completed meanwhile (an update cannot reach a closed workflow): its result
        # says how it ended.
        return None


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
        SchedulerInput(
            tenant=tenant,
            fleet=[c.to_dict() for c in fleet],
            cluster_silent_s=HEALTH.cluster_silent_s,
        ),
        id=protocol.scheduler_workflow_id(tenant),
        task_queue=protocol.CONTROL_TASK_QUEUE,
        id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
        priority=protocol.scheduler_priority(tenant),
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


def changed_by(source: str = "sdk", who: str | None = None) -> dict[str, str]:
    """Who makes a configuration change, for its audit row: ``who`` (default: the local
    user at this host) and ``source`` (``cli``, ``cli --edit``, ``sdk``, ...)."""
    if who is None:
        try:
            user = getpass.getuser()
        except (KeyError, OSError):
            user = "unknown"
        who = f"{user}@{socket.gethostname()}"
    return {"who": who, "source": source}


async def upsert_queue(
    client: Client,
    tenant: str,
    spec: dict[str, Any],
    fleet: Sequence[ClusterSpec] = (),
    *,
    by: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """Create or replace a queue (``QueueSpec.to_dict()`` notation); returns it as applied.

    ``by`` (:func:`changed_by`; default: this user, from the SDK) goes on the audit row.

    Raises:
        temporalio.client.WorkflowUpdateFailedError: invalid spec (message names the field).
    """
    arg = {**spec, "by": dict(by or changed_by())}
    return await _update(client, tenant, protocol.UPSERT_QUEUE_UPDATE, arg, fleet)


async def declare_environment(client: Client, tenant: str, spec: dict[str, Any]) -> dict[str, Any]:
    """Declare a reusable environment to the tenant's scheduler (``EnvironmentSpec``
    notation: ``{name, resources, replicas, concurrency, idle_ttl}``); idempotent.

    Raises:
        temporalio.client.WorkflowUpdateFailedError: a bad field, or another shape of an
            environment in use (the message names the fields).
    """
    return await _update(client, tenant, protocol.DECLARE_ENVIRONMENT_UPDATE, spec)


async def update_queue(
    client: Client,
    tenant: str,
    name: str,
    changes: dict[str, Any],
    *,
    by: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """Change knobs of a queue live (scenario-file notation; None unsets). Returns the spec."""
    arg = {"name": name, "changes": changes, "by": dict(by or changed_by())}
    return await _update(client, tenant, protocol.UPDATE_QUEUE_UPDATE, arg)


async def remove_queue(
    client: Client, tenant: str, name: str, *, by: Mapping[str, str] | None = None
) -> dict[str, Any]:
    """Remove an empty queue; refused (WorkflowUpdateFailedError) while it holds work."""
    arg = {"name": name, "by": dict(by or changed_by())}
    return await _update(client, tenant, protocol.REMOVE_QUEUE_UPDATE, arg)


async def register_cluster(
    client: Client, tenant: str, spec: dict[str, Any], *, by: Mapping[str, str] | None = None
) -> dict[str, Any]:
    """Add a cluster to the tenant's fleet or replace its declared shape
    (``ClusterSpec.to_dict()`` notation); stored and audited. Returns it as applied.

    Raises:
        temporalio.client.WorkflowUpdateFailedError: invalid spec (message names the field).
    """
    arg = {**spec, "by": dict(by or changed_by())}
    return await _update(client, tenant, protocol.REGISTER_CLUSTER_UPDATE, arg)


async def set_org(
    client: Client, tenant: str, org: dict[str, Any], *, by: Mapping[str, str] | None = None
) -> dict[str, Any]:
    """Replace the tenant's org limits (``OrgLimits.to_dict()`` notation)."""
    arg = {**org, "by": dict(by or changed_by())}
    return await _update(client, tenant, protocol.SET_ORG_UPDATE, arg)


async def config_history(
    client: Client, tenant: str, kind: str, name: str = "", limit: int = 50
) -> list[dict[str, Any]]:
    """The audit trail of a queue (``kind`` "queue") or of the org limits ("org"), oldest
    first: ``{"change", "who", "source", "at", "old", "new"}`` each. Read from the store
    by a short workflow on the control plane (``ConfigHistoryWorkflow``).

    Raises:
        TimeoutError: no control-plane worker answered within 20 s.
    """
    req = {"tenant": tenant, "kind": kind, "name": name, "limit": limit}
    handle = await client.start_workflow(
        ConfigHistoryWorkflow.run,
        req,
        id=f"headway-config-history-{tenant}-{uuid.uuid4().hex[:12]}",
        task_queue=protocol.CONTROL_TASK_QUEUE,
        execution_timeout=timedelta(seconds=60),
        priority=protocol.tenant_priority(tenant),
    )
    try:
        return await asyncio.wait_for(handle.result(), 20.0)
    except TimeoutError:
        with contextlib.suppress(RPCError):
            await handle.terminate("no control-plane worker answered")
        raise


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


async def get_fleet(client: Client, tenant: str, wait_s: float = 10.0) -> dict[str, Any]:
    """Clusters the tenant's scheduler knows, with their last capacity reports.

    A scheduler that has just started learns its fleet in its first tasks: its answer
    is awaited (up to ``wait_s``) until it says the fleet is known, so a cluster name
    is never judged against an empty fleet.
    """
    h = client.get_workflow_handle(protocol.scheduler_workflow_id(tenant))
    deadline = time.monotonic() + wait_s
    while True:
        out: dict[str, Any] = await h.query("fleet")
        if out.get("known", True) or time.monotonic() >= deadline:
            return out
        await asyncio.sleep(0.1)


async def get_waiting_reasons(client: Client, tenant: str) -> dict[str, tuple[str, list[str]]]:
    """Each waiting action's current reason and every reason so far, from its scheduler."""
    h = client.get_workflow_handle(protocol.scheduler_workflow_id(tenant))
    out: dict[str, list[Any]] = await h.query("waiting_reasons")
    return {k: (str(v[0]), [str(r) for r in v[1]]) for k, v in out.items()}


async def why(client: Client, tenant: str, action_id: str) -> dict[str, Any]:
    """Why an action is where it is, from the scheduler that decides it.

    Returns ``{"action_id", "state", "reason", "reasons", "message"}``; ``state`` None
    means the action is not in the scheduler's window (see ``action_state`` for its own
    view: queued in the store, ended, ...).
    """
    h = client.get_workflow_handle(protocol.scheduler_workflow_id(tenant))
    # A retried action (revision 4+) waits or runs as its latest attempt (``ACTION~N``):
    # asked by the action's id, the answer is that attempt's, which it names; between
    # two attempts (a backoff) it has no lease, and its own state says why.
    try:
        st: ActionStatus | None = await action_state(client, tenant, action_id)
    except Exception:  # not an action, or ended and no worker to replay it: as asked
        st = None
    if st is not None and st.attempts and st.state not in _ENDED:
        last = st.attempts[-1]
        if st.reason == "Retrying" or (st.reason == "CapacityChanged" and last.outcome):
            # Between two attempts (a backoff, or the pause after a hand-back).
            return {
                "action_id": last.action_id,
                "state": None,
                "reason": st.reason,
                "reasons": [st.reason],
                "message": f"attempt {last.number} ended {last.outcome}: {last.message};"
                f" {last.retry}"
                if st.reason == "CapacityChanged"
                else f"attempt {last.number} ended {last.outcome}: {last.retry}",
            }
        action_id = last.action_id
    out: dict[str, Any] = await h.query("why", action_id)
    if st is not None and len(st.attempts) > 1:
        before = st.attempts[-2]
        if before.outcome == "CapacityChanged":
            # Revision 5+: its cluster handed the last admission back; what it waits
            # for now is the scheduler's answer above.
            out["handed_back"] = (
                f"attempt {before.number} ended CapacityChanged on {before.cluster}:"
                f" {before.message}; {before.retry}"
            )
    return out


#: States an action ends in.
_ENDED = frozenset({"succeeded", "failed", "cancelled", "rejected"})


async def action_state(client: Client, tenant: str, action_id: str) -> ActionStatus:
    """The action workflow's own ``state`` query (state, queue, cluster, reasons, events)."""
    h = client.get_workflow_handle(protocol.action_workflow_id(tenant, action_id))
    return await h.query(ActionWorkflow.state)


async def cancel(client: Client, tenant: str, action_id: str) -> None:
    """Request cancellation of an action (waiting: leaves the queue; running: pods deleted)."""
    await client.get_workflow_handle(protocol.action_workflow_id(tenant, action_id)).cancel()


async def wait_result(
    handle: WorkflowHandle[Any, Any],
    *,
    action_id: str | None = None,
    rpc_timeout: timedelta | None = None,
) -> ActionResult:
    """Wait for an action to end; failures, rejections, cancellation and termination
    become results.

    Args:
        handle: the action's workflow.
        action_id: the action's id (else asked of the workflow, or read from its id).
        rpc_timeout: the deadline of each call to the server (its long poll); past it,
            ``temporalio.service.RPCError`` (ask again).

    Returns:
        ``ActionResult`` with state ``succeeded``, ``failed``, ``rejected`` or
        ``cancelled``. A workflow terminated or timed out by hand (``temporal workflow
        terminate``) is ``failed`` with reason ``Terminated`` / ``TimedOut``: it ran no
        further, and the caller gets an answer rather than an exception.
    """
    try:
        res = await handle.result(rpc_timeout=rpc_timeout)
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
                    name: IndexedValueType.INDEXED_VALUE_TYPE_KEYWORD_LIST
                    if kind == "KeywordList"
                    else IndexedValueType.INDEXED_VALUE_TYPE_KEYWORD
                    for name, kind in protocol.SEARCH_ATTRIBUTES.items()
                },
            )
        )
    except Exception as err:  # already registered
        if "already" not in str(err).lower():
            raise


# --- reading and cancelling actions (``headway get actions``, ``describe``, ``cancel``) ---

#: Every state an action is shown in, in lifecycle order (``submitting``: started, its
#: first task not yet through, so Temporal's visibility has no attributes for it yet).
ACTION_STATES = ("submitting", "waiting", "running", "succeeded", "failed", "cancelled", "rejected")

#: ``WorkflowExecutionStatus`` values for which the action's own state is kept, and the
#: state (and reason) the others end as whatever the attributes last said: a workflow
#: terminated or timed out by hand ran no further, a cancelled one was cancelled.
_CLOSED_AS: dict[WorkflowExecutionStatus, tuple[str, str | None]] = {
    WorkflowExecutionStatus.CANCELED: ("cancelled", "Cancelled"),
    WorkflowExecutionStatus.TERMINATED: ("failed", "Terminated"),
    WorkflowExecutionStatus.TIMED_OUT: ("failed", "TimedOut"),
}


class ActionNotFoundError(Exception):
    """No action of that id in the tenant (never submitted, or past retention)."""

    def __init__(self, tenant: str, action_id: str) -> None:
        self.tenant = tenant
        self.action_id = action_id
        super().__init__(f"action {action_id!r} not found in tenant {tenant!r}")


@dataclass
class ActionRow:
    """One action as Temporal's visibility lists it (no workflow is asked anything)."""

    action_id: str
    tenant: str
    queue: str | None
    run: str | None
    state: str
    reason: str | None
    cluster: str | None
    workflow_id: str
    status: str  # the workflow's execution status, lower case (running, completed, ...)
    started_at: float | None = None
    ended_at: float | None = None
    #: A waiting action's place in its queue (1: next) and its forecast start in
    #: seconds from now (None: not within the forecast); ``get actions`` fills them in
    #: from the scheduler's state.
    position: int | None = None
    starts_in_s: float | None = None


def _q(value: str) -> str:
    """A string literal of Temporal's list filter."""
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def actions_query(
    tenant: str,
    *,
    queue: str | None = None,
    state: str | None = None,
    run: str | None = None,
    in_flight: bool = False,
) -> str:
    """The visibility filter that lists a tenant's actions.

    Actions of revision 2+ get their attributes in their first task, so an action just
    started has none yet: those (running, no ``HeadwayTenant``) are listed too, and
    :func:`list_actions` keeps the ones whose memo (set at start) matches.
    """
    if state is not None and state not in ACTION_STATES:
        raise ValueError(f"state: {state!r} is not one of {', '.join(ACTION_STATES)}")
    published = [f"HeadwayTenant = {_q(tenant)}"]
    if queue is not None:
        published.append(f"HeadwayQueue = {_q(queue)}")
    if run is not None:
        published.append(f"HeadwayRun = {_q(run)}")
    running = "ExecutionStatus = 'Running'"
    if state in ("waiting", "running"):
        published.append(f"HeadwayState = {_q(state)} AND {running}")
    elif state == "failed":
        published.append(
            "(HeadwayState = 'failed' OR ExecutionStatus = 'Terminated'"
            " OR ExecutionStatus = 'TimedOut')"
        )
    elif state == "cancelled":
        published.append("(HeadwayState = 'cancelled' OR ExecutionStatus = 'Canceled')")
    elif state in ("succeeded", "rejected"):
        published.append(f"HeadwayState = {_q(state)}")
    if in_flight and state not in ("waiting", "running"):  # those say it already
        published.append(running)
    clauses = [] if state == "submitting" else [" AND ".join(published)]
    if state in (None, "submitting"):
        clauses.append(f"(HeadwayTenant IS NULL AND {running})")
    which = clauses[0] if len(clauses) == 1 else "(" + ") OR (".join(clauses) + ")"
    return f"WorkflowType = {_q(protocol.ACTION_WORKFLOW)} AND ({which})"


def _state_of(
    status: WorkflowExecutionStatus | None, sa: TypedSearchAttributes
) -> tuple[str, str | None]:
    """An action's state and reason from its attributes and its workflow's status."""
    state = sa.get(SA["HeadwayState"])
    reason = sa.get(SA["HeadwayReason"])
    if status is None or status == WorkflowExecutionStatus.RUNNING:
        return (state or "submitting", reason)
    if status in _CLOSED_AS:
        if status == WorkflowExecutionStatus.CANCELED or state not in ACTION_STATES[3:]:
            return _CLOSED_AS[status]
        return (state, reason)  # it had ended in its own terms first
    if state in ACTION_STATES[3:]:
        return (state, reason)
    return (
        ("succeeded", reason) if status == WorkflowExecutionStatus.COMPLETED else ("failed", reason)
    )


async def list_actions(
    client: Client,
    tenant: str,
    *,
    queue: str | None = None,
    state: str | None = None,
    run: str | None = None,
    in_flight: bool = False,
    limit: int | None = 100,
) -> list[ActionRow]:
    """The tenant's actions from Temporal's visibility, newest first.

    Args:
        queue, state, run: keep only actions with this queue, state (one of
            ``ACTION_STATES``) or run.
        in_flight: only actions whose workflow still runs (submitting, waiting, running).
        limit: at most this many rows (None: all).

    Visibility lags the workflows by a moment (it is written asynchronously).
    """
    query = actions_query(tenant, queue=queue, state=state, run=run, in_flight=in_flight)
    prefix = protocol.action_workflow_id(tenant, "")
    out: list[ActionRow] = []
    async for w in client.list_workflows(query):
        sa = w.typed_search_attributes
        memo: dict[str, Any] = {}
        if sa.get(SA["HeadwayTenant"]) is None:
            memo = dict(await w.memo())
            own_run = memo.get("run") or memo.get("action_id")
            if memo.get("tenant") != tenant or (queue is not None and memo.get("queue") != queue):
                continue
            if run is not None and own_run != run:
                continue
        st, reason = _state_of(w.status, sa)
        if state is not None and st != state:
            continue
        action_id = memo.get("action_id") or w.id.removeprefix(prefix)
        out.append(
            ActionRow(
                action_id=str(action_id),
                tenant=tenant,
                queue=sa.get(SA["HeadwayQueue"]) or memo.get("queue"),
                run=sa.get(SA["HeadwayRun"]) or memo.get("run") or memo.get("action_id"),
                state=st,
                reason=reason,
                cluster=sa.get(SA["HeadwayCluster"]),
                workflow_id=w.id,
                status=w.status.name.lower() if w.status is not None else "unknown",
                started_at=w.start_time.timestamp() if w.start_time else None,
                ended_at=w.close_time.timestamp() if w.close_time else None,
            )
        )
        if limit is not None and len(out) >= limit:
            break
    return out


@dataclass
class ActionDetails:
    """What Temporal knows of one action: its workflow, its submission, its own state
    query, and how it ended. The scheduler's side (why, position) is asked separately.

    Attributes:
        request: the submission, read back from the workflow's first event.
        status: the action's ``state`` query (None when it could not be asked: an ended
            action is answered by replaying it, which needs a control-plane worker).
        result: how it ended, when it has.
        attempts: attempts of its cluster activity (1 = no retry), 0 if never dispatched.
        last_failure: the message of the cluster activity's last failed attempt.
        cancel_requested_by: who asked for the cancellation (Temporal's identity).
    """

    action_id: str
    tenant: str
    workflow_id: str
    run_id: str | None
    state: str
    reason: str | None
    execution_status: str
    started_at: float | None
    ended_at: float | None
    queue: str | None = None
    run: str | None = None
    cluster: str | None = None
    request: SubmitRequest | None = None
    status: ActionStatus | None = None
    result: ActionResult | None = None
    attempts: int = 0
    last_failure: str = ""
    cancel_requested_by: str | None = None
    history_length: int = 0
    memo: dict[str, Any] = field(default_factory=dict)


async def _describe_action(
    client: Client, tenant: str, action_id: str
) -> tuple[WorkflowHandle[Any, Any], WorkflowExecutionDescription]:
    """The action's workflow handle and description; ActionNotFoundError if there is none
    (a missing namespace is not a missing action: that error stands)."""
    handle = client.get_workflow_handle(protocol.action_workflow_id(tenant, action_id))
    try:
        desc = await handle.describe()
    except RPCError as err:
        if err.status == RPCStatusCode.NOT_FOUND and "namespace" not in err.message.lower():
            raise ActionNotFoundError(tenant, action_id) from err
        raise
    if desc.workflow_type != protocol.ACTION_WORKFLOW:
        raise ActionNotFoundError(tenant, action_id)
    return handle, desc


async def action_details(client: Client, tenant: str, action_id: str) -> ActionDetails:
    """Everything Temporal holds about one action (see :class:`ActionDetails`).

    Raises:
        ActionNotFoundError: no such action in the tenant.
    """
    workflow_id = protocol.action_workflow_id(tenant, action_id)
    handle, desc = await _describe_action(client, tenant, action_id)
    sa = desc.typed_search_attributes
    state, reason = _state_of(desc.status, sa)
    memo = dict(await desc.memo())
    d = ActionDetails(
        action_id=action_id,
        tenant=tenant,
        workflow_id=workflow_id,
        run_id=desc.run_id,
        state=state,
        reason=reason,
        execution_status=desc.status.name.lower() if desc.status is not None else "unknown",
        started_at=desc.start_time.timestamp() if desc.start_time else None,
        ended_at=desc.close_time.timestamp() if desc.close_time else None,
        queue=sa.get(SA["HeadwayQueue"]) or memo.get("queue"),
        run=sa.get(SA["HeadwayRun"]) or memo.get("run") or action_id,
        cluster=sa.get(SA["HeadwayCluster"]),
        memo=memo,
    )
    await _read_history(client, handle, d)
    for pending in desc.raw_description.pending_activities:
        if pending.activity_type.name == protocol.RUN_ACTION_ACTIVITY:
            d.attempts = max(d.attempts, pending.attempt)
            if pending.HasField("last_failure"):
                d.last_failure = pending.last_failure.message
    try:
        d.status = await handle.query(ActionWorkflow.state)
    except Exception:  # an ended action needs a worker to replay it: shown without
        d.status = None
    if d.status is not None:
        d.cluster = d.status.cluster or d.cluster
    if desc.status not in (None, WorkflowExecutionStatus.RUNNING):
        d.result = await wait_result(handle, action_id=action_id)
        if desc.status not in _CLOSED_AS:
            d.state, d.reason = d.result.state, d.result.reason or d.reason
        d.cluster = d.result.cluster or d.cluster
    return d


async def _read_history(client: Client, handle: WorkflowHandle[Any, Any], d: ActionDetails) -> None:
    """The submission (first event), the cluster activity's attempts and failures, and
    who asked for a cancellation, from the action's history (a few dozen events)."""
    from temporalio.api.enums.v1 import EventType

    run_action_events: set[int] = set()
    async for event in handle.fetch_history_events():
        d.history_length += 1
        kind = event.event_type
        if kind == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_STARTED:
            payloads = event.workflow_execution_started_event_attributes.input.payloads
            try:
                values = await client.data_converter.decode(payloads, [SubmitRequest])
            except Exception:  # not an action's submission: left out
                values = []
            if values and isinstance(values[0], SubmitRequest):
                d.request = values[0]
        elif kind == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
            attrs = event.activity_task_scheduled_event_attributes
            if attrs.activity_type.name == protocol.RUN_ACTION_ACTIVITY:
                run_action_events.add(event.event_id)
                d.attempts = max(d.attempts, 1)
        elif kind == EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED:
            started = event.activity_task_started_event_attributes
            if started.scheduled_event_id in run_action_events:
                d.attempts = max(d.attempts, started.attempt)
                if started.HasField("last_failure"):
                    d.last_failure = started.last_failure.message
        elif kind == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_CANCEL_REQUESTED:
            who = event.workflow_execution_cancel_requested_event_attributes.identity
            d.cancel_requested_by = who or "unknown"


@dataclass
class CancelOutcome:
    """What :func:`cancel_action` did.

    Attributes:
        before: the action's state when asked (``submitting``/``waiting``/``running``, or
            how it had already ended).
        requested: whether a cancellation was sent (False: it had ended already).
        result: how it ended (None: not waited for, or still ending at the timeout).
        cluster: where it ran, if it had been admitted.
    """

    action_id: str
    before: str
    requested: bool
    result: ActionResult | None = None
    cluster: str | None = None


async def cancel_action(
    client: Client, tenant: str, action_id: str, *, wait: bool = True, timeout_s: float = 120.0
) -> CancelOutcome:
    """Cancel one action and (by default) wait until it has ended.

    The action's workflow is cancelled: a waiting action leaves its queue (its lease ends
    as ``cancelled``); a running one has its cluster activity cancelled, which deletes
    the pods, then a delete activity makes sure none is left, and the reservation is
    released. Either way the end is recorded once and the action ends ``cancelled``.
    An action that had ended already is left as it is.

    Raises:
        ActionNotFoundError: no such action in the tenant.
    """
    workflow_id = protocol.action_workflow_id(tenant, action_id)
    handle, desc = await _describe_action(client, tenant, action_id)
    before, _ = _state_of(desc.status, desc.typed_search_attributes)
    cluster = desc.typed_search_attributes.get(SA["HeadwayCluster"])
    if desc.status != WorkflowExecutionStatus.RUNNING:
        result = await wait_result(handle, action_id=action_id)
        return CancelOutcome(action_id, result.state, False, result, result.cluster or cluster)
    # Cancel this run, not whatever run the id names later.
    run_handle = client.get_workflow_handle(workflow_id, run_id=desc.run_id)
    await run_handle.cancel()
    if not wait:
        return CancelOutcome(action_id, before, requested=True, cluster=cluster)
    try:
        result = await asyncio.wait_for(
            wait_result(run_handle, action_id=action_id), timeout=timeout_s
        )
    except TimeoutError:
        return CancelOutcome(action_id, before, requested=True, cluster=cluster)
    return CancelOutcome(action_id, before, True, result, result.cluster or cluster)


async def tell_start_estimates(
    client: Client, tenant: str, scores: dict[str, dict[str, Any]]
) -> None:
    """Hand the tenant's scheduler the scores of its queues' start estimates."""
    from headway.workflows.scheduler import START_ESTIMATES_SIGNAL

    h = client.get_workflow_handle(protocol.scheduler_workflow_id(tenant))
    await h.signal(START_ESTIMATES_SIGNAL, scores)


async def start_estimate(
    client: Client, tenant: str, action_id: str, default_runtime: float = 3600.0
) -> dict[str, Any] | None:
    """Where a waiting action stands: ``{"position", "of", "queue", "starts_in_s",
    "starts_in_p90_s", "cluster"}`` (its place in its queue, 1 next; its forecast start
    in seconds from now, None when not within the forecast, and where; the p90 adds its
    queue's scored lateness, None until some were scored), from the scheduler's state run
    forward on a copy (``headway.scheduler.insight.forecast``). None: it is not waiting
    in the scheduler's window (running, ended, or queued in the store behind the window)."""
    from headway.scheduler import Scheduler
    from headway.scheduler.insight import forecast

    data = await get_snapshot(client, tenant)
    sched, now = Scheduler.from_snapshot(data["snapshot"]), float(data["now"])
    a = sched.actions.get(action_id)
    q = sched.queues.get(a.queue) if a is not None else None
    if a is None or q is None or a.state != "waiting":
        return None
    ids = [w.id for w in q.waiting]
    f = forecast(sched, now, default_runtime=default_runtime)
    at = f.starts.get(action_id)
    p50 = None if at is None else max(0.0, at - now)
    return {
        "queue": a.queue,
        "position": ids.index(action_id) + 1 if action_id in ids else None,
        "of": len(ids),
        "starts_in_s": p50,
        "starts_in_p90_s": await start_p90(client, tenant, a.queue, p50),
        "cluster": f.clusters.get(action_id),
    }


async def start_p90(client: Client, tenant: str, queue: str, p50: float | None) -> float | None:
    """The p90 start: the forecast plus how late its queue's actions started against
    theirs, at the 90th percentile (as the control plane scored them); None before any
    was scored."""
    if p50 is None:
        return None
    scores = ((await get_queues(client, tenant)).get(queue) or {}).get("start_estimates")
    if not scores:
        return None
    return p50 + float(scores["p90_margin_s"])


async def get_snapshot(client: Client, tenant: str) -> dict[str, Any]:
    """The tenant scheduler's ``snapshot`` query: ``{"now", "snapshot"}`` (the core's
    state as ``Scheduler.to_snapshot()`` writes it, and the scheduler's clock)."""
    h = client.get_workflow_handle(protocol.scheduler_workflow_id(tenant))
    out: dict[str, Any] = await h.query("snapshot")
    return out
