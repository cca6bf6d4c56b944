"""Shared builders for the cluster-worker tests."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

from headway.activities.backends.base import pod_name
from headway.activities.backends.kubernetes import KubernetesBackend
from headway.activities.backends.sim import SimBackend
from headway.protocol import ActionEvent, ActionEventKind, DispatchRequest, GangKind, PodSpec
from headway.scheduler.model import ClusterSpec, NodeGroup
from headway.scheduler.resources import Pod
from headway.worker.cluster import run_cluster_worker
from headway.worker.control_plane import run_control_plane_worker
from kubernetes import client as k8s
from temporalio.client import Client
from temporalio.testing import ActivityEnvironment

GI = 2**30


def small_cluster(name: str = "c1", *, reports_capacity: bool = True) -> ClusterSpec:
    """Two CPU nodes (4 cores, 16Gi) and one 8 x H100 node."""
    return ClusterSpec(
        name,
        (
            NodeGroup("cpu", 2, Pod(cpu=4000, memory=16 * GI, eph=100 * GI)),
            NodeGroup(
                "gpu", 1, Pod(cpu=32000, memory=256 * GI, eph=500 * GI, gpu=8, gpu_type="H100")
            ),
        ),
        reports_capacity,
    )


def sim(spec: ClusterSpec | None = None, **opts: object) -> SimBackend:
    opts.setdefault("time_scale", 0.01)
    return SimBackend(spec or small_cluster(), **opts)  # type: ignore[arg-type]


def pod_of(action_id: str, role: str = "main", index: int = 0, tenant: str = "t1") -> str:
    """The name a backend gives a pod of ``tenant``'s action (``request`` makes tenant
    t1's)."""
    return pod_name(action_id, role, index, tenant)


def request(
    action_id: str,
    pods: list[PodSpec] | None = None,
    *,
    kind: GangKind = GangKind.SINGLE,
    duration_s: float | None = 1.0,
    inject: str | None = None,
    cluster: str = "c1",
) -> DispatchRequest:
    return DispatchRequest(
        tenant="t1",
        action_id=action_id,
        workflow_id=f"wf-{action_id}",
        cluster=cluster,
        kind=kind,
        pods=pods or [PodSpec(role="main", index=0, cpu_m=1000, memory=GI)],
        duration_s=duration_s,
        inject=inject,
    )


async def collect_until_terminal(
    queue: asyncio.Queue[ActionEvent], action_id: str, timeout: float = 5.0
) -> list[ActionEvent]:
    """Events of one action up to and including its first terminal event."""
    from headway.protocol import TERMINAL_EVENTS

    out: list[ActionEvent] = []
    async with asyncio.timeout(timeout):
        while True:
            ev = await queue.get()
            if ev.action_id != action_id:
                continue
            out.append(ev)
            if ev.kind in TERMINAL_EVENTS:
                return out


class Recorder:
    """Stands in for the action workflow: records every signalled event."""

    def __init__(self) -> None:
        self.events: list[tuple[str, ActionEvent]] = []
        self.changed = asyncio.Event()

    async def __call__(self, workflow_id: str, event: ActionEvent) -> None:
        self.events.append((workflow_id, event))
        self.changed.set()

    def kinds(self) -> list[ActionEventKind]:
        return [e.kind for _, e in self.events]

    async def wait_for(self, kind: ActionEventKind, timeout: float = 5.0) -> ActionEvent:
        async with asyncio.timeout(timeout):
            while True:
                for _, e in self.events:
                    if e.kind is kind:
                        return e
                self.changed.clear()
                await self.changed.wait()


def attempt_env(
    attempt: int = 1,
    details: Sequence[Any] = (),
    *,
    activity_id: str = "1",
    beats: list[Any] | None = None,
) -> ActivityEnvironment:
    """An ActivityEnvironment for one attempt of one dispatch (``activity_id``), with the
    heartbeat details an earlier attempt left; heartbeats go to ``beats``."""
    env = ActivityEnvironment()
    env.info = dataclasses.replace(
        env.info,
        attempt=attempt,
        heartbeat_details=list(details),
        activity_id=activity_id,
        workflow_id="wf",
        workflow_run_id="run-1",
    )
    if beats is not None:
        env.on_heartbeat = lambda *d: beats.append(d[0] if d else None)
    return env


@contextlib.asynccontextmanager
async def kube_cluster_worker(
    client: Client,
    kube_url: object,
    cluster: str,
    namespace: str,
    tenants: list[str],
    **worker_kw: Any,
) -> AsyncIterator[KubernetesBackend]:
    """A Kubernetes cluster worker alone (its own backend and API client) against the
    fake API server at ``kube_url``, stopped on the way out: a worker that goes and
    comes back while the control plane stays."""
    cfg = k8s.Configuration()
    cfg.host = str(kube_url).rstrip("/")
    api = k8s.ApiClient(cfg)
    backend = KubernetesBackend(
        cluster, namespace=namespace, api_client=api, backoff_initial_s=0.05, backoff_max_s=0.2
    )
    stop = asyncio.Event()
    task = asyncio.ensure_future(
        run_cluster_worker(client, cluster, backend, tenants=tenants, stop=stop, **worker_kw)
    )
    try:
        yield backend
    finally:
        stop.set()
        await asyncio.wait_for(asyncio.gather(task, return_exceptions=True), 60)
        api.close()


@contextlib.asynccontextmanager
async def kube_control_plane(
    client: Client,
    kube_url: object,
    tmp_path: Path,
    cluster: str,
    namespace: str,
    fleet: list[ClusterSpec],
    tenants: list[str],
    extra: Callable[[asyncio.Event], list[Awaitable[Any]]] = lambda stop: [],
    backend_kw: dict[str, Any] | None = None,
    **worker_kw: Any,
) -> AsyncIterator[asyncio.Event]:
    """The control plane (SQLite store under ``tmp_path``) and a Kubernetes cluster
    worker for ``tenants`` against the fake API server at ``kube_url``, with
    ``extra(stop)`` (the fake's scheduler or kubelet, an audit) running beside them
    (``backend_kw``: more of the backend's arguments); yields the event that stops them
    all, and stops them on the way out."""
    cfg = k8s.Configuration()
    cfg.host = str(kube_url).rstrip("/")
    api = k8s.ApiClient(cfg)
    backend = KubernetesBackend(
        cluster,
        namespace=namespace,
        api_client=api,
        backoff_initial_s=0.05,
        backoff_max_s=0.2,
        **(backend_kw or {}),
    )
    stop = asyncio.Event()
    db = f"sqlite:///{tmp_path / 'leases.db'}"
    tasks = [
        asyncio.ensure_future(
            run_control_plane_worker(client, database_url=db, fleet=fleet, stop=stop)
        ),
        asyncio.ensure_future(
            run_cluster_worker(client, cluster, backend, tenants=tenants, stop=stop, **worker_kw)
        ),
        *(asyncio.ensure_future(w) for w in extra(stop)),
    ]
    try:
        yield stop
    finally:
        stop.set()
        await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 60)
        api.close()
