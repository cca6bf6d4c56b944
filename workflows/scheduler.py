"""``SchedulerWorkflow``: the one owner of a shard's (tenant's) scheduling state.

It wraps the pure, deterministic core ``headway.scheduler.Scheduler`` and feeds it
events; it never polls. Temporal's limits shape everything here:

* **Event-driven, batched passes.** Signal and update handlers only record what changed
  (cheap, synchronous); the main loop wakes once per activation, so every signal that
  arrived in one workflow task is applied and followed by *one* core pass. A timer exists
  only for the core's ``next_wakeup()`` (environment expiry, ...) and the lease reaper.
* **Bounded windows, backlog in SQL.** Each queue's waiting actions in memory are capped
  at ``WINDOW`` (default 500); the rest stay as pending leases in the store. The loop
  refills a queue's window with a *local* activity (``LeaseStore.sync``) when it falls
  below half, or when a nudge says the store has news and there is room. A million-action
  backfill therefore costs this workflow a bounded snapshot and one sync per ~250
  admissions, and another tenant (its own scheduler workflow, its own rows) shares
  nothing with it but the database.
* **Coalesced inbound signals.** Submitters and finishing actions do not signal per
  action: they write the store and nudge only when a store flag flips (see
  ``headway.activities.store``); ends come back through the same sync.
* **Batched outbound signals.** Admissions and rejections of one or more passes go to
  one dispatch activity call (``headway.activities.dispatch``; a *local* one for
  batches up to ``LOCAL_DISPATCH_MAX``, so a small pass costs one workflow task), at most
  ``MAX_DISPATCH_INFLIGHT`` at a time; while they run, new decisions accumulate into the
  next batch. The workflow thus stays far below 2,000 pending outbound operations.
* **Hand over first, signal off the loop** (patch ``hand-over-first``). A serial run
  awaits each local activity, so a local dispatch that signals its batch held the loop
  (and the workflow task, and every nudge behind it) for as long as those signals took:
  measured (``bench/trace_admission.py``), 0.2-2 s per iteration for 10-80 admissions
  on a loaded machine, enqueue-to-admission p50 ~1.7 s, and most actions' first-task
  wait for their admission (0.25 s) ran out, so each then cost a signal and a workflow
  task more. Now the loop's local activity only hands admissions over to the actions
  still waiting on this worker (milliseconds); the rest go to a regular dispatch that
  signals them while the loop takes its next nudge.
* **Continue-as-new** when Temporal suggests it (or the history passes
  ``MAX_HISTORY``), after in-flight dispatches drained and all handlers finished; the
  core snapshot plus the small loop state (seq counter, store cursors, reaper clock) is
  carried, and nothing outstanding is dropped.
* **One reader of inputs** (patch ``serial-inputs``). The Python SDK may hand a local
  activity's result to the workflow in the *next* workflow task, together with that
  task's signals, where a replay hands it over at once (and it orders results of
  concurrent local activities differently on replay). Code that reads what signals,
  updates, timers or regular activities changed, or the clock, or the history length,
  right after a local activity would then decide differently on replay: a control-plane
  restart stopped the shard for good (issue #20). So handlers and spawned tasks only
  append to an inbox; the loop takes the inbox, reads the clock and the history length
  only where it wakes (a wake comes from history: the same on replay), and awaits every
  local activity itself, one at a time. What a local activity returns is recorded and
  may be used at once.
* **Reaping.** An admitted action whose workflow vanished (terminated) would hold its
  reservation forever: the dispatch activity reports such workflows ``gone`` when it
  signals them, and running leases older than ``REAP_AFTER_S`` are probed in batches.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, TypeVar

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ApplicationError

with workflow.unsafe.imports_passed_through():
    import headway.scheduler.scenario  # noqa: F401  (core imports it lazily)
    from headway import protocol
    from headway.protocol import Admission, CapacityReport
    from headway.scheduler import Admitted, PassError, Scheduler
    from headway.scheduler.insight import explain
    from headway.scheduler.model import (
        ActionSpec,
        ClusterSpec,
        EnvironmentSpec,
        OrgLimits,
        QueueSpec,
        QueueStatus,
        check_count,
        check_limits,
    )
    from headway.scheduler.reasons import Reason, describe
    from headway.scheduler.scenario import environment_from_dict
    from headway.workflows.shared import (
        CONFIG_ACTIVITY,
        DEFAULT_CLUSTER_SILENT_S,
        DISPATCH_ACTIVITY,
        DONE_CHANNEL,
        FLEET_ACTIVITY,
        HEALTH,
        NUDGE_SIGNAL,
        SET_DOOR_ACTIVITY,
        SYNC_ACTIVITY,
        AdmitItem,
        DispatchBatch,
        DispatchResult,
        DoorInput,
        Rejection,
        RejectItem,
        SchedulerInput,
        SyncInput,
        SyncOutput,
    )

__all__ = ["SchedulerWorkflow"]

#: Waiting actions held in memory per queue; refilled below WINDOW // 2.
WINDOW = 500
#: Cap of leases one sync claims (bounds the local activity's result payload).
MAX_SYNC_LEASES = 2000
#: Cap of ends one sync claims.
MAX_SYNC_DONE = 5000
#: Syncs per loop iteration before a pass runs (keeps one activation well under 2 s).
MAX_SYNCS_PER_ITERATION = 4
#: Leases claimed per loop iteration (patch ``bites``): a shard refilling from a big
#: backlog takes it in bites, each its own workflow task with a pass and a dispatch of
#: at most this many, so it never holds the worker (and the server) for long in one
#: piece. Measured (bench/scheduler_history.py isolation): in 500-lease pieces, a 5-action
#: run of another shard took ~1.5x as long while such a backlog started to drain.
BITE = 100
#: Decisions per dispatch activity call.
DISPATCH_BATCH = 1000
MAX_DISPATCH_INFLIGHT = 4
#: A regular dispatch lost with its control-plane worker (kill -9) is retried after this
#: long: it bounds how long its undelivered admissions wait after a crash. (Since
#: ``hand-over-first`` most signals go this way; 1,000 signals take a few seconds.)
REMOTE_DISPATCH_TIMEOUT_S = 60
#: ... and one whose worker died sooner: the activity heartbeats every
#: ``DISPATCH_HEARTBEAT_EVERY_S`` (``activities/dispatch.py``), so a worker killed
#: mid-dispatch is noticed after this long, and the batch retried on a live worker.
REMOTE_DISPATCH_HEARTBEAT_S = 10
#: Batches up to this size (and without probes) are dispatched by a *local* activity in
#: the pass's own workflow task: no activity task round trip, no extra workflow task.
LOCAL_DISPATCH_MAX = 100
#: Admissions decided within this long of their action's submission are offered to the
#: action's first-task waiter (``hand-over-first``); that wait is at most the action's
#: ``ADMIT_WAIT_S`` (2 s), so older ones go to the signalling dispatch directly.
OFFER_WITHIN_S = 2.0
#: Undelivered decisions above which window refills pause.
MAX_UNDELIVERED = DISPATCH_BATCH * MAX_DISPATCH_INFLIGHT
#: Running actions are probed for a vanished workflow after this long, then again.
REAP_AFTER_S = 900.0
REAP_BATCH = 500
#: Continue as new at the latest here, whatever the server suggests.
MAX_HISTORY = 10_000
# A pass that fails again on the rebuilt core fails the action it was deciding about and
# tries again, at most this many times a pass (one bad action's data; more means the bug
# is not in one action's data, and the next event tries again).
MAX_FAILED_ACTIONS = 8
#: A cluster whose worker has reported before and then says nothing for this long is
#: down: it takes no new work until it reports again (workers report on every change and
#: at least every 30 s, ``worker.cluster.capacity_loop``).
CLUSTER_SILENT_S = DEFAULT_CLUSTER_SILENT_S
#: Serial runs look at the store by themselves this long after their last sync while
#: work waits or runs (``BUSY``), else after ``IDLE``. A nudge can be lost for good: its
#: sender flipped the store's flag, then died (or the server was down) before the signal
#: went out, and the flag, set, keeps every later sender silent. Found by the fault suite
#: (issue #20): 34 actions waited for ever behind ends the scheduler never collected.
SAFETY_SYNC_BUSY_S = 30.0
SAFETY_SYNC_IDLE_S = 120.0


@dataclass
class _Loop:
    """Loop state carried across continue-as-new, besides the core snapshot."""

    seq: int = 0
    sync_no: int = 0
    more: list[str] = field(default_factory=list)
    nudged: list[str] = field(default_factory=list)
    running_since: dict[str, float] = field(default_factory=dict)
    forget: list[str] = field(default_factory=list)
    workflow_ids: dict[str, str] = field(default_factory=dict)
    capacity_seq: dict[str, int] = field(default_factory=dict)
    capacity: dict[str, dict[str, Any]] = field(default_factory=dict)
    # Per cluster, the worker incarnation whose reports the view holds: [id, started_at].
    capacity_from: dict[str, list[Any]] = field(default_factory=dict)
    # Clusters marked down because their worker went silent (CLUSTER_SILENT_S).
    silent: list[str] = field(default_factory=list)


# Unsandboxed, as ``ActionWorkflow`` (see there): the sandbox's import context around
# every activation cost ~0.5 ms of worker CPU per admitted action under load, and what
# it guards (time, randomness, I/O) this code reaches only through ``workflow`` and the
# pure core; the checked-in histories replay in CI.
#: Signal from the control plane: per queue, how good its start estimates were.
START_ESTIMATES_SIGNAL = "start_estimates"


@workflow.defn(name=protocol.SCHEDULER_WORKFLOW, sandboxed=False)
class SchedulerWorkflow:
    """One per tenant: queues, reservations and clusters; emits admissions in batches."""

    @workflow.init
    def __init__(self, inp: SchedulerInput) -> None:
        # Built here, not in run(): updates and signals of the first activation are
        # handled before run() starts and must find the restored state.
        self._tenant = inp.tenant
        self._fleet = list(inp.fleet)
        # Whether the fleet is known (given, carried, or learned from the worker in run());
        # until then reports of clusters not yet registered wait in ``_early_reports``.
        self._fleet_known = bool(inp.fleet) or bool(inp.carried)
        # Whether silent workers mark their cluster down (patched in run()).
        self._silent_checks = False
        self._early_reports: dict[str, CapacityReport] = {}
        # How good the start estimates of each queue were, as the control plane scored
        # them (``START_ESTIMATES_SIGNAL``): shown by the ``queues`` query, not decided on.
        self._start_estimates: dict[str, dict[str, Any]] = {}
        # The door's settings pushed to the store: changes made, changes pushed.
        self._door_gen = 0
        self._door_pushed = 0
        self._door_lock = asyncio.Lock()
        self._max_history = inp.max_history
        # This run's silence interval (its input's; else CLUSTER_SILENT_S).
        self._silent_s = inp.cluster_silent_s
        self._changed = True
        # See "One reader of inputs" above. Decided once per run, as it starts: a run
        # recorded before replays as it was written, the next run (after continue-as-new)
        # is serial.
        self._serial = workflow.patched("serial-inputs")
        # Syncs of its own accord (SAFETY_SYNC_BUSY_S); serial runs recorded before not.
        self._safety = self._serial and workflow.patched("safety-sync")
        # Delivery hands admissions over first and signals the rest off the loop (see
        # "Hand over first" above); serial runs recorded before dispatch locally.
        self._hand_over = self._serial and workflow.patched("hand-over-first")
        # How many of the undelivered admissions (from the front) were offered already.
        self._offered = 0
        # The fleet is part of the stored configuration (the cluster registry: clusters
        # registered live, and those of the worker's fleet file), reloaded by a fresh
        # run; runs recorded before push only queues and org limits.
        self._clusters_in_config = self._serial and workflow.patched("clusters-in-config")
        # Reusable environments too: a declaration is stored before its update returns,
        # and a fresh run knows them without the SDK declaring them again (an SDK process
        # declares each once); runs recorded before keep them only in the core's state.
        self._envs_in_config = self._clusters_in_config and workflow.patched(
            "environments-in-config"
        )
        self._inbox: list[Callable[[], None]] = []
        # Configuration changes applied and not yet pushed to the store (one audit row
        # each), and how many this run has made (their tokens).
        self._audit: list[dict[str, Any]] = []
        self._audit_no = 0
        # The queues draining as of the last iteration: one that drained since (the
        # core settles it) gets its audit row, by the scheduler.
        self._draining: set[str] = set()
        # A fresh run reads its tenant's stored configuration in run() (patch
        # ``config-from-store``); until then validators cannot tell a queue is missing.
        self._config_pending = not inp.carried
        # Syncs of this run: the latest whose result the loop took, and the latest whose
        # result is surely in the history (its task completed); the claims of those in
        # between stay in the store (``SyncInput.keep_claims``, issue #20).
        self._seen_sync = 0
        self._durable_sync = 0
        # The loop's clock: read where the loop wakes (serial runs).
        self._now = workflow.now().timestamp()
        self._last_sync_at = self._now
        self._nudged: set[str] = set()
        self._more: set[str] = set()
        self._out_admit: list[AdmitItem] = []
        self._out_reject: list[RejectItem] = []
        self._inflight = 0
        self._timer_at: float | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._core: Scheduler
        self._loop = _Loop()
        if inp.carried:
            self._core = Scheduler.from_snapshot(inp.carried["snapshot"])
            self._loop = _Loop(**inp.carried["loop"])
            self._nudged.update(self._loop.nudged)
            self._more.update(self._loop.more)
            self._out_admit = [_admit_item(d) for d in inp.carried.get("admit", [])]
            self._out_reject = [_reject_item(d) for d in inp.carried.get("reject", [])]
        else:
            self._core = Scheduler(clusters=[ClusterSpec.from_dict(c) for c in inp.fleet])
            # A fresh scheduler may have been (re)started over an existing backlog.
            self._nudged.add(DONE_CHANNEL)
            self._more.add("*")
        known = self._cluster_names()
        for c in inp.fleet:
            if c["name"] not in known:
                self._core.add_cluster(ClusterSpec.from_dict(c))
        # The store's ``wants-ends`` as this run last wrote it (None: not yet), and
        # whether this run keeps it (patched in: runs recorded before do not).
        self._wants_written: bool | None = None
        self._lazy_ends = False
        # Backlog refills in bites, the next one by a (non-local) activity (patch
        # ``bites``; runs recorded before take whole windows and sleep between refills).
        self._bites = False
        self._claimed = 0  # leases claimed in this loop iteration
        # Whether the latest pass left work waiting (leases claimed since are undecided,
        # not waiting).
        self._waits = self._waiting()
        self._stats = {
            "passes": 0,
            "syncs": 0,
            "admitted": 0,
            "rejected": 0,
            "dispatches": 0,
            # Passes that raised (a bug) and actions failed alone for it: see ``_schedule``.
            "pass_failures": 0,
            "actions_failed": 0,
            # Capacity reports ignored: stale, or of a cluster outside the fleet.
            "capacity_ignored": 0,
            # Clusters marked down for a silent worker (CLUSTER_SILENT_S).
            "clusters_down": 0,
            # Syncs of a serial run's own accord (SAFETY_SYNC_BUSY_S).
            "safety_syncs": 0,
            # Admissions handed over in-process to their action's first task.
            "handed_over": 0,
        }

    # --- inbound: signals -----------------------------------------------------------

    @workflow.signal(name=NUDGE_SIGNAL)
    def nudge(self, channel: str) -> None:
        """The store has news on ``channel`` (``q:<queue>`` or ``done``)."""
        if self._serial:
            self._history_moved_on(self._seen_sync)
            self._inbox.append(lambda: self._nudged.add(channel))
            return
        self._nudged.add(channel)
        self._changed = True

    @workflow.signal(name=START_ESTIMATES_SIGNAL)
    def start_estimates(self, scores: dict[str, dict[str, Any]]) -> None:
        """The control plane's scores of this tenant's start estimates, per queue (see
        ``headway.telemetry.StartEstimates``): kept for the ``queues`` query only, never
        read by a pass, so it changes no decision (and is not carried on)."""
        self._start_estimates.update(scores)

    @workflow.signal(name=protocol.CAPACITY_SIGNAL)
    def capacity_report(self, report: CapacityReport) -> None:
        """A cluster worker's view of its cluster.

        Reports are ordered by the sending worker's incarnation (its start) and then its
        sequence: a restarted worker numbers from 1 again and its reports win over the
        old process's; a report older than the view (reordered, or from an older process
        still alive during a rollout) is ignored with a log line. Only clusters of the
        tenant's fleet are accepted: a report naming any other cluster is ignored and
        counted (``stats``: capacity_ignored), or held until the fleet is known when it
        is still being learned.
        """
        if self._serial:
            self._history_moved_on(self._seen_sync)
            heard_at = workflow.now().timestamp()
            self._inbox.append(lambda: self._take_report(report, heard_at))
            return
        if not workflow.patched("registered-clusters-only"):
            self._capacity_report_v0(report)
            return
        if report.cluster not in self._cluster_names() and not self._fleet_known:
            self._early_reports[report.cluster] = report
            return
        self._take_report(report, None)

    def _history_moved_on(self, seen: int) -> None:
        """A signal or an update came (it comes first in a new workflow task), or a timer
        or regular activity started when ``seen`` syncs were taken completed: the task
        that took them completed, so their results are in the history."""
        self._durable_sync = max(self._durable_sync, seen)

    def _take_report(self, report: CapacityReport, heard_at: float | None) -> None:
        """A report of a known fleet (serial runs: taken by the loop, heard at
        ``heard_at``; else now)."""
        if report.cluster not in self._cluster_names():
            self._ignore_report(report, "the cluster is not in the tenant's fleet")
            return
        stale = self._stale(report)
        if stale:
            self._ignore_report(report, stale)
            return
        self._apply_report(report, heard_at)

    def _capacity_report_v0(self, report: CapacityReport) -> None:
        # Histories recorded before "registered-clusters-only" replay through this.
        last = self._loop.capacity_seq.get(report.cluster)
        if report.sequence and last is not None and report.sequence <= last:
            return
        if report.cluster not in self._cluster_names():
            self._core.add_cluster(ClusterSpec(report.cluster))
        self._apply_report(report)

    def _stale(self, report: CapacityReport) -> str:
        """Why ``report`` is older than the view of its cluster ("" when it is not)."""
        held = self._loop.capacity_from.get(report.cluster)
        if held is not None and report.incarnation != held[0]:
            if report.started_at < held[1]:
                return f"from worker {report.incarnation!r}, older than {held[0]!r}"
            return ""  # a newer incarnation: its sequence starts again
        last = self._loop.capacity_seq.get(report.cluster)
        if report.sequence and last is not None and report.sequence <= last:
            return f"sequence {report.sequence} not above {last}"
        return ""

    def _ignore_report(self, report: CapacityReport, why: str) -> None:
        self._stats["capacity_ignored"] += 1
        workflow.logger.warning("capacity report of %s ignored (%s)", report.cluster, why)

    def _apply_report(self, report: CapacityReport, heard_at: float | None = None) -> None:
        self._core.report_capacity(report.cluster, report.nodes, report.reflected_actions)
        self._loop.capacity_seq[report.cluster] = report.sequence
        if report.incarnation:
            self._loop.capacity_from[report.cluster] = [report.incarnation, report.started_at]
        self._loop.capacity[report.cluster] = {
            "known": report.nodes is not None,
            "nodes": len(report.nodes) if report.nodes is not None else None,
            "free_gpu": sum(n.free_gpu for n in report.nodes) if report.nodes else 0,
            "free_cpu_m": sum(n.free_cpu_m for n in report.nodes) if report.nodes else 0,
            "sequence": report.sequence,
            "incarnation": report.incarnation,
            "observed_at": report.observed_at,
            "heard_at": workflow.now().timestamp() if heard_at is None else heard_at,
        }
        if self._silent_checks and report.cluster in self._loop.silent:
            workflow.logger.warning("cluster %s reports again: up", report.cluster)
            self._loop.silent.remove(report.cluster)
            self._core.set_cluster_health(report.cluster, True)
        self._changed = True

    # --- inbound: queue configuration (updates with validators) ---------------------

    @workflow.update(name=protocol.UPSERT_QUEUE_UPDATE)
    async def upsert_queue(self, spec: dict[str, Any]) -> dict[str, Any]:
        """Create or replace a queue; returns the applied ``QueueSpec.to_dict()``.

        ``spec`` may carry ``by`` (``{"who", "source"}``) for the audit row."""
        spec, by = _split_by(spec)
        q = _parse_queue(spec)
        if self._serial:

            def upsert() -> None:
                old = self._queue_dict(q.name)
                _apply(lambda: self._core.upsert_queue(q))
                self._record("queue", q.name, old, q.to_dict(), by)

            await self._through_loop(upsert)
            return q.to_dict()
        _apply(lambda: self._core.upsert_queue(q))
        self._changed = True
        await self._push_door()
        return q.to_dict()

    @upsert_queue.validator
    def _validate_upsert(self, spec: dict[str, Any]) -> None:
        _parse_queue(_split_by(spec)[0])

    @workflow.update(name=protocol.UPDATE_QUEUE_UPDATE)
    async def update_queue(self, req: dict[str, Any]) -> dict[str, Any]:
        """Change some knobs of a queue live (``{"name", "changes"}``); in-flight work stays."""
        if self._serial:

            def change() -> QueueSpec:
                old = self._queue_dict(req["name"])
                new: QueueSpec = _apply(
                    lambda: self._core.update_queue(req["name"], req.get("changes") or {})
                )
                self._record("queue", new.name, old, new.to_dict(), req.get("by"))
                return new

            changed: QueueSpec = await self._through_loop(change)
            return changed.to_dict()
        spec: QueueSpec = _apply(
            lambda: self._core.update_queue(req["name"], req.get("changes") or {})
        )
        self._changed = True
        await self._push_door()
        return spec.to_dict()

    @update_queue.validator
    def _validate_update(self, req: dict[str, Any]) -> None:
        if not isinstance(req, dict):
            raise ValueError(f"request: {req!r} is not a mapping")
        name = req.get("name")
        if name not in self._core.queues and not self._config_pending:
            raise ValueError(f"name: {name!r} does not exist")
        changes = req.get("changes")
        if changes is not None and not isinstance(changes, dict):
            raise ValueError(f"changes: {changes!r} is not a mapping")

    @workflow.update(name=protocol.REMOVE_QUEUE_UPDATE)
    async def remove_queue(self, req: dict[str, Any]) -> dict[str, Any]:
        """Remove an empty queue (``{"name"}``): nothing waiting, running or in the store."""
        name = req["name"]
        if self._serial:

            def remove() -> None:
                old = self._queue_dict(name)
                self._remove_queue(name)
                self._record("queue", name, old, None, req.get("by"))

            await self._through_loop(remove)
            return {"name": name, "removed": True}
        _apply(lambda: self._core.remove_queue(name))
        self._more.discard(name)
        self._nudged.discard(f"q:{name}")
        self._changed = True
        await self._push_door()
        return {"name": name, "removed": True}

    @remove_queue.validator
    def _validate_remove(self, req: dict[str, Any]) -> None:
        if not isinstance(req, dict) or not isinstance(req.get("name"), str):
            raise ValueError(f"request: {req!r} is not {{'name': QUEUE}}")
        name = req["name"]
        q = self._core.queues.get(name)
        if q is None:
            if self._config_pending:
                return  # the loop finds out once the stored configuration is in
            raise ValueError(f"queue: {name!r} does not exist")
        held = len(q.waiting) + q.running
        if held or name in self._more:
            more = " and more in the store" if name in self._more else ""
            raise ValueError(
                f"queue: {name!r} still holds {held} action(s){more}; "
                f"drain it (`headway drain queue {name}`) and wait until it is empty"
            )

    @workflow.update(name=protocol.REGISTER_CLUSTER_UPDATE)
    async def register_cluster(self, spec: dict[str, Any]) -> dict[str, Any]:
        """Add a cluster to the tenant's fleet, or replace the declared shape of a known
        one (what runs there stays); returns the applied ``ClusterSpec.to_dict()``.

        Stored with the configuration (the cluster registry) and audited; a queue's
        selector may name it from then on. Its worker's capacity reports are taken from
        then on too (a report of a cluster not in the fleet is ignored)."""
        spec, by = _split_by(spec)
        c = _parse_cluster(spec)

        def register() -> None:
            old = next((dict(f) for f in self._fleet if f.get("name") == c.name), None)
            self._core.add_cluster(c)
            new = c.to_dict()
            self._fleet = [f for f in self._fleet if f.get("name") != c.name] + [new]
            self._record("cluster", c.name, old, new, by)

        await self._through_loop(register)
        return c.to_dict()

    @register_cluster.validator
    def _validate_register_cluster(self, spec: dict[str, Any]) -> None:
        if not self._clusters_in_config:
            raise ValueError(
                "this scheduler run predates the cluster registry; it takes clusters "
                "after its next continue-as-new"
            )
        _parse_cluster(_split_by(spec)[0])

    @workflow.update(name=protocol.SET_ORG_UPDATE)
    async def set_org(self, org: dict[str, Any]) -> dict[str, Any]:
        """Replace the tenant's org-wide limits (``by``: as for ``upsert_queue``)."""
        org, by = _split_by(org)
        limits = _parse_org(org)
        if self._serial:

            def set_org() -> None:
                old = self._core.org.to_dict()
                _apply(lambda: self._core.set_org(limits))
                self._record("org", "", old, limits.to_dict(), by)

            await self._through_loop(set_org)
            return limits.to_dict()
        _apply(lambda: self._core.set_org(limits))
        self._changed = True
        await self._push_door()
        return limits.to_dict()

    @set_org.validator
    def _validate_org(self, org: dict[str, Any]) -> None:
        _parse_org(_split_by(org)[0])

    # --- inbound: reusable environments (the SDK declares them at first submit) -----

    @workflow.update(name=protocol.DECLARE_ENVIRONMENT_UPDATE)
    async def declare_environment(self, spec: dict[str, Any]) -> dict[str, Any]:
        """Declare a reusable environment (``EnvironmentSpec.to_dict()`` notation, as a
        scenario's ``environments:`` entry); returns it as declared. Idempotent: the same
        shape again changes nothing. A different shape replaces the declared one only
        while nothing of it exists (no pool placed, no action of it known); otherwise it
        is refused, naming the fields that differ (the pool in place keeps its shape).

        Declared environments live in the core's state (carried across continue-as-new)
        and (``environments-in-config``) in the stored configuration, which a scheduler
        started afresh reloads; this update returns once the declaration is stored.
        """
        env = _parse_environment(spec)
        if self._envs_in_config:
            await self._through_loop(lambda: _apply(lambda: self._declare(env)))
            return env.to_dict()
        if not self._serial:
            _apply(lambda: self._declare(env))
            return env.to_dict()
        done: list[tuple[bool, Any]] = []

        def declare() -> None:
            try:
                done.append((True, _apply(lambda: self._declare(env))))
            except Exception as err:  # the update fails, the workflow task does not
                done.append((False, err))

        self._inbox.append(declare)
        await workflow.wait_condition(lambda: bool(done))
        ok, value = done[0]
        if not ok:
            raise value
        return env.to_dict()

    @declare_environment.validator
    def _validate_environment(self, spec: dict[str, Any]) -> None:
        _parse_environment(spec)

    def _declare(self, env: EnvironmentSpec) -> None:
        old = self._core.env_specs.get(env.name)
        if old == env:
            return
        if old is not None:
            in_use = env.name in self._core.envs or any(
                a.env == env.name for a in self._core.actions.values()
            )
            if in_use:
                was, now = old.to_dict(), env.to_dict()
                diff = ", ".join(f"{k}: {was[k]!r} -> {now[k]!r}" for k in now if now[k] != was[k])
                raise ValueError(
                    f"environment {env.name!r} is declared with another shape and is in use"
                    f" ({diff}); give the new shape another name, or declare it once the"
                    " pool is torn down (idle_ttl after its last action)"
                )
        self._core.env_specs[env.name] = env
        if old is not None:
            self._core.invalidate()  # placements remembered for the old footprint
        self._changed = True

    def _queue_dict(self, name: str) -> dict[str, Any] | None:
        q = self._core.queues.get(name)
        return q.spec.to_dict() if q is not None else None

    def _record(
        self, kind: str, name: str, old: dict[str, Any] | None, new: dict[str, Any] | None, by: Any
    ) -> None:
        """Note a configuration change applied just now, for its audit row (pushed to the
        store with the door); a change that changed nothing is not one."""
        if old == new:
            return
        by = by if isinstance(by, dict) else {}
        self._audit_no += 1
        self._audit.append(
            {
                "kind": kind,
                "name": name,
                "change": "set" if kind == "org" else _change(old, new),
                "who": str(by.get("who") or "unknown"),
                "source": str(by.get("source") or "unknown"),
                "at": workflow.now().timestamp(),
                "old": old,
                "new": new,
                "token": f"{workflow.info().run_id}:{self._audit_no}",
            }
        )

    def _load_config(self, stored: dict[str, Any]) -> None:
        """Take the tenant's stored configuration (a fresh run): its queues, its org,
        (``clusters-in-config``) the clusters registered beyond its fleet file (a
        cluster the fleet file declares keeps the file's shape: the file is the
        operator's declaration at start), and (``environments-in-config``) its declared
        reusable environments."""
        known = self._cluster_names()
        clusters = (stored.get("clusters") or []) if self._clusters_in_config else []
        for spec in clusters:
            try:
                c = _parse_cluster(spec)
            except ValueError as err:
                workflow.logger.error("stored cluster %r left out: %s", spec, err)
                continue
            if c.name not in known:
                self._core.add_cluster(c)
                self._fleet.append(c.to_dict())
        for spec in stored.get("queues") or []:
            try:
                q = _parse_queue(spec)
                if q.name not in self._core.queues:
                    self._core.upsert_queue(q)
            except (ValueError, KeyError, TypeError) as err:  # skip it, keep the rest
                workflow.logger.error("stored queue %r left out: %s", spec, err)
        org = stored.get("org")
        if org is not None:
            try:
                self._core.set_org(_parse_org(org))
            except (ValueError, KeyError, TypeError) as err:
                workflow.logger.error("stored org limits %r left out: %s", org, err)
        for spec in (stored.get("environments") or []) if self._envs_in_config else []:
            try:  # stored as the core has it (EnvironmentSpec.to_dict(): millicores)
                env = EnvironmentSpec.from_dict(spec)
            except (ValueError, KeyError, TypeError, AttributeError) as err:
                workflow.logger.error("stored environment %r left out: %s", spec, err)
                continue
            # One declared meanwhile (its update waited for this load) is the newer.
            self._core.env_specs.setdefault(env.name, env)

    def _remove_queue(self, name: str) -> None:
        _apply(lambda: self._core.remove_queue(name))
        self._more.discard(name)
        self._nudged.discard(f"q:{name}")

    async def _through_loop(self, change: Callable[[], _T]) -> _T:
        """Have the loop apply ``change`` where it takes its inputs, and the door's settings
        reach the store; return what ``change`` returned, or raise what it raised.

        An update returns only once its change is at the door, so a submission after it
        is decided by the new settings.
        """
        self._history_moved_on(self._seen_sync)
        done: list[tuple[bool, Any, int]] = []

        def apply() -> None:
            try:
                value: Any = change()
            except Exception as err:  # the update fails, the workflow task does not
                done.append((False, err, 0))
                return
            self._door_gen += 1
            done.append((True, value, self._door_gen))

        self._inbox.append(apply)
        await workflow.wait_condition(
            lambda: bool(done) and (not done[0][0] or self._door_pushed >= done[0][2])
        )
        ok, value, _ = done[0]
        if not ok:
            raise value
        result: _T = value
        return result

    async def _put_door(self, remote: bool = False) -> None:
        """Put the door's settings as they are now into the store (``remote``: by a
        regular activity, whose completion is a wake replays share)."""
        at = self._door_gen
        door = self._door_input()
        await _activity(SET_DOOR_ACTIVITY, door, type(None), local=not remote, timeout_s=30)
        self._door_pushed = at
        del self._audit[: len(door.audit)]

    def _door_input(self) -> DoorInput:
        org = self._core.org.submit_rate
        return DoorInput(
            tenant=self._tenant,
            rate={"per_second": org.per_second, "burst": org.burst} if org else None,
            queues={
                name: {
                    "status": q.spec.status.value,
                    "depth": q.spec.depth,
                    "rate": q.spec.submit_rate.to_dict() if q.spec.submit_rate else None,
                }
                for name, q in sorted(self._core.queues.items())
            },
            # The configuration goes to the store with the door, and its audit rows.
            config={
                "queues": {n: q.spec.to_dict() for n, q in sorted(self._core.queues.items())},
                "org": self._core.org.to_dict(),
                **(
                    {"clusters": {str(c["name"]): dict(c) for c in self._fleet}}
                    if self._clusters_in_config
                    else {}
                ),
                **(
                    {"environments": {n: e.to_dict() for n, e in self._core.env_specs.items()}}
                    if self._envs_in_config
                    else {}
                ),
            },
            audit=list(self._audit),
        )

    async def _push_door(self) -> None:
        """Put the door's settings (queues, the org's submit rate) into the store, where
        ``put_lease`` decides every submission against them (patch ``door``).

        An update returns only once its change is at the door, so a submission after it
        is decided by the new settings. Pushes go one at a time, each with the state as
        it is when it starts: the last leaves the store as the core is.
        """
        if not workflow.patched("door"):
            return
        self._door_gen += 1
        want = self._door_gen
        async with self._door_lock:
            if self._door_pushed >= want:
                return  # a push that started after this change carried it
            await self._put_door()

    # --- queries ----------------------------------------------------------------------

    @workflow.query(name="queues")
    def queues(self) -> dict[str, dict[str, Any]]:
        """Per queue: config and stats; ``backlog_in_store`` if leases wait beyond the window."""
        stats = self._core.queue_stats()
        for name, s in stats.items():
            s["backlog_in_store"] = name in self._more
            if name in self._start_estimates:
                s["start_estimates"] = self._start_estimates[name]
        return stats

    @workflow.query(name="waiting_reasons")
    def waiting_reasons(self) -> dict[str, list[Any]]:
        """Per waiting action in the window: ``[reason, [every reason so far]]``. The
        control plane tells each action that has waited a while (for the Web UI)."""
        out: dict[str, list[Any]] = {}
        down: dict[str, str | None] = {}
        for k, (r, rs) in self._core.waiting_reasons().items():
            if r == Reason.NoClusterCapacity:
                a = self._core.actions.get(k)
                if a is not None:
                    q = a.spec.queue
                    if q not in down:
                        down[q] = self._all_down(q)
                    if down[q] is not None:
                        r, rs = Reason.ClusterDown, list(dict.fromkeys([*rs, Reason.ClusterDown]))
            out[k] = [r, rs]
        return out

    @workflow.query(name="why")
    def why(self, action_id: str) -> dict[str, Any]:
        """Where an action is and the reasons the last pass recorded on it."""
        state = self._core.state(action_id)
        if state is None:
            return {
                "action_id": action_id,
                "state": None,
                "reason": None,
                "reasons": [],
                "message": "not in the scheduler's window: queued in the store behind the"
                " window, rejected, or already ended",
            }
        reason = self._core.reason(action_id)
        out: dict[str, Any] = {
            "action_id": action_id,
            "state": state,
            "reason": reason,
            "reasons": self._core.reasons(action_id),
            "message": describe(reason) if reason else "",
        }
        a = self._core.actions.get(action_id)
        down = self._all_down(a.spec.queue) if a is not None else None
        if state == "waiting" and reason == Reason.NoClusterCapacity and down is not None:
            # Not room but health: every cluster it may use is down (no worker heard).
            out["reason"] = Reason.ClusterDown.value
            out["message"] = f"{describe(Reason.ClusterDown)}: {down}"
        if state == "waiting":
            # What would unblock it, in numbers. Worked out on a copy: a query must not
            # touch the state (or the caches) the next pass decides with.
            now = workflow.now().timestamp()
            copy = Scheduler.from_snapshot(self._core.to_snapshot())
            copy.schedule(now)
            ex = explain(copy, action_id, now)
            out["details"] = ex.details
            out["unblock"] = ex.unblock
        if out["reason"] == Reason.ClusterDown:
            out["reasons"] = list(dict.fromkeys([*out["reasons"], Reason.ClusterDown.value]))
            out["unblock"] = [
                "a worker of one of these clusters reporting again (start or restart it), or"
                " a cluster that is up added to the queue's clusters"
            ]
        return out

    @workflow.query(name="org")
    def org(self) -> dict[str, Any]:
        """The tenant's org limits (``OrgLimits.to_dict()``; None is unlimited)."""
        return self._core.org.to_dict()

    @workflow.query(name="snapshot")
    def snapshot(self) -> dict[str, Any]:
        """The core's state and the scheduler's clock, for client-side forecasts and
        what-ifs (``headway forecast``, ``headway what-if``) on a copy."""
        return {"now": workflow.now().timestamp(), "snapshot": self._core.to_snapshot()}

    @workflow.query(name="fleet")
    def fleet(self) -> dict[str, Any]:
        """The tenant's fleet, its clusters, and the latest capacity view of each."""
        return {
            "fleet": self._fleet,
            "clusters": sorted(self._cluster_names()),
            # False while a fresh run still learns its fleet (from the worker, then the
            # stored registry): an empty list then does not mean "no clusters".
            "known": self._fleet_known and not self._config_pending,
            "capacity": self._loop.capacity,
            "down": sorted(self._loop.silent),
            # Admissions to a cluster that had reported no capacity, per cluster (the
            # control plane's poller turns them into a metric and a warning).
            "unknown_capacity_admissions": dict(self._core.unknown_capacity_by_cluster),
        }

    @workflow.query(name="carried_bytes")
    def carried_bytes(self) -> int:
        """Size in bytes of what continue-as-new would carry right now (JSON)."""
        return len(json.dumps(self.carried_state(), separators=(",", ":")))

    @workflow.query(name="stats")
    def stats(self) -> dict[str, Any]:
        """Loop counters of this run (for benchmarks and debugging)."""
        return {
            **self._stats,
            "history_length": workflow.info().get_current_history_length(),
            "run_id": workflow.info().run_id,
            "continued": workflow.info().continued_run_id is not None,
            "inflight_dispatches": self._inflight,
            "running_tracked": len(self._loop.running_since),
        }

    # --- the loop -----------------------------------------------------------------

    @workflow.run
    async def run(self, inp: SchedulerInput) -> None:
        """Wait for change, sync, pass, dispatch; continue as new when suggested."""
        # Finishers nudge at once only while work waits (``wants-ends`` in the store);
        # other ends come with the next sync. See ``headway.store.leases``.
        self._lazy_ends = workflow.patched("lazy-ends")
        self._bites = workflow.patched("bites")
        self._silent_checks = workflow.patched("silent-clusters")
        # A cluster no worker has ever reported for goes down once work sent to it has
        # waited the silence interval (see _mark_silent); runs recorded before not.
        self._unheard_checks = self._silent_checks and workflow.patched("unheard-clusters")
        if inp.carried and workflow.patched("sync-after-continue"):
            # A nudge that reached the previous run while it was continuing as new is
            # lost with it, and its store flag stays set, so no one nudges again: look
            # at the store once, as a fresh run does.
            self._nudged.add(DONE_CHANNEL)
            self._more.add("*")
            self._changed = True
        if not self._fleet and not inp.carried and workflow.patched("fleet-from-worker"):
            # Started without a fleet (by a config call): learn it from the worker.
            specs: list[dict[str, Any]] = await workflow.execute_local_activity(
                FLEET_ACTIVITY,
                start_to_close_timeout=timedelta(seconds=30),
                result_type=list[dict[str, Any]],
            )
            self._fleet = specs
            known = self._cluster_names()
            for c in specs:
                if c["name"] not in known:
                    self._core.add_cluster(ClusterSpec.from_dict(c))
            self._changed = True
        self._fleet_known = True
        if not inp.carried and workflow.patched("config-from-store"):
            # A fresh run (a new tenant, or one started again after its scheduler was
            # terminated or its Temporal server lost it) takes the configuration stored
            # by its predecessors, before any change that reached it meanwhile.
            stored: dict[str, Any] = await workflow.execute_local_activity(
                CONFIG_ACTIVITY,
                self._tenant,
                start_to_close_timeout=timedelta(seconds=30),
                retry_policy=_RETRY,
                result_type=dict[str, Any],
            )
            self._load_config(stored)
            self._changed = True
        self._config_pending = False
        # Every run puts its settings at the door first: a tenant's first run makes its
        # door, a continued one restates it, and one recorded before the door existed
        # (patch ``door``) brings it to a store that never had it.
        if self._serial:
            # The first iteration wakes right after this regular activity: where a
            # replay wakes (after a local one, the result may come a task later).
            self._door_gen += 1
            await self._put_door(remote=True)
            await self._serve(inp)
            return
        await self._push_door()
        early, self._early_reports = self._early_reports, {}
        for report in early.values():
            self.capacity_report(report)
        while True:
            await workflow.wait_condition(self._has_work)
            self._changed = False
            now = workflow.now().timestamp()
            for _ in range(MAX_SYNCS_PER_ITERATION):
                if not self._sync_needed() or (self._bites and self._claimed >= BITE):
                    break
                await self._sync()
            self._claimed = 0
            now = workflow.now().timestamp()
            if self._silent_checks:
                self._mark_silent(now)
            self._decide(now)
            cont = self._should_continue_as_new()
            # The task that continues as new may not complete: a signal arriving while it
            # runs makes the server reject its completion (UnhandledCommand) and the task
            # runs again, its pass recomputed. A local dispatch in it would have delivered
            # the first pass's admissions already; a regular one is only a command.
            remote = cont and workflow.patched("no-local-dispatch-when-continuing")
            self._launch_dispatches(local_ok=not remote)
            self._maybe_reap(now)
            self._arm_timer(now)
            if cont:
                await self._drain_and_continue_as_new(inp)
            if self._sync_needed():
                # Local activities chained in one workflow task hold back its commands
                # (the dispatches just started) and every query until the task's
                # heartbeat. Nudges end by themselves, a backlog does not: when it is
                # the backlog asking for the next refill, end the task (1 ms timer).
                if self._backlog_refill_needed():
                    if self._bites:
                        # The next bite by a regular activity: its completion starts the
                        # next task at once, where a 1 ms timer fires on the server's
                        # timer clock (measured ~0.9 s on the dev server).
                        await self._sync(remote=True)
                    elif workflow.patched("yield-between-refills"):
                        await workflow.sleep(0.001)
                self._changed = True

    async def _serve(self, inp: SchedulerInput) -> None:
        """The loop of a serial run: wake, take the inbox, sync, pass, deliver.

        The inbox, the clock and the history length are read right after a wake only
        (see "One reader of inputs" in the module docstring): every later step uses
        what was read there and what its own local activities returned.
        """
        self._note_drained()  # (only learns which queues drain: none was seen draining)
        while True:
            await workflow.wait_condition(self._has_work)
            self._now = now = workflow.now().timestamp()
            cont = self._should_continue_as_new()
            self._take_inbox()
            # Nothing sets it again before the next wake but history (a timer, a
            # regular activity): the next iteration starts where a replay starts it.
            self._changed = False
            if self._door_pushed < self._door_gen:
                await self._put_door()
            for _ in range(MAX_SYNCS_PER_ITERATION):
                if not self._sync_needed() or (self._bites and self._claimed >= BITE):
                    break
                await self._sync()
            self._claimed = 0
            if self._door_pushed < self._door_gen:
                await self._put_door()  # a sync found the store without its door
            if self._silent_checks:
                self._mark_silent(now)
            self._decide(now)
            if self._note_drained():
                await self._put_door()  # the drained status and its audit row
            if cont:
                # Its task may not complete (a signal arriving meanwhile makes the server
                # reject it) and then runs again: regular dispatches only, which are mere
                # commands until it completes.
                await self._continue_as_new(inp)
            await self._deliver(now)
            self._maybe_reap(now)
            self._arm_timer(now)
            if self._sync_needed():
                # More to take from the store than this iteration took (a backlog, ends
                # beyond one sync): by a regular activity, whose completion is history,
                # so the next iteration wakes where a replay wakes.
                await self._sync(remote=True)
                self._changed = True

    def _note_drained(self) -> bool:
        """Record the queues that went from draining to drained (their last action
        ended): an audit row each, by the scheduler. Whether there were any."""
        now_draining = set()
        drained = []
        for name, q in self._core.queues.items():
            status = q.spec.status
            if status is QueueStatus.draining:
                now_draining.add(name)
            elif status is QueueStatus.drained and name in self._draining:
                drained.append(name)
        self._draining = now_draining
        if not drained or not workflow.patched("audit-drained"):
            return False
        for name in drained:
            new = self._core.queues[name].spec.to_dict()
            old = {**new, "status": QueueStatus.draining.value}
            self._record("queue", name, old, new, {"who": "scheduler", "source": "scheduler"})
        self._door_gen += 1
        return True

    def _take_inbox(self) -> None:
        items, self._inbox = self._inbox, []
        for apply in items:
            apply()

    def _decide(self, now: float) -> None:
        """One pass; its admissions join the undelivered ones (and the rejections of
        what waited past its queue's ``max_queued_time``, decided first)."""
        self._expire(now)
        admitted = self._schedule(now)
        self._waits = self._waiting()
        self._stats["passes"] += 1
        for a in admitted:
            self._loop.running_since[a.action_id] = now
            self._out_admit.append(
                AdmitItem(
                    self._workflow_id(a.action_id),
                    Admission(
                        action_id=a.action_id,
                        cluster=a.cluster,
                        node_hints=list(a.nodes),
                        decided_at=now,
                        reasons=list(a.reasons),
                        ready_timeout=self._ready_timeout(a.action_id),
                    ),
                )
            )
        self._stats["admitted"] += len(admitted)

    def _ready_timeout(self, action_id: str) -> float | None:
        """The ready timeout of the queue that admitted ``action_id`` (None: none)."""
        a = self._core.actions.get(action_id)
        q = self._core.queues.get(a.spec.queue) if a is not None else None
        return q.spec.retry.ready_timeout if q is not None else None

    async def _deliver(self, now: float) -> None:
        """Deliver what is decided (serial runs): a small batch by a local activity the
        loop awaits, a big one (or a probe) by a regular activity left running. A batch
        that finds workflows gone frees their room: the pass runs again.

        ``hand-over-first``: the loop only hands admissions over (a local activity), and
        regular dispatches signal the rest."""
        if self._hand_over:
            await self._hand_over_fresh(now)
            self._launch_dispatches(local_ok=False)
            return
        while (self._out_admit or self._out_reject) and self._inflight < MAX_DISPATCH_INFLIGHT:
            batch = self._next_batch()
            if not self._small(batch) or not workflow.patched("local-dispatch"):
                self._start_dispatch(batch)
                continue
            self._stats["dispatches"] += 1
            res = await _activity(
                DISPATCH_ACTIVITY, batch, DispatchResult, local=True, timeout_s=30
            )
            if res.gone:
                self._forget_gone(res.gone, now)
                self._decide(now)

    async def _hand_over_fresh(self, now: float) -> None:
        """Offer the admissions not offered yet whose action may still wait for it in its
        first workflow task (decided within ``OFFER_WITHIN_S`` of its submission) to
        that waiter, by local activities of at most ``LOCAL_DISPATCH_MAX``; the ones
        handed over are delivered. Needs no dispatch slot: an action's waiter runs out
        while signals queue."""
        fresh = [a for a in self._out_admit[self._offered :] if self._young(a, now)]
        self._offered = len(self._out_admit)
        handed: set[str] = set()
        for i in range(0, len(fresh), LOCAL_DISPATCH_MAX):
            chunk = fresh[i : i + LOCAL_DISPATCH_MAX]
            batch = DispatchBatch(self._tenant, chunk, hand_over_only=True)
            res = await _activity(
                DISPATCH_ACTIVITY, batch, DispatchResult, local=True, timeout_s=30
            )
            unsent = set(res.unsent)
            handed.update(
                a.admission.action_id for a in chunk if a.admission.action_id not in unsent
            )
        if handed:
            self._out_admit = [a for a in self._out_admit if a.admission.action_id not in handed]
            self._offered = len(self._out_admit)
            self._stats["handed_over"] += len(handed)

    def _young(self, item: AdmitItem, now: float) -> bool:
        a = self._core.actions.get(item.admission.action_id)
        return a is not None and now - a.spec.submit <= OFFER_WITHIN_S

    def _next_batch(self) -> DispatchBatch:
        admit = self._out_admit[:DISPATCH_BATCH]
        del self._out_admit[:DISPATCH_BATCH]
        self._offered = max(0, self._offered - len(admit))
        reject = self._out_reject[: DISPATCH_BATCH - len(admit)]
        del self._out_reject[: len(reject)]
        return DispatchBatch(self._tenant, admit, reject)

    @staticmethod
    def _small(batch: DispatchBatch) -> bool:
        n = len(batch.admissions) + len(batch.rejections)
        return not batch.probe and n <= LOCAL_DISPATCH_MAX

    async def _dispatch_remote(self, batch: DispatchBatch) -> None:
        """A regular dispatch activity; what it found reaches the loop by the inbox."""
        res: DispatchResult | None = None
        seen = self._seen_sync
        try:
            res = await _activity(
                DISPATCH_ACTIVITY,
                batch,
                DispatchResult,
                local=False,
                timeout_s=REMOTE_DISPATCH_TIMEOUT_S,
                heartbeat_s=REMOTE_DISPATCH_HEARTBEAT_S,
            )
        finally:
            self._history_moved_on(seen)
            self._inbox.append(lambda: self._dispatched(res))

    def _dispatched(self, res: DispatchResult | None) -> None:
        self._inflight -= 1
        if res is not None and res.gone:
            self._forget_gone(res.gone, self._now)

    def _forget_gone(self, gone: list[str], now: float) -> None:
        # The workflow is gone, so nobody will ever release it: do it here, and have
        # the store forget its lease.
        for action_id in gone:
            self._release(action_id, "cancelled", now)
            self._loop.forget.append(action_id)

    async def _continue_as_new(self, inp: SchedulerInput) -> None:
        """Serial runs: deliver what is decided by regular activities, let handlers and
        dispatches finish (taking the inbox at each wake), then continue as new."""
        while True:
            self._launch_dispatches(local_ok=False)
            await workflow.wait_condition(
                lambda: (
                    bool(self._inbox)
                    or (
                        self._inflight == 0
                        and not (self._out_admit or self._out_reject)
                        and workflow.all_handlers_finished()
                    )
                )
            )
            if not self._inbox:
                break
            self._take_inbox()
            if self._door_pushed < self._door_gen:
                await self._put_door()
        self._continue(inp)

    def _schedule(self, now: float) -> list[Admitted]:
        """The pass, kept from stopping the shard for good when it raises (a bug).

        A workflow task that raises is retried for ever with the same inputs, so one bad
        pass would stop every action of the tenant. Instead: what the failed pass had
        admitted is kept (it is applied), the core is rebuilt from its snapshot (ground
        truth only: nothing remembered) and the pass is tried again on the plain path;
        if it fails there too while deciding about one action, that action alone is
        failed (``SchedulerError``) and the pass tried once more. Every failure is
        logged with its traceback and counted (``stats``: pass_failures, actions_failed).
        The rebuilt core goes back to the fast path after a pass that succeeds.
        """
        try:
            return self._core.schedule(now)
        except PassError as e:
            admitted = list(e.admitted)
            self._pass_failed(e, "rebuilding the core and retrying on the plain path")
        for _ in range(MAX_FAILED_ACTIONS + 1):
            try:
                self._core = self._rebuilt(admitted, now)
                admitted += self._core.schedule(now)
                self._core = Scheduler.from_snapshot(self._core.to_snapshot())
                return admitted
            except PassError as e:
                admitted += e.admitted
                if e.action_id is None:
                    self._pass_failed(
                        e, "not deciding about one action: waiting for the next event"
                    )
                    break
                self._pass_failed(e, f"failing action {e.action_id!r} alone")
                self._fail_action(e.action_id, now)
            except Exception as e:  # the snapshot itself: keep the core as it is
                self._pass_failed(e, "the core could not be rebuilt")
                break
        return admitted

    def _rebuilt(self, admitted: list[Admitted], now: float) -> Scheduler:
        """The core rebuilt from its snapshot (ground truth only), on the plain path.

        The core records an admission in a few steps; a pass that raised between them
        leaves an action marked running that no one dispatches, holding its room for
        ever. Such an action started at ``now`` and is neither among this pass's
        admissions nor among those dispatched before (``running_since``): it is dropped
        from the snapshot and failed alone. Room its placement may have taken on a node
        comes back with its cluster's next capacity report (the worker reports on every
        change and every 30 s), which counts only the pods that exist.
        """
        snap = self._core.to_snapshot()
        told = {a.action_id for a in admitted}
        half = {
            r[0][0]
            for r in snap["running"]
            if r[3] == now and r[0][0] not in told and r[0][0] not in self._loop.running_since
        }
        if half:
            snap["running"] = [r for r in snap["running"] if r[0][0] not in half]
            snap["waiting"] = [r for r in snap["waiting"] if r[0] not in half]
        core = Scheduler.from_snapshot(snap, incremental=False)
        for action_id in sorted(half):
            workflow.logger.error("action %r was half admitted by a failed pass", action_id)
            self._reject_failed(action_id, now)
        return core

    def _pass_failed(self, e: BaseException, then: str) -> None:
        self._stats["pass_failures"] += 1
        workflow.logger.error(
            "scheduler pass failed (%s: %s); %s", type(e).__name__, e, then, exc_info=e
        )

    def _fail_action(self, action_id: str, now: float) -> None:
        try:
            self._core.cancel(action_id, now)
        except Exception as e:  # the action is failed to its workflow all the same
            self._pass_failed(e, f"cancelling {action_id!r} in the core failed")
        self._reject_failed(action_id, now)

    def _expire(self, now: float) -> None:
        """Reject each waiting action past its queue's ``max_queued_time``: its workflow
        ends rejected (``QueuedTooLong``) and releases its lease. Nothing is decided,
        and no command issued, for a tenant whose queues set no such limit (the
        histories recorded before the knob replay)."""
        for gone in self._core.expire_waiting(now):
            self._stats["rejected"] += 1
            reason = Reason.QueuedTooLong
            self._out_reject.append(
                RejectItem(
                    self._workflow_id(gone.action_id),
                    Rejection(gone.action_id, str(reason), gone.detail, now),
                )
            )
            self._loop.workflow_ids.pop(gone.action_id, None)

    def _reject_failed(self, action_id: str, now: float) -> None:
        self._stats["actions_failed"] += 1
        reason = Reason.SchedulerError
        self._out_reject.append(
            RejectItem(
                self._workflow_id(action_id),
                Rejection(action_id, str(reason), describe(reason), now),
            )
        )
        self._loop.workflow_ids.pop(action_id, None)

    def _has_work(self) -> bool:
        return (
            self._changed
            or bool(self._inbox)
            or (
                self._inflight < MAX_DISPATCH_INFLIGHT and bool(self._out_admit or self._out_reject)
            )
        )

    # --- store sync ---------------------------------------------------------------

    def _room(self) -> dict[str, int]:
        room: dict[str, int] = {}
        # Backpressure: while decisions wait for dispatch, pull nothing new in (the
        # undelivered list is carried across continue-as-new and must stay bounded).
        if len(self._out_admit) + len(self._out_reject) >= MAX_UNDELIVERED:
            return dict.fromkeys(self._core.queues, 0)
        for name in self._core.queues:
            w = self._core.waiting_count(name)
            want = (f"q:{name}" in self._nudged and w < WINDOW) or (
                (name in self._more or "*" in self._more) and w < WINDOW // 2
            )
            room[name] = WINDOW - w if want else 0
        return room

    def _sync_needed(self) -> bool:
        if self._loop.forget or DONE_CHANNEL in self._nudged or "*" in self._more:
            return True
        if self._lazy_ends and self._waits and self._wants_written is not True:
            # Work waits now, and finishers still nudge lazily: tell them (and collect
            # the ends that came meanwhile) before waiting for a signal.
            return True
        room = self._room()
        if any(room.values()):
            return True
        # Leases of queues the core does not know are fetched (and rejected) at once.
        queues = self._core.queues
        return any((c.startswith("q:") and c[2:] not in queues) for c in self._nudged) or any(
            q not in queues for q in self._more
        )

    def _waiting(self) -> bool:
        return any(q.waiting for q in self._core.queues.values())

    def _backlog_refill_needed(self) -> bool:
        queues = self._core.queues
        return any(
            q == "*" or q not in queues or self._core.waiting_count(q) < WINDOW // 2
            for q in self._more
        )

    async def _sync(self, remote: bool = False) -> None:
        """Claim new leases (at most a bite with ``bites``) and ends, and apply them.

        Args:
            remote: run the sync as a regular activity rather than a local one: it ends
                the workflow task, and its completion starts the next.
        """
        taken, self._nudged = self._nudged, set()
        self._loop.sync_no += 1
        number = self._loop.sync_no
        run_id = workflow.info().run_id
        token = f"{run_id}:{number}"
        # A regular activity runs once the task that scheduled it completed: every sync
        # before it is in the history.
        first_kept = number if remote else self._durable_sync + 1
        keep = [f"{run_id}:{k}" for k in range(first_kept, number)] if self._serial else []
        forget, self._loop.forget = self._loop.forget, []
        room = self._room_for(taken)
        wants = self._waits if self._lazy_ends else None
        inp = SyncInput(
            tenant=self._tenant,
            token=token,
            room=room,
            default_room=WINDOW,
            max_leases=BITE if self._bites else MAX_SYNC_LEASES,
            max_done=MAX_SYNC_DONE,
            forget=forget,
            wants_ends=wants,
            keep_claims=keep,
        )
        # A remote sync takes milliseconds (a 1M-lease store: ~50 ms); if its worker dies,
        # the retry (same token, same claims) should not wait long.
        res = await _activity(
            SYNC_ACTIVITY, inp, SyncOutput, local=not remote, timeout_s=10 if remote else 60
        )
        self._claimed += len(res.leases)
        self._stats["syncs"] += 1
        self._seen_sync = number
        self._last_sync_at = self._now
        if remote:
            self._history_moved_on(number)
        if wants is not None:
            self._wants_written = wants
        # Serial runs: the clock of the wake (after a local activity, reading it would
        # differ on replay when the result came in the next task).
        now = self._now if self._serial else workflow.now().timestamp()
        for d in res.leases:
            spec = ActionSpec.from_dict({**d, "seq": self._loop.seq})
            self._loop.seq += 1
            wf = d.get("workflow_id") or ""
            if wf and wf != protocol.action_workflow_id(self._tenant, spec.id):
                self._loop.workflow_ids[spec.id] = wf
            if spec.id in self._core.actions:
                # Delivered again (a claim retried after a lost task): it is already
                # here, waiting or running; submitting twice would raise on every retry.
                workflow.logger.warning("lease of %r delivered again: kept once", spec.id)
                continue
            # A lease taken in at the door (``put_lease``) was decided there against the
            # store's whole backlog; the core does not decide the door's rules again.
            at_door = bool(d.get("door"))
            if not at_door and self._door_pushed and workflow.patched("door-restated"):
                # The door was put, yet a submission passed without one: the store lost
                # it (restored from a backup, or a new database under a running shard).
                # This one is decided here, late; the door is put again for the next.
                workflow.logger.warning(
                    "lease of %r came without the door: the store has no door for "
                    "tenant %r; putting it again",
                    spec.id,
                    self._tenant,
                )
                self._door_gen += 1
            rejected = self._core.submit(spec, now, door=not at_door)
            if rejected is not None:
                self._stats["rejected"] += 1
                self._out_reject.append(
                    RejectItem(
                        self._workflow_id(spec.id),
                        Rejection(spec.id, str(rejected), describe(rejected), now),
                    )
                )
                self._loop.workflow_ids.pop(spec.id, None)
        for action_id, kind in res.done:
            self._release(action_id, kind, now)
        self._more = set(res.more)
        if res.more_done:
            self._nudged.add(DONE_CHANNEL)
        if not self._serial:
            self._changed = True

    def _room_for(self, taken: set[str]) -> dict[str, int]:
        saved, self._nudged = self._nudged, taken
        try:
            return self._room()
        finally:
            self._nudged = saved

    def _release(self, action_id: str, kind: str, now: float) -> None:
        if kind == "cancelled":
            self._core.cancel(action_id, now)
        else:
            self._core.finish(action_id, now)
        self._loop.running_since.pop(action_id, None)
        self._loop.workflow_ids.pop(action_id, None)

    # --- dispatch -------------------------------------------------------------------

    def _workflow_id(self, action_id: str) -> str:
        return self._loop.workflow_ids.get(action_id) or protocol.action_workflow_id(
            self._tenant, action_id
        )

    def _launch_dispatches(self, local_ok: bool = True) -> None:
        while (self._out_admit or self._out_reject) and self._inflight < MAX_DISPATCH_INFLIGHT:
            self._start_dispatch(self._next_batch(), local_ok)

    def _start_dispatch(self, batch: DispatchBatch, local_ok: bool = True) -> None:
        """A dispatch left running (serial runs: a regular one; see ``_deliver``)."""
        self._inflight += 1
        self._stats["dispatches"] += 1
        if self._serial:
            self._spawn(self._dispatch_remote(batch))
            return
        local = local_ok and self._small(batch) and workflow.patched("local-dispatch")
        self._spawn(self._dispatch(batch, local))

    async def _dispatch(self, batch: DispatchBatch, local: bool = False) -> None:
        try:
            res = await _activity(
                DISPATCH_ACTIVITY,
                batch,
                DispatchResult,
                local=local,
                timeout_s=30 if local else 120,
            )
        finally:
            self._inflight -= 1
            self._changed = True
        self._forget_gone(res.gone, workflow.now().timestamp())

    # --- reaping ------------------------------------------------------------------

    def _maybe_reap(self, now: float) -> None:
        due = [a for a, t in self._loop.running_since.items() if now - t >= REAP_AFTER_S]
        if not due or self._inflight >= MAX_DISPATCH_INFLIGHT:
            return
        due = sorted(due)[:REAP_BATCH]
        for a in due:
            self._loop.running_since[a] = now
        self._start_dispatch(
            DispatchBatch(self._tenant, probe=[[a, self._workflow_id(a)] for a in due])
        )

    def _mark_silent(self, now: float) -> None:
        """Mark down each cluster whose worker has gone silent (see CLUSTER_SILENT_S).

        A declared cluster no worker has reported for is unknown, and open: work may be
        sent to it. But once an action sent there has waited the silence interval with
        no worker ever heard from (``unheard-clusters``), nobody is there to take it: the
        cluster is down too (its work is handed back by its own dispatch timeout), until
        a worker reports.
        """
        for name in self._unheard_overdue(now):
            workflow.logger.warning(
                "cluster %s: no worker has reported, work sent to it waited %.0f s: down"
                " until one reports",
                name,
                now - (self._unheard_since(name) or now),
            )
            self._loop.silent.append(name)
            self._stats["clusters_down"] += 1
            self._core.set_cluster_health(name, False)
        for name, view in self._loop.capacity.items():
            heard = view.get("heard_at")
            if heard is None or name in self._loop.silent or name not in self._core.clusters:
                continue
            if now - heard >= self._silent_after() and self._core.clusters[name].healthy:
                workflow.logger.warning(
                    "cluster %s silent for %.0f s: down until it reports again", name, now - heard
                )
                self._loop.silent.append(name)
                self._stats["clusters_down"] += 1
                self._core.set_cluster_health(name, False)

    def _unheard_since(self, name: str) -> float | None:
        """When the longest-waiting action on cluster ``name`` was sent there, while no
        worker of it has ever reported (``unheard-clusters``); else None."""
        if not self._unheard_checks or name in self._loop.capacity:
            return None
        return min((a.start for a in self._core.on_cluster.get(name, {}).values()), default=None)

    def _unheard_overdue(self, now: float) -> list[str]:
        """The healthy clusters never heard from whose work has waited the interval."""
        out = []
        for name, c in self._core.clusters.items():
            since = self._unheard_since(name)
            if since is None or name in self._loop.silent or not c.healthy:
                continue
            if now - since >= self._silent_after():
                out.append(name)
        return out

    def _all_down(self, queue: str) -> str | None:
        """When every cluster ``queue`` may use is down, which and why; else None."""
        q = self._core.queues.get(queue)
        if q is None:
            return None
        sel = q.spec.clusters
        names = [
            n for n in (sel if sel is not None else self._core.clusters) if n in self._core.clusters
        ]
        if not names or any(self._core.clusters[n].healthy for n in names):
            return None
        now = workflow.now().timestamp()
        said = []
        for n in names:
            heard = self._loop.capacity.get(n, {}).get("heard_at")
            if n in self._loop.silent and heard is not None:
                said.append(f"{n} (its worker silent for {now - heard:.0f}s)")
            elif n in self._loop.silent:
                said.append(f"{n} (no worker of it has reported)")
            else:
                said.append(f"{n} (marked unhealthy)")
        return ", ".join(said)

    def _silent_after(self) -> float:
        return CLUSTER_SILENT_S if self._silent_s is None else self._silent_s

    def _silence_deadline(self) -> float | None:
        deadlines = [
            v["heard_at"] + self._silent_after()
            for n, v in self._loop.capacity.items()
            if v.get("heard_at") is not None and n not in self._loop.silent
        ]
        for n in self._core.clusters:
            since = self._unheard_since(n)
            if since is not None and n not in self._loop.silent:
                deadlines.append(since + self._silent_after())
        return min(deadlines, default=None)

    def _arm_timer(self, now: float) -> None:
        wake = self._core.next_wakeup()
        if self._silent_checks and (self._waits or self._loop.running_since):
            # Only while work waits or runs: an idle shard need not wake to notice.
            silence = self._silence_deadline()
            if silence is not None:
                wake = silence if wake is None else min(wake, silence)
        if self._loop.running_since:
            reap = min(self._loop.running_since.values()) + REAP_AFTER_S
            wake = reap if wake is None else min(wake, reap)
        if self._safety:
            safety = self._last_sync_at + self._safety_interval()
            wake = safety if wake is None else min(wake, safety)
        if wake is None:
            return
        if self._timer_at is not None and self._timer_at <= wake:
            return
        self._timer_at = wake
        self._spawn(self._timer(wake, max(wake - now, 0.001)))

    async def _timer(self, at: float, delay: float) -> None:
        seen = self._seen_sync
        await workflow.sleep(delay)
        if self._serial:
            self._history_moved_on(seen)
            self._inbox.append(lambda: self._timer_fired(at))
            return
        self._timer_fired(at)

    def _timer_fired(self, at: float) -> None:
        if self._timer_at == at:
            self._timer_at = None
        self._changed = True
        if self._safety and self._now >= self._last_sync_at + self._safety_interval():
            # See SAFETY_SYNC_BUSY_S: every channel, as a fresh run looks.
            self._nudged.add(DONE_CHANNEL)
            self._more.add("*")
            self._stats["safety_syncs"] += 1

    def _safety_interval(self) -> float:
        busy = self._waits or self._loop.running_since
        return SAFETY_SYNC_BUSY_S if busy else SAFETY_SYNC_IDLE_S

    # --- continue-as-new ----------------------------------------------------------

    def _should_continue_as_new(self) -> bool:
        info = workflow.info()
        limit = min(self._max_history, MAX_HISTORY)
        return info.is_continue_as_new_suggested() or info.get_current_history_length() > limit

    async def _drain_and_continue_as_new(self, inp: SchedulerInput) -> None:
        if (self._out_admit or self._out_reject) and workflow.patched("deliver-before-continue"):
            # Deliver what is decided first: carried, undelivered admissions (up to
            # MAX_UNDELIVERED, ~150 bytes each) could add ~600 KB to the payload;
            # delivered, the carried state is the core's window. By regular activities:
            # local ones would chain in one workflow task for as long as the delivery
            # takes (over 5 s was seen), holding back queries and signals.
            while self._out_admit or self._out_reject:
                self._launch_dispatches(local_ok=False)
                await workflow.wait_condition(lambda: self._inflight < MAX_DISPATCH_INFLIGHT)
        # Outstanding dispatches must land (or they would be redone with stale ids), and
        # update/signal handlers must not be cut off mid-way.
        await workflow.wait_condition(
            lambda: self._inflight == 0 and workflow.all_handlers_finished()
        )
        self._continue(inp)

    def _continue(self, inp: SchedulerInput) -> None:
        """Continue as new, carrying the state (see ``carried_state``)."""
        self._loop.nudged = sorted(self._nudged)
        self._loop.more = sorted(self._more)
        workflow.continue_as_new(
            SchedulerInput(
                tenant=inp.tenant,
                fleet=self._fleet,
                carried=self.carried_state(),
                max_history=self._max_history,
                # The next run takes this worker's setting, if it has one (an input is
                # not part of what a replay checks; the next run decides with it).
                cluster_silent_s=(
                    HEALTH.cluster_silent_s
                    if HEALTH.cluster_silent_s is not None
                    else self._silent_s
                ),
            )
        )

    def carried_state(self) -> dict[str, Any]:
        """What continue-as-new carries: core snapshot, loop state, undispatched decisions."""
        return {
            "snapshot": self._core.to_snapshot(),
            "loop": {
                "seq": self._loop.seq,
                "sync_no": 0,
                "more": sorted(self._more),
                "nudged": sorted(self._nudged),
                "running_since": dict(self._loop.running_since),
                "forget": list(self._loop.forget),
                "workflow_ids": dict(self._loop.workflow_ids),
                "capacity_seq": dict(self._loop.capacity_seq),
                "capacity": dict(self._loop.capacity),
                "capacity_from": dict(self._loop.capacity_from),
                "silent": list(self._loop.silent),
            },
            "admit": [_admit_dict(a) for a in self._out_admit],
            "reject": [_reject_dict(r) for r in self._out_reject],
        }

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        # The workflow event loop is deterministic; keep a reference so the task lives.
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _cluster_names(self) -> set[str]:
        return set(self._core.clusters)


