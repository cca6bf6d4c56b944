"""The policy tables together: every case has a name of its own."""

from __future__ import annotations

from typing import Any

import pytest
from headway.scheduler import Scheduler
from headway.scheduler.core import PassError

from ..helpers import job, scenario
from . import (
    test_backfill,
    test_capacity_and_health,
    test_concurrency_and_quotas,
    test_draining_and_live_updates,
    test_environments,
    test_placement,
    test_priority,
    test_result_fields,
    test_same_instant_order,
    test_strict_and_greedy,
    test_submission,
)
from .cases import C1, Q
from .engines import run_on

TABLES = (
    test_submission.SUBMISSION,
    test_concurrency_and_quotas.GATES,
    test_priority.PRIORITY,
    test_strict_and_greedy.STRICT,
    test_backfill.BACKFILL,
    test_placement.PLACEMENT,
    test_capacity_and_health.CAPACITY,
    test_draining_and_live_updates.LIVE,
    test_environments.ENVIRONMENTS,
    test_same_instant_order.TIME,
    test_result_fields.RESULT,
)


def test_every_case_has_a_name_of_its_own() -> None:
    ids = [c.id for table in TABLES for c in table]
    assert len(ids) == len(set(ids))
    assert len(ids) > 50


def test_the_reference_engine_never_runs_the_cores_pass(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_pass(*_: Any) -> int:
        raise AssertionError("the core's pass ran on the reference engine")

    monkeypatch.setattr(Scheduler, "_pass", no_pass)
    doc = run_on("reference", scenario(C1, Q, [job("a", "q", 0, 10), job("b", "q", 5, 10)]))
    assert [a["start"] for a in doc["actions"]] == [0, 5]
    with pytest.raises(PassError):
        run_on("incremental", scenario(C1, Q, [job("a", "q", 0, 10)]))
