"""``headway export workload`` and ``headway review``: the record of what ran, replayed.

Both read the control plane's store directly (``--database-url``, as the control-plane
worker's), not Temporal: the record (``headway.store.history``) and the tenant's stored
queues and org limits, over the fleet file's clusters.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any, NoReturn

import click
from headway.store.history import Finished

from ._common import DATABASE_URL_ENV, Settings, load_fleet, settings

__all__ = ["export", "review"]

_since_option = click.option(
    "--since",
    default="7d",
    show_default=True,
    help="The window: actions submitted this long ago or later (7d, 12h, 30m, 90s).",
)
_database_option = click.option(
    "--database-url",
    envvar=DATABASE_URL_ENV,
    default=None,
    help="The control plane's store (SQLAlchemy URL). [env HEADWAY_DATABASE_URL;"
    " default: .headway/headway.db, as `headway up`]",
)
_fleet_option = click.option(
    "--fleet",
    "fleet_path",
    type=click.Path(dir_okay=False),
    default=None,
    help="Fleet file whose clusters the replay runs on. [default: the bundled examples/fleet.yaml]",
)


def _fail(msg: str, code: int = 2) -> NoReturn:
    click.echo(f"error: {msg}", err=True)
    sys.exit(code)


def _check_store_exists(database_url: str | None) -> None:
    """A SQLite store that is not there is an error naming it: opening it would create an
    empty one (its directory too) and answer that nothing ran."""
    from headway.store.leases import DEFAULT_DATABASE_URL
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    url = database_url or DEFAULT_DATABASE_URL
    try:
        parsed = make_url(url)
    except ArgumentError:
        return  # LeaseStore names a URL it cannot parse
    path = parsed.database
    sqlite = parsed.get_backend_name() == "sqlite" and path and path != ":memory:"
    if not sqlite or Path(str(path)).exists():
        return
    if database_url is None:
        _fail(
            f"--database-url: no store at {path}, the default (run this where `headway up`"
            " keeps its data directory, or give --database-url)",
            1,
        )
    _fail(f"--database-url: {url!r}: no store at {path}", 1)


def _window(cfg: Settings, since: str, database_url: str | None) -> tuple[list[Finished], Any]:
    """The tenant's recorded actions since ``since``, and its stored configuration."""
    from headway.store import LeaseStore
    from headway.store.config import ConfigStore
    from headway.store.history import HistoryStore, parse_duration
    from sqlalchemy.exc import SQLAlchemyError

    try:
        secs = parse_duration(since, "--since")
    except ValueError as exc:
        _fail(str(exc))
    if secs <= 0:
        _fail(f"--since: {since!r} must be more than 0")
    _check_store_exists(database_url)
    try:
        store = LeaseStore(database_url)
    except (SQLAlchemyError, OSError) as exc:
        _fail(f"--database-url: cannot open the store: {' '.join(str(exc).split())[:200]}", 1)
    try:
        rows = HistoryStore(store).window(cfg.tenant, time.time() - secs)
        config = ConfigStore(store).load(cfg.tenant)
    finally:
        store.close()
    if not any(r.admitted_at is not None for r in rows):
        never = f" ({len(rows)} recorded, none of them ran)" if rows else ""
        _fail(
            f"--since {since}: no action of tenant {cfg.tenant!r} ran in the window{never};"
            " widen it, or check --tenant and --database-url",
            1,
        )
    return rows, config


def _layout(fleet_path: str | None, config: dict[str, Any]) -> Any:
    """Today's layout: the stored queues and org limits (else the fleet file's)."""
    from headway.review.workload import Layout
    from headway.scheduler.model import OrgLimits, QueueSpec

    fleet = load_fleet(fleet_path)
    queues = [QueueSpec.from_dict(q) for q in config.get("queues") or []] or list(fleet.queues)
    org = OrgLimits.from_dict(config["org"]) if config.get("org") else fleet.org
    return Layout(list(fleet.clusters), queues, org, list(fleet.environments))


@click.group("export")
def export() -> None:
    """Export what the control plane recorded."""


