"""The gates: the checks an action passes before any fit (``_gate``, in the order of
``GATES``), and what may run in a reserved gap (``_allowed``, ``_use_up``).

``GATES`` is the gates' one ordered table: each gate's reason, the limit that turns it
on, and what of the ground truth it reads. ``_gate`` is that table written out inline
(it runs for every decision), and the index layer's predicates over it (``_reads_running``
here; ``run_gates`` in ``cycle._visit`` and ``index.still._classes_as_now``; ``gated`` in
``index.classes._walk``) are too: ``tests/scheduler/policy/test_gates.py`` holds them to
the table.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..common import _INF
from ..policy.backfill import _joint_extra
from ..reasons import Reason

if TYPE_CHECKING:
    from ..common import _Reservation
    from ..core import Scheduler
    from ..fit import ClusterState, Runs
    from ..model import QueueSpec
    from ..resources import Usage
    from ..truth import _Action, _Queue


@dataclass(frozen=True, slots=True)
class Gate:
    """One gate: the ``Reason`` it gives, the limit that turns it on (a field of
    ``QueueSpec`` for ``scope`` "queue", of ``OrgLimits`` for "org"), and what it reads:
    "running" (the queue's or the org's running actions), "runs" (their runs, with the
    action's own), "usage" (the queue's in-flight resources, with the action's demand)."""

    reason: Reason
    limit: str
    scope: str
    reads: frozenset[str]


#: The gates in the order they are asked (``reasons.GATE_ORDER`` but for the fit): the
#: first that fails is the action's reason.
GATES: tuple[Gate, ...] = (
    Gate(Reason.ActionConcurrency, "action_concurrency", "queue", frozenset({"running"})),
    Gate(Reason.RunConcurrency, "run_concurrency", "queue", frozenset({"runs"})),
    Gate(Reason.PerRunConcurrency, "per_run_concurrency", "queue", frozenset({"runs"})),
    Gate(Reason.MaxResources, "max_resources", "queue", frozenset({"usage"})),
    Gate(Reason.OrgConcurrentActions, "max_concurrent_actions", "org", frozenset({"running"})),
    Gate(Reason.OrgConcurrentRuns, "max_concurrent_runs", "org", frozenset({"runs"})),
)


def _reads_running(spec: QueueSpec) -> bool:
    """Do the queue's gates read its running work (count, runs, resources)?"""
    return (
        spec.action_concurrency is not None
        or spec.run_concurrency is not None
        or spec.per_run_concurrency is not None
        or spec.max_resources is not None
    )


def _gate(self: Scheduler, q: _Queue, a: _Action, demand: Usage) -> Reason | None:
    spec = q.spec
    if spec.action_concurrency is not None and q.running >= spec.action_concurrency:
        return Reason.ActionConcurrency
    rc = q.run_counts
    if spec.run_concurrency is not None and a.run not in rc and len(rc) >= spec.run_concurrency:
        return Reason.RunConcurrency
    if spec.per_run_concurrency is not None and rc.get(a.run, 0) >= spec.per_run_concurrency:
        return Reason.PerRunConcurrency
    if spec.max_resources is not None and spec.max_resources.exceeded_by(q.usage, demand):
        return Reason.MaxResources
    org = self.org
    if org.max_concurrent_actions is not None and self.org_running >= org.max_concurrent_actions:
        return Reason.OrgConcurrentActions
    if (
        org.max_concurrent_runs is not None
        and a.run not in self.org_run_counts
        and len(self.org_run_counts) >= org.max_concurrent_runs
    ):
        return Reason.OrgConcurrentRuns
    return None


def _allowed(
    self: Scheduler,
    a: _Action,
    now: float,
    rs: list[_Reservation],
    runs: Runs,
    c: ClusterState,
) -> list[_Reservation] | None:
    """May ``a`` start on a cluster under reservations ``rs``?

    Returns None if not; else the reservations whose EASY extra it must use up
    (empty: none).
    """
    if a.spec.estimate is None:
        self._vhist = True  # an estimate from the task's history
    est = self.estimate(a.task, a.spec.estimate)
    if est is None:
        return None
    end = now + est
    need: list[_Reservation] = []
    for r in rs:
        if end <= r.time:
            # Allowed until the action would no longer be gone by the reservation.
            h = r.time - est
            if h < self._horizon:
                self._horizon = h
            vhz = self._vhz
            if h < vhz.get(c.name, _INF):
                vhz[c.name] = h
            continue
        if r.extra is None:
            return None
        need.append(r)
    if not need or not runs:
        return need if runs else []
    if c.place(runs, commit=False, limit=_joint_extra(need)) is None:
        return None
    return need


def _use_up(r: _Reservation, runs: Runs, nodes: list[int]) -> None:
    """An admission under ``r`` takes ``nodes`` out of its EASY extra."""
    x = r.extra
    assert x is not None
    if r.shared:
        r.extra = x = x.clone()
        r.shared = False
    x.take(runs, nodes)
