"""The simulated backend names pods for the tenant too (issue #22): two tenants' actions
of one id have pods of their own, and a worker started on state an older worker kept
adopts the pods it named for the action alone."""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path
from typing import Any

from headway.activities.backends.base import pod_name
from headway.activities.cluster import ClusterActivities
from headway.protocol import ActionEventKind as K
from headway.protocol import DispatchRequest

from .helpers import Recorder, attempt_env, pod_of, request, sim
from .test_exactly_once import run_until_running


def for_tenant(req: DispatchRequest, tenant: str) -> DispatchRequest:
    return dataclasses.replace(req, tenant=tenant, workflow_id=f"wf-{tenant}-{req.action_id}")


async def test_sim_two_tenants_same_action_id_have_their_own_pods_and_cleanup() -> None:
    b = sim()
    await b.start()
    try:
        a = for_tenant(request("train", duration_s=600), "acme")
        z = for_tenant(request("train", duration_s=600), "zeta")
        names_a = await b.create_pods(a, dispatch="wf-acme-train/r/1")
        names_z = await b.create_pods(z, dispatch="wf-zeta-train/r/1")
        assert names_a == [pod_of("train", tenant="acme")]
        assert names_z == [pod_of("train", tenant="zeta")]
        assert sorted(b.pods("train")) == sorted(names_a + names_z), "neither replaced"
        found = {(h.tenant, h.action_id) for h in await b.headway_pods()}
        assert found == {("acme", "train"), ("zeta", "train")}
        assert await b.delete_pods("train", tenant="acme") == 1
        assert list(b.pods("train")) == names_z
        b.forget("train", tenant="acme")
        assert await b.dispatch_record("train", "wf-zeta-train/r/1") != {}
    finally:
        await b.close()


async def test_sim_a_retry_on_an_upgraded_worker_adopts_the_pod_named_without_the_tenant(
    tmp_path: Path,
) -> None:
    """The state an older worker kept names the running pod for the action alone (as it
    did): the retry on a newer worker follows it to its end and creates nothing."""
    first = sim(time_scale=0.05, state_dir=tmp_path)
    await first.start()
    req = request("up", duration_s=30.0)  # 1.5 s of wall time
    beats: list[Any] = []
    rec1 = Recorder()
    await run_until_running(
        ClusterActivities(first, signaler=rec1, heartbeat_s=0.05), rec1, req, beats
    )
    created = first.created_count
    await first.close()
    # Written by a worker before tenants were part of names: the same state, old names.
    old, new = pod_name("up", "main", 0), pod_of("up")
    assert first.state_path is not None
    first.state_path.write_text(first.state_path.read_text().replace(new, old))
    beat = {**beats[-1], "created": [old], "pods": {}}

    second = sim(time_scale=0.05, state_dir=tmp_path)
    await second.start()
    try:
        assert list(second.pods("up")) == [old]
        rec2 = Recorder()
        acts = ClusterActivities(second, signaler=rec2, heartbeat_s=0.05)
        result = await asyncio.wait_for(attempt_env(2, [beat]).run(acts.run_action, req), 10)
        assert (result.kind, result.pod) == (K.SUCCEEDED, old), result
        assert second.created_count == created, "nothing created again"
        assert second.pods("up") == {}
    finally:
        await second.close()
