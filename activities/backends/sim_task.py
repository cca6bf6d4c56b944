"""Task code on the simulated backend: an SDK task's pod runs its function for real.

A pod whose command is the SDK's entrypoint (``python -m headway.sdk.run ...``, what
:mod:`headway.sdk` puts in every task's pod spec, and what a Kubernetes pod runs in the
environment's image) is run by the simulated cluster as a fresh process of the worker's
own interpreter instead of a sleep. The process gets the pod's environment (for a
replicated gang ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR`` and
``MASTER_PORT``, as torchrun's rendezvous expects) and ``HEADWAY_OUTPUT_FILE``, where the
entrypoint writes its outcome as one JSON document (``{"ok": true, "output": ...}`` or
``{"ok": false, "error": {"type", "message", "traceback"}}``); on Kubernetes the same
document goes to the container's termination message. Its stdout and stderr go to
``<pod>.log`` next to that file.

A task of a reusable environment (its command carries ``--pool NAME`` and the pool's
shape, :class:`headway.ReusePolicy`) does not get a fresh process: it is sent to the
environment's pool, ``replicas`` long-lived processes of ``python -m headway.sdk.run
--serve`` started by its first task, each running up to ``concurrency`` calls at a time
(the least busy one takes the next call; more wait for a slot). Each call carries its
pod's environment (``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``, ... and the action's own
variables, as a fresh process gets them): the pool process gives each call its own
``os.environ`` (see :func:`headway.sdk.run.serve`). A pool left without a
call for its ``idle_ttl`` is torn down: its processes are told to stop (stdin closed)
and are killed if they do not. Its processes' output goes to ``pool-<name>-<i>.log``.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import itertools
import json
import os
import signal
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

__all__ = [
    "OUTPUT_FILE_ENV",
    "POOLS",
    "TASK_ENTRYPOINT",
    "PoolShape",
    "TaskOutcome",
    "ask_member",
    "is_task_command",
    "master_port",
    "outcome_of",
    "pool_shape",
    "run_task_process",
]

#: The module an SDK task's pod runs (``python -m headway.sdk.run``).
TASK_ENTRYPOINT = "headway.sdk.run"
#: Where the entrypoint writes its outcome document.
OUTPUT_FILE_ENV = "HEADWAY_OUTPUT_FILE"


def is_task_command(command: list[str]) -> bool:
    """Whether a pod's command is the SDK's task entrypoint."""
    return len(command) >= 3 and command[1] == "-m" and command[2] == TASK_ENTRYPOINT


def master_port(action_id: str) -> int:
    """A rendezvous port for a gang's replicas, the same for each of them (29500 and up,
    as torchrun's default, spread by action so gangs on one machine do not collide)."""
    return 29500 + int(hashlib.sha256(action_id.encode()).hexdigest()[:6], 16) % 20000


@dataclass
class TaskOutcome:
    """How a task process ended: ``ok``, its exit code, a one-line message, and the
    outcome document (the JSON text the entrypoint wrote, None when it wrote none)."""

    ok: bool
    exit_code: int
    message: str
    document: str | None


def outcome_of(exit_code: int, output_file: Path, log_file: Path) -> TaskOutcome:
    """Read a finished task process's outcome from its output file (and log tail)."""
    try:
        text = output_file.read_text()
        doc = json.loads(text)
    except (OSError, ValueError):
        text, doc = None, None
    if isinstance(doc, dict) and doc.get("ok") is True and exit_code == 0:
        return TaskOutcome(True, 0, "Completed", text)
    if isinstance(doc, dict) and isinstance(doc.get("error"), dict):
        err = doc["error"]
        message = f"{err.get('type', 'Error')}: {err.get('message', '')}".rstrip(": ")
        return TaskOutcome(False, exit_code or 1, message, text)
    try:
        tail = log_file.read_text(errors="replace").strip().splitlines()[-5:]
    except OSError:
        tail = []
    detail = f"; its log ({log_file}) ends with: " + " | ".join(tail) if tail else ""
    return TaskOutcome(
        False, exit_code or 1, f"the task process exited with code {exit_code}{detail}", None
    )


async def run_task_process(
    command: list[str], env: dict[str, str], output_file: Path, log_file: Path
) -> TaskOutcome:
    """Run the entrypoint of ``command`` with this interpreter until it exits (a task of a
    reusable environment: in its pool's processes, see :class:`_Pool`).

    Cancelled (the pod deleted or preempted), it kills the process's whole group first.
    """
    output_file.parent.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(FileNotFoundError):
        output_file.unlink()
    shape = pool_shape(command)
    if shape is not None:
        call_env = {**env, OUTPUT_FILE_ENV: str(output_file)}
        return await POOLS.run(shape, command, call_env, output_file, log_file)
    argv = [sys.executable, *command[1:]]
    with log_file.open("ab") as log:
        proc = await asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            env={**os.environ, **env, OUTPUT_FILE_ENV: str(output_file)},
            start_new_session=True,
        )
    try:
        code = await proc.wait()
    except asyncio.CancelledError:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        with contextlib.suppress(Exception):
            await asyncio.shield(proc.wait())
        raise
    return outcome_of(code, output_file, log_file)


