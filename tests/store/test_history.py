"""The record of finished actions in SQL: written once per action, read by window,
pruned by age. SQLite, and PostgreSQL when HEADWAY_TEST_POSTGRES_URL is set."""

from __future__ import annotations

import asyncio
import time
from typing import cast

import pytest
from headway.activities.store import StoreActivities
from headway.store import LeaseStore
from headway.store.history import (
    Finished,
    HistoryStore,
    history_retention,
    parse_duration,
    row_values,
)
from headway.workflows.shared import FinishLeaseInput
from temporalio.client import Client
from temporalio.testing import ActivityEnvironment


def finished(aid: str, submitted: float, **kw: object) -> Finished:
    base: dict[str, object] = {
        "action_id": aid,
        "queue": "q",
        "submitted_at": submitted,
        "admitted_at": submitted + 1.0,
        "ended_at": submitted + 11.0,
        "outcome": "succeeded",
        "cluster": "c1",
        "pods": [{"cpu": 1000, "memory": 2**30}],
        "demand": {"resources": {"cpu": "1", "memory": "1Gi"}},
    }
    base.update(kw)
    return Finished.from_dict(base)


def test_an_action_is_recorded_once_and_the_first_end_stands(
    store: LeaseStore, tenant: str
) -> None:
    h = HistoryStore(store)
    assert h.record(tenant, finished("a", 100.0)) is True
    # A retried activity writes the same action again, even with other times: no second
    # row, and the first stands.
    assert h.record(tenant, finished("a", 100.0, ended_at=999.0)) is False
    assert h.count(tenant) == 1
    (row,) = h.window(tenant, 0.0)
    assert row.ended_at == 111.0 and row.wait == 1.0 and row.duration == 10.0
    assert row.run == "a" and row.task == "a"  # no run or task given: the action's own


def test_the_window_is_by_submission_time_in_submission_order(
    store: LeaseStore, tenant: str
) -> None:
    h = HistoryStore(store)
    for aid, at in (("late", 300.0), ("early", 100.0), ("middle", 200.0)):
        h.record(tenant, finished(aid, at))
    h.record(tenant + "-other", finished("x", 150.0))
    assert [r.action_id for r in h.window(tenant, 0.0)] == ["early", "middle", "late"]
    assert [r.action_id for r in h.window(tenant, 150.0)] == ["middle", "late"]
    assert [r.action_id for r in h.window(tenant, 150.0, until=300.0)] == ["middle"]


def test_rows_older_than_the_retention_are_pruned(store: LeaseStore, tenant: str) -> None:
    h = HistoryStore(store)
    h.record(tenant, finished("old", 0.0))  # ended at 11
    h.record(tenant, finished("new", 1000.0))  # ended at 1011
    assert h.prune(before=500.0) >= 1  # (PostgreSQL: other tests' old rows go too)
    assert [r.action_id for r in h.window(tenant, 0.0)] == ["new"]


def test_an_unknown_outcome_is_refused(store: LeaseStore, tenant: str) -> None:
    with pytest.raises(ValueError, match="outcome: 'exploded'"):
        HistoryStore(store).record(tenant, finished("a", 0.0, outcome="exploded"))


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("7d", 7 * 86400.0), ("12h", 43200.0), ("30m", 1800.0), ("90", 90.0), ("2w", 1209600.0)],
    ids=["days", "hours", "minutes", "bare-seconds", "weeks"],
)
def test_durations_read_with_their_unit(text: str, seconds: float) -> None:
    assert parse_duration(text, "--since") == seconds


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("7 days", "--history-retention: '7 days' is not a duration"),
        ("0", "must be more than 0"),
    ],
    ids=["a-word-for-a-unit", "zero"],
)
def test_a_bad_retention_is_an_error_naming_it(value: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        history_retention(value)


def test_retention_forever_keeps_everything() -> None:
    assert history_retention("forever") is None


@pytest.mark.parametrize("nowait", [False, True], ids=["in-a-thread", "on-the-event-loop"])
def test_a_record_rides_the_group_commit_of_its_end_once(
    store: LeaseStore, tenant: str, nowait: bool
) -> None:
    """The control plane writes the record as an op of the finish's group commit; the
    same op again (a retried activity) writes nothing twice."""
    store.put_lease(tenant, "a", "q", "wf-a", {"id": "a"}, 1.0)
    row = row_values(tenant, finished("a", 1.0))
    ops = [("finish", (tenant, "a", "finished")), ("record", (row,))]
    for _ in range(2):
        out = store.apply_nowait(ops) if nowait else None
        if out is None:  # the event loop's path declines when it would wait: as the worker
            store.apply(ops)
    h = HistoryStore(store)
    assert h.count(tenant) == 1
    assert [r.action_id for r in h.window(tenant, 0.0)] == ["a"]


def test_a_record_missing_a_column_is_refused_before_anything_is_written(
    store: LeaseStore, tenant: str
) -> None:
    row = row_values(tenant, finished("a", 1.0))
    del row["outcome"]
    with pytest.raises(ValueError, match="record: missing outcome"):
        store.apply([("record", (row,))])
    assert HistoryStore(store).count(tenant) == 0


async def test_the_worker_prunes_records_older_than_its_retention_as_it_records(
    store: LeaseStore, tenant: str
) -> None:
    """``finish_lease`` (run as Temporal runs an activity) writes the record and deletes
    the ones that ended before the retention period."""
    h = HistoryStore(store)
    now = time.time()
    h.record(tenant, finished("last-month", now - 30 * 86400))
    store.put_lease(tenant, "fresh", "q", "wf-fresh", {"id": "fresh"}, now)
    # A pending lease's end deletes it and nudges no one: the client is never called.
    acts = StoreActivities(store, cast(Client, None), history_retention_s=7 * 86400)
    rec = finished("fresh", now - 20).to_dict()
    await ActivityEnvironment().run(
        acts.finish_lease, FinishLeaseInput(tenant, "fresh", "finished", record=rec)
    )
    for _ in range(100):  # the prune runs off the event loop
        if h.count(tenant) == 1:
            break
        await asyncio.sleep(0.05)
    assert [r.action_id for r in h.window(tenant, 0.0)] == ["fresh"]
