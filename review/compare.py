"""Runs side by side: what was recorded, the replay under today's layout, the replay
under a proposal. Pure: no I/O, no clock.

A *view* is one run of a workload: per action its submit, start, end, cluster, pods and
reasons, plus the clusters it ran on. Views come from the simulator's result
(``sim_view``) or from the record (``recorded_view``), and are measured the same way
(``measure``): per queue the wait distribution, the time its actions spent blocked
behind gangs (waits whose reasons include ``HeldForGang`` or ``BackfillWindow``),
starvation (waits over a threshold), and per cluster and resource the utilization over
time. ``compare`` names the actions that start much sooner or later; ``fidelity`` says
how close a replay came to the record.
"""

from __future__ import annotations

import bisect
import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from headway.scheduler.model import ClusterSpec
from headway.scheduler.resources import Pod
from headway.scheduler.scenario import Scenario
from headway.scheduler.simulator import SimResult
from headway.store.history import Finished

__all__ = [
    "GANG_REASONS",
    "RESOURCES",
    "ActionRun",
    "Fidelity",
    "Measures",
    "Mover",
    "QueueMeasures",
    "View",
    "compare",
    "fidelity",
    "measure",
    "percentile",
    "recorded_view",
    "sim_view",
]

#: Reasons that mean "waited because a gang held or reserved the room".
GANG_REASONS = frozenset({"HeldForGang", "BackfillWindow"})
#: Resources drawn over time (as ``Pod`` attributes, and their names in the report).
RESOURCES = (("cpu", "cpu"), ("gpu", "gpu"), ("memory", "memory"))
#: Points of a utilization or depth curve.
SAMPLES = 200


@dataclass(frozen=True)
class ActionRun:
    """One action in a view (times in seconds from the view's time 0)."""

    id: str
    queue: str
    submit: float
    start: float | None
    end: float | None
    cluster: str | None
    pods: tuple[Pod, ...]
    reasons: tuple[str, ...] = ()

    @property
    def wait(self) -> float | None:
        return None if self.start is None else self.start - self.submit

    @property
    def gang(self) -> bool:
        return len(self.pods) > 1


@dataclass
class View:
    """One run of a workload, to measure and draw."""

    name: str
    actions: list[ActionRun]
    clusters: list[ClusterSpec]
    queues: list[str]


def sim_view(name: str, sc: Scenario, res: SimResult) -> View:
    """The simulator's result of ``sc`` as a view.

    An action whose attempts failed (``failures:``) counts from its first start to its
    last end with its first attempt's pods: its retries' gaps and raised memory are not
    told apart (an approximation of its utilization, not of its waits)."""
    pods = {w.spec.id: w.spec.pods for w in sc.workload}
    acts = [
        ActionRun(
            a["id"],
            a["queue"],
            float(a["submit"]),
            a["start"],
            a["end"],
            a["cluster"],
            pods[a["id"]],
            tuple(a["reasons"]),
        )
        for a in res.doc["actions"]
    ]
    return View(name, acts, list(sc.clusters), [q.name for q in sc.queues])


def recorded_view(name: str, rows: Sequence[Finished], t0: float, sc: Scenario) -> View:
    """The recorded actions that ran, on the replay's clock (``t0`` is its time 0)."""
    acts = [
        ActionRun(
            r.action_id,
            r.queue,
            r.submitted_at - t0,
            None if r.admitted_at is None else r.admitted_at - t0,
            r.ended_at - t0,
            r.cluster,
            tuple(Pod.from_dict(p) for p in r.pods),
            tuple(r.reasons),
        )
        for r in rows
        if r.admitted_at is not None
    ]
    return View(name, acts, list(sc.clusters), [q.name for q in sc.queues])


def percentile(xs: Sequence[float], p: float) -> float | None:
    """Linear interpolation between closest ranks (as ``headway simulate``)."""
    if not xs:
        return None
    s = sorted(xs)
    h = (len(s) - 1) * p
    lo = math.floor(h)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (h - lo) * (s[hi] - s[lo])


@dataclass
class QueueMeasures:
    admitted: int
    pending: int
    p50: float | None
    p95: float | None
    max: float | None
    gang_blocked: float
    starved: int
    waits: list[float]


