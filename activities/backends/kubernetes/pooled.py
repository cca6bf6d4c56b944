"""Actions of reusable (warm) environments on Kubernetes: calls in their pool, no pod.

An action whose one pod runs the SDK's entrypoint for a reusable environment (its command
carries ``--pool NAME`` and the pool's shape, see ``sim_task.pool_shape``) gets no pod of
its own: it runs as one call in that environment's pool of pulling pods
(:class:`~headway.activities.backends.kube_pool.KubePools`, one per namespace). The call
is known by the name the action's pod would have had, and makes the events such a pod
would give, on the backend's event hub: Running once a pool pod took it, then Succeeded
or Failed with the outcome document (a failure's message is the task's ``Type:
message``). Deleting the action's pods cancels its call.

The pools' listener: ``listen`` (``HOST:PORT``, the worker flag ``--pool-listen``) is the
address the pool pods dial; the worker listens on every interface at PORT (0: a free
one). Without it, HOST is ``$POD_IP`` (the worker's pod IP, from the downward API), else
this host's address. On a real cluster the pool pods must reach it: a Service in front
of the worker (give its name and a fixed port) or the worker's pod IP. Only the worker's
own namespace's pools listen on that PORT; a queue's own namespace gets a free port.

Exactly once: a call lives only in the worker process that started it. A retried
dispatch (the worker restarted) finds no call and no pod, so the activity reports the
work ``PodLost`` and never runs it a second time; the old worker's connections are gone,
and with them (the pod's process cancels its calls when its connection closes) the call.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
from collections.abc import Callable
from dataclasses import dataclass

from headway.protocol import ActionEvent, ActionEventKind, DispatchRequest
from kubernetes import client as k8s

from ..base import EventHub, PodRecord
from ..kube_pool import KubePools, PoolUnavailable, parse_listen
from ..sim_task import PoolShape, TaskOutcome, pool_shape
from .pods import _resources, pod_names

__all__ = ["PooledCalls", "pooled_shape"]

log = logging.getLogger(__name__)


def pooled_shape(req: DispatchRequest) -> PoolShape | None:
    """The pool an action runs in (None: it gets pods of its own)."""
    if len(req.pods) != 1:
        return None
    return pool_shape(req.pods[0].command)


def _default_host() -> str:
    """The address pool pods reach this worker by when none is given."""
    if os.environ.get("POD_IP"):
        return os.environ["POD_IP"]
    try:
        return socket.gethostbyname(socket.gethostname())
    except OSError:
        return "127.0.0.1"


@dataclass
class _Call:
    """One action's call: its task, its dispatch, and its latest event."""

    name: str
    dispatch: str
    task: asyncio.Task[None] | None = None
    last: ActionEvent | None = None


