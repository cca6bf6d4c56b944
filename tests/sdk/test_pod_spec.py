"""The Kubernetes pods of an SDK task: the environment's image running the same
entrypoint the simulated backend runs, with its demand as requests and, for a clustered
environment, each replica's rank in its environment. (Manifests only: the pods' outcome
document is not yet read back from the container's termination message on Kubernetes.)"""

from __future__ import annotations

from dataclasses import asdict

import headway
import pytest
from headway.activities.backends.kubernetes import build_pods
from headway.protocol import DispatchRequest, GangKind
from headway.scheduler import demand_from_request
from headway.sdk._engine import Connection
from headway.sdk.tasks import Run
from headway.workflows.action import _pod_specs

env = headway.ClusteredTaskEnvironment(
    "train",
    headway.Resources(cpu=4, memory="8Gi", gpu="H100:8"),
    replicas=2,
    nproc_per_node=8,
    image="registry.example/train:1",
)


@env.task
async def train(steps: int) -> int:
    return steps


def test_an_sdk_task_pod_runs_the_entrypoint_in_its_image_with_its_rank(monkeypatch):
    captured = {}

    async def fake_submit(client, req):  # the request the SDK would send
        captured["req"] = req
        raise RuntimeError("not sent")

    monkeypatch.setattr("headway.workflows.client.submit_action", fake_submit)
    monkeypatch.setattr("headway.sdk._engine.ENGINE.client", _no_client)
    run = Run(Connection("temporal:7233", "default", "default"), "r1", "production")
    with pytest.raises(RuntimeError, match="not sent"):
        headway.sdk._engine.ENGINE.run(run._submit(train, train.encode_inputs((5,), {})))
    req = captured["req"]
    kind, pods = demand_from_request(asdict(req.demand))
    dispatch = DispatchRequest(
        tenant="default",
        action_id=req.action_id,
        workflow_id="wf",
        cluster="gpu",
        kind=GangKind(kind.value),
        pods=_pod_specs(kind, tuple(pods), req),
    )
    manifests = build_pods(dispatch, "default")
    assert len(manifests) == 2
    for rank, pod in enumerate(manifests):
        (c,) = pod["spec"]["containers"]
        assert c["image"] == "registry.example/train:1"
        assert c["command"][:3] == ["python", "-m", "headway.sdk.run"]
        args = dict(zip(c["command"][3::2], c["command"][4::2], strict=True))
        assert args["--module"] == __name__ and args["--task"] == "train"
        assert args["--inputs"] == '{"steps":5}' and args["--run-queue"] == "production"
        assert args["--env"] == "NPROC_PER_NODE=8"
        envs = {e["name"]: e["value"] for e in c["env"]}
        assert envs["RANK"] == str(rank) and envs["WORLD_SIZE"] == "2"
        assert envs["MASTER_ADDR"]
        assert c["resources"]["requests"]["nvidia.com/gpu"] == "8"


async def _no_client(conn):
    return None
