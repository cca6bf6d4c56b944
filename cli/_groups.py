"""The verb groups of ``headway VERB NOUN`` (kubectl's order), defined once so each noun's
module adds its commands to the same groups."""

from __future__ import annotations

import click

__all__ = ["create", "delete", "describe", "drain", "get", "resume", "update"]


@click.group()
def create() -> None:
    """Create a resource (queue, cluster)."""


@click.group()
def update() -> None:
    """Update a resource (queue, org) live; work in flight is never killed."""


@click.group()
def get() -> None:
    """List resources, or show one (queues, queue, actions, clusters, org)."""


@click.group()
def describe() -> None:
    """Show one resource in detail (queue, action, cluster)."""


@click.group()
def delete() -> None:
    """Remove a resource (queue) that holds no work."""


@click.group()
def drain() -> None:
    """Stop a resource taking new work (queue); what it holds still runs."""


@click.group()
def resume() -> None:
    """Let a drained or draining resource take work again (queue)."""
