"""``headway up``: the embedded default in one command."""

from __future__ import annotations

import asyncio
import signal
import time
from types import FrameType

import click

from ._common import (
    ADDRESS_ENV,
    DATABASE_URL_ENV,
    DEFAULT_PORT,
    cluster_names,
    default_database_url,
    free_port,
    load_fleet,
    port_in_use,
    resolve_data_dir,
    settings,
    ui_hint,
)
from ._stack import running_stack, wait_ready

__all__ = ["up"]


@click.command()
@click.option(
    "--data-dir",
    envvar="HEADWAY_DATA_DIR",
    default=None,
    help="Server state, store and logs. [env HEADWAY_DATA_DIR; default ./.headway]",
)
@click.option(
    "--fleet",
    "fleet_path",
    type=click.Path(dir_okay=False, exists=True),
    default=None,
    help="Fleet file. [default: the bundled examples/fleet.yaml]",
)
@click.option("--port", default=7233, show_default=True, help="Temporal gRPC port.")
@click.option("--ui-port", default=8233, show_default=True, help="Web UI port.")
@click.option("--headless", is_flag=True, help="No Web UI.")
@click.option(
    "--database-url",
    envvar=DATABASE_URL_ENV,
    default=None,
    help="The control plane's store. [default: SQLite in the data directory]",
)
@click.option(
    "--metrics-port",
    type=click.IntRange(0, 65535),
    default=None,
    help="Prometheus scrape port of the control plane; each cluster worker takes the next"
    " one (0: any free ports). [default: 9464, or free ports when it is taken]",
)
@click.pass_context
def up(
    ctx: click.Context,
    data_dir: str | None,
    fleet_path: str | None,
    port: int,
    ui_port: int,
    headless: bool,
    database_url: str | None,
    metrics_port: int | None,
) -> None:
    """Run a Temporal server, the control plane and one simulated cluster worker per fleet
    cluster, until Ctrl-C (or SIGTERM) stops them all."""
    cfg = settings(ctx)
    directory = resolve_data_dir(data_dir)
    fleet = load_fleet(fleet_path)
    clusters = cluster_names(fleet)
    metrics = _metrics_ports(metrics_port, 1 + len(clusters))
    stopping: list[int] = []
    started = False

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        stopping.append(signum)
        if not started:
            # Still starting: unwind now (running_stack stops what already runs).
            raise KeyboardInterrupt

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        with running_stack(
            directory,
            fleet_path=fleet_path,
            port=port,
            ui_port=ui_port,
            headless=headless,
            database_url=database_url or default_database_url(directory),
            tenant=cfg.tenant,
            metrics_ports=metrics,
        ) as stack:
            asyncio.run(wait_ready(stack, fleet, tenant=cfg.tenant, namespace=cfg.namespace))
            started = True
            click.echo(f"Headway is up. Temporal at {stack.address}", err=True)
            hint = address_hint(stack.address, port, cfg.address)
            if hint:
                click.echo(hint, err=True)
            if stack.ui_url:
                click.echo(
                    f"  Web UI:   {stack.ui_url}/namespaces/{cfg.namespace}/workflows", err=True
                )
                hint = ui_hint(port, ui_port)
                if hint:
                    click.echo(hint, err=True)
            click.echo(f"  workers:  control-plane, {', '.join(clusters)} (sim)", err=True)
            click.echo(f"  metrics:  http://localhost:{metrics[0]}/metrics", err=True)
            for name, p in zip(clusters, metrics[1:], strict=True):
                click.echo(f"            {name}: http://localhost:{p}/metrics", err=True)
            click.echo(f"  logs:     {directory / 'logs'}", err=True)
            click.echo("Ctrl-C stops everything.", err=True)
            while not stopping:
                # A dead worker is started again; the server's death, or a worker's
                # crash loop, raises StackFailed (the stack stops, exit 1).
                stack.supervise()
                time.sleep(0.2)
            click.echo("Stopping...", err=True)
    except KeyboardInterrupt:
        if not stopping:
            raise
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
    click.echo("Stopped.", err=True)


def address_hint(address: str, port: int, current: str) -> str | None:
    """What other shells must set to reach this stack, when their default does not: the
    server is not on the default port, or this shell's address points elsewhere."""
    host, _, current_port = current.rpartition(":")
    if port == DEFAULT_PORT and host in ("localhost", "127.0.0.1") and current_port == str(port):
        return None
    return (
        f"  connect:  other shells (the CLI and the SDK): export {ADDRESS_ENV}={address}"
        f" (or headway --address {address} ...)"
    )


#: The control plane's scrape port under ``headway up`` (the Prometheus exporter's usual).
DEFAULT_METRICS_PORT = 9464


def _metrics_ports(given: int | None, count: int) -> list[int]:
    """``count`` scrape ports from ``given`` on: a port given explicitly must be free; the
    default steps aside to free ports when taken (a second `up`, a test run)."""
    if given == 0:
        return [free_port() for _ in range(count)]
    base = DEFAULT_METRICS_PORT if given is None else given
    ports = list(range(base, base + count))
    taken = [p for p in ports if p > 65535 or port_in_use(p, "0.0.0.0")]
    if not taken:
        return ports
    if given is not None:
        raise click.ClickException(
            f"port {taken[0]} (--metrics-port {given}, one per worker from there) is already"
            " in use: pass --metrics-port with a free range, or 0 for any free ports."
        )
    return [free_port() for _ in range(count)]