# --- helpers -------------------------------------------------------------------------

_T = TypeVar("_T")
_RETRY = RetryPolicy(maximum_interval=timedelta(seconds=10))


async def _activity(
    name: str,
    arg: Any,
    result_type: type[_T],
    *,
    local: bool,
    timeout_s: float,
    heartbeat_s: float | None = None,
) -> _T:
    """Run activity ``name`` locally (in this workflow task) or as a regular activity
    (``heartbeat_s``: its heartbeat timeout; a regular activity's option only, which
    replay does not compare, so recorded histories replay as they were)."""
    timeout = timedelta(seconds=timeout_s)
    res: _T
    if local:
        res = await workflow.execute_local_activity(
            name, arg, result_type=result_type, start_to_close_timeout=timeout, retry_policy=_RETRY
        )
    else:
        res = await workflow.execute_activity(
            name,
            arg,
            result_type=result_type,
            start_to_close_timeout=timeout,
            heartbeat_timeout=timedelta(seconds=heartbeat_s) if heartbeat_s else None,
            retry_policy=_RETRY,
        )
    return res


def _apply(fn: Any) -> Any:
    """Run a core config change; its ValueError fails the update, not the workflow task."""
    try:
        return fn()
    except (ValueError, KeyError, TypeError) as err:
        raise ApplicationError(str(err), type="ValueError", non_retryable=True) from err


