"""The cluster worker as the final arbiter (issue #22): before it creates pods it checks
the admission against its live view, and hands it back when the pods no longer fit."""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

import pytest
from headway.activities.arbiter import larger_than_shapes, misfit, tolerates, unusable_reason
from headway.activities.backends.kubernetes import KubernetesBackend
from headway.activities.cluster import ClusterActivities
from headway.protocol import ActionEventKind, GangKind, NodeCapacity, PodSpec
from headway.scheduler.resources import Pod
from kubernetes import client as k8s
from temporalio.testing import ActivityEnvironment

from .fake_kube import FakeKube
from .helpers import GI, Recorder, pod_of, request, sim


def node(name: str, cpu: int, free: int, gpu: int = 0, unusable: str = "") -> NodeCapacity:
    return NodeCapacity(
        name, cpu, 16 * GI, 0, gpu, "H100" if gpu else None, free, 16 * GI, 0, gpu, unusable
    )


def pod(cpu: int, index: int = 0, gpu: int = 0) -> PodSpec:
    return PodSpec("worker", index, cpu_m=cpu, memory=GI, gpu=gpu, gpu_type="H100" if gpu else None)


@pytest.mark.parametrize(
    ("pods", "nodes", "pending", "why"),
    [
        pytest.param([pod(3000)], [node("a", 4000, 4000)], [], None, id="room-fits"),
        pytest.param(
            [pod(3000)],
            [node("a", 4000, 1000)],
            [],
            "1 Insufficient cpu",
            id="a-pod-someone-else-placed-took-the-room",
        ),
        pytest.param(
            [pod(3000, 0), pod(3000, 1)],
            [node("a", 4000, 4000), node("b", 4000, 4000)],
            [],
            None,
            id="a-gang-spread-over-two-nodes-fits",
        ),
        pytest.param(
            [pod(3000, 0), pod(3000, 1)],
            [node("a", 8000, 6000)],
            [pod(1000)],
            "Insufficient cpu",
            id="a-pending-pod-of-this-worker-takes-room-first",
        ),
        pytest.param(
            [pod(1000)],
            [node("a", 4000, 0, unusable="node(s) were unschedulable")],
            [],
            "1 node(s) were unschedulable",
            id="a-cordoned-node-is-not-room",
        ),
        pytest.param(
            [pod(1000, gpu=8)],
            [node("a", 4000, 4000)],
            [],
            "node(s) didn't match",
            id="a-typed-gpu-pod-needs-its-type",
        ),
    ],
)
def test_the_arbiter_checks_every_pod_of_the_gang_at_once(
    pods: list[PodSpec], nodes: list[NodeCapacity], pending: list[PodSpec], why: str | None
) -> None:
    verdict = misfit(pods, nodes, pending)
    if why is None:
        assert verdict is None
    else:
        assert verdict is not None and why in verdict.message, verdict
        assert not verdict.permanent


def test_a_pod_larger_than_every_declared_shape_is_a_permanent_misfit() -> None:
    shapes = [Pod(cpu=8000, memory=32 * GI)]
    assert larger_than_shapes([pod(4000)], shapes) is None
    verdict = larger_than_shapes([pod(100_000)], shapes)
    assert verdict is not None and verdict.permanent
    assert "larger than every node shape" in verdict.message
    assert larger_than_shapes([pod(100_000)], []) is None  # nothing declared: no check


@pytest.mark.parametrize(
    ("toleration", "taint", "ok"),
    [
        ({"key": "gpu", "operator": "Exists"}, {"key": "gpu", "effect": "NoSchedule"}, True),
        ({"operator": "Exists"}, {"key": "any", "effect": "NoExecute"}, True),
        ({"key": "gpu", "value": "a"}, {"key": "gpu", "value": "b", "effect": "NoSchedule"}, False),
        (
            {"key": "gpu", "value": "a", "effect": "NoExecute"},
            {"key": "gpu", "value": "a", "effect": "NoSchedule"},
            False,
        ),
    ],
    ids=["exists-by-key", "exists-for-all", "value-differs", "effect-differs"],
)
def test_tolerations_match_taints_as_the_kube_scheduler_does(
    toleration: dict[str, str], taint: dict[str, str], ok: bool
) -> None:
    assert tolerates(toleration, taint) is ok


@pytest.mark.parametrize(
    ("spec", "status", "why"),
    [
        ({}, {}, ""),
        ({"unschedulable": True}, {}, "node(s) were unschedulable"),
        ({}, {"conditions": [{"type": "Ready", "status": "False"}]}, "node(s) were not ready"),
        (
            {"taints": [{"key": "nvidia.com/gpu", "effect": "NoSchedule"}]},
            {},
            "node(s) had untolerated taint {nvidia.com/gpu: present}",
        ),
        ({"taints": [{"key": "soft", "effect": "PreferNoSchedule"}]}, {}, ""),
    ],
    ids=["ready", "cordoned", "not-ready", "tainted", "a-preference-only-steers"],
)
def test_a_node_that_takes_no_new_pod_says_why(
    spec: dict[str, Any], status: dict[str, Any], why: str
) -> None:
    assert unusable_reason({"spec": spec, "status": status}) == why


