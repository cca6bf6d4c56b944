"""A queue's or the org's limit past any sane value (a depth of 10**23) is refused before
anything is sent, named with its flag; it used to be applied by the scheduler and then
fail the store's 64-bit write on every retry, wedging the tenant's scheduler."""

from __future__ import annotations

import pytest
from click.testing import CliRunner
from headway.cli._common import free_port
from headway.cli._specs import MAX_LIMIT
from headway.cli.main import cli

NOWHERE = f"127.0.0.1:{free_port()}"
HUGE = "99999999999999999999999"


@pytest.mark.parametrize(
    "args",
    [
        ["update", "queue", "default", "--depth", HUGE],
        ["create", "queue", "q", "--action-concurrency", HUGE],
        ["update", "queue", "default", "--run-concurrency", str(MAX_LIMIT + 1)],
        ["update", "queue", "default", "--retry-oom", HUGE],
        ["update", "org", "--max-concurrent-actions", HUGE],
    ],
    ids=lambda a: " ".join(a[:4]),
)
def test_a_limit_past_the_bound_is_a_usage_error_naming_the_flag(args: list[str]):
    result = CliRunner().invoke(cli, ["--address", NOWHERE, *args])
    assert result.exit_code == 2, result.output
    flag = next(a for a in args if a.startswith("--"))
    assert f"{flag}: " in result.output and "is more than 1,000,000,000" in result.output
    assert "cannot reach" not in result.output


def test_the_bound_itself_is_accepted():
    result = CliRunner().invoke(
        cli, ["--address", NOWHERE, "update", "queue", "default", "--depth", str(MAX_LIMIT)]
    )
    assert result.exit_code == 1, result.output  # past the checks: nothing answers
