"""A reusable environment's action on Kubernetes (issue #25), run by the activities as a
call in its environment's pool: a retried dispatch never runs the call a second time, the
arbiter does not hand it back for the room its pool holds, and cancelling the action
cancels its call.

As in ``test_exactly_once``, one dispatch is played through Temporal's
ActivityEnvironment: attempt 1 runs until its call runs in a pool pod, then times out
(its worker went silent). The retry runs on the same backend (the worker is alive: it
adopts the call) or on a fresh one (the worker restarted: the call is gone with its
connection, and the retry reports the work lost). The fake API server's kubelet runs the
pool pods' processes for real; each call of the task appends a line to a file.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from headway.activities.backends.kube_pool import POOL_LABEL
from headway.activities.backends.kubernetes import KubernetesBackend
from headway.activities.cluster import POD_LOST, ClusterActivities
from headway.protocol import ActionEventKind as K
from headway.protocol import DispatchRequest, PodSpec
from kubernetes import client as k8s
from temporalio.activity import ActivityCancellationDetails

from .fake_kube import FakeKube
from .helpers import GI, Recorder, attempt_env, pod_of, request
from .test_kubernetes import NS, add_node

MODULE = """\
import asyncio, os
import headway

env = headway.TaskEnvironment(
    name="kretry",
    reusable=headway.ReusePolicy(replicas=1, concurrency=2, idle_ttl=30),
)

@env.task
async def once(log: str, go: str) -> int:
    with open(log, "a") as f:
        f.write(os.environ["HEADWAY_ACTION_ID"] + "\\n")
    try:
        while not os.path.exists(go):
            await asyncio.sleep(0.05)
    except asyncio.CancelledError:
        with open(log + ".cancelled", "a") as f:
            f.write(os.environ["HEADWAY_ACTION_ID"] + "\\n")
        raise
    return os.getpid()
