"""OpenTelemetry metrics and traces: every reason is a counter, every wait a histogram.

The scheduler's decisions are recorded as reasons on the actions; this module turns them
into metrics per queue and per cluster, so "why isn't my run moving?" and "which team is
starving?" are answered by the same state machine that schedules the work. The README's
table (section Observability) lists every metric with its unit and labels.

Where each comes from, and why it is never counted twice:

* per action (admissions, the wait histogram, reasons, rejections): the action workflow,
  at the moment it hears its admission or its rejection, only when that workflow task is
  not a replay (``workflow.unsafe.is_replaying``, the same rule Temporal's own
  ``workflow.metric_meter()`` follows). A worker restart or a cache eviction replays the
  history without counting again; an action is admitted or rejected once.
* per queue and cluster (waiting by reason, running, in flight against each quota,
  depth, blocked heads and gangs, free and unknown capacity, unknown-capacity
  admissions): the control-plane worker polls each shard scheduler's ``queues`` and
  ``fleet`` queries (``poll_schedulers``), so a gauge can never disagree with the pass
  that decides, and the deterministic scheduler workflow emits nothing itself.
* per pod event (``headway.action.events``, ``headway.action.event.latency``,
  ``headway.action.retries``): the cluster worker's ``run_action`` activity.

Exports: a Prometheus scrape endpoint (``setup(metrics_port=...)``, env
``HEADWAY_METRICS_PORT``; ``headway worker ... --metrics-port``), and/or
``HEADWAY_OTEL_EXPORTER=console`` (stderr) or ``otlp`` (the ``otlp`` extra:
``pip install 'headway[otlp]'``); tests pass their own in-memory readers.

Traces come from Temporal's OpenTelemetry interceptor: each action's submit, workflow,
activities and signals form one trace.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import sys
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from opentelemetry import trace
from opentelemetry.metrics import CallbackOptions, Meter, Observation
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import (
    ConsoleMetricExporter,
    MetricReader,
    PeriodicExportingMetricReader,
)
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter

__all__ = [
    "METRICS_INTERVAL_ENV",
    "METRICS_PORT_ENV",
    "Telemetry",
    "fleet_gauges",
    "flush",
    "get",
    "interceptors",
    "metrics_interval",
    "poll_schedulers",
    "setup",
    "tracer",
]

log = logging.getLogger(__name__)

#: The Prometheus scrape port of a worker (``--metrics-port``); unset: no endpoint.
METRICS_PORT_ENV = "HEADWAY_METRICS_PORT"
#: Seconds between two polls of the schedulers' queries for the queue and cluster gauges.
METRICS_INTERVAL_ENV = "HEADWAY_METRICS_INTERVAL_S"
DEFAULT_METRICS_INTERVAL_S = 10.0
#: One warning per cluster per this many seconds about admissions to unknown capacity.
UNKNOWN_WARN_EVERY_S = 3600.0

#: Waits run from milliseconds (room free) to days (a backfill queue): seconds.
WAIT_BUCKETS = (0.1, 0.5, 1, 2, 5, 10, 30, 60, 120, 300, 600, 1800, 3600, 7200, 21600, 86400)
#: Start-estimate errors: 10 minutes (600 s) is a boundary, a figure of the ETA bench.
ETA_BUCKETS = (1, 5, 15, 30, 60, 120, 300, 600, 1200, 1800, 3600, 7200, 14400, 43200, 86400)
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)

#: Queue usage keys (the scheduler's ``queues`` query) -> (resource label, scale to the
#: exported unit: CPU in cores, memory and storage in bytes, GPUs in devices).
_RESOURCES = {
    "cpu_m": ("cpu", 0.001),
    "memory": ("memory", 1.0),
    "ephemeral_storage": ("ephemeral_storage", 1.0),
    "gpu": ("gpu", 1.0),
}

_lock = threading.Lock()
_current: Telemetry | None = None


class Telemetry:
    """Headway's instruments on one meter provider (a process has one, see ``setup``)."""

    def __init__(self, provider: MeterProvider, tracer_provider: TracerProvider | None) -> None:
        self.provider = provider
        self.tracer_provider = tracer_provider
        #: ``http://HOST:PORT/metrics`` when this process serves a scrape endpoint.
        self.metrics_address: str | None = None
        self._server: Any = None
        m = provider.get_meter("headway")
        self._create_decision_instruments(m)
        self._create_attempt_instruments(m)
        self._stats: dict[str, dict[str, dict[str, Any]]] = {}
        self._fleet: dict[str, dict[str, Any]] = {}
        self._blocked_since: dict[tuple[str, str, str], float] = {}
        # Unknown-capacity admissions per (tenant, cluster): the scheduler's count, and
        # what this process has seen of it across scheduler restarts (a count that went
        # down started again from 0).
        self._unknown_seen: dict[tuple[str, str], int] = {}
        self._unknown_total: dict[tuple[str, str], int] = {}
        self._unknown_warned: dict[tuple[str, str], float] = {}
        self._register_queue_gauges(m)
        self._register_cluster_gauges(m)

    def _create_decision_instruments(self, m: Meter) -> None:
        """Counted by the action workflow as it hears its admission or rejection, and
        by the control plane as a forecast start comes true."""
        self.admissions = m.create_counter(
            "headway.admissions", unit="{action}", description="Actions admitted"
        )
        self.wait = m.create_histogram(
            "headway.admission.wait",
            unit="s",
            description="Submission to admission, by the first reason the action waited for",
            explicit_bucket_boundaries_advisory=WAIT_BUCKETS,
        )
        self.reasons = m.create_counter(
            "headway.reasons",
            unit="{action}",
            description="Distinct reasons admitted actions were held back for (once each)",
        )
        self.rejections = m.create_counter(
            "headway.rejections", unit="{action}", description="Actions rejected, by reason"
        )
        self.eta_error = m.create_histogram(
            "headway.start_estimate.error",
            unit="s",
            description="How far an action's forecast start (made when the control plane"
            " first saw it waiting) was from its actual start",
            explicit_bucket_boundaries_advisory=ETA_BUCKETS,
        )

    def _create_attempt_instruments(self, m: Meter) -> None:
        """Counted per attempt: pod events and retries by the cluster worker, hand-backs,
        ready timeouts and requeues."""
        self.events = m.create_counter(
            "headway.action.events", unit="{event}", description="Informer events per kind"
        )
        self.event_latency = m.create_histogram(
            "headway.action.event.latency",
            unit="s",
            description="Informer observation to the action workflow being told",
            explicit_bucket_boundaries_advisory=LATENCY_BUCKETS,
        )
        self.retries = m.create_counter(
            "headway.action.retries",
            unit="{attempt}",
            description="run_action attempts after the first (a worker lost mid-action)",
        )
        self.handbacks = m.create_counter(
            "headway.action.handbacks",
            unit="{dispatch}",
            description="Admissions a cluster worker handed back instead of creating pods"
            " (the pods no longer fit its live view), by kind: CapacityChanged (requeued)"
            " or Unschedulable (larger than every declared node shape)",
        )
        self.ready_timeouts = m.create_counter(
            "headway.action.ready_timeouts",
            unit="{attempt}",
            description="Attempts whose pods were not all running within the queue's"
            " ready_timeout after dispatch (deleted, NotReady)",
        )
        self.requeues = m.create_counter(
            "headway.action.requeues",
            unit="{attempt}",
            description="Attempts retried by the queue's retry policy, by failure class"
            " (oom, lost, failed, not_ready; a hand-back is counted in handbacks)",
        )

    def _register_queue_gauges(self, m: Meter) -> None:
        """The per-queue gauges, read from the last poll of the schedulers' queries."""
        m.create_observable_gauge("headway.queue.waiting", [self._observe_waiting], unit="{action}")
        m.create_observable_gauge("headway.queue.running", [self._observe_running], unit="{action}")
        m.create_observable_gauge(
            "headway.queue.in_flight",
            [self._observe_in_flight],
            description="Resources the queue's running actions hold (cpu cores, bytes, GPUs)",
        )
        m.create_observable_gauge(
            "headway.queue.quota",
            [self._observe_quota],
            description="The queue's max_resources, per resource set (cpu cores, bytes, GPUs)",
        )
        m.create_observable_gauge(
            "headway.queue.depth.used",
            [self._observe_depth_used],
            unit="{action}",
            description="Waiting plus running actions in the scheduler's window",
        )
        m.create_observable_gauge(
            "headway.queue.depth.limit",
            [self._observe_depth_limit],
            unit="{action}",
            description="The queue's depth, when set",
        )
        m.create_observable_gauge(
            "headway.queue.blocked_head_seconds", [self._observe_blocked], unit="s"
        )
        m.create_observable_gauge(
            "headway.queue.blocked_gang",
            [self._observe_blocked_gang],
            unit="{pod}",
            description="Pods of a gang blocking the head of its queue (absent: none)",
        )

    def _register_cluster_gauges(self, m: Meter) -> None:
        """The per-cluster gauges and the unknown-capacity admissions counter."""
        m.create_observable_gauge("headway.cluster.free", [self._observe_free])
        m.create_observable_gauge(
            "headway.cluster.unknown_capacity",
            [self._observe_unknown],
            description="1 while a cluster has reported no capacity (unknown means open)",
        )
        m.create_observable_counter(
            "headway.cluster.unknown_capacity.admissions",
            [self._observe_unknown_admissions],
            unit="{action}",
            description="Actions admitted to a cluster whose capacity was unknown",
        )

    # --- recording ---------------------------------------------------------------------

    def record_admission(
        self,
        tenant: str,
        queue: str,
        cluster: str,
        wait_s: float | None,
        reasons: Sequence[str],
    ) -> None:
        """One admitted action: counted, its wait observed, each distinct reason once."""
        attrs = {"tenant": tenant, "queue": queue, "cluster": cluster}
        self.admissions.add(1, attrs)
        if wait_s is not None:
            self.wait.record(
                max(0.0, wait_s), {**attrs, "reason": reasons[0] if reasons else "None"}
            )
        for r in dict.fromkeys(reasons):
            self.reasons.add(1, {**attrs, "reason": r})

    def record_rejection(self, tenant: str, queue: str, reason: str) -> None:
        self.rejections.add(1, {"tenant": tenant, "queue": queue, "reason": reason})

    def record_event(self, cluster: str, kind: str, observed_at: float | None = None) -> None:
        self.events.add(1, {"cluster": cluster, "kind": kind})
        if observed_at:
            self.event_latency.record(
                max(0.0, time.time() - observed_at), {"cluster": cluster, "kind": kind}
            )

    def record_start_estimate(self, tenant: str, queue: str, error_s: float) -> None:
        """An action started ``error_s`` after (negative: before) its forecast start."""
        self.eta_error.record(abs(error_s), {"tenant": tenant, "queue": queue})

    def record_retry(self, cluster: str) -> None:
        self.retries.add(1, {"cluster": cluster})

    def record_handback(self, cluster: str, kind: str) -> None:
        """A cluster worker handed an admission back (``CapacityChanged`` or
        ``Unschedulable``) instead of creating its pods."""
        self.handbacks.add(1, {"cluster": cluster, "kind": kind})

    def record_requeue(self, tenant: str, queue: str, cls: str) -> None:
        """An attempt ended in a failure class its queue retries: the next is requeued."""
        self.requeues.add(1, {"tenant": tenant, "queue": queue, "class": cls})

    def record_ready_timeout(self, tenant: str, queue: str, cluster: str) -> None:
        """An attempt's pods were not all running within its queue's ready timeout."""
        self.ready_timeouts.add(1, {"tenant": tenant, "queue": queue, "cluster": cluster})

    def update_queue_stats(
        self, tenant: str, stats: Mapping[str, Mapping[str, Any]], now: float | None = None
    ) -> None:
        """Take the scheduler's ``queue_stats`` (the ``queues`` query) for the gauges."""
        now = time.time() if now is None else now
        self._stats[tenant] = {k: dict(v) for k, v in stats.items()}
        live = set()
        for q, st in stats.items():
            head = st.get("blocked_head")
            if head:
                key = (tenant, q, str(head))
                live.add(key)
                self._blocked_since.setdefault(key, now)
        for key in [k for k in self._blocked_since if k[0] == tenant and k not in live]:
            del self._blocked_since[key]

    def update_fleet(self, tenant: str, fleet: Mapping[str, Any]) -> None:
        """Take the scheduler's ``fleet`` query: per cluster, free capacity or unknown,
        and how many actions it admitted to a cluster of unknown capacity."""
        self._fleet[tenant] = dict(fleet)
        now = time.monotonic()
        for cluster, info in fleet.items():
            count = int(info.get("unknown_admissions", 0)) if isinstance(info, Mapping) else 0
            key = (tenant, cluster)
            seen = self._unknown_seen.get(key, 0)
            new = count - seen if count >= seen else count  # the scheduler started afresh
            self._unknown_seen[key] = count
            if new <= 0:
                continue
            self._unknown_total[key] = self._unknown_total.get(key, 0) + new
            last = self._unknown_warned.get(key)
            if last is None or now - last >= UNKNOWN_WARN_EVERY_S:
                self._unknown_warned[key] = now
                # Nobody can see a cluster's real room when it reports none: the work
                # went there on trust ("unknown means open"). Once an hour per cluster.
                log.warning(
                    "tenant %s: %d action(s) admitted to cluster %s with unknown capacity"
                    " (it reported no nodes; %d so far): check its cluster worker",
                    tenant,
                    new,
                    cluster,
                    self._unknown_total[key],
                )

    # --- observation -------------------------------------------------------------------

    def _queues(self) -> Iterable[tuple[str, str, dict[str, Any]]]:
        for tenant, qs in self._stats.items():
            for q, st in qs.items():
                yield tenant, q, st

    def _observe_waiting(self, _: CallbackOptions) -> Iterable[Observation]:
        for tenant, q, st in self._queues():
            by = st.get("waiting_by_reason") or {}
            for reason, n in by.items():
                yield Observation(n, {"tenant": tenant, "queue": q, "reason": reason})
            rest = int(st.get("waiting", 0)) - sum(by.values())
            if rest > 0 or not by:
                yield Observation(max(rest, 0), {"tenant": tenant, "queue": q, "reason": "None"})

    def _observe_running(self, _: CallbackOptions) -> Iterable[Observation]:
        for tenant, q, st in self._queues():
            yield Observation(int(st.get("running", 0)), {"tenant": tenant, "queue": q})

    def _observe_in_flight(self, _: CallbackOptions) -> Iterable[Observation]:
        for tenant, q, st in self._queues():
            usage = st.get("usage") or {}
            for key, (res, scale) in _RESOURCES.items():
                yield Observation(
                    usage.get(key, 0) * scale, {"tenant": tenant, "queue": q, "resource": res}
                )

    def _observe_quota(self, _: CallbackOptions) -> Iterable[Observation]:
        from headway.scheduler.model import QueueSpec

        for tenant, q, st in self._queues():
            try:
                quota = QueueSpec.from_dict(st["spec"]).max_resources
            except (KeyError, TypeError, ValueError):  # a spec this version cannot read
                continue
            if quota is None:
                continue
            for res, value, scale in (
                ("cpu", quota.cpu, 0.001),
                ("memory", quota.memory, 1.0),
                ("ephemeral_storage", quota.eph, 1.0),
                ("gpu", quota.gpu, 1.0),
            ):
                if value is not None:
                    yield Observation(
                        value * scale, {"tenant": tenant, "queue": q, "resource": res}
                    )

    def _observe_depth_used(self, _: CallbackOptions) -> Iterable[Observation]:
        for tenant, q, st in self._queues():
            used = int(st.get("waiting", 0)) + int(st.get("running", 0))
            yield Observation(used, {"tenant": tenant, "queue": q})

    def _observe_depth_limit(self, _: CallbackOptions) -> Iterable[Observation]:
        for tenant, q, st in self._queues():
            depth = (st.get("spec") or {}).get("depth")
            if depth is not None:
                yield Observation(int(depth), {"tenant": tenant, "queue": q})

    def _observe_blocked(self, _: CallbackOptions) -> Iterable[Observation]:
        now = time.time()
        for (tenant, q, head), since in self._blocked_since.items():
            yield Observation(now - since, {"tenant": tenant, "queue": q, "head": head})

    def _observe_blocked_gang(self, _: CallbackOptions) -> Iterable[Observation]:
        for tenant, q, st in self._queues():
            head, pods = st.get("blocked_head"), int(st.get("blocked_head_pods") or 0)
            if head and pods > 1:
                yield Observation(pods, {"tenant": tenant, "queue": q, "head": str(head)})

    def _observe_free(self, _: CallbackOptions) -> Iterable[Observation]:
        for tenant, fleet in self._fleet.items():
            for cluster, info in fleet.items():
                free = info.get("free") if isinstance(info, Mapping) else None
                if not isinstance(free, Mapping):
                    continue
                for res, n in free.items():
                    yield Observation(n, {"tenant": tenant, "cluster": cluster, "resource": res})

    def _observe_unknown(self, _: CallbackOptions) -> Iterable[Observation]:
        for tenant, fleet in self._fleet.items():
            for cluster, info in fleet.items():
                known = info.get("known", True) if isinstance(info, Mapping) else True
                yield Observation(0 if known else 1, {"tenant": tenant, "cluster": cluster})

    def _observe_unknown_admissions(self, _: CallbackOptions) -> Iterable[Observation]:
        for (tenant, cluster), n in self._unknown_total.items():
            yield Observation(n, {"tenant": tenant, "cluster": cluster})

    def shutdown(self) -> None:
        """Stop the scrape endpoint, if any (tests set up more than once per process)."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None


def metrics_interval() -> float:
    """``$HEADWAY_METRICS_INTERVAL_S`` (default 10): seconds between scheduler polls."""
    raw = os.environ.get(METRICS_INTERVAL_ENV)
    if raw is None or raw == "":
        return DEFAULT_METRICS_INTERVAL_S
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not value > 0:
        raise ValueError(f"{METRICS_INTERVAL_ENV}: {raw!r} is not a positive number of seconds")
    return value


async def poll_schedulers(
    client: Any,
    *,
    tenants: Sequence[str] = (),
    interval_s: float = DEFAULT_METRICS_INTERVAL_S,
    stop: asyncio.Event | None = None,
    tell_reasons: bool = True,
) -> None:
    """Feed the queue and cluster gauges from each shard scheduler's queries, and (with
    ``tell_reasons``) tell waiting actions their current reason (``WaitingReasons``).

    The gauges read the scheduler's own state (its ``queues`` and ``fleet`` queries), so
    a dashboard can never disagree with the pass that decides. ``tenants`` empty: every
    running scheduler workflow, found through visibility.
    """
    from headway import protocol
    from headway.workflows import client as hw

    stop = stop or asyncio.Event()
    prefix = protocol.scheduler_workflow_id("")
    tell = WaitingReasons() if tell_reasons else None
    estimates = StartEstimates()
    while not stop.is_set():
        names = list(tenants)
        if not names:
            try:
                async for wf in client.list_workflows(
                    "WorkflowType = 'SchedulerWorkflow' AND ExecutionStatus = 'Running'"
                ):
                    if wf.id.startswith(prefix):
                        names.append(wf.id[len(prefix) :])
            except Exception as exc:  # visibility can lag or be unavailable
                log.debug("listing schedulers failed: %s", exc)
        t = get()
        for tenant in names:
            try:
                t.update_queue_stats(tenant, await hw.get_queues(client, tenant))
                fleet = await hw.get_fleet(client, tenant)
                t.update_fleet(tenant, fleet_gauges(fleet))
                if tell is not None:
                    await tell.poll(client, tenant)
                await estimates.poll(client, tenant, t)
            except Exception as exc:  # a scheduler mid continue-as-new, or gone
                log.debug("polling scheduler %s failed: %s", tenant, exc)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), interval_s)


class WaitingReasons:
    """Tells each action that has waited a poll or more its scheduler's current reason
    (the action workflow's ``REASON_SIGNAL``), once per change, so the Web UI shows what
    blocks it within two poll intervals. An action admitted before the next poll is told
    nothing: most never wait that long, and they cost no signal.
    """

    #: At most this many signals per tenant per poll (the rest go at the next poll).
    MAX_PER_POLL = 500
    CONCURRENCY = 8

    def __init__(self) -> None:
        self._seen: dict[str, dict[str, tuple[str, list[str]]]] = {}
        self._told: dict[str, dict[str, tuple[str, list[str]]]] = {}

    async def poll(self, client: Any, tenant: str) -> int:
        """One poll of ``tenant``: returns how many actions were told."""
        from headway import protocol
        from headway.workflows import client as hw
        from headway.workflows.action import REASON_SIGNAL, WaitingReason

        now = await hw.get_waiting_reasons(client, tenant)
        seen, told = self._seen.get(tenant, {}), self._told.setdefault(tenant, {})
        self._seen[tenant] = now
        for gone in [a for a in told if a not in now]:
            del told[gone]
        due = [a for a, note in now.items() if a in seen and told.get(a) != note]
        due = due[: self.MAX_PER_POLL]
        sem = asyncio.Semaphore(self.CONCURRENCY)

        async def tell(action_id: str) -> None:
            reason, reasons = now[action_id]
            handle = client.get_workflow_handle(protocol.action_workflow_id(tenant, action_id))
            async with sem:
                try:
                    await handle.signal(REASON_SIGNAL, WaitingReason(reason, reasons))
                except Exception as exc:  # ended meanwhile; told again next poll if not
                    log.debug("telling %s its reason failed: %s", action_id, exc)
                    return
            told[action_id] = (reason, reasons)

        await asyncio.gather(*(tell(a) for a in due))
        return len(due)


class StartEstimates:
    """Scores start estimates: each waiting action's start, as forecast when the control
    plane first sees it (``headway.scheduler.insight.forecast``, the core run forward on
    a copy of the scheduler's snapshot), against the start the scheduler then gave it
    (``headway.start_estimate.error``). An action seen waiting is scored once it has
    started: from the scheduler's snapshot while it runs, or, when it started and ended
    between two polls, from its workflow's admission time (``MAX_LOOKUPS`` per poll).
    """

    #: No snapshot nor forecast over more waiting actions than this per tenant and poll
    #: (its CPU is the control plane worker's): nothing is scored while it is deeper.
    MAX_WAITING = 2000

    #: Errors kept per queue for its scores (the most recent).
    KEEP = 200

    #: Ended actions whose start is asked of their workflow per tenant and poll (a
    #: query each); more than that ended in one poll go unscored.
    MAX_LOOKUPS = 50

    def __init__(self) -> None:
        self._predicted: dict[str, dict[str, tuple[str, float]]] = {}
        # Per tenant and queue: the latest errors, actual start - forecast start (s).
        self._errors: dict[str, dict[str, list[float]]] = {}

    def scores(self, tenant: str) -> dict[str, dict[str, Any]]:
        """Per queue: how many were scored (of the latest ``KEEP``), the median absolute
        error, the share within 10 minutes, and ``p90_margin_s``: how much later than
        its forecast an action started, at the 90th percentile (the p90 start is the
        forecast plus it)."""
        out: dict[str, dict[str, Any]] = {}
        for queue, errs in self._errors.get(tenant, {}).items():
            late = sorted(errs)
            out[queue] = {
                "scored": len(errs),
                "median_abs_error_s": round(_median([abs(e) for e in errs]), 1),
                "within_10min": round(sum(abs(e) <= 600 for e in errs) / len(errs), 3),
                "p90_margin_s": round(max(0.0, late[int(0.9 * (len(late) - 1))]), 1),
            }
        return out

    def _score(self, tenant: str, queue: str, error_s: float) -> None:
        errs = self._errors.setdefault(tenant, {}).setdefault(queue, [])
        errs.append(error_s)
        del errs[: -self.KEEP]

    async def poll(self, client: Any, tenant: str, t: Telemetry) -> None:
        from headway.scheduler import Scheduler
        from headway.scheduler.insight import forecast
        from headway.workflows import client as hw

        predicted = self._predicted.setdefault(tenant, {})
        waiting = sum(int(st.get("waiting", 0)) for st in t._stats.get(tenant, {}).values())
        if not waiting and not predicted:
            return  # nothing to forecast nor to score: no snapshot asked for
        if waiting > self.MAX_WAITING:
            # A backlog this deep: its snapshot is large and its forecast costly; what
            # was predicted goes unscored rather than hold the poll up.
            predicted.clear()
            return
        data = await hw.get_snapshot(client, tenant)
        sched, now = Scheduler.from_snapshot(data["snapshot"]), float(data["now"])
        scored, lookups = False, self.MAX_LOOKUPS
        for action_id, (queue, start) in list(predicted.items()):
            a = sched.actions.get(action_id)
            if a is not None and a.state == "waiting":
                continue
            del predicted[action_id]
            began: float | None = None
            if a is not None and a.state == "running":
                began = a.start
            elif a is None and lookups > 0:
                lookups -= 1  # ended since the last poll (or never admitted)
                began = await _admitted_at(client, tenant, action_id)
            if began is not None:
                t.record_start_estimate(tenant, queue, began - start)
                self._score(tenant, queue, began - start)
                scored = True
        if scored:
            # The scores go to the tenant's scheduler, which shows them (``get queue``,
            # the p90 of ``describe action`` and the SDK's ``eta``).
            await hw.tell_start_estimates(client, tenant, self.scores(tenant))
        new = [a for q in sched.queues.values() for a in q.waiting if a.id not in predicted]
        if not new:
            return
        starts = forecast(sched, now).starts
        for a in new:
            at = starts.get(a.id)
            if at is not None:
                predicted[a.id] = (a.queue, at)


async def _admitted_at(client: Any, tenant: str, attempt: str) -> float | None:
    """When the action of ``attempt`` (an id or ``ID~N``) was last admitted, from its
    workflow; None when it never was (rejected, cancelled waiting) or cannot be asked."""
    from headway.scheduler.retry import ATTEMPT_SEP
    from headway.workflows import client as hw

    try:
        status = await hw.action_state(client, tenant, attempt.split(ATTEMPT_SEP, 1)[0])
    except Exception as exc:  # gone past retention, or its worker busy: unscored
        log.debug("reading %s's admission failed: %s", attempt, exc)
        return None
    return status.admitted_at


def _median(xs: Sequence[float]) -> float:
    ordered = sorted(xs)
    n = len(ordered)
    return (ordered[n // 2] + ordered[(n - 1) // 2]) / 2 if n else 0.0


def fleet_gauges(fleet: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """The scheduler's ``fleet`` query reshaped for ``update_fleet``: every cluster of the
    fleet. Known or not as the scheduler sees it: its last report, else its fleet entry
    (a cluster that does not report capacity is unknown until it does)."""
    out: dict[str, dict[str, Any]] = {}
    capacity = fleet.get("capacity") or {}
    declared = {
        str(c.get("name")): bool(c.get("reports_capacity", True))
        for c in fleet.get("fleet") or ()
        if isinstance(c, Mapping)
    }
    unknown_admissions = fleet.get("unknown_capacity_admissions") or {}
    names = set(fleet.get("clusters") or ()) | set(capacity) | set(unknown_admissions)
    for name in sorted(names):
        cap = capacity.get(name)
        known = bool(cap.get("known", True)) if cap is not None else declared.get(name, True)
        out[name] = {
            "known": known,
            # CPU in cores, as in the queue gauges.
            "free": {"gpu": cap.get("free_gpu", 0), "cpu": cap.get("free_cpu_m", 0) / 1000}
            if known and cap is not None
            else None,
            "unknown_admissions": int(unknown_admissions.get(name, 0)),
        }
    return out


def _prometheus_reader(port: int, host: str) -> tuple[MetricReader, Any, str]:
    """A Prometheus reader on a registry of its own, served on ``host:port``."""
    from opentelemetry.exporter.prometheus import PrometheusMetricReader
    from prometheus_client import CollectorRegistry, start_http_server

    registry = CollectorRegistry(auto_describe=True)
    reader = PrometheusMetricReader(registry=registry)
    try:
        server, _thread = start_http_server(port, addr=host, registry=registry)
    except OSError as exc:
        raise ValueError(
            f"--metrics-port: cannot serve metrics on {host}:{port} ({exc.strerror or exc})"
        ) from exc
    shown = "localhost" if host in ("0.0.0.0", "::", "") else host
    return reader, server, f"http://{shown}:{server.server_port}/metrics"


def setup(
    service: str,
    *,
    readers: Sequence[MetricReader] = (),
    span_processors: Sequence[SpanProcessor] = (),
    exporter: str | None = None,
    metrics_port: int | None = None,
    metrics_host: str = "0.0.0.0",
) -> Telemetry:
    """Install Headway's meter and tracer providers for this process (idempotent per call).

    Args:
        service: ``service.name`` of the resource (``headway-control-plane``, ...).
        readers: extra metric readers (tests pass an ``InMemoryMetricReader``).
        span_processors: extra span processors.
        exporter: ``console``, ``otlp`` or ``none``; default ``$HEADWAY_OTEL_EXPORTER``.
        metrics_port: serve a Prometheus scrape endpoint (``/metrics``) on this port (0:
            any free one; the address is ``Telemetry.metrics_address``); None: none.
        metrics_host: the address the endpoint listens on.

    Raises:
        ValueError: a bad exporter, or a port that cannot be served (in use).
    """
    global _current
    exporter = (exporter or os.environ.get("HEADWAY_OTEL_EXPORTER") or "none").lower()
    if exporter not in ("none", "console", "otlp"):
        raise ValueError(f"HEADWAY_OTEL_EXPORTER: {exporter!r} is not one of none, console, otlp")
    resource = Resource.create({"service.name": service})
    all_readers = list(readers)
    processors = list(span_processors)
    if exporter == "console":
        all_readers.append(
            PeriodicExportingMetricReader(ConsoleMetricExporter(out=sys.stderr), 10_000)
        )
        processors.append(BatchSpanProcessor(ConsoleSpanExporter(out=sys.stderr)))
    elif exporter == "otlp":  # pragma: no cover - optional dependency
        try:
            from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import (  # type: ignore[import-not-found]
                OTLPMetricExporter,
            )
            from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (  # type: ignore[import-not-found]
                OTLPSpanExporter,
            )
        except ImportError as exc:
            raise ValueError(
                "HEADWAY_OTEL_EXPORTER: 'otlp' needs the otlp extra (pip install 'headway[otlp]')"
            ) from exc
        all_readers.append(PeriodicExportingMetricReader(OTLPMetricExporter()))
        processors.append(BatchSpanProcessor(OTLPSpanExporter()))
    with _lock:
        if _current is not None:
            _current.shutdown()  # its port is freed before a new one is bound
    server: Any = None
    address: str | None = None
    if metrics_port is not None:
        reader, server, address = _prometheus_reader(metrics_port, metrics_host)
        all_readers.append(reader)
    provider = MeterProvider(resource=resource, metric_readers=all_readers)
    tracer_provider = TracerProvider(resource=resource)
    for p in processors:
        tracer_provider.add_span_processor(p)
    with _lock:
        _current = Telemetry(provider, tracer_provider)
        _current._server, _current.metrics_address = server, address
    return _current


def get() -> Telemetry:
    """The process's telemetry. ``setup`` never called (the CLI, an SDK program): a tracer
    provider all the same, so the trace an action starts here carries a real context to
    the workers (a no-op tracer would start none), exported as $HEADWAY_OTEL_EXPORTER
    says; metrics go nowhere."""
    global _current
    with _lock:
        if _current is None:
            tracer_provider = TracerProvider(
                resource=Resource.create({"service.name": "headway-client"})
            )
            exporter = (os.environ.get("HEADWAY_OTEL_EXPORTER") or "none").lower()
            if exporter == "console":
                tracer_provider.add_span_processor(
                    BatchSpanProcessor(ConsoleSpanExporter(out=sys.stderr))
                )
            _current = Telemetry(MeterProvider(), tracer_provider)
        return _current


def flush(timeout_ms: int = 5000) -> None:
    """Export what is buffered now (a process leaving by ``os._exit`` runs no atexit)."""
    with _lock:
        t = _current
    if t is not None and t.tracer_provider is not None:
        t.tracer_provider.force_flush(timeout_ms)


def tracer() -> trace.Tracer:
    """Headway's tracer on the process's provider (for spans of its own: submit, pods)."""
    t = get()
    return (t.tracer_provider or trace.get_tracer_provider()).get_tracer("headway")


def interceptors() -> list[Any]:
    """Temporal client interceptors that trace workflows, activities and signals.

    Uses the tracer provider installed by ``setup`` (none: spans are dropped).
    """
    from temporalio.contrib.opentelemetry import TracingInterceptor

    return [TracingInterceptor(tracer())]
