"""A reusable environment on Kubernetes: a pool of long-lived pods that pull their calls.

On the simulated backend a warm environment's pool is ``replicas`` local processes
(:mod:`headway.activities.backends.sim_task`). On Kubernetes it is ``replicas`` pods of
the environment's image and requests, each running ``python -m headway.sdk.run --pull
HOST:PORT --pool-key KEY --pod NAME``: the pod connects to its cluster worker (this
module's :class:`KubePools`, listening on HOST:PORT, which a pod reaches through the
worker's Service), says which pool it serves, and is handed up to ``concurrency`` calls
at a time over that connection, one JSON document per line:

* pod -> worker, first: ``{"hello": KEY, "pod": NAME, "pid": PID}``;
* worker -> pod: ``{"id", "argv", "env"}`` (a call: the task's entrypoint arguments and
  its pod's environment, which the call sees as its ``os.environ``), ``{"cancel": ID}``;
* pod -> worker: ``{"id", "code", "document"}`` (the outcome document, as a task pod's
  termination message has it).

A call waits for a connected pod with a free slot (the least busy one takes it). The
pool's pods are created by its first call and deleted once it had no call for its
``idle_ttl``: their connections are closed first (the pod's process then exits, its pod
ends Succeeded), then the pods are deleted. A pod whose connection drops ends its calls
in flight as failed; the next call finds the pool short of it and creates it again.

A call waiting while *no* pod of its pool is connected waits at most
``connect_timeout_s`` (the pods unschedulable, their image not pulled, or this worker's
address not reachable from them): it then fails with :class:`PoolUnavailable`. Once a pod
is connected, a call waits for a free slot as long as it takes.

The Kubernetes backend routes a reusable environment's action here (see
:mod:`headway.activities.backends.kubernetes.pooled`).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import itertools
import json
import logging
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from .sim_task import TASK_ENTRYPOINT, PoolShape, TaskOutcome, ask_member

__all__ = ["POOL_LABEL", "KubePools", "PoolUnavailable", "parse_listen", "pool_pod_names"]

log = logging.getLogger(__name__)

#: The label every pod of a pool carries: its pool's key.
POOL_LABEL = "headway.io/pool"
#: The longest line of the pull protocol (``headway.sdk.run.LINE_LIMIT``).
LINE_LIMIT = 16 * 2**20


class PoolUnavailable(Exception):
    """No pod of a pool connected within the pools' ``connect_timeout_s``."""


def parse_listen(value: str, field_name: str = "--pool-listen") -> tuple[str, int]:
    """``HOST:PORT`` (port 0: a free one) as (host, port); ValueError naming ``value``."""
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit() or int(port) > 65535:
        raise ValueError(f"{field_name}: {value!r} is not HOST:PORT (a port 0..65535)")
    return host, int(port)


def _key(shape: PoolShape) -> str:
    """A pool's key: its environment and a digest of its whole shape (a label value)."""
    digest = hashlib.sha256(repr(shape).encode()).hexdigest()[:10]
    safe = "".join(c if c.isalnum() else "-" for c in shape.name.lower()).strip("-")[:40]
    return f"{safe or 'env'}-{digest}"


def pool_pod_names(shape: PoolShape, instance: str) -> list[str]:
    """The names of the pods of one placement (``instance``) of a pool: a pool placed
    again gets new names, never those of pods still being deleted."""
    return [f"hw-pool-{_key(shape)}-{instance}-{i}" for i in range(shape.replicas)]


@dataclass
class _PodConn:
    """A pool pod's connection and the calls it runs."""

    name: str
    writer: asyncio.StreamWriter
    calls: dict[str, asyncio.Future[tuple[int, str | None]]] = field(default_factory=dict)

    def send(self, msg: Mapping[str, Any]) -> None:
        self.writer.write((json.dumps(msg) + "\n").encode())


