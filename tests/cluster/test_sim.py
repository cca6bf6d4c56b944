"""The simulated backend: binding, lifecycle events, faults and exact capacity."""

from __future__ import annotations

import asyncio

import pytest
from headway.activities.backends import pod_name, sanitize_dns1123
from headway.protocol import ActionEventKind as K
from headway.protocol import GangKind, PodSpec
from headway.scheduler.model import ClusterSpec, NodeGroup
from headway.scheduler.resources import Pod

from .helpers import GI, collect_until_terminal, pod_of, request, sim, small_cluster


def test_pod_names_are_dns1123_and_distinct():
    assert pod_name("a1", "main", 0) == "hw-a1-main-0"
    weird = pod_name("Run_42/Step.A", "ray-head", 0)
    assert weird == weird.lower() and len(weird) <= 63
    assert all(c.isalnum() or c == "-" for c in weird)
    assert weird[0].isalnum() and weird[-1].isalnum()
    long = pod_name("x" * 100, "worker", 3)
    assert len(long) <= 63
    # Sanitizing never merges two different ids onto one name (adoption is by name).
    assert sanitize_dns1123("a_b") != sanitize_dns1123("a.b")


async def test_single_pod_lifecycle_and_capacity():
    b = sim()
    with b.subscribe() as q:
        names = await b.create_pods(request("a1"))
        assert names == [pod_of("a1")]
        cap = await b.capacity()
        assert cap.reflected_actions == ["a1"]
        # Best fit: the CPU-only pod goes to the first CPU node, not the GPU node.
        node = b.pods("a1")[pod_of("a1")]
        assert node == "cpu-0"
        by_name = {n.name: n for n in cap.nodes or []}
        assert by_name["cpu-0"].free_cpu_m == 3000
        assert by_name["cpu-0"].free_memory == 15 * GI
        assert by_name["cpu-1"].free_cpu_m == 4000
        assert by_name["gpu-0"].free_gpu == 8 and by_name["gpu-0"].gpu_type == "H100"
        events = await collect_until_terminal(q, "a1")
    assert [e.kind for e in events] == [K.SCHEDULED, K.RUNNING, K.SUCCEEDED]
    assert all(e.pod == pod_of("a1") and e.node == "cpu-0" and e.cluster == "c1" for e in events)
    cap = await b.capacity()
    assert cap.reflected_actions == []
    assert all(n.free_cpu_m == n.cpu_m for n in cap.nodes or [])
    await b.close()


@pytest.mark.parametrize(
    ("inject", "kind", "exit_code"),
    [
        ("oom", K.OOM_KILLED, 137),
        ("fail", K.FAILED, 1),
        ("preempt", K.PREEMPTED, None),
        ("node-lost", K.NODE_LOST, None),
        ("image-pull", K.IMAGE_PULL_FAILED, None),
    ],
)
async def test_injected_faults(inject, kind, exit_code):
    b = sim()
    with b.subscribe() as q:
        await b.create_pods(request("f1", inject=inject))
        events = await collect_until_terminal(q, "f1")
    assert events[0].kind is K.SCHEDULED
    assert events[-1].kind is kind
    assert events[-1].exit_code == exit_code
    if inject == "image-pull":
        assert K.RUNNING not in [e.kind for e in events]
        # The pod stays bound and holds its requests until deleted, like on Kubernetes.
        cap = await b.capacity()
        assert {n.name: n.free_cpu_m for n in cap.nodes or []}["cpu-0"] == 3000
        assert await b.delete_pods("f1") == 1
        cap = await b.capacity()
        assert {n.name: n.free_cpu_m for n in cap.nodes or []}["cpu-0"] == 4000
    if inject == "node-lost":
        cap = await b.capacity()
        assert "cpu-0" not in {n.name for n in cap.nodes or []}
    await b.close()


async def test_unknown_fault_is_rejected():
    b = sim()
    with pytest.raises(ValueError, match="inject"):
        await b.create_pods(request("x", inject="meteor"))


