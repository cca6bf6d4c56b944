"""``headway worker control-plane`` and ``headway worker cluster``: the two kinds of
long-running worker, each until SIGINT/SIGTERM."""

from __future__ import annotations

import asyncio
import logging
import signal
from collections.abc import Awaitable, Callable
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import click
from headway import protocol
from headway.activities.fairness import DEFAULT_CONTENDED_RATE
from headway.worker.gc_tuning import freeze_startup, set_young_threshold

from ._common import (
    DATABASE_URL_ENV,
    Settings,
    check_name,
    connect_retrying,
    fleet_cluster,
    load_fleet,
    settings,
)

if TYPE_CHECKING:
    from temporalio.client import Client

__all__ = ["worker"]


async def _serve(cfg: Settings, body: Callable[[Client, asyncio.Event], Awaitable[None]]) -> None:
    """Connect (waiting for a server that is still starting) and run ``body`` until a
    signal sets the stop event it receives."""
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    try:  # first: a bad HEADWAY_GC_YOUNG fails before connecting
        set_young_threshold()
    except ValueError as exc:
        raise click.ClickException(str(exc)) from exc
    client = await connect_retrying(cfg, timeout_s=120.0)
    # Everything the worker imports is alive for good now: out of the collector's way.
    freeze_startup()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        await body(client, stop)
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)


@click.group()
def worker() -> None:
    """Run a Headway worker."""


_fleet_option = click.option(
    "--fleet",
    "fleet_path",
    type=click.Path(dir_okay=False),
    default=None,
    help="Fleet file (clusters and queues). [default: the bundled examples/fleet.yaml]",
)


_metrics_port_option = click.option(
    "--metrics-port",
    "metrics_port",
    envvar="HEADWAY_METRICS_PORT",
    type=click.IntRange(0, 65535),
    default=None,
    help="Serve Prometheus metrics on http://0.0.0.0:PORT/metrics (0: any free port; the"
    " ready line says which). [env HEADWAY_METRICS_PORT; default: no endpoint]",
)


def _setup_telemetry(service: str, port: int | None) -> str:
    """Install the process's telemetry; the scrape address for the ready line ('' none)."""
    from headway import telemetry

    try:
        t = telemetry.setup(service, metrics_port=port)
    except ValueError as exc:
        raise click.ClickException(str(exc)) from exc
    return f", metrics {t.metrics_address}" if t.metrics_address else ""


def _metrics_interval() -> float:
    from headway import telemetry

    try:
        return telemetry.metrics_interval()
    except ValueError as exc:
        raise click.ClickException(str(exc)) from exc


