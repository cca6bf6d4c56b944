"""`headway simulate --swf` on a trace with nothing to simulate (empty, only comments) is
an error naming the file, exit 2, not an empty summary and exit 0."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner
from headway.cli.main import cli


@pytest.mark.parametrize(
    "text", ["", "; MaxProcs: 4\n; Note: no jobs\n"], ids=["empty", "comments"]
)
def test_a_trace_without_jobs_is_an_error_naming_the_file(tmp_path: Path, text: str):
    trace = tmp_path / "trace.swf"
    trace.write_text(text)
    result = CliRunner().invoke(cli, ["simulate", "--swf", str(trace), "--algorithm", "backfill"])
    assert result.exit_code == 2, result.output
    assert f"error: {trace}: no jobs in it" in result.output
    assert isinstance(result.exception, SystemExit)
