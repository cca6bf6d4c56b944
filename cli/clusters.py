"""Cluster commands: ``headway get clusters``, ``describe cluster NAME`` and
``create cluster NAME`` (the cluster registry: the tenant's fleet, stored and audited).

Both read the tenant's scheduler: its ``fleet`` query (the declared fleet and the latest
capacity report of each cluster: when, from which worker incarnation, known or not) and
its state (each node's allocatable and free as the scheduler counts them, and which of
its own actions run where), so they show what the scheduler decides with.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import click

from ._common import Settings, check_name, no_tenant, settings, with_client
from ._groups import create, describe, get
from ._output import (
    Block,
    duration,
    emit_structured,
    fmt_cpu,
    fmt_gpu,
    fmt_memory,
    output_option,
    render_table,
)
from .completion import complete_clusters

if TYPE_CHECKING:
    from headway.scheduler import Scheduler
    from temporalio.client import Client

__all__ = ["create_cluster", "describe_cluster", "get_clusters"]

#: What each status means (``describe cluster`` prints it).
STATUS_HELP = {
    "Ready": "its worker reports capacity; the scheduler places work on it",
    "Unknown": "its worker cannot read nodes: capacity unknown, and unknown means open",
    "NoReport": "no worker has reported yet: the declared node groups stand in",
    "Down": "its worker went silent or it was marked unhealthy: it takes no new work",
}

_RES = ("cpu", "memory", "gpu", "ephemeral_storage")


def _amounts(cpu: int, memory: int, eph: int, gpu: int, gpu_type: str | None) -> dict[str, Any]:
    return {
        "cpu": fmt_cpu(cpu),
        "memory": fmt_memory(memory) if memory else "0",
        "gpu": fmt_gpu(gpu, gpu_type) if gpu else "0",
        "ephemeral_storage": fmt_memory(eph) if eph else "0",
    }


def _gpu_type(types: set[str | None]) -> str | None:
    named = sorted(t for t in types if t)
    return named[0] if len(named) == 1 else ("/".join(named) or None)


def cluster_views(
    fleet: Mapping[str, Any], live: tuple[Scheduler, float] | None, tenant: str
) -> list[dict[str, Any]]:
    """Each cluster of the tenant's fleet as plain data (json/yaml print it whole)."""
    from headway.scheduler.model import ClusterSpec

    capacity: Mapping[str, Any] = fleet.get("capacity") or {}
    down = set(fleet.get("down") or [])
    declared = {c["name"]: ClusterSpec.from_dict(c) for c in fleet.get("fleet") or []}
    names = list(dict.fromkeys([*declared, *(fleet.get("clusters") or [])]))
    sched = live[0] if live is not None else None
    wall = time.time()
    out: list[dict[str, Any]] = []
    for name in names:
        rep = capacity.get(name)
        state = sched.clusters.get(name) if sched is not None else None
        healthy = state.healthy if state is not None else True
        if name in down or not healthy:
            status = "Down"
        elif rep is None:
            status = "NoReport"
        elif not rep.get("known", True):
            status = "Unknown"
        else:
            status = "Ready"
        view: dict[str, Any] = {"name": name, "status": status, "healthy": healthy}
        heard = (rep or {}).get("heard_at") or (rep or {}).get("observed_at")
        view["last_report"] = (
            None
            if rep is None
            else {
                "age_s": wall - heard if heard else None,
                "observed_at": rep.get("observed_at"),
                "sequence": rep.get("sequence"),
                "incarnation": rep.get("incarnation") or None,
                "capacity_known": bool(rep.get("known", True)),
            }
        )
        spec = declared.get(name)
        view["declared"] = [
            {"group": g.name, "count": g.count, **_amounts(*_pod(g.shape))}
            for g in (spec.node_groups if spec is not None else ())
        ]
        nodes: list[dict[str, Any]] = []
        total = [0, 0, 0, 0]
        free = [0, 0, 0, 0]
        types: set[str | None] = set()
        if state is not None:
            for i, cap in enumerate(state.cap):
                f = (state.fcpu[i], state.fmem[i], state.feph[i], state.fgpu[i])
                c = (cap.cpu, cap.memory, cap.eph, cap.gpu)
                types.add(cap.gpu_type)
                for k in range(4):
                    total[k] += c[k]
                    free[k] += f[k]
                nodes.append(
                    {
                        "name": state.node_names[i] if i < len(state.node_names) else str(i),
                        "allocatable": _amounts(*c, cap.gpu_type),
                        "free": _amounts(*f, cap.gpu_type),
                    }
                )
        elif spec is not None:  # no scheduler state: the declaration and the report
            for g in spec.node_groups:
                types.add(g.shape.gpu_type)
                for k, v in enumerate(_pod(g.shape)[:4]):
                    total[k] += v * g.count
            free = list(total)
            if rep is not None and rep.get("known", True):
                free[0] = int(rep.get("free_cpu_m", free[0]))
                free[3] = int(rep.get("free_gpu", free[3]))
                free[1] = free[2] = -1  # not in the report
        gtype = _gpu_type(types)
        view["nodes"] = len(nodes) if nodes else (rep or {}).get("nodes")
        view["allocatable"] = _amounts(total[0], total[1], total[2], total[3], gtype)
        view["free"] = _amounts(free[0], free[1], free[2], free[3], gtype)
        if free[1] < 0:
            view["free"].update(memory=None, ephemeral_storage=None)
        view["node_list"] = nodes
        view.update(_use(sched, name, total, free, gtype, tenant))
        out.append(view)
    return out


