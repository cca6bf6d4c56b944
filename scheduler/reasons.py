"""Why an action is where it is: machine-readable reasons, each documented.

Every decision the gate makes is recorded on the action as one of these PascalCase
constants, so "why isn't my run moving?" is answered by the state machine that schedules
the work. A reason is data returned by the pass, never an exception. ``describe`` gives
the human message.
"""

from __future__ import annotations

from enum import StrEnum

__all__ = ["GATE_ORDER", "SUBMIT_REASONS", "Reason", "describe"]


class Reason(StrEnum):
    """Reasons an action was rejected at submission or held back in a pass."""

    # --- submission (the action is rejected, never admitted) -------------------------
    QueueDraining = "QueueDraining"
    """The queue is draining or drained and accepts no new work."""
    QueueDepthExceeded = "QueueDepthExceeded"
    """The queue already holds ``depth`` actions (waiting plus running): backpressure."""
    RateLimited = "RateLimited"
    """The tenant's submit-rate token bucket is empty."""
    FanOutExceeded = "FanOutExceeded"
    """The run already has ``max_actions_per_run`` accepted actions."""
    Unschedulable = "Unschedulable"
    """The demand alone exceeds the queue's ``max_resources``, or no cluster the queue may
    use has node shapes that could hold every pod even when empty."""
    UnknownQueue = "UnknownQueue"
    """The action names a queue that does not exist."""

    # --- expiry (an accepted action is rejected while it waits) ----------------------
    QueuedTooLong = "QueuedTooLong"
    """The action waited its queue's ``max_queued_time`` without starting: it is rejected
    and its place in the queue released. Raising the queue's limit, or resubmitting when
    the queue is shorter (or on a queue with more room), lets it run."""

    # --- gates, in the order they are checked each pass ------------------------------
    ActionConcurrency = "ActionConcurrency"
    """The queue already runs ``action_concurrency`` actions."""
    RunConcurrency = "RunConcurrency"
    """The queue already runs actions of ``run_concurrency`` runs, and not of this run."""
    PerRunConcurrency = "PerRunConcurrency"
    """This run already runs ``per_run_concurrency`` actions in this queue."""
    MaxResources = "MaxResources"
    """The queue's in-flight demand plus this action's would exceed ``max_resources``."""
    OrgConcurrentActions = "OrgConcurrentActions"
    """The tenant already runs ``max_concurrent_actions`` actions across its queues."""
    OrgConcurrentRuns = "OrgConcurrentRuns"
    """The tenant already runs actions of ``max_concurrent_runs`` runs, not of this run."""
    NoClusterCapacity = "NoClusterCapacity"
    """No eligible cluster (in the selector, healthy) has room with a node for every pod."""
    HeldForGang = "HeldForGang"
    """Room exists, but a blocked gang head holds it (``strict``), or this action is behind
    the blocked head of its own strict queue."""
    BackfillWindow = "BackfillWindow"
    """Room exists on a cluster reserved for a blocked head, and this action would not be
    gone by the reservation (nor fit in EASY's extra)."""
    EnvironmentBusy = "EnvironmentBusy"
    """The warm environment the action runs in is at ``replicas x concurrency``."""
    # --- the cluster: health, and the cluster worker as the final arbiter -------------
    ClusterDown = "ClusterDown"
    """Every cluster the queue may use is down: its worker has not been heard from for the
    control plane's silence interval (``--cluster-silent``, 90 s by default), or it was
    marked unhealthy. Nothing is dispatched there; the cluster is up again with its
    worker's next capacity report (its running actions are adopted). Restarting the
    cluster's worker, or letting the queue use another cluster, unblocks it."""
    CapacityChanged = "CapacityChanged"
    """The cluster worker, the final arbiter of its cluster, handed the admission back
    before creating anything: the pods no longer fit its live view (another tenant's or a
    non-Headway pod took the room, a node went, was cordoned, tainted or NotReady), or no
    worker of the cluster took the dispatch in time. The action is back in its queue at
    its place (its first submit time), its reservation released, no retry used, and its
    scheduler has a fresh report. Room coming back on that cluster, or another cluster
    the queue may use with room, lets it start; after 5 hand-backs it ends failed."""
    SchedulerError = "SchedulerError"
    """Deciding about this action made the scheduler's pass fail even after the shard
    rebuilt its state; the action was failed alone so that the rest of the tenant's work
    goes on. A bug in Headway: the scheduler workflow's log has the error."""


SUBMIT_REASONS = (
    Reason.QueueDraining,
    Reason.QueueDepthExceeded,
    Reason.RateLimited,
    Reason.FanOutExceeded,
    Reason.Unschedulable,
)

GATE_ORDER = (
    Reason.ActionConcurrency,
    Reason.RunConcurrency,
    Reason.PerRunConcurrency,
    Reason.MaxResources,
    Reason.OrgConcurrentActions,
    Reason.OrgConcurrentRuns,
    Reason.NoClusterCapacity,
)


def describe(reason: Reason | str) -> str:
    """The human message for a reason (its documentation's first sentence)."""
    try:
        r = Reason(reason)
    except ValueError:
        return str(reason)
    return _DOCS.get(r, r.value)


_DOCS: dict[Reason, str] = {
    Reason.QueueDraining: "the queue is draining or drained and accepts no new work",
    Reason.QueueDepthExceeded: "the queue is at its depth limit (waiting + running)",
    Reason.RateLimited: "the tenant's submit rate limit is exhausted",
    Reason.FanOutExceeded: "the run reached the tenant's per-run fan-out limit",
    Reason.Unschedulable: "the demand can never fit this queue's quota or any allowed cluster",
    Reason.UnknownQueue: "no such queue",
    Reason.QueuedTooLong: "the action waited its queue's max_queued_time without starting",
    Reason.ActionConcurrency: "the queue is at its action concurrency",
    Reason.RunConcurrency: "the queue is at its run concurrency",
    Reason.PerRunConcurrency: "this run is at the queue's per-run concurrency",
    Reason.MaxResources: "the queue's max_resources quota would be exceeded",
    Reason.OrgConcurrentActions: "the tenant is at its concurrent-action limit",
    Reason.OrgConcurrentRuns: "the tenant is at its concurrent-run limit",
    Reason.NoClusterCapacity: "no eligible cluster has room for every pod now",
    Reason.HeldForGang: "room exists but is held for a blocked gang at the head",
    Reason.BackfillWindow: "room exists but is reserved for a blocked head and this would"
    " not finish before it",
    Reason.EnvironmentBusy: "the warm environment is fully busy",
    Reason.ClusterDown: "every cluster this queue may use is down (its worker is silent)",
    Reason.CapacityChanged: "the cluster worker handed the admission back: the pods no longer"
    " fit its live view; back in its queue at its place",
    Reason.SchedulerError: "deciding about this action failed the scheduler's pass (a bug:"
    " see the scheduler workflow's log); it was failed alone",
}