def _split_by(d: Any) -> tuple[Any, Any]:
    """An update's argument without its ``by`` (who made the change, from where)."""
    if isinstance(d, dict) and "by" in d:
        rest = dict(d)
        return rest, rest.pop("by")
    return d, None


def _change(old: Any, new: Any) -> str:
    return "create" if old is None else "delete" if new is None else "update"


def _parse_queue(spec: Any) -> QueueSpec:
    if not isinstance(spec, dict):
        raise ValueError(f"queue: {spec!r} is not a mapping")
    if not isinstance(spec.get("name"), str) or not spec["name"]:
        raise ValueError(f"name: {spec.get('name')!r} is not a queue name")
    try:
        q = QueueSpec.from_dict(spec)
    except (KeyError, TypeError) as err:
        raise ValueError(f"queue {spec.get('name')!r}: {err}") from err
    check_limits(q)
    return q


def _parse_cluster(spec: Any) -> ClusterSpec:
    """A cluster in ``ClusterSpec.to_dict()`` notation (the CLI checks the fleet file's
    notation before it sends one); errors name the field and value."""
    if not isinstance(spec, dict):
        raise ValueError(f"cluster: {spec!r} is not a mapping")
    name = spec.get("name")
    if not isinstance(name, str) or not name:
        raise ValueError(f"name: {name!r} is not a cluster name")
    try:
        c = ClusterSpec.from_dict(spec)
    except (KeyError, TypeError, ValueError, AttributeError) as err:
        raise ValueError(f"cluster {name!r}: {err!r}") from err
    for i, g in enumerate(c.node_groups):
        if g.count < 0:
            raise ValueError(f"node_groups[{i}].count: {g.count} must be >= 0")
    return c


