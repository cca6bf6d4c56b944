"""Wire contracts shared by the control plane and the cluster workers.

Everything that crosses a process boundary (workflow inputs, signals, activity inputs and
the events a cluster worker reports) is defined here, once, as plain dataclasses that
Temporal's default JSON converter round-trips. Names of task queues, workflow ids, signals
and search attributes live here too, so a cluster worker and the control plane can never
disagree on them.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from temporalio.common import Priority
    from temporalio.converter import DataConverter


def data_converter() -> DataConverter:
    """How Headway's payloads are encoded: plain JSON, decoded by cached pydantic adapters.

    The bytes are what Temporal's default converter writes too (either side reads the
    other), but decoding compiles once per type instead of re-reading type hints for
    every payload (see ``headway.workflows.converter``). Every client Headway connects
    uses it: CLI, SDK, workers, tests, benchmarks.
    """
    from headway.workflows.converter import DATA_CONVERTER

    return DATA_CONVERTER


# --- names -----------------------------------------------------------------------------

#: Task queue of the control-plane worker (scheduler + action workflows, store activities).
CONTROL_TASK_QUEUE = "headway-control"
DEFAULT_NAMESPACE = "default"
DEFAULT_TENANT = "default"


def cluster_task_queue(cluster: str) -> str:
    """Task queue polled by the one cluster worker of ``cluster``."""
    return f"headway-cluster-{cluster}"


def scheduler_workflow_id(tenant: str) -> str:
    """Workflow id of the shard scheduler of ``tenant`` (one shard per tenant)."""
    return f"headway-scheduler-{tenant}"


def action_workflow_id(tenant: str, action_id: str) -> str:
    """Workflow id of one action's lifecycle workflow."""
    return f"headway-action-{tenant}-{action_id}"


def tenant_priority(tenant: str) -> Priority:
    """Task-queue fairness by shard: every workflow of ``tenant`` (and so each of its
    activities, which inherit it) carries the tenant as its fairness key.

    Actions of all tenants share the control-plane and cluster task queues. Without
    fairness, a tenant submitting hundreds of actions fills them, and another tenant's
    tasks wait behind that backlog in FIFO order; with it, the server dispatches tasks of
    different keys round-robin. A server with fairness off ignores the key.
    """
    from temporalio.common import Priority

    return Priority(fairness_key=tenant[:64])


#: Priority key of a tenant's scheduler workflow (1 is the highest; unset, as on actions,
#: is 3). Its workflow tasks and activities (syncs, dispatches) are the admission path of
#: every action of the tenant, a few per hundred actions; in the control plane's queues
#: (the sticky one of the worker included) they go ahead of the actions' own tasks, which
#: under load were seen to hold them back by up to ~1-2 s (issue #26,
#: ``bench/trace_admission.py``).
SCHEDULER_PRIORITY_KEY = 1


def scheduler_priority(tenant: str) -> Priority:
    """A scheduler workflow's priority: ``SCHEDULER_PRIORITY_KEY``, within its tenant's
    fairness key (``tenant_priority``)."""
    from temporalio.common import Priority

    return Priority(priority_key=SCHEDULER_PRIORITY_KEY, fairness_key=tenant[:64])


#: Dynamic config a Temporal server needs for ``tenant_priority`` to act (the dev servers
#: Headway starts pass it; on a self-hosted cluster, set it in its dynamic config).
SERVER_DYNAMIC_CONFIG: tuple[str, ...] = ("matching.enableFairness=true",)


# Search attributes Headway registers on the server (name -> Temporal type) so the Web UI
# lists and filters actions by queue, cluster, state and last reason.
SEARCH_ATTRIBUTES: dict[str, str] = {
    "HeadwayQueue": "Keyword",
    "HeadwayCluster": "Keyword",
    "HeadwayState": "Keyword",
    "HeadwayReason": "Keyword",
    "HeadwayTenant": "Keyword",
    "HeadwayRun": "Keyword",
    # Every reason the action waited for (or was rejected with), set at admission and
    # kept once it ended: `HeadwayReasons = 'HeldForGang'` finds finished actions too.
    "HeadwayReasons": "KeywordList",
}


# --- pod shapes on the wire -------------------------------------------------------------


@dataclass
class PodSpec:
    """One pod of an action, as the cluster worker creates it.

    Quantities are canonical integers: CPU in millicores, memory and ephemeral storage in
    bytes. ``gpu_type`` is None for an untyped GPU request.
    """

    role: str  # "main", "worker", "ray-head", "ray-worker", "spark-driver", "spark-executor"
    index: int
    cpu_m: int = 0
    memory: int = 0
    ephemeral_storage: int = 0
    gpu: int = 0
    gpu_type: str | None = None
    image: str = "busybox"
    command: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)


