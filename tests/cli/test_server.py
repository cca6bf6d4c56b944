"""`headway server start`: a real dev server on a durable SQLite file in the data directory,
with Headway's search attributes registered, stopped cleanly by Ctrl-C."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from headway import protocol
from headway.cli._common import free_port
from temporalio.api.operatorservice.v1 import ListSearchAttributesRequest
from temporalio.client import Client

pytestmark = pytest.mark.integration


async def _connect(address: str) -> Client:
    for _ in range(300):
        try:
            return await Client.connect(address)
        except Exception:
            await asyncio.sleep(0.2)
    raise AssertionError(f"no server at {address}")


async def test_server_start_registers_search_attributes_in_the_data_dir(tmp_path: Path):
    port, ui_port = free_port(), free_port()
    env = {**os.environ, "HEADWAY_DATA_DIR": str(tmp_path)}  # the env var, not the flag
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "headway.cli",
            "server",
            "start",
            "--port",
            str(port),
            "--ui-port",
            str(ui_port),
        ],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        client = await _connect(f"127.0.0.1:{port}")
        resp = await client.operator_service.list_search_attributes(
            ListSearchAttributesRequest(namespace="default")
        )
        assert set(protocol.SEARCH_ATTRIBUTES) <= set(resp.custom_attributes)
        assert (tmp_path / "temporal.db").exists()

        proc.send_signal(signal.SIGINT)
        out, _ = await asyncio.to_thread(proc.communicate, timeout=60)
        assert proc.returncode == 0, out
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