# --- the activity, on the simulated backend ------------------------------------------


async def test_a_sim_dispatch_that_no_longer_fits_is_handed_back_and_creates_nothing() -> None:
    b = sim()
    rec = Recorder()
    refreshed: list[str] = []

    async def refresh(tenant: str) -> None:
        refreshed.append(tenant)

    acts = ClusterActivities(b, signaler=rec, heartbeat_s=0.01, refresh=refresh)
    b.cordon("cpu-0")
    b.taint("cpu-1", "dedicated", "infra")
    req = dataclasses.replace(
        request("hb1", [PodSpec("main", 0, cpu_m=2000, memory=GI)]), handback=True
    )
    # The GPU node has room for it too, but it went NotReady.
    b.set_ready("gpu-0", False)
    result = await ActivityEnvironment().run(acts.run_action, req)
    assert result.kind is ActionEventKind.CAPACITY_CHANGED, result
    assert "node(s) were unschedulable" in result.message
    assert "untolerated taint {dedicated: infra}" in result.message
    assert "node(s) were not ready" in result.message
    assert b.pods("hb1") == {} and b.created_count == 0
    assert refreshed == ["t1"]
    report = await b.capacity()
    assert report.nodes is not None
    assert all(n.free_cpu_m == 0 and n.unusable for n in report.nodes)
    # Uncordoned: the same dispatch runs.
    b.cordon("cpu-0", False)
    result = await ActivityEnvironment().run(acts.run_action, req)
    assert result.kind is ActionEventKind.SUCCEEDED, result
    await b.close()


async def test_without_handback_an_older_workflow_s_dispatch_is_created_as_before() -> None:
    b = sim()
    acts = ClusterActivities(b, signaler=Recorder(), heartbeat_s=0.01)
    for n in ("cpu-0", "cpu-1", "gpu-0"):
        b.cordon(n)
    created: list[str] = []

    async def run() -> None:
        ev = await ActivityEnvironment().run(acts.run_action, request("old1"))
        created.append(ev.kind)

    import asyncio

    task = asyncio.create_task(run())
    for _ in range(100):
        if b.pods("old1"):
            break
        await asyncio.sleep(0.01)
    assert b.pods("old1") == {pod_of("old1"): None}  # created, pending
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await b.close()


async def test_unknown_capacity_checks_the_declared_node_shapes() -> None:
    from .helpers import small_cluster

    b = sim(small_cluster(reports_capacity=False))
    acts = ClusterActivities(
        b, signaler=Recorder(), heartbeat_s=0.01, shapes=[g.shape for g in b.spec.node_groups]
    )
    req = dataclasses.replace(
        request("big1", [PodSpec("main", 0, cpu_m=100_000, memory=GI)]), handback=True
    )
    result = await ActivityEnvironment().run(acts.run_action, req)
    assert result.kind is ActionEventKind.UNSCHEDULABLE, result
    assert "larger than every node shape" in result.message
    assert b.created_count == 0
    await b.close()


# --- the Kubernetes backend against the fake API server -----------------------------


async def add_node(kube: FakeKube, name: str, cpu: str = "4", **spec: Any) -> None:
    body = {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name},
        "spec": spec,
        "status": {
            "allocatable": {"cpu": cpu, "memory": "16Gi", "pods": "110"},
            "conditions": [{"type": "Ready", "status": "True"}],
        },
    }
    async with kube.post("/api/v1/nodes", json=body) as resp:
        assert resp.status < 300, await resp.text()


async def foreign_pod(kube: FakeKube, name: str, node: str, cpu: str) -> None:
    body = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "other"},
        "spec": {
            "nodeName": node,
            "containers": [{"name": "c", "image": "x", "resources": {"requests": {"cpu": cpu}}}],
        },
        "status": {"phase": "Running"},
    }
    async with kube.post("/api/v1/namespaces/other/pods", json=body) as resp:
        assert resp.status < 300, await resp.text()


async def settled(b: KubernetesBackend, check: Any) -> None:
    async with asyncio.timeout(10):
        while True:
            view = b.free_nodes()
            if view is not None and check(view[0]):
                return
            await asyncio.sleep(0.02)