@worker.command("control-plane")
@_fleet_option
@click.option(
    "--database-url",
    envvar=DATABASE_URL_ENV,
    default=None,
    help="The control plane's store (SQLAlchemy URL). [env HEADWAY_DATABASE_URL]",
)
@click.option(
    "--admit-wait",
    "admit_wait_s",
    envvar="HEADWAY_ADMIT_WAIT_S",
    type=click.FloatRange(min=0),
    default=None,
    help="Seconds an action's first workflow task waits on this worker for its admission"
    " before falling back to a signal (0: never wait). [env HEADWAY_ADMIT_WAIT_S;"
    " default 2]",
)
@click.option(
    "--contended-rate",
    "contended_rate",
    envvar="HEADWAY_CONTENDED_RATE",
    type=click.FloatRange(min=0),
    default=DEFAULT_CONTENDED_RATE,
    show_default=True,
    help="Admission signals per second one shard may send while another shard has actions"
    " writing or ending leases on this worker, so a shard draining a backlog does not slow"
    " another's small runs (0: no pacing). [env HEADWAY_CONTENDED_RATE]",
)
@click.option(
    "--history-retention",
    envvar="HEADWAY_HISTORY_RETENTION",
    default="30d",
    show_default=True,
    help="How long the record of a finished action is kept for `headway export workload`"
    " and `headway review` (7d, 12h, or forever). [env HEADWAY_HISTORY_RETENTION]",
)
@click.option(
    "--cluster-silent",
    "cluster_silent",
    envvar="HEADWAY_CLUSTER_SILENT",
    default="90s",
    show_default=True,
    help="A cluster whose worker has said nothing this long is down: nothing new is"
    " dispatched there, and a dispatch its worker has not taken up within it is handed"
    " back to its queue (90, 90s, 5m). Schedulers take it when they start or continue"
    " as new. [env HEADWAY_CLUSTER_SILENT]",
)
@_metrics_port_option
@click.pass_context
def control_plane(
    ctx: click.Context,
    fleet_path: str | None,
    database_url: str | None,
    admit_wait_s: float | None,
    contended_rate: float,
    history_retention: str,
    cluster_silent: str,
    metrics_port: int | None,
) -> None:
    """The control plane: shard schedulers, action workflows and their activities."""
    from headway.scheduler.model import parse_seconds
    from headway.store.history import history_retention as parse_retention

    try:
        cluster_silent_s = parse_seconds(cluster_silent, "--cluster-silent")
        if cluster_silent_s <= 0:
            raise ValueError(f"--cluster-silent: {cluster_silent!r} must be more than 0")
    except ValueError as exc:
        raise click.BadParameter(
            str(exc).split(": ", 1)[-1], param_hint="--cluster-silent"
        ) from None

    try:
        parse_retention(history_retention)
    except ValueError as exc:
        raise click.BadParameter(
            str(exc).split(": ", 1)[-1], param_hint="--history-retention"
        ) from None
    cfg = settings(ctx)
    fleet = load_fleet(fleet_path)
    from headway import telemetry
    from headway.worker.control_plane import run_control_plane_worker

    interval_s = _metrics_interval()
    metrics = _setup_telemetry("headway-control-plane", metrics_port)

    def ready(tenants: list[str]) -> None:
        click.echo(
            f"control-plane worker ready: Temporal {cfg.address} (namespace {cfg.namespace}),"
            f" task queue {protocol.CONTROL_TASK_QUEUE}, schedulers of"
            f" {', '.join(tenants) or 'no tenant yet'}{metrics}",
            err=True,
        )

    opts = cfg.base()

    def serves(tenant: str) -> bool:
        # One namespace per control-plane worker: a tenant mapped elsewhere is served by
        # the control plane of its own namespace.
        return opts.namespace_for(tenant) == cfg.namespace

    async def body(client: Client, stop: asyncio.Event) -> None:
        # The gauges (waiting by reason, blocked heads, free capacity) come from the
        # schedulers' own queries, polled beside the worker.
        poller = asyncio.create_task(
            telemetry.poll_schedulers(client, interval_s=interval_s, stop=stop)
        )
        try:
            await run_control_plane_worker(
                client,
                database_url=database_url,
                fleet=list(fleet.clusters),
                stop=stop,
                admit_wait_s=admit_wait_s,
                contended_rate=contended_rate,
                seed_queues=[q.to_dict() for q in fleet.queues],
                seed_tenant=cfg.tenant,
                on_ready=ready,
                history_retention=history_retention,
                cluster_silent_s=cluster_silent_s,
                serves=serves,
            )
        finally:
            stop.set()
            await poller

    asyncio.run(_serve(cfg, body))


