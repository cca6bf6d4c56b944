"""One cluster shared by two tenants (issue #22): its worker serves both, and each
tenant's scheduler gets the same capacity, every pod counted whoever's it is. Separate
processes, as deployed: a Temporal dev server, the control-plane worker and one cluster
worker started with ``--serve-tenant`` twice."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from headway.cli._common import free_port, load_fleet
from headway.cli._stack import Stack, _headway, start_server, wait_ready
from headway.cli.server import server_argv
from waiting import eventually

pytestmark = pytest.mark.integration

# One node of 4 CPUs: one tenant's 4-CPU action leaves no room for the other's.
FLEET = """\
clusters:
  - name: shared
    node_groups:
      - {name: n, count: 1, shape: {cpu: 4, memory: 16Gi}}
queues:
  - name: default
"""


@pytest.fixture(scope="module")
def shared(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Stack, Path]]:
    data = tmp_path_factory.mktemp("shared")
    fleet = data / "fleet.yaml"
    fleet.write_text(FLEET)
    port = free_port()
    stack = Stack(data, f"127.0.0.1:{port}", None)
    try:
        start_server(stack, server_argv(data, port=port, headless=True), port)
        db = f"sqlite:///{data / 'headway.db'}"
        stack.spawn(
            "control-plane",
            _headway(
                "--address",
                stack.address,
                "worker",
                "control-plane",
                "--fleet",
                str(fleet),
                "--database-url",
                db,
            ),
        )
        stack.spawn(
            "cluster-shared",
            _headway(
                "--address",
                stack.address,
                "worker",
                "cluster",
                "--name",
                "shared",
                "--backend",
                "sim",
                "--fleet",
                str(fleet),
                "--serve-tenant",
                "team-a",
                "--serve-tenant",
                "team-b",
                "--state-dir",
                str(data / "sim"),
            ),
        )
        import asyncio

        for tenant in ("team-a", "team-b"):
            asyncio.run(wait_ready(stack, load_fleet(str(fleet)), tenant=tenant))
        yield stack, fleet
    finally:
        stack.stop()


def hw(stack: Stack, tenant: str, *args: str) -> tuple[int, str]:
    proc = subprocess.run(
        _headway("--address", stack.address, "--tenant", tenant, *args),
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    return proc.returncode, proc.stdout + proc.stderr


def describe(stack: Stack, tenant: str, action: str) -> dict[str, Any]:
    code, out = hw(stack, tenant, "describe", "action", action, "-o", "json")
    assert code == 0, out
    doc: dict[str, Any] = json.loads(out)
    return doc


def test_a_cluster_shared_by_two_tenants_is_never_overcommitted(
    shared: tuple[Stack, Path],
) -> None:
    stack, _ = shared
    code, out = hw(stack, "team-a", "submit", "--cpu", "4", "--duration", "30", "--id", "big-a")
    assert code == 0, out
    eventually(
        lambda: describe(stack, "team-a", "big-a")["state"] == "running" or None,
        "team-a's action running",
    )
    # team-b's scheduler has heard the same capacity: the node is full, so its action
    # waits for room in its queue, instead of being sent to a cluster without it.
    code, out = hw(stack, "team-b", "submit", "--cpu", "4", "--duration", "1", "--id", "big-b")
    assert code == 0, out
    # Once team-a's action ends, the room is team-b's. (Judged from the record, not by
    # catching b while it waits: on a loaded machine the CLI calls can take most of a's
    # 30 s, and b may wait only a moment.)
    b = eventually(
        lambda: ((w := describe(stack, "team-b", "big-b"))["state"] == "succeeded" and w) or None,
        "team-b's action done",
        show=lambda: (describe(stack, "team-b", "big-b"), describe(stack, "team-a", "big-a")),
    )
    a = describe(stack, "team-a", "big-a")
    assert a["state"] == "succeeded", a
    a_ended = max(e["at"] for e in a["events"] if e["kind"] == "Succeeded")
    b_bound = min(e["at"] for e in b["events"] if e["kind"] == "Scheduled")
    assert b_bound >= a_ended, (a["events"], b["events"])  # never both on the node
    assert [t["outcome"] for t in b["attempts"]] == ["Succeeded"], b  # not sent there early
    if b["submitted_at"] < a_ended:
        assert "NoClusterCapacity" in b["reasons"], b  # it waited for the room
