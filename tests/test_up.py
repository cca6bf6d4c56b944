"""`headway up` starts the whole stack as child processes and Ctrl-C (SIGINT) or SIGTERM
stops every one of them: nothing is left behind."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
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
