"""The cluster activities over the simulated backend, in Temporal's ActivityEnvironment."""

from __future__ import annotations

import asyncio

import pytest
from headway.activities.cluster import ClusterActivities, GangTracker
from headway.protocol import TERMINAL_EVENTS, ActionEvent, GangKind, PodSpec
from headway.protocol import ActionEventKind as K
from temporalio.activity import ActivityCancellationDetails
from temporalio.testing import ActivityEnvironment

from .helpers import GI, Recorder, pod_of, request, sim


def env_with_heartbeats() -> tuple[ActivityEnvironment, list[object]]:
    env = ActivityEnvironment()
    beats: list[object] = []
    env.on_heartbeat = lambda *details: beats.append(details)
    return env, beats


async def test_single_pod_signals_each_event_and_returns_terminal():
    b = sim()
    rec = Recorder()
    acts = ClusterActivities(b, signaler=rec, heartbeat_s=0.01)
    env, beats = env_with_heartbeats()
    result = await env.run(acts.run_action, request("s1"))
    assert result.kind is K.SUCCEEDED and result.pod == pod_of("s1")
    assert rec.kinds() == [K.SCHEDULED, K.RUNNING, K.SUCCEEDED]
    assert {wf for wf, _ in rec.events} == {"wf-s1"}
    assert beats, "run_action must heartbeat while the pod lives"
    assert b.pods("s1") == {}, "finished pods are cleaned up"
    await b.close()


async def test_gang_succeeds_only_when_every_pod_has():
    b = sim()
    rec = Recorder()
    acts = ClusterActivities(b, signaler=rec, heartbeat_s=0.05)
    gang = [PodSpec(role="worker", index=i, cpu_m=1000, memory=GI) for i in range(3)]
    result = await ActivityEnvironment().run(
        acts.run_action, request("g1", gang, kind=GangKind.REPLICAS)
    )
    assert result.kind is K.SUCCEEDED and result.pod is None
    assert result.message == "all 3 pods succeeded"
    kinds = rec.kinds()
    assert kinds.count(K.SCHEDULED) == 3 and kinds.count(K.RUNNING) == 3
    # One terminal signal for the gang, never one per pod.
    assert [k for k in kinds if k in TERMINAL_EVENTS] == [K.SUCCEEDED]
    await b.close()


async def test_gang_fails_at_first_failure_and_tears_down_the_rest():
    b = sim()
    rec = Recorder()
    acts = ClusterActivities(b, signaler=rec, heartbeat_s=0.05)
    gang = [PodSpec(role="ray-head", index=0, cpu_m=500)] + [
        PodSpec(role="ray-worker", index=i, cpu_m=500) for i in range(2)
    ]
    result = await ActivityEnvironment().run(
        acts.run_action, request("r1", gang, kind=GangKind.RAY, duration_s=4, inject="oom")
    )
    assert result.kind is K.OOM_KILLED and result.exit_code == 137
    assert result.pod == pod_of("r1", "ray-head", 0)
    assert b.pods("r1") == {}
    assert [k for k in rec.kinds() if k in TERMINAL_EVENTS] == [K.OOM_KILLED]
    await b.close()


async def test_cancellation_deletes_pods_and_reraises():
    b = sim(time_scale=1.0)
    rec = Recorder()
    acts = ClusterActivities(b, signaler=rec, heartbeat_s=0.05)
    env = ActivityEnvironment()
    task = asyncio.create_task(env.run(acts.run_action, request("c1", duration_s=60)))
    await rec.wait_for(K.SCHEDULED)
    assert b.pods("c1")
    env.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert b.pods("c1") == {}
    await b.close()


async def test_retried_attempt_adopts_pods_and_creates_nothing_twice():
    b = sim(time_scale=0.5)  # the pod runs 1.5 s: long enough to kill the first attempt
    rec1 = Recorder()
    first = ClusterActivities(b, signaler=rec1, heartbeat_s=0.05)
    env1 = ActivityEnvironment()
    req = request("a1", duration_s=3.0)
    task = asyncio.create_task(env1.run(first.run_action, req))
    running = await rec1.wait_for(K.RUNNING)
    # The attempt times out (its worker went silent): the pods must survive for the retry.
    env1.cancel(ActivityCancellationDetails(timed_out=True))
    with pytest.raises(asyncio.CancelledError):
        await task
    assert b.pods("a1") == {pod_of("a1"): running.node}

    # A restarted worker: a fresh activities object over the same cluster.
    rec2 = Recorder()
    second = ClusterActivities(b, signaler=rec2, heartbeat_s=0.05)
    created_before = b.created_count
    result = await ActivityEnvironment().run(second.run_action, req)
    assert b.created_count == created_before, "the retry adopted, it created no pod"
    assert result.kind is K.SUCCEEDED and result.node == running.node
    # It picks up where the pod is (Running), without a second Scheduled.
    assert rec2.kinds() == [K.RUNNING, K.SUCCEEDED]
    await b.close()


async def test_worker_shutdown_keeps_pods_for_the_successor():
    b = sim(time_scale=1.0)
    rec = Recorder()
    acts = ClusterActivities(b, signaler=rec, heartbeat_s=0.05)
    env = ActivityEnvironment()
    task = asyncio.create_task(env.run(acts.run_action, request("w1", duration_s=60)))
    await rec.wait_for(K.RUNNING)
    env.worker_shutdown()
    env.cancel(ActivityCancellationDetails(worker_shutdown=True))
    with pytest.raises(asyncio.CancelledError):
        await task
    assert list(b.pods("w1")) == [pod_of("w1")]
    await b.close()


async def test_delete_action_is_idempotent():
    b = sim(time_scale=1.0)
    acts = ClusterActivities(b, signaler=Recorder())
    req = request("d1", duration_s=60)
    await b.create_pods(req)
    env = ActivityEnvironment()
    assert await env.run(acts.delete_action, req) == 1
    assert await env.run(acts.delete_action, req) == 0
    await b.close()


async def test_unschedulable_is_reported_while_waiting():
    b = sim()
    rec = Recorder()
    acts = ClusterActivities(b, signaler=rec, heartbeat_s=0.05)
    huge = [PodSpec(role="main", index=0, cpu_m=1_000_000)]
    task = asyncio.create_task(ActivityEnvironment().run(acts.run_action, request("u1", huge)))
    ev = await rec.wait_for(K.UNSCHEDULABLE)
    assert "Insufficient cpu" in ev.message
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await b.close()


def test_tracker_ignores_other_actions_and_late_node_loss():
    t = GangTracker("a", "c", ["p0", "p1"])
    assert t.observe(ActionEvent("b", K.RUNNING, "c", pod="p0")) == []
    assert t.observe(ActionEvent("a", K.SUCCEEDED, "c", pod="p0")) == []
    # p0 already finished: losing its node afterwards does not fail the gang.
    assert t.observe(ActionEvent("a", K.NODE_LOST, "c", pod="p0")) == []
    assert t.terminal is None
    out = t.observe(ActionEvent("a", K.SUCCEEDED, "c", pod="p1"))
    assert [e.kind for e in out] == [K.SUCCEEDED] and t.terminal is out[0]
    assert t.observe(ActionEvent("a", K.FAILED, "c", pod="p1")) == []
