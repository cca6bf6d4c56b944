"""The cluster worker: one per cluster, next to it, dialing out only.

It polls ``protocol.cluster_task_queue(cluster)`` for the cluster activities (outbound to
Temporal) and reaches the cluster through a :class:`ClusterBackend` (outbound to the kube
API, or nothing at all for the simulated backend). It never listens on a port, so the
control plane needs no route and no credentials into the cluster. Alongside the activities
it reports the cluster's capacity to every tenant's shard scheduler whenever it changes.

Each run of a worker is one *incarnation* (a fresh uuid4 and its start time): every
capacity report carries both, so the scheduler can tell a restarted worker's reports
(whose sequence starts at 1 again) from an old incarnation's late ones. The incarnation
is stamped on the pod log's lines too.

On start, and every ``gc_interval_s`` after, the worker deletes the Headway pods (found
by label) of actions that have ended: those whose action workflow is closed, or no
longer exists. Pods of running workflows are left alone, however old or finished: a
retried ``run_action`` adopts them and needs their state.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from headway.activities.backends.base import ClusterBackend
from headway.activities.backends.sim import SimBackend
from headway.activities.cluster import ClusterActivities
from headway.protocol import (
    CAPACITY_SIGNAL,
    DEFAULT_TENANT,
    CapacityReport,
    DispatchRequest,
    cluster_task_queue,
    report_for,
    scheduler_workflow_id,
)
from headway.scheduler.model import ClusterSpec, NodeGroup
from headway.scheduler.resources import Pod
from temporalio.client import Client, WorkflowExecutionStatus
from temporalio.exceptions import ApplicationError
from temporalio.service import RPCError, RPCStatusCode
from temporalio.worker import (
    ActivityInboundInterceptor,
    ExecuteActivityInput,
    Interceptor,
    PollerBehaviorAutoscaling,
    Worker,
)

__all__ = [
    "DEFAULT_SIM_CLUSTER",
    "TENANT_NOT_SERVED",
    "Incarnation",
    "TenantGuard",
    "capacity_loop",
    "collect_garbage",
    "gc_loop",
    "make_backend",
    "run_cluster_worker",
]

log = logging.getLogger(__name__)

_GI = 2**30
#: The simulated cluster used when the fleet file does not describe one: a few CPU nodes
#: and two 8-GPU nodes, enough for every demo scenario to show queueing.
DEFAULT_SIM_CLUSTER = ClusterSpec(
    "local",
    (
        NodeGroup("cpu", 4, Pod(cpu=16_000, memory=64 * _GI, eph=200 * _GI)),
        NodeGroup("gpu", 2, Pod(cpu=64_000, memory=512 * _GI, eph=1000 * _GI, gpu=8)),
    ),
)


@dataclass(frozen=True)
class Incarnation:
    """One run of a cluster worker: a fresh id and the wall time it started."""

    id: str = field(default_factory=lambda: uuid.uuid4().hex)
    started_at: float = field(default_factory=time.time)


def make_backend(
    name: str, kind: str, fleet_cluster: ClusterSpec | None, **opts: Any
) -> ClusterBackend:
    """Build the backend a cluster worker runs with.

    Args:
        name: The cluster's name as the control plane knows it.
        kind: ``"sim"`` (embedded simulation) or ``"kubernetes"`` (alias ``"k8s"``).
        fleet_cluster: The cluster's spec from the fleet file; the simulation builds its
            nodes from it (``DEFAULT_SIM_CLUSTER``'s nodes when None). Ignored by the
            Kubernetes backend, which reads real nodes.
        **opts: Passed to the backend's constructor (e.g. ``time_scale`` for the
            simulation; ``namespace``, ``gpu_node_label``, ``api_client`` for Kubernetes).

    Returns:
        A backend, not yet started (``run_cluster_worker`` starts it).

    Raises:
        ValueError: For an unknown ``kind``.
    """
    if kind == "sim":
        spec = fleet_cluster if fleet_cluster is not None else DEFAULT_SIM_CLUSTER
        return SimBackend(dataclasses.replace(spec, name=name), **opts)
    if kind in ("kubernetes", "k8s"):
        # Imported lazily so the simulated default never pays for the kubernetes client.
        from headway.activities.backends.kubernetes import KubernetesBackend

        return KubernetesBackend(name, **opts)
    raise ValueError(f"backend: {kind!r} is not a backend (one of: sim, kubernetes)")


#: The failure type of an admission refused because its tenant is not this worker's.
TENANT_NOT_SERVED = "TenantNotServed"


class TenantGuard(Interceptor):
    """Refuses (and logs) an admission for a tenant this worker does not serve in the
    namespace it came from: the cluster runs only the work of the tenants its operator
    gave it, whoever else can reach its task queue."""

    def __init__(self, cluster: str, namespace: str, tenants: Sequence[str]) -> None:
        self.cluster = cluster
        self.namespace = namespace
        self.tenants = frozenset(tenants)

    def refusal(self, tenant: str) -> str | None:
        """Why an admission for ``tenant`` is refused (None: it is served)."""
        if tenant in self.tenants:
            return None
        return (
            f"cluster worker of {self.cluster} does not serve tenant {tenant!r} in namespace "
            f"{self.namespace!r} (it serves {', '.join(sorted(self.tenants))})"
        )

    def intercept_activity(self, next: ActivityInboundInterceptor) -> ActivityInboundInterceptor:
        return _GuardedActivity(next, self)


class _GuardedActivity(ActivityInboundInterceptor):
    def __init__(self, next: ActivityInboundInterceptor, guard: TenantGuard) -> None:
        super().__init__(next)
        self._guard = guard

    async def execute_activity(self, input: ExecuteActivityInput) -> Any:
        req = input.args[0] if input.args else None
        if isinstance(req, DispatchRequest):
            why = self._guard.refusal(req.tenant)
            if why is not None:
                log.warning("refused action %s (%s): %s", req.action_id, req.workflow_id, why)
                # Not retryable: no retry makes this worker serve the tenant.
                raise ApplicationError(why, type=TENANT_NOT_SERVED, non_retryable=True)
        return await super().execute_activity(input)


async def _send_report(
    client: Client, tenant: str, report: CapacityReport, served: Sequence[str] | None = None
) -> bool:
    if served is not None and tenant not in served:
        log.warning(
            "refused a capacity report of %s for tenant %r: not served (serves %s)",
            report.cluster,
            tenant,
            ", ".join(served),
        )
        return False
    try:
        await client.get_workflow_handle(scheduler_workflow_id(tenant)).signal(
            CAPACITY_SIGNAL, report
        )
        return True
    except RPCError as exc:
        if exc.status == RPCStatusCode.NOT_FOUND:
            # The tenant's scheduler has not started yet; it gets a report on the retry.
            log.debug("scheduler of %s not running yet", tenant)
        else:
            log.warning("capacity report to %s failed: %s", tenant, exc)
        return False


async def capacity_loop(
    client: Client,
    backend: ClusterBackend,
    tenants: Sequence[str],
    *,
    debounce_s: float = 0.5,
    retry_s: float = 2.0,
    resync_s: float = 30.0,
    incarnation: Incarnation | None = None,
    clients: Mapping[str, Client] | None = None,
) -> None:
    """Report capacity to each tenant's scheduler now, and again whenever it changes.

    ``clients``: the client of each tenant that lives in another namespace than
    ``client``'s (the tenant-namespaces mapping).

    Changes are coalesced over ``debounce_s`` so a gang binding pod by pod costs one
    signal. A scheduler that is not running yet is retried every ``retry_s``; every
    ``resync_s`` all schedulers get a fresh report anyway, which repairs anything a
    restarted scheduler missed. Every report carries ``incarnation`` (a new one when
    None).
    """
    me = incarnation or Incarnation()
    version = 0
    targets = list(tenants)
    while True:
        failed: list[str] = []
        try:
            report = dataclasses.replace(
                await backend.capacity(), incarnation=me.id, started_at=me.started_at
            )
        except Exception as exc:
            log.warning("reading capacity of %s failed: %s", backend.name, exc)
            failed = targets
        else:
            for tenant in targets:
                to = (clients or {}).get(tenant, client)
                if not await _send_report(to, tenant, report_for(report, tenant), tenants):
                    failed.append(tenant)
        try:
            version = await asyncio.wait_for(
                backend.wait_capacity_change(version), retry_s if failed else resync_s
            )
        except TimeoutError:
            targets = failed or list(tenants)
            continue
        await asyncio.sleep(debounce_s)
        # Everything that changed during the debounce is in the next report already.
        version = await backend.wait_capacity_change(-1)
        targets = list(tenants)


async def _workflow_closed(client: Client, workflow_id: str, *, missing: bool) -> bool | None:
    """True when the workflow is closed, False while it runs, None when unknown; one
    that does not exist (its history is gone) answers ``missing``."""
    try:
        desc = await client.get_workflow_handle(workflow_id).describe()
    except RPCError as exc:
        if exc.status == RPCStatusCode.NOT_FOUND:
            return missing
        log.warning("gc: describing %s failed: %s", workflow_id, exc)
        return None
    return desc.status is not None and desc.status != WorkflowExecutionStatus.RUNNING


def _tenant_of(workflow_id: str, tenants: Sequence[str]) -> str | None:
    """The served tenant whose action ``workflow_id`` is (the longest that fits)."""
    fits = [t for t in tenants if workflow_id.startswith(f"headway-action-{t}-")]
    return max(fits, key=len) if fits else None


async def collect_garbage(
    client: Client,
    backend: ClusterBackend,
    clients: Mapping[str, Client] | None = None,
    tenants: Sequence[str] = (),
) -> list[str]:
    """Delete the pods (and forget the records) of every action whose workflow has ended.

    A workflow id derived from a sanitized label (pods made before the id was recorded
    on them) is trusted only when Temporal says the workflow is closed, never when it
    cannot be found: it might name another workflow than the action's.

    With ``clients`` (tenants in several namespaces), each action's workflow is asked in
    its tenant's namespace, and the pods of a tenant not in ``tenants`` are left alone:
    its workflow lives where this worker cannot look.

    Returns:
        The ids of the actions whose pods were deleted.
    """
    cleaned: list[str] = []
    for found in await backend.headway_pods():
        ask = client
        if clients:
            tenant = _tenant_of(found.workflow_id, tenants)
            if tenant is None:
                continue
            ask = clients.get(tenant, client)
        closed = await _workflow_closed(ask, found.workflow_id, missing=found.exact)
        if not closed:
            continue
        try:
            deleted = await backend.delete_pods(
                found.action_id, found.namespace, tenant=found.tenant
            )
        except Exception as exc:
            # The next round tries again.
            log.warning("gc: deleting the pods of ended action %s failed: %s", found.action_id, exc)
            continue
        backend.forget(found.action_id, tenant=found.tenant)
        if deleted:
            log.info("gc: deleted %d pod(s) of ended action %s", deleted, found.action_id)
        cleaned.append(found.action_id)
    return cleaned


async def gc_loop(
    client: Client,
    backend: ClusterBackend,
    interval_s: float | None,
    clients: Mapping[str, Client] | None = None,
    tenants: Sequence[str] = (),
) -> None:
    """Collect garbage now, then every ``interval_s`` (once only when None)."""
    while True:
        try:
            await collect_garbage(client, backend, clients, tenants)
        except Exception as exc:
            log.warning("gc of %s failed: %s", backend.name, exc)
        if interval_s is None:
            return
        await asyncio.sleep(interval_s)


async def run_cluster_worker(
    client: Client,
    cluster: str,
    backend: ClusterBackend,
    *,
    tenants: Sequence[str] = (DEFAULT_TENANT,),
    stop: asyncio.Event | None = None,
    heartbeat_s: float = 5.0,
    debounce_s: float = 0.5,
    retry_s: float = 2.0,
    resync_s: float = 30.0,
    max_concurrent_activities: int = 1000,
    incarnation: Incarnation | None = None,
    gc_interval_s: float | None = 300.0,
    shapes: Sequence[Pod] = (),
    clients: Mapping[str, Client] | None = None,
    refuse_other_tenants: bool = False,
) -> None:
    """Run the cluster worker of ``cluster`` until ``stop`` is set (forever if None).

    With ``refuse_other_tenants`` it serves ``tenants`` only: an admission for any other
    tenant (or for a served tenant from another namespace than its own) is refused and
    logged (:class:`TenantGuard`). Without, it runs any tenant's admissions that reach
    its task queue in its namespaces (the development default: one namespace, tenants
    made up on the fly), and still reports capacity to ``tenants`` only.

    Args:
        client: Connected Temporal client (the worker's only connection to the control
            plane, opened outbound).
        cluster: The cluster's name; the worker polls ``cluster_task_queue(cluster)``.
        backend: How to reach the cluster; started here and closed on the way out.
        tenants: Tenants whose shard schedulers receive this cluster's capacity reports.
        stop: Set it to shut the worker down. In-flight pods are left running; the next
            worker for this cluster adopts them when Temporal retries the activities.
        heartbeat_s: Heartbeat period of ``run_action``.
        debounce_s: Coalescing window of capacity reports.
        retry_s: Retry period for schedulers that are not running yet.
        resync_s: Period of unconditional capacity reports.
        max_concurrent_activities: ``run_action`` lives as long as its pods, so this
            bounds how many actions one worker follows at once.
        incarnation: This run's identity (a new one when None).
        gc_interval_s: Period of the garbage collection of ended actions' pods, which
            also runs once at start (None: at start only).
        shapes: The node shapes the fleet file declares for the cluster: what a
            dispatch is checked against while the backend cannot see its nodes.
        clients: The client of each served tenant that lives in another namespace than
            ``client``'s: the worker polls the cluster's task queue in each namespace.
        refuse_other_tenants: Refuse (and log) admissions of tenants not in ``tenants``.
    """
    stop = stop or asyncio.Event()
    me = incarnation or Incarnation()
    backend.incarnation = me.id
    log.info("cluster worker %s: incarnation %s (pid %d)", cluster, me.id, os.getpid())
    await backend.start()
    try:

        async def refresh(tenant: str) -> None:
            # After a hand-back: the tenant's scheduler hears at once what this worker
            # saw (also a tenant it does not serve: it sent work here).
            report = dataclasses.replace(
                await backend.capacity(), incarnation=me.id, started_at=me.started_at
            )
            to = (clients or {}).get(tenant, client)
            await _send_report(to, tenant, report_for(report, tenant))

        per_client: dict[int, tuple[Client, list[str]]] = {}
        for tenant in tenants:
            c = (clients or {}).get(tenant, client)
            per_client.setdefault(id(c), (c, []))[1].append(tenant)
        workers = [
            _activity_worker(
                c,
                cluster,
                backend,
                served if refuse_other_tenants else None,
                heartbeat_s,
                max_concurrent_activities,
                shapes=shapes,
                refresh=refresh,
            )
            for c, served in per_client.values()
        ]
        worker_task = asyncio.create_task(_run_all(workers))
        reporter = asyncio.create_task(
            capacity_loop(
                client,
                backend,
                tenants,
                debounce_s=debounce_s,
                retry_s=retry_s,
                resync_s=resync_s,
                incarnation=me,
                clients=clients,
            )
        )
        collector = asyncio.create_task(
            gc_loop(client, backend, gc_interval_s, clients, list(tenants))
        )
        stopper = asyncio.create_task(stop.wait())
        try:
            done, _ = await asyncio.wait(
                {worker_task, reporter, stopper}, return_when=asyncio.FIRST_COMPLETED
            )
        finally:
            stopper.cancel()
            reporter.cancel()
            collector.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reporter
            with contextlib.suppress(asyncio.CancelledError):
                await collector
            if not worker_task.done():
                await asyncio.gather(*(w.shutdown() for w in workers))
            with contextlib.suppress(asyncio.CancelledError):
                await worker_task
        for task in done:
            if task is not stopper and not task.cancelled() and task.exception() is not None:
                raise task.exception()  # type: ignore[misc]
    finally:
        await backend.close()


def _activity_worker(
    client: Client,
    cluster: str,
    backend: ClusterBackend,
    tenants: Sequence[str] | None,
    heartbeat_s: float,
    max_concurrent_activities: int,
    *,
    shapes: Sequence[Pod] = (),
    refresh: Callable[[str], Awaitable[None]] | None = None,
) -> Worker:
    """The worker polling ``cluster``'s task queue in ``client``'s namespace, for
    ``tenants`` only (None: any tenant's)."""
    acts = ClusterActivities(
        backend, client, heartbeat_s=heartbeat_s, shapes=shapes, refresh=refresh
    )
    return Worker(
        client,
        task_queue=cluster_task_queue(cluster),
        activities=acts.activities(),
        interceptors=[TenantGuard(cluster, client.namespace, tenants)] if tenants else [],
        max_concurrent_activities=max_concurrent_activities,
        # A burst of admissions to this cluster is picked up by as many pollers as
        # its backlog needs, not five.
        activity_task_poller_behavior=PollerBehaviorAutoscaling(),
        graceful_shutdown_timeout=timedelta(seconds=0),
        # A cancel reaches a running action with its next heartbeat; by default the
        # SDK holds heartbeats back to 80% of the 30 s timeout (a cancel took ~24 s).
        # One heartbeat call per running action every 3 s is cheap beside that.
        max_heartbeat_throttle_interval=timedelta(seconds=3),
    )


async def _run_all(workers: Sequence[Worker]) -> None:
    """Run every worker; the first to fail fails them all."""
    await asyncio.gather(*(w.run() for w in workers))
