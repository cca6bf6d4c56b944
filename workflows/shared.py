"""Control-plane-internal contracts between the two workflows and their activities.

Unlike ``protocol`` (what cluster workers see), these never leave the control-plane
worker: the action workflow, the scheduler workflow and the store/dispatch activities all
run in it. Plain dataclasses that Temporal's JSON converter round-trips.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from headway.protocol import Admission

__all__ = [
    "CONFIG_ACTIVITY",
    "CONFIG_HISTORY_ACTIVITY",
    "DEFAULT_CLUSTER_SILENT_S",
    "DISPATCH_ACTIVITY",
    "DONE_CHANNEL",
    "FINISH_LEASE_ACTIVITY",
    "FLEET_ACTIVITY",
    "HEALTH",
    "NUDGE_SIGNAL",
    "PUT_LEASE_ACTIVITY",
    "PUT_LEASE_WAIT_ACTIVITY",
    "REJECT_SIGNAL",
    "REQUEUE_LEASE_ACTIVITY",
    "RETRY_POLICY_ACTIVITY",
    "SET_DOOR_ACTIVITY",
    "SYNC_ACTIVITY",
    "AdmitItem",
    "DispatchBatch",
    "DispatchResult",
    "DoorInput",
    "FinishLeaseInput",
    "Health",
    "PutLeaseInput",
    "PutLeaseOutput",
    "RejectItem",
    "Rejection",
    "RequeueLeaseInput",
    "SchedulerInput",
    "SyncInput",
    "SyncOutput",
]

#: Activity names (implementations in ``headway.activities.store`` / ``.dispatch``).
PUT_LEASE_ACTIVITY = "headway.store.put_lease"
#: put_lease, then wait briefly for the admission in-process (see ``PutLeaseInput.wait_s``).
PUT_LEASE_WAIT_ACTIVITY = "headway.store.put_lease_wait"
FINISH_LEASE_ACTIVITY = "headway.store.finish_lease"
#: End one attempt's lease and put the next attempt's, one transaction, no door.
REQUEUE_LEASE_ACTIVITY = "headway.store.requeue_lease"
#: A queue's retry policy as stored (``RetryPolicy.to_dict()``; the default if none).
RETRY_POLICY_ACTIVITY = "headway.store.retry_policy"
SYNC_ACTIVITY = "headway.store.sync"
#: The scheduler's door settings into the store (``LeaseStore.set_door``), after a change.
SET_DOOR_ACTIVITY = "headway.store.set_door"
DISPATCH_ACTIVITY = "headway.control.dispatch"
FLEET_ACTIVITY = "headway.control.fleet"
#: A scheduler starting afresh reads its tenant's stored configuration (queues, org).
CONFIG_ACTIVITY = "headway.store.config"
#: The audit trail of a queue or of the org limits (``ConfigHistoryWorkflow``).
CONFIG_HISTORY_ACTIVITY = "headway.store.config_history"

#: Store flag channel of action ends (queue channels are ``q:<queue>``).
DONE_CHANNEL = "done"

#: Signal on the scheduler workflow, payload a channel name (``q:<queue>`` or ``done``):
#: "the store holds something new on this channel". Coalesced by the store's flags.
NUDGE_SIGNAL = "nudge"
#: Signal on an action workflow from the dispatch activity, payload Rejection.
REJECT_SIGNAL = "reject"


@dataclass
class Rejection:
    """The scheduler refused an action at submission (QueueDepthExceeded, ...)."""

    action_id: str
    reason: str
    message: str = ""
    decided_at: float = 0.0
    #: ``RateLimited`` at the door: seconds until a submission would pass (None: never,
    #: or another reason).
    retry_after: float | None = None


@dataclass
class SchedulerInput:
    """Input of SchedulerWorkflow.

    Attributes:
        tenant: the shard.
        fleet: ``ClusterSpec.to_dict()`` of the clusters known up front (fleet file), so
            the scheduler can place work before the first capacity report arrives.
        carried: state carried across continue-as-new (None on a fresh start).
        max_history: continue as new at the latest after this many history events
            (the server's suggestion usually comes first; tests lower it).
    """

    tenant: str
    fleet: list[dict[str, Any]] = field(default_factory=list)
    carried: dict[str, Any] | None = None
    max_history: int = 10_000
    #: Seconds of silence after which a cluster's worker is taken for gone (None: the
    #: scheduler's ``CLUSTER_SILENT_S``). In the input, so a run decides with one value
    #: however its worker is configured when it replays.
    cluster_silent_s: float | None = None


@dataclass
class Health:
    """How this control-plane process judges cluster health (``headway worker
    control-plane --cluster-silent``): the schedulers it starts or continues as new
    take it in their input; an action's dispatch waits this long for a word from its
    cluster before it is handed back."""

    cluster_silent_s: float | None = None  # None: DEFAULT_CLUSTER_SILENT_S

    def silent_s(self) -> float:
        return DEFAULT_CLUSTER_SILENT_S if self.cluster_silent_s is None else self.cluster_silent_s


#: A cluster whose worker has reported before and then says nothing for this long is
#: down (workers report on every change and at least every 30 s).
DEFAULT_CLUSTER_SILENT_S = 90.0
#: This process's settings (the control-plane worker sets them before it polls).
HEALTH = Health()


@dataclass
class PutLeaseInput:
    """Local activity input: record one pending lease (and nudge if needed)."""

    tenant: str
    action_id: str
    queue: str
    workflow_id: str
    spec: dict[str, Any]
    submitted_at: float
    #: ``put_lease_wait`` only: wait up to this long for the admission in-process.
    wait_s: float = 0.0


@dataclass
class PutLeaseOutput:
    """Result of ``put_lease_wait``: the admission if it came while waiting."""

    nudged: bool = False
    admission: Admission | None = None
    #: The door refused the submission: no lease was written (and nothing waited).
    rejection: Rejection | None = None


@dataclass
class DoorInput:
    """Local activity input: a tenant's door settings, as its scheduler has them now.

    ``rate``: the tenant's submit rate (``{"per_second", "burst"}``, None unlimited);
    ``queues``: per queue ``{"status", "depth", "rate"}`` (a queue left out has no door).
    ``config``: the whole configuration, stored with the door (``{"queues": {name:
    QueueSpec.to_dict()}, "org": OrgLimits.to_dict()}``, and by name ``"clusters"`` and
    ``"environments"`` when the run stores them; None: leave it as stored);
    ``audit``: the changes since the last push, one audit row each (``ConfigStore``).
    """

    tenant: str
    rate: dict[str, float] | None = None
    queues: dict[str, dict[str, Any]] = field(default_factory=dict)
    config: dict[str, Any] | None = None
    audit: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class FinishLeaseInput:
    """Local activity input: an action ended, was cancelled, or was rejected."""

    tenant: str
    action_id: str
    kind: str  # "finished" | "cancelled" | "rejected"
    #: What ran, for the record of finished actions (``headway.store.history.Finished``
    #: as a dict); None from workflows recorded before the record existed.
    record: dict[str, Any] | None = None


@dataclass
class RequeueLeaseInput:
    """Local activity input: attempt ``ended`` failed retryably; ``lease`` is the next
    attempt's (its own action id, the action's first submit time)."""

    ended: str
    lease: PutLeaseInput


@dataclass
class SyncInput:
    """Local activity input of the scheduler's refill (see ``LeaseStore.sync``)."""

    tenant: str
    token: str
    room: dict[str, int]
    default_room: int
    max_leases: int
    max_done: int
    forget: list[str] = field(default_factory=list)
    #: Whether work waits (sets the store's ``wants-ends``); None: leave it (older runs).
    wants_ends: bool | None = None
    #: Tokens of earlier syncs whose results may not be in the workflow's history yet:
    #: the ends they claimed stay in the store (``LeaseStore.sync``'s ``keep``).
    keep_claims: list[str] = field(default_factory=list)


