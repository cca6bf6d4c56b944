"""`headway demo` runs its whole workload on a real server and exits 0 when it is done."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from headway.cli._common import free_port
from headway.cli.demo import WORKLOAD

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