class _KubePool:
    """One warm environment's pods in one namespace (see the module docstring)."""

    def __init__(self, owner: KubePools, shape: PoolShape, image: str, requests: dict[str, str]):
        self.owner = owner
        self.shape = shape
        self.key = _key(shape)
        self.instance = uuid.uuid4().hex[:6]
        self.names = pool_pod_names(shape, self.instance)
        self.image = image
        self.requests = requests
        self.pods: dict[str, _PodConn] = {}
        # Pods created (or found running) and not known to have gone: not created again
        # while they start and connect.
        self.created: set[str] = set()
        self.changed = asyncio.Condition()
        self.busy = 0
        self.idle: asyncio.Task[None] | None = None
        self.closed = False

    def manifest(self, name: str) -> Any:
        """A pool pod: the environment's image and requests, the pull entrypoint (a dict,
        which the client sends as it is)."""
        command = ["python", "-m", TASK_ENTRYPOINT, "--pull", self.owner.address]
        command += ["--pool-key", self.key, "--pod", name]
        return {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": name,
                "labels": {POOL_LABEL: self.key, "headway.io/tenant": self.shape.tenant[:63]},
            },
            "spec": {
                "restartPolicy": "Never",
                "containers": [
                    {
                        "name": "main",
                        "image": self.image,
                        "command": command,
                        "resources": {"requests": self.requests, "limits": self.requests},
                    }
                ],
            },
        }

    async def ensure_pods(self) -> None:
        """Create the pool's pods that are not connected and do not run (one that ended
        is deleted and created again; 409 for one that runs: it is connecting)."""
        api = k8s.CoreV1Api(self.owner.api)
        ns = self.owner.namespace
        for name in self.names:
            if name in self.created:
                continue
            self.created.add(name)
            try:
                await asyncio.to_thread(api.create_namespaced_pod, ns, self.manifest(name))
            except ApiException as err:
                if err.status != 409:
                    self.created.discard(name)
                    raise
                pod = await asyncio.to_thread(api.read_namespaced_pod, name, ns)
                if pod.status is not None and pod.status.phase in ("Succeeded", "Failed"):
                    await asyncio.to_thread(api.delete_namespaced_pod, name, ns)
                    await asyncio.to_thread(api.create_namespaced_pod, ns, self.manifest(name))

    async def _slot(self) -> _PodConn:
        """The least busy connected pod with a free slot, once there is one; while none
        is connected at all, for up to the pools' ``connect_timeout_s``."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.owner.connect_timeout_s
        async with self.changed:
            while True:
                free = [p for p in self.pods.values() if len(p.calls) < self.shape.concurrency]
                if free:
                    return min(free, key=lambda p: (len(p.calls), p.name))
                if self.pods:
                    await self.changed.wait()  # all busy: a slot frees up in time
                    continue
                left = deadline - loop.time()
                if left <= 0:
                    raise PoolUnavailable(self.unavailable())
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.changed.wait(), left)

    def unavailable(self) -> str:
        return (
            f"EnvironmentUnavailable: no pod of reusable environment {self.shape.name!r}"
            f" ({', '.join(self.names)}) connected to its cluster worker at"
            f" {self.owner.address} within {self.owner.connect_timeout_s:g} s (the pods"
            " unschedulable, their image not pulled, or that address not reachable from"
            " them)"
        )

    async def run(
        self,
        command: list[str],
        env: dict[str, str],
        on_start: Callable[[str], None] | None = None,
    ) -> TaskOutcome:
        if self.idle is not None:
            self.idle.cancel()
            self.idle = None
        self.busy += 1
        try:
            pod = await self._slot()
            rid = f"c{next(_IDS)}"
            fut: asyncio.Future[tuple[int, str | None]] = asyncio.get_running_loop().create_future()
            pod.calls[rid] = fut
            msg = {"id": rid, "argv": command[3:], "env": env}
            started = (lambda: on_start(pod.name)) if on_start is not None else None
            code, document = await ask_member(pod.send, pod.calls, msg, fut, self.changed, started)
            return _outcome(code, document, pod.name)
        finally:
            self.busy -= 1
            if self.busy == 0 and not self.closed:
                self.idle = asyncio.get_running_loop().create_task(self._expire())

    async def attach(self, conn: _PodConn, reader: asyncio.StreamReader) -> None:
        """Serve one pod's connection until it drops: its answers end its calls."""
        old = self.pods.get(conn.name)
        if old is not None:
            old.writer.close()
        async with self.changed:
            self.pods[conn.name] = conn
            self.changed.notify_all()
        try:
            while line := await reader.readline():
                with contextlib.suppress(ValueError, KeyError, TypeError):
                    msg = json.loads(line)
                    fut = conn.calls.pop(str(msg["id"]), None)
                    if fut is not None and not fut.done():
                        fut.set_result((int(msg.get("code", 1)), msg.get("document")))
        except ConnectionError:
            pass
        finally:
            if self.pods.get(conn.name) is conn:
                del self.pods[conn.name]
                self.created.discard(conn.name)  # gone: the next call creates it again
            for fut in conn.calls.values():
                if not fut.done():
                    fut.set_result((1, None))
            conn.calls.clear()

    async def _expire(self) -> None:
        await asyncio.sleep(self.shape.idle_ttl)
        if self.busy == 0:
            self.owner.forget(self)
            await self.stop()

    async def stop(self) -> None:
        """Tear the pool down: connections closed (the pods' processes exit and their
        pods end; up to ``STOP_GRACE_S``), then the pods deleted."""
        self.closed = True
        for conn in list(self.pods.values()):
            conn.writer.close()
        api = k8s.CoreV1Api(self.owner.api)
        ns = self.owner.namespace
        for name in self.names:
            try:
                await _ended(api, ns, name)
                await asyncio.to_thread(api.delete_namespaced_pod, name, ns)
            except ApiException as err:
                if err.status != 404:
                    log.warning("pool pod %s not deleted: %s", name, err)