def _pod(p: Any) -> tuple[int, int, int, int, str | None]:
    return (p.cpu, p.memory, p.eph, p.gpu, p.gpu_type)


def _use(
    sched: Scheduler | None,
    name: str,
    total: list[int],
    free: list[int],
    gtype: str | None,
    tenant: str,
) -> dict[str, Any]:
    """What this tenant's actions hold on the cluster and what everything else (other
    tenants, pods Headway did not create) holds: used minus ours."""
    if sched is None:
        return {"running_actions": [], "in_use": None}
    ours = [0, 0, 0, 0]
    running: list[str] = []
    for a in sched.actions.values():
        if a.state == "running" and a.cluster == name:
            running.append(a.id)
            u = a.usage
            for k, v in enumerate((u.cpu, u.memory, u.eph, u.gpu)):
                ours[k] += v
    used = [max(0, total[k] - free[k]) for k in range(4)]
    others = [max(0, used[k] - ours[k]) for k in range(4)]
    return {
        "running_actions": sorted(running),
        "in_use": {
            f"tenant {tenant}": _amounts(ours[0], ours[1], ours[2], ours[3], gtype),
            "others": _amounts(others[0], others[1], others[2], others[3], gtype),
        },
    }


def _fetch(cfg: Settings) -> list[dict[str, Any]]:
    async def go(client: Client) -> list[dict[str, Any]]:
        from headway.workflows import client as hw
        from temporalio.service import RPCError, RPCStatusCode

        from .queues import fetch_snapshot_or_none

        try:
            fleet = await hw.get_fleet(client, cfg.tenant)
        except RPCError as exc:
            if exc.status == RPCStatusCode.NOT_FOUND and "amespace" not in exc.message:
                raise no_tenant(cfg) from exc
            raise
        live = await fetch_snapshot_or_none(client, cfg.tenant)
        return cluster_views(fleet, live, cfg.tenant)

    return with_client(cfg, go)


def _ratio(free: Any, total: Any) -> str:
    return f"{'?' if free is None else free}/{total}"


@get.command("clusters")
@output_option
@click.pass_context
def get_clusters(ctx: click.Context, output: str) -> None:
    """List the tenant's clusters: status, nodes, free of each resource against the
    total (as the scheduler counts them), and the age of the last capacity report.
    wide adds the GPU type, the actions running there and the reporting worker."""
    cfg = settings(ctx)
    views = _fetch(cfg)
    if emit_structured(views, output):
        return
    if not views:
        click.echo(f"No clusters in the fleet of tenant {cfg.tenant!r}.")
        return
    headers = ["name", "status", "nodes", "free gpu", "free cpu", "free memory", "reported"]
    if output == "wide":
        headers += ["gpu type", "running", "worker", "seq"]
    rows = []
    for v in views:
        free, total, rep = v["free"], v["allocatable"], v["last_report"]
        row: list[Any] = [
            v["name"],
            v["status"],
            v["nodes"],
            _ratio(_count(free["gpu"]), _count(total["gpu"])),
            _ratio(free["cpu"], total["cpu"]),
            _ratio(free["memory"], total["memory"]),
            "never" if rep is None else f"{duration(rep['age_s'])} ago",
        ]
        if output == "wide":
            gtype = str(total["gpu"]).partition(":")[0] if ":" in str(total["gpu"]) else None
            row += [
                gtype,
                len(v["running_actions"]),
                (rep or {}).get("incarnation"),
                (rep or {}).get("sequence"),
            ]
        rows.append(row)
    click.echo(render_table(headers, rows))


