"""Queue and org commands: ``headway create queue``, ``headway update queue``,
``headway get queues``, ``headway get org``, ``headway update org``.

Every flag is checked on this side with the scheduler core's parsers before anything is
sent, so bad input fails naming the flag and the value and nothing is half-applied.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, TypeVar

import click
import yaml
from headway.scheduler.model import LIMIT_KNOBS, QUEUE_KNOBS, Knob, KnobKind, OrgLimits, QueueSpec

from ._common import settings, with_client
from ._specs import (
    QUEUE_FIELDS,
    UNSET_WORDS,
    knob,
    parse_limit,
    queue_from_entry,
    queue_to_entry,
)

if TYPE_CHECKING:
    from temporalio.client import Client

__all__ = ["create", "get", "update"]

F = TypeVar("F", bound=Callable[..., Any])

_MAX_FLAGS = {
    "max_cpu": "cpu",
    "max_memory": "memory",
    "max_gpu": "gpu",
    "max_ephemeral_storage": "ephemeral_storage",
}
_LIMIT_FLAGS = LIMIT_KNOBS
#: Words on the flags whose value is one of a few (the knob's help lists them).
_CHOICE_KINDS = (KnobKind.priority, KnobKind.algorithm, KnobKind.status)
_QUOTA_HELP = {
    "max_cpu": "Quota on in-flight CPU, e.g. 512 or 500m.",
    "max_memory": "Quota on in-flight memory, e.g. 4Ti.",
    "max_gpu": 'Quota on in-flight GPUs, e.g. 16 or "H200:16".',
    "max_ephemeral_storage": "Quota on in-flight ephemeral storage.",
}


def _knob_options(k: Knob) -> list[Callable[[F], F]]:
    """The flags of one queue knob (none for the name, which is the argument)."""
    if k.kind is KnobKind.name:
        return []
    if k.kind is KnobKind.quota:
        return [click.option("--" + f.replace("_", "-"), help=h) for f, h in _QUOTA_HELP.items()]
    if k.kind is KnobKind.clusters:
        help_ = "A cluster this queue may dispatch to (repeat; default: any healthy one)."
        return [click.option("--cluster", "clusters", multiple=True, help=help_)]
    return [click.option("--" + k.name.replace("_", "-"), help=k.help)]


def _queue_options(f: F) -> F:
    """The policy flags shared by ``create queue`` and ``update queue``, one or more per
    knob of the registry (``QUEUE_KNOBS``), in its order."""
    options = [o for k in QUEUE_KNOBS for o in _knob_options(k)]
    for option in reversed(options):
        f = option(f)
    return f


def _apply_flags(entry: dict[str, Any], flags: Mapping[str, Any]) -> dict[str, Any]:
    """The queue ``entry`` (human notation) with the given flags applied."""
    out = dict(entry)
    for key in (k.name for k in QUEUE_KNOBS if k.kind in _CHOICE_KINDS):
        if flags.get(key) is not None:
            out[key] = flags[key]
    for key in _LIMIT_FLAGS:
        if flags.get(key) is not None:
            out[key] = knob(flags[key])
    quota = dict(out.get("max_resources") or {})
    for flag, resource in _MAX_FLAGS.items():
        value = flags.get(flag)
        if value is None:
            continue
        if str(value).lower() in UNSET_WORDS:
            quota.pop(resource, None)
        else:
            quota[resource] = value
    out["max_resources"] = quota or None
    if flags.get("clusters"):
        out["clusters"] = list(flags["clusters"])
    return out


def _checked(entry: Mapping[str, Any], *, from_flags: bool = True) -> QueueSpec:
    """The queue ``entry`` as a spec, or a usage error naming the flag (or, for YAML from
    ``--edit``, the field) and the value."""
    try:
        return queue_from_entry(entry)
    except ValueError as exc:
        msg = str(exc)
        if from_flags:
            # "max_resources.cpu: 'x' is not..." reads best as the flag the user typed.
            for flag, resource in _MAX_FLAGS.items():
                msg = _reword(msg, f"max_resources.{resource}", flag)
            for key in QUEUE_FIELDS:
                msg = _reword(msg, key, key)
        raise click.BadParameter(msg) from None


def _reword(msg: str, field: str, flag: str) -> str:
    option = "--" + flag.replace("_", "-")
    if msg.startswith(f"{field}:") or msg.startswith(f"{field}["):
        return option + msg[len(field) :]
    return msg


async def fetch_queues(client: Client, tenant: str) -> dict[str, dict[str, Any]]:
    """Per queue: ``{"spec": QueueSpec.to_dict(), "waiting": ..., "running": ...}``; empty
    while the tenant's scheduler has not started (no queue exists yet)."""
    from headway.workflows import client as hw
    from temporalio.service import RPCError, RPCStatusCode

    try:
        return await hw.get_queues(client, tenant)
    except RPCError as exc:
        if exc.status == RPCStatusCode.NOT_FOUND:
            return {}
        raise