async def test_unschedulable_until_capacity_frees():
    cpu_only = ClusterSpec("c1", (NodeGroup("cpu", 2, Pod(cpu=4000, memory=16 * GI)),))
    b = sim(cpu_only)
    big = [PodSpec(role="main", index=0, cpu_m=3000, memory=GI)]
    with b.subscribe() as q:
        await b.create_pods(request("b1", big, duration_s=1.0))
        await b.create_pods(request("b2", big, duration_s=1.0))
        await b.create_pods(request("b3", big, duration_s=1.0))
        first = await asyncio.wait_for(_next_of(q, "b3"), 2)
        assert first.kind is K.UNSCHEDULABLE
        assert first.message == "0/2 nodes are available: 2 Insufficient cpu."
        assert "b3" not in (await b.capacity()).reflected_actions
        events = await collect_until_terminal(q, "b3")
    # It binds as soon as b1 or b2 ends, with no one asking again.
    assert [e.kind for e in events][-3:] == [K.SCHEDULED, K.RUNNING, K.SUCCEEDED]
    await b.close()


async def _next_of(q, action_id):
    while True:
        ev = await q.get()
        if ev.action_id == action_id:
            return ev


async def test_typed_gpu_pods_only_fit_matching_nodes():
    b = sim()
    with b.subscribe() as q:
        await b.create_pods(
            request("g1", [PodSpec(role="main", index=0, cpu_m=1000, gpu=2, gpu_type="A100")])
        )
        ev = await asyncio.wait_for(_next_of(q, "g1"), 2)
        assert ev.kind is K.UNSCHEDULABLE
        assert "didn't match Pod's node affinity/selector" in ev.message
        await b.create_pods(
            request("g2", [PodSpec(role="main", index=0, cpu_m=1000, gpu=2, gpu_type="H100")])
        )
        ev = await asyncio.wait_for(_next_of(q, "g2"), 2)
        assert ev.kind is K.SCHEDULED and ev.node == "gpu-0"
    cap = await b.capacity()
    gpu = next(n for n in cap.nodes or [] if n.name == "gpu-0")
    assert gpu.free_gpu == 6
    # g1 is pending, so it is not reflected (the scheduler keeps its own reservation).
    assert cap.reflected_actions == ["g2"]
    await b.close()


async def test_create_is_idempotent_and_gang_binds_every_pod():
    b = sim(time_scale=1.0)  # long enough that nothing ends during the test
    gang = [PodSpec(role="worker", index=i, cpu_m=2000, memory=GI) for i in range(3)]
    req = request("tr", gang, kind=GangKind.REPLICAS, duration_s=60)
    names = await b.create_pods(req)
    again = await b.create_pods(req)
    assert names == again == [pod_of("tr", "worker", i) for i in range(3)]
    assert len(b.pods("tr")) == 3
    cap = await b.capacity()
    used = sum(n.cpu_m - n.free_cpu_m for n in cap.nodes or [])
    assert used == 6000  # three pods, not six
    assert await b.delete_pods("tr") == 3
    assert await b.delete_pods("tr") == 0
    await b.close()


async def test_kill_node_and_preempt_methods():
    b = sim(time_scale=1.0)
    three = [PodSpec(role="main", index=0, cpu_m=3000, memory=GI)]
    await b.create_pods(request("k1", three, duration_s=60))
    await b.create_pods(request("k2", three, duration_s=60))
    with b.subscribe() as q:
        node = b.pods("k1")[pod_of("k1")]
        assert node is not None
        lost = b.kill_node(node)
        assert pod_of("k1") in lost
        ev = await asyncio.wait_for(_next_of(q, "k1"), 2)
        assert ev.kind is K.NODE_LOST and ev.node == node
        cap = await b.capacity()
        assert node not in {n.name for n in cap.nodes or []}
        b.restore_node(node)
        cap = await b.capacity()
        assert node in {n.name for n in cap.nodes or []}
        assert b.preempt("k2")
        ev = await asyncio.wait_for(_next_of(q, "k2"), 2)
        assert ev.kind is K.PREEMPTED
    await b.close()


async def test_capacity_unknown_when_cluster_does_not_report():
    b = sim(small_cluster(reports_capacity=False))
    first = await b.capacity()
    second = await b.capacity()
    assert first.nodes is None and first.cluster == "c1"
    assert second.sequence > first.sequence


async def test_capacity_change_signal():
    b = sim()
    v0 = await b.wait_capacity_change(-1)
    waiter = asyncio.create_task(b.wait_capacity_change(v0))
    await asyncio.sleep(0)
    assert not waiter.done()
    await b.create_pods(request("w1"))
    assert await asyncio.wait_for(waiter, 1) > v0
    await b.close()
