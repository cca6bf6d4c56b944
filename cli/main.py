"""The ``headway`` console command (verb-noun: ``headway create queue``)."""

from __future__ import annotations

import contextlib
import os
import sys

import click
from headway import __version__, protocol

# clusters and queues add their commands to the verb groups when imported.
from . import clusters, queues  # noqa: F401
from ._common import UI_URL_ENV, check_name
from ._connection import connection_options, settings_from_options
from ._groups import create, delete, describe, drain, get, resume, update
from .actions import cancel
from .completion import completion
from .insight import forecast, what_if
from .review import export, review
from .server import server
from .submit import submit, why
from .top import top
from .up import up
from .worker import worker

__all__ = ["cli", "main"]


#: Shown under ``headway --help``: what scripts can rely on.
EPILOG = """\b
Exit codes:
  0  done
  1  an error: server unreachable, resource missing, request refused,
     action not found or not ended in time (one line on stderr says which)
  2  a usage error: a bad flag or value (named, with the value)
  3  submit: refused by policy (unknown queue, draining, at its depth)
  4  submit: rate limited (retry after the time it says)
\b
Reads take -o table|wide|json|yaml (--json is -o json); quantities are in
Kubernetes units (500m, 64Gi). Completion: headway completion bash|zsh|fish."""


def _check_ui_url(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    if value is None or value == "":
        return None
    if not value.startswith(("http://", "https://")) or len(value) < 10:
        raise click.UsageError(f"--ui-url: {value!r} is not an http(s) URL", ctx)
    return value.rstrip("/")


def _check_tenant(ctx: click.Context, param: click.Parameter, value: str) -> str:
    try:
        return check_name(value, "--tenant")
    except click.BadParameter as exc:
        # The message names the flag already; click would name it a second time.
        raise click.UsageError(exc.message, ctx) from None


@click.group(
    context_settings={"help_option_names": ["-h", "--help"], "show_default": True},
    epilog=EPILOG,
)
@connection_options
@click.option(
    "--tenant",
    default=protocol.DEFAULT_TENANT,
    show_default=True,
    callback=_check_tenant,
    help="Headway tenant (shard).",
)
@click.option(
    "--ui-url",
    envvar=UI_URL_ENV,
    default=None,
    callback=_check_ui_url,
    help="Temporal Web UI base URL for links (default: the --address port + 1000). "
    f"[env {UI_URL_ENV}]",
)
@click.version_option(__version__, prog_name="headway")
@click.pass_context
def cli(ctx: click.Context, /, tenant: str, ui_url: str | None, **conn: str | bool | None) -> None:
    """Headway decides when and where AI and batch work runs on a fleet of Kubernetes
    clusters: queues with priority, concurrency, quotas and cluster routing, on Temporal."""
    ctx.obj = settings_from_options(ctx, conn, tenant=tenant, ui_url=ui_url)


for command in (
    server,
    worker,
    up,
    create,
    update,
    get,
    describe,
    drain,
    resume,
    delete,
    cancel,
    top,
    submit,
    why,
    forecast,
    what_if,
    completion,
    export,
    review,
):
    cli.add_command(command)

try:
    from headway.cli.demo import demo
except ImportError:  # pragma: no cover - only while the demo is being written
    pass
else:
    cli.add_command(demo)

try:
    from headway.cli.simulate import simulate
except ImportError:  # pragma: no cover - until `headway simulate` lands
    pass
else:
    cli.add_command(simulate)


def main() -> None:
    """Console entry point: run the CLI, then leave without interpreter teardown.

    A short-lived process that used the Temporal client can abort while the interpreter
    tears down its native runtime (sdk-python issue 300), turning a success into a crash.
    Every event loop is closed by the time click returns, so we flush and ``os._exit``.
    Only this entry point does so; ``CliRunner`` tests call ``cli`` directly.
    """
    try:
        cli.main(prog_name="headway")
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        if isinstance(exc.code, str):
            print(exc.code, file=sys.stderr)
    telemetry = sys.modules.get("headway.telemetry")
    if telemetry is not None:  # os._exit skips atexit: the submit's spans go out first
        telemetry.flush()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
    os._exit(code)
