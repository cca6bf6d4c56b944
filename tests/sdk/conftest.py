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
from headway.cli._common import load_fleet
from headway.cli._stack import Stack, _headway, wait_ready
from temporalio.testing import WorkflowEnvironment

UI = "http://ui.test:8233"


@pytest.fixture(scope="package")
def stack(
    temporal_env: WorkflowEnvironment, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Stack]:
    address = temporal_env.client.service_client.config.target_host
    data_dir = tmp_path_factory.mktemp("sdk")
    fleet = load_fleet(None)
    s = Stack(data_dir, address, None)
    try:
        common = ["--address", address]
        s.spawn(
            "control-plane",
            _headway(
                *common,
                "worker",
                "control-plane",
                "--database-url",
                f"sqlite:///{data_dir / 'headway.db'}",
            ),
        )
        for c in fleet.clusters:
            s.spawn(
                f"cluster-{c.name}",
                _headway(
                    *common,
                    "worker",
                    "cluster",
                    "--name",
                    c.name,
                    "--backend",
                    "sim",
                    "--state-dir",
                    str(data_dir / "sim-state"),
                ),
            )
        asyncio.run(wait_ready(s, fleet))
        yield s
    finally:
        s.stop()


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