@dataclass
class Measures:
    """A view, measured."""

    queues: dict[str, QueueMeasures]
    span: float
    #: Sample times of the curves below.
    times: list[float]
    #: cluster -> resource -> fraction used at each sample time.
    utilization: dict[str, dict[str, list[float]]]
    #: cluster -> resource -> mean fraction used over the span.
    mean_utilization: dict[str, dict[str, float | None]]
    #: queue -> actions waiting at each sample time.
    depth: dict[str, list[int]]


def measure(view: View, starved_after: float, span: float | None = None) -> Measures:
    """Per queue waits, gang-blocked time and starvation; curves over ``[0, span]``."""
    acts = view.actions
    if span is None:
        span = max([a.end or a.submit for a in acts] + [1e-9])
    queues: dict[str, QueueMeasures] = {}
    for q in view.queues:
        mine = [a for a in acts if a.queue == q]
        waits = [w for a in mine if (w := a.wait) is not None]
        queues[q] = QueueMeasures(
            admitted=len(waits),
            pending=sum(1 for a in mine if a.start is None),
            p50=percentile(waits, 0.5),
            p95=percentile(waits, 0.95),
            max=max(waits) if waits else None,
            gang_blocked=sum(a.wait or 0.0 for a in mine if GANG_REASONS.intersection(a.reasons)),
            # One that never started waited to the end of the window (at least).
            starved=sum(1 for a in mine if _waited(a, span) > starved_after),
            waits=waits,
        )
    times = [span * i / (SAMPLES - 1) for i in range(SAMPLES)]
    util, mean = _utilization(view, times, span)
    return Measures(queues, span, times, util, mean, _depth(view, times))


def _waited(a: ActionRun, span: float) -> float:
    return a.start - a.submit if a.start is not None else span - a.submit


def _capacity(c: ClusterSpec) -> dict[str, int]:
    return {
        key: sum(getattr(g.shape, attr) * g.count for g in c.node_groups) for attr, key in RESOURCES
    }


def _utilization(
    view: View, times: list[float], span: float
) -> tuple[dict[str, dict[str, list[float]]], dict[str, dict[str, float | None]]]:
    util: dict[str, dict[str, list[float]]] = {}
    mean: dict[str, dict[str, float | None]] = {}
    for c in view.clusters:
        cap = _capacity(c)
        runs = [a for a in view.actions if a.cluster == c.name and a.start is not None]
        util[c.name] = {}
        mean[c.name] = {}
        for attr, key in RESOURCES:
            if not cap[key]:
                continue
            deltas: list[tuple[float, int]] = []
            area = 0.0
            for a in runs:
                used = sum(getattr(p, attr) for p in a.pods)
                if not used:
                    continue
                assert a.start is not None
                end = a.end if a.end is not None else span
                deltas += [(a.start, used), (end, -used)]
                area += used * (min(end, span) - min(a.start, span))
            util[c.name][key] = _step_curve(deltas, times, cap[key])
            mean[c.name][key] = area / (cap[key] * span) if span > 0 else None
    return util, mean


def _step_curve(deltas: list[tuple[float, int]], times: list[float], cap: int) -> list[float]:
    """The sum of ``deltas`` in force at each time (ends before starts at one instant)."""
    deltas.sort(key=lambda d: (d[0], d[1]))
    out: list[float] = []
    level = 0
    i = 0
    for t in times:
        while i < len(deltas) and deltas[i][0] <= t:
            level += deltas[i][1]
            i += 1
        out.append(level / cap)
    return out


def _depth(view: View, times: list[float]) -> dict[str, list[int]]:
    out: dict[str, list[int]] = {}
    for q in view.queues:
        mine = [a for a in view.actions if a.queue == q]
        subs = sorted(a.submit for a in mine)
        starts = sorted(a.start for a in mine if a.start is not None)
        out[q] = [bisect.bisect_right(subs, t) - bisect.bisect_right(starts, t) for t in times]
    return out


@dataclass(frozen=True)
class Mover:
    """An action whose start moved between two views (``delta`` < 0: sooner)."""

    id: str
    queue: str
    wait_before: float | None
    wait_after: float | None
    delta: float


