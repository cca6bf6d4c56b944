"""`headway submit` refuses absurd demands before anything is sent: zero GPUs of a type,
a pod larger than any machine, a gang larger than any action may be, times that are not
finite; each is named with its flag and value, exit 2, no traceback."""

from __future__ import annotations

import pytest
from click.testing import CliRunner
from headway.cli._common import free_port
from headway.cli.main import cli

# Nothing listens here: a submission that got past the checks would fail connecting
# (exit 1, "cannot reach"), not with a usage error.
NOWHERE = f"127.0.0.1:{free_port()}"


def submit(*args: str):
    return CliRunner().invoke(cli, ["--address", NOWHERE, "submit", *args])


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (["--gpu", "H100:0"], "--gpu: 'H100:0' asks for no GPUs of type H100"),
        (["--replicas", "99999999999999"], "'--replicas': 99999999999999 is not in the range"),
        (["--cpu", "1e400"], "--cpu: '1e400' is more than one pod may ask for (at most 10000"),
        (["--cpu", "10001"], "--cpu: '10001' is more than one pod may ask for"),
        (["--memory", "1e400"], "--memory: '1e400' is more than one pod may ask for"),
        (["--memory", "257Ti"], "--memory: '257Ti' is more than one pod may ask for (at most"),
        (["--ephemeral-storage", "1Ei"], "--ephemeral-storage: '1Ei' is more than one pod"),
        (["--gpu", "1025"], "--gpu: '1025' is more than one pod may ask for (at most 1024)"),
        (["--gpu", "H100:" + "9" * 5000], "--gpu: 'H100:99999"),
        (["--duration", "nan"], "--duration: nan must be a finite number of seconds"),
        (["--duration", "1e400"], "'--duration': inf is not in the range"),
        (["--estimate", "inf"], "'--estimate': inf is not in the range"),
        (["--count", "99999999999"], "'--count': 99999999999 is not in the range"),
    ],
    ids=lambda v: " ".join(v) if isinstance(v, list) else None,
)
def test_an_absurd_demand_is_a_usage_error_naming_the_flag(args: list[str], named: str):
    result = submit(*args)
    assert result.exit_code == 2, result.output
    assert named in result.output
    assert isinstance(result.exception, SystemExit)  # no traceback
    assert "Traceback" not in result.output
    assert "cannot reach" not in result.output


@pytest.mark.parametrize(
    "args",
    [
        ["--gpu", "H100:1024", "--cpu", "10000", "--memory", "256Ti"],
        ["--gpu", "0"],  # no GPUs, any type: a CPU pod
        ["--replicas", "10000", "--count", "10000"],
        ["--duration", "31536000", "--estimate", "0"],
    ],
    ids=lambda v: " ".join(v),
)
def test_the_bounds_themselves_are_accepted(args: list[str]):
    # Past the checks: it tries to connect to nowhere.
    result = submit(*args)
    assert result.exit_code == 1, result.output
    assert "Temporal" in result.output or "reach" in result.output, result.output
