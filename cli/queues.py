"""Queue and org commands: ``headway create queue``, ``update queue``, ``get queues``,
``get queue NAME``, ``describe queue NAME``, ``drain queue``, ``resume queue``, ``get org``,
``update org``.

Every flag is checked on this side with the scheduler core's parsers before anything is
sent, so bad input fails naming the flag and the value and nothing is half-applied.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, TypeVar

import click
import yaml
from headway.scheduler.model import (
    LIMIT_KNOBS,
    QUEUE_KNOBS,
    Knob,
    KnobKind,
    OrgLimits,
    QueueSpec,
    QueueStatus,
    RetryPolicy,
)
from headway.scheduler.resources import Pod

from ._common import Settings, check_name, no_tenant, settings, with_client
from ._groups import create, delete, describe, drain, get, resume, update
from ._output import (
    Block,
    duration,
    emit_structured,
    fmt_cpu,
    fmt_gpu,
    fmt_memory,
    iso,
    limit,
    output_option,
    render_table,
    runtime_option,
)
from ._specs import (
    QUEUE_FIELDS,
    UNSET_WORDS,
    check_limit,
    knob,
    parse_limit,
    queue_from_entry,
    queue_to_entry,
)
from .completion import complete_clusters, complete_queues

if TYPE_CHECKING:
    from headway.scheduler import Scheduler
    from temporalio.client import Client

__all__ = ["create", "delete", "describe", "drain", "fetch_queues", "get", "resume", "update"]

F = TypeVar("F", bound=Callable[..., Any])

_MAX_FLAGS = {
    "max_cpu": "cpu",
    "max_memory": "memory",
    "max_gpu": "gpu",
    "max_ephemeral_storage": "ephemeral_storage",
}
_LIMIT_FLAGS = LIMIT_KNOBS
_SECONDS_FLAGS = tuple(k.name for k in QUEUE_KNOBS if k.kind is KnobKind.seconds)
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
        return [
            click.option(
                "--cluster",
                "clusters",
                multiple=True,
                help=help_,
                shell_complete=complete_clusters,
            )
        ]
    if k.kind is KnobKind.rate:
        return [
            click.option("--submit-rate", help=_RATE_HELP),
            click.option("--submit-burst", help=_BURST_HELP),
        ]
    if k.kind is KnobKind.retry:
        return [
            click.option("--" + flag.replace("_", "-"), help=h) for flag, h in _RETRY_HELP.items()
        ]
    return [click.option("--" + k.name.replace("_", "-"), help=k.help)]


#: The retry policy's flags (``retry_<key>``: its key), each merged into the queue's.
_RETRY_HELP = {
    "retry_oom": "Retries after OOMKilled, each with more memory (default 0).",
    "retry_oom_factor": "Memory multiplied by this per OOM retry (default 2).",
    "retry_oom_max_memory": "Most memory an OOM retry may ask per pod, e.g. 64Gi"
    " ('unlimited' unsets).",
    "retry_lost": "Requeues at the head after Preempted, Evicted, NodeLost, PodLost (default 0).",
    "retry_failed": "Retries after a non-zero exit (default 0).",
    "retry_backoff": "Wait before the first retry of a failure, doubled each next, e.g. 30s"
    " (default 30s).",
    "retry_ready_timeout": "Pods not all running this long after dispatch, e.g. 10m: deleted"
    " and requeued ('unlimited' unsets, the default).",
    "retry_not_ready": "Requeues after a ready timeout before it fails NotReady (default 2).",
}
_RETRY_COUNTS = ("retry_oom", "retry_lost", "retry_failed", "retry_not_ready")


def _retry_flags(old: Mapping[str, Any] | None, flags: Mapping[str, Any]) -> dict[str, Any] | None:
    """The queue's retry policy (file notation) with the ``--retry-*`` flags given on top;
    None when none was given. A count that is not one names its flag and the value."""
    given = {f: flags[f] for f in _RETRY_HELP if flags.get(f) is not None}
    if not given:
        return None
    out = dict(old or {})
    for flag, value in given.items():
        key = flag.removeprefix("retry_")
        if flag in _RETRY_COUNTS:
            name = f"--{flag.replace('_', '-')}"
            try:
                out[key] = int(value)
            except ValueError:
                raise click.BadParameter(f"{name}: {value!r} is not a number of retries") from None
            try:
                check_limit(out[key], name)
            except ValueError as exc:
                raise click.BadParameter(str(exc)) from None
        elif flag == "retry_oom_factor":
            out[key] = _number(value, "--retry-oom-factor")
        elif flag in ("retry_oom_max_memory", "retry_ready_timeout") and (
            str(value).lower() in UNSET_WORDS
        ):
            out[key] = None
        else:
            out[key] = value
    return out


_RATE_HELP = "Submissions per second ('unlimited' unsets)."
_BURST_HELP = "Submission burst (default: the rate, at least 1)."


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
            try:
                check_limit(out[key], f"--{key.replace('_', '-')}")
            except ValueError as exc:
                raise click.BadParameter(str(exc)) from None
    for key in _SECONDS_FLAGS:
        value = flags.get(key)
        if value is not None:
            # "600", "10m": the core's duration parser reads the text as typed.
            out[key] = None if str(value).lower() in UNSET_WORDS else value
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
    if flags.get("submit_rate") is not None or flags.get("submit_burst") is not None:
        out["submit_rate"] = merge_rate(
            out.get("submit_rate"), flags.get("submit_rate"), flags.get("submit_burst")
        )
    retry = _retry_flags(out.get("retry"), flags)
    if retry is not None:
        out["retry"] = retry
    return out


def _show_retry(policy: Mapping[str, Any] | None) -> str:
    """A retry policy on one line: what each class gets, or "none"."""
    p = RetryPolicy.parse(policy)
    parts = []
    if p.oom:
        cap = f", up to {fmt_memory(p.oom_max_memory)}" if p.oom_max_memory else ""
        parts.append(f"oom {p.oom} (memory x{p.oom_factor:g}{cap})")
    if p.lost:
        parts.append(f"lost {p.lost} (at the head)")
    if p.failed:
        parts.append(f"failed {p.failed}")
    if p.ready_timeout is not None:
        parts.append(f"ready within {duration(p.ready_timeout)} ({p.not_ready} requeues)")
    if p.failed or p.ready_timeout is not None:
        parts.append(f"backoff {duration(p.backoff)}")
    return ", ".join(parts) or "none"


def _rate_flags(rate: str | None, burst: str | None) -> tuple[bool, float | None, float | None]:
    """``--submit-rate``/``--submit-burst`` checked: (unset, per second, burst)."""
    if rate is not None and rate.lower() in UNSET_WORDS:
        return True, None, None
    per_s = None if rate is None else _number(rate, "--submit-rate")
    burst_n = None if burst is None else _number(burst, "--submit-burst")
    if per_s is not None and per_s <= 0:
        raise click.BadParameter(f"--submit-rate: {rate!r} must be more than 0")
    if burst_n is not None and burst_n < 1:
        raise click.BadParameter(f"--submit-burst: {burst!r} must be at least 1")
    return False, per_s, burst_n


def merge_rate(
    old: Mapping[str, Any] | None, rate: str | None, burst: str | None
) -> dict[str, float] | None:
    """A submit rate ``{per_second, burst}`` after ``--submit-rate``/``--submit-burst``
    (either may be None: not given) on top of ``old``; None: unlimited. A usage error
    names the flag and the value."""
    unset, per_s, burst_n = _rate_flags(rate, burst)
    if unset:
        return None
    old = old or {}
    rate_now = per_s if per_s is not None else old.get("per_second")
    if rate_now is None:
        raise click.BadParameter("--submit-burst needs --submit-rate (none is set)")
    # A new rate without a burst keeps the old burst, or gets the rate (at least 1).
    default_burst = old.get("burst", max(1.0, rate_now))
    return {"per_second": rate_now, "burst": burst_n if burst_n is not None else default_burst}


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
            for flag in _RETRY_HELP:
                msg = _reword(msg, "retry." + flag.removeprefix("retry_"), flag)
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
        # No scheduler yet: no queue. A missing namespace is an error of its own.
        if exc.status == RPCStatusCode.NOT_FOUND and "namespace" not in exc.message.lower():
            return {}
        raise


# --- create / update ---------------------------------------------------------------------


_allow_unknown_option = click.option(
    "--allow-unknown-cluster",
    is_flag=True,
    help="Accept --cluster names the tenant's fleet does not have (yet).",
)


@create.command("queue")
@click.argument("name", shell_complete=complete_queues)
@_queue_options
@_allow_unknown_option
@click.pass_context
def create_queue(
    ctx: click.Context, /, name: str, allow_unknown_cluster: bool, **flags: Any
) -> None:
    """Create the queue NAME with the policy given by the flags."""
    cfg = settings(ctx)
    check_name(name, "NAME")
    _check_clusters(flags)
    spec = _checked(_apply_flags({"name": name}, flags))

    async def go(client: Client) -> None:
        from headway.workflows import client as hw

        if name in await fetch_queues(client, cfg.tenant):
            raise click.ClickException(
                f"queue {name!r} already exists; change it with `headway update queue {name}`"
            )
        if spec.clusters and not allow_unknown_cluster:
            await hw.ensure_scheduler(client, cfg.tenant)
            await _refuse_unknown_clusters(client, cfg.tenant, spec.clusters, "--cluster")
        await hw.upsert_queue(client, cfg.tenant, spec.to_dict(), by=hw.changed_by("cli"))

    with_client(cfg, go)
    click.echo(f"queue {name!r} created")


@update.command("queue")
@click.argument("name", shell_complete=complete_queues)
@_queue_options
@click.option("--clear-cluster", is_flag=True, help="Let the queue use any healthy cluster.")
@click.option(
    "--edit",
    is_flag=True,
    help="Edit the queue as YAML in $EDITOR (a failed edit reopens with the error on top;"
    " closed unchanged, it is kept in a file).",
)
@_allow_unknown_option
@click.pass_context
def update_queue(
    ctx: click.Context,
    /,
    name: str,
    clear_cluster: bool,
    edit: bool,
    allow_unknown_cluster: bool,
    **flags: Any,
) -> None:
    """Change the queue NAME live: only the flags given change."""
    cfg = settings(ctx)
    check_name(name, "NAME")
    _check_clusters(flags)
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
        known = None
        if not allow_unknown_cluster:
            known = await _fleet_clusters(client, cfg.tenant)
        if edit:
            new = _edit(name, entry, known)
        else:
            new = _checked(entry)
            if known is not None:
                _unknown_clusters(new.clusters, known, "--cluster")
        before, after = old.to_dict(), new.to_dict()
        # The update takes the changed fields in the file notation (None unsets a knob).
        human = queue_to_entry(new)
        changes = {k: human[k] for k, v in after.items() if k != "name" and before.get(k) != v}
        if changes:
            source = "cli --edit" if edit else "cli"
            await hw.update_queue(client, cfg.tenant, name, changes, by=hw.changed_by(source))
        return bool(changes)

    changed = with_client(cfg, go)
    click.echo(f"queue {name!r} updated" if changed else f"queue {name!r} unchanged")


def _check_clusters(flags: Mapping[str, Any]) -> None:
    for c in flags.get("clusters") or ():
        check_name(c, "--cluster")


async def _fleet_clusters(client: Client, tenant: str) -> list[str] | None:
    """The clusters of the tenant's fleet, or None when its scheduler cannot say."""
    from headway.workflows import client as hw
    from temporalio.client import WorkflowQueryFailedError
    from temporalio.service import RPCError, RPCStatusCode

    try:
        fleet = await hw.get_fleet(client, tenant)
    except WorkflowQueryFailedError:
        return None
    except RPCError as exc:
        if exc.status in (RPCStatusCode.UNAVAILABLE, RPCStatusCode.DEADLINE_EXCEEDED):
            raise
        return None
    return [str(c) for c in fleet.get("clusters") or []] or None


