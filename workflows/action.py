"""``ActionWorkflow``: one action's lifecycle, from enqueue to its end.

Lifecycle: ``waiting`` (lease written, scheduler nudged) -> ``running`` (admitted; the
cluster-local ``RUN_ACTION_ACTIVITY`` creates the pods and relays informer events) ->
``succeeded`` | ``failed`` | ``cancelled`` | ``rejected``.

Submit path: the action computes its demand once (the resolved queue and the demand are
in the workflow input and the lease, so both survive restarts), then a *local* activity
writes the lease to the store and nudges the shard scheduler only when the queue's flag
was clear (see ``headway.activities.store``). The scheduler answers with one
``ADMIT_SIGNAL`` (or ``REJECT_SIGNAL``) delivered by its batched dispatch activity.

Release exactly once: every exit path after the lease is written goes through one
``finish_lease`` local activity (``finished`` / ``cancelled`` / ``rejected``); the store
records the end once and hands it to the scheduler once, and the core's ``finish`` and
``cancel`` are idempotent besides.

Reasons while waiting: the scheduler does not signal actions when their reason changes
(that would be one signal per action per pass). ``HeadwayReason`` shows ``Waiting`` until
the control plane's poller tells an action that has waited a poll or more its current
reason (``REASON_SIGNAL``, only when it changed: within two ``HEADWAY_METRICS_INTERVAL_S``),
and the admission carries the pass's reasons (kept, searchable, in ``HeadwayReasons``);
the live "why" of a waiting action is the scheduler's ``why`` query
(``headway.workflows.client.why``), answered by the same state machine that schedules it.

The Web UI (Temporal user metadata): the start carries a static summary and details
(queue and demand, ``headway.workflows.summary``); the current details say what it waits
for, where it runs and after how long, and how it ended; each activity has a summary.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from datetime import timedelta
from typing import Any

from temporalio import workflow
from temporalio.common import (
    RetryPolicy,
    SearchAttributeKey,
    SearchAttributePair,
    SearchAttributeUpdate,
    TypedSearchAttributes,
)
from temporalio.exceptions import ActivityError, ApplicationError, CancelledError
from temporalio.exceptions import TimeoutError as ActivityTimeout

with workflow.unsafe.imports_passed_through():
    from headway import protocol, telemetry
    from headway.protocol import (
        ActionEvent,
        ActionEventKind,
        Admission,
        DispatchRequest,
        GangKind,
        PodSpec,
        SubmitRequest,
    )
    from headway.scheduler import demand_from_request
    from headway.scheduler.model import ActionSpec, DemandKind
    from headway.scheduler.model import RetryPolicy as QueueRetry
    from headway.scheduler.resources import Pod
    from headway.scheduler.retry import ATTEMPT_SEP, Retry, attempt_id, next_attempt
    from headway.workflows import shared, summary
    from headway.workflows.shared import (
        FINISH_LEASE_ACTIVITY,
        PUT_LEASE_ACTIVITY,
        PUT_LEASE_WAIT_ACTIVITY,
        REJECT_SIGNAL,
        REQUEUE_LEASE_ACTIVITY,
        RETRY_POLICY_ACTIVITY,
        FinishLeaseInput,
        PutLeaseInput,
        PutLeaseOutput,
        Rejection,
        RequeueLeaseInput,
    )

__all__ = [
    "ATTEMPT_SEP",
    "PARENT_LABEL",
    "REASONS_SA",
    "REASON_SIGNAL",
    "SA",
    "SEARCH_ATTRIBUTE_KEYS",
    "SUBMITTED_UPDATE",
    "ActionResult",
    "ActionStatus",
    "ActionWorkflow",
    "Attempt",
    "ReasonSeen",
    "SubmitAnswer",
    "WaitingReason",
    "attempt_id",
]

#: Typed search attribute keys of the Keyword ones, by ``protocol.SEARCH_ATTRIBUTES`` name.
SA = {
    name: SearchAttributeKey.for_keyword(name)
    for name, kind in protocol.SEARCH_ATTRIBUTES.items()
    if kind == "Keyword"
}
#: The keyword list of every reason the action waited for (see ``protocol``).
REASONS_SA = SearchAttributeKey.for_keyword_list("HeadwayReasons")
#: Every key, for servers started with them registered (tests, benchmarks).
SEARCH_ATTRIBUTE_KEYS: list[SearchAttributeKey[Any]] = [*SA.values(), REASONS_SA]

#: How long the first task's local activity waits for the admission in-process.
ADMIT_WAIT_S = 2.0
#: The same when the submitter waits for the answer (the ``submitted`` update): the
#: answer goes out only when the first task completes, so the wait is kept shorter. An
#: admission with room free comes within it on an idle control plane (nudge, sync, pass,
#: dispatch: tens of ms), but on a loaded one the path took 0.2-1 s (issue #26,
#: ``bench/trace_admission.py``): at 0.25 s, 60-90 % of actions missed it, and each
#: then cost an admission signal and a workflow task more, which on a CPU-bound machine
#: is throughput. At 1 s (with the scheduler's ``hand-over-first``), 97.5 % were handed
#: over and the shard ran 1.34x as many actions per second as the code before beside it
#: on the same server (median of 4 rounds). When work waits in the shard
#: (``wants-ends``) the first task does not wait at all.
ANSWER_WAIT_S = 1.0

#: Update on the action workflow: the submission's answer (``SubmitAnswer``), given as
#: soon as the door decided; the client sends it with the start (update-with-start).
SUBMITTED_UPDATE = "submitted"

#: Signal to a waiting action: the scheduler's current reason for it (``WaitingReason``).
REASON_SIGNAL = "waiting_reason"

#: Label an SDK task's child action carries: its parent action's id.
PARENT_LABEL = "headway.io/parent"

#: The ``Retry.cls`` of a hand-back: not a failure class, so no retry budget is used.
HANDBACK = "handback"
#: Revision 5+: hand-backs (``CapacityChanged``) an action takes before the next one
#: ends it. Each is followed by a fresh capacity report to its scheduler, so the same
#: cluster is chosen again only when its worker says there is room; the bound is for a
#: cluster whose room keeps going before the pods get there (a busy shared cluster), so
#: that an action never circles for ever: it ends failed ``CapacityChanged``, every
#: hand-back in its attempts.
MAX_HANDBACKS = 5
#: The wait before a handed-back action is requeued, doubled at each hand-back (1, 2, 4,
#: 8, 16 s): room another tenant's pending pods hold is in a report once they bind, so a
#: shared cluster settles instead of handing the same admission back at once.
HANDBACK_BACKOFF_S = 1.0


#: How long the delete of a cancelled or timed-out attempt's pods may wait for its
#: cluster's worker (schedule to close), seconds.
DELETE_WITHIN_S = 600.0
#: ``workflow.patched`` id: cancelling an attempt whose cluster never answered waits the
#: cluster silence interval for the delete, not ``DELETE_WITHIN_S``.
CANCEL_UNHEARD_PATCH = "cancel-unheard"
#: ``workflow.patched`` id: an attempt cancelled while its cluster's worker had gone
#: silent (its run activity ends by heartbeat timeout, not by the worker's word) ends
#: cancelled, not failed ``ClusterError``, and its delete waits the silence interval.
CANCEL_LOST_WORKER_PATCH = "cancel-lost-worker"


def dispatch_start_timeout() -> float:
    """Revision 5+: seconds a dispatch may wait for a word from its cluster (any event
    of its pods, or its end) before it is handed back (``CapacityChanged``): a cluster
    whose worker is gone never takes it. The control-plane worker's cluster silence
    interval (``headway worker control-plane --cluster-silent``), so by then the
    scheduler has marked the cluster down and the requeued action goes elsewhere or
    waits with ``ClusterDown``. (A timer's duration is not part of what a replay
    checks, so a worker configured otherwise replays the same history.)"""
    return shared.HEALTH.silent_s()


#: Events kept on the workflow for the ``state`` query (the oldest are dropped first,
#: the terminal one is always kept).
MAX_EVENTS = 100


def start_attributes(
    req: SubmitRequest,
) -> tuple[TypedSearchAttributes | None, dict[str, Any]]:
    """Search attributes and memo to start an action's workflow with (see ``submit``).

    Revision 2+ starts with the memo only (no attributes): the first workflow task
    upserts them, so they are written once with the state that task reaches (usually
    ``running``) instead of once at start and again at admission.
    """
    memo = {"action_id": req.action_id, "queue": req.queue, "tenant": req.tenant, "run": req.run}
    parent = req.labels.get(PARENT_LABEL)
    if parent:
        # An SDK task's child action names its parent's workflow, shown in the Web UI.
        memo["parent"] = protocol.action_workflow_id(req.tenant, parent)
    if req.revision >= 2:
        return None, memo
    sa = TypedSearchAttributes(
        [
            SearchAttributePair(SA["HeadwayQueue"], req.queue),
            SearchAttributePair(SA["HeadwayTenant"], req.tenant),
            SearchAttributePair(SA["HeadwayRun"], req.run or req.action_id),
            SearchAttributePair(SA["HeadwayState"], "waiting"),
            SearchAttributePair(SA["HeadwayReason"], "Waiting"),
        ]
    )
    return sa, memo


_ROLES: dict[DemandKind, tuple[str, str]] = {
    DemandKind.single: ("main", "main"),
    DemandKind.replicas: ("worker", "worker"),
    DemandKind.ray: ("ray-head", "ray-worker"),
    DemandKind.spark: ("spark-driver", "spark-executor"),
}


@dataclass
class Attempt:
    """One attempt of an action (revision 4+): the id it ran as, where, how it ended,
    and, when it was retried, why and how (``RetryPolicy``)."""

    number: int
    action_id: str
    cluster: str | None = None
    outcome: str | None = None
    message: str = ""
    retry: str = ""


@dataclass
class ReasonSeen:
    """A reason an action waited for and when it was told it (its workflow's clock).

    The scheduler's poller tells a waiting action its reason once it has waited a poll
    or more and then on every change, so ``at`` is when the reason was seen, at most
    about two poll intervals after it began.
    """

    reason: str
    at: float


@dataclass
class ActionStatus:
    """What the ``state`` query answers."""

    action_id: str
    tenant: str
    queue: str
    state: str  # submitting | waiting | running | succeeded | failed | cancelled | rejected
    cluster: str | None = None
    reason: str | None = None
    reasons: list[str] = field(default_factory=list)
    events: list[ActionEvent] = field(default_factory=list)
    submitted_at: float = 0.0
    admitted_at: float | None = None
    ended_at: float | None = None
    #: Revision 4+: every attempt so far, the current one last (``id`` is the lease's).
    attempts: list[Attempt] = field(default_factory=list)
    #: Each reason it waited for, when it was told (``waiting_reason``), in order: a new
    #: entry whenever the scheduler's current reason changed.
    waited: list[ReasonSeen] = field(default_factory=list)


@dataclass
class SubmitAnswer:
    """The answer to a submission (the ``submitted`` update), once the door decided.

    ``accepted``: taken in; ``state`` is then ``waiting``, or ``running`` when it was
    admitted at once. Else ``state`` is ``rejected`` with the door's ``reason`` (e.g.
    ``QueueDepthExceeded``), its ``message`` and, when rate limited, ``retry_after``
    seconds (None: no retry would pass until the limit is changed).
    """

    action_id: str
    accepted: bool
    state: str
    reason: str | None = None
    message: str = ""
    retry_after: float | None = None
    cluster: str | None = None


@dataclass
class WaitingReason:
    """Why a waiting action still waits, as its scheduler's last pass said: the current
    reason, and every distinct reason it has waited for so far."""

    reason: str
    reasons: list[str] = field(default_factory=list)


@dataclass
class ActionResult:
    """How an action ended (the workflow's result, or the details of its failure)."""

    action_id: str
    state: str  # succeeded | failed | cancelled | rejected
    cluster: str | None = None
    reason: str | None = None
    reasons: list[str] = field(default_factory=list)
    exit_code: int | None = None
    message: str = ""
    #: What the action's code returned (an SDK task's JSON output document), else None.
    output: str | None = None


# Unsandboxed: thousands of these run per minute, and the sandbox costs each activation
# an import-hook context and each new run a module re-execution. Determinism here rests
# on what the sandbox would only have guarded: the code reads time and randomness only
# through ``workflow``, calls the pure core, and the checked-in histories replay in CI.
# The scheduler workflow runs unsandboxed for the same reasons (it has an activation per
# pass and per local activity, and its code is the pure core plus this package).
@workflow.defn(name=protocol.ACTION_WORKFLOW, sandboxed=False)
class ActionWorkflow:
    """One action: enqueue with the shard scheduler, run when admitted, release once."""

    def __init__(self) -> None:
        self._req: SubmitRequest | None = None
        self._spec: ActionSpec | None = None
        self._status = ActionStatus("", "", "", "submitting")
        self._admission: Admission | None = None
        self._rejection: Rejection | None = None
        self._terminal: ActionEvent | None = None
        self._lean = False
        # Revision 2+: the first publish also sets queue, tenant and run (none at start).
        self._first_publish = False
        # The submission's answer (the ``submitted`` update), once the door decided, and
        # whether a submitter waits for it (its handler runs before ``run`` starts).
        self._answer: SubmitAnswer | None = None
        self._answer_wanted = False
        # The demand in a few characters, for the Web UI's details ("2×H100:8").
        self._demand = ""
        # What the Web UI shows as it runs (``workflow.set_current_details``).
        self._details = ""
        # Revision 4+: the id of the attempt under way ("" before ``run`` or earlier
        # revisions): only its admission and its terminal event count.
        self._attempt = ""
        # Revision 4+, the attempt under way: its pods seen running, and the latest
        # message the cluster gave about it (what a ready timeout reports).
        self._ready: set[str] = set()
        self._said = ""
        # Revision 5+, the attempt under way: whether its cluster said anything yet; and
        # the action's hand-backs so far (a reason of every later admission).
        self._heard = False
        self._handbacks = 0

    # --- handlers -----------------------------------------------------------------

    @workflow.signal(name=protocol.ADMIT_SIGNAL)
    def admit(self, admission: Admission) -> None:
        """The scheduler admitted this action (repeats from a retried batch are ignored)."""
        if self._admission is None and self._rejection is None:
            if self._attempt and admission.action_id != self._attempt:
                return  # an earlier attempt's, delivered late
            self._admission = admission

    @workflow.signal(name=REJECT_SIGNAL)
    def reject(self, rejection: Rejection) -> None:
        """The scheduler refused this action at submission."""
        if self._admission is None and self._rejection is None:
            self._rejection = rejection

    @workflow.signal(name=protocol.ACTION_EVENT_SIGNAL)
    def action_event(self, event: ActionEvent) -> None:
        """An informer event from the cluster worker (progress, OOM, preemption ...)."""
        events = self._status.events
        events.append(event)
        if len(events) > MAX_EVENTS:
            del events[: len(events) - MAX_EVENTS]
        if self._attempt and event.action_id != self._attempt:
            return  # kept in the events, but an earlier attempt's end is not this one's
        self._heard = True
        if event.message:
            self._said = event.message
        if event.kind is ActionEventKind.RUNNING and event.pod:
            self._ready.add(event.pod)
        if event.kind in protocol.TERMINAL_EVENTS and self._terminal is None:
            self._terminal = event

    @workflow.signal(name=REASON_SIGNAL)
    def waiting_reason(self, note: WaitingReason) -> None:
        """The scheduler's current reason for this action while it waits.

        The scheduler does not signal reasons itself (one signal per action per pass);
        the control plane's poller tells the actions that have waited a poll or more,
        only when their reason changed (``headway.telemetry.WaitingReasons``): the
        Web UI's current details and ``HeadwayReason`` then show it, not ``Waiting``.
        """
        st = self._status
        if st.state != "waiting" or self._admission is not None or self._rejection is not None:
            return  # admitted, rejected or ended meanwhile: those say more
        if note.reason == st.reason and note.reasons == st.reasons:
            return
        if not st.waited or st.waited[-1].reason != note.reason:
            st.waited.append(ReasonSeen(note.reason, workflow.now().timestamp()))
        st.reason, st.reasons = note.reason, list(note.reasons)
        self._set_details(summary.waiting(self._demand, st.queue, note.reason, note.reasons))
        self._publish()

    @workflow.update(name=SUBMITTED_UPDATE)
    async def submitted(self) -> SubmitAnswer:
        """The submission's answer, as soon as the door decided (accepted or rejected)."""
        self._answer_wanted = True
        st = self._status
        await workflow.wait_condition(lambda: self._answer is not None or st.ended_at is not None)
        if self._answer is not None:
            return self._answer
        # Ended before the door was asked (cancelled at once).
        return SubmitAnswer(st.action_id, st.state != "rejected", st.state, st.reason)

    @workflow.query(name="state")
    def state(self) -> ActionStatus:
        """State, queue, cluster, reasons and recorded events."""
        return self._status

    # --- the lifecycle ------------------------------------------------------------

    @workflow.run
    async def run(self, req: SubmitRequest) -> ActionResult:
        """Enqueue, wait for admission, run on the admitted cluster, release.

        Returns:
            How it ended: succeeded, or rejected (``state`` "rejected", its reason and
            message; runs recorded before patch ``rejected-completes`` raised instead).

        Raises:
            ApplicationError: the action failed (type = the attributed reason, e.g.
                ``OOMKilled``); details[0] is the ``ActionResult`` as a dict.
            asyncio.CancelledError: the action was cancelled (pods deleted, released).
        """
        self._req = req
        info = workflow.info()
        now = workflow.now().timestamp()
        st = self._status
        st.action_id, st.tenant, st.queue, st.submitted_at = (
            req.action_id,
            req.tenant,
            req.queue,
            now,
        )
        rev = req.revision
        self._start_publishing(rev, info)
        try:
            kind, pods = demand_from_request(asdict(req.demand))
        except ValueError as err:
            return self._end_rejected("InvalidDemand", str(err))
        self._demand = summary.demand(pods)
        spec = ActionSpec(
            id=req.action_id,
            queue=req.queue,
            pods=tuple(pods),
            run=req.run,
            task=req.task,
            submit=now,
            estimate=req.estimate_s,
            environment=req.environment,
            kind=kind,
        )
        self._spec = spec
        lease = PutLeaseInput(
            tenant=req.tenant,
            action_id=req.action_id,
            queue=req.queue,
            workflow_id=info.workflow_id,
            spec=spec.to_dict(),
            submitted_at=now,
        )
        try:
            refused = await self._enqueue(req, lease)
            if refused is not None:
                return refused
            adm = self._admission
            self._answer = SubmitAnswer(
                req.action_id,
                True,
                "running" if adm is not None else "waiting",
                cluster=adm.cluster if adm is not None else None,
            )
            st.state, st.reason = "waiting", "Waiting"
            self._set_details(summary.waiting(self._demand, req.queue, None, ()))
            if not self._lean or (self._first_publish and self._admission is None):
                self._publish()
            await workflow.wait_condition(
                lambda: self._admission is not None or self._rejection is not None
            )
        except asyncio.CancelledError:
            await self._release("cancelled", "cancelled", "Cancelled")
            self._end("cancelled", "Cancelled")
            raise
        if self._rejection is not None:
            await self._release("rejected", "rejected", self._rejection.reason)
            return self._end_rejected(self._rejection.reason, self._rejection.message)
        admission = self._admission
        assert admission is not None
        if rev >= 4:
            return await self._attempts(req, spec, kind, admission, lease)
        return await self._run_on_cluster(req, spec, kind, admission)

    def _start_publishing(self, rev: int, info: workflow.Info) -> None:
        """How this run publishes its state to the Web UI's search attributes.

        Lean publishing (patched in): ``client.submit`` sets the search attributes and a
        static memo at start, so only admission and the end upsert (each an extra
        visibility write on the server, which bare workflows do not pay). Revision 1+
        takes the patched paths without asking (no marker, no upsert of
        TemporalChangeVersion); revision 0 inputs were recorded with the patches.
        """
        st = self._status
        self._lean = rev >= 1 or workflow.patched("lean-publish")
        if rev >= 2:
            # Deferred publishing: each search-attribute write costs the server a
            # validation (namespace and cluster-metadata reads) besides the event, about
            # 3 ms of server CPU per action on the bench machine; writing them once in
            # the first task, after the admission wait, saves the start's write. The
            # memo (queue, tenant, run) is there from the start.
            self._first_publish = True
        elif not self._lean:
            self._publish(run=True)
        elif info.typed_search_attributes.get(SA["HeadwayState"]) is None:
            st.state, st.reason = "waiting", "Waiting"  # started by hand: publish once
            self._publish(run=True, memo=True)

    async def _enqueue(self, req: SubmitRequest, lease: PutLeaseInput) -> ActionResult | None:
        """Write the action's lease (the door decides); the result if it was refused
        there, else None (admitted already, in-process, or waiting)."""
        if req.revision >= 1 or workflow.patched("admit-in-first-task"):
            # Write the lease and wait briefly for the admission in-process: when it
            # comes, the cluster activity is scheduled in this same workflow task.
            lease.wait_s = ANSWER_WAIT_S if self._answer_wanted else ADMIT_WAIT_S
            out: PutLeaseOutput = await workflow.execute_local_activity(
                PUT_LEASE_WAIT_ACTIVITY,
                lease,
                summary=f"enqueue on {req.queue}",
                result_type=PutLeaseOutput,
                start_to_close_timeout=timedelta(seconds=30),
                retry_policy=RetryPolicy(maximum_interval=timedelta(seconds=10)),
            )
            if out.rejection is not None:
                # Refused at the door: no lease was written, nothing to release.
                rj = out.rejection
                return self._end_rejected(
                    rj.reason, rj.message, retry_after=rj.retry_after, at_door=True
                )
            if out.admission is not None:
                self.admit(out.admission)
        else:
            await workflow.execute_local_activity(
                PUT_LEASE_ACTIVITY,
                lease,
                start_to_close_timeout=timedelta(seconds=30),
                retry_policy=RetryPolicy(maximum_interval=timedelta(seconds=10)),
            )
        return None

    async def _run_on_cluster(
        self, req: SubmitRequest, spec: ActionSpec, kind: DemandKind, admission: Admission
    ) -> ActionResult:
        result = await self._run_once(req, spec, kind, admission)
        # The record's outcome is the one known now; the result below is decided after
        # the release, as it always was (a terminal event heard during the release still
        # counts there, so recorded histories end the same way).
        heard = self._terminal if self._terminal is not None and req.revision >= 3 else result
        await self._release_ended(heard)
        if self._terminal is not None and req.revision >= 3:
            # The first outcome heard stands: the attempt that saw the pods end signalled
            # it before deleting them; a retry (that attempt's worker killed before its
            # result reached Temporal) finds them gone and says PodLost (issue #20).
            result = self._terminal
        return self._conclude(req, result)

    async def _attempts(
        self,
        req: SubmitRequest,
        spec: ActionSpec,
        kind: DemandKind,
        admission: Admission,
        lease: PutLeaseInput,
    ) -> ActionResult:
        """Revision 4+: run attempts until one ends for good (issue #23).

        An attempt that ends in a failure class its queue retries (``RetryPolicy``, read
        live from the store at each failure) is followed by a new lease for the next
        attempt (``attempt_id``): same workflow, the action's first submit time (the head
        of its queue), no door; the scheduler admits it as any other. Its pods are new
        (their names follow the attempt's id), so nothing of the last attempt is adopted.
        """
        st = self._status
        used: dict[str, int] = {}
        self._attempt = req.action_id
        st.attempts = [Attempt(1, req.action_id)]
        while True:
            result = await self._run_once(req, spec, kind, admission)
            if self._terminal is not None:
                result = self._terminal  # the first outcome heard stands (revision 3)
            this = st.attempts[-1]
            this.cluster, this.outcome, this.message = (
                admission.cluster,
                result.kind.value,
                result.message,
            )
            retry = None
            if result.kind == ActionEventKind.CAPACITY_CHANGED:
                retry, result = self._hand_back(result, spec)
            elif result.kind != ActionEventKind.SUCCEEDED:
                retry = next_attempt(
                    await self._retry_policy(req), result.kind.value, used, spec.pods
                )
            if retry is None:
                await self._release_ended(result)
                return self._conclude(req, result)
            if retry.cls != HANDBACK:  # a hand-back uses none of the retry budget
                used[retry.cls] = used.get(retry.cls, 0) + 1
                if not workflow.unsafe.is_replaying():  # once per retry, as admissions
                    telemetry.get().record_requeue(req.tenant, req.queue, retry.cls)
            this.retry = retry.note
            if self._terminal is None:
                self.action_event(result)  # the attempt's end, in its history
            spec = await self._requeue(req, spec, retry, lease)
            try:
                await workflow.wait_condition(
                    lambda: self._admission is not None or self._rejection is not None
                )
            except asyncio.CancelledError:
                await self._release("cancelled", "cancelled", "Cancelled")
                self._end("cancelled", "Cancelled")
                raise
            if self._rejection is not None:
                # The scheduler refused the retry (e.g. its raised memory fits no node,
                # or it waited past max_queued_time): the failure it retried stands.
                rj = self._rejection
                await self._release("rejected", "failed", result.kind.value)
                st.attempts[-1].outcome, st.attempts[-1].message = rj.reason, rj.message
                said = result.message or result.kind.value
                result = replace(
                    result,
                    message=f"{said}; its retry was refused: {rj.reason}: {rj.message}",
                )
                self._terminal = result  # its end is in the events already
                return self._conclude(req, result)
            assert self._admission is not None
            admission = self._admission

    def _hand_back(self, result: ActionEvent, spec: ActionSpec) -> tuple[Retry | None, ActionEvent]:
        """Revision 5+: an admission its cluster handed back (``CapacityChanged``): the
        next attempt, at once and with the same pods, back at its place in its queue
        (the first submit time stands); or, past ``MAX_HANDBACKS``, the end it is."""
        if self._handbacks >= MAX_HANDBACKS:
            said = f"{result.message}; handed back {self._handbacks} times before, the limit"
            return None, replace(result, message=said)
        self._handbacks += 1
        # A moment for the cluster to settle (pods binding, its next report) before the
        # next pass may send it there again: 1 s, then doubled. Its place stays its own.
        delay = HANDBACK_BACKOFF_S * 2 ** (self._handbacks - 1)
        note = (
            f"back in its queue at its place after {delay:g}s (hand-back {self._handbacks}"
            f" of {MAX_HANDBACKS}, no retry used)"
        )
        return Retry(HANDBACK, delay, spec.pods, note), result

    async def _retry_policy(self, req: SubmitRequest) -> QueueRetry:
        got: dict[str, Any] = await workflow.execute_local_activity(
            RETRY_POLICY_ACTIVITY,
            {"tenant": req.tenant, "queue": req.queue},
            result_type=dict,
            start_to_close_timeout=timedelta(seconds=30),
            retry_policy=RetryPolicy(maximum_interval=timedelta(seconds=10)),
        )
        return QueueRetry.parse(got)

    async def _requeue(
        self, req: SubmitRequest, spec: ActionSpec, retry: Retry, lease: PutLeaseInput
    ) -> ActionSpec:
        """Put the next attempt's lease (after the retry's backoff); its spec."""
        st = self._status
        ended = self._attempt
        number = len(st.attempts) + 1
        # A hand-back says so while it waits (and among every reason it waited for).
        why = "CapacityChanged" if retry.cls == HANDBACK else "Retrying"
        if retry.cls == HANDBACK:
            st.reasons = list(dict.fromkeys([*st.reasons, why]))
        st.state, st.reason = "waiting", why
        self._publish()
        try:
            if retry.delay > 0:
                # The ended attempt holds nothing while it backs off.
                await self._release("finished")
                await workflow.sleep(timedelta(seconds=retry.delay))
            now = workflow.now().timestamp()
            nxt = replace(
                spec,
                id=attempt_id(req.action_id, number),
                pods=retry.pods,
                meta={**spec.meta, "attempt": number, "queued_at": now},
            )
            self._admission, self._terminal, self._attempt = None, None, nxt.id
            self._ready, self._said, self._heard = set(), "", False
            st.attempts.append(Attempt(number, nxt.id))
            await workflow.execute_local_activity(
                REQUEUE_LEASE_ACTIVITY,
                RequeueLeaseInput(
                    ended=ended,
                    lease=replace(lease, action_id=nxt.id, spec=nxt.to_dict(), wait_s=0.0),
                ),
                start_to_close_timeout=timedelta(seconds=30),
                retry_policy=RetryPolicy(maximum_interval=timedelta(seconds=10)),
            )
        except asyncio.CancelledError:
            await self._release("cancelled", "cancelled", "Cancelled")
            self._end("cancelled", "Cancelled")
            raise
        st.state, st.reason, st.cluster = (
            "waiting",
            why if retry.cls == HANDBACK else "Waiting",
            None,
        )
        self._publish()
        return nxt

    async def _run_once(
        self, req: SubmitRequest, spec: ActionSpec, kind: DemandKind, admission: Admission
    ) -> ActionEvent:
        """Dispatch to the admitted cluster and wait for the pods' end (its event).

        Raises:
            ApplicationError: ``ClusterError`` (released, ended failed).
            asyncio.CancelledError: cancelled (pods deleted, released, ended).
        """
        st = self._status
        st.state, st.cluster = "running", admission.cluster
        st.admitted_at = admitted_at = workflow.now().timestamp()
        st.reasons = list(admission.reasons)
        if self._handbacks:
            # Revision 5+: what held it includes the hand-backs before this admission.
            st.reasons = list(dict.fromkeys([*st.reasons, "CapacityChanged"]))
        st.reason = "Admitted"
        self._publish()
        self._set_details(
            summary.admitted(
                self._demand, admission.cluster, admitted_at - st.submitted_at, st.reasons
            )
        )
        if not workflow.unsafe.is_replaying():
            # Counted here, once per action: a replay (restart, cache eviction) does not
            # count again, the rule of Temporal's own workflow metric meter; see
            # ``headway.telemetry``.
            decided = admission.decided_at or workflow.now().timestamp()
            telemetry.get().record_admission(
                req.tenant, req.queue, admission.cluster, decided - st.submitted_at, st.reasons
            )
        dispatch = DispatchRequest(
            tenant=req.tenant,
            action_id=self._attempt or req.action_id,
            workflow_id=workflow.info().workflow_id,
            cluster=admission.cluster,
            kind=GangKind(kind.value),
            pods=_pod_specs(kind, spec.pods, req),
            duration_s=req.duration_s,
            inject=req.inject,
            node_hints=list(admission.node_hints),
            # (New activity-input fields: replay does not compare activity inputs.)
            queue=req.queue,
            kube=req.kube,
            handback=req.revision >= 5,
        )
        try:
            if req.revision >= 5:
                return await self._run_watched(req, dispatch, admission)
            if admission.ready_timeout is not None and self._attempt:
                return await self._run_until_ready(
                    req, dispatch, admission, admission.ready_timeout
                )
            result: ActionEvent = await self._start_run(dispatch, admission)
        except (asyncio.CancelledError, ActivityError) as err:
            cancelled = isinstance(err, asyncio.CancelledError) or (
                isinstance(err, ActivityError) and isinstance(err.cause, CancelledError)
            )
            # Cancelled while the cluster's worker was gone (frozen, cut off): the run
            # activity could not hear the cancel and ended by its heartbeat timeout
            # instead. The user asked for a cancellation; that is what it is.
            worker_lost = (
                not cancelled
                and _cancel_requested()
                and isinstance(err, ActivityError)
                and isinstance(err.cause, ActivityTimeout)
                and workflow.patched(CANCEL_LOST_WORKER_PATCH)
            )
            if not cancelled and not worker_lost:
                await self._release("finished", "failed", "ClusterError")
                msg = str(err.cause or err) if isinstance(err, ActivityError) else str(err)
                res = self._end("failed", "ClusterError", message=msg)
                raise ApplicationError(
                    msg, asdict(res), type="ClusterError", non_retryable=True
                ) from err
            await self._cancel_running(req, dispatch, admission, worker_lost=worker_lost)
            raise asyncio.CancelledError() from err
        return result

    def _start_run(
        self, dispatch: DispatchRequest, admission: Admission
    ) -> workflow.ActivityHandle[ActionEvent]:
        """The run activity on the admitted cluster's worker."""
        return workflow.start_activity(
            protocol.RUN_ACTION_ACTIVITY,
            dispatch,
            summary=f"create {len(dispatch.pods)} pods on {admission.cluster}",
            result_type=ActionEvent,
            task_queue=protocol.cluster_task_queue(admission.cluster),
            start_to_close_timeout=timedelta(days=30),
            heartbeat_timeout=timedelta(seconds=30),
            # A retried attempt adopts the pods its predecessor created (the cluster
            # worker's contract), so retrying never runs the work twice.
            retry_policy=RetryPolicy(
                initial_interval=timedelta(seconds=1),
                maximum_interval=timedelta(seconds=30),
                maximum_attempts=20,
            ),
            cancellation_type=workflow.ActivityCancellationType.WAIT_CANCELLATION_COMPLETED,
        )

    async def _run_watched(
        self, req: SubmitRequest, dispatch: DispatchRequest, admission: Admission
    ) -> ActionEvent:
        """Revision 5+: the run activity, handed back (``CapacityChanged``) when its
        cluster says nothing of it within ``dispatch_start_timeout()`` (no worker took
        it: the cluster is down), and under the queue's ready timeout when it has one."""
        handle = self._start_run(dispatch, admission)
        started = workflow.now().timestamp()
        limit = dispatch_start_timeout()
        try:
            heard = await _within(lambda: handle.done() or self._heard, limit)
        except asyncio.CancelledError:
            handle.cancel()
            raise
        if not heard:
            handle.cancel()
            # Not taken up: the cancel ends it at once. Taken up by a worker that is still
            # there: cancelled, it deletes whatever it created on its way out.
            try:
                ended: ActionEvent = await handle
            except ActivityError as err:
                if isinstance(err.cause, ActivityTimeout):
                    # Taken up by a worker that died before a word reached us: pods may
                    # exist. Delete them (a worker that returns in time does) before the
                    # action may run elsewhere; give up after the same interval.
                    await self._delete_left(req, dispatch, admission, within_s=limit)
            else:
                return ended  # it ran and ended meanwhile, its events lost: that stands
            return ActionEvent(
                dispatch.action_id,
                ActionEventKind.CAPACITY_CHANGED,
                admission.cluster,
                message=f"no worker of cluster {admission.cluster} took the dispatch within"
                f" {limit:g}s (the cluster is down)",
                observed_at=workflow.now().timestamp(),
            )
        if admission.ready_timeout is not None and not handle.done():
            left = admission.ready_timeout - (workflow.now().timestamp() - started)
            return await self._until_ready(
                req, dispatch, admission, handle, max(left, 0.001), admission.ready_timeout
            )
        result: ActionEvent = await handle
        return result

    async def _run_until_ready(
        self, req: SubmitRequest, dispatch: DispatchRequest, admission: Admission, timeout: float
    ) -> ActionEvent:
        """The run activity, given ``timeout`` seconds for every pod to be running; past
        it the pods are deleted (the activity cancelled, then whatever is left) and the
        attempt ends ``NotReady`` with the latest message the cluster gave (e.g. ``0/3
        nodes are available: 1 Insufficient nvidia.com/gpu``)."""
        handle = self._start_run(dispatch, admission)
        return await self._until_ready(req, dispatch, admission, handle, timeout, timeout)

    async def _until_ready(
        self,
        req: SubmitRequest,
        dispatch: DispatchRequest,
        admission: Admission,
        handle: workflow.ActivityHandle[ActionEvent],
        left: float,
        timeout: float,
    ) -> ActionEvent:
        """Wait ``left`` seconds for every pod of the started run to be running; past
        it, the ready timeout (``timeout`` seconds after dispatch) ends the attempt."""
        want = len(dispatch.pods)
        try:
            await workflow.wait_condition(
                lambda: handle.done() or len(self._ready) >= want,
                timeout=timedelta(seconds=left),
            )
        except TimeoutError:
            if not workflow.unsafe.is_replaying():
                telemetry.get().record_ready_timeout(req.tenant, req.queue, admission.cluster)
            handle.cancel()
            # Cancelled, as asked: the run activity deleted the pods on its way out.
            with contextlib.suppress(ActivityError):
                await handle
            await self._delete_left(req, dispatch, admission)
            running = len(self._ready)
            return ActionEvent(
                dispatch.action_id,
                ActionEventKind.NOT_READY,
                admission.cluster,
                message=f"{running}/{want} pods running {timeout:g}s after dispatch: "
                + (self._said or "no word from the cluster"),
                observed_at=workflow.now().timestamp(),
            )
        except asyncio.CancelledError:
            handle.cancel()
            raise
        result: ActionEvent = await handle
        return result

    def _conclude(self, req: SubmitRequest, result: ActionEvent) -> ActionResult:
        """End with the attempt's outcome: succeeded, or raise its failure."""
        if self._terminal is None or self._terminal.kind != result.kind:
            self.action_event(result)
        if result.kind == ActionEventKind.SUCCEEDED:
            return self._end(
                "succeeded", "Succeeded", exit_code=result.exit_code, output=result.output
            )
        reason = str(result.kind.value)
        res = self._end(
            "failed",
            reason,
            exit_code=result.exit_code,
            message=result.message or reason,
            output=result.output,
        )
        raise ApplicationError(
            f"action {req.action_id} {reason}: {result.message}".rstrip(": "),
            asdict(res),
            type=reason,
            non_retryable=True,
        )

    async def _cancel_running(
        self,
        req: SubmitRequest,
        dispatch: DispatchRequest,
        admission: Admission,
        *,
        worker_lost: bool = False,
    ) -> None:
        within_s = DELETE_WITHIN_S
        # Patch ``cancel-unheard``: a cluster that never said a word of this attempt (its
        # worker is dead, or never took the dispatch) is given the cluster silence
        # interval for the delete, not ten minutes; by then a live worker has taken it,
        # and a dead one's pods are its own restart's to delete (it deletes the pods of
        # ended actions at start). Histories recorded before it replay as they ran. So
        # is a worker that spoke and then went silent (``worker_lost``, patch
        # ``cancel-lost-worker``).
        if worker_lost or (not self._heard and workflow.patched(CANCEL_UNHEARD_PATCH)):
            within_s = dispatch_start_timeout()
        await self._delete_left(req, dispatch, admission, within_s=within_s)
        await self._release("finished", "cancelled", "Cancelled")
        self._end("cancelled", "Cancelled")

    async def _delete_left(
        self,
        req: SubmitRequest,
        dispatch: DispatchRequest,
        admission: Admission,
        *,
        within_s: float = DELETE_WITHIN_S,
    ) -> None:
        # Cancelling the run activity deleted the pods; make sure nothing is left.
        try:
            await workflow.execute_activity(
                protocol.DELETE_ACTION_ACTIVITY,
                dispatch,
                summary=f"delete the pods of {req.action_id} on {admission.cluster}",
                task_queue=protocol.cluster_task_queue(admission.cluster),
                start_to_close_timeout=timedelta(minutes=2),
                schedule_to_close_timeout=timedelta(seconds=within_s),
            )
        except ActivityError as err:
            # Still cancelled: the run activity's own cancellation deleted the pods;
            # this was the belt to its braces.
            workflow.logger.warning("delete of %s failed: %s", req.action_id, err)

    # --- helpers ------------------------------------------------------------------

    async def _release_ended(self, end: ActionEvent) -> None:
        """Release the lease of an attempt whose pods ended with ``end``, the action's
        last: its record says succeeded, or failed with the end's kind as the reason."""
        ok = end.kind == ActionEventKind.SUCCEEDED
        await self._release(
            "finished", "succeeded" if ok else "failed", "Succeeded" if ok else end.kind.value
        )

    async def _release(self, kind: str, outcome: str | None = None, reason: str = "") -> None:
        """Release the attempt's lease; with ``outcome``, the action's end: its record
        (``headway.store.history``) goes too. An attempt followed by another gives none."""
        assert self._req is not None
        # The record of what ran travels with the release (the same local activity, no
        # new command), so it is written once per action and replays as before.
        await workflow.execute_local_activity(
            FINISH_LEASE_ACTIVITY,
            FinishLeaseInput(
                tenant=self._req.tenant,
                action_id=self._attempt or self._req.action_id,
                kind=kind,
                record=self._record(outcome, reason) if outcome is not None else None,
            ),
            summary=f"release the lease ({kind})",
            start_to_close_timeout=timedelta(seconds=30),
            retry_policy=RetryPolicy(maximum_interval=timedelta(seconds=10)),
        )

    def _record(self, outcome: str, reason: str) -> dict[str, Any] | None:
        """The action as it ran (``headway.store.history.Finished`` as a dict)."""
        req, spec, st = self._req, self._spec, self._status
        if req is None or spec is None:
            return None
        return {
            "action_id": req.action_id,
            "queue": req.queue,
            "run": req.run,
            "task": req.task,
            "cluster": st.cluster,
            "submitted_at": st.submitted_at,
            "admitted_at": st.admitted_at,
            "ended_at": workflow.now().timestamp(),
            "outcome": outcome,
            "reason": reason,
            "reasons": list(st.reasons),
            "kind": spec.kind.value,
            "pods": [p.to_dict() for p in spec.pods],
            "demand": {k: v for k, v in asdict(req.demand).items() if v is not None},
            "estimate": req.estimate_s,
            "environment": req.environment,
        }

    def _end(
        self,
        state: str,
        reason: str,
        *,
        exit_code: int | None = None,
        message: str = "",
        output: str | None = None,
    ) -> ActionResult:
        st = self._status
        st.state, st.reason = state, reason
        st.ended_at = workflow.now().timestamp()
        self._publish()
        # How it ended, before what it was (the admitted text, if it got that far).
        self._set_details(summary.ended(state, reason, self._details))
        return ActionResult(
            action_id=st.action_id,
            state=state,
            cluster=st.cluster,
            reason=reason,
            reasons=list(st.reasons),
            exit_code=exit_code,
            message=message,
            output=output,
        )

    def _end_rejected(
        self,
        reason: str,
        message: str,
        *,
        retry_after: float | None = None,
        at_door: bool = False,
    ) -> ActionResult:
        self._status.reasons = [reason]
        res = self._end("rejected", reason, message=message)
        if not workflow.unsafe.is_replaying():  # once per action, as admissions
            telemetry.get().record_rejection(self._status.tenant, self._status.queue, reason)
        if self._answer is None:
            self._answer = SubmitAnswer(
                res.action_id, False, "rejected", reason, message, retry_after
            )
        # A rejection is an answer, not a crash: the workflow completes with it (its
        # result says rejected, why and what), where it used to fail with a stack trace.
        # Refusals at the door are new (no recorded run ends differently); other
        # rejections take the patch (only a rejected action records its marker).
        if at_door or workflow.patched("rejected-completes"):
            return res
        raise ApplicationError(
            f"action {res.action_id} rejected: {reason}{': ' + message if message else ''}",
            asdict(res),
            type="Rejected",
            non_retryable=True,
        )

    def _set_details(self, text: str) -> None:
        """The Web UI's current details (no server operation: read by its metadata query)."""
        if text != self._details:
            self._details = text
            workflow.set_current_details(text)

    def _publish(self, run: bool = False, memo: bool = False) -> None:
        """Upsert search attributes (and memo) so the Web UI lists and filters actions."""
        st = self._status
        pairs: list[SearchAttributeUpdate[Any]] = [
            SA["HeadwayState"].value_set(st.state),
            SA["HeadwayReason"].value_set(st.reason or st.state),
        ]
        if (run or self._first_publish) and self._req is not None:
            self._first_publish = False
            pairs += [
                SA["HeadwayQueue"].value_set(st.queue),
                SA["HeadwayTenant"].value_set(st.tenant),
                SA["HeadwayRun"].value_set(self._req.run or st.action_id),
            ]
        if st.cluster:
            pairs.append(SA["HeadwayCluster"].value_set(st.cluster))
        if st.reasons:
            pairs.append(REASONS_SA.value_set(list(st.reasons)))
        workflow.upsert_search_attributes(pairs)
        if memo or not self._lean:
            workflow.upsert_memo(
                {"state": st.state, "reason": st.reason, "cluster": st.cluster, "queue": st.queue}
            )


def _cancel_requested() -> bool:
    """Whether the workflow has been asked to cancel: the SDK cancels the workflow's
    main task, whose count of cancel requests stays up after the request was delivered
    (to an activity handle that then ended otherwise). Replays alike: the request is a
    history event, delivered at the same point."""
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0


async def _within(cond: Callable[[], bool], seconds: float) -> bool:
    """Whether ``cond`` became true within ``seconds`` (a timer, cancelled if it did)."""
    try:
        await workflow.wait_condition(cond, timeout=timedelta(seconds=seconds))
    except TimeoutError:
        return False
    return True


def _pod_specs(kind: DemandKind, pods: tuple[Pod, ...], req: SubmitRequest) -> list[PodSpec]:
    first, rest = _ROLES[kind]
    out: list[PodSpec] = []
    for i, p in enumerate(pods):
        role = first if i == 0 else rest
        out.append(
            PodSpec(
                role=role,
                index=i,
                cpu_m=p.cpu,
                memory=p.memory,
                ephemeral_storage=p.eph,
                gpu=p.gpu,
                gpu_type=p.gpu_type,
                image=req.image,
                command=list(req.command),
            )
        )
    return out
