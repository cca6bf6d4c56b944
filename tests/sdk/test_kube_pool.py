"""A reusable environment's pool on Kubernetes: long-lived pods that pull their calls from
their cluster worker (``python -m headway.sdk.run --pull``), against the fake API server,
whose kubelet runs each pool pod's container as a real local process. No Temporal: the
calls are made to the pools directly (the Kubernetes backend's routing to them is
tested end to end in ``tests/cluster/test_e2e_kube_pool.py``)."""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import AsyncIterator
from pathlib import Path

import kmock
import pytest
import pytest_asyncio
from headway.activities.backends.kube_pool import (
    POOL_LABEL,
    KubePools,
    PoolUnavailable,
    parse_listen,
)
from headway.activities.backends.sim_task import PoolShape, pool_shape
from headway.tests.cluster.fake_kube import FakeKube
from kubernetes import client as k8s

NS = "hw-pool"

MODULE = """\
import asyncio, os
import headway

env = headway.TaskEnvironment(
    name="kwarm",
    reusable=headway.ReusePolicy(replicas=2, concurrency=3, idle_ttl=1),
)

RUNNING = 0
MOST = 0

@env.task
async def where(i: int) -> dict:
    global RUNNING, MOST
    RUNNING += 1
    MOST = max(MOST, RUNNING)
    await asyncio.sleep(0.3)
    RUNNING -= 1
    if i < 0:
        raise ValueError(f"negative: {i}")
    return {"pid": os.getpid(), "most": MOST, "rank": os.environ.get("RANK"),
            "action": os.environ.get("HEADWAY_ACTION_ID")}
"""


@pytest_asyncio.fixture
async def kube(tmp_path: Path) -> AsyncIterator[FakeKube]:
    async with FakeKube() as server, kmock.Server(server):
        node = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": "n1", "labels": {}},
            "status": {
                "allocatable": {"cpu": "16", "memory": "64Gi", "pods": "110"},
                "conditions": [{"type": "Ready", "status": "True"}],
            },
        }
        async with server.post("/api/v1/nodes", json=node) as resp:
            assert resp.status < 300, await resp.text()
        stop = asyncio.Event()
        kubelet = asyncio.create_task(server.run_kubelet(stop, tmp_path))
        try:
            yield server
        finally:
            stop.set()
            await kubelet
            server.drop_watches()


def call(root: Path, action: str, i: int) -> list[str]:
    command = ["python", "-m", "headway.sdk.run", "--module", "kwarmtask", "--task", "where"]
    command += ["--root", str(root), "--action", action, "--run", "r", "--address", "x:1"]
    command += ["--pool", "kwarm", "--pool-replicas", "2", "--pool-concurrency", "3"]
    command += ["--pool-idle-ttl", "1", "--inputs", json.dumps({"i": i})]
    return command


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


async def test_a_pools_pods_pull_its_calls_and_are_deleted_after_its_idle_time(
    kube: FakeKube, tmp_path: Path
) -> None:
    (tmp_path / "kwarmtask.py").write_text(MODULE)
    cfg = k8s.Configuration()
    cfg.host = str(kube.url).rstrip("/")
    api = k8s.ApiClient(cfg)
    pools = KubePools(api, NS, advertise="127.0.0.1", bind="127.0.0.1")
    await pools.start()
    shape = pool_shape(call(tmp_path, "x", 0))
    assert isinstance(shape, PoolShape)
    requests = {"cpu": "1", "memory": "1Gi"}

    async def run(action: str, i: int) -> dict[str, object]:
        env = {"RANK": "0", "HEADWAY_ACTION_ID": action}
        done = await asyncio.wait_for(
            pools.run(
                shape, call(tmp_path, action, i), env, image="python:3.12", requests=requests
            ),
            60,
        )
        return {"ok": done.ok, "message": done.message, "doc": json.loads(done.document or "{}")}

    try:
        outs = await asyncio.gather(*(run(f"a{i}", i) for i in range(12)))
        assert all(o["ok"] for o in outs), outs
        results = [o["doc"]["output"] for o in outs]  # type: ignore[index]
        # Two pods served every call, none more than its concurrency at once, and each
        # call saw its own environment.
        pids = {r["pid"] for r in results}
        assert len(pids) == 2
        assert max(r["most"] for r in results) <= 3
        assert [r["action"] for r in results] == [f"a{i}" for i in range(12)]
        assert {r["rank"] for r in results} == {"0"}
        # The pool's pods: the environment's requests, the pull entrypoint, one label.
        pods = [p for p in kube.live("pods") if POOL_LABEL in p["metadata"].get("labels", {})]
        names = pools.pod_names()["kwarm"]
        assert (
            sorted(p["metadata"]["name"] for p in pods)
            == names
            == [f"{names[0][:-2]}-{i}" for i in range(2)]
        )
        for p in pods:
            (c,) = p["spec"]["containers"]
            assert c["command"][1:4] == ["-m", "headway.sdk.run", "--pull"]
            assert c["resources"]["requests"] == requests
        assert pools.connected()["kwarm"] == names
        # A failure in the task is that call's outcome; the pods go on serving.
        bad = await run("bad", -1)
        assert (bad["ok"], bad["message"]) == (False, "ValueError: negative: -1")
        again = await run("again", 1)
        assert again["doc"]["output"]["pid"] in pids  # type: ignore[index]
        # Idle for its idle_ttl (1 s): its pods deleted, their processes gone.
        for _ in range(100):
            live = [p for p in kube.live("pods") if POOL_LABEL in p["metadata"].get("labels", {})]
            if not live and not any(_alive(p) for p in pids) and "kwarm" not in pools.connected():
                break
            await asyncio.sleep(0.1)
        assert not [p for p in kube.live("pods") if POOL_LABEL in p["metadata"]["labels"]]
        assert not any(_alive(p) for p in pids)
        # The next call creates the pool anew: new pods, new processes.
        anew = await run("anew", 2)
        assert anew["ok"] and anew["doc"]["output"]["pid"] not in pids  # type: ignore[index]
        assert not set(pools.pod_names()["kwarm"]) & set(names)
    finally:
        await pools.close()
        api.close()
    assert os.environ.get("HEADWAY_ACTION_ID") is None


