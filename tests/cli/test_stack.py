"""The stack's server start: a dev server that loses its own port race is started again;
any other failure is reported at once, with the end of its log."""

from __future__ import annotations

import sys
from pathlib import Path

import click
import pytest
from headway.cli._common import free_port
from headway.cli._stack import Stack, start_server

# A stand-in for `temporal server start-dev`: it counts its starts in a file, fails the
# first `fail_times` of them with `message`, and after that listens on the port.
FAKE_SERVER = """
import socket, sys, time
count_file, fail_times, message, port = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
try:
    n = int(open(count_file).read())
except FileNotFoundError:
    n = 0
open(count_file, "w").write(str(n + 1))
if n < fail_times:
    print(message, flush=True)
    sys.exit(1)
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", port))
s.listen()
time.sleep(60)
"""

RACE = "listen tcp 127.0.0.1:36289: bind: address already in use"


def fake_argv(tmp_path: Path, fail_times: int, message: str, port: int) -> list[str]:
    script = tmp_path / "fake_server.py"
    script.write_text(FAKE_SERVER)
    return [
        sys.executable,
        str(script),
        str(tmp_path / "starts"),
        str(fail_times),
        message,
        str(port),
    ]


def starts(tmp_path: Path) -> int:
    return int((tmp_path / "starts").read_text())


@pytest.mark.parametrize(
    ("fail_times", "expected_starts"),
    [(0, 1), (1, 2), (2, 3)],
    ids=["up-at-once", "lost-the-port-race-once-then-up", "lost-it-twice-then-up-on-the-last-try"],
)
def test_a_server_that_lost_its_port_race_is_started_again(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], fail_times: int, expected_starts: int
):
    port = free_port()
    stack = Stack(tmp_path, f"127.0.0.1:{port}", None)
    try:
        server = start_server(
            stack, fake_argv(tmp_path, fail_times, RACE, port), port, timeout_s=30
        )
        assert server.alive
        assert starts(tmp_path) == expected_starts
        # Only the live server is supervised: a dead first try is not the stack's failure.
        assert stack.children == [server]
        assert stack.failed() is None
        err = capsys.readouterr().err
        assert err.count("lost a port race") == expected_starts - 1
    finally:
        stack.stop(timeout_s=5)


def test_a_server_that_keeps_losing_the_race_is_reported_after_the_last_attempt(tmp_path: Path):
    port = free_port()
    stack = Stack(tmp_path, f"127.0.0.1:{port}", None)
    try:
        with pytest.raises(click.ClickException) as err:
            start_server(stack, fake_argv(tmp_path, 5, RACE, port), port, timeout_s=30, attempts=3)
        assert starts(tmp_path) == 3
        assert f"did not come up on port {port}" in err.value.message
        assert "address already in use" in err.value.message
    finally:
        stack.stop(timeout_s=5)


def test_any_other_failure_is_reported_at_once_with_the_log(tmp_path: Path):
    port = free_port()
    stack = Stack(tmp_path, f"127.0.0.1:{port}", None)
    try:
        with pytest.raises(click.ClickException) as err:
            start_server(
                stack,
                fake_argv(tmp_path, 1, "unable to open database file", port),
                port,
                timeout_s=30,
            )
        assert starts(tmp_path) == 1  # not retried: trying again would fail the same way
        assert "unable to open database file" in err.value.message
    finally:
        stack.stop(timeout_s=5)
