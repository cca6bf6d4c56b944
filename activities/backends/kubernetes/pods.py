"""Pod construction for the Kubernetes backend: the Pod and headless Service manifests
of one admitted action (plain dicts, as sent to the API server), named for its tenant,
constrained to the nodes its admission chose, a gang held by a scheduling gate until
it is whole, and the action's own Kubernetes options applied.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from headway.protocol import DispatchRequest, GangKind, KubeOptions, PodSpec

from ..base import (
    ACTION_ANNOTATION,
    ACTION_LABEL,
    DISPATCH_ANNOTATION,
    ROLE_LABEL,
    TENANT_LABEL,
    WORKFLOW_ANNOTATION,
    label_value,
    pod_name,
    service_name,
)
from ..sim_task import is_task_command

GPU_RESOURCE = "nvidia.com/gpu"
DEFAULT_GPU_NODE_LABEL = "nvidia.com/gpu.product"
MASTER_PORT = 29500
RAY_GCS_PORT = 6379
SPARK_DRIVER_PORT = 7078

#: Keeps a Headway pod on the API server, marked for deletion, until its outcome is
#: recorded: the pod is the record that its dispatch created it.
FINALIZER = "headway.io/dispatch"


def _resources(spec: PodSpec) -> dict[str, str]:
    res: dict[str, str] = {}
    if spec.cpu_m:
        res["cpu"] = f"{spec.cpu_m}m"
    if spec.memory:
        res["memory"] = str(spec.memory)
    if spec.ephemeral_storage:
        res["ephemeral-storage"] = str(spec.ephemeral_storage)
    if spec.gpu:
        res[GPU_RESOURCE] = str(spec.gpu)
    return res


def owner(req: DispatchRequest, legacy: bool = False) -> str:
    """The tenant that names the action's pods and Service ("" for the names a worker
    gave them before tenants were part of names: ``legacy``)."""
    return "" if legacy else req.tenant


def pod_names(req: DispatchRequest, legacy: bool = False) -> list[str]:
    """The names of the action's pods, in ``req.pods`` order (see ``legacy`` in
    :func:`owner`)."""
    return [pod_name(req.action_id, p.role, p.index, owner(req, legacy)) for p in req.pods]


def _gang_env(
    req: DispatchRequest, namespace: str, legacy: bool = False
) -> dict[tuple[str, int], dict[str, str]]:
    """Per-pod environment that lets a gang find itself (rendezvous addresses, ranks)."""
    svc = service_name(req.action_id, owner(req, legacy))
    names = {
        (p.role, p.index): name for p, name in zip(req.pods, pod_names(req, legacy), strict=True)
    }

    def fqdn(role: str, index: int) -> str:
        return f"{names[(role, index)]}.{svc}.{namespace}.svc"

    env: dict[tuple[str, int], dict[str, str]] = {k: {} for k in names}
    if req.kind is GangKind.REPLICAS:
        ranked = sorted(req.pods, key=lambda p: (p.role, p.index))
        master = fqdn(ranked[0].role, ranked[0].index)
        for rank, p in enumerate(ranked):
            env[(p.role, p.index)] = {
                "MASTER_ADDR": master,
                "MASTER_PORT": str(MASTER_PORT),
                "WORLD_SIZE": str(len(ranked)),
                "NNODES": str(len(ranked)),
                "RANK": str(rank),
                "NODE_RANK": str(rank),
                "NPROC_PER_NODE": p.env.get("NPROC_PER_NODE", str(max(p.gpu, 1))),
            }
    elif req.kind is GangKind.RAY:
        head = next((p for p in req.pods if p.role == "ray-head"), req.pods[0])
        address = f"{fqdn(head.role, head.index)}:{RAY_GCS_PORT}"
        for key in env:
            env[key] = {"RAY_HEAD_ADDRESS": address}
    elif req.kind is GangKind.SPARK:
        driver = next((p for p in req.pods if p.role == "spark-driver"), req.pods[0])
        host = fqdn(driver.role, driver.index)
        for key in env:
            env[key] = {
                "SPARK_DRIVER_HOST": host,
                "SPARK_DRIVER_PORT": str(SPARK_DRIVER_PORT),
                "SPARK_DRIVER_URL": f"spark://{host}:{SPARK_DRIVER_PORT}",
            }
    return env


def needs_service(req: DispatchRequest) -> bool:
    """Whether the gang's pods must find each other by name."""
    return req.kind is not GangKind.SINGLE and len(req.pods) > 0


