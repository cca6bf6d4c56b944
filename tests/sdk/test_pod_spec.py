"""The Kubernetes pods of an SDK task: the environment's image running the same
entrypoint the simulated backend runs, with its demand as requests and, for a clustered
environment, each replica's rank in its environment; and an environment's Kubernetes
options on its pods. (The outcome read back from the container's termination message:
``tests/cluster/test_kube_options.py``.)"""

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


gpu_env = headway.TaskEnvironment(
    "infer",
    headway.Resources(cpu=2, memory="16Gi", gpu="H100:1"),
    image="registry.example/infer:2",
    secrets=["hf-token:HF_TOKEN"],
    labels={"team": "nlp"},
    tolerations=["nvidia.com/gpu:NoSchedule"],
    node_selector={"pool": "gpu"},
    priority_class="online",
    service_account="infer",
    volumes=["pvc:models:/models:ro"],
    shm_size="2Gi",
)


@gpu_env.task
async def infer(prompt: str) -> str:
    return prompt


def test_an_environments_kubernetes_options_reach_its_pods(monkeypatch):
    captured = {}

    async def fake_submit(client, req):
        captured["req"] = req
        raise RuntimeError("not sent")

    monkeypatch.setattr("headway.workflows.client.submit_action", fake_submit)
    monkeypatch.setattr("headway.sdk._engine.ENGINE.client", _no_client)
    run = Run(Connection("temporal:7233", "default", "default"), "r2", None)
    with pytest.raises(RuntimeError, match="not sent"):
        headway.sdk._engine.ENGINE.run(run._submit(infer, infer.encode_inputs(("hi",), {})))
    req = captured["req"]
    assert req.kube == gpu_env.kube
    kind, pods = demand_from_request(asdict(req.demand))
    dispatch = DispatchRequest(
        tenant="default",
        action_id=req.action_id,
        workflow_id="wf",
        cluster="gpu",
        kind=GangKind(kind.value),
        pods=_pod_specs(kind, tuple(pods), req),
        kube=req.kube,
    )
    (pod,) = build_pods(dispatch, "default", gpu_names={"H100": "NVIDIA-H100-80GB-HBM3"})
    spec = pod["spec"]
    (c,) = spec["containers"]
    assert pod["metadata"]["labels"]["team"] == "nlp"
    assert spec["priorityClassName"] == "online" and spec["serviceAccountName"] == "infer"
    assert spec["nodeSelector"] == {
        "pool": "gpu",
        "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3",
    }
    assert {m["mountPath"] for m in c["volumeMounts"]} == {"/models", "/dev/shm"}
    assert c["terminationMessagePath"] == "/dev/termination-log"


@pytest.mark.parametrize(
    ("kwargs", "named"),
    [
        pytest.param({"labels": {"team": "a b"}}, "labels: 'team=a b'", id="label"),
        pytest.param({"secrets": ["creds:a-b"]}, "secrets: 'creds:a-b'", id="secret"),
        pytest.param({"tolerations": ["x:Never"]}, "tolerations: 'x:Never'", id="toleration"),
        pytest.param({"volumes": ["pvc:d"]}, "volumes: 'pvc:d'", id="volume"),
        pytest.param({"shm_size": "big"}, "shm_size: 'big'", id="shm"),
        pytest.param({"priority_class": "Hi"}, "priority_class: 'Hi'", id="priority-class"),
    ],
)
def test_a_bad_kubernetes_option_of_an_environment_names_argument_and_value(kwargs, named):
    with pytest.raises(ValueError, match=named.replace("(", r"\(")):
        headway.TaskEnvironment("bad", **kwargs)
    with pytest.raises(ValueError, match=named):
        headway.ClusteredTaskEnvironment("bad", replicas=2, **kwargs)