class PooledCalls:
    """The pooled actions of one Kubernetes backend (see the module docstring)."""

    def __init__(
        self,
        cluster: str,
        api_client: Callable[[], k8s.ApiClient],
        hub: EventHub,
        clock: Callable[[], float],
        *,
        default_namespace: str | None,
        listen: str | None = None,
        connect_timeout_s: float = 300.0,
    ) -> None:
        self.cluster = cluster
        self._api_client = api_client
        self._hub = hub
        self._clock = clock
        self._default_ns = default_namespace
        if listen is None:
            self.host, self.port = _default_host(), 0
        else:
            self.host, self.port = parse_listen(listen)
        self.connect_timeout_s = connect_timeout_s
        self._pools: dict[str, KubePools] = {}
        self._starting = asyncio.Lock()
        self._calls: dict[tuple[str, str], _Call] = {}

    async def _pools_of(self, ns: str) -> KubePools:
        async with self._starting:
            pools = self._pools.get(ns)
            if pools is None:
                fixed = ns == self._default_ns or not self._pools
                pools = KubePools(
                    self._api_client(),
                    ns,
                    advertise=self.host,
                    port=self.port if fixed else 0,
                    connect_timeout_s=self.connect_timeout_s,
                )
                await pools.start()
                self._pools[ns] = pools
            return pools

    def start(self, req: DispatchRequest, ns: str, dispatch: str, *, adopt_only: bool) -> str:
        """Start the action's call (adopt it when this process runs it already; with
        ``adopt_only`` start nothing). Returns the call's name."""
        (name,) = pod_names(req)
        key = (req.tenant, req.action_id)
        call = self._calls.get(key)
        if call is not None and (call.dispatch == dispatch or adopt_only):
            return call.name
        if call is not None and call.task is not None:
            call.task.cancel()  # another dispatch's: superseded
        if adopt_only:
            return name
        call = _Call(name, dispatch)
        self._calls[key] = call
        call.task = asyncio.get_running_loop().create_task(self._run(req, ns, call))
        return name

    async def _run(self, req: DispatchRequest, ns: str, call: _Call) -> None:
        shape = pooled_shape(req)
        assert shape is not None
        spec = req.pods[0]
        env = {**(req.kube.env if req.kube else {}), **spec.env}
        env.update(
            {
                "HEADWAY_ACTION_ID": req.action_id,
                "HEADWAY_TENANT": req.tenant,
                "HEADWAY_POD": call.name,
            }
        )

        def started(pod: str) -> None:
            self._publish(req, call, ActionEventKind.RUNNING, f"running in pool pod {pod}")

        try:
            pools = await self._pools_of(ns)
            outcome = await pools.run(
                shape,
                list(spec.command),
                env,
                image=spec.image,
                requests=_resources(spec),
                on_start=started,
            )
        except PoolUnavailable as exc:
            outcome = TaskOutcome(False, 1, str(exc), None)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # the API server refused the pool's pods, ...
            log.warning("%s: its pooled call failed: %s", req.action_id, exc)
            outcome = TaskOutcome(False, 1, f"EnvironmentUnavailable: {exc}", None)
        kind = ActionEventKind.SUCCEEDED if outcome.ok else ActionEventKind.FAILED
        self._publish(req, call, kind, outcome.message, outcome)

    def _publish(
        self,
        req: DispatchRequest,
        call: _Call,
        kind: ActionEventKind,
        message: str,
        outcome: TaskOutcome | None = None,
    ) -> None:
        event = ActionEvent(
            action_id=req.action_id,
            kind=kind,
            cluster=self.cluster,
            pod=call.name,
            exit_code=None if outcome is None else outcome.exit_code,
            message=message,
            observed_at=self._clock(),
            output=None if outcome is None else outcome.document,
        )
        call.last = event
        self._hub.publish(event)

    def _keys(self, action_id: str, tenant: str) -> list[tuple[str, str]]:
        return [k for k in self._calls if k[1] == action_id and (not tenant or k[0] == tenant)]

    async def cancel(self, action_id: str, tenant: str = "") -> int:
        """Cancel and forget the action's calls (``tenant``'s only when given)."""
        cancelled = 0
        for key in self._keys(action_id, tenant):
            call = self._calls.pop(key)
            if call.task is not None and not call.task.done():
                call.task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await call.task
                cancelled += 1
        return cancelled

    def current_events(self, action_id: str) -> list[ActionEvent]:
        return [c.last for k, c in self._calls.items() if k[1] == action_id and c.last is not None]

    def live(self, action_id: str, dispatch: str = "") -> dict[str, str | None]:
        """The action's calls that run (name -> no node), ``dispatch``'s when given."""
        return {
            c.name: None
            for k, c in self._calls.items()
            if k[1] == action_id
            and (not dispatch or c.dispatch == dispatch)
            and c.task is not None
            and not c.task.done()
        }

    def records(self, action_id: str, dispatch: str) -> dict[str, PodRecord]:
        """The action's calls of ``dispatch`` this process knows, with their outcome."""
        out: dict[str, PodRecord] = {}
        for k, c in self._calls.items():
            if k[1] != action_id or c.dispatch != dispatch:
                continue
            ended = c.last is not None and c.last.kind in (
                ActionEventKind.SUCCEEDED,
                ActionEventKind.FAILED,
            )
            out[c.name] = PodRecord(c.name, None, c.last.kind if ended and c.last else None)
        return out

    def pool_pods(self) -> dict[str, dict[str, list[str]]]:
        """Each namespace's pools' pods as placed, by environment name (for tests)."""
        return {ns: p.pod_names() for ns, p in self._pools.items()}

    async def close(self) -> None:
        """Cancel every call, tear every pool down (its pods deleted), stop listening."""
        for key in list(self._calls):
            await self.cancel(key[1], key[0])
        pools, self._pools = list(self._pools.values()), {}
        for pools_ in pools:
            await pools_.close()
