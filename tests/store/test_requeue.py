"""``LeaseStore.requeue``: a retried action's next attempt (issue #23) ends the last
attempt's lease and puts its own in one transaction, past the door: a queue at its depth
or a drained rate bucket does not refuse an action it took in once. SQLite, and
PostgreSQL when HEADWAY_TEST_POSTGRES_URL is set."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from headway.scheduler.door import QueueDoor
from headway.scheduler.model import QueueStatus, RateLimit
from headway.store import LeaseStore

from .test_leases import BACKENDS, PG, spec


@pytest.fixture(params=BACKENDS)
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[LeaseStore]:
    url = f"sqlite:///{tmp_path / 'requeue.db'}" if request.param == "sqlite" else PG
    s = LeaseStore(url)
    yield s
    s.close()


@pytest.fixture
def tenant() -> str:
    return f"t{uuid.uuid4().hex[:10]}"


def _retry(s: LeaseStore, t: str, ended: str, attempt: str) -> bool:
    body = {**spec(0, "q"), "id": attempt}
    return s.requeue(t, ended, attempt, "q", "wf-a0", body, 0.0).nudge


@pytest.mark.parametrize(
    "door",
    [
        pytest.param(QueueDoor(depth=1), id="a-queue-at-its-depth"),
        pytest.param(QueueDoor(rate=RateLimit(0.001, 1)), id="a-spent-rate-bucket"),
        pytest.param(QueueDoor(QueueStatus.draining), id="a-draining-queue"),
    ],
)
def test_the_next_attempt_passes_the_door_the_action_passed_once(
    store: LeaseStore, tenant: str, door: QueueDoor
) -> None:
    store.set_door(tenant, None, {"q": QueueDoor(depth=1, rate=RateLimit(0.001, 1))})
    assert store.put_lease(tenant, "a0", "q", "wf-a0", spec(0, "q"), 0.0).refused is None
    first = store.sync(tenant, "s1", {"q": 10})
    assert [lease["id"] for lease in first.leases] == ["a0"]
    store.set_door(tenant, None, {"q": door})
    assert _retry(store, tenant, "a0", "a0~2")
    got = store.sync(tenant, "s2", {"q": 10})
    # The end of attempt 1 and the lease of attempt 2 reach the scheduler together.
    assert got.done == [["a0", "finished"]]
    assert [(lease["id"], lease.get("door")) for lease in got.leases] == [("a0~2", True)]
    assert store.held_count(tenant, "q") == 1  # one action, one slot of its depth


def test_a_retried_requeue_writes_once(store: LeaseStore, tenant: str) -> None:
    store.put_lease(tenant, "a0", "q", "wf-a0", spec(0, "q"), 0.0)
    store.sync(tenant, "s1", {"q": 10})
    _retry(store, tenant, "a0", "a0~2")
    assert _retry(store, tenant, "a0", "a0~2")  # the lease existed: nudge again, write nothing
    got = store.sync(tenant, "s2", {"q": 10})
    assert [lease["id"] for lease in got.leases] == ["a0~2"]
    assert store.held_count(tenant, "q") == 1
