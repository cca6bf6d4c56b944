"""The gates: the checks an action passes before any fit (``_gate``, in the order of
``GATES``), and what may run in a reserved gap (``gap_allows``, ``_use_up``).

``GATES`` is the gates' one ordered table: each gate's reason, the limit that turns it
on, what of the ground truth it reads, and its check. ``_gate`` asks the table in order;
what the index layer needs to know of the gates is read off the same table
(``gates_on``, ``_any_gate_on``, ``_reads_running``, ``_org_gated``, ``_reads_runs``),
so a gate added to it is asked and accounted for everywhere.
``tests/scheduler/policy/test_gates.py`` holds the table to the reasons' order and to
the queue knobs.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..common import _INF
from ..policy.backfill import _joint_extra
from ..reasons import Reason

if TYPE_CHECKING:
    from ..common import _Reservation
    from ..core import Scheduler
    from ..fit import ClusterState, Runs
    from ..model import OrgLimits, QueueSpec
    from ..resources import Quota, Usage
    from ..truth import _Action, _Queue


# A gate's check: does action ``a`` (of queue ``q``, its demand ``demand``) fail it,
# with the gate's limit set to ``limit``?
Check = Callable[["Scheduler", "_Queue", "_Action", "Usage", Any], bool]


@dataclass(frozen=True, slots=True)
class Gate:
    """One gate: the ``Reason`` it gives, the limit that turns it on (a field of
    ``QueueSpec`` for ``scope`` "queue", of ``OrgLimits`` for "org"), what it reads:
    "running" (the queue's or the org's running actions), "runs" (their runs, with the
    action's own), "usage" (the queue's in-flight resources, with the action's demand),
    and its check (``fails``), asked only when the limit is set."""

    reason: Reason
    limit: str
    scope: str
    reads: frozenset[str]
    fails: Check
    of_org: bool = field(init=False)  # scope "org" (read in ``_gate``, for every decision)

    def __post_init__(self) -> None:
        object.__setattr__(self, "of_org", self.scope == "org")

    def limit_in(self, spec: QueueSpec, org: OrgLimits) -> Any:
        """The gate's limit for a queue of ``spec`` under ``org`` (None: off)."""
        return getattr(org if self.of_org else spec, self.limit)


def _action_concurrency(s: Scheduler, q: _Queue, a: _Action, demand: Usage, n: int) -> bool:
    return q.running >= n


def _run_concurrency(s: Scheduler, q: _Queue, a: _Action, demand: Usage, n: int) -> bool:
    rc = q.run_counts
    return a.run not in rc and len(rc) >= n


def _per_run_concurrency(s: Scheduler, q: _Queue, a: _Action, demand: Usage, n: int) -> bool:
    return q.run_counts.get(a.run, 0) >= n


def _max_resources(s: Scheduler, q: _Queue, a: _Action, demand: Usage, quota: Quota) -> bool:
    return quota.exceeded_by(q.usage, demand)


def _org_actions(s: Scheduler, q: _Queue, a: _Action, demand: Usage, n: int) -> bool:
    return s.org_running >= n


def _org_runs(s: Scheduler, q: _Queue, a: _Action, demand: Usage, n: int) -> bool:
    rc = s.org_run_counts
    return a.run not in rc and len(rc) >= n


#: The gates in the order they are asked (``reasons.GATE_ORDER`` but for the fit): the
#: first that fails is the action's reason.
GATES: tuple[Gate, ...] = (
    Gate(
        Reason.ActionConcurrency,
        "action_concurrency",
        "queue",
        frozenset({"running"}),
        _action_concurrency,
    ),
    Gate(Reason.RunConcurrency, "run_concurrency", "queue", frozenset({"runs"}), _run_concurrency),
    Gate(
        Reason.PerRunConcurrency,
        "per_run_concurrency",
        "queue",
        frozenset({"runs"}),
        _per_run_concurrency,
    ),
    Gate(Reason.MaxResources, "max_resources", "queue", frozenset({"usage"}), _max_resources),
    Gate(
        Reason.OrgConcurrentActions,
        "max_concurrent_actions",
        "org",
        frozenset({"running"}),
        _org_actions,
    ),
    Gate(Reason.OrgConcurrentRuns, "max_concurrent_runs", "org", frozenset({"runs"}), _org_runs),
)
_QUEUE_GATES = tuple(g for g in GATES if g.scope == "queue")
_ORG_GATES = tuple(g for g in GATES if g.scope == "org")
_RUNS_GATES = tuple(g for g in GATES if "runs" in g.reads)


def gates_on(spec: QueueSpec, org: OrgLimits) -> list[Gate]:
    """The gates whose limit is set for a queue of ``spec`` under ``org``, in order."""
    return [g for g in GATES if g.limit_in(spec, org) is not None]


def _reads_running(spec: QueueSpec) -> bool:
    """Do the queue's gates read its running work (count, runs, resources)? (Every
    queue gate does: an action's end revisits its queue when one is set.)"""
    return any(getattr(spec, g.limit) is not None for g in _QUEUE_GATES)


def _org_gated(org: OrgLimits) -> bool:
    """Is a tenant-wide gate set (so that every queue's answers read the org's running
    work, and an admission anywhere may change them)?"""
    return any(getattr(org, g.limit) is not None for g in _ORG_GATES)


def _reads_runs(spec: QueueSpec, org: OrgLimits) -> bool:
    """Does a gate set for the queue read the runs (so that an action's run is part of
    what its answer depends on)?"""
    return any(getattr(org if g.of_org else spec, g.limit) is not None for g in _RUNS_GATES)


def _any_gate_on(spec: QueueSpec, org: OrgLimits) -> bool:
    """Is any gate set for a queue of ``spec`` under ``org``? (``gates_on``, without
    making the list: asked once per visit.)"""
    return any(getattr(org if g.of_org else spec, g.limit) is not None for g in GATES)


def _gate(self: Scheduler, q: _Queue, a: _Action, demand: Usage) -> Reason | None:
    """The first gate of ``GATES`` that ``a`` fails, or None."""
    spec = q.spec
    org = self.org
    for g in GATES:
        limit = getattr(org if g.of_org else spec, g.limit)
        if limit is not None and g.fails(self, q, a, demand, limit):
            return g.reason
    return None


def gap_allows(
    est: float, now: float, rs: list[_Reservation], runs: Runs, c: ClusterState
) -> tuple[list[_Reservation] | None, float]:
    """May an action of estimate ``est`` start on ``c`` now under reservations ``rs``?

    The answer (None: no; else the reservations whose EASY extra it must use up, empty:
    none), and until when on the clock it stands (the earliest time, among the
    reservations it would be gone by, at which it would no longer be: ``_INF`` if none).
    """
    end = now + est
    until = _INF
    need: list[_Reservation] = []
    for r in rs:
        if end <= r.time:
            # Allowed until the action would no longer be gone by the reservation.
            if r.time - est < until:
                until = r.time - est
            continue
        if r.extra is None:
            return None, until
        need.append(r)
    if not need or not runs:
        return (need if runs else []), until
    if c.place(runs, commit=False, limit=_joint_extra(need)) is None:
        return None, until
    return need, until


def _use_up(r: _Reservation, runs: Runs, nodes: list[int]) -> None:
    """An admission under ``r`` takes ``nodes`` out of its EASY extra."""
    x = r.extra
    assert x is not None
    if r.shared:
        r.extra = x = x.clone()
        r.shared = False
    x.take(runs, nodes)
