"""The processes of a fault run, each in its own process group so ``kill -9`` takes a
whole process (and anything it started) down at once, as a node failure or an OOM kill
of a pod would.

Every process appends to its own log across restarts (``<data>/logs/<name>.log``), with a
banner line per start, so the evidence of a defect spans incarnations.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from headway.cli.server import server_argv

__all__ = [
    "Event",
    "Proc",
    "Supervisor",
    "freeze_code",
    "headway_argv",
    "server_command",
    "start_server",
    "wait_for_port",
]


#: What of the checkout a run's processes import: the package, not its tests or tools.
_NOT_CODE = {".git", ".venv", "tests", "bench", "docs", "build", "headway.egg-info"}


def freeze_code(dest: Path) -> Path:
    """Copy the package as it is now to ``dest/headway`` and return ``dest``, for the
    run's processes to import (``PYTHONPATH``, ahead of the editable install's finder).

    A process restarted by a fault imports the code again: in a checkout others edit
    while the run goes on, the restarted control plane would replay histories its
    predecessor wrote with other code, and report their nondeterminism as Headway's.
    Frozen, every incarnation runs the code the run started with (in CI, the same code).
    """
    root = Path(__file__).resolve().parents[2]
    target = dest / "headway"
    for path in root.rglob("*"):
        rel = path.relative_to(root)
        if rel.parts[0] in _NOT_CODE or "__pycache__" in rel.parts or not path.is_file():
            continue
        if path.suffix not in (".py", ".yaml", ".typed"):
            continue
        out = target / rel
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_bytes(path.read_bytes())
    return dest


def headway_argv(*args: str) -> list[str]:
    """``headway ARGS`` run by this interpreter (the checkout's package, whatever PATH says)."""
    return [sys.executable, "-m", "headway.cli", *args]


@dataclass
class Event:
    """Something the supervisor did or saw, with its wall-clock time (the pod log and the
    Temporal histories are stamped with the same clock)."""

    t: float
    what: str  # start | kill | exit (died on its own) | stop
    name: str
    detail: str = ""


@dataclass
class Proc:
    """One supervised process and how to start it again."""

    name: str
    argv: list[str]
    env: dict[str, str]
    log: Path
    popen: subprocess.Popen[bytes] | None = None
    starts: int = 0
    #: Set while the supervisor itself took it down, so its exit is not unplanned.
    expected_down: bool = False

    @property
    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def tail(self, lines: int = 30) -> str:
        try:
            text = self.log.read_text(errors="replace").splitlines()
        except OSError:
            return ""
        return "\n".join(text[-lines:])


@dataclass
class Supervisor:
    """Starts, kills (SIGKILL to the group) and restarts the run's processes."""

    data_dir: Path
    #: Environment of every process (each adds its own).
    env: dict[str, str] = field(default_factory=dict)
    events: list[Event] = field(default_factory=list)
    procs: dict[str, Proc] = field(default_factory=dict)
    clock: Callable[[], float] = time.time

    def add(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> Proc:
        logs = self.data_dir / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        proc = Proc(name, argv, dict(env or {}), logs / f"{name}.log")
        self.procs[name] = proc
        return proc

    def start(self, name: str) -> Proc:
        proc = self.procs[name]
        assert not proc.alive, f"{name} is already running"
        proc.starts += 1
        with proc.log.open("ab") as handle:
            handle.write(f"\n===== start #{proc.starts} at {self.clock():.3f} =====\n".encode())
            handle.flush()
            proc.popen = subprocess.Popen(
                proc.argv,
                stdin=subprocess.DEVNULL,
                stdout=handle,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                env={**os.environ, **self.env, **proc.env},
            )
        proc.expected_down = False
        self.events.append(Event(self.clock(), "start", name, f"pid {proc.popen.pid}"))
        return proc

    def kill9(self, name: str) -> None:
        """SIGKILL the process group of ``name`` and reap it: nothing runs any cleanup."""
        proc = self.procs[name]
        assert proc.popen is not None
        proc.expected_down = True
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.popen.pid, signal.SIGKILL)
        t = self.clock()
        proc.popen.wait(timeout=30)
        self.events.append(Event(t, "kill", name, f"pid {proc.popen.pid}"))

    def stop(self, name: str, timeout_s: float = 20.0) -> None:
        """SIGTERM (a graceful stop), then SIGKILL whatever is left of the group."""
        proc = self.procs[name]
        if proc.popen is None:
            return
        proc.expected_down = True
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.popen.pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.popen.wait(timeout=timeout_s)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.popen.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.popen.wait(timeout=5)
        self.events.append(Event(self.clock(), "stop", name))

    def stop_all(self) -> None:
        # Newest first and the server last, as `headway up` stops its stack.
        for name in reversed(list(self.procs)):
            self.stop(name)

    def unplanned_exits(self) -> list[Proc]:
        """Processes that exited without the supervisor taking them down (each reported
        once, as an ``exit`` event)."""
        out = []
        for proc in self.procs.values():
            if proc.popen is not None and not proc.expected_down and not proc.alive:
                proc.expected_down = True  # reported now; a restart clears it
                self.events.append(
                    Event(self.clock(), "exit", proc.name, f"code {proc.popen.returncode}")
                )
                out.append(proc)
        return out


def server_command(data_dir: Path, port: int) -> list[str]:
    """The dev server on ``data_dir/temporal.db``: restarting it with the same command
    reopens the same SQLite file, as an operator's restart would."""
    return server_argv(data_dir, port=port, headless=True)


def start_server(sup: Supervisor, name: str, port: int, timeout_s: float = 90.0) -> None:
    """Start (or restart) the dev server and wait until it accepts connections.

    ``temporal server start-dev`` picks its internal ports itself and binds them a moment
    later, so a start can lose them to another process ("address already in use"); that
    is the server's race, not a fault of the run, so such a start is tried again.
    """
    for attempt in range(3):
        proc = sup.start(name)
        if wait_for_port(port, proc, timeout_s):
            return
        raced = not proc.alive and "address already in use" in proc.tail()
        if not raced or attempt == 2:
            raise RuntimeError(f"the Temporal server did not come up on {port}:\n{proc.tail()}")
        proc.expected_down = True
    raise AssertionError("unreachable")


def wait_for_port(port: int, proc: Proc, timeout_s: float) -> bool:
    """Until something accepts on ``port`` (False if ``proc`` died or time ran out)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not proc.alive:
            return False
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return True
        except OSError:
            time.sleep(0.1)
    return False
