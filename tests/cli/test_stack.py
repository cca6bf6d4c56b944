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


@pytest.mark.parametrize(
    ("message", "expected_starts"),
    [
        # Lost on every attempt: reported after the last one.
        (RACE, 3),
        # Not the race: not retried (trying again would fail the same way).
        ("unable to open database file", 1),
    ],
    ids=["kept-losing-the-race-reported-after-the-last-attempt", "other-failure-reported-at-once"],
)
def test_a_server_that_does_not_come_up_is_reported_with_its_log(
    tmp_path: Path, message: str, expected_starts: int
):
    port = free_port()
    stack = Stack(tmp_path, f"127.0.0.1:{port}", None)
    try:
        with pytest.raises(click.ClickException) as err:
            start_server(stack, fake_argv(tmp_path, 5, message, port), port, timeout_s=30)
        assert starts(tmp_path) == expected_starts
        assert f"did not come up on port {port}" in err.value.message
        assert message in err.value.message
    finally:
        stack.stop(timeout_s=5)