@worker.command("cluster")
@click.option("--name", required=True, help="The cluster this worker serves (a fleet cluster).")
@click.option(
    "--backend",
    type=click.Choice(["sim", "kubernetes"]),
    default="sim",
    show_default=True,
    help="sim: an in-process simulated cluster; kubernetes: a real API server.",
)
@_fleet_option
@click.option("--kubeconfig", default=None, help="kubernetes backend: kubeconfig file.")
@click.option("--context", "kube_context", default=None, help="kubernetes backend: context.")
@click.option(
    "--pod-namespace",
    default=None,
    help="kubernetes backend: namespace the pods run in. [default: the backend's]",
)
@click.option(
    "--config",
    "config_path",
    type=click.Path(dir_okay=False),
    envvar="HEADWAY_CLUSTER_CONFIG",
    default=None,
    help="kubernetes backend: the cluster's configuration file (YAML: namespace, "
    "queue_namespaces, gpu_node_label, gpu_names, delete_grace_seconds, "
    "image_pull_grace_seconds; see headway.worker.kube_config). [env "
    "HEADWAY_CLUSTER_CONFIG]",
)
@click.option(
    "--pool-listen",
    envvar="HEADWAY_POOL_LISTEN",
    default=None,
    metavar="HOST:PORT",
    help="kubernetes backend: the address the pods of reusable environments' pools dial "
    "(the worker listens at PORT on every interface; 0: a free one). On a real cluster a "
    "Service in front of the worker, or its pod IP, must be reachable from those pods. "
    "[env HEADWAY_POOL_LISTEN; default: $POD_IP, else this host's address, a free port]",
)
@click.option(
    "--time-scale",
    type=float,
    default=None,
    help="sim backend: simulated seconds per real second. [default: the backend's]",
)
@click.option(
    "--state-dir",
    type=click.Path(file_okay=False),
    envvar="HEADWAY_SIM_STATE_DIR",
    default=None,
    help="sim backend: keep the simulated cluster's pods in this directory, so they outlive"
    " the worker (a restarted worker resumes them). [env HEADWAY_SIM_STATE_DIR; default: in"
    " memory only]",
)
@click.option(
    "--serve-tenant",
    "serve_tenants",
    multiple=True,
    envvar="HEADWAY_WORKER_TENANTS",
    help="A tenant this cluster serves: its scheduler gets the cluster's capacity, and "
    "given this, the worker refuses (and logs) any other tenant's admissions (repeat it, or "
    "list them in the env var separated by spaces, for a cluster shared by several "
    "tenants: each gets the same capacity, every pod counted). [env "
    "HEADWAY_WORKER_TENANTS; default: --tenant gets the reports, and any tenant's work "
    "runs]",
)
@_metrics_port_option
@click.pass_context
def cluster(
    ctx: click.Context,
    name: str,
    backend: str,
    fleet_path: str | None,
    kubeconfig: str | None,
    kube_context: str | None,
    pod_namespace: str | None,
    config_path: str | None,
    pool_listen: str | None,
    time_scale: float | None,
    state_dir: str | None,
    serve_tenants: tuple[str, ...],
    metrics_port: int | None,
) -> None:
    """A cluster worker: dials out to Temporal and runs admitted actions' pods.

    With HEADWAY_POD_LOG set, every pod created, bound and ended is appended to that file
    (one JSON line each, fsync'd), for audits."""
    cfg = settings(ctx)
    tenants = list(dict.fromkeys(check_name(t, "--serve-tenant") for t in serve_tenants))
    explicit = bool(tenants)
    tenants = tenants or [cfg.tenant]
    entry = fleet_cluster(load_fleet(fleet_path), name)
    from headway.worker.cluster import make_backend, run_cluster_worker

    opts = _backend_options(
        backend,
        {
            "kubeconfig": kubeconfig,
            "context": kube_context,
            "namespace": pod_namespace,
            "config": config_path,
            "pool_listen": pool_listen,
            "time_scale": time_scale,
            "state_dir": state_dir,
        },
    )
    try:
        # A state file that cannot be read back is refused before connecting anywhere.
        impl = make_backend(name, backend, entry, **opts)
    except ValueError as exc:
        raise click.ClickException(str(exc)) from exc

    # After the flags are checked, before connecting: a port in use fails at once.
    metrics = _setup_telemetry(f"headway-cluster-{name}", metrics_port)

    by_namespace = cfg.base().tenants_of(tenants)
    # The first connection goes to a namespace it serves (a namespace-scoped credential
    # may be refused any other).
    cfg = replace(cfg, namespace=next(iter(by_namespace)))

    async def body(client: Client, stop: asyncio.Event) -> None:
        # A client per other namespace the served tenants live in (the mapping).
        clients: dict[str, Client] = {}
        for ns, served in by_namespace.items():
            if ns != client.namespace:
                other = await connect_retrying(replace(cfg, namespace=ns), timeout_s=120.0)
                clients.update(dict.fromkeys(served, other))
        where = "; ".join(f"namespace {ns}: {', '.join(ts)}" for ns, ts in by_namespace.items())
        click.echo(
            f"cluster worker ready: cluster {name} ({backend}), Temporal {cfg.address},"
            f" task queue {protocol.cluster_task_queue(name)},"
            f" tenant{'s' if len(tenants) > 1 else ''} by {where}{metrics}",
            err=True,
        )
        # What a dispatch is checked against while the backend cannot see its nodes.
        shapes = [g.shape for g in entry.node_groups] if entry is not None else []
        await run_cluster_worker(
            client,
            name,
            impl,
            tenants=tenants,
            stop=stop,
            shapes=shapes,
            clients=clients or None,
            # Tenants given explicitly are the only ones served; without, any tenant's
            # work in the namespace runs (the development default).
            refuse_other_tenants=explicit,
        )

    if backend == "kubernetes":
        _check_kube_config(kubeconfig, kube_context)
    asyncio.run(_serve(cfg, body))


