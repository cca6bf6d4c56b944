"""The scheduling review on a recorded live run (issue #28): a real Temporal dev server,
the control-plane worker and two simulated cluster workers as `headway worker ...`
processes, actions submitted through the CLI. Then, from the record alone: export ->
simulate comes close to what ran (fidelity, measured and printed), and `headway review`
shows a proposal's effect in the right direction on a case built for it: a quota that
starves the `prod` queue (one 1-CPU action at a time), removed.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from click.testing import CliRunner
from headway.cli._common import load_fleet
from headway.cli._stack import Stack, _headway, wait_ready
from headway.cli.main import cli
from headway.review.compare import fidelity, recorded_view, sim_view
from headway.review.review import fidelity_lines
from headway.review.workload import build_replay
from headway.scheduler.scenario import load_scenario
from headway.scheduler.simulator import simulate
from headway.store import LeaseStore
from headway.store.history import HistoryStore
from temporalio.testing import WorkflowEnvironment

from .chromium import screenshot_shows_charts

pytestmark = pytest.mark.integration

FLEET = """\
clusters:
  - name: c1
    node_groups: [{name: n, count: 1, shape: {cpu: 4, memory: 16Gi}}]
  - name: c2
    node_groups: [{name: n, count: 1, shape: {cpu: 4, memory: 16Gi}}]
queues:
  - name: prod
    priority: high
    max_resources: {cpu: 1}      # the quota that starves it: one action at a time
  - name: batch
    priority: low
"""

PROPOSAL = """\
queues:
  - name: prod
    max_resources: null          # the quota, removed
