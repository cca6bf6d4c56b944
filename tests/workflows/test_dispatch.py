"""The dispatch activity against a fake client: the worker-wide signal budget, gone actions,
hand-over-only batches."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field, replace
from datetime import timedelta
from pathlib import Path
from typing import Any, cast

import pytest
from headway.activities import dispatch as dispatch_module
from headway.activities.dispatch import DispatchActivities
from headway.activities.store import AdmissionWaiters
from headway.protocol import Admission
from headway.store import LeaseStore
from headway.workflows.shared import AdmitItem, DispatchBatch
from temporalio.client import Client
from temporalio.service import RPCError, RPCStatusCode
from temporalio.testing import ActivityEnvironment


@dataclass
class FakeTemporal:
    """Signals take a while; workflows named ``missing-*`` do not exist."""

    delay: float = 0.01
    in_flight: int = 0
    peak: int = 0
    signalled: list[str] = field(default_factory=list)

    def get_workflow_handle(self, workflow_id: str) -> Any:
        fake = self

        class Handle:
            async def signal(self, name: str, arg: object) -> None:
                fake.in_flight += 1
                fake.peak = max(fake.peak, fake.in_flight)
                try:
                    await asyncio.sleep(fake.delay)
                    if workflow_id.startswith("missing-"):
                        raise RPCError("not found", RPCStatusCode.NOT_FOUND, b"")
                    fake.signalled.append(workflow_id)
                finally:
                    fake.in_flight -= 1

        return Handle()


def batch(tenant: str, ids: list[str]) -> DispatchBatch:
    return DispatchBatch(tenant, [AdmitItem(f"{i}", Admission(i, "c1")) for i in ids])


async def test_one_signal_budget_is_shared_by_every_tenants_batches() -> None:
    fake = FakeTemporal()
    acts = DispatchActivities(cast(Client, fake), concurrency=3)
    env = ActivityEnvironment()
    big = batch("bulk", [f"b{i}" for i in range(40)])
    small = batch("interactive", ["a0", "a1"])
    results = await asyncio.gather(env.run(acts.dispatch, big), env.run(acts.dispatch, small))
    assert fake.peak == 3  # never more in flight, across both tenants' batches
    assert sorted(fake.signalled) == sorted([f"b{i}" for i in range(40)] + ["a0", "a1"])
    assert [r.gone for r in results] == [[], []]


async def test_a_workflow_that_no_longer_runs_comes_back_gone() -> None:
    fake = FakeTemporal(delay=0)
    acts = DispatchActivities(cast(Client, fake))
    res = await ActivityEnvironment().run(acts.dispatch, batch("t", ["x", "missing-y"]))
    assert res.gone == ["missing-y"]
    assert fake.signalled == ["x"]


async def test_hand_over_only_hands_waiting_admissions_over_and_returns_the_rest_unsent(
    tmp_path: Path,
) -> None:
    fake = FakeTemporal(delay=0)
    store = LeaseStore(f"sqlite:///{tmp_path}/leases.db")
    waiters = AdmissionWaiters()
    acts = DispatchActivities(cast(Client, fake), store=store, waiters=waiters)
    fut = waiters.add("t", "w")
    assert fut is not None
    only = DispatchBatch(
        "t", [AdmitItem(i, Admission(i, "c1")) for i in ("w", "x", "y")], hand_over_only=True
    )
    try:
        res = await ActivityEnvironment().run(acts.dispatch, only)
        assert res.unsent == ["x", "y"]
        assert fut.result().action_id == "w"
        assert store.admission("t", "w") is not None  # durable before handed over
        assert fake.signalled == []  # the rest are signalled by a regular dispatch
    finally:
        store.close()


async def test_hand_over_only_refuses_rejections_and_probes() -> None:
    acts = DispatchActivities(cast(Client, FakeTemporal()))
    bad = DispatchBatch("t", probe=[["a", "wf-a"]], hand_over_only=True)
    with pytest.raises(ValueError, match="hand_over_only: a batch with 0 rejection"):
        await ActivityEnvironment().run(acts.dispatch, bad)


@pytest.mark.parametrize(
    ("heartbeat_timeout", "is_local", "beats"),
    [
        pytest.param(timedelta(seconds=10), False, True, id="regular-with-timeout-beats"),
        pytest.param(None, False, False, id="regular-without-timeout-stays-silent"),
        pytest.param(timedelta(seconds=10), True, False, id="local-never-beats"),
    ],
)
async def test_a_slow_regular_dispatch_heartbeats_so_a_dead_worker_is_noticed_early(
    monkeypatch: pytest.MonkeyPatch,
    heartbeat_timeout: timedelta | None,
    is_local: bool,
    beats: bool,
) -> None:
    monkeypatch.setattr(dispatch_module, "DISPATCH_HEARTBEAT_EVERY_S", 0.02)
    fake = FakeTemporal(delay=0.15)
    acts = DispatchActivities(cast(Client, fake), concurrency=1)
    env = ActivityEnvironment()
    env.info = replace(env.info, heartbeat_timeout=heartbeat_timeout, is_local=is_local)
    heartbeats: list[object] = []
    env.on_heartbeat = lambda *details: heartbeats.append(details)
    res = await env.run(acts.dispatch, batch("t", ["a", "b"]))
    assert res.gone == [] and sorted(fake.signalled) == ["a", "b"]
    assert bool(heartbeats) is beats, heartbeats
    # The beat stops with the batch: nothing more after it returned.
    n = len(heartbeats)
    await asyncio.sleep(0.1)
    assert len(heartbeats) == n


async def test_a_quick_regular_dispatch_sends_no_heartbeat(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    fake = FakeTemporal(delay=0)
    acts = DispatchActivities(cast(Client, fake))
    env = ActivityEnvironment()
    env.info = replace(env.info, heartbeat_timeout=timedelta(seconds=10), is_local=False)
    heartbeats: list[object] = []
    env.on_heartbeat = lambda *details: heartbeats.append(details)
    await env.run(acts.dispatch, batch("t", ["a"]))
    assert heartbeats == []
