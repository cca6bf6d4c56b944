"""`headway up` supervises its children: a worker that dies is started again with the same
command line and environment, one line on stderr; a crash loop (four deaths within 60 s)
or the Temporal server's death stops the stack with a clear message."""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

import pytest
from headway.cli._stack import DEATH_WINDOW_S, MAX_DEATHS, SERVER, Stack, StackFailed
from headway.cli.up import address_hint

# Prints its argv and one variable of its environment, then sleeps.
SLEEPER = (
    "import os, sys, time; print(sys.argv[1:], os.environ.get('PROBE'), flush=True); time.sleep(60)"
)


def sleeper(stack: Stack, name: str) -> None:
    stack.spawn(name, [sys.executable, "-c", SLEEPER, "--name", name], {"PROBE": f"env-{name}"})


def kill9(stack: Stack, name: str) -> int:
    child = next(c for c in stack.children if c.name == name)
    pid = child.proc.pid
    os.kill(pid, signal.SIGKILL)
    child.proc.wait(timeout=10)
    return pid


def wait_lines(log: Path, count: int) -> list[str]:
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        lines = [ln for ln in log.read_text().splitlines() if ln.startswith("[")]
        if len(lines) >= count:
            return lines
        time.sleep(0.05)
    raise AssertionError(log.read_text())


def test_a_dead_worker_is_restarted_with_the_same_argv_and_env(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
):
    stack = Stack(tmp_path, "127.0.0.1:1", None)
    try:
        sleeper(stack, "control-plane")
        sleeper(stack, "cluster-a")
        wait_lines(tmp_path / "logs" / "cluster-a.log", 1)
        assert stack.supervise() == []
        old = kill9(stack, "cluster-a")

        restarted = stack.supervise()

        assert [c.name for c in restarted] == ["cluster-a"]
        child = restarted[0]
        assert child.alive and child.proc.pid != old
        assert [c.name for c in stack.children] == ["control-plane", "cluster-a"]
        first, second = wait_lines(child.log, 2)
        assert first == second == "['--name', 'cluster-a'] env-cluster-a"
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1, err
        assert "cluster-a exited with code -9; restarted it" in err[0]
        assert stack.failed() is None
    finally:
        stack.stop(timeout_s=5)
    assert all(not c.alive for c in stack.children)


def test_four_deaths_within_the_window_stop_the_stack(tmp_path: Path):
    stack = Stack(tmp_path, "127.0.0.1:1", None)
    try:
        sleeper(stack, "control-plane")
        t0 = 1000.0
        for i in range(MAX_DEATHS - 1):
            kill9(stack, "control-plane")
            assert len(stack.supervise(now=t0 + i)) == 1
        kill9(stack, "control-plane")
        with pytest.raises(StackFailed) as err:
            stack.supervise(now=t0 + MAX_DEATHS)
        assert f"control-plane died {MAX_DEATHS} times within 60 s" in err.value.message
        assert "exit code -9" in err.value.message
        assert err.value.exit_code == 1
    finally:
        stack.stop(timeout_s=5)


def test_deaths_spread_beyond_the_window_keep_being_restarted(tmp_path: Path):
    stack = Stack(tmp_path, "127.0.0.1:1", None)
    try:
        sleeper(stack, "cluster-a")
        for i in range(MAX_DEATHS + 2):
            kill9(stack, "cluster-a")
            assert len(stack.supervise(now=1000.0 + i * (DEATH_WINDOW_S / 2 + 1))) == 1
    finally:
        stack.stop(timeout_s=5)


def test_the_servers_death_stops_the_stack(tmp_path: Path):
    stack = Stack(tmp_path, "127.0.0.1:1", None)
    try:
        sleeper(stack, SERVER)
        sleeper(stack, "control-plane")
        kill9(stack, SERVER)
        with pytest.raises(StackFailed) as err:
            stack.supervise()
        assert "the Temporal server exited with code -9; stopping the stack" in err.value.message
    finally:
        stack.stop(timeout_s=5)


@pytest.mark.parametrize(
    ("address", "port", "current", "hinted"),
    [
        ("127.0.0.1:7233", 7233, "localhost:7233", False),
        ("127.0.0.1:7233", 7233, "127.0.0.1:7233", False),
        ("127.0.0.1:17233", 17233, "localhost:7233", True),
        # This shell points elsewhere (its HEADWAY_TEMPORAL_ADDRESS): others may too.
        ("127.0.0.1:7233", 7233, "temporal.example:7233", True),
    ],
)
def test_up_tells_other_shells_the_address_off_the_default(
    address: str, port: int, current: str, hinted: bool
):
    hint = address_hint(address, port, current)
    if hinted:
        assert hint is not None
        assert f"export HEADWAY_TEMPORAL_ADDRESS={address}" in hint
    else:
        assert hint is None