def _unknown_clusters(clusters: Any, known: list[str], field: str) -> None:
    """A usage error naming the clusters not in ``known``, if any."""
    unknown = [c for c in clusters or () if c not in known]
    if unknown:
        raise click.BadParameter(
            f"{field}: {', '.join(repr(c) for c in unknown)} is not a cluster of the fleet "
            f"(clusters: {', '.join(known)}); --allow-unknown-cluster accepts it anyway"
        )


async def _refuse_unknown_clusters(client: Client, tenant: str, clusters: Any, field: str) -> None:
    known = await _fleet_clusters(client, tenant)
    if known is not None:
        _unknown_clusters(clusters, known, field)


#: The head of the YAML ``--edit`` opens: every field with what it accepts.
_EDIT_HELP = """\
# Queue {name!r}: edit and save. Lines starting with '#' are ignored; the
# name cannot change; a knob left empty (null) or 'unlimited' has no limit.
#   priority:    {priorities}
#   algorithm:   {algorithms}
#   status:      {statuses}
#   run_concurrency, action_concurrency, per_run_concurrency, depth: a count
#   submit_rate: {{per_second: 5, burst: 10}} (submissions to this queue)
#   max_queued_time: seconds an action may wait to start (600, or 10m, 2h)
#   max_resources: {{cpu: 512 or 500m, memory: 4Ti, gpu: 16 or "H200:16",
#                  ephemeral_storage: 1Ti}}
#   clusters:    null (any healthy one) or a list of: {clusters}
"""