async def test_kubernetes_capacity_counts_only_what_a_pod_can_use(
    kube: FakeKube, api_client: k8s.ApiClient
) -> None:
    await add_node(kube, "plain")
    await add_node(kube, "cordoned", unschedulable=True)
    await add_node(kube, "tainted", taints=[{"key": "nvidia.com/gpu", "effect": "NoSchedule"}])
    await add_node(kube, "steered", taints=[{"key": "x", "effect": "PreferNoSchedule"}])
    b = KubernetesBackend("k1", namespace="hw", api_client=api_client, backoff_initial_s=0.05)
    await b.start()
    try:
        await settled(b, lambda nodes: len(nodes) == 4)
        kube.modify(
            "nodes",
            None,
            "plain",
            {"status": {"conditions": [{"type": "Ready", "status": "False"}]}},
        )
        await settled(b, lambda nodes: all(n.free_cpu_m == 0 for n in nodes if n.name == "plain"))
        report = await b.capacity()
        assert report.nodes is not None
        free = {n.name: (n.free_cpu_m, n.unusable) for n in report.nodes}
        assert free == {
            "cordoned": (0, "node(s) were unschedulable"),
            "plain": (0, "node(s) were not ready"),
            "steered": (4000, ""),
            "tainted": (0, "node(s) had untolerated taint {nvidia.com/gpu: present}"),
        }
        # A pod that tolerates the taint may use that node.
        view = b.free_nodes([{"key": "nvidia.com/gpu", "operator": "Exists"}])
        assert view is not None
        assert {n.name: n.free_cpu_m for n in view[0]}["tainted"] == 4000
    finally:
        await b.close()


async def test_kubernetes_dispatch_is_handed_back_when_a_foreign_pod_took_the_room(
    kube: FakeKube, api_client: k8s.ApiClient
) -> None:
    await add_node(kube, "n1")
    b = KubernetesBackend("k1", namespace="hw", api_client=api_client, backoff_initial_s=0.05)
    await b.start()
    acts = ClusterActivities(b, signaler=Recorder(), heartbeat_s=0.01)
    try:
        await settled(b, lambda nodes: len(nodes) == 1)
        await foreign_pod(kube, "intruder", "n1", "3")
        await settled(b, lambda nodes: nodes[0].free_cpu_m == 1000)
        req = dataclasses.replace(
            request(
                "k-hb",
                [
                    PodSpec("worker", 0, cpu_m=1000, memory=GI),
                    PodSpec("worker", 1, cpu_m=1000, memory=GI),
                ],
                kind=GangKind.REPLICAS,
                cluster="k1",
            ),
            handback=True,
            namespace="hw",
        )
        result = await ActivityEnvironment().run(acts.run_action, req)
        assert result.kind is ActionEventKind.CAPACITY_CHANGED, result
        assert "0/1 nodes are available: 1 Insufficient cpu" in result.message
        assert not [p for p in kube.live("pods") if p["metadata"]["namespace"] == "hw"]
    finally:
        await b.close()


async def test_kubernetes_dispatch_counts_another_workers_headway_pod_not_yet_bound(
    kube: FakeKube, api_client: k8s.ApiClient
) -> None:
    """A Headway pod this worker's own informer does not watch (another worker's, in its
    namespace; or one the all-pods informer saw first) that is not bound yet takes its
    room first: kube-scheduler will bind it before anything created after it."""
    await add_node(kube, "n1")
    b = KubernetesBackend("k1", namespace="hw", api_client=api_client, backoff_initial_s=0.05)
    await b.start()
    acts = ClusterActivities(b, signaler=Recorder(), heartbeat_s=0.01)
    try:
        await settled(b, lambda nodes: len(nodes) == 1)
        body = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": "hw-theirs-main-0",
                "namespace": "other",
                "labels": {"headway.io/action": "theirs"},
            },
            "spec": {
                "containers": [{"name": "c", "image": "x", "resources": {"requests": {"cpu": "3"}}}]
            },
            "status": {"phase": "Pending"},
        }
        async with kube.post("/api/v1/namespaces/other/pods", json=body) as resp:
            assert resp.status < 300, await resp.text()

        async def seen() -> None:
            async with asyncio.timeout(10):
                while not (view := b.free_nodes()) or not view[1]:
                    await asyncio.sleep(0.02)

        await seen()
        req = dataclasses.replace(
            request("k-mine", [PodSpec("main", 0, cpu_m=2000, memory=GI)], cluster="k1"),
            handback=True,
            namespace="hw",
        )
        result = await ActivityEnvironment().run(acts.run_action, req)
        assert result.kind is ActionEventKind.CAPACITY_CHANGED, result
        assert not [p for p in kube.live("pods") if p["metadata"]["namespace"] == "hw"]
    finally:
        await b.close()


async def test_a_simulated_node_stays_cordoned_and_tainted_across_a_worker_restart(
    tmp_path: Any,
) -> None:
    first = sim(state_dir=tmp_path)
    first.cordon("cpu-0")
    first.taint("gpu-0", "nvidia.com/gpu", effect="NoExecute")
    await first.close()
    again = sim(state_dir=tmp_path)
    report = await again.capacity()
    assert report.nodes is not None
    assert {n.name: n.unusable for n in report.nodes} == {
        "cpu-0": "node(s) were unschedulable",
        "cpu-1": "",
        "gpu-0": "node(s) had untolerated taint {nvidia.com/gpu: present}",
    }
    again.untaint("gpu-0", "nvidia.com/gpu")
    again.set_ready("cpu-1", False)
    report = await again.capacity()
    assert report.nodes is not None
    assert {n.name: n.free_cpu_m for n in report.nodes} == {"cpu-0": 0, "cpu-1": 0, "gpu-0": 32000}
    await again.close()
