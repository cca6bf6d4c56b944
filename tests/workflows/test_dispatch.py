"""The dispatch activity against a fake client: the worker-wide signal budget, gone actions."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any, cast

from headway.activities.dispatch import DispatchActivities
from headway.protocol import Admission
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