# --- create / update / get groups -------------------------------------------------------


@click.group()
def create() -> None:
    """Create a resource (queue)."""


@click.group()
def update() -> None:
    """Update a resource (queue, org) live; work in flight is never killed."""


@click.group()
def get() -> None:
    """Show resources (queues, org)."""


@create.command("queue")
@click.argument("name")
@_queue_options
@click.pass_context
def create_queue(ctx: click.Context, /, name: str, **flags: Any) -> None:
    """Create the queue NAME with the policy given by the flags."""
    cfg = settings(ctx)
    spec = _checked(_apply_flags({"name": name}, flags))

    async def go(client: Client) -> None:
        from headway.workflows import client as hw

        if name in await fetch_queues(client, cfg.tenant):
            raise click.ClickException(
                f"queue {name!r} already exists; change it with `headway update queue {name}`"
            )
        await hw.upsert_queue(client, cfg.tenant, spec.to_dict())

    with_client(cfg, go)
    click.echo(f"queue {name!r} created")


@update.command("queue")
@click.argument("name")
@_queue_options
@click.option("--clear-cluster", is_flag=True, help="Let the queue use any healthy cluster.")
@click.option("--edit", is_flag=True, help="Edit the queue as YAML in $EDITOR.")
@click.pass_context
def update_queue(
    ctx: click.Context, /, name: str, clear_cluster: bool, edit: bool, **flags: Any
) -> None:
    """Change the queue NAME live: only the flags given change."""
    cfg = settings(ctx)
    if clear_cluster and flags.get("clusters"):
        raise click.BadParameter("--cluster and --clear-cluster contradict each other")
    _checked(_apply_flags({"name": name}, flags))  # bad flags fail before any round trip

    async def go(client: Client) -> bool:
        from headway.workflows import client as hw

        current = (await fetch_queues(client, cfg.tenant)).get(name)
        if current is None:
            raise click.ClickException(f"queue {name!r} does not exist (see `headway get queues`)")
        old = QueueSpec.from_dict(current["spec"])
        entry = _apply_flags(queue_to_entry(old), flags)
        if clear_cluster:
            entry["clusters"] = None
        if edit:
            entry = _edit(entry)
        new = _checked(entry, from_flags=not edit)
        if new.name != name:
            raise click.BadParameter(f"name: a queue cannot be renamed ({name!r} -> {new.name!r})")
        before, after = old.to_dict(), new.to_dict()
        # The update takes the changed fields in the file notation (None unsets a knob).
        human = queue_to_entry(new)
        changes = {k: human[k] for k, v in after.items() if k != "name" and before.get(k) != v}
        if changes:
            await hw.update_queue(client, cfg.tenant, name, changes)
        return bool(changes)

    changed = with_client(cfg, go)
    click.echo(f"queue {name!r} updated" if changed else f"queue {name!r} unchanged")


def _edit(entry: dict[str, Any]) -> dict[str, Any]:
    text = yaml.safe_dump(
        {k: entry.get(k) for k in QUEUE_FIELDS}, sort_keys=False, default_flow_style=False
    )
    edited = click.edit(text, extension=".yaml")
    if edited is None:  # editor closed without saving
        return entry
    try:
        data = yaml.safe_load(edited)
    except yaml.YAMLError as exc:
        raise click.BadParameter(f"--edit: not valid YAML: {exc}") from None
    if not isinstance(data, dict):
        raise click.BadParameter("--edit: expected a mapping of queue fields")
    return data


def _emit_structured(data: Any, output: str) -> bool:
    """Print ``data`` as JSON or YAML when asked; False means the caller draws a table."""
    if output == "json":
        click.echo(json.dumps(data, indent=2))
    elif output == "yaml":
        click.echo(yaml.safe_dump(data, sort_keys=False), nl=False)
    else:
        return False
    return True


def _output_option(f: F) -> F:
    return click.option(
        "-o",
        "--output",
        type=click.Choice(["table", "yaml", "json"]),
        default="table",
        show_default=True,
    )(f)