def _count(gpu: Any) -> Any:
    """``H100:8`` -> ``8`` (the column says GPU; the type is in wide)."""
    return gpu if gpu is None else str(gpu).rpartition(":")[2]


@describe.command("cluster")
@click.argument("name", shell_complete=complete_clusters)
@click.option(
    "--history",
    is_flag=True,
    help="Show the changes of its registration instead (who, when, from where, old -> new).",
)
@click.option(
    "--last", type=click.IntRange(min=1), default=50, show_default=True, help="With --history."
)
@output_option
@click.pass_context
def describe_cluster(ctx: click.Context, name: str, history: bool, last: int, output: str) -> None:
    """Show the cluster NAME: status, its last capacity report, allocatable and free per
    node, what this tenant's actions and everything else use, and what runs there."""
    cfg = settings(ctx)
    check_name(name, "NAME")
    if history:
        from .queues import show_history

        show_history(cfg, "cluster", name, last, output)
        return
    views = {v["name"]: v for v in _fetch(cfg)}
    v = views.get(name)
    if v is None:
        known = ", ".join(views) or "none"
        raise click.ClickException(
            f"cluster {name!r} is not in the fleet of tenant {cfg.tenant!r} (clusters: {known})"
        )
    if emit_structured(v, output):
        return
    b = Block()
    b.field("Name", v["name"])
    b.field("Status", f"{v['status']}: {STATUS_HELP[v['status']]}")
    rep = v["last_report"]
    if rep is None:
        b.field("Last report", "never")
    else:
        worker = f", worker {rep['incarnation'][:12]}" if rep["incarnation"] else ""
        b.field(
            "Last report",
            f"{duration(rep['age_s'])} ago (sequence {rep['sequence']}{worker})",
        )
        b.field("Capacity", "known" if rep["capacity_known"] else "unknown (treated as open)")
    b.field("Nodes", v["nodes"])
    b.field("Allocatable", _line(v["allocatable"]))
    b.field("Free", _line(v["free"]))
    if v["in_use"] is not None:
        b.section("In use")
        b.table(
            ["by", "cpu", "memory", "gpu", "ephemeral"],
            [[who, *(u[r] for r in _RES)] for who, u in v["in_use"].items()],
        )
    if v["node_list"]:
        b.section("Nodes (free/allocatable)")
        b.table(
            ["name", "cpu", "memory", "gpu", "ephemeral"],
            [[n["name"], *(_ratio(*_pair(n, r)) for r in _RES)] for n in v["node_list"]],
        )
    running = v["running_actions"]
    b.field(f"Running actions ({len(running)})", running or "none")
    if v["declared"]:
        b.section("Declared node groups")
        b.table(
            ["group", "count", "cpu", "memory", "gpu", "ephemeral"],
            [[g["group"], g["count"], *(g[r] for r in _RES)] for g in v["declared"]],
        )
    click.echo(b.render())


def _pair(node: Mapping[str, Any], resource: str) -> tuple[Any, Any]:
    """A node's free and allocatable amount; GPUs as counts (the type is per cluster)."""
    free, total = node["free"][resource], node["allocatable"][resource]
    return (_count(free), _count(total)) if resource == "gpu" else (free, total)


def _line(amounts: Mapping[str, Any]) -> str:
    return ", ".join(
        f"{'ephemeral' if r == 'ephemeral_storage' else r} {'?' if amounts[r] is None else amounts[r]}"
        for r in _RES
    )


# --- create cluster -------------------------------------------------------------------------

#: ``--node-group`` keys: the group's name and node count, and the node shape's resources
#: (as a fleet file's ``shape:``).
_GROUP_KEYS = ("name", "count", "cpu", "memory", "gpu", "ephemeral-storage")


