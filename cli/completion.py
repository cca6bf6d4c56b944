"""``headway completion bash|zsh|fish`` and the completers of queue, cluster and action
names.

The script is click's own: the shell calls ``headway`` back with ``_HEADWAY_COMPLETE``
set, and click completes commands and flags itself. Names of queues, clusters and actions
come from the server the command line points at (its ``--address``, ``--namespace``,
``--tenant``), within a short deadline; when it cannot answer, nothing is offered rather
than the shell hanging or printing an error.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

import click
from click.shell_completion import CompletionItem
from headway import protocol

from ._common import Settings
from ._connection import settings_from_options

if TYPE_CHECKING:
    from temporalio.client import Client

__all__ = [
    "COMPLETE_VAR",
    "complete_actions",
    "complete_clusters",
    "complete_in_flight",
    "complete_queues",
    "completion",
]

#: The variable the completion scripts set when they call ``headway`` back.
COMPLETE_VAR = "_HEADWAY_COMPLETE"
#: How long a completion may wait for the server.
DEADLINE_S = 2.0

SHELLS = ("bash", "zsh", "fish")


@click.command("completion")
@click.argument("shell", type=click.Choice(SHELLS))
def completion(shell: str) -> None:
    """Print the completion script of SHELL: commands, flags, and the names of queues,
    clusters and actions (asked of the server).

    \b
    Enable it with:
      bash:  eval "$(headway completion bash)"    (in ~/.bashrc)
      zsh:   eval "$(headway completion zsh)"     (in ~/.zshrc)
      fish:  headway completion fish > ~/.config/fish/completions/headway.fish
    """
    from click.shell_completion import get_completion_class

    cls = get_completion_class(shell)
    if cls is None:  # click ships all three; kept for a click without one
        raise click.ClickException(f"SHELL: {shell!r} has no completion in this click")
    root = click.get_current_context().find_root().command
    click.echo(cls(root, {}, "headway", COMPLETE_VAR).source())


def _settings(ctx: click.Context) -> Settings:
    """The group's options as typed so far (completion runs no group callback)."""
    params = ctx.find_root().params
    tenant = params.get("tenant") or protocol.DEFAULT_TENANT
    return settings_from_options(ctx, params, tenant=tenant, ui_url=None)


def _ask(ctx: click.Context, names: Callable[[Client, str], Awaitable[list[str]]]) -> list[str]:
    try:
        cfg = _settings(ctx)
    except click.UsageError:  # a completion offers nothing rather than failing the shell
        return []

    async def go() -> list[str]:
        client = await cfg.options().connect(interceptors=[])
        return await names(client, cfg.tenant)

    try:
        return asyncio.run(asyncio.wait_for(go(), DEADLINE_S))
    except Exception:  # a completion offers nothing rather than failing the shell
        return []


def _items(found: list[str], incomplete: str) -> list[CompletionItem]:
    return [CompletionItem(n) for n in sorted(set(found)) if n.startswith(incomplete)]


def complete_queues(
    ctx: click.Context, param: click.Parameter, incomplete: str
) -> list[CompletionItem]:
    """The tenant's queue names."""

    async def names(client: Client, tenant: str) -> list[str]:
        from headway.workflows import client as hw

        return list(await hw.get_queues(client, tenant))

    return _items(_ask(ctx, names), incomplete)


def complete_clusters(
    ctx: click.Context, param: click.Parameter, incomplete: str
) -> list[CompletionItem]:
    """The clusters of the tenant's fleet."""

    async def names(client: Client, tenant: str) -> list[str]:
        from headway.workflows import client as hw

        fleet = await hw.get_fleet(client, tenant)
        return [str(c) for c in fleet.get("clusters") or []]

    return _items(_ask(ctx, names), incomplete)


def _actions(in_flight: bool) -> Callable[[Client, str], Awaitable[list[str]]]:
    async def names(client: Client, tenant: str) -> list[str]:
        from headway.workflows import client as hw

        rows = await hw.list_actions(client, tenant, in_flight=in_flight, limit=200)
        return [r.action_id for r in rows]

    return names


def complete_actions(
    ctx: click.Context, param: click.Parameter, incomplete: str
) -> list[CompletionItem]:
    """The tenant's latest actions (any state)."""
    return _items(_ask(ctx, _actions(False)), incomplete)


def complete_in_flight(
    ctx: click.Context, param: click.Parameter, incomplete: str
) -> list[CompletionItem]:
    """The tenant's actions still in flight (what ``cancel`` can act on)."""
    return _items(_ask(ctx, _actions(True)), incomplete)
