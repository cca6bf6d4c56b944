"""The cluster worker's ``--pool-listen`` flag (the address the pods of reusable
environments' pools dial on the Kubernetes backend): checked before anything connects."""

from __future__ import annotations

import pytest
from click.testing import CliRunner
from headway.cli.main import cli

NOWHERE = "127.0.0.1:1"


def _worker(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(
        cli, ["--address", NOWHERE, "worker", "cluster", "--name", "cpu", *args]
    )
    return result.exit_code, result.output


@pytest.mark.parametrize("value", ["hw-worker", "hw-worker:port", "h:99999"])
def test_a_bad_pool_listen_address_is_refused_naming_it(value: str) -> None:
    code, output = _worker("--backend", "kubernetes", "--pool-listen", value)
    assert code != 0
    assert f"--pool-listen: '{value}' is not HOST:PORT" in output
    assert "Traceback" not in output


def test_pool_listen_does_not_apply_to_the_simulated_backend() -> None:
    code, output = _worker("--backend", "sim", "--pool-listen", "h:1")
    assert code != 0
    assert "--pool-listen does not apply to --backend sim" in output