#: A gang's pods are created held by this scheduling gate and released together once every
#: one exists. Until then none can run, so the retry of a worker killed halfway through
#: creating a gang completes it (nothing of it ran) where it would otherwise report the
#: missing members lost: a missing member of a released gang may have run, and is.
GANG_GATE = "headway.io/gang-complete"


#: Where an SDK task's pod writes its outcome document: the container's termination
#: message, which the kubelet keeps in the pod's status for the backend to read.
TERMINATION_LOG = "/dev/termination-log"
#: The kubelet keeps at most this much of a container's termination message.
TERMINATION_MESSAGE_MAX = 4096
#: Node field the pods' required node affinity names (exact, unlike a hostname label).
_NODE_NAME_FIELD = "metadata.name"


def gpu_label_value(gpu_type: str, gpu_names: Mapping[str, str]) -> str:
    """The node-label value a pod asking for ``gpu_type`` must find (``H100`` ->
    ``NVIDIA-H100-80GB-HBM3`` by the worker's GPU name map; unmapped: itself)."""
    return gpu_names.get(gpu_type, gpu_type)


def gpu_short_name(label_value: str | None, gpu_names: Mapping[str, str]) -> str | None:
    """The GPU type a node reports under: the short name whose map value is the node's
    label value (``NVIDIA-H100-80GB-HBM3`` -> ``H100``), else the label value itself, so
    the scheduler's ``H100:8`` matches. Call it wherever node capacity is read."""
    if label_value is None:
        return None
    for short, value in gpu_names.items():
        if value == label_value:
            return short
    return label_value


def _apply_options(
    pod: dict[str, Any], container: dict[str, Any], kube: KubeOptions | None
) -> None:
    """The action's own Kubernetes options onto its pod (Headway's labels and
    annotations win: the submit validation refuses its ``headway.io/`` keys anyway)."""
    if kube is None:
        return
    meta, spec = pod["metadata"], pod["spec"]
    meta["labels"] = {**kube.labels, **meta["labels"]}
    meta["annotations"] = {**kube.annotations, **meta["annotations"]}
    if kube.args:
        container["args"] = list(kube.args)
    env: list[dict[str, Any]] = container["env"]
    named = {e["name"] for e in env}
    for ref in kube.env_from_secrets:
        if ref.key is None:
            container.setdefault("envFrom", []).append({"secretRef": {"name": ref.secret}})
        elif ref.key not in named:
            env.append(
                {
                    "name": ref.key,
                    "valueFrom": {"secretKeyRef": {"name": ref.secret, "key": ref.key}},
                }
            )
    if kube.tolerations:
        spec["tolerations"] = [
            {
                k: v
                for k, v in (
                    ("key", t.key),
                    ("operator", t.operator),
                    ("value", t.value),
                    ("effect", t.effect),
                )
                if v
            }
            for t in kube.tolerations
        ]
    if kube.node_selector:
        spec["nodeSelector"] = {**kube.node_selector, **spec.get("nodeSelector", {})}
    if kube.priority_class:
        spec["priorityClassName"] = kube.priority_class
    if kube.service_account:
        spec["serviceAccountName"] = kube.service_account
    volumes: list[dict[str, Any]] = []
    mounts: list[dict[str, Any]] = []
    for i, v in enumerate(kube.volumes):
        name = f"vol-{i}"
        sources: dict[str, dict[str, Any]] = {
            "pvc": {"persistentVolumeClaim": {"claimName": v.source, "readOnly": v.read_only}},
            "configmap": {"configMap": {"name": v.source}},
            "secret": {"secret": {"secretName": v.source}},
            "emptydir": {"emptyDir": {}},
        }
        source = sources[v.kind]
        volumes.append({"name": name, **source})
        mounts.append({"name": name, "mountPath": v.mount_path, "readOnly": v.read_only})
    if kube.shm_size:
        # Memory-backed, so it counts against the pod's memory limit, as on any pod.
        volumes.append(
            {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": str(kube.shm_size)}}
        )
        mounts.append({"name": "dshm", "mountPath": "/dev/shm"})
    if volumes:
        spec["volumes"] = volumes
        container["volumeMounts"] = mounts


def _node_affinity(nodes: Sequence[str]) -> dict[str, Any]:
    """Required node affinity to exactly ``nodes`` (by name)."""
    term = {"matchFields": [{"key": _NODE_NAME_FIELD, "operator": "In", "values": list(nodes)}]}
    return {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [term]}
        }
    }


