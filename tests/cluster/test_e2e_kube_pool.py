"""A warm (reusable) environment on the Kubernetes backend, end to end (issue #25): an SDK
program's actions in one reusable environment run as calls in that environment's pool of
pulling pods (``headway.activities.backends.kubernetes.pooled``), not in a pod each.

The program is its own interpreter, as a user runs it; the control plane and the
Kubernetes cluster worker are the real ones on a real Temporal server; the cluster is the
fake API server, whose kubelet runs the pool pods' ``python -m headway.sdk.run --pull``
as local processes, which dial the worker's pool listener.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import textwrap
import uuid
from pathlib import Path
from typing import Any

from headway.activities.backends.base import ACTION_LABEL
from headway.activities.backends.kube_pool import POOL_LABEL
from headway.scheduler import ClusterSpec, NodeGroup, Pod, QueueSpec
from headway.workflows import client as hw
from temporalio.testing import WorkflowEnvironment

from .fake_kube import FakeKube
from .helpers import kube_control_plane
from .test_sdk_kubernetes import add_node

NS = "hw-kpool"
CLUSTER = "k8s-kpool"
GI = 2**30

PROGRAM = """
    import asyncio, json, os, sys

    import headway

    env = headway.TaskEnvironment(
        name="kwarm",
        resources=headway.Resources(cpu=1, memory="1Gi"),
        reusable=headway.ReusePolicy(replicas=2, concurrency=4, idle_ttl="2s"),
    )

    @env.task
    async def where(i: int) -> dict:
        await asyncio.sleep(0.2)
        if i < 0:
            raise ValueError(f"negative: {i}")
        return {"i": i, "pid": os.getpid(), "action": os.environ.get("HEADWAY_ACTION_ID")}

    async def main() -> None:
        runs = await asyncio.gather(*(
            headway.with_runcontext(queue="q", name=f"kw-{i}").run_async(where, i=i)
            for i in range(6)
        ))
        print(json.dumps([await r.result() for r in runs]), flush=True)
        try:
            await (await headway.with_runcontext(queue="q", name="kw-bad").run_async(
                where, i=-1)).result()
        except headway.TaskFailed as exc:
            print(exc.error_type, "|", exc.error_message, flush=True)

    if __name__ == "__main__":
        headway.init(tenant=sys.argv[1])
        asyncio.run(main())
"""


def _pool_pods(objs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [p for p in objs if POOL_LABEL in (p["metadata"].get("labels") or {})]


async def test_a_reusable_environments_actions_run_in_its_pool_of_pods_created_once(
    temporal_env: WorkflowEnvironment, kube: FakeKube, tmp_path: Path
) -> None:
    client = temporal_env.client
    tenant = f"kpool-{uuid.uuid4().hex[:8]}"
    await add_node(kube)
    fleet = [ClusterSpec(CLUSTER, (NodeGroup("n", 1, Pod(cpu=16_000, memory=64 * GI)),))]
    async with kube_control_plane(
        client,
        kube.url,
        tmp_path,
        CLUSTER,
        NS,
        fleet,
        [tenant],
        lambda stop: [kube.run_kubelet(stop, tmp_path)],
        backend_kw={"pool_listen": "127.0.0.1:0"},
    ):
        await hw.ensure_scheduler(client, tenant, fleet)
        await hw.upsert_queue(client, tenant, QueueSpec("q").to_dict())
        program = tmp_path / "prog.py"
        program.write_text(textwrap.dedent(PROGRAM))
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            str(program),
            tenant,
            cwd=tmp_path,
            env={
                **os.environ,
                "HEADWAY_TEMPORAL_ADDRESS": client.service_client.config.target_host,
                "PYTHONUNBUFFERED": "1",
            },
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        out, err = await asyncio.wait_for(proc.communicate(), 180)
        lines = out.decode().strip().splitlines()
        print("\n".join(lines))
        assert proc.returncode == 0, err.decode()[-3000:]
        # Every action succeeded, its result computed in a pool pod's process with its
        # own environment.
        results = json.loads(lines[0])
        assert [r["i"] for r in results] == list(range(6))
        assert all(r["action"] for r in results)
        assert len({r["action"] for r in results}) == 6
        pids = {r["pid"] for r in results}
        assert 1 <= len(pids) <= 2
        # A failure in the task is its action's outcome, as a pod's would be.
        assert lines[1] == "ValueError | negative: -1"
        # The pool's pods were created once (two of them, the replicas), and no action
        # had a pod of its own.
        created = [obj for _, plural, kind, obj in kube.log if (plural, kind) == ("pods", "ADDED")]
        assert len(_pool_pods(created)) == 2
        assert not [p for p in created if ACTION_LABEL in (p["metadata"].get("labels") or {})]
        for pod in _pool_pods(created):
            (c,) = pod["spec"]["containers"]
            assert c["command"][1:4] == ["-m", "headway.sdk.run", "--pull"]
            assert c["resources"]["requests"] == {"cpu": "1000m", "memory": str(GI)}
        # Idle for its idle_ttl: the pool's pods are deleted.
        for _ in range(300):
            if not _pool_pods(kube.live("pods")):
                break
            await asyncio.sleep(0.1)
        assert not _pool_pods(kube.live("pods"))