"""

#: (id, queue, task, cpu, replicas, duration s) in submission order.
WORK = [
    ("p1", "prod", "serve", "1", 1, 2),
    ("b1", "batch", "etl", "1", 1, 3),
    ("p2", "prod", "serve", "1", 1, 2),
    ("p3", "prod", "serve", "1", 1, 2),
    ("g1", "batch", "train", "1", 2, 3),
    ("p4", "prod", "serve", "1", 1, 2),
    ("p5", "prod", "serve", "1", 1, 2),
    ("b2", "batch", "etl", "1", 1, 3),
]


@dataclass
class Recorded:
    address: str
    tenant: str
    database_url: str
    fleet: Path
    dir: Path


def hw(rec: Recorded, *args: str) -> tuple[int, str]:
    result = CliRunner().invoke(
        cli, ["--address", rec.address, "--tenant", rec.tenant, *args], catch_exceptions=False
    )
    return result.exit_code, result.output


@pytest.fixture(scope="module")
def recorded(
    temporal_env: WorkflowEnvironment, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Recorded]:
    """The work above run live and recorded; the stack is stopped once it all ended."""
    address = temporal_env.client.service_client.config.target_host
    d = tmp_path_factory.mktemp("review")
    fleet_path = d / "fleet.yaml"
    fleet_path.write_text(FLEET)
    fleet = load_fleet(fleet_path)
    tenant = f"rv{uuid.uuid4().hex[:8]}"
    url = f"sqlite:///{d / 'headway.db'}"
    rec = Recorded(address, tenant, url, fleet_path, d)
    s = Stack(d, address, None)
    try:
        common = ["--address", address, "--tenant", tenant]
        s.spawn(
            "control-plane",
            _headway(
                *common,
                "worker",
                "control-plane",
                "--database-url",
                url,
                "--fleet",
                str(fleet_path),
            ),
        )
        for c in fleet.clusters:
            s.spawn(
                f"cluster-{c.name}",
                _headway(
                    *common, "worker", "cluster", "--name", c.name, "--fleet", str(fleet_path)
                ),
            )
        asyncio.run(wait_ready(s, fleet, tenant=tenant))
        for aid, queue, task, cpu, replicas, duration in WORK:
            args = ["submit", "--id", aid, "--queue", queue, "--task", task, "--cpu", cpu]
            args += ["--memory", "1Gi", "--duration", str(duration)]
            if replicas > 1:
                args += ["--replicas", str(replicas)]
            code, out = hw(rec, *args)
            assert code == 0, out
        store = LeaseStore(url)
        try:
            history = HistoryStore(store)
            deadline = time.monotonic() + 120
            while history.count(tenant) < len(WORK):
                assert time.monotonic() < deadline, "the actions did not all end"
                time.sleep(0.5)
        finally:
            store.close()
    finally:
        s.stop()
    yield rec


def test_export_then_simulate_comes_close_to_what_was_recorded(recorded: Recorded) -> None:
    out = recorded.dir / "workload.yaml"
    code, text = hw(
        recorded,
        "export",
        "workload",
        "--since",
        "1h",
        "-o",
        str(out),
        "--database-url",
        recorded.database_url,
        "--fleet",
        str(recorded.fleet),
    )
    assert code == 0, text
    sc = load_scenario(out.read_text(), str(out))  # the scenario schema, as simulate reads it
    assert sorted(w.spec.id for w in sc.workload) == sorted(w[0] for w in WORK)
    prod = next(q for q in sc.queues if q.name == "prod")
    assert prod.max_resources is not None and prod.max_resources.cpu == 1000
    gang = next(w for w in sc.workload if w.spec.id == "g1")
    assert len(gang.spec.pods) == 2
    # `headway simulate` runs the exported file as it is.
    code, text = hw(recorded, "simulate", str(out))
    assert code == 0, text

    store = LeaseStore(recorded.database_url)
    try:
        rows = HistoryStore(store).window(recorded.tenant, 0.0)
    finally:
        store.close()
    replay = build_replay(rows, _layout_of(sc))
    rec_view = recorded_view("recorded", replay.ran, replay.t0, replay.scenario)
    sim = sim_view("today", sc, simulate(sc))
    fid = fidelity(rec_view, sim)
    print("\n".join(fidelity_lines(fid)))  # the figures, for the report to the lead
    assert fid.actions == len(WORK)
    # prod runs one at a time in submission order under its quota, live and replayed.
    rec_prod = [
        a.id for a in sorted(rec_view.actions, key=lambda a: a.start or 0) if a.queue == "prod"
    ]
    sim_prod = [a.id for a in sorted(sim.actions, key=lambda a: a.start or 0) if a.queue == "prod"]
    assert rec_prod == sim_prod == ["p1", "p2", "p3", "p4", "p5"]
    assert fid.order_correlation is not None and fid.order_correlation > 0.8
    assert set(fid.wait_error) == {"prod", "batch"}


def _layout_of(sc):  # type: ignore[no-untyped-def]
    from headway.review.workload import Layout

    return Layout(sc.clusters, sc.queues, sc.org, sc.environments)


def test_review_shows_the_removed_quota_unstarving_prod(recorded: Recorded) -> None:
    proposal = recorded.dir / "proposal.yaml"
    proposal.write_text(PROPOSAL)
    report = recorded.dir / "review.html"
    figures = recorded.dir / "review.json"
    code, text = hw(
        recorded,
        "review",
        "--since",
        "1h",
        "--proposal",
        str(proposal),
        "--report",
        str(report),
        "--starved",
        "3s",
        "-o",
        str(figures),
        "--database-url",
        recorded.database_url,
        "--fleet",
        str(recorded.fleet),
    )
    assert code == 0, text
    print(text)  # the terminal summary, for the report to the lead
    assert "WAIT P50" in text
    assert "STARVED: actions that waited over 3.0s." in " ".join(text.split())
    doc = json.loads(figures.read_text())
    today, prop = (
        doc["views"]["today"]["queues"]["prod"],
        doc["views"]["proposal"]["queues"]["prod"],
    )
    # Under the quota prod's five 2 s actions run one after another: the last waits ~8 s.
    assert today["wait_max"] > prop["wait_max"]
    assert today["wait_p50"] > prop["wait_p50"]
    assert today["starved"] > prop["starved"] == 0
    sooner = {m["id"] for m in doc["sooner"]}
    assert {"p3", "p4", "p5"} <= sooner  # named
    assert not {m["id"] for m in doc["later"]} & {"p1", "p2", "p3", "p4", "p5"}
    assert doc["fidelity"]["actions"] == len(WORK)
    # The report renders in a real browser, charts drawn.
    shown = screenshot_shows_charts(report, recorded.dir / "review.png")
    assert shown.charts == 4  # wait CDFs, utilization, queue depth, gangs
    print(f"report {report}: {shown}")