"""


def pooled_request(root: Path, action: str) -> DispatchRequest:
    inputs = {"log": str(root / "calls.log"), "go": str(root / "go")}
    command = ["python", "-m", "headway.sdk.run", "--module", "kretrytask", "--task", "once"]
    command += ["--root", str(root), "--action", action, "--run", "r", "--address", "x:1"]
    command += ["--pool", "kretry", "--pool-replicas", "1", "--pool-concurrency", "2"]
    command += ["--pool-idle-ttl", "30", "--inputs", json.dumps(inputs)]
    req = request(
        action,
        [PodSpec(role="main", index=0, cpu_m=1000, memory=GI, image="python", command=command)],
    )
    req.namespace = NS
    return req


async def pooled_backend(api_client: k8s.ApiClient, **opts: Any) -> KubernetesBackend:
    b = KubernetesBackend(
        "c1",
        namespace=NS,
        api_client=api_client,
        backoff_initial_s=0.05,
        backoff_max_s=0.2,
        pool_listen="127.0.0.1:0",
        **opts,
    )
    await b.start()
    return b


@pytest_asyncio.fixture
async def kubelet(kube: FakeKube, tmp_path: Path) -> AsyncIterator[FakeKube]:
    await add_node(kube, "n1", cpu="8", memory="32Gi")
    stop = asyncio.Event()
    task = asyncio.create_task(kube.run_kubelet(stop, tmp_path))
    try:
        yield kube
    finally:
        stop.set()
        await task


def pool_posts(kube: FakeKube) -> int:
    return sum(
        1
        for _, plural, kind, obj in kube.log
        if (plural, kind) == ("pods", "ADDED") and POOL_LABEL in obj["metadata"]["labels"]
    )


@pytest.mark.parametrize("restarted", [False, True])
async def test_a_retried_pooled_action_never_runs_its_call_twice(
    kubelet: FakeKube, api_client: k8s.ApiClient, tmp_path: Path, restarted: bool
) -> None:
    (tmp_path / "kretrytask.py").write_text(MODULE)
    req = pooled_request(tmp_path, "p1")
    first = await pooled_backend(api_client)
    second = first
    try:
        beats: list[Any] = []
        rec1 = Recorder()
        env1 = attempt_env(1, beats=beats)
        acts1 = ClusterActivities(first, signaler=rec1, heartbeat_s=0.05)
        task = asyncio.create_task(env1.run(acts1.run_action, req))
        running = await rec1.wait_for(K.RUNNING, timeout=60)
        assert running.pod == pod_of("p1")
        for _ in range(600):  # the call has begun in the pool pod's process
            if (tmp_path / "calls.log").exists():
                break
            await asyncio.sleep(0.05)
        env1.cancel(ActivityCancellationDetails(timed_out=True))
        with pytest.raises(asyncio.CancelledError):
            await task
        if restarted:
            await first.close()  # its pools torn down, their connections closed
            second = await pooled_backend(api_client)
        posts = pool_posts(kubelet)
        rec2 = Recorder()
        acts2 = ClusterActivities(second, signaler=rec2, heartbeat_s=0.05)
        task2 = asyncio.create_task(attempt_env(2, [beats[-1]]).run(acts2.run_action, req))
        if not restarted:
            await rec2.wait_for(K.RUNNING)  # the running call, adopted
        (tmp_path / "go").touch()
        result = await asyncio.wait_for(task2, 30)
        if restarted:
            assert result.kind is POD_LOST, result
            assert result.message.startswith(
                f"PodLost: pod {pod_of('p1')}, created by an earlier attempt, is gone"
            )
        else:
            assert result.kind is K.SUCCEEDED, result
        # The call ran once: the retry started nothing, not even a pool pod.
        assert (tmp_path / "calls.log").read_text().splitlines() == ["p1"]
        assert pool_posts(kubelet) == posts == 1
    finally:
        await second.close()
        if second is not first:
            await first.close()


async def test_a_pooled_action_is_not_handed_back_for_the_room_its_pool_holds(
    kube: FakeKube, api_client: k8s.ApiClient, tmp_path: Path
) -> None:
    # One CPU: the pool's one pod takes all of it; later actions run in that pod.
    await add_node(kube, "n1", cpu="1", memory="32Gi")
    stop = asyncio.Event()
    kubelet = asyncio.create_task(kube.run_kubelet(stop, tmp_path))
    (tmp_path / "kretrytask.py").write_text(MODULE)
    (tmp_path / "go").touch()
    b = await pooled_backend(api_client)
    try:
        acts = ClusterActivities(b, signaler=Recorder(), heartbeat_s=0.05, cleanup=True)
        results = []
        for i, action in enumerate(["h1", "h2"]):
            req = pooled_request(tmp_path, action)
            req.handback = True
            env = attempt_env(1, activity_id=str(i))
            results.append(await asyncio.wait_for(env.run(acts.run_action, req), 60))
        assert [r.kind for r in results] == [K.SUCCEEDED, K.SUCCEEDED], results
        assert (tmp_path / "calls.log").read_text().splitlines() == ["h1", "h2"]
        assert pool_posts(kube) == 1
    finally:
        await b.close()
        stop.set()
        await kubelet


async def test_cancelling_a_pooled_action_cancels_its_call_and_the_pool_serves_on(
    kubelet: FakeKube, api_client: k8s.ApiClient, tmp_path: Path
) -> None:
    (tmp_path / "kretrytask.py").write_text(MODULE)
    b = await pooled_backend(api_client)
    try:
        rec = Recorder()
        acts = ClusterActivities(b, signaler=rec, heartbeat_s=0.05)
        env = attempt_env(1, activity_id="1")
        task = asyncio.create_task(env.run(acts.run_action, pooled_request(tmp_path, "c1")))
        await rec.wait_for(K.RUNNING, timeout=60)
        for _ in range(600):  # the call has begun in the pool pod's process
            if (tmp_path / "calls.log").exists():
                break
            await asyncio.sleep(0.05)
        env.cancel()  # the action cancelled: its pods (here: its call) deleted
        with pytest.raises(asyncio.CancelledError):
            await task
        cancelled = tmp_path / "calls.log.cancelled"
        for _ in range(600):
            if cancelled.exists():
                break
            await asyncio.sleep(0.05)
        assert cancelled.read_text().splitlines() == ["c1"]
        assert not rec.kinds().count(K.SUCCEEDED)
        # The pool's pod goes on serving the environment's next action.
        (tmp_path / "go").touch()
        env2 = attempt_env(1, activity_id="2")
        done = await asyncio.wait_for(env2.run(acts.run_action, pooled_request(tmp_path, "c2")), 60)
        assert done.kind is K.SUCCEEDED, done
        assert (tmp_path / "calls.log").read_text().splitlines() == ["c1", "c2"]
        assert pool_posts(kubelet) == 1
    finally:
        await b.close()


async def test_a_pooled_action_whose_pool_pods_never_connect_fails_with_a_clear_message(
    kubelet: FakeKube, api_client: k8s.ApiClient, tmp_path: Path
) -> None:
    (tmp_path / "kretrytask.py").write_text(MODULE)
    b = await pooled_backend(api_client, pool_connect_timeout_s=1)
    try:
        req = pooled_request(tmp_path, "u1")
        req.pods[0].cpu_m = 64_000  # more than the node has: the pool's pod stays Pending
        acts = ClusterActivities(b, signaler=Recorder(), heartbeat_s=0.05)
        done = await asyncio.wait_for(attempt_env(1).run(acts.run_action, req), 60)
        assert done.kind is K.FAILED, done
        assert done.message.startswith(
            "EnvironmentUnavailable: no pod of reusable environment 'kretry'"
        ), done.message
        assert "within 1 s" in done.message
        assert not (tmp_path / "calls.log").exists()
    finally:
        await b.close()