def _edit(name: str, entry: dict[str, Any], known: list[str] | None) -> QueueSpec:
    """The queue as edited in $EDITOR. A failed edit reopens with the error on top; one
    closed unchanged after an error is kept in a file the error names."""
    from headway.scheduler.model import Algorithm, Priority

    head = _EDIT_HELP.format(
        name=name,
        priorities=", ".join(p.name for p in Priority),
        algorithms=", ".join(a.value for a in Algorithm),
        statuses=", ".join(s.value for s in QueueStatus),
        clusters=", ".join(known) if known else "any name",
    )
    body = yaml.safe_dump(
        {k: entry.get(k) for k in QUEUE_FIELDS}, sort_keys=False, default_flow_style=False
    )
    text = head + body
    for _ in range(_EDIT_TRIES):
        edited = click.edit(text, extension=".yaml")
        if edited is None or edited == text:  # closed without saving, or unchanged
            if text.startswith(_ERROR_MARK):
                path = _keep(edited or text)
                raise click.ClickException(
                    f"--edit: not applied ({_first_error(text)}); your edit is kept in {path}"
                )
            return _checked(entry, from_flags=False)
        try:
            new = _parse_edit(edited, name, known)
        except click.BadParameter as exc:
            text = _with_error(edited, exc.message)
            continue
        return new
    raise click.ClickException(
        f"--edit: not applied after {_EDIT_TRIES} tries ({_first_error(text)}); "
        f"your edit is kept in {_keep(text)}"
    )


#: Times a failed edit is reopened before it is given up (and kept in a file).
_EDIT_TRIES = 10


_ERROR_MARK = "# ERROR: "