#: How long a torn-down pool's pods are given to end on their own before their deletion.
STOP_GRACE_S = 10.0


async def _ended(api: k8s.CoreV1Api, namespace: str, name: str) -> None:
    """Wait (up to ``STOP_GRACE_S``) until a pod whose connection was closed has ended."""
    deadline = asyncio.get_running_loop().time() + STOP_GRACE_S
    while asyncio.get_running_loop().time() < deadline:
        pod = await asyncio.to_thread(api.read_namespaced_pod, name, namespace)
        if pod.status is None or pod.status.phase in ("Succeeded", "Failed", "Pending"):
            return  # ended, or never started (its container runs nothing yet)
        await asyncio.sleep(0.2)


def _outcome(code: int, document: str | None, pod: str) -> TaskOutcome:
    """A pooled call's outcome from its answer (as ``sim_task.outcome_of`` reads a file)."""
    try:
        doc = json.loads(document or "")
    except ValueError:
        doc = None
    if isinstance(doc, dict) and doc.get("ok") is True and code == 0:
        return TaskOutcome(True, 0, "Completed", document)
    if isinstance(doc, dict) and isinstance(doc.get("error"), dict):
        err = doc["error"]
        message = f"{err.get('type', 'Error')}: {err.get('message', '')}".rstrip(": ")
        return TaskOutcome(False, code or 1, message, document)
    return TaskOutcome(
        False, code or 1, f"PodLost: pool pod {pod} went while running the call", None
    )


_IDS = itertools.count(1)


