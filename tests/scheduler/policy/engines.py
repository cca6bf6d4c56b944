"""The two engines a policy table runs against.

- ``incremental``: the core as it runs (``Scheduler``, every shortcut on);
- ``reference``: every scheduling cycle decided by ``scheduler/reference.py`` alone.
  ``ReferenceScheduler`` keeps the ground truth between cycles in a core, as the
  control plane would (submissions, completions, events, ``next_wakeup``), but its
  ``schedule`` asks ``reference_pass`` and then takes on the state the reference left
  (admissions, reasons, free capacity, environments, queue statuses): the core's own
  pass never runs. Its door and expiries are the core's, checked against the reference's
  answers (``reference_submit``, ``reference_expired``): a difference fails the test.

A table's expectations are worked out by hand from the spec, so each engine is held to
them on its own, not to the other.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from headway.scheduler import Scheduler, simulator
from headway.scheduler.core import Admitted, Expired
from headway.scheduler.model import ActionSpec
from headway.scheduler.reasons import Reason
from headway.scheduler.reference import (
    Decisions,
    estimate,
    reference_expired,
    reference_pass,
    reference_submit,
)
from headway.scheduler.scenario import load_scenario
from headway.scheduler.simulator import simulate

ENGINES = ("incremental", "reference")


class EngineMismatch(AssertionError):
    """The core's door or expiry answered otherwise than the reference's."""


def _after(before: Mapping[str, Any], ref: Decisions, now: float) -> dict[str, Any]:
    """``before`` (a core snapshot) with what the reference's cycle decided on it."""
    st = ref.state
    rows = {r[0]: r for r in before["waiting"]}
    was_running = {x[0][0]: x for x in before["running"]}
    admitted = {a.action_id: a for a in ref.admitted}
    waiting = []
    for w in st.waiting:
        row = list(rows[w.id])
        row[10], row[11] = list(w.reasons), w.last
        waiting.append(row)
    running = []
    for r in st.running:
        if r.id in was_running:
            running.append(was_running[r.id])
            continue
        # Admitted in this cycle: its reasons are those it had waited for; its last
        # reason is not observable once it runs (the core leaves it as it was).
        row = list(rows[r.id])
        row[10] = list(admitted[r.id].reasons)
        row[11] = row[10][-1] if row[10] else row[11]
        est = estimate(st, r.spec)
        running.append(
            [row, r.cluster, list(r.nodes), r.start, est, r.est_end, r.charged, r.instance]
        )
    clusters = []
    for c in before["clusters"]:
        free = st.clusters[c["spec"]["name"]].free
        clusters.append({**c, "free": [[f[d] for f in free] for d in range(4)]})
    unknown = dict(before.get("unknown_capacity_by_cluster") or {})
    for a in ref.admitted:
        if not st.clusters[a.cluster].known:
            unknown[a.cluster] = unknown.get(a.cluster, 0) + 1
    return {
        **before,
        "clusters": clusters,
        "queues": [q.to_dict() for q in st.queues.values()],
        "envs": [
            {
                "name": n,
                "cluster": i.cluster,
                "nodes": list(i.nodes),
                "queue": i.queue,
                "expires_at": i.expires_at,
            }
            for n, i in st.envs.items()
        ],
        "waiting": waiting,
        "running": running,
        "unknown_capacity_passes": st.unknown_capacity_passes,
        **({"unknown_capacity_by_cluster": unknown} if unknown else {}),
    }


class ReferenceDoor(Scheduler):
    """A core whose door (``submit``) and expiries (``expire_waiting``) are checked against
    the reference's answers (``reference_submit``, ``reference_expired``): a difference
    raises ``mismatch``. The part ``ReferenceScheduler`` here and ``CheckedScheduler``
    (``test_reference_differential``) share; each decides its cycles its own way."""

    mismatch: type[AssertionError] = EngineMismatch

    def submit(self, action: ActionSpec, now: float, *, door: bool = True) -> Reason | None:
        if not door:
            # (Taken in by the live door already: the reference decides at the door.)
            return super().submit(action, now, door=False)
        want = reference_submit(self.to_snapshot(), action, now)
        got = super().submit(action, now)
        if got != want:
            raise self.mismatch(f"submit {action.id} at {now}: core {got!r} != reference {want!r}")
        return got

    def expire_waiting(self, now: float) -> list[Expired]:
        want = reference_expired(self.to_snapshot(), now)
        got = super().expire_waiting(now)
        if [e.action_id for e in got] != want:
            raise self.mismatch(f"expired at {now}: core {got!r} != reference {want!r}")
        return got

    @classmethod
    def from_snapshot(cls, d: Mapping[str, Any], incremental: bool | None = None) -> Scheduler:
        s = Scheduler.from_snapshot(d, incremental)
        s.__class__ = cls
        return s


class ReferenceScheduler(ReferenceDoor):
    """A core whose every cycle is the reference's (see the module's docstring)."""

    def schedule(self, now: float) -> list[Admitted]:
        before = self.to_snapshot()
        ref = reference_pass(before, now)
        fresh = Scheduler.from_snapshot(_after(before, ref, now))
        self.__dict__.update(fresh.__dict__)
        return [Admitted(a.action_id, a.cluster, a.nodes, a.reasons) for a in ref.admitted]


@contextmanager
def on_engine(engine: str) -> Iterator[None]:
    """``simulate`` (and ``make_scheduler``) run on ``engine``."""
    if engine not in ENGINES:
        raise ValueError(f"engine: {engine!r} is not one of {ENGINES}")
    # (``simulate`` builds its scheduler by the name its module imported.)
    sim: Any = simulator
    old = sim.Scheduler
    if engine == "reference":
        sim.Scheduler = ReferenceScheduler
    try:
        yield
    finally:
        sim.Scheduler = old


def scheduler_class(engine: str) -> type[Scheduler]:
    """The class a test builds a scheduler of directly, on ``engine``."""
    return ReferenceScheduler if engine == "reference" else Scheduler


def run_on(engine: str, text: str) -> dict[str, Any]:
    """Parse and simulate a scenario on ``engine``; the result document."""
    with on_engine(engine):
        return simulate(load_scenario(text, "test.yaml")).doc