def build_pods(
    req: DispatchRequest,
    namespace: str,
    gpu_node_label: str = DEFAULT_GPU_NODE_LABEL,
    *,
    dispatch: str = "",
    gpu_names: Mapping[str, str] | None = None,
    constrain: bool = True,
    legacy: bool = False,
) -> list[dict[str, Any]]:
    """The Pod manifests of one action (plain dicts, as sent to the API server).

    Requests equal limits (Guaranteed QoS: what admission counted is what the pod gets),
    GPUs are ``nvidia.com/gpu`` and a GPU type becomes a node selector on
    ``gpu_node_label`` (its value through ``gpu_names``, short name -> label value).
    Every pod is constrained (required node affinity) to the nodes the admission chose
    (``node_hints``), so the in-cluster scheduler binds a gang where the admission
    counted it whole, and a single cannot take a gang's room (``constrain`` False: not,
    for hints that name no node of the cluster). Annotations carry the
    action id, its workflow id and the ``dispatch`` creating the pod, verbatim; the
    action's own options (``req.kube``) add labels, annotations, env, volumes, ...
    An SDK task's container writes its outcome to its termination message. Pods and
    Service are named for the tenant and the action (``legacy``: for the action alone,
    as before tenants were part of names, to complete a gang begun that way).
    """
    gang = _gang_env(req, namespace, legacy)
    svc = service_name(req.action_id, owner(req, legacy)) if needs_service(req) else None
    names_map = gpu_names or {}
    kube = req.kube
    hints = sorted(set(req.node_hints)) if constrain else []
    out: list[dict[str, Any]] = []
    for p, name in zip(req.pods, pod_names(req, legacy), strict=True):
        env = {**(kube.env if kube else {}), **p.env, **gang[(p.role, p.index)]}
        env.update(
            {"HEADWAY_ACTION_ID": req.action_id, "HEADWAY_TENANT": req.tenant, "HEADWAY_POD": name}
        )
        task_pod = is_task_command(p.command)
        if task_pod:
            env["HEADWAY_OUTPUT_FILE"] = TERMINATION_LOG
            env["HEADWAY_OUTPUT_MAX_BYTES"] = str(TERMINATION_MESSAGE_MAX)
        resources = _resources(p)
        container: dict[str, Any] = {
            "name": "main",
            "image": p.image,
            "env": [{"name": k, "value": v} for k, v in sorted(env.items())],
            "resources": {"requests": resources, "limits": dict(resources)},
        }
        if p.command:
            container["command"] = list(p.command)
        if task_pod:
            container["terminationMessagePath"] = TERMINATION_LOG
            container["terminationMessagePolicy"] = "File"
        spec: dict[str, Any] = {"restartPolicy": "Never", "containers": [container]}
        if svc is not None:
            spec["hostname"] = name
            spec["subdomain"] = svc
        if p.gpu and p.gpu_type:
            spec["nodeSelector"] = {gpu_node_label: gpu_label_value(p.gpu_type, names_map)}
        if hints:
            spec["affinity"] = _node_affinity(hints)
        if len(req.pods) > 1:
            spec["schedulingGates"] = [{"name": GANG_GATE}]
        annotations = {ACTION_ANNOTATION: req.action_id, WORKFLOW_ANNOTATION: req.workflow_id}
        if dispatch:
            annotations[DISPATCH_ANNOTATION] = dispatch
        pod: dict[str, Any] = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": name,
                "namespace": namespace,
                "labels": {
                    ACTION_LABEL: label_value(req.action_id),
                    TENANT_LABEL: label_value(req.tenant),
                    ROLE_LABEL: label_value(p.role),
                },
                "annotations": annotations,
                "finalizers": [FINALIZER],
            },
            "spec": spec,
        }
        _apply_options(pod, container, kube)
        out.append(pod)
    return out


def build_service(req: DispatchRequest, namespace: str, legacy: bool = False) -> dict[str, Any]:
    """The headless Service behind the gang's pod DNS names (torchrun, Ray, Spark),
    selecting the pods of this tenant's action only (``legacy``: as named and selecting
    before tenants were part of names, for a gang begun that way)."""
    selector = {ACTION_LABEL: label_value(req.action_id)}
    if not legacy:
        selector[TENANT_LABEL] = label_value(req.tenant)
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {
            "name": service_name(req.action_id, owner(req, legacy)),
            "namespace": namespace,
            "labels": dict(selector),
            "annotations": {ACTION_ANNOTATION: req.action_id},
        },
        "spec": {
            "clusterIP": "None",
            # Peers must resolve before they are Ready: the rendezvous is what makes
            # them Ready.
            "publishNotReadyAddresses": True,
            "selector": selector,
            "ports": [
                {"name": "master", "port": MASTER_PORT},
                {"name": "ray-gcs", "port": RAY_GCS_PORT},
                {"name": "spark-driver", "port": SPARK_DRIVER_PORT},
            ],
        },
    }
