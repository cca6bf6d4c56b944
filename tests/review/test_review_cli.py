"""`headway export workload`, `headway review` and `simulate --report` on a record
written straight into a store (no server): bad input is a clear error naming the field
and value with a non-zero exit, never a traceback; the summary speaks in units."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from click.testing import CliRunner
from headway.cli.main import cli
from headway.review.units import human_duration
from headway.store import LeaseStore
from headway.store.history import Finished, HistoryStore

from .chromium import screenshot_shows_charts

FLEET = """\
clusters:
  - name: c1
    node_groups: [{name: n, count: 1, shape: {cpu: 4, memory: 16Gi}}]
queues:
  - {name: prod, priority: high, max_resources: {cpu: 1}}
  - {name: batch, priority: low}
"""


@pytest.fixture
def recorded(tmp_path: Path) -> tuple[str, Path]:
    """A store holding three prod actions that ran one after another an hour ago, and one
    cancelled while it waited; and the fleet file."""
    url = f"sqlite:///{tmp_path / 'h.db'}"
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text(FLEET)
    store = LeaseStore(url)
    h = HistoryStore(store)
    t0 = time.time() - 3600
    for i in range(3):
        h.record(
            "default",
            Finished(
                action_id=f"p{i}",
                queue="prod",
                submitted_at=t0,
                admitted_at=t0 + 60 * i,
                ended_at=t0 + 60 * (i + 1),
                outcome="succeeded",
                cluster="c1",
                pods=[{"cpu": 1000, "memory": 2**30}],
                demand={"resources": {"cpu": "1", "memory": "1Gi"}},
            ),
        )
    h.record(
        "default",
        Finished(
            action_id="gave-up",
            queue="batch",
            submitted_at=t0,
            ended_at=t0 + 5,
            outcome="cancelled",
            pods=[{"cpu": 1000}],
        ),
    )
    store.close()
    return url, fleet


def run(*args: str) -> tuple[int, str]:
    r = CliRunner().invoke(cli, list(args))
    assert r.exception is None or isinstance(r.exception, SystemExit), r.exception
    return r.exit_code, r.output


def review(recorded: tuple[str, Path], proposal: Path, *extra: str) -> tuple[int, str]:
    url, fleet = recorded
    return run(
        "review",
        "--proposal",
        str(proposal),
        "--database-url",
        url,
        "--fleet",
        str(fleet),
        *extra,
    )


@pytest.mark.parametrize(
    ("proposal", "message"),
    [
        (
            "queues:\n  - {name: nope, priority: high}\n",
            "queues[0].name: 'nope' is not a queue of the recorded layout (queues: prod, batch)",
        ),
        (
            "queues:\n  - {name: prod, max_resources: {cpu: lots}}\n",
            "queues[0].max_resources.cpu: 'lots'",
        ),
        ("queues:\n  - {name: prod, priority: urgent}\n", "queues[0].priority: 'urgent'"),
        (
            "queues:\n  - {name: prod, clusters: [c9]}\n",
            "queues[0].clusters: 'c9' is not a cluster of the fleet",
        ),
        ("org: {max_concurrent_actions: -3}\n", "org.max_concurrent_actions: -3"),
        ("quotas: {}\n", "quotas: not a proposal field"),
        ("queues: [\n", "not valid YAML"),
    ],
    ids=[
        "an-unknown-queue",
        "a-bad-quantity",
        "a-bad-priority",
        "an-unknown-cluster",
        "a-negative-org-limit",
        "an-unknown-section",
        "not-yaml",
    ],
)
def test_a_bad_proposal_is_an_error_naming_the_field_and_value(
    recorded: tuple[str, Path], tmp_path: Path, proposal: str, message: str
) -> None:
    p = tmp_path / "proposal.yaml"
    p.write_text(proposal)
    code, out = review(recorded, p)
    assert code == 2, out
    assert message in out
    assert str(p) in out  # the file is named
    assert "Traceback" not in out


@pytest.mark.parametrize(
    ("args", "code", "message"),
    [
        (["--since", "10m"], 1, "--since 10m: no action of tenant 'default' ran in the window"),
        (["--since", "7 days"], 2, "--since: '7 days' is not a duration"),
        (["--since", "0s"], 2, "--since: '0s' must be more than 0"),
        (["--starved", "soon"], 2, "--starved: 'soon' is not a duration"),
    ],
    ids=["an-empty-window", "a-bad-window", "a-zero-window", "a-bad-threshold"],
)
def test_a_bad_window_or_threshold_is_an_error(
    recorded: tuple[str, Path], tmp_path: Path, args: list[str], code: int, message: str
) -> None:
    p = tmp_path / "proposal.yaml"
    p.write_text("queues: [{name: prod, max_resources: null}]\n")
    got, out = review(recorded, p, *args)
    assert got == code, out
    assert message in out
    assert "Traceback" not in out


def test_export_of_an_empty_window_is_an_error(recorded: tuple[str, Path]) -> None:
    url, fleet = recorded
    code, out = run(
        "export", "workload", "--since", "5m", "--database-url", url, "--fleet", str(fleet)
    )
    assert code == 1
    assert "no action of tenant 'default' ran in the window" in out


def test_export_leaves_out_what_never_ran_and_says_so(recorded: tuple[str, Path]) -> None:
    url, fleet = recorded
    code, out = run("export", "workload", "--database-url", url, "--fleet", str(fleet))
    assert code == 0, out
    assert "# Left out, never ran (nothing to replay): 1 cancelled." in out
    assert "gave-up" not in out.split("workload:")[1]
    assert "duration: 60.0" in out


def test_the_review_summary_speaks_in_units_with_labelled_columns(
    recorded: tuple[str, Path], tmp_path: Path
) -> None:
    p = tmp_path / "proposal.yaml"
    p.write_text("queues: [{name: prod, max_resources: null}]\n")
    code, out = review(recorded, p, "--starved", "90s")
    assert code == 0, out
    lines = out.splitlines()
    head = next(line for line in lines if line.startswith("QUEUE"))
    assert head.split()[:6] == ["QUEUE", "RUN", "ACTIONS", "WAIT", "P50", "WAIT"]
    assert head.endswith("STARVED")
    assert "STARVED: actions that waited over 1m 30s." in " ".join(out.split())
    today = next(line for line in lines if line.startswith("prod ") and "today" in line)
    # Waits of 0, 1 and 2 minutes under the quota: p50 1m, p95 1m 54s, max 2m; one starved.
    assert today.split()[2:] == ["3", "1m", "1m", "54s", "2m", "0s", "1"]
    assert "p2 (prod): waited 2m -> 0s, 2m sooner" in out
    assert "Left out, never ran (nothing to replay): 1 cancelled." in out
    assert all(len(line) <= 80 for line in lines), [line for line in lines if len(line) > 80]


@pytest.mark.parametrize(
    ("seconds", "shown"),
    [
        (None, "-"),
        (0.0, "0s"),
        (0.25, "250 ms"),
        (4.2, "4.2s"),
        (42.0, "42s"),
        (750.0, "12m 30s"),
        (7200.0, "2h"),
        (3.2 * 86400, "3.2 days"),
    ],
    ids=["none", "zero", "milliseconds", "seconds", "tens-of-seconds", "minutes", "hours", "days"],
)
def test_durations_are_shown_with_units(seconds: float | None, shown: str) -> None:
    assert human_duration(seconds) == shown


def test_simulate_prints_units_and_writes_a_report_that_renders(tmp_path: Path) -> None:
    story = Path(__file__).parents[2] / "examples" / "stories" / "multi-gpu-job-never-starts.yaml"
    report = tmp_path / "story.html"
    code, out = run("simulate", str(story), "--report", str(report))
    assert code == 0, out
    assert "makespan 23m" in out  # not "1380.0 s"
    assert "WAIT P50" in out
    shown = screenshot_shows_charts(report, tmp_path / "story.png", two_runs=False)
    assert shown.charts == 4


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("7 days", "'7 days' is not a duration"),
        ("0", "'0' must be more than 0"),
    ],
    ids=["a-word-for-a-unit", "zero"],
)
def test_a_bad_history_retention_stops_the_worker_before_it_starts(
    value: str, message: str
) -> None:
    code, out = run("worker", "control-plane", "--history-retention", value)
    assert code == 2
    assert "--history-retention" in out and message in out


@pytest.mark.parametrize("command", [["export", "workload"], ["review", "--proposal"]])
def test_a_store_that_is_not_there_is_named_and_not_created(
    tmp_path: Path, command: list[str]
) -> None:
    if command[0] == "review":
        proposal = tmp_path / "proposal.yaml"
        proposal.write_text("queues: []\n")
        command = [*command, str(proposal)]
    missing = tmp_path / "no-such-dir" / "headway.db"
    code, out = run(*command, "--database-url", f"sqlite:///{missing}")
    assert code == 1, out
    assert f"no store at {missing}" in out
    assert "Traceback" not in out
    assert not missing.parent.exists()  # opening it would have made an empty store
