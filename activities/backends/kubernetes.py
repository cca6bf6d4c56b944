"""The Kubernetes backend: pods and gangs through the official client, informers back.

Everything here dials out to the kube API: pods are created with deterministic names (409
Conflict means a predecessor created them: adopt), and three informers (list, then watch
from the list's resourceVersion with bookmarks, relisting on 410 Gone and reconnecting
with backoff) keep an in-memory picture of Headway's pods, every pod's requests and the
nodes. Pod status changes become :class:`~headway.protocol.ActionEvent`s the moment the
watch delivers them, so an OOM kill or a preemption is attributed to its action within
seconds; the same picture yields the capacity report.

The official client is synchronous: calls run in threads (``asyncio.to_thread``) and each
informer owns a thread that hands what it sees to the event loop.

Exactly once: every pod carries the dispatch that created it (``headway.io/dispatch``:
the ``run_action`` activity, all of its attempts). A retried attempt asks the API server
(a LIST, not the informer's picture) which of its dispatch's pods exist and creates
nothing (``adopt_only``); what is missing was lost, and the activity reports it, but for
a gang still held by its scheduling gate (``GANG_GATE``), which it completes. A pod
of the same name left by an earlier dispatch of the action is deleted and created anew.
Every pod carries the finalizer ``FINALIZER``, so the API server keeps it, marked for
deletion, when someone else deletes it (a lost node's pod GC, a preemption, ``kubectl
delete``) until Headway lifts the finalizer: only once the pod's outcome is recorded (the
cleanup of an ended action, the garbage collection of a closed workflow). Without it a
pod created by a worker killed before its first heartbeat, then deleted with its node
before a retry, would leave no trace, and the retry would run the work a second time (the
Job controller tracks its pods with a finalizer for the same reason). A pod marked for
deletion has ended: ``PodLost`` (``NodeLost`` when its node is gone), unless it finished.
The pod log (``HEADWAY_POD_LOG``, format in ``headway.activities.backends.base``) gets
"creating" before this backend's POST of a pod (the intent: the call may not reach the
API server), "created" when the POST created it, and "bound"/"ended" when the informer
sees a pod take a node or stop holding it (finished, or deleted).
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import json
import logging
import os
import socket
import threading
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from headway.activities.arbiter import unusable_reason
from headway.protocol import (
    TERMINAL_EVENTS,
    ActionEvent,
    ActionEventKind,
    CapacityReport,
    DispatchRequest,
    GangKind,
    KubeOptions,
    NodeCapacity,
    PodSpec,
    action_workflow_id,
)
from headway.scheduler.resources import QuantityError, parse_cpu, parse_memory
from kubernetes import client as k8s
from kubernetes import config as k8s_config
from kubernetes.client.exceptions import ApiException
from kubernetes.watch.watch import iter_resp_lines

from .base import (
    ACTION_ANNOTATION,
    ACTION_LABEL,
    DISPATCH_ANNOTATION,
    ROLE_LABEL,
    TENANT_LABEL,
    WORKFLOW_ANNOTATION,
    ChangeSignal,
    EventHub,
    HeadwayPods,
    PodLog,
    PodRecord,
    label_value,
    pod_name,
    service_name,
)
from .sim_task import is_task_command

__all__ = [
    "DEFAULT_GPU_NODE_LABEL",
    "GPU_RESOURCE",
    "Informer",
    "KubernetesBackend",
    "build_pods",
    "build_service",
    "pod_requests",
    "translate_pod",
]

log = logging.getLogger(__name__)

GPU_RESOURCE = "nvidia.com/gpu"
DEFAULT_GPU_NODE_LABEL = "nvidia.com/gpu.product"
MASTER_PORT = 29500
RAY_GCS_PORT = 6379
SPARK_DRIVER_PORT = 7078

_K = ActionEventKind
_IMAGE_PULL_REASONS = frozenset({"ErrImagePull", "ImagePullBackOff", "InvalidImageName"})
#: Image-pull states that never resolve by waiting: failed at once.
_IMAGE_PULL_FATAL = frozenset({"InvalidImageName"})
# DisruptionTarget reasons of an eviction (the kubelet under node pressure, the eviction
# API in a drain), as opposed to a preemption for a higher-priority pod.
_EVICTION_REASONS = frozenset({"EvictionByEvictionAPI", "TerminationByKubelet"})
# DisruptionTarget reasons that mean the node went away rather than the pod being pushed
# out for someone else.
_NODE_GONE_REASONS = frozenset({"DeletionByPodGC", "DeletionByTaintManager"})
_FINISHED_PHASES = frozenset({"Succeeded", "Failed"})
#: How long a pod this worker created counts as pending room before the informers show
#: it (it normally shows within a second; one deleted unseen is forgotten after this).
UNSEEN_TTL_S = 60.0


# --- pod construction -------------------------------------------------------------------


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


# --- status translation -----------------------------------------------------------------


def _conditions(pod: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c.get("type", ""): c for c in (pod.get("status") or {}).get("conditions") or []}


def translate_pod(
    pod: dict[str, Any], *, node_gone: bool = False
) -> tuple[ActionEventKind, int | None, str] | None:
    """What a pod's status says happened to it: ``(kind, exit_code, message)``.

    Args:
        pod: The pod as the API serves it (a JSON dict).
        node_gone: The node the pod was bound to no longer exists.

    Returns:
        The most telling event kind, or None when there is nothing to report yet.
    """
    status = pod.get("status") or {}
    phase = status.get("phase", "")
    reason = status.get("reason") or ""
    conds = _conditions(pod)
    statuses = list(status.get("initContainerStatuses") or []) + list(
        status.get("containerStatuses") or []
    )

    # Container-level causes first: an OOM kill also shows up as phase Failed.
    for cs in statuses:
        state = cs.get("state") or {}
        term = state.get("terminated") or {}
        if term.get("reason") == "OOMKilled":
            return _K.OOM_KILLED, term.get("exitCode", 137), f"container {cs.get('name')} OOMKilled"
        waiting = state.get("waiting") or {}
        if waiting.get("reason") in _IMAGE_PULL_REASONS:
            image = cs.get("image") or _spec_image(pod, cs.get("name"))
            detail = waiting.get("message") or waiting["reason"]
            return (
                _K.IMAGE_PULL_FAILED,
                None,
                f"image {image!r} could not be pulled: {waiting['reason']}: {detail}",
            )

    if reason == "Evicted":
        return _K.EVICTED, None, status.get("message") or reason
    disruption = conds.get("DisruptionTarget")
    if disruption is not None and disruption.get("status") == "True":
        message = disruption.get("message") or disruption.get("reason") or "disrupted"
        if disruption.get("reason") in _NODE_GONE_REASONS:
            return _K.NODE_LOST, None, message
        if disruption.get("reason") in _EVICTION_REASONS:
            return _K.EVICTED, None, message
        return _K.PREEMPTED, None, message
    if reason == "Preempting":
        return _K.PREEMPTED, None, status.get("message") or reason
    if reason == "NodeLost" or (node_gone and phase not in _FINISHED_PHASES):
        return _K.NODE_LOST, None, status.get("message") or "node lost"

    if phase == "Succeeded":
        return _K.SUCCEEDED, 0, "Completed"
    if _deleted_before_it_ended(pod):
        if node_gone:
            return _K.NODE_LOST, None, "node lost"
        return _K.POD_LOST, None, "PodLost: the pod was deleted before it ended"
    if phase == "Failed":
        code: int | None = None
        why = reason or "Failed"
        for cs in statuses:
            term = (cs.get("state") or {}).get("terminated") or {}
            if term.get("exitCode"):
                code = int(term["exitCode"])
                why = term.get("reason") or why
                break
        return _K.FAILED, code, status.get("message") or why
    if phase == "Running":
        return _K.RUNNING, None, ""
    scheduled = conds.get("PodScheduled")
    if scheduled is not None:
        if scheduled.get("status") == "True":
            return _K.SCHEDULED, None, f"bound to {(pod.get('spec') or {}).get('nodeName', '')}"
        if scheduled.get("reason") == "Unschedulable":
            return _K.UNSCHEDULABLE, None, scheduled.get("message") or "Unschedulable"
    return None


def _spec_image(pod: dict[str, Any], container: str | None) -> str:
    spec = pod.get("spec") or {}
    for c in list(spec.get("initContainers") or []) + list(spec.get("containers") or []):
        if c.get("name") == container:
            return str(c.get("image") or "")
    return ""


def _image_pull_reason(pod: dict[str, Any]) -> str | None:
    """The image-pull waiting reason of the pod's first container stuck on one."""
    status = pod.get("status") or {}
    for cs in list(status.get("initContainerStatuses") or []) + list(
        status.get("containerStatuses") or []
    ):
        reason = ((cs.get("state") or {}).get("waiting") or {}).get("reason")
        if reason in _IMAGE_PULL_REASONS:
            return str(reason)
    return None


