"""``headway simulate``: what the scheduler would do with your fleet, queues and workload."""

from __future__ import annotations

import sys
from pathlib import Path

import click
from headway.scheduler.scenario import ScenarioError, load_scenario
from headway.scheduler.simulator import SwfError, load_swf, render_json
from headway.scheduler.simulator import simulate as run_sim

__all__ = ["simulate"]


@click.command("simulate")
@click.argument("scenario", required=False, type=click.Path(dir_okay=False, path_type=Path))
@click.option(
    "--swf",
    "swf",
    type=click.Path(dir_okay=False, path_type=Path),
    help="An SWF trace instead of a scenario.",
)
@click.option(
    "--algorithm",
    type=click.Choice(["strict", "greedy", "backfill", "easy"]),
    help="With --swf: the queue's algorithm.",
)
@click.option(
    "--estimates",
    type=click.Choice(["requested", "actual", "history"]),
    default="requested",
    show_default=True,
    help="With --swf: where runtime estimates come from.",
)
@click.option(
    "-o",
    "--output",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Write the JSON result here.",
)
@click.option(
    "--seed", type=int, default=0, show_default=True, help="Seed (the run is deterministic)."
)
@click.option(
    "--report",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Also write the report: one self-contained HTML file with charts (as `headway review`).",
)
@click.option(
    "--starved",
    default="10m",
    show_default=True,
    help="With --report: a wait longer than this counts as starved.",
)
def simulate(
    scenario: Path | None,
    swf: Path | None,
    algorithm: str | None,
    estimates: str,
    output: Path | None,
    seed: int,
    report: Path | None,
    starved: str,
) -> None:
    """Run SCENARIO.yaml (or an SWF trace) through the scheduler core on a simulated clock.

    Prints a per-queue summary; with -o writes the full JSON result.
    """
    if (scenario is None) == (swf is None):
        raise click.UsageError("give either SCENARIO or --swf TRACE (exactly one)")
    try:
        if swf is not None:
            if algorithm is None:
                raise click.UsageError("--swf needs --algorithm strict|greedy|backfill|easy")
            text = _read(swf)
            sc, skipped = load_swf(text, algorithm, estimates, str(swf))
        else:
            assert scenario is not None
            if algorithm is not None:
                raise click.UsageError("--algorithm goes with --swf only")
            sc = load_scenario(_read(scenario), str(scenario))
            skipped = 0
    except (ScenarioError, SwfError) as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(2)
    res = run_sim(sc, seed=seed, skipped=skipped)
    from headway.review.review import simulate_summary

    click.echo(simulate_summary(sc, res))
    if output is not None:
        output.write_text(render_json(res))
        click.echo(f"result written to {output}")
    if report is not None:
        from headway.review.review import scenario_review
        from headway.store.history import parse_duration

        from .review import write_report

        try:
            starved_s = parse_duration(starved, "--starved")
        except ValueError as exc:
            click.echo(f"error: {exc}", err=True)
            sys.exit(2)
        name = (scenario or swf or Path("scenario")).name
        write_report(scenario_review(name, sc, res, starved_after=starved_s), report)


def _read(p: Path) -> str:
    try:
        return p.read_text()
    except OSError as exc:
        click.echo(f"error: {p}: {exc.strerror}", err=True)
        sys.exit(2)
