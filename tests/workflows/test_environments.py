"""Reusable environments declared to a live scheduler (``declare_environment``, what the
SDK sends at a warm environment's first submit): idempotent, a bad field refused by name,
another shape refused while anything of it exists and taken once nothing does; an action
of it places the pool, whose footprint its queue holds until ``idle_ttl`` after its end.

On the real dev server with the control-plane worker in-process (SQLite store) and the
fake cluster of ``conftest``.
"""

from __future__ import annotations

from typing import Any

import pytest
from headway.protocol import DemandRequest, SubmitRequest
from headway.workflows import client as hw
from temporalio.client import WorkflowUpdateFailedError

from .conftest import Plane
from .test_lifecycle import eventually

pytestmark = pytest.mark.integration


def pool(**changes: Any) -> dict[str, Any]:
    return {
        "name": "pool",
        "resources": {"cpu": 2, "memory": "1Gi"},
        "replicas": 2,
        "concurrency": 2,
        "idle_ttl": 1.0,
        **changes,
    }


def req(tenant: str, action_id: str, queue: str) -> SubmitRequest:
    demand = DemandRequest(resources={"cpu": 2, "memory": "1Gi"})
    return SubmitRequest(
        action_id=action_id,
        queue=queue,
        demand=demand,
        tenant=tenant,
        duration_s=0.2,
        environment="pool",
    )


async def _usage(plane: Plane, tenant: str, queue: str) -> int:
    return int((await hw.get_queues(plane.client, tenant))[queue]["usage"]["cpu_m"])


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        pytest.param(pool(replicas=0), "replicas", id="no replicas"),
        pytest.param(pool(resources={"cpu": "lots"}), "cpu", id="a quantity that is not one"),
        pytest.param(pool(colour="blue"), "colour", id="an unknown field"),
    ],
)
async def test_a_bad_environment_is_refused_naming_its_field(
    plane: Plane, tenant: str, spec: dict[str, Any], message: str
) -> None:
    await hw.upsert_queue(plane.client, tenant, {"name": "warm"}, plane.fleet)
    with pytest.raises(WorkflowUpdateFailedError) as err:
        await hw.declare_environment(plane.client, tenant, spec)
    assert message in str(err.value.cause)


async def test_a_declared_environment_keeps_its_shape_while_in_use(
    plane: Plane, tenant: str
) -> None:
    # "held" starts nothing, so its action of the pool waits: the pool is in use.
    await hw.upsert_queue(
        plane.client, tenant, {"name": "held", "action_concurrency": 0}, plane.fleet
    )
    await hw.upsert_queue(plane.client, tenant, {"name": "warm"}, plane.fleet)
    # Answered as declared, in the core's units (milli-CPU, bytes); the same again is
    # the same answer (idempotent).
    declared = await hw.declare_environment(plane.client, tenant, pool())
    assert declared == pool(resources={"cpu": 2000, "memory": 2**30})
    assert await hw.declare_environment(plane.client, tenant, pool()) == declared
    sub = await hw.submit_action(plane.client, req(tenant, "h1", "held"))
    assert sub.answer is not None and sub.answer.accepted

    async def waits() -> bool:
        st = await hw.action_state(plane.client, tenant, "h1")
        return st.state == "waiting" and st.reason is not None

    await eventually(waits)
    with pytest.raises(WorkflowUpdateFailedError) as err:
        await hw.declare_environment(plane.client, tenant, pool(replicas=3))
    assert "environment 'pool' is declared with another shape and is in use" in str(err.value.cause)
    assert "replicas: 2 -> 3" in str(err.value.cause)
    await hw.cancel(plane.client, tenant, "h1")
    assert (await hw.wait_result(sub.handle, action_id="h1")).state == "cancelled"

    # An action places the pool: its queue holds the footprint (2 x 2 CPU) until the
    # pool's idle_ttl (1 s) after the action ended, then nothing.
    w1 = await hw.submit_action(plane.client, req(tenant, "w1", "warm"))
    assert (await hw.wait_result(w1.handle, action_id="w1")).state == "succeeded"
    snapshot = (await hw.get_snapshot(plane.client, tenant))["snapshot"]
    if snapshot["envs"]:  # (it may be gone already on a slow test run)
        assert await _usage(plane, tenant, "warm") == 4000

    async def torn_down() -> bool:
        envs = (await hw.get_snapshot(plane.client, tenant))["snapshot"]["envs"]
        return not envs and await _usage(plane, tenant, "warm") == 0

    await eventually(torn_down)
    # Nothing of it is left: another shape replaces the declared one.
    replaced = await hw.declare_environment(plane.client, tenant, pool(replicas=3))
    assert replaced["replicas"] == 3
