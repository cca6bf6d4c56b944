"""An SDK program on the Kubernetes backend, end to end (issues #22 and #25): its tasks'
pods run ``python -m headway.sdk.run ...``, and each result comes back through the
container's termination message, read by the cluster worker from the pod's status.

The program is its own interpreter, as a user runs it; the control plane and the
Kubernetes cluster worker are the real ones on a real Temporal server; the cluster is the
fake API server, whose kubelet runs an SDK task's container as a local process and keeps
what it wrote to its termination-message file (cut at 4096 bytes, as a kubelet does).
"""

from __future__ import annotations

import asyncio
import os
import sys
import textwrap
import uuid
from pathlib import Path

from headway.scheduler import ClusterSpec, NodeGroup, Pod, QueueSpec
from headway.workflows import client as hw
from temporalio.testing import WorkflowEnvironment

from .fake_kube import FakeKube
from .helpers import kube_control_plane

NS = "hw-sdk"
CLUSTER = "k8s-sdk"
GI = 2**30

PROGRAM = """
    import sys

    import headway

    env = headway.TaskEnvironment(
        name="k8s", resources=headway.Resources(cpu=1, memory="1Gi"), labels={"team": "nlp"}
    )

    @env.task
    async def add(a: int, b: int) -> int:
        return a + b

    @env.task
    async def too_big() -> str:
        return "x" * 5000

    if __name__ == "__main__":
        headway.init(tenant=sys.argv[1])
        print(headway.with_runcontext(queue="q").run(add, a=4, b=5).wait(timeout=90))
        try:
            headway.with_runcontext(queue="q").run(too_big).wait(timeout=90)
        except headway.TaskFailed as exc:
            print(exc.error_type, "|", exc.error_message)
"""


async def add_node(kube: FakeKube) -> None:
    node = {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": "n1", "labels": {}},
        "status": {
            "allocatable": {"cpu": "16", "memory": "64Gi", "pods": "110"},
            "conditions": [{"type": "Ready", "status": "True"}],
        },
    }
    async with kube.post("/api/v1/nodes", json=node) as resp:
        assert resp.status < 300, await resp.text()


async def test_an_sdk_programs_results_come_back_from_its_pods_termination_messages(
    temporal_env: WorkflowEnvironment, kube: FakeKube, tmp_path: Path
) -> None:
    client = temporal_env.client
    tenant = f"sdk-{uuid.uuid4().hex[:8]}"
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
        # The sum, computed in the pod and returned through its termination message.
        assert lines[0] == "9"
        # A result the termination message cannot hold: a clear failure, not a cut one.
        error_type, message = lines[1].split(" | ", 1)
        assert error_type == "SerializationError"
        assert "more than the 4096 this pod can return" in message
        # The pods were the SDK's: its entrypoint, the environment's labels.
        created = [obj for _, plural, kind, obj in kube.log if (plural, kind) == ("pods", "ADDED")]
        assert len(created) == 2
        for pod in created:
            (c,) = pod["spec"]["containers"]
            assert c["command"][1:3] == ["-m", "headway.sdk.run"]
            assert c["terminationMessagePath"] == "/dev/termination-log"
            assert pod["metadata"]["labels"]["team"] == "nlp"
