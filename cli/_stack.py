"""The embedded default as child processes: a Temporal server, the control-plane worker
and one cluster worker per fleet cluster, each in its own process group.

Children run in their own sessions so a terminal's Ctrl-C reaches only the supervisor,
which then stops them in order (workers first, the server last) and makes sure every
process group is gone before it returns.

A worker that dies while the stack runs (killed, crashed) is started again with the same
command line and environment, saying so on stderr in one line: the control plane and the
cluster workers pick up where they were (their state is in the store, Temporal and the
sim state directory). One that died :data:`MAX_DEATHS` times within
:data:`DEATH_WINDOW_S` is crash-looping, and the Temporal server's death leaves nothing to
serve: either stops the whole stack (:class:`StackFailed`).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import click
from headway.scheduler.model import OrgLimits
from headway.scheduler.scenario import Fleet

from ._common import cluster_names, load_fleet
from .server import check_ports, server_argv, wait_for_port

__all__ = ["Child", "Stack", "StackFailed", "running_stack", "start_server"]

#: The name of the Temporal server's child: its death stops the stack (nothing restarts it).
SERVER = "temporal-server"
#: A worker that died this many times within :data:`DEATH_WINDOW_S` is not restarted again.
MAX_DEATHS = 4
DEATH_WINDOW_S = 60.0


class StackFailed(click.ClickException):
    """A child the stack cannot do without died: the stack stops (exit 1)."""


@dataclass
class Child:
    """One supervised process (the leader of its own process group)."""

    name: str
    proc: subprocess.Popen[bytes]
    log: Path
    #: The command line and full environment it was started with (a restart reuses them).
    argv: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    #: When it died (monotonic seconds), within the last :data:`DEATH_WINDOW_S`.
    deaths: deque[float] = field(default_factory=deque)

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None

    def tail(self, lines: int = 20) -> str:
        """The end of this child's log, for error messages."""
        try:
            text = self.log.read_text(errors="replace").splitlines()
        except OSError:
            return ""
        return "\n".join(text[-lines:])