class KubePools:
    """The pools of one cluster worker's namespace, and the listener their pods dial.

    ``advertise``: the host name the pods reach this worker by (its Service's name in a
    cluster); ``port`` 0 picks a free one. ``connect_timeout_s``: how long a call waits
    while no pod of its pool is connected (:class:`PoolUnavailable` after).
    """

    def __init__(
        self,
        api: k8s.ApiClient,
        namespace: str,
        *,
        advertise: str,
        bind: str = "0.0.0.0",
        port: int = 0,
        connect_timeout_s: float = 300.0,
    ) -> None:
        self.api = api
        self.connect_timeout_s = connect_timeout_s
        self.namespace = namespace
        self.advertise = advertise
        self.bind = bind
        self.port = port
        self._pools: dict[str, _KubePool] = {}
        self._starting = asyncio.Lock()
        self._server: asyncio.Server | None = None

    @property
    def address(self) -> str:
        return f"{self.advertise}:{self.port}"

    async def start(self) -> None:
        """Listen, and delete the pool pods that ended in this namespace: left by a worker
        that crashed (their connection dropped, their process ended; nothing else would
        delete them). Running ones are left alone: another worker's, or ending."""
        self._server = await asyncio.start_server(
            self._accept, self.bind, self.port, limit=LINE_LIMIT
        )
        self.port = self._server.sockets[0].getsockname()[1]
        try:
            await self._delete_ended()
        except ApiException as exc:  # no right to list or delete: they stay, as before
            log.warning("pool pods in %s left as they are: %s", self.namespace, exc.reason)

    async def _delete_ended(self) -> None:
        api = k8s.CoreV1Api(self.api)
        pods = await asyncio.to_thread(
            api.list_namespaced_pod, self.namespace, label_selector=POOL_LABEL
        )
        for pod in pods.items:
            name = pod.metadata.name if pod.metadata is not None else None
            if name and pod.status is not None and pod.status.phase in ("Succeeded", "Failed"):
                log.info("deleting pool pod %s, ended before this worker", name)
                with contextlib.suppress(ApiException):
                    await asyncio.to_thread(api.delete_namespaced_pod, name, self.namespace)

    async def run(
        self,
        shape: PoolShape,
        command: list[str],
        env: dict[str, str],
        *,
        image: str,
        requests: dict[str, str],
        on_start: Callable[[str], None] | None = None,
    ) -> TaskOutcome:
        """Run one call of a reusable environment's task in its pool (created by the
        first call of its shape; its missing pods created again). ``on_start`` is told
        the pod's name once the call is handed to one.

        Raises:
            PoolUnavailable: No pod of the pool connected in ``connect_timeout_s``.
        """
        key = _key(shape)
        async with self._starting:
            pool = self._pools.get(key)
            if pool is None or pool.closed:
                pool = _KubePool(self, shape, image, requests)
                self._pools[key] = pool
            if len(pool.created) < shape.replicas:
                await pool.ensure_pods()
        return await pool.run(command, env, on_start)

    def forget(self, pool: _KubePool) -> None:
        if self._pools.get(pool.key) is pool:
            del self._pools[pool.key]

    def connected(self) -> dict[str, list[str]]:
        """Each pool's connected pods, by environment name (for tests and logs)."""
        return {p.shape.name: sorted(p.pods) for p in self._pools.values()}

    def pod_names(self) -> dict[str, list[str]]:
        """Each pool's pods as placed, by environment name."""
        return {p.shape.name: p.names for p in self._pools.values()}

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            hello = json.loads(await reader.readline())
            pool = self._pools.get(str(hello["hello"]))
        except (ValueError, KeyError, TypeError, ConnectionError):
            pool = None
            hello = {}
        if pool is None or pool.closed:
            writer.close()  # a pod of a pool torn down (or unknown): it exits
            return
        await pool.attach(_PodConn(str(hello.get("pod") or ""), writer), reader)
        writer.close()

    async def close(self) -> None:
        """Stop every pool and the listener (the worker is stopping)."""
        pools, self._pools = list(self._pools.values()), {}
        for pool in pools:
            if pool.idle is not None:
                pool.idle.cancel()
            await pool.stop()
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(Exception):
                await self._server.wait_closed()
