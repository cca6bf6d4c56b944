"""The connection flags of ``headway`` (the ``temporal`` CLI's names), turned into the
:class:`~headway.connection.ConnectionOptions` every sub-command connects with.

The flags have no click ``envvar``: :func:`headway.connection.load` reads the
environment and the config file itself, so the CLI, the SDK and the workers resolve the
same settings the same way.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import click
from headway import connection
from headway.connection import ConnectionSettingsError

from ._common import Settings

F = TypeVar("F", bound=Callable[..., Any])


def _env(name: str) -> str:
    return " / ".join(connection.ENV[name])


_OPTIONS: list[Callable[[F], F]] = [
    click.option(
        "--address",
        default=None,
        help=f"Temporal frontend host:port. [env {_env('address')}; default "
        f"{connection.DEFAULT_ADDRESS}]",
    ),
    click.option(
        "--namespace",
        default=None,
        help="Temporal namespace (default: the tenant's, from tenant-namespaces, else "
        f"'default'). [env {_env('namespace')}]",
    ),
    click.option(
        "--tls/--no-tls",
        "tls",
        default=None,
        help="Connect with TLS (on by default once a TLS file or an API key is given). "
        f"[env {_env('tls')}]",
    ),
    click.option(
        "--tls-ca-path",
        default=None,
        help=f"CA certificate (PEM) the server's is checked against. [env {_env('tls_ca_path')}]",
    ),
    click.option(
        "--tls-cert-path",
        default=None,
        help=f"Client certificate (PEM) for mutual TLS. [env {_env('tls_cert_path')}]",
    ),
    click.option(
        "--tls-key-path",
        default=None,
        help=f"Client certificate's private key (PEM). [env {_env('tls_key_path')}]",
    ),
    click.option(
        "--tls-server-name",
        default=None,
        help="Server name to check the server's certificate for (and send as SNI). "
        f"[env {_env('tls_server_name')}]",
    ),
    click.option(
        "--api-key",
        default=None,
        help="API key, sent as 'authorization: Bearer ...' (never printed). Prefer the "
        f"env var or the config file's api-key-file. [env {_env('api_key')}]",
    ),
    click.option(
        "--config",
        "config",
        default=None,
        type=click.Path(dir_okay=False),
        help="Connection config file (YAML: these settings with '-' names, api-key-file, "
        f"tenant-namespaces, profiles). [env {connection.CONFIG_ENV}]",
    ),
    click.option(
        "--profile",
        default=None,
        help=f"Profile of the config file to use over its top level. [env {connection.PROFILE_ENV}]",
    ),
]

#: The keyword arguments those options give the command.
OPTION_NAMES = (
    "address",
    "namespace",
    "tls",
    "tls_ca_path",
    "tls_cert_path",
    "tls_key_path",
    "tls_server_name",
    "api_key",
    "config",
    "profile",
)


def connection_options(f: F) -> F:
    """Add the connection flags to a click command."""
    for option in reversed(_OPTIONS):
        f = option(f)
    return f


def settings_from_options(
    ctx: click.Context, given: Mapping[str, Any], *, tenant: str, ui_url: str | None
) -> Settings:
    """The :class:`Settings` of the flags in ``given``: the environment and config file
    fill what they leave out, and the tenant's namespace is taken from the mapping.
    A wrong setting is a usage error naming it."""
    try:
        base = connection.load(**{k: given.get(k) for k in OPTION_NAMES})
        opts = base.for_tenant(tenant)
    except ConnectionSettingsError as exc:
        raise click.UsageError(str(exc), ctx) from None
    return Settings(
        address=opts.address,
        namespace=opts.namespace,
        tenant=tenant,
        ui_url=ui_url,
        connection=base,
    )