@dataclass
class Stack:
    """The processes of one ``headway up``."""

    data_dir: Path
    address: str
    ui_url: str | None
    children: list[Child] = field(default_factory=list)

    def spawn(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> Child:
        log = self.data_dir / "logs" / f"{name}.log"
        full_env = {**local_env(), **(env or {})}
        child = Child(name, _popen(argv, full_env, log), log, list(argv), full_env)
        self.children.append(child)
        return child

    def failed(self) -> Child | None:
        """The first child that exited on its own, if any."""
        return next((c for c in self.children if not c.alive), None)

    def supervise(self, now: float | None = None) -> list[Child]:
        """Restart every worker that died since the last call (same argv and environment,
        its log appended to), one line on stderr each; returns those restarted.

        Raises:
            StackFailed: the Temporal server died, or a worker died for the
                :data:`MAX_DEATHS`-th time within :data:`DEATH_WINDOW_S`.
        """
        restarted = []
        for child in self.children:
            if child.alive:
                continue
            code = child.proc.returncode
            if child.name == SERVER:
                raise StackFailed(
                    f"the Temporal server exited with code {code}; stopping the stack (the"
                    f" workers cannot run without it). Its log ({child.log}) ends with:\n"
                    f"{child.tail()}"
                )
            at = time.monotonic() if now is None else now
            child.deaths.append(at)
            while child.deaths and child.deaths[0] <= at - DEATH_WINDOW_S:
                child.deaths.popleft()
            if len(child.deaths) >= MAX_DEATHS:
                raise StackFailed(
                    f"{child.name} died {len(child.deaths)} times within "
                    f"{DEATH_WINDOW_S:.0f} s (last exit code {code}); stopping the stack."
                    f" Its log ({child.log}) ends with:\n{child.tail()}"
                )
            with contextlib.suppress(OSError), child.log.open("a") as note:
                note.write(f"--- headway up: exited with code {code}; restarting ---\n")
            # Whatever the dead child left in its process group goes with it (as at stop).
            _signal_group(child.proc.pid, signal.SIGKILL)
            child.proc = _popen(child.argv, child.env, child.log)
            restarted.append(child)
            click.echo(
                f"headway: {child.name} exited with code {code}; restarted it as pid"
                f" {child.proc.pid} ({len(child.deaths)} of {MAX_DEATHS - 1} restarts allowed"
                f" within {DEATH_WINDOW_S:.0f} s)",
                err=True,
            )
        return restarted

    def stop(self, timeout_s: float = 20.0) -> None:
        """Stop every child: SIGTERM each group, newest first, then SIGKILL stragglers."""
        for child in reversed(self.children):
            _signal_group(child.proc.pid, signal.SIGTERM)
            deadline = time.monotonic() + timeout_s
            with contextlib.suppress(subprocess.TimeoutExpired):
                child.proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        for child in self.children:
            # Whatever a child left in its group (or a child that ignored SIGTERM) goes now.
            _signal_group(child.proc.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                child.proc.wait(timeout=5)


def _popen(argv: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    """Start ``argv`` in a session of its own, its output appended to ``log``."""
    log.parent.mkdir(parents=True, exist_ok=True)
    handle: IO[bytes] = log.open("ab")
    try:
        return subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=handle,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env=env,
        )
    finally:
        handle.close()  # the child holds its own copy


def local_env() -> dict[str, str]:
    """This process's environment without the connection settings: the stack's server is
    local and plain (one namespace, no TLS), whatever the user's shell points at."""
    from headway import connection

    drop = {v for names in connection.ENV.values() for v in names}
    drop |= {connection.CONFIG_ENV, connection.PROFILE_ENV, connection.TENANT_NAMESPACES_ENV}
    return {k: v for k, v in os.environ.items() if k not in drop}


def _signal_group(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def _headway(*args: str) -> list[str]:
    # The same interpreter and package as this process, whatever PATH says.
    return [sys.executable, "-m", "headway.cli", *args]


# What the Temporal CLI prints when a port it wanted was taken before it could bind it.
_BIND_RACE = "address already in use"


def start_server(
    stack: Stack, argv: list[str], port: int, *, timeout_s: float = 90.0, attempts: int = 3
) -> Child:
    """Spawn the Temporal dev server and wait until it accepts connections on ``port``.

    ``temporal server start-dev`` picks its internal ports (membership, history,
    matching) itself: it finds a free one, lets it go, and binds it a moment later, so
    another process starting at the same time can take it first and the server exits
    with "bind: address already in use". That race is the server's, not the user's, so a
    start that dies of it is retried (a few times, on the same data directory); any other
    failure, and the last attempt's, is reported with the end of the server's log.

    Raises:
        click.ClickException: the server did not come up.
    """
    for attempt in range(1, attempts + 1):
        server = stack.spawn(SERVER, argv)
        if wait_for_port(port, server.proc, timeout_s=timeout_s):
            return server
        tail = server.tail()
        raced = not server.alive and _BIND_RACE in tail
        if not raced or attempt == attempts:
            raise click.ClickException(
                f"the Temporal server did not come up on port {port}; its log "
                f"({server.log}) ends with:\n{tail}"
            )
        # A dead child would otherwise be reported by ``Stack.failed`` as the stack's failure.
        stack.children.remove(server)
        click.echo(
            f"headway: the Temporal server lost a port race at start ({_BIND_RACE}); "
            f"starting it again (attempt {attempt + 1} of {attempts})",
            err=True,
        )
    raise AssertionError("unreachable")  # the loop returns or raises


@contextlib.contextmanager
def running_stack(
    data_dir: Path,
    *,
    fleet_path: str | None = None,
    port: int = 7233,
    ui_port: int = 8233,
    headless: bool = False,
    database_url: str | None = None,
    tenant: str = "default",
    server_timeout_s: float = 90.0,
    metrics_ports: list[int] | None = None,
) -> Iterator[Stack]:
    """Start the whole stack, yield it, and stop every process on the way out."""
    fleet = load_fleet(fleet_path)
    ports = {"--port": port} if headless else {"--port": port, "--ui-port": ui_port}
    check_ports(ports)
    address = f"127.0.0.1:{port}"
    stack = Stack(data_dir, address, None if headless else f"http://localhost:{ui_port}")
    try:
        start_server(
            stack,
            server_argv(data_dir, port=port, ui_port=ui_port, headless=headless),
            port,
            timeout_s=server_timeout_s,
        )
        common = ["--address", address, "--tenant", tenant]
        fleet_args = ["--fleet", str(Path(fleet_path).resolve())] if fleet_path else []
        db_args = ["--database-url", database_url] if database_url else []
        # Scrape ports: the control plane's first, then one per cluster worker.
        scrape: list[list[str]] = [["--metrics-port", str(p)] for p in metrics_ports or []]
        scrape += [[]] * (1 + len(cluster_names(fleet)) - len(scrape))
        stack.spawn(
            "control-plane",
            _headway(*common, "worker", "control-plane", *fleet_args, *db_args, *scrape[0]),
        )
        # The simulated clusters keep their pods in the data directory, so a cluster
        # worker that dies and restarts resumes them instead of losing or rerunning them.
        sim = ["--backend", "sim", "--state-dir", str(data_dir / "sim-state")]
        for i, name in enumerate(cluster_names(fleet)):
            stack.spawn(
                f"cluster-{name}",
                _headway(
                    *common, "worker", "cluster", "--name", name, *sim, *fleet_args, *scrape[i + 1]
                ),
            )
        yield stack
    finally:
        stack.stop()


async def _connect_when_healthy(stack: Stack, options: Any, deadline: float) -> Any:
    """A client of the stack's server, once its frontend answers: the port opens before
    the frontend is healthy ("Frontend is not healthy yet"), longer on a loaded machine.

    Raises :class:`click.ClickException` if the server exits first or ``deadline``
    (the loop's clock) passes.
    """
    import asyncio

    loop = asyncio.get_running_loop()
    while True:
        try:
            return await options.connect(interceptors=[])
        except RuntimeError as err:
            dead = stack.failed()
            if dead is not None:
                raise click.ClickException(
                    f"{dead.name} exited with code {dead.proc.returncode}; its log"
                    f" ({dead.log}) ends with:\n{dead.tail()}"
                ) from None
            if loop.time() >= deadline:
                raise click.ClickException(
                    f"the Temporal server at {stack.address} did not become ready: {err}"
                ) from None
            await asyncio.sleep(0.2)


async def wait_ready(
    stack: Stack,
    fleet: Fleet,
    *,
    tenant: str = "default",
    namespace: str = "default",
    timeout_s: float = 90.0,
) -> None:
    """Wait until the control plane and every cluster worker poll their task queues, then
    start the tenant's scheduler with the fleet and create the fleet's queues it lacks.

    Raises :class:`click.ClickException` with the failing child's log if one exits first.
    """
    import asyncio

    from headway import protocol
    from headway.connection import ConnectionOptions
    from headway.workflows import client as hw
    from temporalio.api.enums.v1 import TaskQueueType
    from temporalio.api.taskqueue.v1 import TaskQueue
    from temporalio.api.workflowservice.v1 import DescribeTaskQueueRequest

    from .queues import fetch_queues

    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    client = await _connect_when_healthy(
        stack, ConnectionOptions(stack.address, namespace), deadline
    )
    wanted = [(protocol.CONTROL_TASK_QUEUE, TaskQueueType.TASK_QUEUE_TYPE_WORKFLOW)] + [
        (protocol.cluster_task_queue(c.name), TaskQueueType.TASK_QUEUE_TYPE_ACTIVITY)
        for c in fleet.clusters
    ]
    while wanted:
        dead = stack.failed()
        if dead is not None:
            raise click.ClickException(
                f"{dead.name} exited with code {dead.proc.returncode}; its log ({dead.log}) "
                f"ends with:\n{dead.tail()}"
            )
        queue, kind = wanted[0]
        resp = await client.workflow_service.describe_task_queue(
            DescribeTaskQueueRequest(
                namespace=namespace, task_queue=TaskQueue(name=queue), task_queue_type=kind
            )
        )
        if resp.pollers:
            wanted.pop(0)
            continue
        if loop.time() >= deadline:
            raise click.ClickException(
                f"no worker polls task queue {queue!r} yet; see {stack.data_dir / 'logs'}"
            )
        await asyncio.sleep(0.2)

    # Queues changed live since an earlier `up` keep their changes: only missing ones are
    # created from the file.
    await hw.ensure_scheduler(client, tenant, list(fleet.clusters))
    existing = await fetch_queues(client, tenant)
    for spec in fleet.queues:
        if spec.name not in existing:
            await hw.upsert_queue(
                client,
                tenant,
                spec.to_dict(),
                list(fleet.clusters),
                by=hw.changed_by("fleet", "headway up"),
            )
    if fleet.org != OrgLimits():
        await hw.set_org(
            client, tenant, fleet.org.to_dict(), by=hw.changed_by("fleet", "headway up")
        )
