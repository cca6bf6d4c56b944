"""The SDK and a server that is not there, or went away after it connected: a
``headway.ServerUnreachable`` naming the address, not the transport's ``RPCError``."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import headway
import pytest
from headway.cli._common import free_port, temporal_binary
from headway.cli.server import wait_for_port
from headway.sdk import Client


@pytest.fixture
def server(tmp_path: Path) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """A bare Temporal dev server (no Headway workers), to be killed by the test."""
    port = free_port()
    proc = subprocess.Popen(
        [
            *(temporal_binary(), "server", "start-dev", "--headless", "--ip", "127.0.0.1"),
            *("--port", str(port), "--db-filename", str(tmp_path / "t.db")),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        assert wait_for_port(port, proc, timeout_s=60)
        yield f"127.0.0.1:{port}", proc
    finally:
        proc.kill()
        proc.wait()


async def test_connecting_to_nothing_raises_server_unreachable():
    address = f"127.0.0.1:{free_port()}"
    with pytest.raises(headway.ServerUnreachable) as err:
        await Client.connect(address)
    assert f"cannot reach Temporal at {address}" in str(err.value)
    assert "\n" not in str(err.value)


# Run as its own interpreter: the Temporal client's retries against a dead server leave
# CPython 3.11.7's parser state off in the process that made them ("AST constructor
# recursion depth mismatch" when pytest compiles its next module), so not in pytest's.
GONE = """
import asyncio, os, signal, sys
import headway
from headway.sdk import Client, Resources, Task

from headway.workflows import client as hw

tries = 0
once = hw._submit_once

async def counted(*args):
    global tries
    tries += 1
    return await once(*args)

hw._submit_once = counted

async def main(address, pid):
    client = await Client.connect(address)
    os.kill(pid, signal.SIGKILL)
    for call in (
        lambda: client.why("some-action"),
        lambda: client.with_runcontext(queue="default").submit(Task("t", Resources(cpu=1))),
    ):
        try:
            await call()
        except headway.ServerUnreachable as exc:
            print("ServerUnreachable:", exc, flush=True)
    print("submission tries:", tries, flush=True)

asyncio.run(main(sys.argv[1], int(sys.argv[2])))
import gc; gc.collect()  # an unread failure would be reported now, on stderr
"""


def test_a_server_gone_after_connecting_raises_server_unreachable(
    server: tuple[str, subprocess.Popen[bytes]],
):
    address, proc = server
    done = subprocess.run(
        [sys.executable, "-c", GONE, address, str(proc.pid)],
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    # (The Temporal client logs its retries on stdout.)
    raised = [ln for ln in done.stdout.splitlines() if ln.startswith("ServerUnreachable")]
    assert (
        raised
        == [
            f"ServerUnreachable: address: cannot reach Temporal at '{address}' any more"
            " (tcp connect error); is Headway still up?"
        ]
        * 2
    ), done.stdout[-3000:] + done.stderr[-3000:]
    # The Temporal client retried the connection already: the submission is tried once,
    # not six times more (a minute of silence before the error), and the failure the SDK
    # also set on the start operation was read, not reported as never retrieved.
    assert "submission tries: 1" in done.stdout, done.stdout[-3000:]
    assert "never retrieved" not in done.stderr, done.stderr[-3000:]
