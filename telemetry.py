"""OpenTelemetry metrics and traces: every reason is a counter, every wait a histogram.

The scheduler's decisions are recorded as reasons on the actions; this module turns them
into metrics per queue and per cluster, so "why isn't my run moving?" and "which team is
starving?" are answered by the same state machine that schedules the work:

* ``headway.admissions`` (counter; tenant, queue, cluster) and ``headway.admission.wait``
  (histogram, seconds; tenant, queue, cluster, reason: the first reason it waited for);
* ``headway.reasons`` (counter; tenant, queue, cluster, reason): each distinct reason an
  admitted action was held back for; ``headway.rejections`` (tenant, queue, reason);
* ``headway.queue.waiting`` (gauge; tenant, queue, reason), ``headway.queue.running``,
  ``headway.queue.blocked_head_seconds`` (gauge: how long a head, typically a gang, has
  been blocking its queue; the signal to move that queue to backfill);
* ``headway.cluster.free`` (gauge; tenant, cluster, resource) and
  ``headway.cluster.unknown_capacity`` (1 when a cluster reports no capacity);
* ``headway.action.events`` (counter; cluster, kind: Scheduled, Running, OOMKilled,
  Preempted, ...) and ``headway.action.event.latency`` (histogram, seconds from the
  informer seeing it to the action's workflow being told): preemption and OOM attribution.

Traces come from Temporal's OpenTelemetry interceptor: each action's submit, workflow,
activities and signals form one trace. Nothing is exported unless asked:
``HEADWAY_OTEL_EXPORTER=console`` prints to stderr; ``otlp`` uses the OTLP exporter if
``opentelemetry-exporter-otlp`` is installed; tests pass their own in-memory readers.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from opentelemetry import trace
from opentelemetry.metrics import CallbackOptions, Observation
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import (
    ConsoleMetricExporter,
    MetricReader,
    PeriodicExportingMetricReader,
)
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter

__all__ = ["Telemetry", "fleet_gauges", "get", "interceptors", "poll_schedulers", "setup"]

log = logging.getLogger(__name__)

_lock = threading.Lock()
_current: Telemetry | None = None


class Telemetry:
    """Headway's instruments on one meter provider (a process has one, see ``setup``)."""

    def __init__(self, provider: MeterProvider, tracer_provider: TracerProvider | None) -> None:
        self.provider = provider
        self.tracer_provider = tracer_provider
        m = provider.get_meter("headway")
        self.admissions = m.create_counter(
            "headway.admissions", unit="{action}", description="Actions admitted"
        )
        self.wait = m.create_histogram(
            "headway.admission.wait", unit="s", description="Enqueue to admission"
        )
        self.reasons = m.create_counter(
            "headway.reasons",
            unit="{action}",
            description="Distinct reasons admitted actions were held back for",
        )
        self.rejections = m.create_counter(
            "headway.rejections", unit="{action}", description="Actions rejected at submission"
        )
        self.events = m.create_counter(
            "headway.action.events", unit="{event}", description="Informer events per kind"
        )
        self.event_latency = m.create_histogram(
            "headway.action.event.latency",
            unit="s",
            description="Informer observation to the action workflow being told",
        )
        self._stats: dict[str, dict[str, dict[str, Any]]] = {}
        self._fleet: dict[str, dict[str, Any]] = {}
        self._blocked_since: dict[tuple[str, str, str], float] = {}
        m.create_observable_gauge("headway.queue.waiting", [self._observe_waiting], unit="{action}")
        m.create_observable_gauge("headway.queue.running", [self._observe_running], unit="{action}")
        m.create_observable_gauge(
            "headway.queue.blocked_head_seconds", [self._observe_blocked], unit="s"
        )
        m.create_observable_gauge("headway.cluster.free", [self._observe_free])
        m.create_observable_gauge(
            "headway.cluster.unknown_capacity", [self._observe_unknown], unit="1"
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
        attrs = {"tenant": tenant, "queue": queue, "cluster": cluster}
        self.admissions.add(1, attrs)
        if wait_s is not None:
            self.wait.record(
                max(0.0, wait_s), {**attrs, "reason": reasons[0] if reasons else "None"}
            )
        for r in reasons:
            self.reasons.add(1, {**attrs, "reason": r})

    def record_rejection(self, tenant: str, queue: str, reason: str) -> None:
        self.rejections.add(1, {"tenant": tenant, "queue": queue, "reason": reason})

    def record_event(self, cluster: str, kind: str, observed_at: float | None = None) -> None:
        self.events.add(1, {"cluster": cluster, "kind": kind})
        if observed_at:
            self.event_latency.record(
                max(0.0, time.time() - observed_at), {"cluster": cluster, "kind": kind}
            )

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
        """Take the scheduler's ``fleet`` query: per cluster, free capacity or unknown."""
        self._fleet[tenant] = dict(fleet)

    # --- observation -------------------------------------------------------------------

    def _observe_waiting(self, _: CallbackOptions) -> Iterable[Observation]:
        for tenant, qs in self._stats.items():
            for q, st in qs.items():
                by = st.get("waiting_by_reason") or {}
                for reason, n in by.items():
                    yield Observation(n, {"tenant": tenant, "queue": q, "reason": reason})
                rest = int(st.get("waiting", 0)) - sum(by.values())
                if rest > 0 or not by:
                    yield Observation(
                        max(rest, 0), {"tenant": tenant, "queue": q, "reason": "None"}
                    )

    def _observe_running(self, _: CallbackOptions) -> Iterable[Observation]:
        for tenant, qs in self._stats.items():
            for q, st in qs.items():
                yield Observation(int(st.get("running", 0)), {"tenant": tenant, "queue": q})

    def _observe_blocked(self, _: CallbackOptions) -> Iterable[Observation]:
        now = time.time()
        for (tenant, q, head), since in self._blocked_since.items():
            yield Observation(now - since, {"tenant": tenant, "queue": q, "head": head})

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


async def poll_schedulers(
    client: Any,
    *,
    tenants: Sequence[str] = (),
    interval_s: float = 10.0,
    stop: asyncio.Event | None = None,
) -> None:
    """Feed the queue and cluster gauges from each shard scheduler's queries.

    The gauges read the scheduler's own state (its ``queues`` and ``fleet`` queries), so
    a dashboard can never disagree with the pass that decides. ``tenants`` empty: every
    running scheduler workflow, found through visibility.
    """
    from headway import protocol
    from headway.workflows import client as hw

    stop = stop or asyncio.Event()
    prefix = protocol.scheduler_workflow_id("")
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
            except Exception as exc:  # a scheduler mid continue-as-new, or gone
                log.debug("polling scheduler %s failed: %s", tenant, exc)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), interval_s)


