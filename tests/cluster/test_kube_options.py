"""What a Kubernetes user needs per action (issue #22), on the Kubernetes backend: the
pod spec of every option, GPU short names both ways, a namespace per queue, graceful
deletion, evictions as such, and an SDK task's outcome read back from its container's
termination message. Over real HTTP against the fake API server where a pod is involved.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
import yaml
from headway.activities.backends.kubernetes import (
    KubernetesBackend,
    build_pods,
    gpu_short_name,
    translate_pod,
)
from headway.protocol import ActionEvent, DispatchRequest, GangKind, PodSpec
from headway.protocol import ActionEventKind as K
from headway.sdk.kube import kube_options
from headway.sdk.run import _fit

from .fake_kube import FakeKube
from .helpers import GI, request

NS = "hw"
GPU_NAMES = {"H100": "NVIDIA-H100-80GB-HBM3"}

EVERY_OPTION = kube_options(
    args=["train.py", "--lr", "3e-4"],
    env={"LOG": "debug"},
    env_from_secrets=["hf-token:HF_TOKEN", "wandb"],
    labels={"team": "nlp"},
    annotations={"example.com/owner": "ana@example.com"},
    tolerations=["nvidia.com/gpu:NoSchedule", "dedicated=ml:NoExecute"],
    node_selector={"topology.kubernetes.io/zone": "eu-west-1a"},
    priority_class="batch-low",
    service_account="trainer",
    volumes=["pvc:datasets:/data:ro", "configmap:train-config:/etc/train", "emptydir:/scratch"],
    shm_size="8Gi",
)


def every_option_request() -> DispatchRequest:
    return DispatchRequest(
        tenant="t1",
        action_id="train-1",
        workflow_id="wf-train-1",
        cluster="c1",
        kind=GangKind.SINGLE,
        pods=[
            PodSpec(
                "main",
                0,
                cpu_m=8000,
                memory=64 * GI,
                gpu=8,
                gpu_type="H100",
                image="registry.example/train:1",
                command=["python", "-u"],
            )
        ],
        node_hints=["gpu-node-2"],
        queue="train",
        kube=EVERY_OPTION,
    )


def test_the_pod_of_an_action_with_every_option():
    (pod,) = build_pods(every_option_request(), "ml", gpu_names=GPU_NAMES, dispatch="d1")
    print(yaml.safe_dump(pod, sort_keys=False))  # the report's excerpt
    meta, spec = pod["metadata"], pod["spec"]
    (c,) = spec["containers"]
    assert meta["namespace"] == "ml"
    assert meta["labels"]["team"] == "nlp" and meta["labels"]["headway.io/action"] == "train-1"
    assert meta["annotations"]["example.com/owner"] == "ana@example.com"
    assert c["command"] == ["python", "-u"] and c["args"] == ["train.py", "--lr", "3e-4"]
    env = {e["name"]: e for e in c["env"]}
    assert env["LOG"]["value"] == "debug"
    assert env["HF_TOKEN"]["valueFrom"] == {"secretKeyRef": {"name": "hf-token", "key": "HF_TOKEN"}}
    assert c["envFrom"] == [{"secretRef": {"name": "wandb"}}]
    assert spec["tolerations"] == [
        {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
        {"key": "dedicated", "operator": "Equal", "value": "ml", "effect": "NoExecute"},
    ]
    # The GPU short name as the node label's value, beside the user's own selector.
    assert spec["nodeSelector"] == {
        "topology.kubernetes.io/zone": "eu-west-1a",
        "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3",
    }
    assert spec["priorityClassName"] == "batch-low"
    assert spec["serviceAccountName"] == "trainer"
    terms = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert terms["nodeSelectorTerms"] == [
        {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["gpu-node-2"]}]}
    ]
    volumes = {v["name"]: v for v in spec["volumes"]}
    assert volumes["vol-0"]["persistentVolumeClaim"] == {"claimName": "datasets", "readOnly": True}
    assert volumes["vol-1"]["configMap"] == {"name": "train-config"}
    assert volumes["vol-2"]["emptyDir"] == {}
    assert volumes["dshm"]["emptyDir"] == {"medium": "Memory", "sizeLimit": str(8 * GI)}
    mounts = {m["mountPath"]: m for m in c["volumeMounts"]}
    assert set(mounts) == {"/data", "/etc/train", "/scratch", "/dev/shm"}
    assert mounts["/data"]["readOnly"] is True
    # Not an SDK task: no termination message is read back.
    assert "terminationMessagePath" not in c


def test_a_gangs_pods_are_held_and_constrained_to_the_admissions_nodes():
    req = request(
        "gang",
        [PodSpec("worker", i, cpu_m=1000, memory=GI, gpu=8, gpu_type="H100") for i in range(2)],
        kind=GangKind.REPLICAS,
    )
    req.node_hints = ["n3", "n2"]
    for pod in build_pods(req, NS):
        assert pod["spec"]["schedulingGates"] == [{"name": "headway.io/gang-complete"}]
        (term,) = pod["spec"]["affinity"]["nodeAffinity"][
            "requiredDuringSchedulingIgnoredDuringExecution"
        ]["nodeSelectorTerms"]
        assert term["matchFields"][0]["values"] == ["n2", "n3"]
        # Unmapped GPU names pass through as they are.
        assert pod["spec"]["nodeSelector"] == {"nvidia.com/gpu.product": "H100"}
    # No hints (capacity unknown): no constraint.
    req.node_hints = []
    assert all("affinity" not in p["spec"] for p in build_pods(req, NS))


@pytest.mark.parametrize(
    ("label", "reported"),
    [
        pytest.param("NVIDIA-H100-80GB-HBM3", "H100", id="mapped-label-reports-its-short-name"),
        pytest.param("NVIDIA-A100-SXM4-80GB", "NVIDIA-A100-SXM4-80GB", id="unmapped-as-is"),
        pytest.param(None, None, id="no-label"),
    ],
)
def test_gpu_short_name(label, reported):
    assert gpu_short_name(label, GPU_NAMES) == reported


@pytest.mark.parametrize(
    ("status", "kind"),
    [
        pytest.param(
            {"phase": "Failed", "reason": "Evicted", "message": "The node was low on memory."},
            K.EVICTED,
            id="kubelet-eviction-is-evicted",
        ),
        pytest.param(
            {
                "phase": "Running",
                "conditions": [
                    {
                        "type": "DisruptionTarget",
                        "status": "True",
                        "reason": "EvictionByEvictionAPI",
                    }
                ],
            },
            K.EVICTED,
            id="a-drain-is-evicted",
        ),
        pytest.param(
            {
                "phase": "Running",
                "conditions": [
                    {"type": "DisruptionTarget", "status": "True", "reason": "TerminationByKubelet"}
                ],
            },
            K.EVICTED,
            id="node-pressure-termination-is-evicted",
        ),
        pytest.param(
            {
                "phase": "Running",
                "conditions": [
                    {
                        "type": "DisruptionTarget",
                        "status": "True",
                        "reason": "PreemptionByScheduler",
                    }
                ],
            },
            K.PREEMPTED,
            id="scheduler-preemption-stays-preempted",
        ),
        pytest.param({"phase": "Failed", "reason": "Preempting"}, K.PREEMPTED, id="preempting"),
    ],
)
def test_evictions_are_reported_as_evicted_not_preempted(status, kind):
    state = translate_pod({"status": status})
    assert state is not None and state[0] is kind


async def _backend(api_client: Any, **opts: Any) -> KubernetesBackend:
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


async def _node(kube: FakeKube, name: str, product: str) -> None:
    node = {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": {"nvidia.com/gpu.product": product}},
        "status": {
            "allocatable": {"cpu": "64", "memory": "512Gi", "nvidia.com/gpu": "8"},
            "conditions": [{"type": "Ready", "status": "True"}],
        },
    }
    async with kube.post("/api/v1/nodes", json=node) as resp:
        assert resp.status < 300, await resp.text()


async def _event(q: asyncio.Queue[ActionEvent], action: str, kind: K) -> ActionEvent:
    async with asyncio.timeout(10):
        while True:
            ev = await q.get()
            if ev.action_id == action and ev.kind is kind:
                return ev


async def test_nodes_report_their_gpus_under_the_short_name(kube, api_client):
    await _node(kube, "g1", "NVIDIA-H100-80GB-HBM3")
    b = await _backend(api_client, gpu_names=GPU_NAMES)
    try:
        async with asyncio.timeout(10):
            while (report := await b.capacity()).nodes is None:
                await asyncio.sleep(0.05)
        (node,) = report.nodes
        assert (node.gpu, node.gpu_type) == (8, "H100")
    finally:
        await b.close()


async def test_a_queue_runs_in_its_namespace_and_is_deleted_gracefully(kube, api_client):
    b = await _backend(api_client, queue_namespaces={"train": "ml"}, delete_grace_s=45)
    try:
        req = request("ns-1")
        req.queue = "train"
        (name,) = await b.create_pods(req)
        (pod,) = kube.live("pods")
        assert pod["metadata"]["namespace"] == "ml"
        # The worker's own namespace for other queues.
        other = request("ns-2")
        other.queue = "default"
        await b.create_pods(other)
        assert {p["metadata"]["namespace"] for p in kube.live("pods")} == {"ml", NS}
        # Found and deleted where it runs, with the configured grace period.
        assert await b.live_pods("ns-1") == {name: None}
        assert await b.delete_pods("ns-1", "ml") == 1
        assert ("pods", f"ml/{name}", "45") in kube.deletes
        assert [p["metadata"]["namespace"] for p in kube.live("pods")] == [NS]
    finally:
        await b.close()


def _task_request(action: str) -> DispatchRequest:
    command = ["python", "-m", "headway.sdk.run", "--module", "m", "--task", "f"]
    return request(action, [PodSpec("main", 0, cpu_m=100, memory=GI, command=command)])


def _terminated(phase: str, code: int, message: str) -> dict[str, Any]:
    terminated = {"exitCode": code, "reason": "Completed" if code == 0 else "Error"}
    return {
        "status": {
            "phase": phase,
            "containerStatuses": [
                {"name": "main", "state": {"terminated": {**terminated, "message": message}}}
            ],
        }
    }


@pytest.mark.parametrize(
    ("phase", "code", "document", "kind", "message"),
    [
        pytest.param(
            "Succeeded", 0, {"ok": True, "output": 9}, K.SUCCEEDED, "Completed", id="result"
        ),
        pytest.param(
            "Failed",
            1,
            {"ok": False, "error": {"type": "ValueError", "message": "boom", "traceback": "tb"}},
            K.FAILED,
            "ValueError: boom",
            id="raised",
        ),
    ],
)
async def test_an_sdk_tasks_outcome_comes_back_from_its_termination_message(
    kube, api_client, phase, code, document, kind, message
):
    b = await _backend(api_client)
    try:
        with b.subscribe() as q:
            (name,) = await b.create_pods(_task_request("sdk-1"))
            (pod,) = kube.live("pods")
            (c,) = pod["spec"]["containers"]
            assert c["terminationMessagePath"] == "/dev/termination-log"
            env = {e["name"]: e["value"] for e in c["env"]}
            assert env["HEADWAY_OUTPUT_FILE"] == "/dev/termination-log"
            assert env["HEADWAY_OUTPUT_MAX_BYTES"] == "4096"
            # The kubelet's part: the file's content becomes the container's message.
            text = json.dumps(document, separators=(",", ":"))
            async with kube.patch(
                f"/api/v1/namespaces/{NS}/pods/{name}", json=_terminated(phase, code, text)
            ) as resp:
                assert resp.status == 200
            ev = await _event(q, "sdk-1", kind)
            assert ev.output == text and ev.message == message
    finally:
        await b.close()


def test_a_result_larger_than_the_termination_message_is_a_clear_failure():
    text, code = _fit({"ok": True, "output": "x" * 5000}, 0, 4096)
    doc = json.loads(text)
    assert code == 1 and doc["error"]["type"] == "SerializationError"
    assert "more than the 4096 this pod can return" in doc["error"]["message"]
    assert "termination message" in doc["error"]["message"]
    # A failure keeps the end of its traceback that fits.
    tb = "".join(f"line {i}\n" for i in range(2000)) + "ValueError: boom"
    failure = {"ok": False, "error": {"type": "ValueError", "message": "boom", "traceback": tb}}
    text, code = _fit(failure, 1, 4096)
    assert code == 1 and len(text.encode()) <= 4096
    assert json.loads(text)["error"]["traceback"].endswith("ValueError: boom")


@pytest.mark.parametrize(
    ("hints", "constrained"),
    [
        pytest.param(["g1"], True, id="the-clusters-own-node-constrains"),
        pytest.param(["gpu-0"], False, id="a-fleet-placeholder-from-unknown-capacity-does-not"),
    ],
)
async def test_pods_are_constrained_only_to_nodes_the_cluster_has(
    kube, api_client, hints, constrained
):
    await _node(kube, "g1", "NVIDIA-H100-80GB-HBM3")
    b = await _backend(api_client)
    try:
        async with asyncio.timeout(10):
            while (await b.capacity()).nodes is None:
                await asyncio.sleep(0.05)
        req = request("hinted")
        req.node_hints = hints
        await b.create_pods(req)
        (pod,) = kube.live("pods")
        assert ("affinity" in pod["spec"]) is constrained
    finally:
        await b.close()