@get.command("queues")
@_output_option
@click.pass_context
def get_queues(ctx: click.Context, output: str) -> None:
    """List the tenant's queues with their policy."""
    cfg = settings(ctx)
    queues = with_client(cfg, lambda c: fetch_queues(c, cfg.tenant))
    entries = [
        {
            **queue_to_entry(QueueSpec.from_dict(q["spec"])),
            **{k: v for k, v in q.items() if k != "spec"},
        }
        for q in queues.values()
    ]
    if _emit_structured(entries, output):
        return
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"queues of tenant {cfg.tenant!r}")
    # Names are what people grep for: never cut them; narrow terminals fold the rest.
    widest = max((len(e["name"]) for e in entries), default=4)
    table.add_column("name", no_wrap=True, min_width=widest)
    for col in (
        "priority",
        "algorithm",
        "concurrency run/action/per-run",
        "depth",
        "max_resources",
        "clusters",
        "status",
        "waiting",
        "running",
    ):
        table.add_column(col, overflow="fold")
    for e in entries:
        conc = "/".join(
            _show(e[k]) for k in ("run_concurrency", "action_concurrency", "per_run_concurrency")
        )
        quota = ", ".join(f"{k}={v}" for k, v in (e["max_resources"] or {}).items()) or "-"
        table.add_row(
            e["name"],
            e["priority"],
            e["algorithm"],
            conc,
            _show(e["depth"]),
            quota,
            ", ".join(e["clusters"]) if e["clusters"] is not None else "any",
            e["status"],
            str(e.get("waiting", "-")),
            str(e.get("running", "-")),
        )
    Console().print(table)


def _show(value: Any) -> str:
    return "∞" if value is None else str(value)


# --- org ----------------------------------------------------------------------------------

_ORG_LIMITS = ("max_concurrent_runs", "max_concurrent_actions", "max_actions_per_run")


async def _fetch_org(client: Client, tenant: str) -> OrgLimits | None:
    """The tenant's current org limits, or None if this control plane cannot tell."""
    from headway.workflows import client as hw

    reader = getattr(hw, "get_org", None)
    if reader is None:
        return None
    return OrgLimits.from_dict(await reader(client, tenant))


@get.command("org")
@_output_option
@click.pass_context
def get_org(ctx: click.Context, output: str) -> None:
    """Show every org-wide limit of the tenant against its default."""
    cfg = settings(ctx)
    org = with_client(cfg, lambda c: _fetch_org(c, cfg.tenant))
    if org is None:
        raise click.ClickException("this control plane does not expose its org limits yet")
    current, defaults = org.to_dict(), OrgLimits().to_dict()
    if _emit_structured(current, output):
        return
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"org limits of tenant {cfg.tenant!r}")
    for col in ("limit", "value", "default"):
        table.add_column(col)
    for key, value in current.items():
        table.add_row(key, _show_org(value), _show_org(defaults[key]))
    Console().print(table)


def _show_org(value: Any) -> str:
    if isinstance(value, Mapping):
        return f"{value['per_second']}/s, burst {value['burst']}"
    return _show(value)


@update.command("org")
@click.option("--max-concurrent-runs", help="Runs in flight across queues ('unlimited' unsets).")
@click.option("--max-concurrent-actions", help="Actions in flight across queues.")
@click.option("--max-actions-per-run", help="Fan-out: actions one run may submit.")
@click.option("--submit-rate", help="Submissions per second ('unlimited' unsets).")
@click.option("--submit-burst", help="Submission burst (default: the rate, at least 1).")
@click.pass_context
def update_org(ctx: click.Context, /, **flags: Any) -> None:
    """Change the tenant's org-wide limits; only the flags given change."""
    cfg = settings(ctx)
    limits: dict[str, int | None] = {}
    for key in _ORG_LIMITS:
        if flags[key] is not None:
            try:
                limits[key] = parse_limit(flags[key], f"--{key.replace('_', '-')}")
            except ValueError as exc:
                raise click.BadParameter(str(exc)) from None
    rate, burst = flags["submit_rate"], flags["submit_burst"]
    unset_rate = rate is not None and rate.lower() in UNSET_WORDS
    per_s = None if rate is None or unset_rate else _number(rate, "--submit-rate")
    burst_n = None if burst is None else _number(burst, "--submit-burst")
    if per_s is not None and per_s <= 0:
        raise click.BadParameter(f"--submit-rate: {rate!r} must be more than 0")
    if burst_n is not None and burst_n < 1:
        raise click.BadParameter(f"--submit-burst: {burst!r} must be at least 1")

    async def go(client: Client) -> bool:
        from headway.workflows import client as hw

        current = await _fetch_org(client, cfg.tenant)
        entry = (current or OrgLimits()).to_dict()
        entry.update(limits)
        if unset_rate:
            entry["submit_rate"] = None
        elif per_s is not None or burst_n is not None:
            old = entry.get("submit_rate") or {}
            rate_now = per_s if per_s is not None else old.get("per_second")
            if rate_now is None:
                raise click.BadParameter("--submit-burst needs --submit-rate (none is set)")
            entry["submit_rate"] = {
                "per_second": rate_now,
                "burst": burst_n if burst_n is not None else old.get("burst", max(1.0, rate_now)),
            }
        await hw.set_org(client, cfg.tenant, entry)
        return current is not None

    merged = with_client(cfg, go)
    click.echo("org limits updated" if merged else "org limits set (limits not given: unlimited)")


def _number(value: str, flag: str) -> float:
    try:
        return float(value)
    except ValueError:
        raise click.BadParameter(f"{flag}: {value!r} is not a number") from None
