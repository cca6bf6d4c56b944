"""A kubelet eviction on the Kubernetes backend, end to end (issues #22, #23): reported as
``Evicted`` (not ``Preempted``), and retried as the ``lost`` class: requeued at once, its
next attempt a pod of its own, which succeeds. Real control plane, cluster worker and
Temporal server; the fake API server's scheduler binds the pods, the test evicts one."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

from headway.protocol import ActionEventKind, DemandRequest, SubmitRequest
from headway.scheduler import ClusterSpec, NodeGroup, Pod, QueueSpec
from headway.scheduler.model import RetryPolicy
from headway.workflows import client as hw
from temporalio.testing import WorkflowEnvironment

from .fake_kube import FakeKube
from .helpers import kube_control_plane

NS = "hw-evict"
CLUSTER = "k8s-evict"
GI = 2**30
EVICTED = {
    "status": {
        "phase": "Failed",
        "reason": "Evicted",
        "message": "The node was low on resource: memory.",
    }
}


async def add_node(kube: FakeKube) -> None:
    node = {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": "n1", "labels": {}},
        "status": {
            "allocatable": {"cpu": "16", "memory": "64Gi", "pods": "110"},
            "conditions": [{"type": "Ready", "status": "True"}],
        },
    }
    async with kube.post("/api/v1/nodes", json=node) as resp:
        assert resp.status < 300, await resp.text()


async def running_pod(kube: FakeKube, prefix: str, timeout: float = 60) -> str:
    async with asyncio.timeout(timeout):
        while True:
            for pod in kube.live("pods"):
                name = str(pod["metadata"]["name"])
                phase = (pod.get("status") or {}).get("phase")
                if name.startswith(prefix) and phase == "Running":
                    return name
            await asyncio.sleep(0.05)


async def test_an_evicted_action_is_evicted_and_retried_as_lost(
    temporal_env: WorkflowEnvironment, kube: FakeKube, tmp_path: Path
) -> None:
    client = temporal_env.client
    tenant = f"evict-{uuid.uuid4().hex[:8]}"
    await add_node(kube)
    fleet = [ClusterSpec(CLUSTER, (NodeGroup("n", 1, Pod(cpu=16_000, memory=64 * GI)),))]
    async with kube_control_plane(
        client,
        kube.url,
        tmp_path,
        CLUSTER,
        NS,
        fleet,
        [tenant],
        lambda stop: [kube.run_scheduler(stop)],
    ):
        await hw.ensure_scheduler(client, tenant, fleet)
        await hw.upsert_queue(client, tenant, QueueSpec("once").to_dict())
        await hw.upsert_queue(
            client, tenant, QueueSpec("retried", retry=RetryPolicy(lost=1)).to_dict()
        )

        def req(action_id: str, queue: str) -> SubmitRequest:
            return SubmitRequest(
                action_id=action_id,
                queue=queue,
                tenant=tenant,
                demand=DemandRequest(resources={"cpu": "1", "memory": "1Gi"}),
                estimate_s=60,
            )

        # No retries: the action ends Evicted, with the kubelet's message.
        once = await hw.submit(client, req("ev-1", "once"))
        kube.modify("pods", NS, await running_pod(kube, f"hw-{tenant}-ev-1-"), EVICTED)
        res = await asyncio.wait_for(hw.wait_result(once), 60)
        assert res.state == "failed" and "Evicted" in (res.reason or ""), res
        st = await hw.action_state(client, tenant, "ev-1")
        kinds = [e.kind for e in st.events]
        assert ActionEventKind.EVICTED in kinds and ActionEventKind.PREEMPTED not in kinds

        # Retried as lost: requeued at once; the next attempt runs and succeeds.
        retried = await hw.submit(client, req("ev-2", "retried"))
        kube.modify("pods", NS, await running_pod(kube, f"hw-{tenant}-ev-2-"), EVICTED)
        second = await running_pod(kube, f"hw-{tenant}-ev-2-2-")
        kube.modify("pods", NS, second, {"status": {"phase": "Succeeded"}})
        res = await asyncio.wait_for(hw.wait_result(retried), 60)
        assert res.state == "succeeded", res
        st = await hw.action_state(client, tenant, "ev-2")
        print([(a.number, a.outcome, a.retry) for a in st.attempts])
        assert [a.outcome for a in st.attempts][:1] == ["Evicted"]
        assert "requeued at the head" in st.attempts[0].retry
