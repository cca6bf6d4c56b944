"""A scheduler pass that raises (a bug) does not stop the tenant's work: the shard
rebuilds its core, fails the one action it could not decide about, and goes on."""

from __future__ import annotations

from typing import Any

import pytest
from headway import protocol
from headway.scheduler import Scheduler
from headway.workflows import client as hw

from .conftest import Plane
from .test_lifecycle import _queue_idle, eventually, req, setup_queue

pytestmark = pytest.mark.integration


async def test_a_pass_failing_on_one_action_fails_it_alone_and_the_rest_runs(
    plane: Plane, tenant: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    gate = Scheduler._gate

    def raising(self: Scheduler, q: Any, a: Any, demand: Any) -> Any:
        if a.id == "poison":
            raise RuntimeError("planted bug")
        return gate(self, q, a, demand)

    # The workflows run unsandboxed in this process: the planted bug reaches the core.
    monkeypatch.setattr(Scheduler, "_gate", raising)
    await setup_queue(plane, tenant, action_concurrency=2)
    ids = ["a1", "poison", "a2", "a3"]
    handles = [await hw.submit(plane.client, req(tenant, i, duration_s=0.1)) for i in ids]
    results = {i: await hw.wait_result(h) for i, h in zip(ids, handles, strict=True)}
    assert (results["poison"].state, results["poison"].reason) == ("rejected", "SchedulerError")
    assert {i: r.state for i, r in results.items() if i != "poison"} == dict.fromkeys(
        ["a1", "a2", "a3"], "succeeded"
    )
    assert sorted(plane.cluster.started) == ["a1", "a2", "a3"]
    stats = await plane.client.get_workflow_handle(protocol.scheduler_workflow_id(tenant)).query(
        "stats"
    )
    assert stats["actions_failed"] == 1
    assert stats["pass_failures"] >= 2  # the fast path, then the rebuilt plain path
    await eventually(lambda: _queue_idle(plane.client, tenant, "default"))


async def test_an_action_half_admitted_by_a_failing_pass_is_failed_not_left_holding_room(
    plane: Plane, tenant: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    admit = Scheduler._admit

    def half(self: Scheduler, q: Any, a: Any, c: Any, nodes: Any, inst: Any, *rest: Any) -> Any:
        if a.id == "half":
            # The first steps of recording an admission, then a bug.
            a.state, a.cluster, a.nodes, a.start = "running", c.name, nodes, rest[0]
            raise RuntimeError("planted bug in the admission's bookkeeping")
        return admit(self, q, a, c, nodes, inst, *rest)

    monkeypatch.setattr(Scheduler, "_admit", half)
    # One slot: were "half" left running in the core, "after" would wait for ever.
    await setup_queue(plane, tenant, action_concurrency=1)
    h = await hw.submit(plane.client, req(tenant, "half", duration_s=0.1))
    res = await hw.wait_result(h)
    assert (res.state, res.reason) == ("rejected", "SchedulerError")
    after = await hw.wait_result(await hw.submit(plane.client, req(tenant, "after")))
    assert after.state == "succeeded"
    assert plane.cluster.started == ["after"]
    await eventually(lambda: _queue_idle(plane.client, tenant, "default"))