def _parse_environment(spec: Any) -> EnvironmentSpec:
    if not isinstance(spec, dict):
        raise ValueError(f"environment: {spec!r} is not a mapping")
    return environment_from_dict(spec)


def _parse_org(org: Any) -> OrgLimits:
    if not isinstance(org, dict):
        raise ValueError(f"org: {org!r} is not a mapping")
    try:
        limits = OrgLimits.from_dict(org)
    except (KeyError, TypeError) as err:
        raise ValueError(f"org.submit_rate: {org.get('submit_rate')!r} ({err})") from err
    for f in ("max_concurrent_runs", "max_concurrent_actions", "max_actions_per_run"):
        v = getattr(limits, f)
        if v is not None:
            check_count(v, f)
    return limits


def _admit_dict(a: AdmitItem) -> dict[str, Any]:
    ad = a.admission
    return {
        "workflow_id": a.workflow_id,
        "action_id": ad.action_id,
        "cluster": ad.cluster,
        "node_hints": list(ad.node_hints),
        "decided_at": ad.decided_at,
        "reasons": list(ad.reasons),
        "ready_timeout": ad.ready_timeout,
    }


def _admit_item(d: dict[str, Any]) -> AdmitItem:
    return AdmitItem(
        d["workflow_id"],
        Admission(
            d["action_id"],
            d["cluster"],
            d["node_hints"],
            d["decided_at"],
            d["reasons"],
            d.get("ready_timeout"),
        ),
    )


def _reject_dict(r: RejectItem) -> dict[str, Any]:
    rj = r.rejection
    return {
        "workflow_id": r.workflow_id,
        "action_id": rj.action_id,
        "reason": rj.reason,
        "message": rj.message,
        "decided_at": rj.decided_at,
    }


def _reject_item(d: dict[str, Any]) -> RejectItem:
    return RejectItem(
        d["workflow_id"], Rejection(d["action_id"], d["reason"], d["message"], d["decided_at"])
    )