def _parse_edit(text: str, name: str, known: list[str] | None) -> QueueSpec:
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise click.BadParameter(f"not valid YAML: {' '.join(str(exc).split())}") from None
    if not isinstance(data, dict):
        raise click.BadParameter("expected a mapping of queue fields")
    unknown = sorted(str(k) for k in data if k not in QUEUE_FIELDS)
    if unknown:
        raise click.BadParameter(
            f"{unknown[0]}: not a queue field (fields: {', '.join(QUEUE_FIELDS)})"
        )
    data.setdefault("name", name)
    new = _checked(data, from_flags=False)
    if new.name != name:
        raise click.BadParameter(f"name: a queue cannot be renamed ({name!r} -> {new.name!r})")
    if known is not None:
        _unknown_clusters(new.clusters, known, "clusters")
    return new


def _with_error(text: str, error: str) -> str:
    """``text`` with its previous error lines replaced by ``error``."""
    lines = text.splitlines(keepends=True)
    while lines and lines[0].startswith(_ERROR_MARK):
        lines.pop(0)
    return f"{_ERROR_MARK}{error}\n" + "".join(lines)


def _first_error(text: str) -> str:
    return text.splitlines()[0][len(_ERROR_MARK) :]


def _keep(text: str) -> str:
    import tempfile

    fd, path = tempfile.mkstemp(prefix="headway-edit-", suffix=".yaml")
    with open(fd, "w") as f:
        f.write(text)
    return path


# --- get / describe ---------------------------------------------------------------------


@get.command("queues")
@output_option
@click.pass_context
def get_queues(ctx: click.Context, output: str) -> None:
    """List the tenant's queues with their policy and what they hold.

    wide adds the runs in flight, the concurrency limits (runs/actions/per-run, ∞ for
    unlimited), the depth, the quota and the blocked head."""
    cfg = settings(ctx)
    queues = with_client(cfg, lambda c: fetch_queues(c, cfg.tenant))
    entries = [
        {
            **queue_to_entry(QueueSpec.from_dict(q["spec"])),
            **{k: v for k, v in q.items() if k != "spec"},
        }
        for q in queues.values()
    ]
    if emit_structured(entries, output):
        return
    if not entries:
        click.echo(f"No queues in tenant {cfg.tenant!r} (create one with `headway create queue`).")
        return
    headers = ["name", "priority", "algorithm", "status", "waiting", "running", "clusters"]
    if output == "wide":
        headers += ["runs", "concurrency", "depth", "quota", "blocked-head"]
    rows = []
    for e in entries:
        row = [
            e["name"],
            e["priority"],
            e["algorithm"],
            e["status"],
            e.get("waiting", "-"),
            e.get("running", "-"),
            _clusters_cell(e["clusters"], whole=output == "wide"),
        ]
        if output == "wide":
            conc = "/".join(
                _inf(e[k]) for k in ("run_concurrency", "action_concurrency", "per_run_concurrency")
            )
            quota = ",".join(f"{k}={v}" for k, v in (e["max_resources"] or {}).items())
            row += [e.get("runs", "-"), conc, _inf(e["depth"]), quota, e.get("blocked_head")]
        rows.append(row)
    click.echo(render_table(headers, rows))


def _clusters_cell(clusters: list[str] | None, whole: bool) -> str:
    """The selector in a table cell: whole in ``wide``, else the first cluster and how
    many more once the list passes 20 characters (the table keeps to 80 columns)."""
    if clusters is None:
        return "any"
    joined = ",".join(clusters)
    if whole or len(joined) <= 20 or len(clusters) == 1:
        return joined
    return f"{clusters[0]},+{len(clusters) - 1}"


def _inf(value: Any) -> str:
    return "∞" if value is None else str(value)


async def fetch_snapshot_or_none(client: Client, tenant: str) -> tuple[Scheduler, float] | None:
    """The scheduler's state as a local copy and its clock, or None when it could not be
    had (too large to answer, or an older scheduler): views then show less, not fail."""
    from headway.scheduler import Scheduler
    from headway.workflows import client as hw
    from temporalio.client import WorkflowQueryFailedError
    from temporalio.service import RPCError, RPCStatusCode

    try:
        data = await hw.get_snapshot(client, tenant)
    except WorkflowQueryFailedError:
        return None
    except RPCError as exc:
        if exc.status in (RPCStatusCode.UNAVAILABLE, RPCStatusCode.DEADLINE_EXCEEDED):
            raise
        return None
    return Scheduler.from_snapshot(data["snapshot"]), float(data["now"])


