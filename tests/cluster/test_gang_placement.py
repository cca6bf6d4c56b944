"""Gangs placed whole in the cluster (issue #22): the pods of an admission are constrained
(required node affinity) to the nodes the admission counted them on, so the in-cluster
scheduler cannot spread two singles over the room a gang was admitted into.

The burst of the issue: two 4-GPU singles submitted 0.4 s before a 2x8-GPU gang, on three
empty 8-GPU nodes. The fake API server plays kube-scheduler (spreading like its default
``LeastAllocated`` score, honouring gates, selectors and required affinity); the control
plane, the scheduler and the cluster worker are the real ones, on a real Temporal server.
"""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path
from typing import Any

import pytest
from headway.activities.backends.kubernetes import build_pods
from headway.protocol import ActionEventKind, DemandRequest, GangKind, PodSpec, SubmitRequest
from headway.scheduler import ClusterSpec, NodeGroup, Pod, QueueSpec
from headway.workflows import client as hw
from temporalio.testing import WorkflowEnvironment

from .fake_kube import FakeKube
from .helpers import GI, kube_control_plane, request

NS = "hw-gang"
CLUSTER = "k8s-gang"
NODES = ("n1", "n2", "n3")


async def add_gpu_node(kube: FakeKube, name: str) -> None:
    node = {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": {}},
        "status": {
            "allocatable": {"cpu": "64", "memory": "512Gi", "pods": "110", "nvidia.com/gpu": "8"},
            "conditions": [{"type": "Ready", "status": "True"}],
        },
    }
    async with kube.post("/api/v1/nodes", json=node) as resp:
        assert resp.status < 300, await resp.text()


async def create(kube: FakeKube, pods: list[dict[str, Any]]) -> None:
    for body in pods:
        async with kube.post(f"/api/v1/namespaces/{NS}/pods", json=body) as resp:
            assert resp.status < 300, await resp.text()


def burst(hints: dict[str, list[str]]) -> list[list[dict[str, Any]]]:
    """The burst's pods: two 4-GPU singles, then a 2x8-GPU gang (released at once)."""
    singles = [
        request(f"single-{i}", [PodSpec("main", 0, cpu_m=1000, memory=GI, gpu=4)]) for i in range(2)
    ]
    gang = request(
        "gang",
        [PodSpec("worker", i, cpu_m=1000, memory=GI, gpu=8) for i in range(2)],
        kind=GangKind.REPLICAS,
    )
    out = []
    for req in [*singles, gang]:
        req.node_hints = hints.get(req.action_id, [])
        pods = build_pods(req, NS)
        for p in pods:
            p["spec"].pop("schedulingGates", None)
        out.append(pods)
    return out


@pytest.mark.parametrize(
    ("hints", "whole"),
    [
        pytest.param({}, False, id="advisory-placement-splits-the-gang"),
        pytest.param(
            {"single-0": ["n1"], "single-1": ["n1"], "gang": ["n2", "n3"]},
            True,
            id="pods-bound-to-the-admissions-nodes-keep-it-whole",
        ),
    ],
)
async def test_the_fake_scheduler_spreads_unless_the_admission_constrains(kube, hints, whole):
    for name in NODES:
        await add_gpu_node(kube, name)
    singles_a, singles_b, gang = burst(hints)
    await create(kube, singles_a + singles_b)
    kube.bind_pending()
    await create(kube, gang)
    kube.bind_pending()
    gang_nodes = [kube.bindings.get(p["metadata"]["name"]) for p in gang]
    assert (None not in gang_nodes) is whole, (kube.bindings, kube.unschedulable)
    if not whole:
        # The failure, reproduced: the singles went to two nodes.
        assert len({kube.bindings[p["metadata"]["name"]] for p in singles_a + singles_b}) == 2


async def test_the_burst_keeps_the_gang_whole_end_to_end(
    temporal_env: WorkflowEnvironment, kube: FakeKube, tmp_path: Path
) -> None:
    client = temporal_env.client
    tenant = f"gang-{uuid.uuid4().hex[:8]}"
    for name in NODES:
        await add_gpu_node(kube, name)
    fleet = [ClusterSpec(CLUSTER, (NodeGroup("gpu", 3, Pod(cpu=64_000, memory=512 * GI, gpu=8)),))]
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
        await hw.upsert_queue(client, tenant, QueueSpec("q").to_dict())
        # The scheduler has heard the cluster's nodes (else it admits "unknown means
        # open", with no nodes to constrain the pods to).
        async with asyncio.timeout(60):
            while (await hw.get_fleet(client, tenant))["capacity"].get(CLUSTER, {}).get(
                "nodes"
            ) != len(NODES):
                await asyncio.sleep(0.1)

        def req(action_id: str, gpu: int, replicas: int | None = None) -> SubmitRequest:
            return SubmitRequest(
                action_id=action_id,
                queue="q",
                tenant=tenant,
                demand=DemandRequest(
                    resources={"cpu": "1", "memory": "1Gi", "gpu": str(gpu)}, replicas=replicas
                ),
                estimate_s=600,
            )

        handles = [await hw.submit(client, req(f"single-{i}", 4)) for i in range(2)]
        await asyncio.sleep(0.4)
        handles.append(await hw.submit(client, req("gang", 8, replicas=2)))

        bound_by = ("single-0", "single-1", "gang")

        def bound(action: str) -> list[str]:
            return sorted(
                node
                for pod, node in kube.bindings.items()
                if pod.startswith(f"hw-{tenant}-{action}-")
            )

        try:
            async with asyncio.timeout(90):
                while len(bound("gang")) < 2 or any(not bound(f"single-{i}") for i in range(2)):
                    await asyncio.sleep(0.1)
        except TimeoutError:
            states = {a: (await hw.action_state(client, tenant, a)).state for a in bound_by}
            raise AssertionError(
                f"not all bound: {kube.bindings}; unschedulable {kube.unschedulable};"
                f" actions {states}"
            ) from None
        singles = bound("single-0") + bound("single-1")
        gang = bound("gang")
        print(f"singles on {singles}, gang on {gang}; unschedulable: {kube.unschedulable}")
        assert len(set(singles)) == 1, "the singles share one node"
        assert len(set(gang)) == 2 and not set(gang) & set(singles), "the gang is whole"
        assert not kube.unschedulable, "no pod of the burst ever waited as a pending pod"
        st = await hw.action_state(client, tenant, "gang")
        assert ActionEventKind.UNSCHEDULABLE not in [e.kind for e in st.events]

        # The kubelet finishes them; every action succeeds.
        for pod in list(kube.bindings):
            kube.modify("pods", NS, pod, {"status": {"phase": "Succeeded"}})
        for h in handles:
            res = await asyncio.wait_for(hw.wait_result(h), 60)
            assert res.state == "succeeded", res
