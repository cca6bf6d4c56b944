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
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import os
import signal
import sys
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "OUTPUT_FILE_ENV",
    "TASK_ENTRYPOINT",
    "TaskOutcome",
    "is_task_command",
    "master_port",
    "outcome_of",
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
    """Run the entrypoint of ``command`` with this interpreter until it exits.

    Cancelled (the pod deleted or preempted), it kills the process's whole group first.
    """
    output_file.parent.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(FileNotFoundError):
        output_file.unlink()
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
