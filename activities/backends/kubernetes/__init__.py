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

The package's modules follow its seams: ``pods`` builds the manifests, ``status`` reads
pods (what happened to them, what they request), ``informer`` keeps the picture (list
and watch), ``capacity`` reads what the nodes have free, ``deletion`` removes a pod
(deletion, then Headway's finalizer), ``pooled`` runs a reusable environment's action
as a call in its pool of pulling pods (no pod of its own), and ``backend`` is the backend
itself (creation and adoption of an action's pods, its deletion, events, the capacity
report).
"""

from __future__ import annotations

from .backend import UNSEEN_TTL_S, KubernetesBackend
from .capacity import node_capacity, requests_by_node
from .informer import Informer
from .pods import (
    DEFAULT_GPU_NODE_LABEL,
    FINALIZER,
    GANG_GATE,
    GPU_RESOURCE,
    MASTER_PORT,
    RAY_GCS_PORT,
    SPARK_DRIVER_PORT,
    TERMINATION_LOG,
    TERMINATION_MESSAGE_MAX,
    build_pods,
    build_service,
    gpu_label_value,
    gpu_short_name,
    needs_service,
    owner,
    pod_names,
)
from .status import pod_requests, task_output, translate_pod

__all__ = [
    "DEFAULT_GPU_NODE_LABEL",
    "FINALIZER",
    "GANG_GATE",
    "GPU_RESOURCE",
    "MASTER_PORT",
    "RAY_GCS_PORT",
    "SPARK_DRIVER_PORT",
    "TERMINATION_LOG",
    "TERMINATION_MESSAGE_MAX",
    "UNSEEN_TTL_S",
    "Informer",
    "KubernetesBackend",
    "build_pods",
    "build_service",
    "gpu_label_value",
    "gpu_short_name",
    "needs_service",
    "node_capacity",
    "owner",
    "pod_names",
    "pod_requests",
    "requests_by_node",
    "task_output",
    "translate_pod",
]