def _node_group(raw: str) -> dict[str, Any]:
    """``name=h100,count=2,cpu=96,memory=1Ti,gpu=H100:8`` as a fleet file's node group."""
    fields: dict[str, str] = {}
    for part in raw.split(","):
        key, eq, value = part.strip().partition("=")
        if not eq or not value or key not in _GROUP_KEYS:
            raise click.BadParameter(
                f"{raw!r}: {part.strip()!r} is not KEY=VALUE with KEY one of "
                f"{', '.join(_GROUP_KEYS)}",
                param_hint="--node-group",
            )
        if key in fields:
            raise click.BadParameter(f"{raw!r}: {key} is given twice", param_hint="--node-group")
        fields[key] = value
    for need in ("name", "count"):
        if need not in fields:
            raise click.BadParameter(f"{raw!r}: {need}= is required", param_hint="--node-group")
    try:
        count = int(fields["count"])
    except ValueError:
        raise click.BadParameter(
            f"{raw!r}: count {fields['count']!r} is not a whole number", param_hint="--node-group"
        ) from None
    shape = {k.replace("-", "_"): v for k, v in fields.items() if k not in ("name", "count")}
    return {"name": fields["name"], "count": count, "shape": shape}


def cluster_spec(name: str, groups: tuple[str, ...], unknown_capacity: bool) -> dict[str, Any]:
    """The cluster the flags declare, checked by the fleet file's own parser (so the
    scheduler takes exactly what a fleet file would), as ``ClusterSpec.to_dict()``."""
    import json

    from headway.scheduler.scenario import ScenarioError, parse_fleet

    spec = {
        "name": name,
        "node_groups": [_node_group(g) for g in groups],
        "reports_capacity": not unknown_capacity,
    }
    try:
        (c,) = parse_fleet(json.dumps({"clusters": [spec]}), source="cluster").clusters
    except ScenarioError as exc:
        # "cluster:1: clusters[0].node_groups[1].count: -1 must be >= 0" -> the flag's part.
        said = str(exc).split("clusters[0].", 1)[-1]
        raise click.BadParameter(said, param_hint="--node-group") from None
    return c.to_dict()


@create.command("cluster")
@click.argument("name", shell_complete=complete_clusters)
@click.option(
    "--node-group",
    "node_groups",
    multiple=True,
    metavar="name=N,count=N[,cpu=Q,memory=Q,gpu=[TYPE:]N,ephemeral-storage=Q]",
    help="A group of like nodes (repeat for each group), e.g. "
    "name=h100,count=2,cpu=96,memory=1Ti,gpu=H100:8.",
)
@click.option(
    "--unknown-capacity",
    is_flag=True,
    help="Its worker does not report capacity: unknown means open (counted and alerted).",
)
@click.option(
    "--replace",
    is_flag=True,
    help="Replace the declared node groups of a cluster the fleet already has.",
)
@click.pass_context
def create_cluster(
    ctx: click.Context,
    name: str,
    node_groups: tuple[str, ...],
    unknown_capacity: bool,
    replace: bool,
) -> None:
    """Register the cluster NAME in the tenant's fleet (the cluster registry): stored
    with the tenant's configuration, audited, taken by the scheduler at once, and
    kept after a restart. Queues may then select it (`--cluster NAME`) and its
    worker's capacity reports are taken. Start its worker with
    `headway worker cluster --name NAME`."""
    cfg = settings(ctx)
    check_name(name, "NAME")
    spec = cluster_spec(name, node_groups, unknown_capacity)

    async def go(client: Client) -> None:
        from headway.workflows import client as hw

        await hw.ensure_scheduler(client, cfg.tenant)
        fleet = await hw.get_fleet(client, cfg.tenant)
        if name in fleet.get("clusters", []) and not replace:
            raise click.ClickException(
                f"cluster {name!r} is already in the fleet of tenant {cfg.tenant!r}; "
                "give --replace to replace its node groups"
            )
        await hw.register_cluster(client, cfg.tenant, spec, by=hw.changed_by("cli"))

    with_client(cfg, go)
    nodes = sum(g["count"] for g in spec["node_groups"])
    click.echo(f"cluster {name!r} registered ({nodes} node{'s' if nodes != 1 else ''})")
