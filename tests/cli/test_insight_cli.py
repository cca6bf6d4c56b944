"""``headway forecast`` and ``headway what-if`` over a scheduler's state (CliRunner)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from click.testing import CliRunner
from headway.cli import insight
from headway.cli.main import cli
from headway.scheduler import (
    ActionSpec,
    Algorithm,
    ClusterSpec,
    NodeGroup,
    Pod,
    QueueSpec,
    Scheduler,
)


def live() -> Scheduler:
    s = Scheduler(
        [ClusterSpec("c1", (NodeGroup("n", 2, Pod(64_000, 2**38, 0, 8, "H200")),))],
        [QueueSpec("train", algorithm=Algorithm.greedy, action_concurrency=1)],
    )
    for i in range(3):
        a = ActionSpec(f"a{i}", "train", (Pod(1000, 2**30, 0, 2, "H200"),), seq=i, estimate=100.0)
        assert s.submit(a, 0.0) is None
    s.schedule(0.0)
    return s


@pytest.fixture
def snapshot(monkeypatch: pytest.MonkeyPatch) -> None:
    async def fake(client: Any, tenant: str) -> tuple[Scheduler, float]:
        return Scheduler.from_snapshot(live().to_snapshot()), 0.0

    async def no_connect(cfg: Any) -> Any:
        return object()

    monkeypatch.setattr(insight, "fetch_snapshot", fake)
    monkeypatch.setattr("headway.cli._common.connect", no_connect)


def test_forecast_lists_projected_starts(snapshot: None) -> None:
    res = CliRunner().invoke(cli, ["forecast", "--json"])
    assert res.exit_code == 0, res.output
    rows = {r["action"]: r for r in json.loads(res.output)}
    assert rows["a1"]["starts_in_s"] == 100.0 and rows["a2"]["starts_in_s"] == 200.0
    assert rows["a1"]["reason"] == "ActionConcurrency"


def test_what_if_shows_who_moves_without_applying(snapshot: None) -> None:
    res = CliRunner().invoke(cli, ["what-if", "train", "--action-concurrency", "3"])
    assert res.exit_code == 0, res.output
    assert "2 of 2 waiting actions would start at a different time" in res.output
    assert "1m40s -> now" in res.output


def test_what_if_bad_flag_names_it_and_sends_nothing(snapshot: None) -> None:
    res = CliRunner().invoke(cli, ["what-if", "train", "--action-concurrency", "-2"])
    assert res.exit_code != 0
    assert "--action-concurrency" in res.output and "-2" in res.output


def test_forecast_says_which_would_wait_past_max_queued_time(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The same queue with a 150 s limit: a1 starts at 100, a2 (at 200) would not.
    async def fake(client: Any, tenant: str) -> tuple[Scheduler, float]:
        s = live()
        s.update_queue("train", {"max_queued_time": 150})
        return Scheduler.from_snapshot(s.to_snapshot()), 0.0

    async def no_connect(cfg: Any) -> Any:
        return object()

    monkeypatch.setattr(insight, "fetch_snapshot", fake)
    monkeypatch.setattr("headway.cli._common.connect", no_connect)
    res = CliRunner().invoke(cli, ["forecast", "--json"])
    assert res.exit_code == 0, res.output
    rows = {r["action"]: r for r in json.loads(res.output)}
    assert (rows["a1"]["starts_in_s"], rows["a1"]["expires_in_s"]) == (100.0, None)
    assert (rows["a2"]["starts_in_s"], rows["a2"]["expires_in_s"]) == (None, 150.0)
    table = CliRunner().invoke(cli, ["forecast"])
    assert "never (QueuedTooLong in 2m30s)" in table.output, table.output


def test_forecast_of_an_unknown_queue_names_it_and_fails(snapshot: None) -> None:
    res = CliRunner().invoke(cli, ["forecast", "--queue", "trian"])
    assert res.exit_code == 1, res.output
    assert "--queue: queue 'trian' does not exist (queues: train)" in res.output
    assert "Traceback" not in res.output
