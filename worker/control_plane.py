"""The control-plane worker: both workflows plus the store and dispatch activities.

Runs on ``protocol.CONTROL_TASK_QUEUE``. Any number of these may run against one
Temporal namespace and one database; each tenant's scheduler workflow lives on whichever
worker holds it, so tenants never serialize behind each other.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypedDict

from headway import protocol
from headway.activities.dispatch import DispatchActivities
from headway.activities.fairness import DEFAULT_CONTENDED_RATE, ShardFairness
from headway.activities.store import AdmissionWaiters, StoreActivities
from headway.scheduler.model import ClusterSpec
from headway.store import LeaseStore
from headway.store.config import ConfigStore
from headway.store.history import history_retention as parse_retention
from headway.worker import sdk_fastpath
from headway.workflows.action import ActionWorkflow
from headway.workflows.config import ConfigHistoryWorkflow
from headway.workflows.scheduler import SchedulerWorkflow
from temporalio.client import Client
from temporalio.worker import PollerBehavior, PollerBehaviorAutoscaling, Worker

__all__ = [
    "WORKER_TUNING",
    "WorkerTuning",
    "build_control_plane_worker",
    "restore_tenants",
    "run_control_plane_worker",
]


class WorkerTuning(TypedDict):
    """Slots and pollers of the control-plane worker (benchmarks give bare Temporal the same)."""

    max_concurrent_workflow_tasks: int
    max_concurrent_activities: int
    max_concurrent_local_activities: int
    workflow_task_poller_behavior: PollerBehavior
    activity_task_poller_behavior: PollerBehavior


# Pollers scale with the backlog: with the SDK's fixed 5 workflow-task pollers (one of
# them on the shared queue), a tenant starting hundreds of actions at once built a
# backlog that every other tenant's new actions waited behind (measured: another
# tenant's 5-action run went from ~0.2 s to 1.5-8 s while 400 actions were submitted).
WORKER_TUNING = WorkerTuning(
    max_concurrent_workflow_tasks=400,
    max_concurrent_activities=200,
    max_concurrent_local_activities=400,
    workflow_task_poller_behavior=PollerBehaviorAutoscaling(),
    activity_task_poller_behavior=PollerBehaviorAutoscaling(),
)


def build_control_plane_worker(
    client: Client,
    store: LeaseStore,
    fleet: Sequence[ClusterSpec] = (),
    *,
    task_queue: str = protocol.CONTROL_TASK_QUEUE,
    admit_wait_s: float | None = None,
    contended_rate: float = DEFAULT_CONTENDED_RATE,
    history_retention: str | None = None,
) -> Worker:
    """A Worker (not yet running) with the workflows and activities of the control plane.

    Args:
        client: connected Temporal client (also used by activities to signal workflows).
        store: the lease store.
        fleet: clusters known up front; passed to a scheduler workflow when one starts.
        task_queue: override for tests.
        admit_wait_s: how long an action's first task waits here for its admission
            before it falls back to the admission signal (None: the action's own
            ``ADMIT_WAIT_S``); see ``headway.activities.store``.
        contended_rate: admission signals per second a shard may send while another
            shard has interactive work on this worker; 0 turns the pacing off. See
            ``headway.activities.fairness``.
        history_retention: how long finished actions are kept in the record
            (``headway.store.history``): ``30d``, ``12h`` or ``forever``; None:
            ``$HEADWAY_HISTORY_RETENTION``, else 30 days.

    Building one installs :mod:`headway.worker.sdk_fastpath` for the process.
    """
    sdk_fastpath.install()
    # Waiters hold a workflow task slot while they wait: keep at most half the slots for
    # them so the scheduler's own tasks always find one.
    waiters = AdmissionWaiters(limit=WORKER_TUNING["max_concurrent_workflow_tasks"] // 2)
    fairness = ShardFairness(contended_rate)
    store_acts = StoreActivities(
        store,
        client,
        fleet,
        waiters,
        admit_wait_s=admit_wait_s,
        fairness=fairness,
        history_retention_s=parse_retention(history_retention),
    )
    dispatch = DispatchActivities(client, store=store, waiters=waiters, fairness=fairness)
    return Worker(
        client,
        task_queue=task_queue,
        workflows=[ActionWorkflow, SchedulerWorkflow, ConfigHistoryWorkflow],
        activities=[
            store_acts.put_lease,
            store_acts.put_lease_wait,
            store_acts.finish_lease,
            store_acts.requeue_lease,
            store_acts.retry_policy,
            store_acts.sync,
            store_acts.set_door,
            store_acts.fleet_specs,
            store_acts.load_config,
            store_acts.config_history,
            dispatch.dispatch,
        ],
        **WORKER_TUNING,
    )


async def run_control_plane_worker(
    client: Client,
    *,
    database_url: str | None = None,
    fleet: list[ClusterSpec] | None = None,
    stop: asyncio.Event | None = None,
    admit_wait_s: float | None = None,
    contended_rate: float = DEFAULT_CONTENDED_RATE,
    seed_queues: Sequence[Mapping[str, Any]] = (),
    seed_tenant: str = protocol.DEFAULT_TENANT,
    on_ready: Callable[[list[str]], None] | None = None,
    history_retention: str | None = None,
    cluster_silent_s: float | None = None,
    serves: Callable[[str], bool] | None = None,
) -> None:
    """Run the control-plane worker until ``stop`` is set (or forever).

    Once it polls, it gives ``seed_tenant`` the ``seed_queues`` (``QueueSpec.to_dict()``
    each; the fleet file's) if the database has never seen that tenant, then starts the
    scheduler of every tenant with stored configuration, which reloads it (a scheduler
    already running is left as it is), and calls ``on_ready`` with those tenants.

    Args:
        client: connected Temporal client.
        database_url: SQLAlchemy URL of the lease store; default ``$HEADWAY_DATABASE_URL``
            or SQLite under ``.headway/``.
        fleet: clusters known up front (the fleet file), handed to scheduler workflows.
        stop: set it to shut the worker down gracefully.
        admit_wait_s: see :func:`build_control_plane_worker`.
        contended_rate: see :func:`build_control_plane_worker`.
        seed_queues, seed_tenant, on_ready: see above.
        cluster_silent_s: how long a silent cluster worker takes to make its cluster
            down, and a dispatch to wait for its worker before it is handed back
            (``headway.workflows.shared.HEALTH``; None: 90 s).
        serves: which stored tenants this worker starts the schedulers of (None: all);
            with tenants in several namespaces, those of its client's namespace.
    """
    if cluster_silent_s is not None:
        from headway.workflows.shared import HEALTH

        HEALTH.cluster_silent_s = cluster_silent_s
    store = LeaseStore(database_url)
    worker = build_control_plane_worker(
        client,
        store,
        fleet or [],
        admit_wait_s=admit_wait_s,
        contended_rate=contended_rate,
        history_retention=history_retention,
    )
    try:
        async with worker:
            tenants = await restore_tenants(
                client,
                store,
                fleet or [],
                seed_queues=seed_queues,
                seed_tenant=seed_tenant,
                serves=serves,
            )
            if on_ready is not None:
                on_ready(tenants)
            await (stop.wait() if stop is not None else asyncio.Event().wait())
    finally:
        store.close()


async def restore_tenants(
    client: Client,
    store: LeaseStore,
    fleet: Sequence[ClusterSpec] = (),
    *,
    seed_queues: Sequence[Mapping[str, Any]] = (),
    seed_tenant: str = protocol.DEFAULT_TENANT,
    serves: Callable[[str], bool] | None = None,
) -> list[str]:
    """Seed ``seed_tenant`` with ``seed_queues`` if the store has never seen it, then
    make sure every tenant with stored configuration (that ``serves`` accepts) has its
    scheduler running (a fresh one reloads the configuration). Returns those tenants."""
    from headway.workflows.client import ensure_scheduler

    config = ConfigStore(store)
    if seed_queues:
        who = f"control-plane@{socket.gethostname()}"
        await asyncio.to_thread(
            lambda: config.seed(seed_tenant, seed_queues, who=who, source="fleet")
        )
    tenants = await asyncio.to_thread(config.tenants)
    if serves is not None:
        tenants = [t for t in tenants if serves(t)]
    for tenant in tenants:
        await ensure_scheduler(client, tenant, fleet)
    return tenants