@dataclass
class AdmitItem:
    """One admission and the workflow to signal."""

    workflow_id: str
    admission: Admission


@dataclass
class RejectItem:
    """One rejection and the workflow to signal."""

    workflow_id: str
    rejection: Rejection


@dataclass
class DispatchBatch:
    """Decisions of one or more passes, delivered by one dispatch activity call."""

    tenant: str
    admissions: list[AdmitItem] = field(default_factory=list)
    rejections: list[RejectItem] = field(default_factory=list)
    #: ``[action_id, workflow_id]`` of running actions the reaper wants checked: any whose
    #: workflow is no longer running comes back ``gone``.
    probe: list[list[str]] = field(default_factory=list)
    #: Signal nothing: hand each admission whose action still waits in its first workflow
    #: task on this worker over in-process, and return the others as ``unsent`` (the
    #: scheduler signals them by a regular dispatch, off its loop). Admissions only.
    hand_over_only: bool = False


@dataclass
class SyncOutput:
    """Result of the sync local activity (mirrors ``headway.store.SyncResult``)."""

    leases: list[dict[str, Any]] = field(default_factory=list)
    done: list[list[str]] = field(default_factory=list)
    more: list[str] = field(default_factory=list)
    more_done: bool = False


@dataclass
class DispatchResult:
    """Action ids whose workflows no longer exist (their reservations must be released),
    and (``DispatchBatch.hand_over_only``) those not handed over, to be signalled."""

    gone: list[str] = field(default_factory=list)
    unsent: list[str] = field(default_factory=list)