#: The backend options of ``worker cluster`` by the flag that gives each.
_BACKEND_FLAGS = {
    "kubeconfig": "--kubeconfig",
    "context": "--context",
    "namespace": "--pod-namespace",
    "config": "--config",
    "pool_listen": "--pool-listen",
    "time_scale": "--time-scale",
    "state_dir": "--state-dir",
}


def _backend_options(backend: str, given: dict[str, Any]) -> dict[str, Any]:
    """The options ``make_backend`` takes, from the flags given: a flag of the other
    backend is refused by name; ``--config``'s file is read (the flags win over it)."""
    allowed = (
        {"time_scale", "state_dir"}
        if backend == "sim"
        else {"kubeconfig", "context", "namespace", "config", "pool_listen"}
    )
    misplaced = [k for k, v in given.items() if v is not None and k not in allowed]
    if misplaced:
        raise click.BadParameter(
            f"{', '.join(_BACKEND_FLAGS[k] for k in misplaced)} does not apply to --backend {backend}"
        )
    opts = {k: v for k, v in given.items() if v is not None and k != "config"}
    if given.get("pool_listen") is not None:
        from headway.activities.backends.kube_pool import parse_listen

        try:
            parse_listen(given["pool_listen"])
        except ValueError as exc:
            raise click.BadParameter(str(exc)) from None
    config_path = given.get("config")
    if config_path is not None:
        from headway.worker.kube_config import load_kube_config

        try:
            # The flags win over the file (--pod-namespace over its namespace).
            opts = {**load_kube_config(config_path), **opts}
        except ValueError as exc:
            raise click.BadParameter(str(exc)) from None
    return opts


def _check_kube_config(kubeconfig: str | None, context: str | None) -> None:
    """Fail in one line, before connecting anywhere, when the Kubernetes backend would
    find no configuration (the backend loads it the same way once it runs)."""
    from kubernetes import config as kc

    try:
        if kubeconfig is None and context is None:
            try:
                kc.load_incluster_config()  # type: ignore[no-untyped-call]
            except kc.ConfigException:
                kc.load_kube_config()  # type: ignore[no-untyped-call]
        else:
            kc.new_client_from_config(config_file=kubeconfig, context=context)  # type: ignore[no-untyped-call]
    except (kc.ConfigException, OSError) as exc:
        where = f"--kubeconfig {kubeconfig}" if kubeconfig else "~/.kube/config"
        raise click.ClickException(
            f"--backend kubernetes: no usable Kubernetes configuration in {where} and not "
            f"in a pod ({' '.join(str(exc).split())}); give --kubeconfig FILE [--context "
            "NAME], or run the worker in the cluster with its service account "
            "(docker/k8s/cluster-worker.yaml)"
        ) from None
