"""`headway demo` runs its whole workload on a real server and exits 0 when it is done."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from headway.cli._common import free_port
from headway.cli.demo import WORKLOAD
from headway.store import LeaseStore
from headway.store.history import HistoryStore

pytestmark = pytest.mark.integration


def test_demo_finishes_every_action(tmp_path: Path):
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "headway.cli",
            "demo",
            "--data-dir",
            str(tmp_path),
            "--port",
            str(free_port()),
            "--ui-port",
            str(free_port()),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    total = sum(b.count for b in WORKLOAD)
    assert f"All {total} actions finished." in out
    assert any(b.task.replicas and b.task.replicas > 1 for b in WORKLOAD)  # a multi-node gang
    assert "Per-queue waits" in out and "production" in out and "backfill" in out
    assert out.count("/namespaces/default/workflows/headway-action-default-") == total
    assert "Stopped." in out
    # The seed story, live: under the naive layout production waits for the backfill
    # burst; under the fix it starts at once. The record says so, and the review of the
    # naive act is written as a report.
    assert "The seed story, live" in out
    report = tmp_path / "review.html"
    assert f"Review report: {report}" in " ".join(out.split()) and report.exists()
    store = LeaseStore(f"sqlite:///{tmp_path / 'headway.db'}")
    try:
        rows = HistoryStore(store).window("default", 0.0)
    finally:
        store.close()

    def production_waits(act: str) -> list[float]:
        return [
            r.wait
            for r in rows
            if r.run.startswith(f"story-{act}-") and r.queue == "production" and r.wait is not None
        ]

    naive, fixed = production_waits("naive"), production_waits("fixed")
    assert len(naive) == len(fixed) == 2
    assert min(naive) > max(fixed)