def fleet_gauges(fleet: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """The scheduler's ``fleet`` query reshaped for ``update_fleet``."""
    out: dict[str, dict[str, Any]] = {}
    for name, cap in (fleet.get("capacity") or {}).items():
        out[name] = {
            "known": bool(cap.get("known", True)),
            "free": {"gpu": cap.get("free_gpu", 0), "cpu_m": cap.get("free_cpu_m", 0)}
            if cap.get("known", True)
            else None,
        }
    return out


def setup(
    service: str,
    *,
    readers: Sequence[MetricReader] = (),
    span_processors: Sequence[SpanProcessor] = (),
    exporter: str | None = None,
) -> Telemetry:
    """Install Headway's meter and tracer providers for this process (idempotent per call).

    Args:
        service: ``service.name`` of the resource (``headway-control-plane``, ...).
        readers: extra metric readers (tests pass an ``InMemoryMetricReader``).
        span_processors: extra span processors.
        exporter: ``console``, ``otlp`` or ``none``; default ``$HEADWAY_OTEL_EXPORTER``.
    """
    global _current
    exporter = (exporter or os.environ.get("HEADWAY_OTEL_EXPORTER") or "none").lower()
    if exporter not in ("none", "console", "otlp"):
        raise ValueError(f"HEADWAY_OTEL_EXPORTER: {exporter!r} is not one of none, console, otlp")
    resource = Resource.create({"service.name": service})
    all_readers = list(readers)
    processors = list(span_processors)
    if exporter == "console":
        all_readers.append(PeriodicExportingMetricReader(ConsoleMetricExporter(), 10_000))
        processors.append(BatchSpanProcessor(ConsoleSpanExporter()))
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
                "HEADWAY_OTEL_EXPORTER: 'otlp' needs the opentelemetry-exporter-otlp package"
            ) from exc
        all_readers.append(PeriodicExportingMetricReader(OTLPMetricExporter()))
        processors.append(BatchSpanProcessor(OTLPSpanExporter()))
    provider = MeterProvider(resource=resource, metric_readers=all_readers)
    tracer_provider = TracerProvider(resource=resource)
    for p in processors:
        tracer_provider.add_span_processor(p)
    with _lock:
        _current = Telemetry(provider, tracer_provider)
    return _current


def get() -> Telemetry:
    """The process's telemetry; a no-export default if ``setup`` was never called."""
    global _current
    with _lock:
        if _current is None:
            _current = Telemetry(MeterProvider(), None)
        return _current


def interceptors() -> list[Any]:
    """Temporal client interceptors that trace workflows, activities and signals.

    Uses the tracer provider installed by ``setup`` (none: spans are dropped).
    """
    from temporalio.contrib.opentelemetry import TracingInterceptor

    t = get()
    tracer = (t.tracer_provider or trace.get_tracer_provider()).get_tracer("headway")
    return [TracingInterceptor(tracer)]
