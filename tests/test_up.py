"""`headway up` starts the whole stack as child processes and Ctrl-C (SIGINT) or SIGTERM
stops every one of them: nothing is left behind."""

from __future__ import annotations

import os
import queue
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from headway.cli._common import free_port, load_fleet

pytestmark = pytest.mark.integration


def _processes_mentioning(*needles: str) -> dict[int, str]:
    """Live processes whose command line contains any of ``needles``."""
    found: dict[int, str] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z" and any(n in cmd for n in needles):
            found[int(entry.name)] = cmd
    return found


def _start_up(data_dir: Path, port: int, ui_port: int) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "headway.cli",
            "up",
            "--data-dir",
            str(data_dir),
            "--port",
            str(port),
            "--ui-port",
            str(ui_port),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def _wait_until_up(proc: subprocess.Popen[str]) -> str:
    assert proc.stdout is not None
    seen = []
    for line in proc.stdout:
        seen.append(line)
        if line.startswith("Ctrl-C stops everything"):
            return "".join(seen)
    raise AssertionError(f"`headway up` ended before it was up:\n{''.join(seen)}")


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_signal_stops_every_process(tmp_path: Path, sig: signal.Signals):
    port, ui_port = free_port(), free_port()
    marker = f"127.0.0.1:{port}"
    proc = _start_up(tmp_path, port, ui_port)
    try:
        banner = _wait_until_up(proc)
        assert f"Temporal at {marker}" in banner
        assert f"http://localhost:{ui_port}" in banner
        children = _processes_mentioning(marker, str(tmp_path))
        clusters = len(load_fleet(None).clusters)
        # The server, the control plane and one worker per cluster, besides `up` itself.
        assert len(children) - 1 == 2 + clusters, children
        assert (tmp_path / "temporal.db").exists()

        proc.send_signal(sig)
        rest, _ = proc.communicate(timeout=120)
        assert proc.returncode == 0, rest
        assert "Stopped." in rest
        assert _processes_mentioning(marker, str(tmp_path)) == {}
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_up_restarts_on_the_same_data_dir(tmp_path: Path):
    """The SQLite file is durable: a second `up` on the same directory starts cleanly."""
    for _ in range(2):
        port, ui_port = free_port(), free_port()
        proc = _start_up(tmp_path, port, ui_port)
        try:
            _wait_until_up(proc)
            proc.send_signal(signal.SIGINT)
            rest, _ = proc.communicate(timeout=120)
            assert proc.returncode == 0, rest
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    assert _processes_mentioning(str(tmp_path)) == {}


def _lines(proc: subprocess.Popen[str]) -> queue.Queue[str]:
    """``proc``'s output lines as they come (read on a thread: a test waits with a timeout)."""
    lines: queue.Queue[str] = queue.Queue()

    def pump() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.put(line)
        lines.put("")  # EOF

    threading.Thread(target=pump, daemon=True).start()
    return lines


def _wait_for(lines: queue.Queue[str], needle: str, timeout_s: float = 60) -> str:
    seen = []
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            line = lines.get(timeout=max(0.1, deadline - time.monotonic()))
        except queue.Empty:
            break
        seen.append(line)
        if needle in line:
            return "".join(seen)
        if line == "":
            break
    raise AssertionError(f"no {needle!r} in `headway up`'s output:\n{''.join(seen)}")


def _kill9(needle: str) -> int:
    (pid,) = _processes_mentioning(needle)
    os.kill(pid, signal.SIGKILL)
    return pid


def test_a_killed_worker_is_restarted_and_the_servers_death_stops_the_stack(tmp_path: Path):
    """kill -9 of a cluster worker and of the control plane: each is started again (one line
    on stderr) and a submitted action still completes; kill -9 of the Temporal server: the
    stack stops, exit 1, saying why, nothing left behind."""
    port, ui_port = free_port(), free_port()
    marker = f"127.0.0.1:{port}"
    proc = _start_up(tmp_path, port, ui_port)
    lines = _lines(proc)
    try:
        banner = _wait_for(lines, "Ctrl-C stops everything")
        # Not the default port: other shells are told what to set.
        assert f"export HEADWAY_TEMPORAL_ADDRESS={marker}" in banner

        _kill9(f"{marker} --tenant default worker cluster --name cpu ")
        _wait_for(lines, "headway: cluster-cpu exited with code -9; restarted it")
        _kill9(f"{marker} --tenant default worker control-plane")
        _wait_for(lines, "headway: control-plane exited with code -9; restarted it")
        done = subprocess.run(
            [
                *(sys.executable, "-m", "headway.cli", "--address", marker, "submit"),
                *("--cpu", "1", "--duration", "1", "--id", "after-restarts", "--wait"),
            ],
            capture_output=True,
            text=True,
            timeout=180,
        )
        assert done.returncode == 0, done.stdout + done.stderr
        assert "state=succeeded" in done.stdout, done.stdout
        clusters = len(load_fleet(None).clusters)
        assert len(_processes_mentioning(marker, str(tmp_path))) - 1 == 2 + clusters

        _kill9(f"start-dev --db-filename {tmp_path}")
        rest = _wait_for(lines, "the Temporal server exited with code -9; stopping the stack")
        proc.wait(timeout=120)
        assert proc.returncode == 1, rest
        assert "Traceback" not in rest
        assert _processes_mentioning(marker, str(tmp_path)) == {}
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