@dataclass
class Toleration:
    """A pod toleration: ``key`` (empty with ``Exists``: every taint), ``operator``
    ``Exists`` or ``Equal`` (with ``value``), ``effect`` (empty: every effect)."""

    key: str = ""
    operator: str = "Exists"
    value: str = ""
    effect: str = ""


@dataclass
class SecretEnv:
    """Environment from a Secret: its one ``key`` as the variable of that name, or every
    key of it when ``key`` is None (``envFrom``)."""

    secret: str
    key: str | None = None


@dataclass
class Volume:
    """A volume mounted into the pod's container: ``kind`` one of ``pvc`` (a
    PersistentVolumeClaim), ``configmap``, ``secret`` (``source`` names it) or
    ``emptydir`` (``source`` empty)."""

    kind: str
    source: str
    mount_path: str
    read_only: bool = False


@dataclass
class KubeOptions:
    """What a Kubernetes user sets per action beyond resources, image and command
    (issue #22). Every field is optional; the simulated backend ignores them.
    ``shm_size`` is bytes of memory-backed ``/dev/shm``. Checked by
    ``headway.sdk.kube.kube_options`` (the CLI's flags and the SDK's arguments)."""

    args: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    env_from_secrets: list[SecretEnv] = field(default_factory=list)
    labels: dict[str, str] = field(default_factory=dict)
    annotations: dict[str, str] = field(default_factory=dict)
    tolerations: list[Toleration] = field(default_factory=list)
    node_selector: dict[str, str] = field(default_factory=dict)
    priority_class: str | None = None
    service_account: str | None = None
    volumes: list[Volume] = field(default_factory=list)
    shm_size: int | None = None


class GangKind(StrEnum):
    """How the pods of one action relate to each other."""

    SINGLE = "single"
    REPLICAS = "replicas"  # clustered training: replicas x container, torchrun rendezvous
    RAY = "ray"
    SPARK = "spark"


@dataclass
class DispatchRequest:
    """What the control plane asks a cluster worker to run (one admitted action)."""

    tenant: str
    action_id: str
    workflow_id: str
    cluster: str
    kind: GangKind
    pods: list[PodSpec]
    duration_s: float | None = None  # simulated backend: how long the pods "run"
    # Optional fault injection for the simulated backend (demos and tests):
    # "oom", "preempt", "node-lost", "image-pull", "fail".
    inject: str | None = None
    namespace: str = "default"
    # The nodes the scheduler's best-fit projection chose for the pods: on Kubernetes
    # the pods are constrained to them (required node affinity), so the in-cluster
    # scheduler binds a gang where the admission counted it.
    node_hints: list[str] = field(default_factory=list)
    #: The action's queue: a cluster worker may map it to a pod namespace.
    queue: str = ""
    #: Per-action Kubernetes options (None: none given).
    kube: KubeOptions | None = None
    #: Revision 5+: the worker checks the admission against its live view before it
    #: creates anything and, when the pods no longer fit, hands it back (returns a
    #: ``CapacityChanged`` event) instead of leaving them pending. False (older
    #: workflows, which cannot requeue): it creates the pods as before.
    handback: bool = False


class ActionEventKind(StrEnum):
    """What the informers saw happen to an action's pods."""

    SCHEDULED = "Scheduled"
    RUNNING = "Running"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"
    OOM_KILLED = "OOMKilled"
    PREEMPTED = "Preempted"  # pushed out for a higher-priority pod
    #: Evicted by the kubelet (node pressure) or the eviction API (a drain): the work was
    #: lost through no fault of its own, retried as ``lost`` like a preemption.
    EVICTED = "Evicted"
    NODE_LOST = "NodeLost"
    #: A pod an earlier attempt created is gone (deleted while no worker watched): the
    #: work is reported lost, never created again (exactly once on the cluster).
    POD_LOST = "PodLost"
    IMAGE_PULL_FAILED = "ImagePullFailed"
    UNSCHEDULABLE = "Unschedulable"
    #: Decided by the control plane, never reported by a worker: the pods were not all
    #: running within the queue's ``ready_timeout`` after dispatch (deleted since).
    NOT_READY = "NotReady"
    #: The cluster worker, the final arbiter of its cluster, found that the admitted pods
    #: no longer fit its live view (room taken, a node cordoned, tainted or NotReady) and
    #: created nothing; or no worker of the cluster took the dispatch in time. The action
    #: goes back to its queue at its place (revision 5+). Returned by ``run_action``,
    #: never signalled.
    CAPACITY_CHANGED = "CapacityChanged"


