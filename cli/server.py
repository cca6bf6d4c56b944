"""``headway server start``: a real Temporal server (``temporal server start-dev``) on a
durable SQLite file, with Headway's search attributes registered."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from types import FrameType

import click
from headway import protocol

from ._common import (
    DEFAULT_PORT,
    DEFAULT_UI_PORT,
    port_in_use,
    resolve_data_dir,
    temporal_binary,
    ui_hint,
)

__all__ = ["check_ports", "server", "server_argv", "wait_for_port"]


def server_argv(
    data_dir: Path,
    *,
    port: int = DEFAULT_PORT,
    ui_port: int = DEFAULT_UI_PORT,
    ip: str = "127.0.0.1",
    headless: bool = False,
    log_level: str = "warn",
) -> list[str]:
    """The command line of a dev server that keeps its state in ``data_dir``."""
    argv = [
        temporal_binary(),
        "server",
        "start-dev",
        "--db-filename",
        str(data_dir / "temporal.db"),
        "--ip",
        ip,
        "--port",
        str(port),
        "--log-level",
        log_level,
    ]
    if headless:
        argv.append("--headless")
    else:
        argv += ["--ui-port", str(ui_port), "--ui-disable-news-fetch"]
    for name, kind in protocol.SEARCH_ATTRIBUTES.items():
        argv += ["--search-attribute", f"{name}={kind}"]
    for kv in protocol.SERVER_DYNAMIC_CONFIG:  # tenant fairness (protocol.tenant_priority)
        argv += ["--dynamic-config-value", kv]
    return argv


def check_ports(ports: dict[str, int], ip: str = "127.0.0.1") -> None:
    """Fail before starting anything if a port we need is taken (the dev server itself
    would only say so deep in its log)."""
    for flag, port in ports.items():
        if port_in_use(port, ip):
            raise click.ClickException(
                f"port {port} ({flag}) is already in use on {ip}: is another Temporal "
                f"server or `headway up` running? Stop it, or pass {flag} with a free port."
            )


def wait_for_port(
    port: int, proc: subprocess.Popen[bytes], timeout_s: float = 60.0, ip: str = "127.0.0.1"
) -> bool:
    """Wait until ``proc`` accepts connections on ``port``; False if it died or timed out."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            return False
        try:
            with socket.create_connection((ip, port), timeout=0.5):
                return True
        except OSError:
            time.sleep(0.1)
    return False


@click.group()
def server() -> None:
    """Run the Temporal server Headway lives on."""


@server.command("start")
@click.option(
    "--data-dir",
    envvar="HEADWAY_DATA_DIR",
    default=None,
    help="Where the server keeps its SQLite file. [env HEADWAY_DATA_DIR; default ./.headway]",
)
@click.option("--port", default=DEFAULT_PORT, show_default=True, help="Temporal gRPC port.")
@click.option("--ui-port", default=DEFAULT_UI_PORT, show_default=True, help="Web UI port.")
@click.option("--ip", default="127.0.0.1", show_default=True, help="Address to bind.")
@click.option("--headless", is_flag=True, help="No Web UI.")
def start(data_dir: str | None, port: int, ui_port: int, ip: str, headless: bool) -> None:
    """Start a Temporal dev server on a durable SQLite file, until Ctrl-C."""
    ports = {"--port": port} if headless else {"--port": port, "--ui-port": ui_port}
    check_ports(ports, ip)
    directory = resolve_data_dir(data_dir)
    argv = server_argv(directory, port=port, ui_port=ui_port, ip=ip, headless=headless)
    proc = subprocess.Popen(argv)

    def forward(signum: int, _frame: FrameType | None) -> None:
        # The server shuts down cleanly on SIGINT/SIGTERM; we wait for it below.
        if proc.poll() is None:
            proc.send_signal(signum)

    previous = {s: signal.signal(s, forward) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        if wait_for_port(port, proc, ip=ip):
            ui = "" if headless else f", Web UI http://localhost:{ui_port}"
            click.echo(
                f"Temporal server on {ip}:{port}{ui} (state in {directory / 'temporal.db'})."
                " Ctrl-C stops it.",
                err=True,
            )
            hint = None if headless else ui_hint(port, ui_port)
            if hint:
                click.echo(hint, err=True)
        code = proc.wait()
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
    # SIGINT/SIGTERM-initiated shutdowns are a clean stop, not a failure.
    if code not in (0, -signal.SIGINT, -signal.SIGTERM):
        raise click.ClickException(f"the Temporal server exited with code {code}")
    sys.stdout.flush()
