"""A silenced worker on the Kubernetes backend (issue #22), end to end: its cluster goes
down in its tenant's shard (new work waits, saying why), and when the worker returns the
cluster is up and its running action is adopted, never created again.

The simulated backend's counterpart is
``test_e2e_arbiter.test_sim_a_silenced_worker_makes_its_cluster_down_and_back_...``.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from pathlib import Path
from typing import Any

import pytest
from headway.activities.backends.base import ACTION_ANNOTATION, pod_name
from headway.scheduler import QueueSpec
from headway.worker.control_plane import run_control_plane_worker
from headway.workflows import client as hw
from headway.workflows import shared
from temporalio.testing import WorkflowEnvironment

from .fake_kube import FakeKube
from .helpers import kube_cluster_worker
from .test_e2e_arbiter import (
    NS,
    _is,
    _when,
    add_node,
    free_cpu,
    one_node_fleet,
    state_of,
    submit_request,
    until,
)
from .test_e2e_kube_tenants import _kubelet, _meta, _phase, _succeed

# --- a silenced worker, on Kubernetes ------------------------------------------------------


@pytest.mark.asyncio
async def test_kubernetes_a_silenced_worker_makes_its_cluster_down_and_back_and_its_running_action_is_adopted(
    temporal_env: WorkflowEnvironment,
    kube: FakeKube,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    client = temporal_env.client
    tenant = f"kh-{uuid.uuid4().hex[:8]}"
    cluster = "k8s-hl"
    fleet = one_node_fleet(cluster)
    # Silent for 4 s: down. Workers report every second (the resync), so a live one is
    # never taken for silent.
    monkeypatch.setattr(shared.HEALTH, "cluster_silent_s", 4.0)
    await add_node(kube, "n1")
    seen: dict[tuple[str, str], set[str]] = {}

    def not_long(pod: dict[str, Any]) -> bool:
        return (_meta(pod).get("annotations") or {}).get(ACTION_ANNOTATION) != "long-1"

    stop = asyncio.Event()
    background = [
        asyncio.create_task(
            run_control_plane_worker(
                client,
                database_url=f"sqlite:///{tmp_path / 'leases.db'}",
                fleet=fleet,
                stop=stop,
                cluster_silent_s=4.0,
            )
        ),
        asyncio.create_task(kube.run_scheduler(stop)),
        asyncio.create_task(_kubelet(kube, stop, not_long, seen)),
    ]

    def worker() -> contextlib.AbstractAsyncContextManager[Any]:
        return kube_cluster_worker(client, kube.url, cluster, NS, [tenant], resync_s=1.0)

    long_pod = pod_name("long-1", "main", 0, tenant)
    try:
        # 1. A long action runs (its pod is never finished by the kubelet here).
        async with worker():
            await hw.ensure_scheduler(client, tenant, fleet)
            await hw.upsert_queue(client, tenant, QueueSpec("q").to_dict())
            await until(lambda: _is(free_cpu(client, tenant, cluster), 4000), "first report")
            long = await hw.submit(client, submit_request(tenant, "long-1", "1"))
            await until(
                lambda: _when(state_of(client, tenant, "long-1"), lambda s: s.state == "running"),
                "long-1 running",
            )
            await until(lambda: _is(_phase(kube, long_pod), "Running"), "long-1's pod running")
        # 2. Its worker went silent (it stopped; its pods stay): the cluster goes down.
        await until(
            lambda: _when(hw.get_fleet(client, tenant), lambda f: cluster in f["down"]),
            "the cluster down",
        )
        assert await _phase(kube, long_pod) == "Running", "a silent worker deletes nothing"

        # 3. New work waits, and says why: every cluster its queue may use is down.
        w = await hw.submit(client, submit_request(tenant, "waits-1", "1"))
        why = await until(
            lambda: _when(
                hw.why(client, tenant, "waits-1"), lambda w: w.get("reason") == "ClusterDown"
            ),
            "ClusterDown in why",
        )
        assert cluster in why["message"] and "silent" in why["message"], why
        print("why waits-1:", why)

        # 4. The worker returns: the cluster is up, the running action's pod is adopted
        # (followed to its end, never created again) and the waiting one runs.
        async with worker():
            await until(
                lambda: _when(hw.get_fleet(client, tenant), lambda f: cluster not in f["down"]),
                "the cluster up again",
            )
            await _succeed(kube, long_pod)
            res = await asyncio.wait_for(hw.wait_result(long), 90)
            assert res.state == "succeeded", res
            st = await state_of(client, tenant, "long-1")
            assert [a.outcome for a in st.attempts] == ["Succeeded"], st.attempts
            assert len(seen[(tenant, "long-1")]) == 1, "long-1's pod was created once"
            assert (await asyncio.wait_for(hw.wait_result(w), 60)).state == "succeeded"

        # 5. An admission to a cluster whose worker has just gone (not yet down): no
        # worker takes the dispatch, so it is handed back after the silence interval and
        # waits for the cluster to return.
        d = await hw.submit(client, submit_request(tenant, "dead-1", "1"))
        st = await until(
            lambda: _when(state_of(client, tenant, "dead-1"), lambda s: len(s.attempts) > 1),
            "the dispatch nobody took handed back",
        )
        assert st.attempts[0].outcome == "CapacityChanged", st.attempts
        assert "no worker of cluster" in st.attempts[0].message, st.attempts
        assert (tenant, "dead-1") not in seen, "nothing was created for it"
        async with worker():
            assert (await asyncio.wait_for(hw.wait_result(d), 60)).state == "succeeded"
    finally:
        stop.set()
        await asyncio.wait_for(asyncio.gather(*background, return_exceptions=True), 60)
