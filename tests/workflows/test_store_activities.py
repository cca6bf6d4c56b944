"""The store activities' sync linger, on a fake clock (no Temporal server needed)."""

from __future__ import annotations

from pathlib import Path
from typing import cast

import pytest
from headway.activities import store as store_mod
from headway.activities.store import StoreActivities
from headway.store import LeaseStore
from headway.workflows.shared import SyncInput
from temporalio.client import Client
from temporalio.testing import ActivityEnvironment


class Clock:
    """``time.monotonic`` and ``asyncio.sleep`` of the store module, recorded."""

    def __init__(self) -> None:
        self.now = 100.0
        self.sleeps: list[float] = []

    def monotonic(self) -> float:
        return self.now

    async def sleep(self, s: float) -> None:
        self.sleeps.append(round(s, 6))
        self.now += s


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    c = Clock()
    monkeypatch.setattr(store_mod, "_monotonic", c.monotonic)
    monkeypatch.setattr(store_mod, "_sleep", c.sleep)
    return c


def sync_input(tenant: str, linger: float) -> SyncInput:
    return SyncInput(tenant, f"tok-{linger}", {"q": 10}, 10, 100, 100, linger_s=linger)


@pytest.mark.parametrize(
    ("linger", "gap", "tenant2", "expected"),
    [
        pytest.param(0.1, 0.03, "t", [0.07], id="second-sync-soon-after-waits-the-rest"),
        pytest.param(0.1, 0.5, "t", [], id="second-sync-long-after-does-not-wait"),
        pytest.param(0.0, 0.0, "t", [], id="backlog-refill-never-waits"),
        pytest.param(0.1, 0.0, "other", [], id="another-tenants-sync-does-not-wait"),
    ],
)
async def test_a_nudged_sync_lingers_only_after_a_recent_sync_of_its_tenant(
    clock: Clock, tmp_path: Path, linger: float, gap: float, tenant2: str, expected: list[float]
) -> None:
    store = LeaseStore(f"sqlite:///{tmp_path / 'l.db'}")
    acts = StoreActivities(store, cast(Client, None))
    env = ActivityEnvironment()
    await env.run(acts.sync, sync_input("t", 0.1))  # the first sync of a tenant: no wait
    assert clock.sleeps == []
    clock.now += gap
    out = await env.run(acts.sync, sync_input(tenant2, linger))
    assert clock.sleeps == expected
    assert out.leases == [] and out.done == []
    store.close()