#: Event kinds after which the action is over.
TERMINAL_EVENTS = frozenset(
    {
        ActionEventKind.SUCCEEDED,
        ActionEventKind.FAILED,
        ActionEventKind.OOM_KILLED,
        ActionEventKind.PREEMPTED,
        ActionEventKind.EVICTED,
        ActionEventKind.NODE_LOST,
        ActionEventKind.POD_LOST,
        ActionEventKind.IMAGE_PULL_FAILED,
    }
)


@dataclass
class ActionEvent:
    """One informer-derived event, reported to the action's workflow by signal."""

    action_id: str
    kind: ActionEventKind
    cluster: str
    pod: str | None = None
    node: str | None = None
    exit_code: int | None = None
    message: str = ""
    observed_at: float = 0.0  # unix seconds at the cluster worker when it saw it
    #: What the action's code returned (SDK tasks): a JSON document, on its terminal
    #: event only (``headway.sdk.run`` writes it; None for actions that run no SDK code).
    output: str | None = None


@dataclass
class NodeCapacity:
    """One node as a cluster worker sees it: allocatable and free (allocatable minus the
    requests of non-terminal pods). Canonical integer units as in PodSpec."""

    name: str
    cpu_m: int
    memory: int
    ephemeral_storage: int = 0
    gpu: int = 0
    gpu_type: str | None = None
    free_cpu_m: int = 0
    free_memory: int = 0
    free_ephemeral_storage: int = 0
    free_gpu: int = 0
    #: Why the node takes no new pods ("" it does): it is then reported with nothing
    #: free, in the kube-scheduler's words (``node(s) were unschedulable``, ``node(s)
    #: had untolerated taint {nvidia.com/gpu: present}``, ``node(s) were not ready``).
    unusable: str = ""


@dataclass
class CapacityReport:
    """A cluster worker's view of its cluster, sent to the shard scheduler when it changes.

    ``nodes`` is None when the worker cannot read nodes: capacity unknown ("unknown means
    open"). ``reflected_actions`` names the admitted actions whose pods the report already
    counts, so the scheduler subtracts only the reservations it does not yet reflect.

    ``incarnation`` identifies the worker process that sent it (a new value each start)
    and ``started_at`` when that process started: a restarted worker numbers its
    ``sequence`` from 1 again, so the scheduler orders reports by (incarnation start,
    sequence) and a newer incarnation's reports always win over an older one's.
    """

    cluster: str
    nodes: list[NodeCapacity] | None
    reflected_actions: list[str] = field(default_factory=list)
    sequence: int = 0
    observed_at: float = 0.0
    incarnation: str = ""
    started_at: float = 0.0
    #: The tenant of each of ``reflected_actions`` ("" not known), as a backend reports
    #: them; a worker serving several tenants sends each only its own (action ids are
    #: a tenant's own: another tenant's "train-1" is another action).
    reflected_tenants: list[str] = field(default_factory=list)


def report_for(report: CapacityReport, tenant: str) -> CapacityReport:
    """``report`` as one tenant's scheduler gets it: the same nodes (every pod counts,
    any tenant's or none), and of the reflected actions only that tenant's (or those of
    no known tenant)."""
    if not report.reflected_tenants:
        return report
    mine = [
        a
        for a, t in zip(report.reflected_actions, report.reflected_tenants, strict=True)
        if not t or t == tenant
    ]
    return dataclasses.replace(report, reflected_actions=mine, reflected_tenants=[])


# --- workflow / activity / signal names -------------------------------------------------
# The control plane (workflows/) and the cluster workers (worker/, activities/cluster*)
# meet only through these names and the dataclasses in this module.

ACTION_WORKFLOW = "ActionWorkflow"

#: Revision of ActionWorkflow's code path that new submissions ask for (carried in
#: ``SubmitRequest.revision``). Revision 1 takes the lean-publish and admit-in-first-task
#: paths without ``workflow.patched`` calls: each patch call records a marker and upserts
#: ``TemporalChangeVersion`` (one more visibility write per action, per patch). Inputs
#: recorded before the field existed decode as revision 0 and replay through the patches.
#: Revision 2 starts without search attributes and writes them once in the first task.
#: Revision 3 keeps the first outcome the workflow hears (a retried ``run_action`` that
#: finds the pods deleted after they ended does not turn success into PodLost).
#: Revision 4 retries by failure class (the queue's ``retry`` policy): each attempt after
#: the first is a lease and a dispatch of its own, as ``<action_id>~<n>`` (issue #23).
#: Revision 5 lets the cluster worker hand an admission back (``DispatchRequest.handback``,
#: ``CapacityChanged``): the action returns to its queue at its place without using its
#: retry budget; and a dispatch no worker takes up in time is handed back too (#22).
ACTION_REVISION = 5
SCHEDULER_WORKFLOW = "SchedulerWorkflow"