def task_output(pod: dict[str, Any]) -> str | None:
    """An SDK task pod's outcome document: its main container's termination message
    (None for a pod that runs no SDK task, or wrote nothing)."""
    spec = pod.get("spec") or {}
    main = next((c for c in spec.get("containers") or [] if c.get("name") == "main"), None)
    if main is None or main.get("terminationMessagePath") != TERMINATION_LOG:
        return None
    for cs in (pod.get("status") or {}).get("containerStatuses") or []:
        if cs.get("name") == "main":
            message = ((cs.get("state") or {}).get("terminated") or {}).get("message")
            return str(message) if message else None
    return None


def _task_failure(document: str) -> str | None:
    """``Type: message`` of a task's failure document (None: not one)."""
    try:
        doc = json.loads(document)
    except ValueError:
        return None
    err = doc.get("error") if isinstance(doc, dict) else None
    if not isinstance(err, dict):
        return None
    return f"{err.get('type', 'Error')}: {err.get('message', '')}".rstrip(": ")


def _deleted_before_it_ended(pod: dict[str, Any]) -> bool:
    """Marked for deletion while it ran (or was killed by the deletion): not finished,
    or Failed with every container terminated at or after the deletion was asked for
    (a Failed pod whose times are not all known keeps its own failure)."""
    deleted = _time((pod.get("metadata") or {}).get("deletionTimestamp"))
    if deleted is None:
        return False
    status = pod.get("status") or {}
    if status.get("phase") != "Failed":
        return True
    finished = [
        _time(((cs.get("state") or {}).get("terminated") or {}).get("finishedAt"))
        for cs in status.get("containerStatuses") or []
    ]
    known = [t for t in finished if t is not None]
    return bool(finished) and len(known) == len(finished) and max(known) >= deleted


def _time(value: Any) -> datetime.datetime | None:
    """An RFC 3339 time as the API serves it; None when absent or unreadable."""
    if not value:
        return None
    try:
        t = datetime.datetime.fromisoformat(str(value))
    except ValueError:
        return None
    return t if t.tzinfo is not None else t.replace(tzinfo=datetime.UTC)


def _quantity(value: Any, parse: Callable[[Any, str], int], what: str) -> int:
    try:
        return parse(value, what)
    except QuantityError:
        return 0


def pod_requests(pod: dict[str, Any]) -> tuple[int, int, int, int]:
    """A pod's effective requests (cpu_m, memory, ephemeral, gpu), as the scheduler counts
    them: the larger of the containers' sum and the largest init container, plus
    overhead."""

    def of(c: dict[str, Any]) -> tuple[int, int, int, int]:
        r = (c.get("resources") or {}).get("requests") or {}
        lim = (c.get("resources") or {}).get("limits") or {}
        gpu = r.get(GPU_RESOURCE, lim.get(GPU_RESOURCE, 0))
        return (
            _quantity(r.get("cpu", 0), parse_cpu, "cpu"),
            _quantity(r.get("memory", 0), parse_memory, "memory"),
            _quantity(r.get("ephemeral-storage", 0), parse_memory, "ephemeral-storage"),
            _quantity(gpu, parse_memory, GPU_RESOURCE),
        )

    spec = pod.get("spec") or {}
    total = [0, 0, 0, 0]
    for c in spec.get("containers") or []:
        total = [a + b for a, b in zip(total, of(c), strict=True)]
    for c in spec.get("initContainers") or []:
        total = [max(a, b) for a, b in zip(total, of(c), strict=True)]
    overhead = spec.get("overhead") or {}
    total[0] += _quantity(overhead.get("cpu", 0), parse_cpu, "cpu")
    total[1] += _quantity(overhead.get("memory", 0), parse_memory, "memory")
    return total[0], total[1], total[2], total[3]


def _action_of(pod: dict[str, Any]) -> str | None:
    meta = pod.get("metadata") or {}
    annotated = (meta.get("annotations") or {}).get(ACTION_ANNOTATION)
    if annotated:
        return str(annotated)
    labelled = (meta.get("labels") or {}).get(ACTION_LABEL)
    return str(labelled) if labelled else None


def _tenant_of(pod: dict[str, Any]) -> str:
    """The tenant label of a Headway pod (a tenant name is a valid label value as it
    is); "" when it has none."""
    return str(((pod.get("metadata") or {}).get("labels") or {}).get(TENANT_LABEL, ""))


def _owner_of(pod: dict[str, Any]) -> tuple[str, str] | None:
    """``(tenant, action id)`` of a Headway pod; None for any other pod."""
    action = _action_of(pod)
    return None if action is None else (_tenant_of(pod), action)


def _dispatch_of(pod: dict[str, Any]) -> str:
    return str(((pod.get("metadata") or {}).get("annotations") or {}).get(DISPATCH_ANNOTATION, ""))


def _requests_spec(pod: dict[str, Any]) -> PodSpec:
    cpu, memory, eph, gpu = pod_requests(pod)
    return PodSpec(role="", index=0, cpu_m=cpu, memory=memory, ephemeral_storage=eph, gpu=gpu)