async def test_a_call_whose_pool_pods_never_connect_fails_after_the_bounded_wait(
    kube: FakeKube, tmp_path: Path
) -> None:
    (tmp_path / "kwarmtask.py").write_text(MODULE)
    cfg = k8s.Configuration()
    cfg.host = str(kube.url).rstrip("/")
    api = k8s.ApiClient(cfg)
    pools = KubePools(api, NS, advertise="127.0.0.1", bind="127.0.0.1", connect_timeout_s=1)
    await pools.start()
    shape = pool_shape(call(tmp_path, "x", 0))
    assert isinstance(shape, PoolShape)
    started: list[str] = []
    try:
        # More CPU than the node has: the pool's pods stay Pending, never connect.
        with pytest.raises(PoolUnavailable) as err:
            await asyncio.wait_for(
                pools.run(
                    shape,
                    call(tmp_path, "u", 0),
                    {},
                    image="python:3.12",
                    requests={"cpu": "64", "memory": "1Gi"},
                    on_start=started.append,
                ),
                30,
            )
        assert started == []
        message = str(err.value)
        assert message.startswith("EnvironmentUnavailable: no pod of reusable environment")
        assert "'kwarm'" in message and "within 1 s" in message
        # Idle for its idle_ttl after that: the pending pods are deleted too.
        for _ in range(100):
            if not [p for p in kube.live("pods") if POOL_LABEL in p["metadata"]["labels"]]:
                break
            await asyncio.sleep(0.1)
        assert not [p for p in kube.live("pods") if POOL_LABEL in p["metadata"]["labels"]]
    finally:
        await pools.close()
        api.close()


@pytest.mark.parametrize(
    ("value", "parsed"),
    [("hw-worker:7070", ("hw-worker", 7070)), ("10.0.0.5:0", ("10.0.0.5", 0))],
)
def test_a_pool_listen_address_is_host_and_port(value: str, parsed: tuple[str, int]) -> None:
    assert parse_listen(value) == parsed


@pytest.mark.parametrize("value", ["hw-worker", ":7070", "h:port", "h:70000", "h:-1"])
def test_a_bad_pool_listen_address_is_refused_naming_it(value: str) -> None:
    with pytest.raises(ValueError, match=rf"--pool-listen: '{value}' is not HOST:PORT"):
        parse_listen(value)


async def test_pool_pods_that_ended_before_the_worker_started_are_deleted_running_ones_kept(
    kube: FakeKube,
) -> None:
    # What a crashed worker leaves: pods whose connection dropped and whose process ended.
    async def pool_pod(name: str, phase: str) -> None:
        body = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "namespace": NS, "labels": {POOL_LABEL: "kwarm-x"}},
            "spec": {"nodeName": "n1", "containers": [{"name": "task", "image": "python:3"}]},
            "status": {"phase": phase},
        }
        async with kube.post(f"/api/v1/namespaces/{NS}/pods", json=body) as resp:
            assert resp.status < 300, await resp.text()

    await pool_pod("hw-pool-kwarm-x-old-0", "Succeeded")
    await pool_pod("hw-pool-kwarm-x-old-1", "Failed")
    await pool_pod("hw-pool-kwarm-x-other-0", "Running")
    cfg = k8s.Configuration()
    cfg.host = str(kube.url).rstrip("/")
    api = k8s.ApiClient(cfg)
    pools = KubePools(api, NS, advertise="127.0.0.1", bind="127.0.0.1")
    try:
        await pools.start()
        left = sorted(p["metadata"]["name"] for p in kube.live("pods"))
        assert left == ["hw-pool-kwarm-x-other-0"]
    finally:
        await pools.close()
        api.close()
