"""End to end on the Kubernetes backend: action -> scheduler -> cluster worker -> pods ->
informer events -> action done, with the real ``kubernetes`` client over HTTP.

No kube-apiserver can run here, so the cluster is the kmock-based fake of
``tests/cluster/fake_kube.py``; the test plays the kubelet by patching pod status. The
control plane (both workflows, the lease store) and the cluster worker are the real ones,
on a real Temporal dev server.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from headway import protocol
from headway.activities.backends.kubernetes import KubernetesBackend
from headway.protocol import ActionEventKind, DemandRequest, SubmitRequest
from headway.scheduler import ClusterSpec, NodeGroup, Pod, QueueSpec
from headway.worker.cluster import run_cluster_worker
from headway.worker.control_plane import run_control_plane_worker
from headway.workflows import client as hw
from kubernetes import client as k8s
from temporalio.testing import WorkflowEnvironment

from .fake_kube import FakeKube

NS = "hw-e2e"
CLUSTER = "k8s-e2e"
GI = 2**30


async def add_node(kube: FakeKube, name: str) -> None:
    node = {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": {"nvidia.com/gpu.product": "H100"}},
        "status": {
            "allocatable": {
                "cpu": "16",
                "memory": "64Gi",
                "ephemeral-storage": "100Gi",
                "pods": "110",
                "nvidia.com/gpu": "8",
            },
            "conditions": [{"type": "Ready", "status": "True"}],
        },
    }
    async with kube.post("/api/v1/nodes", json=node) as resp:
        assert resp.status < 300, await resp.text()


async def patch_pod(kube: FakeKube, name: str, patch: dict[str, Any]) -> None:
    async with kube.patch(f"/api/v1/namespaces/{NS}/pods/{name}", json=patch) as resp:
        assert resp.status == 200, await resp.text()


async def pod_of(kube: FakeKube, action_id: str, timeout: float = 30) -> str:
    async with asyncio.timeout(timeout):
        while True:
            for p in kube.live("pods"):
                meta = p.get("metadata", {})
                if meta.get("labels", {}).get("headway.io/action") == action_id:
                    return str(meta["name"])
            await asyncio.sleep(0.05)


def terminated(reason: str, code: int, phase: str = "Failed") -> dict[str, Any]:
    return {
        "status": {
            "phase": phase,
            "containerStatuses": [
                {"name": "main", "state": {"terminated": {"reason": reason, "exitCode": code}}}
            ],
        }
    }


SCHEDULED = {
    "spec": {"nodeName": "n1"},
    "status": {"phase": "Pending", "conditions": [{"type": "PodScheduled", "status": "True"}]},
}
RUNNING = {"status": {"phase": "Running"}}


@pytest.mark.asyncio
async def test_action_runs_on_kubernetes_and_an_oom_is_attributed(
    temporal_env: WorkflowEnvironment, kube: FakeKube, tmp_path: Path
) -> None:
    client = temporal_env.client
    tenant = f"k8s-{uuid.uuid4().hex[:8]}"
    await add_node(kube, "n1")
    cfg = k8s.Configuration()
    cfg.host = str(kube.url).rstrip("/")
    api = k8s.ApiClient(cfg)
    backend = KubernetesBackend(
        CLUSTER, namespace=NS, api_client=api, backoff_initial_s=0.05, backoff_max_s=0.2
    )
    fleet = [
        ClusterSpec(
            CLUSTER,
            (
                NodeGroup(
                    "n", 1, Pod(cpu=16_000, memory=64 * GI, eph=100 * GI, gpu=8, gpu_type="H100")
                ),
            ),
        )
    ]
    stop = asyncio.Event()
    tasks = [
        asyncio.create_task(
            run_control_plane_worker(
                client, database_url=f"sqlite:///{tmp_path / 'leases.db'}", fleet=fleet, stop=stop
            )
        ),
        asyncio.create_task(
            run_cluster_worker(client, CLUSTER, backend, tenants=[tenant], stop=stop)
        ),
    ]
    try:
        await hw.ensure_scheduler(client, tenant, fleet)
        await hw.upsert_queue(client, tenant, QueueSpec("q").to_dict())

        def request(action_id: str) -> SubmitRequest:
            return SubmitRequest(
                action_id=action_id,
                queue="q",
                tenant=tenant,
                demand=DemandRequest(resources={"cpu": "2", "memory": "8Gi", "gpu": "H100:2"}),
                estimate_s=60,
            )

        # 1. A clean run: Scheduled -> Running -> Succeeded, reported by the informers.
        ok = await hw.submit(client, request("ok-1"))
        pod = await pod_of(kube, "ok-1")
        for patch in (SCHEDULED, RUNNING, {"status": {"phase": "Succeeded"}}):
            await patch_pod(kube, pod, patch)
        res = await asyncio.wait_for(hw.wait_result(ok), 60)
        assert res.state == "succeeded", res
        st = await hw.action_state(client, tenant, "ok-1")
        kinds = [e.kind for e in st.events]
        assert ActionEventKind.SCHEDULED in kinds and ActionEventKind.RUNNING in kinds
        assert st.cluster == CLUSTER

        # 2. An OOM kill: attributed to the exact action, with the time it took.
        oom = await hw.submit(client, request("oom-1"))
        pod = await pod_of(kube, "oom-1")
        await patch_pod(kube, pod, SCHEDULED)
        await patch_pod(kube, pod, RUNNING)
        t0 = time.monotonic()
        await patch_pod(kube, pod, terminated("OOMKilled", 137))
        res = await asyncio.wait_for(hw.wait_result(oom), 60)
        attributed_s = time.monotonic() - t0
        assert res.state == "failed", res
        assert "OOMKilled" in (res.reason or ""), res
        st = await hw.action_state(client, tenant, "oom-1")
        ooms = [e for e in st.events if e.kind == ActionEventKind.OOM_KILLED]
        assert ooms and ooms[0].pod == pod and ooms[0].exit_code == 137
        # Within seconds, as the seed promises (loose bound: a shared CI machine).
        assert attributed_s < 30
        print(f"OOM attributed to oom-1 in {attributed_s * 1000:.0f} ms")

        # The pods are cleaned up after completion.
        async with asyncio.timeout(30):
            while any(
                p["metadata"].get("labels", {}).get("headway.io/action") in ("ok-1", "oom-1")
                for p in kube.live("pods")
            ):
                await asyncio.sleep(0.05)
        assert protocol.action_workflow_id(tenant, "oom-1") == oom.id
    finally:
        stop.set()
        await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 60)
        api.close()