@export.command("workload")
@_since_option
@click.option(
    "-o",
    "--output",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Write the scenario here. [default: stdout]",
)
@_database_option
@_fleet_option
@click.pass_context
def export_workload(
    ctx: click.Context,
    since: str,
    output: Path | None,
    database_url: str | None,
    fleet_path: str | None,
) -> None:
    """The actions that ran in the window as a scenario (`headway simulate` runs it).

    Each is a workload entry with its submit time (seconds from the window's first),
    its actual duration, demand, run, task and estimate, under the tenant's queues and
    org limits as stored and the fleet file's clusters.
    """
    from headway.review.workload import build_replay, dump, scenario_doc

    cfg = settings(ctx)
    rows, config = _window(cfg, since, database_url)
    replay = build_replay(rows, _layout(fleet_path, config))
    from headway.review.review import _window_notes

    header = "\n".join(
        [
            f"Exported by `headway export workload --since {since}` (tenant {cfg.tenant}).",
            *_window_notes(replay),
            "Durations are as recorded (admission to end); submit times are seconds",
            "from the window's first submission.",
        ]
    )
    text = dump(scenario_doc(replay), header)
    if output is None:
        click.echo(text, nl=False)
        return
    output.write_text(text)
    click.echo(f"{len(replay.ran)} actions written to {output}", err=True)


@click.command("review")
@_since_option
@click.option(
    "--proposal",
    type=click.Path(dir_okay=False, path_type=Path),
    required=True,
    help="The proposed layout: YAML with queues: (each a queue's name and the fields it"
    " changes), org:, clusters:.",
)
@click.option(
    "--report",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Also write the report (one self-contained HTML file, charts embedded).",
)
@click.option(
    "--starved",
    default="10m",
    show_default=True,
    help="An action that waits longer than this counts as starved.",
)
@click.option(
    "--moved",
    default=None,
    help="Name the actions starting at least this much sooner or later. [default: 5%"
    " of the window's span, at least 1s]",
)
@click.option(
    "-o",
    "--output",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Write the figures as JSON here.",
)
@_database_option
@_fleet_option
@click.pass_context
def review(
    ctx: click.Context,
    since: str,
    proposal: Path,
    report: Path | None,
    starved: str,
    moved: str | None,
    output: Path | None,
    database_url: str | None,
    fleet_path: str | None,
) -> None:
    """Replay the recorded window under today's layout and under --proposal, side by side.

    Per queue: wait p50/p95/max, time blocked behind gangs, actions starved; per cluster:
    utilization; the actions that start much sooner or later, named; and how close the
    replay under today's layout came to what was recorded.
    """
    from headway.review.review import run_review, summary
    from headway.review.workload import ProposalError, apply_proposal
    from headway.store.history import parse_duration

    cfg = settings(ctx)
    try:
        starved_s = parse_duration(starved, "--starved")
        moved_s = parse_duration(moved, "--moved") if moved is not None else None
    except ValueError as exc:
        _fail(str(exc))
    try:
        text = proposal.read_text()
    except OSError as exc:
        _fail(f"--proposal: {proposal}: {exc.strerror}")
    rows, config = _window(cfg, since, database_url)
    today = _layout(fleet_path, config)
    try:
        proposed = apply_proposal(today, text, str(proposal))
    except ProposalError as exc:
        _fail(str(exc))
    rv = run_review(rows, today, proposed, starved_after=starved_s, moved_by=moved_s)
    click.echo(summary(rv))
    if output is not None:
        output.write_text(json.dumps(rv.to_dict(), indent=2) + "\n")
        click.echo(f"figures written to {output}")
    if report is not None:
        write_report(rv, report)


def write_report(rv: Any, path: Path) -> None:
    """Render the review's HTML report to ``path`` (matplotlib needed)."""
    try:
        from headway.review.report import render
    except ImportError as exc:  # the optional extra is missing
        _fail(
            f"--report: the report needs matplotlib ({exc.name} is missing):"
            " pip install 'headway[report]'",
            1,
        )
    path.write_text(render(rv))
    click.echo(f"report written to {path.resolve()}")