# --- warm environments: pools of long-lived task processes ---------------------------------


@dataclass(frozen=True)
class PoolShape:
    """A reusable environment's pool as its tasks' commands declare it. Tasks of one
    tenant's environment share a pool only if they declare the very same shape and
    process environment."""

    tenant: str
    name: str
    replicas: int
    concurrency: int
    idle_ttl: float
    env: tuple[str, ...]


def _flag(command: list[str], name: str) -> str | None:
    for i, arg in enumerate(command[:-1]):
        if arg == name:
            return command[i + 1]
    return None


def pool_shape(command: list[str]) -> PoolShape | None:
    """The pool a task's command runs in, None for a task of its own process."""
    name = _flag(command, "--pool")
    if name is None or not is_task_command(command):
        return None
    try:
        return PoolShape(
            tenant=_flag(command, "--tenant") or "default",
            name=name,
            replicas=max(1, int(_flag(command, "--pool-replicas") or 1)),
            concurrency=max(1, int(_flag(command, "--pool-concurrency") or 1)),
            idle_ttl=max(0.0, float(_flag(command, "--pool-idle-ttl") or 0.0)),
            env=tuple(command[i + 1] for i, a in enumerate(command[:-1]) if a == "--env"),
        )
    except ValueError:
        return None  # not a shape: run it in a fresh process


class _Replica:
    """One process of a pool and the calls it runs."""

    def __init__(self, proc: asyncio.subprocess.Process, log: Path) -> None:
        self.proc = proc
        self.log = log
        self.calls: dict[str, asyncio.Future[int]] = {}
        self.reader: asyncio.Task[None] | None = None
        #: Its output ended: the process is gone, even before it is reaped.
        self.eof = False

    async def read_answers(self) -> None:
        assert self.proc.stdout is not None
        while line := await self.proc.stdout.readline():
            try:
                msg = json.loads(line)
                fut = self.calls.pop(str(msg["id"]), None)
            except (ValueError, KeyError, TypeError):
                continue
            if fut is not None and not fut.done():
                fut.set_result(int(msg.get("code", 1)))
        # The process is gone: no call is given to it from now on (reaping it can take
        # a while under load), and its calls in flight end as a process that died would.
        self.eof = True
        code = await self.proc.wait()
        for fut in self.calls.values():
            if not fut.done():
                fut.set_result(code if code else 1)
        self.calls.clear()

    @property
    def live(self) -> bool:
        """Its answers are still read (a call given to it now is answered, or ended
        with the process's exit code)."""
        return self.reader is not None and not self.reader.done() and not self.eof

    def send(self, msg: Mapping[str, Any]) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write((json.dumps(msg) + "\n").encode())


