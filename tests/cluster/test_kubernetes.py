"""The Kubernetes backend: the real client over real HTTP against an extended kmock."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from headway.activities.backends.base import pod_name, service_name
from headway.activities.backends.kubernetes import (
    KubernetesBackend,
    build_pods,
    pod_requests,
    translate_pod,
)
from headway.activities.cluster import ClusterActivities
from headway.protocol import ActionEvent, GangKind, PodSpec
from headway.protocol import ActionEventKind as K
from temporalio.testing import ActivityEnvironment

from .fake_kube import FakeKube
from .helpers import GI, request

NS = "hw"


async def backend(api_client: Any, **opts: Any) -> KubernetesBackend:
    b = KubernetesBackend(
        "c1",
        namespace=NS,
        api_client=api_client,
        backoff_initial_s=0.05,
        backoff_max_s=0.2,
        **opts,
    )
    await b.start()
    return b


async def patch_pod(kube: FakeKube, name: str, patch: dict[str, Any]) -> None:
    async with kube.patch(f"/api/v1/namespaces/{NS}/pods/{name}", json=patch) as resp:
        assert resp.status == 200, await resp.text()


async def add_node(
    kube: FakeKube, name: str, *, cpu: str, memory: str, gpu: int = 0, product: str | None = None
) -> None:
    alloc = {"cpu": cpu, "memory": memory, "ephemeral-storage": "100Gi", "pods": "110"}
    if gpu:
        alloc["nvidia.com/gpu"] = str(gpu)
    labels = {"nvidia.com/gpu.product": product} if product else {}
    node = {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": labels},
        "status": {"allocatable": alloc, "conditions": [{"type": "Ready", "status": "True"}]},
    }
    async with kube.post("/api/v1/nodes", json=node) as resp:
        assert resp.status < 300, await resp.text()


async def next_event(q: asyncio.Queue[ActionEvent], action: str, timeout: float = 5) -> ActionEvent:
    async with asyncio.timeout(timeout):
        while True:
            ev = await q.get()
            if ev.action_id == action:
                return ev


async def wait_until(predicate: Any, timeout: float = 5) -> None:
    async with asyncio.timeout(timeout):
        while not predicate():
            await asyncio.sleep(0.02)


SCHEDULED = {
    "spec": {"nodeName": "n1"},
    "status": {"phase": "Pending", "conditions": [{"type": "PodScheduled", "status": "True"}]},
}
RUNNING = {"status": {"phase": "Running"}}


def _terminated(reason: str, code: int) -> dict[str, Any]:
    return {
        "status": {
            "phase": "Failed",
            "containerStatuses": [
                {"name": "main", "state": {"terminated": {"reason": reason, "exitCode": code}}}
            ],
        }
    }


@pytest.mark.parametrize(
    ("final", "kind", "exit_code"),
    [
        ({"status": {"phase": "Succeeded"}}, K.SUCCEEDED, 0),
        (_terminated("Error", 3), K.FAILED, 3),
        (_terminated("OOMKilled", 137), K.OOM_KILLED, 137),
        (
            {"status": {"phase": "Failed", "reason": "Evicted", "message": "low memory"}},
            K.EVICTED,
            None,
        ),
        (
            {
                "status": {
                    "conditions": [
                        {"type": "PodScheduled", "status": "True"},
                        {
                            "type": "DisruptionTarget",
                            "status": "True",
                            "reason": "PreemptionByScheduler",
                        },
                    ]
                }
            },
            K.PREEMPTED,
            None,
        ),
        ({"status": {"phase": "Unknown", "reason": "NodeLost"}}, K.NODE_LOST, None),
    ],
)
async def test_pod_lifecycle_events(kube, api_client, final, kind, exit_code):
    b = await backend(api_client)
    try:
        with b.subscribe() as q:
            names = await b.create_pods(request("life"))
            pod = names[0]
            stored = kube.live("pods")[0]
            assert stored["metadata"]["labels"]["headway.io/action"] == "life"
            assert stored["metadata"]["labels"]["headway.io/tenant"] == "t1"
            assert stored["metadata"]["labels"]["headway.io/role"] == "main"
            await patch_pod(
                kube,
                pod,
                {
                    "status": {
                        "phase": "Pending",
                        "conditions": [
                            {
                                "type": "PodScheduled",
                                "status": "False",
                                "reason": "Unschedulable",
                                "message": "0/3 nodes are available: 3 Insufficient cpu.",
                            }
                        ],
                    }
                },
            )
            ev = await next_event(q, "life")
            assert ev.kind is K.UNSCHEDULABLE
            assert ev.message == "0/3 nodes are available: 3 Insufficient cpu."
            await patch_pod(kube, pod, SCHEDULED)
            ev = await next_event(q, "life")
            assert (ev.kind, ev.node, ev.pod) == (K.SCHEDULED, "n1", pod)
            await patch_pod(kube, pod, RUNNING)
            assert (await next_event(q, "life")).kind is K.RUNNING
            await patch_pod(kube, pod, final)
            ev = await next_event(q, "life")
            assert ev.kind is kind and ev.exit_code == exit_code
            assert ev.cluster == "c1"
    finally:
        await b.close()


def _pull_failing(reason: str) -> dict[str, Any]:
    return {
        **SCHEDULED,
        "status": {
            "phase": "Pending",
            "containerStatuses": [
                {
                    "name": "main",
                    "image": "registry.example/typo:1",
                    "state": {"waiting": {"reason": reason, "message": "Back-off pulling image"}},
                }
            ],
        },
    }


@pytest.mark.parametrize(
    ("reason", "tolerated"),
    [
        pytest.param("ImagePullBackOff", True, id="back-off-waits-out-its-grace-then-fails"),
        pytest.param("ErrImagePull", True, id="a-failed-pull-waits-out-its-grace-too"),
        pytest.param("InvalidImageName", False, id="an-invalid-name-fails-at-once"),
    ],
)
async def test_image_pull_failure_is_tolerated_up_to_its_grace_then_names_the_image(
    kube, api_client, reason, tolerated
):
    await add_node(kube, "n1", cpu="8", memory="32Gi")
    b = await backend(api_client, image_pull_grace_s=1.0)
    try:
        with b.subscribe() as q:
            (p1,) = await b.create_pods(request("img"))
            await patch_pod(kube, p1, _pull_failing(reason))
            # Within its grace nothing is said (the kubelet keeps pulling); past it, or
            # at once for a name no pull can fix, the failure names the image.
            ev = await next_event(q, "img")
            assert ev.kind is K.IMAGE_PULL_FAILED
            assert "'registry.example/typo:1' could not be pulled" in ev.message
            assert reason in ev.message
            assert ("still failing after" in ev.message) is tolerated
    finally:
        await b.close()


async def test_image_pulled_within_its_grace_is_no_failure(kube, api_client):
    await add_node(kube, "n1", cpu="8", memory="32Gi")
    b = await backend(api_client, image_pull_grace_s=1.0)
    try:
        with b.subscribe() as q:
            (p1,) = await b.create_pods(request("img"))
            await patch_pod(kube, p1, _pull_failing("ImagePullBackOff"))
            await patch_pod(
                kube,
                p1,
                {
                    "status": {
                        "phase": "Running",
                        "containerStatuses": [{"name": "main", "state": {"running": {}}}],
                    }
                },
            )
            assert (await next_event(q, "img")).kind is K.RUNNING
            with pytest.raises(TimeoutError):
                await next_event(q, "img", timeout=1.5)
    finally:
        await b.close()


async def test_node_deletion_is_node_lost(kube, api_client):
    await add_node(kube, "n1", cpu="8", memory="32Gi")
    b = await backend(api_client)
    try:
        with b.subscribe() as q:
            (p2,) = await b.create_pods(request("lost"))
            await patch_pod(kube, p2, SCHEDULED)
            await patch_pod(kube, p2, RUNNING)
            while (await next_event(q, "lost")).kind is not K.RUNNING:
                pass
            async with kube.delete("/api/v1/nodes/n1") as resp:
                assert resp.status == 200
            ev = await next_event(q, "lost")
            assert ev.kind is K.NODE_LOST and ev.node == "n1"
    finally:
        await b.close()


async def test_relist_after_410_gone(kube, api_client):
    b = await backend(api_client)
    try:
        with b.subscribe() as q:
            (pod,) = await b.create_pods(request("gone"))
            await wait_until(lambda: b.informers["pods"].resource_version not in (None, "0"))
            lists_before = b.informers["pods"].relists
            # The watch breaks, and while nobody watches the pod starts running and the
            # server compacts its history: the informer's resourceVersion is too old now.
            kube.drop_watches()
            kube.modify("pods", NS, pod, {**SCHEDULED, "status": {"phase": "Running"}})
            kube.compact()
            ev = await next_event(q, "gone")
            assert ev.kind is K.RUNNING
            assert b.informers["pods"].relists > lists_before
            # And the fresh watch goes on delivering.
            await patch_pod(kube, pod, {"status": {"phase": "Succeeded"}})
            assert (await next_event(q, "gone")).kind is K.SUCCEEDED
    finally:
        await b.close()


async def test_restarted_worker_adopts_existing_pods(kube, api_client):
    gang = [PodSpec(role="worker", index=i, cpu_m=1000, memory=GI, gpu=1) for i in range(2)]
    req = request("adopt", gang, kind=GangKind.REPLICAS)
    first = await backend(api_client)
    names = await first.create_pods(req)
    await first.close()
    for name in names:
        await patch_pod(kube, name, {**SCHEDULED, "status": {"phase": "Running"}})

    # The restarted worker: a new backend, a new activity attempt, the same request.
    second = await backend(api_client)
    try:
        posts_before = sum(1 for r in list(kube) if r.method == "POST")
        env = ActivityEnvironment()
        events: list[ActionEvent] = []

        async def record(_wf: str, ev: ActionEvent) -> None:
            events.append(ev)

        acts = ClusterActivities(second, signaler=record, heartbeat_s=0.05)
        task = asyncio.create_task(env.run(acts.run_action, req))
        await wait_until(lambda: len([e for e in events if e.kind is K.RUNNING]) == 2)
        assert len(kube.live("pods")) == 2, "nothing created twice"
        assert len(kube.live("services")) == 1
        # The retry tried to create (idempotently) and was answered 409: adopted.
        posts = [r for r in list(kube) if r.method == "POST"][posts_before:]
        assert len(posts) == 3  # the service and both pods, each a conflict
        for name in names:
            await patch_pod(kube, name, {"status": {"phase": "Succeeded"}})
        result = await asyncio.wait_for(task, 5)
        assert result.kind is K.SUCCEEDED and result.message == "all 2 pods succeeded"
        assert kube.live("pods") == [] and kube.live("services") == []
    finally:
        await second.close()


async def test_retried_create_creates_nothing_twice(kube, api_client):
    b = await backend(api_client)
    try:
        gang = [PodSpec(role="ray-head", index=0, cpu_m=500)] + [
            PodSpec(role="ray-worker", index=i, cpu_m=500) for i in range(2)
        ]
        req = request("ray1", gang, kind=GangKind.RAY)
        first = await b.create_pods(req)
        second = await b.create_pods(req)
        assert first == second
        assert sorted(p["metadata"]["name"] for p in kube.live("pods")) == sorted(first)
        assert len(kube.live("services")) == 1
        assert await b.delete_pods("ray1", NS) == 3
        assert await b.delete_pods("ray1", NS) == 0
        assert kube.live("pods") == [] and kube.live("services") == []
    finally:
        await b.close()


async def test_capacity_from_nodes_and_pods(kube, api_client):
    await add_node(kube, "cpu-a", cpu="8", memory="32Gi")
    await add_node(kube, "gpu-a", cpu="64", memory="512Gi", gpu=8, product="NVIDIA-H100-80GB-HBM3")
    # Somebody else's pod takes 2 cores on cpu-a; a finished pod takes nothing.
    other = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "other", "namespace": "kube-system"},
        "spec": {
            "nodeName": "cpu-a",
            "containers": [{"name": "c", "resources": {"requests": {"cpu": "2", "memory": "1Gi"}}}],
        },
        "status": {"phase": "Running"},
    }
    done = {
        **other,
        "metadata": {"name": "done", "namespace": "kube-system"},
        "status": {"phase": "Succeeded"},
    }
    for pod in (other, done):
        async with kube.post("/api/v1/namespaces/kube-system/pods", json=pod) as resp:
            assert resp.status < 300
    b = await backend(api_client)
    try:
        gpu_pod = [
            PodSpec(
                role="main",
                index=0,
                cpu_m=4000,
                memory=64 * GI,
                gpu=4,
                gpu_type="NVIDIA-H100-80GB-HBM3",
            )
        ]
        (name,) = await b.create_pods(request("train", gpu_pod))
        await b.create_pods(request("pending"))  # never bound: not counted, not reflected
        await patch_pod(kube, name, {"spec": {"nodeName": "gpu-a"}, "status": {"phase": "Running"}})

        def settled() -> bool:
            return (
                b._nodes_known
                and b._all_pods_known
                and any(p.get("spec", {}).get("nodeName") == "gpu-a" for p in b._pods.values())
            )

        await wait_until(settled)
        cap = await b.capacity()
        nodes = {n.name: n for n in cap.nodes or []}
        assert nodes["cpu-a"].cpu_m == 8000 and nodes["cpu-a"].free_cpu_m == 6000
        assert nodes["cpu-a"].free_memory == 31 * GI
        assert nodes["cpu-a"].gpu == 0 and nodes["cpu-a"].gpu_type is None
        g = nodes["gpu-a"]
        assert (g.gpu, g.free_gpu, g.gpu_type) == (8, 4, "NVIDIA-H100-80GB-HBM3")
        assert g.free_cpu_m == 60000 and g.free_memory == 448 * GI
        assert cap.reflected_actions == ["train"]
    finally:
        await b.close()


async def test_capacity_unknown_when_nodes_are_forbidden(kube, api_client):
    kube.forbidden.add("nodes")
    b = await backend(api_client)
    try:
        await wait_until(lambda: b._all_pods_known)
        await asyncio.sleep(0.1)
        cap = await b.capacity()
        assert cap.nodes is None and cap.cluster == "c1"
    finally:
        await b.close()


def test_pod_manifests_for_each_gang_kind():
    typed = PodSpec(role="worker", index=0, cpu_m=8000, memory=64 * GI, gpu=8, gpu_type="H100")
    replicas = [
        typed,
        PodSpec(role="worker", index=1, cpu_m=8000, memory=64 * GI, gpu=8, gpu_type="H100"),
    ]
    pods = build_pods(request("tr", replicas, kind=GangKind.REPLICAS), "ml", "gpu.example/product")
    env = [{e["name"]: e["value"] for e in p["spec"]["containers"][0]["env"]} for p in pods]
    # (request() is tenant t1's: its pods and Service are named for it.)
    master = f"{pod_name('tr', 'worker', 0, 't1')}.{service_name('tr', 't1')}.ml.svc"
    assert env[0]["MASTER_ADDR"] == master == env[1]["MASTER_ADDR"]
    assert (env[0]["RANK"], env[1]["RANK"]) == ("0", "1")
    assert env[0]["WORLD_SIZE"] == "2" and env[0]["NPROC_PER_NODE"] == "8"
    assert env[0]["MASTER_PORT"] == "29500"
    res = pods[0]["spec"]["containers"][0]["resources"]
    assert (
        res["requests"]
        == res["limits"]
        == {
            "cpu": "8000m",
            "memory": str(64 * GI),
            "nvidia.com/gpu": "8",
        }
    )
    assert pods[0]["spec"]["nodeSelector"] == {"gpu.example/product": "H100"}
    assert pods[0]["spec"]["subdomain"] == service_name("tr", "t1")
    assert pods[0]["spec"]["restartPolicy"] == "Never"
    assert pod_requests(pods[0]) == (8000, 64 * GI, 0, 8)

    ray = [PodSpec(role="ray-head", index=0), PodSpec(role="ray-worker", index=0)]
    pods = build_pods(request("r", ray, kind=GangKind.RAY), "ml")
    for p in pods:
        env1 = {e["name"]: e["value"] for e in p["spec"]["containers"][0]["env"]}
        head = f"{pod_name('r', 'ray-head', 0, 't1')}.{service_name('r', 't1')}.ml.svc"
        assert env1["RAY_HEAD_ADDRESS"] == f"{head}:6379"

    spark = [PodSpec(role="spark-driver", index=0), PodSpec(role="spark-executor", index=0)]
    pods = build_pods(request("s", spark, kind=GangKind.SPARK), "ml")
    env2 = {e["name"]: e["value"] for e in pods[1]["spec"]["containers"][0]["env"]}
    driver = f"{pod_name('s', 'spark-driver', 0, 't1')}.{service_name('s', 't1')}.ml.svc"
    assert env2["SPARK_DRIVER_HOST"] == driver


def test_translate_pod_edge_cases():
    assert translate_pod({"status": {"phase": "Pending"}}) is None
    gc = {
        "status": {
            "phase": "Running",
            "conditions": [
                {"type": "DisruptionTarget", "status": "True", "reason": "DeletionByPodGC"}
            ],
        }
    }
    assert translate_pod(gc) == (K.NODE_LOST, None, "DeletionByPodGC")
    running = {"spec": {"nodeName": "x"}, "status": {"phase": "Running"}}
    assert translate_pod(running, node_gone=True) == (K.NODE_LOST, None, "node lost")
    # A finished pod stays finished even if its node is gone later.
    done = {"status": {"phase": "Succeeded"}}
    assert translate_pod(done, node_gone=True) == (K.SUCCEEDED, 0, "Completed")


def _failed_at(finished: str | None, deleted: str | None) -> dict[str, Any]:
    term: dict[str, Any] = {"reason": "Error", "exitCode": 137}
    if finished is not None:
        term["finishedAt"] = finished
    meta = {"deletionTimestamp": deleted} if deleted else {}
    return {
        "metadata": meta,
        "status": {
            "phase": "Failed",
            "containerStatuses": [{"name": "main", "state": {"terminated": term}}],
        },
    }


@pytest.mark.parametrize(
    ("pod", "kind"),
    [
        ({"metadata": {"deletionTimestamp": "2026-12-03T10:00:00Z"}}, K.POD_LOST),
        # Killed by its deletion (the kubelet's SIGKILL after the deletion was asked).
        (_failed_at("2026-12-03T10:00:02Z", "2026-12-03T10:00:00Z"), K.POD_LOST),
        (_failed_at("2026-12-03T10:00:00.5+00:00", "2026-12-03T10:00:00Z"), K.POD_LOST),
        # It failed on its own, then was deleted: its own failure.
        (_failed_at("2026-12-03T09:59:00Z", "2026-12-03T10:00:00Z"), K.FAILED),
        (_failed_at(None, "2026-12-03T10:00:00Z"), K.FAILED),
        (_failed_at("2026-12-03T10:00:02Z", None), K.FAILED),
        ({"metadata": {"deletionTimestamp": "x"}, "status": {"phase": "Succeeded"}}, K.SUCCEEDED),
    ],
    ids=[
        "marked-while-running",
        "killed-by-the-deletion",
        "killed-by-the-deletion-fractional-times",
        "failed-before-the-deletion",
        "failed-time-unknown",
        "failed-never-deleted",
        "succeeded-then-deleted",
    ],
)
def test_a_pod_deleted_before_it_ended_is_lost_not_failed(pod: dict[str, Any], kind: K) -> None:
    state = translate_pod(pod)
    assert state is not None and state[0] is kind, state
