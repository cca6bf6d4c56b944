"""The shipped Kubernetes manifests parse as real API objects and grant least privilege."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import sys
import uuid
from pathlib import Path
from typing import Any

import yaml
from headway.cli._common import load_fleet
from headway.protocol import DemandRequest, SubmitRequest
from headway.scheduler import QueueSpec
from headway.worker.control_plane import run_control_plane_worker
from headway.workflows import client as hw
from kubernetes import client as k8s
from temporalio.testing import WorkflowEnvironment

from .fake_kube import FakeKube

MANIFEST = Path(__file__).resolve().parents[2] / "docker" / "k8s" / "cluster-worker.yaml"
DOCKER = MANIFEST.parents[1]

_MODELS = {
    ("v1", "Namespace"): "V1Namespace",
    ("v1", "ConfigMap"): "V1ConfigMap",
    ("v1", "ServiceAccount"): "V1ServiceAccount",
    ("rbac.authorization.k8s.io/v1", "Role"): "V1Role",
    ("rbac.authorization.k8s.io/v1", "RoleBinding"): "V1RoleBinding",
    ("rbac.authorization.k8s.io/v1", "ClusterRole"): "V1ClusterRole",
    ("rbac.authorization.k8s.io/v1", "ClusterRoleBinding"): "V1ClusterRoleBinding",
    ("apps/v1", "Deployment"): "V1Deployment",
}


def load() -> dict[str, list[Any]]:
    api = k8s.ApiClient()
    out: dict[str, list[Any]] = {}
    for doc in yaml.safe_load_all(MANIFEST.read_text()):
        model = _MODELS[(doc["apiVersion"], doc["kind"])]
        out.setdefault(doc["kind"], []).append(
            api.deserialize(json.dumps(doc), model, "application/json")
        )
    return out


def rules(role: Any) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for rule in role.rules:
        assert rule.api_groups == [""], "only core resources"
        assert not rule.resource_names and not rule.non_resource_urls
        for res in rule.resources:
            out.setdefault(res, set()).update(rule.verbs)
    return out


def test_manifest_objects_parse_and_wire_together():
    objs = load()
    assert set(objs) == {
        "Namespace",
        "ConfigMap",
        "ServiceAccount",
        "Role",
        "RoleBinding",
        "ClusterRole",
        "ClusterRoleBinding",
        "Deployment",
    }
    (dep,) = objs["Deployment"]
    (sa,) = objs["ServiceAccount"]
    ns = objs["Namespace"][0].metadata.name
    assert dep.metadata.namespace == sa.metadata.namespace == ns
    assert dep.spec.template.spec.service_account_name == sa.metadata.name
    (c,) = dep.spec.template.spec.containers
    args = [*(c.command or []), *c.args]
    assert args[:1] == ["headway"]
    assert args[args.index("worker") : args.index("worker") + 2] == ["worker", "cluster"]
    assert args[args.index("--backend") + 1] == "kubernetes"
    assert args[args.index("--name") + 1] == "$(HEADWAY_CLUSTER)"
    env = {e.name for e in c.env}
    assert {"HEADWAY_TEMPORAL_ADDRESS", "HEADWAY_NAMESPACE", "HEADWAY_CLUSTER"} <= env
    # Its configuration comes from the ConfigMap, mounted where its args read it.
    (cm,) = objs["ConfigMap"]
    assert cm.metadata.namespace == ns
    (mount,) = c.volume_mounts
    (volume,) = dep.spec.template.spec.volumes
    assert volume.config_map.name == cm.metadata.name and mount.name == volume.name
    for flag, key in (("--fleet", "fleet.yaml"), ("--config", "cluster.yaml")):
        assert args[args.index(flag) + 1] == f"{mount.mount_path}/{key}"
        assert key in cm.data
    # Dials out only: nothing to connect to.
    assert not c.ports
    assert c.security_context.allow_privilege_escalation is False
    for binding in objs["RoleBinding"] + objs["ClusterRoleBinding"]:
        (subject,) = binding.subjects
        assert (subject.kind, subject.name, subject.namespace) == (
            "ServiceAccount",
            sa.metadata.name,
            ns,
        )
    assert objs["RoleBinding"][0].role_ref.name == objs["Role"][0].metadata.name
    assert objs["ClusterRoleBinding"][0].role_ref.name == objs["ClusterRole"][0].metadata.name


def test_rbac_is_least_privilege():
    objs = load()
    (role,) = objs["Role"]
    (cluster_role,) = objs["ClusterRole"]
    assert rules(role) == {
        # patch: lifting a whole gang's scheduling gate, and a pod's finalizer.
        "pods": {"create", "get", "list", "watch", "patch", "delete"},
        "services": {"create", "get", "delete"},
    }
    # Cluster-wide it may only read: nodes, and pods for their requests.
    assert rules(cluster_role) == {"nodes": {"get", "list", "watch"}, "pods": {"list", "watch"}}
    every = [v for r in (role, cluster_role) for rule in r.rules for v in rule.verbs]
    assert "*" not in every


def test_docs_and_dockerfiles_name_the_configuration():
    readme = (DOCKER / "README.md").read_text()
    for var in ("HEADWAY_TEMPORAL_ADDRESS", "HEADWAY_NAMESPACE", "HEADWAY_CLUSTER"):
        assert var in readme
    worker = (DOCKER / "Dockerfile.cluster-worker").read_text()
    assert "worker cluster" in worker and "EXPOSE" not in worker.replace("No EXPOSE", "")
    assert "worker control-plane" in (DOCKER / "Dockerfile.control-plane").read_text().replace(
        '"worker", "control-plane"', "worker control-plane"
    )


# --- the Deployment runs as shipped --------------------------------------------------------


def _expand(text: str, env: dict[str, str]) -> str:
    """Kubernetes' $(VAR) expansion: variables defined earlier, others left as written."""
    return re.sub(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", lambda m: env.get(m[1], m[0]), text)


def container_env(dep: Any, config: dict[str, str]) -> dict[str, str]:
    """The worker container's environment as the kubelet would set it."""
    (c,) = dep.spec.template.spec.containers
    env: dict[str, str] = {}
    for e in c.env:
        if e.value is not None:
            env[e.name] = _expand(e.value, env)
        elif e.value_from.config_map_key_ref is not None:
            env[e.name] = config[e.value_from.config_map_key_ref.key]
        else:
            assert e.value_from.field_ref.field_path == "metadata.namespace"
            env[e.name] = dep.metadata.namespace
    return env


def kubeconfig(path: Path, server: str) -> Path:
    """What the pod's service account gives it in a cluster: the API server's address."""
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "fake", "cluster": {"server": server}}],
                "users": [{"name": "sa", "user": {"token": "unused"}}],
                "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "sa"}}],
                "current-context": "fake",
            }
        )
    )
    return path


