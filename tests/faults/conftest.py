"""The fault suite: every test here carries the ``faults`` marker (select it with
``-m faults``, leave it out with ``-m "not faults"``), and each run's figures are
printed again at the end of the session, so CI's log shows the seed and what the audit
found even when the test passed."""

from __future__ import annotations

from pathlib import Path

import pytest

from .run import summaries

_HERE = Path(__file__).parent


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if _HERE in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.faults)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if summaries:
        terminalreporter.section("fault runs")
        for line in summaries:
            terminalreporter.write_line(line)