#: Cluster-local activity, on ``cluster_task_queue(cluster)``: creates the action's pods
#: idempotently (adopting pods a predecessor created), reports every informer event to the
#: action workflow by the ``ACTION_EVENT_SIGNAL`` signal as it happens, heartbeats while the
#: pods live, and returns the terminal ActionEvent. Cancelling it deletes the pods.
RUN_ACTION_ACTIVITY = "headway.cluster.run_action"
#: Cluster-local activity: delete whatever is left of an action's pods (idempotent).
DELETE_ACTION_ACTIVITY = "headway.cluster.delete_action"

#: Signal on the action workflow, payload ActionEvent.
ACTION_EVENT_SIGNAL = "action_event"
#: Signal on the action workflow from the scheduler (via the dispatch activity), payload
#: Admission.
ADMIT_SIGNAL = "admit"
#: Signal on the scheduler workflow, payload CapacityReport.
CAPACITY_SIGNAL = "capacity_report"
#: Update on the scheduler workflow, payload a QueueSpec.to_dict() dict; returns the dict.
UPSERT_QUEUE_UPDATE = "upsert_queue"
#: Update on the scheduler workflow: {"name": ..., "changes": {...}}; returns the dict.
UPDATE_QUEUE_UPDATE = "update_queue"
#: Update on the scheduler workflow: an OrgLimits.to_dict() dict.
SET_ORG_UPDATE = "set_org"
#: Update on the scheduler workflow: {"name": ...}; removes an empty queue.
REMOVE_QUEUE_UPDATE = "remove_queue"
#: Update on the scheduler workflow: a ClusterSpec.to_dict() dict (+ "by"); adds a cluster
#: to the tenant's fleet or replaces its declared shape. Returns the dict as applied.
REGISTER_CLUSTER_UPDATE = "register_cluster"
#: Update on the scheduler workflow: an EnvironmentSpec.to_dict() dict (a reusable
#: environment, declared by the SDK at its first submit); returns the dict.
DECLARE_ENVIRONMENT_UPDATE = "declare_environment"


@dataclass
class DemandRequest:
    """An action's infrastructure as declared by the user (scenario-file notation).

    Exactly one of ``resources`` (one pod, or ``replicas`` x container), ``ray`` or
    ``spark`` is set; the scheduler core computes the demand from it once, at enqueue.
    Values use Kubernetes quantity notation: ``{"cpu": "500m", "memory": "64Gi",
    "gpu": "H200:8"}``.
    """

    resources: dict[str, str | int | float] | None = None
    replicas: int | None = None
    ray: dict[str, object] | None = None
    spark: dict[str, object] | None = None


@dataclass
class SubmitRequest:
    """Input of ActionWorkflow: one action, submitted by the CLI or the SDK."""

    action_id: str
    queue: str
    demand: DemandRequest
    tenant: str = DEFAULT_TENANT
    run: str = ""
    task: str = ""
    estimate_s: float | None = None
    environment: str | None = None
    image: str = "busybox"
    command: list[str] = field(default_factory=list)
    duration_s: float | None = None  # simulated backend: how long it runs
    inject: str | None = None  # simulated backend fault injection
    labels: dict[str, str] = field(default_factory=dict)
    #: Per-action Kubernetes options (pod labels, env, volumes, ...); None: none given.
    kube: KubeOptions | None = None
    #: Which code path the workflow takes (``ACTION_REVISION``; 0 = recorded before
    #: revisions existed). Part of the input, so replay always takes the same path.
    revision: int = 0


@dataclass
class Admission:
    """The scheduler's decision to start an action, delivered to its workflow."""

    action_id: str
    cluster: str
    node_hints: list[str] = field(default_factory=list)
    decided_at: float = 0.0
    reasons: list[str] = field(default_factory=list)
    #: The queue's ``ready_timeout`` (seconds) when it has one: every pod must run that
    #: long after dispatch, or the attempt ends ``NotReady`` (revision 4+).
    ready_timeout: float | None = None
