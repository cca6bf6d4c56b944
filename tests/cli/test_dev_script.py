"""`./dev help`: the script's header comment, and nothing of the script itself."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

DEV = Path(__file__).resolve().parents[2] / "dev"


@pytest.mark.parametrize("args", [["help"], ["--help"], []], ids=["help", "--help", "no-args"])
def test_dev_help_prints_the_header_and_no_script_line(args: list[str]):
    out = subprocess.run(
        [str(DEV), *args], capture_output=True, text=True, timeout=120, check=True
    ).stdout
    lines = out.splitlines()
    assert lines[0].startswith("Headway's one entry point"), out
    assert any(line.strip().startswith("./dev up") for line in lines), out
    # Every line is help text: none of the script (`set -euo pipefail` used to follow).
    assert not any(line.startswith(("set ", "cd ", "#!")) for line in lines), out
    assert lines[-1].strip().startswith("./dev <anything>"), out
