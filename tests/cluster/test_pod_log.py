"""The pod log: one fsync'd JSON line per pod created, bound and ended, for audits.

Both backends write it when ``HEADWAY_POD_LOG`` names a file; every line once per
(dispatch, pod, event), whichever incarnation of the worker gets to write it.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from headway.activities.backends.base import POD_LOG_ENV, PodLog
from headway.activities.backends.kubernetes import KubernetesBackend
from headway.activities.cluster import ClusterActivities
from headway.protocol import ActionEventKind as K
from headway.protocol import GangKind, PodSpec
from kubernetes import client as k8s
from temporalio.activity import ActivityCancellationDetails

from .fake_kube import FakeKube
from .helpers import GI, Recorder, attempt_env, request, sim
from .test_kubernetes import NS, RUNNING, SCHEDULED, add_node, patch_pod

FIELDS = {
    "t",
    "cluster",
    "action",
    "pod",
    "node",
    "event",
    "cpu_m",
    "mem",
    "gpu",
    "outcome",
    "incarnation",
    "dispatch",
}


def lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def events(path: Path, action: str) -> list[tuple[str, str | None, str | None]]:
    return [(x["event"], x["node"], x["outcome"]) for x in lines(path) if x["action"] == action]


SPEC = PodSpec(role="main", index=0, cpu_m=1500, memory=3 * GI, gpu=2)


def test_a_line_has_every_field_and_is_written_once(tmp_path):
    path = tmp_path / "pods.jsonl"
    log = PodLog(str(path), "c1")
    log.incarnation = "inc-1"
    common: dict[str, Any] = {
        "action": "a",
        "pod": "p",
        "node": None,
        "spec": SPEC,
        "dispatch": "d",
    }
    assert log.append("created", t=1.5, **common)
    assert not log.append("created", t=2.0, **common), "the same fact is never written twice"
    (line,) = lines(path)
    assert set(line) == FIELDS
    assert line == {
        "t": 1.5,
        "cluster": "c1",
        "action": "a",
        "pod": "p",
        "node": None,
        "event": "created",
        "cpu_m": 1500,
        "mem": 3 * GI,
        "gpu": 2,
        "outcome": None,
        "incarnation": "inc-1",
        "dispatch": "d",
    }
    log.close()
    # A later incarnation reads what was written and does not repeat it...
    again = PodLog(str(path), "c1")
    again.open()
    assert again.logged("d", "p", "created")
    assert not again.append("created", t=3.0, **common)
    # ...and sees the pod was never ended.
    assert [x["pod"] for x in again.unended_before()] == ["p"]
    # Another cluster's lines are its own business.
    other = PodLog(str(path), "c2")
    assert other.append("created", t=3.0, **common)
    assert len(lines(path)) == 2


def test_an_intent_alone_is_no_pod_a_later_incarnation_ends(tmp_path):
    """A worker killed between "creating" and its POST reaching the API server left no
    pod: the next incarnation must not log one ended (the audit would count it run)."""
    path = tmp_path / "pods.jsonl"
    log = PodLog(str(path), "c1")
    common: dict[str, Any] = {"action": "a", "node": None, "spec": SPEC, "dispatch": "d"}
    assert log.append("creating", t=1.0, pod="p0", **common)
    assert log.append("creating", t=1.1, pod="p1", **common)
    assert log.append("created", t=1.2, pod="p1", **common)
    log.close()
    again = PodLog(str(path), "c1")
    again.open()
    assert [x["pod"] for x in again.unended_before()] == ["p1"]
    assert again.end_vanished(2.0, lambda _dispatch, _pod: False) == 1
    assert [(x["pod"], x["event"]) for x in lines(path)][-1] == ("p1", "ended")


def test_a_line_torn_by_a_kill_does_not_swallow_the_next(tmp_path):
    path = tmp_path / "pods.jsonl"
    whole = json.dumps({"cluster": "c1", "pod": "p0", "event": "created", "dispatch": "d"})
    path.write_text(whole + "\n" + whole[:17])  # killed in the middle of a write
    log = PodLog(str(path), "c1")
    log.append(
        "ended", t=1.0, action="a", pod="p0", node="n", spec=SPEC, dispatch="d", outcome="Succeeded"
    )
    raw = path.read_text().splitlines()
    assert raw[1] == whole[:17]
    assert json.loads(raw[2])["event"] == "ended"
    assert log.unended_before() == []


def test_the_env_var_turns_it_on(monkeypatch, tmp_path):
    monkeypatch.delenv(POD_LOG_ENV, raising=False)
    assert PodLog.from_env("c1") is None
    monkeypatch.setenv(POD_LOG_ENV, str(tmp_path / "x.jsonl"))
    log = PodLog.from_env("c1")
    assert log is not None and log.path == str(tmp_path / "x.jsonl")


@pytest.mark.parametrize(
    ("inject", "cancel", "expected"),
    [
        (
            None,
            False,
            [("created", None, None), ("bound", "cpu-0", None), ("ended", "cpu-0", "Succeeded")],
        ),
        (
            "oom",
            False,
            [("created", None, None), ("bound", "cpu-0", None), ("ended", "cpu-0", "OOMKilled")],
        ),
        # Pending and bound with its image never pulled: it holds the node until deleted.
        (
            "image-pull",
            False,
            [
                ("created", None, None),
                ("bound", "cpu-0", None),
                ("ended", "cpu-0", "ImagePullFailed"),
            ],
        ),
        # Cancelled while it ran: deleted before it ended.
        (
            None,
            True,
            [("created", None, None), ("bound", "cpu-0", None), ("ended", "cpu-0", "Deleted")],
        ),
    ],
    ids=["succeeded", "oom", "image-pull", "cancelled"],
)
async def test_sim_logs_each_pod_created_bound_and_ended(tmp_path, inject, cancel, expected):
    path = tmp_path / "pods.jsonl"
    b = sim(time_scale=0.02 if cancel else 0.01, pod_log=str(path))
    b.incarnation = "inc-A"
    await b.start()
    try:
        rec = Recorder()
        acts = ClusterActivities(b, signaler=rec, heartbeat_s=0.05)
        env = attempt_env(1)
        task = asyncio.create_task(
            env.run(acts.run_action, request("a1", duration_s=60.0, inject=inject))
        )
        if cancel:
            await rec.wait_for(K.RUNNING)
            env.cancel(ActivityCancellationDetails())
            with pytest.raises(asyncio.CancelledError):
                await task
        else:
            await asyncio.wait_for(task, 10)
        assert events(path, "a1") == expected
        got = lines(path)
        assert all(x["incarnation"] == "inc-A" and x["dispatch"] == "wf/run-1/1" for x in got)
        assert all((x["cpu_m"], x["mem"], x["gpu"]) == (1000, GI, 0) for x in got)
        ts = [x["t"] for x in got]
        assert ts == sorted(ts)
    finally:
        await b.close()


async def test_sim_gang_on_a_lost_node_logs_each_pod_once(tmp_path):
    path = tmp_path / "pods.jsonl"
    b = sim(time_scale=1.0, pod_log=str(path))
    await b.start()
    try:
        gang = [PodSpec(role="worker", index=i, cpu_m=3000, memory=GI) for i in range(2)]
        await b.create_pods(request("g", gang, kind=GangKind.REPLICAS, duration_s=60), dispatch="d")
        nodes = b.pods("g")
        assert sorted(n or "" for n in nodes.values()) == ["cpu-0", "cpu-1"]
        b.kill_node("cpu-0")
        await b.delete_pods("g")
        by_pod = {p: [(e, n, o) for e, n, o, q in _rows(path) if q == p] for p in nodes}
        for pod, node in nodes.items():
            outcome = "NodeLost" if node == "cpu-0" else "Deleted"
            assert by_pod[pod] == [
                ("created", None, None),
                ("bound", node, None),
                ("ended", node, outcome),
            ]
    finally:
        await b.close()


def _rows(path: Path) -> list[tuple[str, str | None, str | None, str]]:
    return [(x["event"], x["node"], x["outcome"], x["pod"]) for x in lines(path)]


async def test_sim_restart_with_state_writes_nothing_twice_and_ends_in_the_new_incarnation(
    tmp_path,
):
    path = tmp_path / "pods.jsonl"
    first = sim(time_scale=0.01, state_dir=tmp_path / "state", pod_log=str(path))
    first.incarnation = "inc-A"
    await first.start()
    await first.create_pods(request("r", duration_s=30.0), dispatch="d")
    await first.close()
    second = sim(time_scale=0.01, state_dir=tmp_path / "state", pod_log=str(path))
    second.incarnation = "inc-B"
    await second.start()
    try:
        async with asyncio.timeout(5):
            while len(events(path, "r")) < 3:
                await asyncio.sleep(0.02)
        assert [(x["event"], x["incarnation"]) for x in lines(path)] == [
            ("created", "inc-A"),
            ("bound", "inc-A"),
            ("ended", "inc-B"),
        ]
    finally:
        await second.close()


async def test_sim_restart_without_state_ends_the_pods_that_died_with_the_worker(tmp_path):
    path = tmp_path / "pods.jsonl"
    first = sim(time_scale=1.0, pod_log=str(path))
    first.incarnation = "inc-A"
    await first.start()
    await first.create_pods(request("gone", duration_s=60.0), dispatch="d")
    await first.close()
    second = sim(pod_log=str(path))
    second.incarnation = "inc-B"
    await second.start()
    try:
        assert [(x["event"], x["node"], x["outcome"], x["incarnation"]) for x in lines(path)] == [
            ("created", None, None, "inc-A"),
            ("bound", "cpu-0", None, "inc-A"),
            ("ended", "cpu-0", "Deleted", "inc-B"),
        ]
    finally:
        await second.close()


async def started_kube(api: k8s.ApiClient, incarnation: str, log: Path) -> KubernetesBackend:
    b = KubernetesBackend(
        "c1",
        namespace=NS,
        api_client=api,
        backoff_initial_s=0.05,
        backoff_max_s=0.2,
        pod_log=str(log),
    )
    b.incarnation = incarnation  # as the worker does: before start
    await b.start()
    return b


async def test_kubernetes_logs_created_bound_ended_and_what_vanished_while_down(
    kube: FakeKube, api_client: k8s.ApiClient, tmp_path: Path
) -> None:
    path = tmp_path / "pods.jsonl"
    await add_node(kube, "n1", cpu="8", memory="32Gi")
    first = await started_kube(api_client, "inc-A", path)
    try:
        (done,) = await first.create_pods(request("done"), dispatch="d1")
        (lost,) = await first.create_pods(request("lost"), dispatch="d2")
        for pod in (done, lost):
            await patch_pod(kube, pod, SCHEDULED)
            await patch_pod(kube, pod, RUNNING)
        await patch_pod(kube, done, {"status": {"phase": "Succeeded"}})

        async def settled() -> None:
            async with asyncio.timeout(5):
                while len(events(path, "done")) < 4 or len(events(path, "lost")) < 3:
                    await asyncio.sleep(0.02)

        await settled()
    finally:
        await first.close()
    # While no worker runs, the node goes and takes the running pod with it.
    await kube.lose_node("n1")
    cfg = k8s.Configuration()
    cfg.host = str(kube.url).rstrip("/")
    second = await started_kube(k8s.ApiClient(cfg), "inc-B", path)
    try:
        async with asyncio.timeout(5):
            while len(events(path, "lost")) < 4:
                await asyncio.sleep(0.02)
        cpu, mem = 1000, GI
        # The intent before the create call, then the call's success.
        assert events(path, "done") == [
            ("creating", None, None),
            ("created", None, None),
            ("bound", "n1", None),
            ("ended", "n1", "Succeeded"),
        ]
        assert events(path, "lost") == [
            ("creating", None, None),
            ("created", None, None),
            ("bound", "n1", None),
            # The pod GC marked it and its finalizer kept it: how it ended is known.
            ("ended", "n1", "NodeLost"),
        ]
        rows = lines(path)
        assert all((x["cpu_m"], x["mem"], x["gpu"]) == (cpu, mem, 0) for x in rows)
        assert [x["incarnation"] for x in rows if x["action"] == "lost"] == [
            "inc-A",
            "inc-A",
            "inc-A",
            "inc-B",
        ]
        assert {x["dispatch"] for x in rows if x["action"] == "lost"} == {"d2"}
    finally:
        await second.close()


def test_a_pod_log_that_cannot_be_opened_fails_the_backend_by_name(monkeypatch, tmp_path):
    where = tmp_path / "no-such-dir" / "pods.jsonl"
    monkeypatch.setenv(POD_LOG_ENV, str(where))
    with pytest.raises(ValueError, match=POD_LOG_ENV) as err:
        sim()
    assert str(where) in str(err.value) and "No such file or directory" in str(err.value)
