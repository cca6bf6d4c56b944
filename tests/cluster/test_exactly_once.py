"""Exactly once on the cluster: a retried ``run_action`` never creates a pod again.

Each test plays one dispatch (``run_action`` and its retries) through Temporal's
ActivityEnvironment with the attempt number and heartbeat details Temporal would hand a
retry. "The worker dies" is the first attempt timing out (its pods are kept for the
successor) and its backend closing; the retry runs on a fresh backend, as a restarted
worker would. The simulated cluster survives only with a state directory; the
Kubernetes one is the fake API server over real HTTP.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from headway.activities.backends.base import DISPATCH_ANNOTATION
from headway.activities.backends.kubernetes import FINALIZER, GANG_GATE, build_pods
from headway.activities.cluster import POD_LOST, ClusterActivities, PriorAttempt
from headway.protocol import ActionEvent, DispatchRequest, GangKind, PodSpec
from headway.protocol import ActionEventKind as K
from headway.scheduler.model import ClusterSpec, NodeGroup
from headway.scheduler.resources import Pod
from kubernetes import client as k8s
from temporalio.activity import ActivityCancellationDetails

from .fake_kube import FakeKube
from .helpers import GI, Recorder, attempt_env, pod_of, request, sim, small_cluster
from .test_kubernetes import NS, RUNNING, SCHEDULED, add_node, backend, patch_pod

#: The dispatch key of ``attempt_env(activity_id="1")``.
DISPATCH_1 = "wf/run-1/1"

# The simulated cluster without its CPU nodes: where the first attempt's pod ran is gone.
NO_CPU_NODES = ClusterSpec(
    "c1",
    (NodeGroup("gpu", 1, Pod(cpu=32000, memory=256 * GI, eph=500 * GI, gpu=8, gpu_type="H100")),),
)


async def run_until_running(
    acts: ClusterActivities, rec: Recorder, req: Any, beats: list[Any]
) -> ActionEvent:
    """Attempt 1 until its pod runs; then it times out (its worker went silent), which
    keeps the pods for a successor. Returns the Running event."""
    env = attempt_env(1, beats=beats)
    task = asyncio.create_task(env.run(acts.run_action, req))
    running = await rec.wait_for(K.RUNNING)
    env.cancel(ActivityCancellationDetails(timed_out=True))
    with pytest.raises(asyncio.CancelledError):
        await task
    return running


# --- the simulated cluster --------------------------------------------------------------


@pytest.mark.parametrize(
    ("keep_state", "restarted_spec", "kind", "message"),
    [
        # The cluster outlived its worker: the retry adopts the running pod.
        (True, small_cluster(), K.SUCCEEDED, "Completed"),
        # The cluster died with its worker: the pod is reported lost, not run again.
        (False, small_cluster(), POD_LOST, f"PodLost: pod {pod_of('x1')}, created by an earlier"),
        # ...and its node is gone too.
        (False, NO_CPU_NODES, K.NODE_LOST, f"node cpu-0 is gone, and with it pod {pod_of('x1')}"),
        # The cluster outlived its worker, but not the pod's node.
        (True, NO_CPU_NODES, K.NODE_LOST, "node cpu-0 was lost"),
    ],
    ids=["state-adopts", "no-state-pod-lost", "no-state-node-lost", "state-node-lost"],
)
async def test_sim_retry_after_a_worker_death_never_creates_again(
    tmp_path: Path, keep_state: bool, restarted_spec: ClusterSpec, kind: K, message: str
) -> None:
    state = tmp_path / "state" if keep_state else None
    first = sim(time_scale=0.05, state_dir=state)
    await first.start()
    req = request("x1", duration_s=30.0)  # 1.5 s of wall time
    beats: list[Any] = []
    rec1 = Recorder()
    running = await run_until_running(
        ClusterActivities(first, signaler=rec1, heartbeat_s=0.05), rec1, req, beats
    )
    assert beats[0]["created"] == [pod_of("x1")], "the first heartbeat names the pods"
    created_before = first.created_count
    await first.close()  # the worker dies; with a state dir the cluster lives on

    second = sim(restarted_spec, time_scale=0.05, state_dir=state)
    await second.start()
    try:
        rec2 = Recorder()
        acts = ClusterActivities(second, signaler=rec2, heartbeat_s=0.05)
        result = await asyncio.wait_for(attempt_env(2, [beats[-1]]).run(acts.run_action, req), 10)
        assert result.kind is kind, result
        assert result.message.startswith(message), result.message
        assert (result.pod, result.node) == (pod_of("x1"), running.node)
        assert second.created_count == (created_before if keep_state else 0)
        assert K.SCHEDULED not in rec2.kinds(), "nothing was scheduled anew"
        assert rec2.kinds()[-1] is kind
        assert second.pods("x1") == {}, "whatever is left is cleaned up"
    finally:
        await second.close()


@pytest.mark.parametrize(
    "keep_state",
    [True, False],
    ids=["cluster-record", "heartbeat-record"],
)
async def test_a_retry_after_the_pods_ended_and_were_removed_returns_their_outcome(
    tmp_path: Path, keep_state: bool
) -> None:
    """The first attempt saw the gang succeed and deleted its pods, then died before
    Temporal heard: the retry returns Succeeded from the record, never runs it again."""
    state = tmp_path / "state" if keep_state else None
    first = sim(time_scale=0.01, state_dir=state)
    await first.start()
    gang = [PodSpec(role="worker", index=i, cpu_m=500, memory=GI) for i in range(2)]
    req = request("done", gang, kind=GangKind.REPLICAS)
    beats: list[Any] = []
    acts = ClusterActivities(first, signaler=Recorder(), heartbeat_s=0.05)
    result = await attempt_env(1, beats=beats).run(acts.run_action, req)
    assert result.kind is K.SUCCEEDED and first.pods("done") == {}
    await first.close()

    second = sim(time_scale=0.01, state_dir=state)
    await second.start()
    try:
        # With the cluster's record the retry needs no heartbeat details at all.
        details = [] if keep_state else [beats[-1]]
        rec = Recorder()
        again = await asyncio.wait_for(
            attempt_env(2, details).run(
                ClusterActivities(second, signaler=rec, heartbeat_s=0.05).run_action, req
            ),
            10,
        )
        assert again.kind is K.SUCCEEDED and again.message == "all 2 pods succeeded"
        assert second.created_count == (first.created_count if keep_state else 0)
        assert second.pods("done") == {}
    finally:
        await second.close()


async def test_a_retry_with_no_record_of_a_creation_creates_the_pods():
    """Attempt 1 died before creating anything (no heartbeat, nothing on the cluster):
    attempt 2 is the first to create."""
    b = sim()
    try:
        acts = ClusterActivities(b, signaler=Recorder(), heartbeat_s=0.05)
        result = await attempt_env(2).run(acts.run_action, request("late"))
        assert result.kind is K.SUCCEEDED
        assert b.created_count == 1
    finally:
        await b.close()


async def test_a_new_dispatch_replaces_the_stale_pods_of_an_earlier_one():
    """The action's earlier dispatch left its pod (its cleanup failed); a new dispatch of
    the action (the queue's retry) runs anew instead of adopting the old outcome."""
    b = sim(time_scale=0.01)
    try:
        req = request("again", duration_s=1.0)
        keep = ClusterActivities(b, signaler=Recorder(), heartbeat_s=0.05, cleanup=False)
        first = await attempt_env(1, activity_id="1").run(keep.run_action, req)
        assert first.kind is K.SUCCEEDED and list(b.pods("again")) == [pod_of("again")]
        rec = Recorder()
        acts = ClusterActivities(b, signaler=rec, heartbeat_s=0.05)
        second = await attempt_env(1, activity_id="2").run(acts.run_action, req)
        assert second.kind is K.SUCCEEDED
        assert b.created_count == 2, "created for the new dispatch"
        assert rec.kinds() == [K.SCHEDULED, K.RUNNING, K.SUCCEEDED], "it really ran again"
    finally:
        await b.close()


@pytest.mark.parametrize(
    ("details", "created", "nodes"),
    [
        ([], [], {}),
        (
            [
                {
                    "dispatch": "d",
                    "created": ["p0", "p1"],
                    "pods": {"p0": {"kind": "Running", "node": "n1"}},
                }
            ],
            ["p0", "p1"],
            {"p0": "n1"},
        ),
        # An older worker's details: {pod: kind}, every pod named there existed.
        ([{"p0": "Running", "p1": "Scheduled"}], ["p0", "p1"], {}),
        (["not a dict", 3], [], {}),
    ],
    ids=["none", "current", "legacy", "garbage"],
)
def test_prior_attempt_reads_heartbeat_details(details, created, nodes):
    prior = PriorAttempt.parse(details)
    assert prior.created == created
    assert {p: n.node for p, n in prior.pods.items() if n.node} == nodes


# --- Kubernetes, over real HTTP ---------------------------------------------------------


async def post_pod(kube: FakeKube, body: dict[str, Any]) -> None:
    async with kube.post(f"/api/v1/namespaces/{NS}/pods", json=body) as resp:
        assert resp.status < 300, await resp.text()


def pod_posts(kube: FakeKube) -> int:
    return sum(1 for r in list(kube) if r.method == "POST" and "/pods" in str(r.url))


async def wait_for_pods(kube: FakeKube, n: int) -> list[str]:
    async with asyncio.timeout(5):
        while len(pods := kube.live("pods")) < n:
            await asyncio.sleep(0.02)
    return sorted(p["metadata"]["name"] for p in pods)


@pytest.mark.parametrize(
    ("fault", "kind", "message"),
    [
        ("none", K.SUCCEEDED, "Completed"),
        # Deleted by someone else: its finalizer keeps it, marked, for the retry to read.
        ("pod-deleted", POD_LOST, "PodLost: the pod was deleted before it ended"),
        # The pod GC marked the pod before deleting it: the retry reads that as NodeLost.
        ("node-lost", K.NODE_LOST, "PodGC: node n1 no longer exists"),
    ],
)
async def test_kubernetes_restarted_worker_never_recreates(
    kube: FakeKube, api_client: k8s.ApiClient, fault: str, kind: K, message: str
) -> None:
    """A worker restart while (nothing | the pod | its node with the pod) disappears."""
    await add_node(kube, "n1", cpu="8", memory="32Gi")
    first = await backend(api_client)
    req = request("k1")
    req.namespace = NS
    beats: list[Any] = []
    rec1 = Recorder()
    acts1 = ClusterActivities(first, signaler=rec1, heartbeat_s=0.05)
    env1 = attempt_env(1, beats=beats)
    task = asyncio.create_task(env1.run(acts1.run_action, req))
    (pod,) = await wait_for_pods(kube, 1)
    assert kube.live("pods")[0]["metadata"]["annotations"][DISPATCH_ANNOTATION] == DISPATCH_1
    await patch_pod(kube, pod, SCHEDULED)
    await patch_pod(kube, pod, RUNNING)
    await rec1.wait_for(K.RUNNING)
    env1.cancel(ActivityCancellationDetails(timed_out=True))
    with pytest.raises(asyncio.CancelledError):
        await task
    await first.close()

    if fault == "pod-deleted":
        async with kube.delete(f"/api/v1/namespaces/{NS}/pods/{pod}") as resp:
            assert resp.status == 200
    elif fault == "node-lost":
        assert await kube.lose_node("n1") == [pod]
    # Kept by its finalizer, marked for deletion, until its outcome is recorded.
    (kept,) = kube.live("pods")
    assert bool(kept["metadata"].get("deletionTimestamp")) is (fault != "none")

    second = await backend(api_client)
    try:
        posts = pod_posts(kube)
        rec2 = Recorder()
        acts2 = ClusterActivities(second, signaler=rec2, heartbeat_s=0.05)
        task2 = asyncio.create_task(attempt_env(2, [beats[-1]]).run(acts2.run_action, req))
        if fault == "none":
            await rec2.wait_for(K.RUNNING)
            await patch_pod(kube, pod, {"status": {"phase": "Succeeded"}})
        result = await asyncio.wait_for(task2, 10)
        assert result.kind is kind, result
        assert result.message.startswith(message), result.message
        assert result.pod == pod and result.node == "n1"
        assert pod_posts(kube) == posts, "the retry created nothing"
        assert kube.live("pods") == []
    finally:
        await second.close()


def gang_of_two(action_id: str) -> DispatchRequest:
    req = request(
        action_id,
        [PodSpec(role="worker", index=i, cpu_m=500) for i in range(2)],
        kind=GangKind.REPLICAS,
    )
    req.namespace = NS
    return req


async def test_kubernetes_gang_cut_short_by_a_crash_is_completed_while_held(
    kube: FakeKube, api_client: k8s.ApiClient
) -> None:
    """Attempt 1 created the first pod of a gang and died before the second (and before
    any heartbeat). The gang's pods are held by a scheduling gate until every one exists,
    so nothing of it can have run: the retry creates the second, once, and releases both."""
    req = gang_of_two("held")
    first = build_pods(req, NS, dispatch=DISPATCH_1)[0]
    assert first["spec"]["schedulingGates"] == [{"name": GANG_GATE}]
    await post_pod(kube, first)
    b = await backend(api_client)
    try:
        posts = pod_posts(kube)
        acts = ClusterActivities(b, signaler=Recorder(), heartbeat_s=0.05)
        task = asyncio.create_task(attempt_env(2).run(acts.run_action, req))
        async with asyncio.timeout(5):
            while not (
                len(kube.live("pods")) == 2
                and not any(p["spec"].get("schedulingGates") for p in kube.live("pods"))
            ):
                await asyncio.sleep(0.05)
        assert pod_posts(kube) == posts + 1
        for p in kube.live("pods"):
            await patch_pod(kube, p["metadata"]["name"], {"status": {"phase": "Succeeded"}})
        result = await asyncio.wait_for(task, 10)
        assert result.kind is K.SUCCEEDED
    finally:
        await b.close()


async def test_kubernetes_gang_whose_release_a_crash_cut_short_is_released_whole(
    kube: FakeKube, api_client: k8s.ApiClient
) -> None:
    """Attempt 1 created the whole gang, released its first pod and died: the retry
    releases the rest (a gang held in part for ever would never finish)."""
    req = gang_of_two("part")
    first, second = build_pods(req, NS, dispatch=DISPATCH_1)
    del first["spec"]["schedulingGates"]
    await post_pod(kube, first)
    await post_pod(kube, second)
    b = await backend(api_client)
    try:
        posts = pod_posts(kube)
        acts = ClusterActivities(b, signaler=Recorder(), heartbeat_s=0.05)
        task = asyncio.create_task(attempt_env(2).run(acts.run_action, req))
        async with asyncio.timeout(5):
            while any(p["spec"].get("schedulingGates") for p in kube.live("pods")):
                await asyncio.sleep(0.05)
        assert pod_posts(kube) == posts
        for p in kube.live("pods"):
            await patch_pod(kube, p["metadata"]["name"], {"status": {"phase": "Succeeded"}})
        assert (await asyncio.wait_for(task, 10)).kind is K.SUCCEEDED
    finally:
        await b.close()


async def test_kubernetes_released_gang_missing_a_member_reports_it_lost(
    kube: FakeKube, api_client: k8s.ApiClient
) -> None:
    """A gang released (every pod existed) that is missing a member on retry: that member
    may have run, so it is not created; the gang ends PodLost and the rest is torn down."""
    req = gang_of_two("half")
    first = build_pods(req, NS, dispatch=DISPATCH_1)[0]
    del first["spec"]["schedulingGates"]
    await post_pod(kube, first)
    b = await backend(api_client)
    try:
        posts = pod_posts(kube)
        rec = Recorder()
        acts = ClusterActivities(b, signaler=rec, heartbeat_s=0.05)
        result = await asyncio.wait_for(attempt_env(2).run(acts.run_action, req), 10)
        assert result.kind is POD_LOST and result.pod == pod_of("half", "worker", 1)
        assert "missing from a gang" in result.message
        assert pod_posts(kube) == posts
        assert kube.live("pods") == []
    finally:
        await b.close()


async def test_kubernetes_new_dispatch_replaces_a_stale_pod(
    kube: FakeKube, api_client: k8s.ApiClient
) -> None:
    req = request("stale")
    req.namespace = NS
    old = build_pods(req, NS, dispatch="wf/run-1/9")[0]
    await post_pod(kube, old)
    await patch_pod(kube, old["metadata"]["name"], {"status": {"phase": "Succeeded"}})
    b = await backend(api_client)
    try:
        rec = Recorder()
        acts = ClusterActivities(b, signaler=rec, heartbeat_s=0.05)
        task = asyncio.create_task(attempt_env(1).run(acts.run_action, req))

        def fresh() -> list[dict[str, Any]]:
            return [
                p
                for p in kube.live("pods")
                if p["metadata"]["annotations"].get(DISPATCH_ANNOTATION) == DISPATCH_1
            ]

        async with asyncio.timeout(5):
            while not fresh():
                await asyncio.sleep(0.02)
        assert len(kube.live("pods")) == 1, "the stale pod was replaced, not kept beside"
        # The old pod's Succeeded is not this dispatch's outcome: it waits for its own.
        await asyncio.sleep(0.2)
        assert not task.done()
        await patch_pod(kube, pod_of("stale"), {"status": {"phase": "Succeeded"}})
        result = await asyncio.wait_for(task, 5)
        assert result.kind is K.SUCCEEDED
    finally:
        await b.close()


async def test_kubernetes_retry_after_a_kill_before_the_first_heartbeat_never_recreates(
    kube: FakeKube, api_client: k8s.ApiClient
) -> None:
    """Attempt 1 created the pod and died before any heartbeat reached Temporal; the pod
    then went with its node while no worker ran (Kubernetes fault seeds 107 and 109).
    Nothing but the pod can say it was created: its finalizer keeps it, marked by the
    pod GC, so the retry reports the loss instead of running the work again."""
    await add_node(kube, "n1", cpu="8", memory="32Gi")
    req = request("gap")
    req.namespace = NS
    first = await backend(api_client)
    try:
        await first.create_pods(req, dispatch=DISPATCH_1)
        (pod,) = await wait_for_pods(kube, 1)
        await patch_pod(kube, pod, SCHEDULED)
    finally:
        await first.close()
    assert await kube.lose_node("n1") == [pod]

    second = await backend(api_client)
    try:
        posts = pod_posts(kube)
        acts = ClusterActivities(second, signaler=Recorder(), heartbeat_s=0.05)
        result = await asyncio.wait_for(attempt_env(2).run(acts.run_action, req), 10)
        assert (result.kind, result.pod, result.node) == (K.NODE_LOST, pod, "n1"), result
        assert pod_posts(kube) == posts, "the retry created nothing"
        assert kube.live("pods") == [], "the finalizer lifted once the outcome was told"
    finally:
        await second.close()


async def test_kubernetes_pod_deleted_under_a_watching_worker_is_lost_and_kept_until_told(
    kube: FakeKube, api_client: k8s.ApiClient
) -> None:
    """``kubectl delete`` of a running pod: reported PodLost at once (an infrastructure
    loss, not the user's code failing), the pod kept by its finalizer until then."""
    await add_node(kube, "n1", cpu="8", memory="32Gi")
    req = request("del")
    req.namespace = NS
    b = await backend(api_client)
    try:
        rec = Recorder()
        acts = ClusterActivities(b, signaler=rec, heartbeat_s=0.05)
        task = asyncio.create_task(attempt_env(1).run(acts.run_action, req))
        (pod,) = await wait_for_pods(kube, 1)
        assert kube.live("pods")[0]["metadata"]["finalizers"] == [FINALIZER]
        await patch_pod(kube, pod, SCHEDULED)
        await patch_pod(kube, pod, RUNNING)
        await rec.wait_for(K.RUNNING)
        async with kube.delete(f"/api/v1/namespaces/{NS}/pods/{pod}") as resp:
            assert resp.status == 200
        result = await asyncio.wait_for(task, 10)
        assert result.kind is POD_LOST and result.message.startswith("PodLost: the pod was")
        assert kube.live("pods") == []
    finally:
        await b.close()