class _Pool:
    """The processes of one warm environment on this cluster (see the module docstring)."""

    def __init__(self, shape: PoolShape, log_dir: Path) -> None:
        self.shape = shape
        self.log_dir = log_dir
        self.replicas: list[_Replica] = []
        self.busy = 0
        self.turn = 0
        self.changed = asyncio.Condition()
        self.idle: asyncio.Task[None] | None = None
        self.closed = False

    @property
    def pids(self) -> list[int]:
        return [r.proc.pid for r in self.replicas]

    @property
    def usable(self) -> bool:
        """Not torn down, and a process of it still runs (one killed from outside, or
        crashed, ends its calls in flight as a process that exits does)."""
        return not self.closed and any(r.live for r in self.replicas)

    async def start(self) -> None:
        for i in range(self.shape.replicas):
            log = self.log_dir / f"pool-{_safe(self.shape.name)}-{i}.log"
            with log.open("ab") as fh:
                proc = await asyncio.create_subprocess_exec(
                    sys.executable,
                    "-m",
                    TASK_ENTRYPOINT,
                    "--serve",
                    stdin=asyncio.subprocess.PIPE,
                    stdout=asyncio.subprocess.PIPE,
                    stderr=fh,
                    start_new_session=True,
                )
            replica = _Replica(proc, log)
            replica.reader = asyncio.get_running_loop().create_task(replica.read_answers())
            self.replicas.append(replica)

    async def _slot(self) -> _Replica:
        """The least busy live replica with a free slot (ties in turn), once there is one."""
        async with self.changed:
            while True:
                live = [r for r in self.replicas if r.live]
                if not live:
                    raise RuntimeError(f"the processes of pool {self.shape.name!r} are gone")
                free = [r for r in live if len(r.calls) < self.shape.concurrency]
                if free:
                    least = min(len(r.calls) for r in free)
                    ties = [r for r in free if len(r.calls) == least]
                    self.turn += 1
                    return ties[self.turn % len(ties)]
                await self.changed.wait()

    async def run(
        self, command: list[str], env: dict[str, str], output_file: Path, log_file: Path
    ) -> TaskOutcome:
        if self.idle is not None:
            self.idle.cancel()
            self.idle = None
        self.busy += 1
        try:
            replica = await self._slot()
            rid = f"c{next(_IDS)}"
            fut: asyncio.Future[int] = asyncio.get_running_loop().create_future()
            replica.calls[rid] = fut
            with log_file.open("a") as log:
                log.write(
                    f"runs in pool {self.shape.name!r}, process {replica.proc.pid}"
                    f" (its output: {replica.log})\n"
                )
            msg = {"id": rid, "argv": command[3:], "output": str(output_file), "env": env}
            code = await ask_member(replica.send, replica.calls, msg, fut, self.changed)
            return outcome_of(code, output_file, replica.log)
        finally:
            self.busy -= 1
            if self.busy == 0 and not self.closed:
                self.idle = asyncio.get_running_loop().create_task(self._expire())

    async def _expire(self) -> None:
        await asyncio.sleep(self.shape.idle_ttl)
        if self.busy == 0:
            POOLS.forget(self)
            await self.stop()

    async def stop(self) -> None:
        """Tear the pool down: stdin closed (the processes stop), killed after 5 s."""
        self.closed = True
        for r in self.replicas:
            if r.proc.stdin is not None:
                with contextlib.suppress(Exception):
                    r.proc.stdin.close()
        for r in self.replicas:
            try:
                await asyncio.wait_for(asyncio.shield(r.proc.wait()), 5.0)
            except TimeoutError:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(r.proc.pid, signal.SIGKILL)
                with contextlib.suppress(Exception):
                    await r.proc.wait()


_T = TypeVar("_T")


async def ask_member(
    send: Callable[[Mapping[str, Any]], None],
    calls: dict[str, asyncio.Future[_T]],
    msg: dict[str, Any],
    fut: asyncio.Future[_T],
    changed: asyncio.Condition,
    sent: Callable[[], None] | None = None,
) -> _T:
    """One call to a pool member (a sim process, a Kubernetes pool pod): ``msg`` sent
    (then ``sent()``), its answer awaited; cancelled, the member is told to cancel it.
    Either way the pool's ``changed`` is notified: the member has a slot again."""
    rid = str(msg["id"])
    send(msg)
    if sent is not None:
        sent()
    try:
        return await asyncio.shield(fut)
    except asyncio.CancelledError:
        calls.pop(rid, None)
        with contextlib.suppress(Exception):
            send({"cancel": rid})
        raise
    finally:
        async with changed:
            changed.notify_all()


def _safe(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name)[:100]


_IDS = itertools.count(1)


class Pools:
    """Every pool of this worker process, by shape."""

    def __init__(self) -> None:
        self._pools: dict[PoolShape, _Pool] = {}
        self._starting = asyncio.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None

    async def run(
        self,
        shape: PoolShape,
        command: list[str],
        env: dict[str, str],
        output_file: Path,
        log_file: Path,
    ) -> TaskOutcome:
        loop = asyncio.get_running_loop()
        if self._loop is not loop:
            # Pools belong to the loop that started them (their pipes do): a backend run
            # on another loop (a test's) starts its own.
            self._pools, self._starting, self._loop = {}, asyncio.Lock(), loop
        pool = self._pools.get(shape)
        if pool is None or not pool.usable:
            async with self._starting:
                pool = self._pools.get(shape)
                if pool is None or not pool.usable:
                    if pool is not None:
                        self.forget(pool)
                        await pool.stop()  # what is left of it
                    pool = _Pool(shape, log_file.parent)
                    await pool.start()
                    self._pools[shape] = pool
        return await pool.run(command, env, output_file, log_file)

    def forget(self, pool: _Pool) -> None:
        if self._pools.get(pool.shape) is pool:
            del self._pools[pool.shape]

    def pids(self) -> dict[str, list[int]]:
        """Each usable pool's processes, by environment name (for tests and logs): a
        pool whose processes all ended is left out as soon as it has seen them end."""
        return {s.name: p.pids for s, p in self._pools.items() if p.usable}

    async def close(self) -> None:
        """Stop every pool (the worker is stopping)."""
        pools, self._pools = list(self._pools.values()), {}
        for pool in pools:
            if pool.idle is not None:
                pool.idle.cancel()
            await pool.stop()


#: This worker process's pools.
POOLS = Pools()