def compare(before: View, after: View, moved_by: float) -> tuple[list[Mover], list[Mover]]:
    """The actions that start at least ``moved_by`` seconds sooner, and later, in
    ``after`` than in ``before`` (largest first). Never started counts as the end."""
    b = {a.id: a for a in before.actions}
    horizon = max([a.end or a.submit for a in before.actions + after.actions] + [0.0])
    sooner: list[Mover] = []
    later: list[Mover] = []
    for a in after.actions:
        old = b.get(a.id)
        if old is None:
            continue
        s0 = old.start if old.start is not None else horizon
        s1 = a.start if a.start is not None else horizon
        d = s1 - s0
        if abs(d) < moved_by:
            continue
        m = Mover(a.id, a.queue, old.wait, a.wait, d)
        (sooner if d < 0 else later).append(m)
    sooner.sort(key=lambda m: (m.delta, m.id))
    later.sort(key=lambda m: (-m.delta, m.id))
    return sooner, later


@dataclass
class Fidelity:
    """How close a replay came to what was recorded."""

    actions: int
    #: Spearman's rank correlation of the admission order (1: the same order).
    order_correlation: float | None
    #: Share of consecutive recorded admissions that the replay admits in the same order.
    order_pairs_kept: float | None
    #: Share of actions placed on the cluster they ran on.
    same_cluster: float | None
    #: Per queue: mean absolute wait error, recorded p50 and replay p50 (seconds).
    wait_error: dict[str, dict[str, float | None]] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "actions": self.actions,
            "order_correlation": self.order_correlation,
            "order_pairs_kept": self.order_pairs_kept,
            "same_cluster": self.same_cluster,
            "wait_error": self.wait_error,
        }


def fidelity(recorded: View, replay: View) -> Fidelity:
    """Admission order, clusters and waits of ``replay`` against ``recorded``."""
    rep = {a.id: a for a in replay.actions}
    both = [a for a in recorded.actions if a.start is not None and a.id in rep]
    both = [a for a in both if rep[a.id].start is not None]
    n = len(both)
    if n == 0:
        return Fidelity(0, None, None, None)
    rec_order = sorted(both, key=lambda a: (a.start, a.submit, a.id))
    rep_rank = _ranks([rep[a.id] for a in both])
    rec_rank = _ranks(both)
    rho = _spearman([rec_rank[a.id] for a in both], [rep_rank[a.id] for a in both])
    kept = (
        sum(
            1
            for x, y in itertools.pairwise(rec_order)
            if (rep[x.id].start or 0.0) <= (rep[y.id].start or 0.0)
        )
        / (n - 1)
        if n > 1
        else None
    )
    same = sum(1 for a in both if a.cluster == rep[a.id].cluster) / n
    err: dict[str, dict[str, float | None]] = {}
    for q in recorded.queues:
        mine = [a for a in both if a.queue == q]
        if not mine:
            continue
        errs = [abs((rep[a.id].wait or 0.0) - (a.wait or 0.0)) for a in mine]
        err[q] = {
            "mean_abs_error": sum(errs) / len(errs),
            "recorded_p50": percentile([a.wait or 0.0 for a in mine], 0.5),
            "replay_p50": percentile([rep[a.id].wait or 0.0 for a in mine], 0.5),
        }
    return Fidelity(n, rho, kept, same, err)


def _ranks(acts: Sequence[ActionRun]) -> dict[str, float]:
    """Average ranks of the start times (ties share their mean rank)."""
    order = sorted(acts, key=lambda a: a.start or 0.0)
    ranks: dict[str, float] = {}
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and order[j + 1].start == order[i].start:
            j += 1
        for k in range(i, j + 1):
            ranks[order[k].id] = (i + j) / 2
        i = j + 1
    return ranks


def _spearman(x: Sequence[float], y: Sequence[float]) -> float | None:
    n = len(x)
    if n < 2:
        return None
    mx, my = sum(x) / n, sum(y) / n
    cov = sum((a - mx) * (b - my) for a, b in zip(x, y, strict=True))
    vx = sum((a - mx) ** 2 for a in x)
    vy = sum((b - my) ** 2 for b in y)
    if vx == 0 or vy == 0:
        return 1.0 if vx == vy else None
    return cov / math.sqrt(vx * vy)
