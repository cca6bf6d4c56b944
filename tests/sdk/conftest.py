"""The embedded default for SDK tests: the control plane and one simulated cluster worker
per cluster of the bundled fleet (its queues, production and backfill included), as
`headway worker ...` child processes on the session's Temporal dev server; and a way to
run an SDK program as its own interpreter against it."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from headway.cli._common import free_port, load_fleet
from headway.cli._stack import Stack, running_stack, wait_ready

UI = "http://ui.test:8233"


@pytest.fixture(scope="package")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    # Its own Temporal server, as `headway up` starts one: a Headway deployment is one
    # Temporal namespace and one store. On the session's shared server, the tenant's
    # scheduler workflow would be the one earlier packages started, and its door (the
    # settings every submission is decided against) would be in their stores, not this
    # one's: every submission would pass the door here.
    data_dir = tmp_path_factory.mktemp("sdk")
    with running_stack(
        data_dir,
        port=free_port(),
        headless=True,
        database_url=f"sqlite:///{data_dir / 'headway.db'}",
    ) as s:
        asyncio.run(wait_ready(s, load_fleet(None)))
        yield s


@dataclass
class Program:
    """One finished run of an SDK program."""

    returncode: int
    stdout: str
    stderr: str

    @property
    def lines(self) -> list[str]:
        return self.stdout.strip().splitlines()


def run_program(
    stack: Stack, directory: Path, source: str, *, name: str = "prog.py", timeout: float = 120
) -> Program:
    """Write ``source`` to ``directory/name`` and run it as a script (its own process),
    pointed at ``stack`` by the environment variables the SDK reads."""
    path = directory / name
    path.write_text(textwrap.dedent(source))
    env = {
        **os.environ,
        "HEADWAY_TEMPORAL_ADDRESS": stack.address,
        "HEADWAY_UI_URL": UI,
        "PYTHONUNBUFFERED": "1",
    }
    proc = subprocess.run(
        [sys.executable, str(path)],
        cwd=directory,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    return Program(proc.returncode, proc.stdout, proc.stderr)