def _pct(values: list[float], p: float) -> float | None:
    """The ``p`` quantile (nearest rank) of ``values``."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(0, min(len(ordered) - 1, math.ceil(p * len(ordered)) - 1))
    return ordered[rank]


def queue_view(
    name: str, stats: Mapping[str, Any], live: tuple[Scheduler, float] | None
) -> dict[str, Any]:
    """One queue's live status: policy, in flight against each limit and quota, what
    waits and why, how long, and the blocked head (plain data: json/yaml print it)."""
    spec = QueueSpec.from_dict(stats["spec"])
    waiting, running = int(stats.get("waiting", 0)), int(stats.get("running", 0))
    usage = stats.get("usage") or {}
    q = live[0].queues.get(name) if live is not None else None
    busiest = max(q.run_counts.values(), default=0) if q is not None else None
    in_flight = {
        "runs": {"used": stats.get("runs"), "limit": spec.run_concurrency},
        "actions": {"used": running, "limit": spec.action_concurrency},
        "per_run": {"used": busiest, "limit": spec.per_run_concurrency},
        "depth": {"used": waiting + running, "limit": spec.depth},
    }
    quota = spec.max_resources
    gpu_type = quota.gpu_type if quota is not None else None
    resources = {
        "cpu": {
            "used": fmt_cpu(usage.get("cpu_m", 0)),
            "limit": fmt_cpu(quota.cpu) if quota and quota.cpu is not None else None,
        },
        "memory": {
            "used": fmt_memory(usage.get("memory", 0)),
            "limit": fmt_memory(quota.memory) if quota and quota.memory is not None else None,
        },
        "ephemeral_storage": {
            "used": fmt_memory(usage.get("ephemeral_storage", 0)),
            "limit": fmt_memory(quota.eph) if quota and quota.eph is not None else None,
        },
        "gpu": {
            "used": fmt_gpu(usage.get("gpu", 0), gpu_type) if usage.get("gpu") else "0",
            "limit": fmt_gpu(quota.gpu, gpu_type) if quota and quota.gpu is not None else None,
        },
    }
    now = time.time()
    waits = [now - a.submit for a in q.waiting] if q is not None else []
    head_id = stats.get("blocked_head")
    head: dict[str, Any] | None = None
    if head_id:
        head = {"action": head_id, "reason": None, "waiting_s": None}
        a = live[0].actions.get(head_id) if live is not None else None
        if a is not None:
            head.update(reason=a.last, waiting_s=now - a.submit)
    return {
        "name": name,
        "status": spec.status.value,
        "priority": spec.priority.name,
        "algorithm": spec.algorithm.value,
        "clusters": list(spec.clusters) if spec.clusters is not None else None,
        "waiting": waiting,
        "running": running,
        "in_flight": in_flight,
        "quota": resources,
        "waiting_by_reason": dict(stats.get("waiting_by_reason") or {}),
        "wait_p50_s": _pct(waits, 0.5),
        "wait_p95_s": _pct(waits, 0.95),
        "blocked_head": head,
        "backlog_in_store": bool(stats.get("backlog_in_store")),
        # How good its start estimates were, as the control plane scored them (None
        # until one was: an action seen waiting, forecast, then seen started).
        "start_estimates": stats.get("start_estimates"),
        "policy": queue_to_entry(spec),
    }


_LIMIT_LABELS = {
    "runs": "runs",
    "actions": "actions",
    "per_run": "per run (busiest)",
    "depth": "depth (waiting+running)",
}


def _queue_block(v: Mapping[str, Any]) -> Block:
    b = Block()
    b.field("Name", v["name"])
    b.field("Status", v["status"])
    b.field("Priority", v["priority"])
    b.field("Algorithm", v["algorithm"])
    b.field("Clusters", ", ".join(v["clusters"]) if v["clusters"] is not None else "any")
    b.field("Waiting", v["waiting"])
    b.field("Running", v["running"])
    b.section("In flight")
    rows: list[list[Any]] = [
        [_LIMIT_LABELS[k], "?" if x["used"] is None else x["used"], limit(x["limit"])]
        for k, x in v["in_flight"].items()
    ]
    rows += [
        [k.replace("_", " "), x["used"], "unlimited" if x["limit"] is None else x["limit"]]
        for k, x in v["quota"].items()
    ]
    b.table(["limit", "in use", "max"], rows)
    b.section("Waiting by reason")
    reasons = v["waiting_by_reason"]
    if reasons:
        b.table(["reason", "actions"], sorted(reasons.items(), key=lambda kv: -kv[1]))
    else:
        b.lines("(nothing waits)" if not v["waiting"] else "(not yet decided)")
    b.field("Wait p50/p95", f"{duration(v['wait_p50_s'])} / {duration(v['wait_p95_s'])}")
    head = v["blocked_head"]
    if head is None:
        b.field("Blocked head", "none")
    else:
        why = f" ({head['reason']})" if head.get("reason") else ""
        b.field("Blocked head", f"{head['action']}{why}, waiting {duration(head['waiting_s'])}")
    if v["backlog_in_store"]:
        b.field("Backlog", "more waits in the store beyond the scheduler's window")
    est = v.get("start_estimates")
    if est:
        b.field(
            "Start estimates",
            f"{est['scored']} scored: median error {duration(est['median_abs_error_s'])},"
            f" {est['within_10min']:.0%} within 10m, p90 +{duration(est['p90_margin_s'])}",
        )
    return b


def _fetch_queue(cfg: Settings, name: str) -> tuple[dict[str, Any], tuple[Scheduler, float] | None]:
    """One queue's stats and the scheduler's state, or a clear error when it is missing."""

    async def go(client: Client) -> tuple[dict[str, Any], tuple[Scheduler, float] | None]:
        queues = await fetch_queues(client, cfg.tenant)
        if not queues:
            raise no_tenant(cfg)
        if name not in queues:
            known = ", ".join(sorted(queues))
            raise click.ClickException(f"queue {name!r} does not exist (queues: {known})")
        return queues[name], await fetch_snapshot_or_none(client, cfg.tenant)

    return with_client(cfg, go)


_history_option = click.option(
    "--history",
    is_flag=True,
    help="Show its configuration changes instead: who, when, from where, old -> new.",
)
_limit_option = click.option(
    "--limit",
    "last",
    type=click.IntRange(min=1),
    default=50,
    show_default=True,
    help="With --history: the latest N changes.",
)


@get.command("queue")
@click.argument("name", shell_complete=complete_queues)
@_history_option
@_limit_option
@output_option
@click.pass_context
def get_queue(ctx: click.Context, name: str, history: bool, last: int, output: str) -> None:
    """Show the queue NAME live: status, policy, in flight against each limit and quota,
    what waits and why, and the blocked head. --history: every change of its
    configuration, oldest first (kept in the control plane's database)."""
    cfg = settings(ctx)
    check_name(name, "NAME")
    if history:
        show_history(cfg, "queue", name, last, output)
        return
    stats, live = _fetch_queue(cfg, name)
    view = queue_view(name, stats, live)
    if emit_structured(view, output):
        return
    click.echo(_queue_block(view).render())


@describe.command("queue")
@click.argument("name", shell_complete=complete_queues)
@runtime_option
@click.option(
    "--max-actions",
    type=click.IntRange(min=0),
    default=20,
    show_default=True,
    help="Waiting and running actions listed (each list).",
)
@output_option
@click.pass_context
def describe_queue(
    ctx: click.Context, name: str, default_runtime: float, max_actions: int, output: str
) -> None:
    """Show the queue NAME in detail: its live status (as `get queue`), every knob, and
    the waiting actions in order with their reasons and forecast starts, and the running
    ones."""
    from headway.scheduler.insight import forecast as run_forecast

    cfg = settings(ctx)
    check_name(name, "NAME")
    stats, live = _fetch_queue(cfg, name)
    view = queue_view(name, stats, live)
    waiting: list[dict[str, Any]] = []
    running: list[dict[str, Any]] = []
    if live is not None:
        sched, now = live
        q = sched.queues.get(name)
        f = run_forecast(sched, now, default_runtime=default_runtime) if q and q.waiting else None
        wall = time.time()
        for pos, a in enumerate(q.waiting if q is not None else [], start=1):
            start = f.starts.get(a.id) if f is not None else None
            waiting.append(
                {
                    "position": pos,
                    "action": a.id,
                    "run": a.run,
                    "reason": a.last,
                    "waiting_s": wall - a.submit,
                    "starts_in_s": None if start is None else max(0.0, start - now),
                    "cluster": f.clusters.get(a.id) if f is not None else None,
                }
            )
        for a in sched.actions.values():
            if a.queue == name and a.state == "running":
                running.append(
                    {
                        "action": a.id,
                        "run": a.run,
                        "cluster": a.cluster,
                        "running_s": wall - a.start if a.start else None,
                    }
                )
    view["waiting_actions"] = waiting[:max_actions] if max_actions else waiting
    view["running_actions"] = running[:max_actions] if max_actions else running
    if emit_structured(view, output):
        return
    b = _queue_block(view)
    b.section("Policy")
    for key, value in view["policy"].items():
        if key == "name":
            continue
        if key == "max_resources":
            value = ", ".join(f"{k}={x}" for k, x in (value or {}).items()) or "none"
        elif key == "clusters":
            value = ", ".join(value) if value is not None else "any"
        elif key in LIMIT_KNOBS:
            value = limit(value)
        elif key == "submit_rate":
            value = _show_org(value) if value is not None else "unlimited"
        elif key in _SECONDS_FLAGS:
            value = duration(value) if value is not None else "unlimited"
        elif key == "retry":
            value = _show_retry(value)
        b.field(key, value, indent=2)
    if live is None:
        b.field("Actions", "(the scheduler's state could not be read: lists left out)")
        click.echo(b.render())
        return
    b.section(f"Waiting actions ({len(waiting)}, in order)")
    if waiting:
        b.table(
            ["#", "action", "reason", "waiting", "starts in", "cluster"],
            [
                [
                    w["position"],
                    w["action"],
                    w["reason"],
                    duration(w["waiting_s"]),
                    "?" if w["starts_in_s"] is None else duration(w["starts_in_s"]),
                    w["cluster"],
                ]
                for w in view["waiting_actions"]
            ],
        )
        if len(waiting) > len(view["waiting_actions"]):
            b.lines(f"... and {len(waiting) - len(view['waiting_actions'])} more")
    b.section(f"Running actions ({len(running)})")
    if running:
        b.table(
            ["action", "run", "cluster", "running"],
            [
                [r["action"], r["run"], r["cluster"], duration(r["running_s"])]
                for r in view["running_actions"]
            ],
        )
        if len(running) > len(view["running_actions"]):
            b.lines(f"... and {len(running) - len(view['running_actions'])} more")
    click.echo(b.render())
    if waiting:
        click.echo("(starts in: forecast by runtime estimates; ?: not within the forecast)")


# --- drain / resume -------------------------------------------------------------------------


def _set_status(ctx: click.Context, name: str, status: QueueStatus) -> tuple[str, dict[str, Any]]:
    cfg = settings(ctx)
    check_name(name, "NAME")

    async def go(client: Client) -> tuple[str, dict[str, Any]]:
        from headway.workflows import client as hw

        queues = await fetch_queues(client, cfg.tenant)
        if name not in queues:
            raise click.ClickException(f"queue {name!r} does not exist (see `headway get queues`)")
        before = str(queues[name]["spec"]["status"])
        if before == status.value or (
            status is QueueStatus.draining and before == QueueStatus.drained.value
        ):
            return before, queues[name]
        await hw.update_queue(
            client, cfg.tenant, name, {"status": status.value}, by=hw.changed_by("cli")
        )
        return before, (await fetch_queues(client, cfg.tenant)).get(name, queues[name])

    return with_client(cfg, go)


@drain.command("queue")
@click.argument("name", shell_complete=complete_queues)
@click.pass_context
def drain_queue(ctx: click.Context, name: str) -> None:
    """Drain the queue NAME: new submissions are refused (QueueDraining); what waits and
    runs goes on, and the queue turns `drained` once it holds nothing."""
    before, now = _set_status(ctx, name, QueueStatus.draining)
    status = now["spec"]["status"]
    held = f"{now.get('waiting', 0)} waiting, {now.get('running', 0)} running"
    if before in (QueueStatus.draining.value, QueueStatus.drained.value):
        click.echo(f"queue {name!r} is already {before} ({held})")
    else:
        click.echo(f"queue {name!r} {status} ({held})")


@resume.command("queue")
@click.argument("name", shell_complete=complete_queues)
@click.pass_context
def resume_queue(ctx: click.Context, name: str) -> None:
    """Make the queue NAME active again: it takes submissions and dispatches."""
    before, _ = _set_status(ctx, name, QueueStatus.active)
    if before == QueueStatus.active.value:
        click.echo(f"queue {name!r} is already active")
    else:
        click.echo(f"queue {name!r} active (was {before})")


@delete.command("queue")
@click.argument("name", shell_complete=complete_queues)
@click.pass_context
def delete_queue(ctx: click.Context, name: str) -> None:
    """Delete the queue NAME. Refused while it holds work (waiting, running, or still in
    the store): drain it first (`headway drain queue NAME`) and let it empty."""
    cfg = settings(ctx)
    check_name(name, "NAME")

    async def go(client: Client) -> None:
        from headway.workflows import client as hw
        from temporalio.client import WorkflowUpdateFailedError

        if name not in await fetch_queues(client, cfg.tenant):
            raise click.ClickException(f"queue {name!r} does not exist (see `headway get queues`)")
        try:
            await hw.remove_queue(client, cfg.tenant, name, by=hw.changed_by("cli"))
        except WorkflowUpdateFailedError as err:
            cause = getattr(err.cause, "message", None) or str(err.cause or err)
            raise click.ClickException(cause) from None

    with_client(cfg, go)
    click.echo(f"queue {name!r} deleted")


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
@_history_option
@_limit_option
@output_option
@click.pass_context
def get_org(ctx: click.Context, history: bool, last: int, output: str) -> None:
    """Show every org-wide limit of the tenant against its default. --history: every
    change of them, oldest first."""
    cfg = settings(ctx)
    if history:
        show_history(cfg, "org", "", last, output)
        return
    org = with_client(cfg, lambda c: _fetch_org(c, cfg.tenant))
    if org is None:
        raise click.ClickException("this control plane does not expose its org limits yet")
    current, defaults = org.to_dict(), OrgLimits().to_dict()
    if emit_structured(current, output):
        return
    rows = [[key, _show_org(value), _show_org(defaults[key])] for key, value in current.items()]
    click.echo(render_table(["limit", "value", "default"], rows))


def _show_org(value: Any) -> str:
    if isinstance(value, Mapping):
        return f"{value['per_second']:g}/s, burst {value['burst']:g}"
    return limit(value)


@update.command("org")
@click.option("--max-concurrent-runs", help="Runs in flight across queues ('unlimited' unsets).")
@click.option("--max-concurrent-actions", help="Actions in flight across queues.")
@click.option("--max-actions-per-run", help="Fan-out: actions one run may submit.")
@click.option("--submit-rate", help=_RATE_HELP)
@click.option("--submit-burst", help=_BURST_HELP)
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
    _rate_flags(rate, burst)  # bad flags fail before any round trip

    async def go(client: Client) -> bool:
        from headway.workflows import client as hw

        current = await _fetch_org(client, cfg.tenant)
        entry = (current or OrgLimits()).to_dict()
        entry.update(limits)
        if rate is not None or burst is not None:
            entry["submit_rate"] = merge_rate(entry.get("submit_rate"), rate, burst)
        await hw.set_org(client, cfg.tenant, entry, by=hw.changed_by("cli"))
        return current is not None

    merged = with_client(cfg, go)
    click.echo("org limits updated" if merged else "org limits set (limits not given: unlimited)")


def _number(value: str, flag: str) -> float:
    try:
        return float(value)
    except ValueError:
        raise click.BadParameter(f"{flag}: {value!r} is not a number") from None


# --- history --------------------------------------------------------------------------


def show_history(cfg: Settings, kind: str, name: str, limit: int, output: str) -> None:
    """The audit trail of a queue, a cluster or the org limits, from the control
    plane's store."""

    async def go(client: Client) -> list[dict[str, Any]]:
        from headway.workflows import client as hw

        try:
            return await hw.config_history(client, cfg.tenant, kind, name, limit)
        except TimeoutError:
            raise click.ClickException(
                f"no control-plane worker answered in 20s on Temporal at {cfg.address}: "
                "start one (`headway worker control-plane` or `headway up`)"
            ) from None

    rows = with_client(cfg, go)
    if emit_structured(rows, output):
        return
    what = f"{kind} {name!r}" if kind in ("queue", "cluster") else "the org limits"
    if not rows:
        click.echo(f"No recorded changes of {what} in tenant {cfg.tenant!r}.")
        return
    table: list[list[Any]] = []
    for r in rows:
        lines = _diff_lines(kind, r)
        first = [iso(r["at"]), _clip(r["who"], 24), r["source"]]
        table.append([*first, lines[0]])
        table.extend(["", "", "", more] for more in lines[1:])
    click.echo(f"Changes of {what} (oldest first):")
    click.echo(_fit_last_column(["when", "who", "source", "change"], table))


def _clip(text: str, n: int) -> str:
    return text if len(text) <= n else text[: n - 1] + "…"


def _human(kind: str, spec: Mapping[str, Any] | None) -> dict[str, Any]:
    if spec is None:
        return {}
    if kind == "queue":
        return queue_to_entry(QueueSpec.from_dict(dict(spec)))
    if kind == "cluster":
        groups = [
            f"{g['name']} x{g['count']} ({_shape(g['shape'])})"
            for g in spec.get("node_groups") or []
        ]
        return {
            "name": spec.get("name"),
            "node_groups": "; ".join(groups) or "none",
            "reports_capacity": spec.get("reports_capacity", True),
        }
    return OrgLimits.from_dict(dict(spec)).to_dict()


def _shape(shape: Mapping[str, Any]) -> str:
    """A node shape (``Pod.to_dict()``) in Kubernetes units: ``cpu 96, memory 1Ti, gpu
    H100:8``."""
    p = Pod.from_dict(dict(shape))
    parts = [f"cpu {fmt_cpu(p.cpu)}", f"memory {fmt_memory(p.memory)}"]
    if p.gpu:
        parts.append(f"gpu {fmt_gpu(p.gpu, p.gpu_type)}")
    if p.eph:
        parts.append(f"ephemeral {fmt_memory(p.eph)}")
    return ", ".join(parts)


def _diff_lines(kind: str, row: Mapping[str, Any]) -> list[str]:
    """One line per field that changed: ``depth: 100 -> 200``; a create lists what it
    set besides the defaults, a delete says so."""
    old, new = _human(kind, row.get("old")), _human(kind, row.get("new"))
    if row["change"] == "delete":
        return ["deleted"]
    if row["change"] == "create":
        default = _human(kind, {"name": new.get("name", "")}) if kind == "queue" else {}
        set_ = [
            f"{k}={_show_value(v)}" for k, v in new.items() if k != "name" and default.get(k) != v
        ]
        return ["created" + (": " + ", ".join(set_) if set_ else "")]
    keys = [k for k in new if k != "name" and old.get(k) != new.get(k)]
    return [f"{k}: {_show_value(old.get(k), k)} -> {_show_value(new.get(k), k)}" for k in keys] or [
        "(no change)"
    ]


#: What None means, per field (else: unlimited).
_NONE_MEANS = {"clusters": "any", "max_resources": "none"}


def _show_value(v: Any, key: str = "") -> str:
    if v is None:
        return _NONE_MEANS.get(key, "unlimited")
    if isinstance(v, Mapping):
        if "per_second" in v:
            return f"{v['per_second']}/s burst {v['burst']}"
        return "{" + ", ".join(f"{k}={x}" for k, x in v.items()) + "}"
    if isinstance(v, list):
        return "[" + ", ".join(str(x) for x in v) + "]"
    return str(v)


def _fit_last_column(headers: list[str], rows: list[list[Any]], width: int = 80) -> str:
    """A table whose last column wraps (into rows of its own) to keep it in ``width``."""
    import textwrap

    lead = [max(len(headers[i]), *(len(str(r[i])) for r in rows)) for i in range(3)]
    room = max(20, width - sum(lead) - 3 * len(lead))
    out: list[list[Any]] = []
    for r in rows:
        parts = textwrap.wrap(str(r[3]), room, break_on_hyphens=False) or [""]
        out.append([*r[:3], parts[0]])
        out.extend(["", "", "", p] for p in parts[1:])
    cells = [[h.upper() for h in headers], *[[str(c) for c in r] for r in out]]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    return "\n".join(
        "   ".join(c.ljust(widths[i]) for i, c in enumerate(r)).rstrip() for r in cells
    )