def _uid(obj: dict[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("uid") or "")


def _key(obj: dict[str, Any]) -> tuple[str, str]:
    meta = obj.get("metadata") or {}
    return meta.get("namespace") or "", meta.get("name") or ""


def _socket_of(resp: Any) -> socket.socket | None:
    """The socket a streaming response reads from.

    Usually its connection's; but when the server said it will close the connection,
    http.client hands the socket over to the response and the connection forgets it
    (``sock`` is None), so it is found under the response's file object instead.
    """
    if resp is None:
        return None
    conn = getattr(resp, "connection", None) or getattr(resp, "_connection", None)
    sock = getattr(conn, "sock", None)
    if isinstance(sock, socket.socket):
        return sock
    fp = getattr(getattr(resp, "_fp", None), "fp", None)  # http.client.HTTPResponse.fp
    raw = getattr(fp, "raw", None)  # socket.SocketIO
    sock = getattr(raw, "_sock", None)
    return sock if isinstance(sock, socket.socket) else None


# --- informers --------------------------------------------------------------------------


@dataclass
class Informer:
    """List-then-watch of one kind of object, in a thread, feeding the event loop.

    ``list_fn`` is a ``CoreV1Api`` list method bound to its scope (namespace, selectors).
    Every change is delivered as ``deliver(type, obj)`` on the loop, ``type`` one of
    ADDED, MODIFIED, DELETED, or SYNC with ``obj={"items": [...]}`` after a (re)list.
    """

    name: str
    list_fn: Callable[..., Any]
    deliver: Callable[[str, dict[str, Any]], None]
    on_error: Callable[[ApiException | Exception], None] = lambda exc: None
    watch_timeout_s: int = 300
    backoff_initial_s: float = 0.2
    backoff_max_s: float = 30.0
    request_timeout_s: float = 30.0
    resource_version: str | None = None
    relists: int = 0
    _stop: threading.Event = field(default_factory=threading.Event)
    _response: Any = None
    _thread: threading.Thread | None = None

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        """Start the informer's thread; deliveries go through ``loop``."""
        self._loop = loop
        self._thread = threading.Thread(target=self._run, name=f"informer-{self.name}", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop watching; interrupts a blocked watch by shutting its socket down.

        Closing the response from this thread would wait for the reader's buffer lock;
        shutting the socket down makes the blocked read return at once instead.
        """
        self._stop.set()
        sock = _socket_of(self._response)
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    async def join(self) -> None:
        """Wait for the thread to end (after :meth:`stop`)."""
        if self._thread is not None:
            await asyncio.to_thread(self._thread.join, 5.0)

    def _emit(self, kind: str, obj: dict[str, Any]) -> None:
        if not self._stop.is_set():
            with contextlib.suppress(RuntimeError):  # loop already closed
                self._loop.call_soon_threadsafe(self.deliver, kind, obj)

    def _run(self) -> None:
        backoff = self.backoff_initial_s
        while not self._stop.is_set():
            try:
                if self.resource_version is None:
                    self._list()
                self._watch()
                backoff = self.backoff_initial_s
            except ApiException as exc:
                if exc.status == 410:
                    # Our resourceVersion was compacted away: start over from a list.
                    self.resource_version = None
                    continue
                if self._stop.is_set():
                    return
                log.warning("informer %s: %s %s", self.name, exc.status, exc.reason)
                self._emit_error(exc)
                self._stop.wait(backoff)
                backoff = min(backoff * 2, self.backoff_max_s)
            except Exception as exc:
                if self._stop.is_set():
                    return
                log.warning("informer %s: %s", self.name, exc)
                self._emit_error(exc)
                self._stop.wait(backoff)
                backoff = min(backoff * 2, self.backoff_max_s)

    def _emit_error(self, exc: ApiException | Exception) -> None:
        with contextlib.suppress(RuntimeError):
            self._loop.call_soon_threadsafe(self.on_error, exc)

    def _list(self) -> None:
        resp = self.list_fn(_preload_content=False, _request_timeout=self.request_timeout_s)
        body = json.loads(resp.data)
        self.resource_version = (body.get("metadata") or {}).get("resourceVersion") or None
        self.relists += 1
        self._emit("SYNC", {"items": body.get("items") or []})

    def _watch(self) -> None:
        resp = self.list_fn(
            watch=True,
            resource_version=self.resource_version,
            allow_watch_bookmarks=True,
            timeout_seconds=self.watch_timeout_s,
            _preload_content=False,
            # The server ends the watch after timeout_seconds; the read timeout is only a
            # backstop against a silently dead connection.
            _request_timeout=(self.request_timeout_s, self.watch_timeout_s + 30),
        )
        self._response = resp
        try:
            for line in iter_resp_lines(resp):  # type: ignore[no-untyped-call]
                if self._stop.is_set():
                    return
                if not line:
                    continue
                event = json.loads(line)
                kind = event.get("type")
                obj = event.get("object") or {}
                if kind == "ERROR":
                    code = obj.get("code", 500)
                    raise ApiException(status=code, reason=obj.get("reason") or obj.get("message"))
                rv = (obj.get("metadata") or {}).get("resourceVersion")
                if rv:
                    self.resource_version = rv
                if kind == "BOOKMARK":
                    continue
                self._emit(kind, obj)
        finally:
            self._response = None
            with contextlib.suppress(Exception):
                resp.release_conn()


# --- the backend ------------------------------------------------------------------------


class KubernetesBackend:
    """A real cluster, through the kube API.

    Args:
        name: The cluster's name as the control plane knows it.
        namespace: Namespace the pods run in (and the only one watched). None: the
            request's namespace, watching all namespaces.
        kubeconfig: Kubeconfig file; default in-cluster config, else ``~/.kube/config``.
        context: Kubeconfig context.
        api_client: A ready ``kubernetes.client.ApiClient`` (overrides the two above).
        gpu_node_label: Node label carrying the GPU type (``nvidia.com/gpu.product`` is
            what NVIDIA's GPU feature discovery sets).
        watch_timeout_s: Server-side watch timeout; watches are renewed after it.
        sync_timeout_s: How long ``create_pods`` waits for the first pod list, so an
            adopted gang's current state is known.
        pod_log: The pod log file; None reads ``$HEADWAY_POD_LOG`` (unset: no log).
        stale_timeout_s: How long to wait for a stale pod (another dispatch's, same
            name) to be gone before creating this dispatch's.
        gpu_names: Short GPU name -> node-label value (``{"H100":
            "NVIDIA-H100-80GB-HBM3"}``): pods asking for ``H100`` select the label value,
            and nodes report their GPUs under the short name.
        queue_namespaces: Queue -> the namespace its pods run in (others: ``namespace``).
        delete_grace_s: Grace period of Headway's pod deletions (cancel, cleanup): the
            container gets SIGTERM and this long before SIGKILL.
        image_pull_grace_s: How long a pod may keep failing to pull its image
            (``ErrImagePull``/``ImagePullBackOff``) before the action fails
            ``ImagePullFailed``; an invalid image name fails at once.
    """

    def __init__(
        self,
        name: str,
        *,
        namespace: str | None = None,
        kubeconfig: str | None = None,
        context: str | None = None,
        api_client: k8s.ApiClient | None = None,
        gpu_node_label: str = DEFAULT_GPU_NODE_LABEL,
        watch_timeout_s: int = 300,
        sync_timeout_s: float = 30.0,
        backoff_initial_s: float = 0.2,
        backoff_max_s: float = 30.0,
        clock: Callable[[], float] = time.time,
        pod_log: str | None = None,
        stale_timeout_s: float = 30.0,
        gpu_names: Mapping[str, str] | None = None,
        queue_namespaces: Mapping[str, str] | None = None,
        delete_grace_s: int = 30,
        image_pull_grace_s: float = 120.0,
    ) -> None:
        self.name = name
        self.gpu_names = dict(gpu_names or {})
        self.queue_namespaces = dict(queue_namespaces or {})
        self.delete_grace_s = delete_grace_s
        self.image_pull_grace_s = image_pull_grace_s
        # Pods failing to pull their image: since when, and the timer that looks again.
        self._pull_failing_since: dict[tuple[str, str], float] = {}
        self._pull_timers: dict[tuple[str, str], asyncio.TimerHandle] = {}
        self._incarnation = ""
        self.stale_timeout_s = stale_timeout_s
        self._pod_log = PodLog.from_env(name, pod_log)
        self.namespace = namespace
        # Where pods are looked for: every namespace once a queue runs elsewhere.
        self._scope: str | None = (
            namespace
            if namespace is not None and set(self.queue_namespaces.values()) <= {namespace}
            else None
        )
        self.gpu_node_label = gpu_node_label
        self.watch_timeout_s = watch_timeout_s
        self.sync_timeout_s = sync_timeout_s
        self.clock = clock
        self._backoff = (backoff_initial_s, backoff_max_s)
        self._api_client = api_client
        self._kubeconfig = kubeconfig
        self._context = context
        self._api: k8s.CoreV1Api | None = None
        self._hub = EventHub()
        self._changes = ChangeSignal()
        self._sequence = 0
        # Headway's pods (label-selected), every pod's requests, and the nodes.
        self._pods: dict[tuple[str, str], dict[str, Any]] = {}
        self._all_pods: dict[tuple[str, str], dict[str, Any]] = {}
        self._nodes: dict[str, dict[str, Any]] = {}
        self._nodes_known = False
        self._gone_nodes: set[str] = set()
        self._all_pods_known = False
        self._last: dict[tuple[str, str], ActionEvent] = {}
        # (tenant, action) Headway is deleting the pods of ("" tenant: every tenant's).
        self._deleting: set[tuple[str, str]] = set()
        # Pods replaced by a newer dispatch's pod of the same name: never reported.
        self._stale_uids: set[str] = set()
        self._pods_synced = asyncio.Event()
        self.informers: dict[str, Informer] = {}
        # Pods this worker created that the informers have not shown yet: (created at,
        # requests), so two dispatches checked one after the other do not both count
        # the same free room.
        self._unseen: dict[tuple[str, str], tuple[float, PodSpec]] = {}

    @property
    def incarnation(self) -> str:
        """The worker process running this backend (stamped on pod-log lines)."""
        return self._incarnation

    @incarnation.setter
    def incarnation(self, value: str) -> None:
        self._incarnation = value
        if self._pod_log is not None:
            self._pod_log.incarnation = value

    # --- lifecycle ----------------------------------------------------------------------

    def _make_api(self) -> k8s.CoreV1Api:
        if self._api_client is None:
            if self._kubeconfig is None and self._context is None:
                try:
                    k8s_config.load_incluster_config()  # type: ignore[no-untyped-call]
                except k8s_config.ConfigException:
                    k8s_config.load_kube_config()  # type: ignore[no-untyped-call]
                self._api_client = k8s.ApiClient()
            else:
                self._api_client = k8s_config.new_client_from_config(  # type: ignore[no-untyped-call]
                    config_file=self._kubeconfig, context=self._context
                )
            # Who wrote what, in the API server's audit log: this process.
            self._api_client.user_agent = f"headway-cluster-worker/{os.getpid()}"
        return k8s.CoreV1Api(self._api_client)

    @property
    def api(self) -> k8s.CoreV1Api:
        """The CoreV1 API (built on first use)."""
        if self._api is None:
            self._api = self._make_api()
        return self._api

    async def start(self) -> None:
        """Start the pod, all-pods and node informers."""
        if self._pod_log is not None:
            await asyncio.to_thread(self._pod_log.open)
        api = await asyncio.to_thread(lambda: self.api)
        loop = asyncio.get_running_loop()
        selector = ACTION_LABEL
        if self._scope is None:

            def pods_fn(**kw: Any) -> Any:
                return api.list_pod_for_all_namespaces(label_selector=selector, **kw)
        else:
            ns = self._scope

            def pods_fn(**kw: Any) -> Any:
                return api.list_namespaced_pod(ns, label_selector=selector, **kw)

        def all_pods_fn(**kw: Any) -> Any:
            return api.list_pod_for_all_namespaces(
                field_selector="status.phase!=Succeeded,status.phase!=Failed", **kw
            )

        initial, cap = self._backoff
        common: dict[str, Any] = {
            "watch_timeout_s": self.watch_timeout_s,
            "backoff_initial_s": initial,
            "backoff_max_s": cap,
        }
        self.informers = {
            "pods": Informer("pods", pods_fn, self._on_pod, **common),
            "all-pods": Informer(
                "all-pods", all_pods_fn, self._on_any_pod, self._on_all_pods_error, **common
            ),
            "nodes": Informer(
                "nodes", api.list_node, self._on_node, self._on_nodes_error, **common
            ),
        }
        for informer in self.informers.values():
            informer.start(loop)

    async def close(self) -> None:
        """Stop the informers and close the API client."""
        for informer in self.informers.values():
            informer.stop()
        for timer in self._pull_timers.values():
            timer.cancel()
        self._pull_timers.clear()
        for informer in self.informers.values():
            await informer.join()
        if self._api_client is not None:
            with contextlib.suppress(Exception):
                await asyncio.to_thread(self._api_client.close)
        if self._pod_log is not None:
            self._pod_log.close()

    # --- pods ---------------------------------------------------------------------------

    def _ns(self, requested: str) -> str:
        return self.namespace or requested or "default"

    def namespace_of(self, req: DispatchRequest) -> str:
        """Where the action's pods run: its queue's namespace, else the worker's."""
        return self.queue_namespaces.get(req.queue) or self._ns(req.namespace)

    async def create_pods(
        self, req: DispatchRequest, *, dispatch: str = "", adopt_only: bool = False
    ) -> list[str]:
        """Create the gang (and its headless Service); 409 Conflict adopts the existing.

        A pod that exists under another ``dispatch`` is stale: it is deleted and this
        dispatch's created. With ``adopt_only`` nothing is sent to the API server.
        """
        ns = self.namespace_of(req)
        self._deleting.discard((req.tenant, req.action_id))
        legacy = await self._begun_before_tenants(req, ns, dispatch, adopt_only)
        names = pod_names(req, legacy)
        if not adopt_only:
            if needs_service(req):
                await self._create(
                    lambda body: self.api.create_namespaced_service(ns, _any(body)),
                    build_service(req, ns, legacy),
                )
            bodies = build_pods(
                req,
                ns,
                self.gpu_node_label,
                dispatch=dispatch,
                gpu_names=self.gpu_names,
                constrain=self._hints_known(req),
                legacy=legacy,
            )
            for spec, body in zip(req.pods, bodies, strict=True):
                await self._create_pod(ns, body, spec, dispatch)
            if len(names) > 1:
                await self._release_gang(ns, names)
        elif len(names) > 1:
            await self._complete_held_gang(req, ns, names, dispatch, legacy)
        # Adoption relies on the informer's picture: make sure it has been listed once.
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._pods_synced.wait(), self.sync_timeout_s)
        return names

    async def _begun_before_tenants(
        self, req: DispatchRequest, ns: str, dispatch: str, adopt_only: bool
    ) -> bool:
        """Whether this dispatch's pods exist under the names a worker gave them before
        tenants were part of names (its predecessor, since upgraded, created them): they
        keep those names, and are adopted, never created a second time under the new.

        A retry (``adopt_only``) asks the API server; a first attempt, the informer's
        picture (it creates only what is missing anyway), where another dispatch's pod
        of such a name is stale, as a pod of the same name would be: it is removed.
        """
        legacy = set(pod_names(req, legacy=True))
        if adopt_only:
            found = [
                p
                for p in await self._list_action_pods(req.action_id, ns, req.tenant)
                if p["metadata"]["name"] in legacy
            ]
        else:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._pods_synced.wait(), self.sync_timeout_s)
            found = [
                pod
                for name in sorted(legacy)
                if (pod := self._pods.get((ns, name))) is not None
                and _action_of(pod) == req.action_id
                and _tenant_of(pod) in ("", req.tenant)
            ]
        ours = [p for p in found if not dispatch or _dispatch_of(p) in ("", dispatch)]
        if not adopt_only:
            for stale in (p for p in found if p not in ours):
                name = stale["metadata"]["name"]
                log.warning("pod %s is of an earlier dispatch, not %s: removing", name, dispatch)
                self._stale_uids.add(_uid(stale))
                self._last.pop((ns, name), None)
                with contextlib.suppress(ApiException):
                    await self._remove_pod(ns, stale)
                await self._wait_gone(ns, name)
        if ours:
            log.info(
                "%s: adopting pods named before tenants were part of names: %s",
                req.action_id,
                ", ".join(sorted(p["metadata"]["name"] for p in ours)),
            )
        return bool(ours)

    def _hints_known(self, req: DispatchRequest) -> bool:
        """Whether the admission's node hints are nodes of this cluster: an admission
        made while its capacity was unknown names the fleet file's placeholders (and a
        node may have gone since), which no pod could ever be bound to."""
        unknown = [n for n in req.node_hints if n not in self._nodes]
        if unknown:
            log.info(
                "%s: the admission's nodes %s are not nodes of %s: pods not constrained",
                req.action_id,
                ", ".join(unknown),
                self.name,
            )
        return not unknown

    async def _create_pod(
        self, ns: str, body: dict[str, Any], spec: PodSpec, dispatch: str
    ) -> None:
        name = body["metadata"]["name"]
        action = body["metadata"]["annotations"][ACTION_ANNOTATION]

        def note(event: str) -> None:
            if self._pod_log is not None:
                self._pod_log.append(
                    event,
                    t=self.clock(),
                    action=action,
                    pod=name,
                    node=None,
                    spec=spec,
                    dispatch=dispatch,
                )

        for _ in range(2):
            # The intent first: a kill between the call and the "created" line must not
            # leave a pod the log never heard of.
            note("creating")
            try:
                await asyncio.to_thread(self.api.create_namespaced_pod, ns, _any(body))
            except ApiException as exc:
                if exc.status != 409:
                    raise
            else:
                note("created")
                # Room it takes until the informer shows it (the arbiter's next check).
                if (ns, name) not in self._pods:
                    self._unseen[(ns, name)] = (self.clock(), spec)
                return
            existing = await self._read_pod(ns, name)
            theirs = _dispatch_of(existing) if existing is not None else ""
            if existing is not None and not (dispatch and theirs and theirs != dispatch):
                log.info("adopting existing Pod %s", name)
                return
            if existing is not None:
                # Left by an earlier dispatch of the action, which is over: not ours to
                # adopt. Replace it, and let nothing it reports (its old outcome, its
                # deletion) pass for the new pod of the same name.
                self._stale_uids.add(_uid(existing))
                self._last.pop((ns, name), None)
                log.warning(
                    "pod %s belongs to dispatch %s, not %s: replacing", name, theirs, dispatch
                )
                with contextlib.suppress(ApiException):
                    await self._remove_pod(ns, existing)
                await self._wait_gone(ns, name)
        raise RuntimeError(f"pod {ns}/{name}: a stale pod of another dispatch keeps coming back")

    async def _release_gang(self, ns: str, names: Sequence[str]) -> None:
        """Lift the gang's scheduling gate (``GANG_GATE``) from each of its pods."""
        for name in names:
            await asyncio.to_thread(
                self.api.patch_namespaced_pod, name, ns, {"spec": {"schedulingGates": None}}
            )

    async def _complete_held_gang(
        self, req: DispatchRequest, ns: str, names: list[str], dispatch: str, legacy: bool
    ) -> None:
        """An earlier attempt's gang still held by its gate (that attempt died creating
        it, or releasing it). Wholly held: nothing of it ran, so what is missing is
        created, then the gang released. Partly released: it was whole when its release
        began, so the rest is released (a member missing now went after that: lost)."""
        pods = {
            p["metadata"]["name"]: p
            for p in await self._list_action_pods(req.action_id, ns, req.tenant)
            if _dispatch_of(p) == dispatch
        }
        held = [n for n, p in pods.items() if (p.get("spec") or {}).get("schedulingGates")]
        if not held:
            return
        if len(held) < len(pods):
            await self._release_gang(ns, held)
            return
        missing = [n for n in names if n not in pods]
        if missing:
            log.warning(
                "%s: completing the gang an earlier attempt began (still held): %s",
                req.action_id,
                ", ".join(missing),
            )
        bodies = build_pods(
            req,
            ns,
            self.gpu_node_label,
            dispatch=dispatch,
            gpu_names=self.gpu_names,
            constrain=self._hints_known(req),
            legacy=legacy,
        )
        for spec, body in zip(req.pods, bodies, strict=True):
            if body["metadata"]["name"] in missing:
                await self._create_pod(ns, body, spec, dispatch)
        await self._release_gang(ns, names)

    async def _read_pod(self, ns: str, name: str) -> dict[str, Any] | None:
        try:
            resp: Any = await asyncio.to_thread(
                self.api.read_namespaced_pod, name, ns, _preload_content=False
            )
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise
        pod: dict[str, Any] = json.loads(resp.data)
        return pod

    async def _wait_gone(self, ns: str, name: str) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.stale_timeout_s
        while await self._read_pod(ns, name) is not None:
            if loop.time() >= deadline:
                raise TimeoutError(
                    f"pod {ns}/{name} of an earlier dispatch still exists after"
                    f" {self.stale_timeout_s:g} s"
                )
            await asyncio.sleep(0.1)

    @staticmethod
    async def _create(fn: Callable[[dict[str, Any]], Any], body: dict[str, Any]) -> None:
        try:
            await asyncio.to_thread(fn, body)
        except ApiException as exc:
            if exc.status != 409:
                raise
            log.info("adopting existing %s %s", body["kind"], body["metadata"]["name"])

    async def delete_pods(
        self, action_id: str, namespace: str = "default", *, tenant: str = ""
    ) -> int:
        """Delete the action's pods and Service (404s are fine: idempotent).

        Every pod is tried even when one delete fails; the first failure is raised after
        (the caller retries, and finds only what is left).
        """
        # A queue's own namespace is taken as given; any other is the worker's.
        ns = namespace if namespace in self.queue_namespaces.values() else self._ns(namespace)
        self._deleting.add((tenant, action_id))
        items = await self._list_action_pods(action_id, ns if self._scope else None, tenant)
        deleted = 0
        failure: ApiException | None = None
        spaces = {ns}
        # The tenant's Service, and whichever its pods name (a gang begun before tenants
        # were part of names has the Service named for the action alone).
        services = {service_name(action_id, tenant)}
        for pod in items:
            pod_ns = (pod.get("metadata") or {}).get("namespace") or ns
            spaces.add(pod_ns)
            subdomain = (pod.get("spec") or {}).get("subdomain")
            if subdomain:
                services.add(str(subdomain))
            try:
                await self._remove_pod(pod_ns, pod, grace_s=self.delete_grace_s)
                deleted += 1
            except ApiException as exc:
                if exc.status != 404:
                    failure = failure or exc
        for space in sorted(spaces):
            for service in sorted(services):
                try:
                    await asyncio.to_thread(self.api.delete_namespaced_service, service, space)
                except ApiException as exc:
                    if exc.status != 404:
                        failure = failure or exc
        if failure is not None:
            raise failure
        return deleted

    async def _remove_pod(self, ns: str, pod: dict[str, Any], *, grace_s: int = 0) -> None:
        """Delete the pod (SIGTERM, then ``grace_s`` seconds before SIGKILL; a stale pod
        being replaced stops at once) and lift Headway's finalizer (it goes).

        The deletion first: a kill between the two leaves the pod marked for deletion,
        which the garbage collection finishes; never a running pod without its record.
        """
        name = pod["metadata"]["name"]
        if not (pod.get("metadata") or {}).get("deletionTimestamp"):
            try:
                await asyncio.to_thread(
                    self.api.delete_namespaced_pod, name, ns, grace_period_seconds=grace_s
                )
            except ApiException as exc:
                if exc.status == 404:
                    return
                raise
        for _ in range(3):
            finalizers = list((pod.get("metadata") or {}).get("finalizers") or [])
            if FINALIZER not in finalizers:
                return
            i = finalizers.index(FINALIZER)
            # A JSON patch with a test: only Headway's own finalizer goes, whatever
            # another controller added meanwhile (a failed test reads the pod again).
            patch = [
                {"op": "test", "path": f"/metadata/finalizers/{i}", "value": FINALIZER},
                {"op": "remove", "path": f"/metadata/finalizers/{i}"},
            ]
            try:
                await asyncio.to_thread(self.api.patch_namespaced_pod, name, ns, patch)
                return
            except ApiException as exc:
                if exc.status == 404:
                    return
                if exc.status not in (409, 422, 500):
                    raise
            fresh = await self._read_pod(ns, name)
            if fresh is None:
                return
            pod = fresh
        raise RuntimeError(f"pod {ns}/{name}: its finalizer could not be lifted")

    async def _list_action_pods(
        self, action_id: str, ns: str | None, tenant: str = ""
    ) -> list[dict[str, Any]]:
        """The action's pods as the API server has them now (not the informer's copy):
        ``tenant``'s only when given (every tenant's of that id when empty)."""
        selector = f"{ACTION_LABEL}={label_value(action_id)}"
        if tenant:
            selector += f",{TENANT_LABEL}={label_value(tenant)}"
        if ns is None:
            resp: Any = await asyncio.to_thread(
                self.api.list_pod_for_all_namespaces,
                label_selector=selector,
                _preload_content=False,
            )
        else:
            resp = await asyncio.to_thread(
                self.api.list_namespaced_pod, ns, label_selector=selector, _preload_content=False
            )
        items = json.loads(resp.data).get("items") or []
        # A label value shared by two ids after sanitizing: the annotation tells them apart.
        return [p for p in items if _action_of(p) == action_id]

    async def dispatch_record(self, action_id: str, dispatch: str) -> dict[str, PodRecord]:
        """The pods of ``dispatch`` that exist now, with their node and outcome.

        The API server keeps no trace of a deleted pod, so this is what is left: a
        retried attempt adds what its predecessor's heartbeats recorded.
        """
        out: dict[str, PodRecord] = {}
        for pod in await self._list_action_pods(action_id, self._scope):
            if _dispatch_of(pod) != dispatch:
                continue
            name = pod["metadata"]["name"]
            state = translate_pod(pod, node_gone=self._node_gone(pod))
            outcome = state[0] if state is not None and state[0] in TERMINAL_EVENTS else None
            out[name] = PodRecord(name, (pod.get("spec") or {}).get("nodeName"), outcome)
        return out

    async def live_pods(self, action_id: str, dispatch: str = "") -> dict[str, str | None]:
        """The action's pods that exist (name -> node), from a LIST; ``dispatch``'s only
        when given (pods created before dispatches were recorded count as its own). A pod
        marked for deletion is not live: it is kept only as the record of its end."""
        return {
            pod["metadata"]["name"]: (pod.get("spec") or {}).get("nodeName")
            for pod in await self._list_action_pods(action_id, self._scope)
            if (not dispatch or _dispatch_of(pod) in ("", dispatch))
            and not pod["metadata"].get("deletionTimestamp")
        }

    async def node_exists(self, node: str) -> bool | None:
        """Whether the API server has the node (a GET); None when it cannot be read."""
        try:
            await asyncio.to_thread(self.api.read_node, node, _preload_content=False)
        except ApiException as exc:
            if exc.status == 404:
                return False
            log.info("reading node %s: %s %s", node, exc.status, exc.reason)
            return None
        return True

    async def headway_pods(self) -> list[HeadwayPods]:
        """Every action with Headway pods, from the informer's picture once it is listed.

        The workflow id comes from the pod's annotation; for pods created before it was
        recorded it is derived from the tenant label, and marked inexact.
        """
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._pods_synced.wait(), self.sync_timeout_s)
        found: dict[tuple[str, str], HeadwayPods] = {}
        for (ns, _), pod in self._pods.items():
            key = _owner_of(pod)
            if key is None or key in found:
                continue
            tenant, action = key
            meta = pod.get("metadata") or {}
            workflow = (meta.get("annotations") or {}).get(WORKFLOW_ANNOTATION)
            if workflow:
                found[key] = HeadwayPods(action, str(workflow), ns, tenant=tenant)
            else:
                found[key] = HeadwayPods(
                    action, action_workflow_id(tenant, action), ns, exact=False, tenant=tenant
                )
        return [found[k] for k in sorted(found, key=lambda k: (k[1], k[0]))]

    def _being_deleted(self, pod: dict[str, Any]) -> bool:
        """Whether Headway is deleting the pods of the pod's action (of its tenant)."""
        tenant, action = _tenant_of(pod), _action_of(pod)
        return action is not None and bool({(tenant, action), ("", action)} & self._deleting)

    def forget(self, action_id: str, *, tenant: str = "") -> None:
        """Nothing to forget: the API server is the record."""

    # --- events -------------------------------------------------------------------------

    def subscribe(self) -> contextlib.AbstractContextManager[asyncio.Queue[ActionEvent]]:
        """A queue of every event published while the context is open."""
        return self._hub.subscribe()

    def events(self) -> AsyncIterator[ActionEvent]:
        """Every event, for all actions, from now on."""
        return self._hub.stream()

    async def current_events(self, action_id: str) -> list[ActionEvent]:
        """The latest event of each of the action's pods, from the informer's picture."""
        return [e for e in self._last.values() if e.action_id == action_id]

    def _report(self, key: tuple[str, str], pod: dict[str, Any], *, node_gone: bool) -> None:
        action = _action_of(pod)
        if action is None or _uid(pod) in self._stale_uids:
            return
        if self._being_deleted(pod) and (pod.get("metadata") or {}).get("deletionTimestamp"):
            return  # Headway's own deletion (an ended or cancelled action): nothing to say
        state = translate_pod(pod, node_gone=node_gone)
        if state is None:
            return
        kind, code, message = state
        if kind is _K.IMAGE_PULL_FAILED:
            waited = self._image_pull_waited(key, pod)
            if waited is None:
                return  # still within its grace: the kubelet keeps trying
            if waited:
                message = f"{message} (still failing after {waited:g} s)"
        else:
            self._image_pull_ok(key)
        output = task_output(pod) if kind in (_K.SUCCEEDED, _K.FAILED) else None
        if kind is _K.FAILED and output is not None:
            message = _task_failure(output) or message
        last = self._last.get(key)
        if last is not None and (
            last.kind in TERMINAL_EVENTS or (last.kind, last.message) == (kind, message)
        ):
            return
        event = ActionEvent(
            action_id=action,
            kind=kind,
            cluster=self.name,
            pod=key[1],
            node=(pod.get("spec") or {}).get("nodeName"),
            exit_code=code,
            message=message,
            observed_at=self.clock(),
            output=output,
        )
        self._last[key] = event
        self._hub.publish(event)

    def _image_pull_waited(self, key: tuple[str, str], pod: dict[str, Any]) -> float | None:
        """How long the pod has failed to pull its image once that is past its grace
        (0: a failure that waiting cannot fix); None while it is within the grace, with
        a timer set to look again when it ends (the kubelet may say nothing new)."""
        if _image_pull_reason(pod) in _IMAGE_PULL_FATAL:
            return 0.0
        now = self.clock()
        since = self._pull_failing_since.setdefault(key, now)
        left = since + self.image_pull_grace_s - now
        if left <= 0:
            return round(now - since, 1)
        if key not in self._pull_timers:
            loop = asyncio.get_running_loop()
            self._pull_timers[key] = loop.call_later(left + 0.05, self._look_again, key)
        return None

    def _image_pull_ok(self, key: tuple[str, str]) -> None:
        self._pull_failing_since.pop(key, None)
        timer = self._pull_timers.pop(key, None)
        if timer is not None:
            timer.cancel()

    def _look_again(self, key: tuple[str, str]) -> None:
        self._pull_timers.pop(key, None)
        pod = self._pods.get(key)
        if pod is not None:
            self._report(key, pod, node_gone=self._node_gone(pod))

    def _node_gone(self, pod: dict[str, Any]) -> bool:
        # Only a node we saw go counts: the node informer may simply not have caught up
        # with a node that was just added.
        node = (pod.get("spec") or {}).get("nodeName")
        return bool(node) and node in self._gone_nodes

    def _on_pod(self, kind: str, obj: dict[str, Any]) -> None:
        # Seen now (or gone): its room is counted from what the informers say.
        if kind == "SYNC":
            for p in obj["items"]:
                self._unseen.pop(_key(p), None)
        else:
            self._unseen.pop(_key(obj), None)
        if kind == "SYNC":
            fresh = {_key(p): p for p in obj["items"]}
            for key in set(self._pods) - set(fresh):
                gone = self._pods.pop(key)
                self._audit(key, gone, deleted=True)
                self._pod_gone(key, gone)
            for key, pod in fresh.items():
                self._pods[key] = pod
                self._report(key, pod, node_gone=self._node_gone(pod))
                self._audit(key, pod)
            if not self._pods_synced.is_set():
                self._audit_vanished({name for _, name in fresh})
            self._pods_synced.set()
        elif kind == "DELETED":
            key = _key(obj)
            self._pods.pop(key, None)
            self._report(key, obj, node_gone=self._node_gone(obj))
            self._audit(key, obj, deleted=True)
            self._pod_gone(key, obj)
        else:
            key = _key(obj)
            self._pods[key] = obj
            self._report(key, obj, node_gone=self._node_gone(obj))
            self._audit(key, obj)
        self._changes.bump()

    def _audit_vanished(self, listed: set[str]) -> None:
        """At the first list: pods an earlier incarnation logged and nobody saw end, that
        are gone now (deleted while no worker watched, e.g. with their node), end now."""
        if self._pod_log is None:
            return
        self._pod_log.end_vanished(self.clock(), lambda _dispatch, pod: pod in listed)

    def _audit(self, key: tuple[str, str], pod: dict[str, Any], *, deleted: bool = False) -> None:
        """Pod-log lines for what the informer saw: bound to a node, and ended (finished,
        or deleted). Each is written once per dispatch and pod, across incarnations."""
        if self._pod_log is None:
            return
        action = _action_of(pod)
        if action is None:
            return
        node = (pod.get("spec") or {}).get("nodeName")
        phase = (pod.get("status") or {}).get("phase")
        dispatch = _dispatch_of(pod)
        now = self.clock()
        common: dict[str, Any] = {
            "action": action,
            "pod": key[1],
            "node": node,
            "spec": _requests_spec(pod),
            "dispatch": dispatch,
        }
        if node:
            self._pod_log.append("bound", t=now, **common)
        if deleted or phase in _FINISHED_PHASES:
            last = self._last.get(key)
            if last is not None and last.kind in TERMINAL_EVENTS:
                outcome = str(last.kind)
            else:
                state = translate_pod(pod)
                terminal = state is not None and state[0] in TERMINAL_EVENTS
                outcome = str(state[0]) if state is not None and terminal else "Deleted"
            self._pod_log.append("ended", t=now, outcome=outcome, **common)

    def _pod_gone(self, key: tuple[str, str], pod: dict[str, Any]) -> None:
        if _uid(pod) in self._stale_uids:
            self._stale_uids.discard(_uid(pod))
            return
        action = _action_of(pod)
        last = self._last.get(key)
        if (
            action is not None
            and not self._being_deleted(pod)
            and (last is None or last.kind not in TERMINAL_EVENTS)
        ):
            # Deleted under a live action by someone else: the pod is not coming back.
            gone = self._node_gone(pod)
            event = ActionEvent(
                action_id=action,
                kind=_K.NODE_LOST if gone else _K.FAILED,
                cluster=self.name,
                pod=key[1],
                node=(pod.get("spec") or {}).get("nodeName"),
                message="node lost" if gone else "pod was deleted",
                observed_at=self.clock(),
            )
            self._hub.publish(event)
        self._last.pop(key, None)
        self._image_pull_ok(key)

    def _on_any_pod(self, kind: str, obj: dict[str, Any]) -> None:
        if kind == "SYNC":
            self._all_pods = {_key(p): p for p in obj["items"]}
            self._all_pods_known = True
        elif kind == "DELETED":
            self._all_pods.pop(_key(obj), None)
        else:
            self._all_pods[_key(obj)] = obj
        self._changes.bump()

    def _on_all_pods_error(self, exc: ApiException | Exception) -> None:
        if isinstance(exc, ApiException) and exc.status in (401, 403):
            self._all_pods_known = False
            self._changes.bump()

    def _on_node(self, kind: str, obj: dict[str, Any]) -> None:
        if kind == "SYNC":
            fresh = {(n.get("metadata") or {}).get("name", ""): n for n in obj["items"]}
            gone = set(self._nodes) - set(fresh)
            self._nodes = fresh
            self._nodes_known = True
        elif kind == "DELETED":
            name = (obj.get("metadata") or {}).get("name", "")
            self._nodes.pop(name, None)
            gone = {name}
        else:
            self._nodes[(obj.get("metadata") or {}).get("name", "")] = obj
            gone = set()
        self._gone_nodes -= set(self._nodes)
        self._gone_nodes |= gone
        for key, pod in self._pods.items():
            if (pod.get("spec") or {}).get("nodeName") in gone:
                self._report(key, pod, node_gone=True)
        self._changes.bump()

    def _on_nodes_error(self, exc: ApiException | Exception) -> None:
        if isinstance(exc, ApiException) and exc.status in (401, 403, 404):
            # Not allowed to read nodes: capacity is unknown, which means open.
            self._nodes_known = False
            self._changes.bump()

    # --- capacity -----------------------------------------------------------------------

    def _node_capacity(
        self,
        node: dict[str, Any],
        used: tuple[int, int, int, int],
        tolerations: Sequence[Mapping[str, Any]] = (),
    ) -> NodeCapacity:
        alloc = (node.get("status") or {}).get("allocatable") or {}
        labels = (node.get("metadata") or {}).get("labels") or {}
        cpu = _quantity(alloc.get("cpu", 0), parse_cpu, "cpu")
        memory = _quantity(alloc.get("memory", 0), parse_memory, "memory")
        eph = _quantity(alloc.get("ephemeral-storage", 0), parse_memory, "ephemeral-storage")
        gpu = _quantity(alloc.get(GPU_RESOURCE, 0), parse_memory, GPU_RESOURCE)
        # A node that takes no new pod (cordoned, NotReady, or tainted against pods like
        # Headway's) has nothing free: counting it would admit pods that stay Pending.
        unusable = unusable_reason(node, tolerations)
        usable = not unusable
        return NodeCapacity(
            name=(node.get("metadata") or {}).get("name", ""),
            cpu_m=cpu,
            memory=memory,
            ephemeral_storage=eph,
            gpu=gpu,
            gpu_type=self.gpu_type_of(labels) if gpu else None,
            free_cpu_m=max(cpu - used[0], 0) if usable else 0,
            free_memory=max(memory - used[1], 0) if usable else 0,
            free_ephemeral_storage=max(eph - used[2], 0) if usable else 0,
            free_gpu=max(gpu - used[3], 0) if usable else 0,
            unusable=unusable,
        )

    def gpu_type_of(self, labels: Mapping[str, str]) -> str | None:
        """The GPU type a node with these labels reports (its short name by the
        worker's GPU name map, so the scheduler's ``H100:8`` matches)."""
        return gpu_short_name(labels.get(self.gpu_node_label), self.gpu_names)

    def free_nodes(
        self, tolerations: Sequence[Mapping[str, Any]] = ()
    ) -> tuple[list[NodeCapacity], list[PodSpec]] | None:
        """The live view for the arbiter: per node, what is free for a pod with
        ``tolerations`` (every pod on the cluster counted, any tenant's or none), and
        the requests of Headway's pods that are created but not bound yet (they take
        room first). None while nodes or pods cannot be read (capacity unknown)."""
        if not (self._nodes_known and self._all_pods_known):
            return None
        used: dict[str, list[int]] = {}
        pending: list[PodSpec] = []
        # The headway informer may be ahead of the all-pods one: count each pod once,
        # from the freshest copy.
        pods = {**self._all_pods, **self._pods}
        for key, pod in pods.items():
            node = (pod.get("spec") or {}).get("nodeName")
            phase = (pod.get("status") or {}).get("phase")
            if phase in _FINISHED_PHASES:
                continue
            if not node:
                if key in self._pods:
                    pending.append(_requests_spec(pod))
                continue
            u = used.setdefault(node, [0, 0, 0, 0])
            for i, q in enumerate(pod_requests(pod)):
                u[i] += q
        horizon = self.clock() - UNSEEN_TTL_S
        for key, (at, spec) in list(self._unseen.items()):
            if key in pods or at < horizon:
                del self._unseen[key]
            else:
                pending.append(spec)
        nodes = [
            self._node_capacity(n, tuple(used.get(name, [0, 0, 0, 0])), tolerations)  # type: ignore[arg-type]
            for name, n in sorted(self._nodes.items())
        ]
        return nodes, pending

    async def live_view(
        self, req: DispatchRequest
    ) -> tuple[list[NodeCapacity], list[PodSpec]] | None:
        """``free_nodes`` for the request's pods (the tolerations they are created with)."""
        bodies = build_pods(
            req,
            self.namespace_of(req),
            self.gpu_node_label,
            gpu_names=self.gpu_names,
            constrain=self._hints_known(req),
        )
        tolerations = (bodies[0].get("spec") or {}).get("tolerations") or [] if bodies else []
        return self.free_nodes(tolerations)

    async def capacity(self) -> CapacityReport:
        """Per node: allocatable, and free = allocatable - requests of non-terminal pods
        (nothing on a node that takes no new pods: cordoned, NotReady, or with a
        ``NoSchedule``/``NoExecute`` taint Headway's pods do not tolerate).

        ``nodes`` is None while nodes or pods cannot be read (not yet listed, or RBAC
        forbids it): unknown means open.
        """
        self._sequence += 1
        now = self.clock()
        view = self.free_nodes()
        if view is None:
            return CapacityReport(self.name, None, [], self._sequence, now)
        nodes, _ = view
        live: dict[tuple[str, str], bool] = {}
        for pod in self._pods.values():
            action = _action_of(pod)
            phase = (pod.get("status") or {}).get("phase")
            if action is None or phase in _FINISHED_PHASES:
                continue
            bound = bool((pod.get("spec") or {}).get("nodeName"))
            # (The label holds the tenant as a label value: tenant names are valid ones.)
            tenant = ((pod.get("metadata") or {}).get("labels") or {}).get(TENANT_LABEL, "")
            key = (action, str(tenant))
            live[key] = live.get(key, True) and bound
        reflected = sorted(k for k, ok in live.items() if ok)
        return CapacityReport(
            self.name,
            nodes,
            [a for a, _ in reflected],
            self._sequence,
            now,
            reflected_tenants=[t for _, t in reflected],
        )

    async def wait_capacity_change(self, since: int) -> int:
        """Block until an informer delivered something after version ``since``."""
        return await self._changes.wait(since)


def _any(body: dict[str, Any]) -> Any:
    # The client serializes plain dicts as they are; its stubs only name the models.
    return body