async def _add_h200_node(kube: FakeKube) -> None:
    node = {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": "h200-a", "labels": {"nvidia.com/gpu.product": "NVIDIA-H200"}},
        "status": {
            "allocatable": {"cpu": "96", "memory": "2Ti", "pods": "110", "nvidia.com/gpu": "8"},
            "conditions": [{"type": "Ready", "status": "True"}],
        },
    }
    async with kube.post("/api/v1/nodes", json=node) as resp:
        assert resp.status < 300, await resp.text()


async def _ready_line(proc: asyncio.subprocess.Process, timeout: float = 90) -> str:
    assert proc.stderr is not None
    seen: list[str] = []
    async with asyncio.timeout(timeout):
        while True:
            raw = await proc.stderr.readline()
            if not raw:
                raise AssertionError(f"the worker exited ({await proc.wait()}): {seen[-10:]}")
            line = raw.decode(errors="replace").rstrip()
            seen.append(line)
            if "cluster worker ready" in line:
                return line


async def _drain(stream: asyncio.StreamReader | None) -> None:
    while stream is not None and await stream.readline():
        pass


async def test_the_shipped_deployment_starts_the_worker_and_it_serves(
    temporal_env: WorkflowEnvironment, kube: FakeKube, tmp_path: Path
) -> None:
    """The Deployment's container, run with exactly its command, args and environment
    (ConfigMap keys and the downward API resolved, the ConfigMap's files where it mounts
    them) against the fake API server and a real Temporal server: it reports ready, its
    cluster takes an action asking for the ConfigMap's short GPU name, and the pod
    selects the node label's value. The operator's two edits are the only changes: where
    Temporal is, and the tenant; the API server comes as a service account's would."""
    objs = load()
    (dep,) = objs["Deployment"]
    (cm,) = objs["ConfigMap"]
    (c,) = dep.spec.template.spec.containers
    (mount,) = c.volume_mounts
    client = temporal_env.client
    tenant = f"shipped-{uuid.uuid4().hex[:8]}"
    config = dict(cm.data)
    config["temporal_address"] = client.service_client.config.target_host
    config["tenants"] = tenant
    files = tmp_path / "etc-headway"
    files.mkdir()
    for key, text in config.items():
        (files / key).write_text(text)
    env = container_env(dep, config)
    args = [_expand(a, env) for a in [*(c.command or []), *c.args]]
    args = [
        str(files) + a[len(mount.mount_path) :] if a.startswith(mount.mount_path) else a
        for a in args
    ]
    assert args[0] == "headway"
    args[0] = str(Path(sys.executable).parent / "headway")
    await _add_h200_node(kube)
    proc_env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("HEADWAY_")},
        **env,
        "KUBECONFIG": str(kubeconfig(tmp_path / "kubeconfig", str(kube.url).rstrip("/"))),
    }
    fleet = load_fleet(files / "fleet.yaml").clusters
    stop = asyncio.Event()
    control = asyncio.create_task(
        run_control_plane_worker(
            client, database_url=f"sqlite:///{tmp_path / 'leases.db'}", fleet=fleet, stop=stop
        )
    )
    proc = await asyncio.create_subprocess_exec(
        *args, env=proc_env, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE
    )
    drain: asyncio.Task[None] | None = None
    try:
        line = await _ready_line(proc)
        print(line)
        assert f"cluster {config['cluster']} (kubernetes)" in line and tenant in line
        drain = asyncio.create_task(_drain(proc.stderr))
        await hw.ensure_scheduler(client, tenant, fleet)
        await hw.upsert_queue(client, tenant, QueueSpec("default").to_dict())
        cluster = config["cluster"]
        async with asyncio.timeout(60):
            while (await hw.get_fleet(client, tenant))["capacity"].get(cluster, {}).get(
                "nodes"
            ) != 1:
                await asyncio.sleep(0.1)
        handle = await hw.submit(
            client,
            SubmitRequest(
                action_id="h200-1",
                queue="default",
                tenant=tenant,
                demand=DemandRequest(resources={"cpu": "1", "memory": "1Gi", "gpu": "H200:8"}),
                estimate_s=60,
            ),
        )
        async with asyncio.timeout(60):
            while not (pods := kube.live("pods")):
                await asyncio.sleep(0.05)
        (pod,) = pods
        assert pod["metadata"]["namespace"] == dep.metadata.namespace
        assert pod["spec"]["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-H200"}
        assert kube.bind_pending() == [(pod["metadata"]["name"], "h200-a")]
        kube.modify(
            "pods",
            dep.metadata.namespace,
            pod["metadata"]["name"],
            {"status": {"phase": "Succeeded"}},
        )
        res = await asyncio.wait_for(hw.wait_result(handle), 60)
        assert res.state == "succeeded" and res.cluster == cluster, res
    finally:
        if proc.returncode is None:
            proc.send_signal(signal.SIGTERM)
        code = await asyncio.wait_for(proc.wait(), 60)
        if drain is not None:
            await drain
        stop.set()
        await asyncio.wait_for(asyncio.gather(control, return_exceptions=True), 60)
    assert code == 0, f"the worker exited {code} on SIGTERM"
