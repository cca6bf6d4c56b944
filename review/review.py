"""``headway review``: a recorded window replayed under today's layout and a proposal.

Both replays run the recorded workload (actual durations; estimates as declared, else
from the task's runtime history, as the live scheduler does) through the scheduler core
(``headway.scheduler.simulator``). The record itself is a third view, and the replay
under today's layout is measured against it (``fidelity``): the core is the same, so
what differs is timing the record shows and a replay does not have (dispatch and pod
start-up, workflow latency, a cluster's reported capacity).
"""

from __future__ import annotations

import textwrap
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from headway.scheduler.scenario import Scenario
from headway.scheduler.simulator import SimResult, simulate
from headway.store.history import Finished

from .compare import (
    Fidelity,
    Measures,
    Mover,
    View,
    compare,
    fidelity,
    measure,
    recorded_view,
    sim_view,
)
from .units import human_duration, human_percent
from .workload import Layout, Replay, build_replay

__all__ = [
    "FIDELITY_NOTE",
    "Review",
    "run_review",
    "scenario_review",
    "simulate_summary",
    "summary",
]

FIDELITY_NOTE = (
    "The replay runs the same scheduler core as the live scheduler; what differs from"
    " the record is timing the record shows and a replay does not model: dispatch and"
    " pod start-up, workflow and signal latency, capacity as the clusters reported it."
)


@dataclass
class Review:
    """Views side by side (the first is the baseline), measured, and what moved."""

    title: str
    views: list[View]
    measures: list[Measures]
    starved_after: float
    moved_by: float
    sooner: list[Mover] = field(default_factory=list)
    later: list[Mover] = field(default_factory=list)
    fidelity: Fidelity | None = None
    #: Lines said above everything else (the window, what was left out).
    notes: list[str] = field(default_factory=list)

    def busy_queues(self) -> list[str]:
        """The queues any view has actions in (a queue nothing used says nothing)."""
        used = {a.queue for v in self.views for a in v.actions}
        return [q for q in self.views[0].queues if q in used]

    def to_dict(self) -> dict[str, Any]:
        """The figures as JSON-ready data (``-o review.json``)."""
        return {
            "title": self.title,
            "notes": self.notes,
            "starved_after": self.starved_after,
            "moved_by": self.moved_by,
            "views": {
                v.name: {
                    "queues": {
                        q: {
                            "admitted": m.admitted,
                            "pending": m.pending,
                            "wait_p50": m.p50,
                            "wait_p95": m.p95,
                            "wait_max": m.max,
                            "gang_blocked": m.gang_blocked,
                            "starved": m.starved,
                        }
                        for q, m in ms.queues.items()
                    },
                    "utilization": ms.mean_utilization,
                }
                for v, ms in zip(self.views, self.measures, strict=True)
            },
            "sooner": [m.__dict__ for m in self.sooner],
            "later": [m.__dict__ for m in self.later],
            "fidelity": self.fidelity.to_dict() if self.fidelity else None,
        }


def run_review(
    rows: Sequence[Finished],
    today: Layout,
    proposal: Layout,
    *,
    starved_after: float,
    moved_by: float | None = None,
) -> Review:
    """Replay ``rows`` under ``today`` and ``proposal``; measure them and the record.

    ``moved_by`` None: 5% of the window's span, at least a second.

    Raises:
        ValueError: no recorded action ran (nothing to replay).
    """
    base = build_replay(rows, today)
    prop = build_replay(rows, proposal)
    v_today = sim_view("today", base.scenario, simulate(base.scenario))
    v_prop = sim_view("proposal", prop.scenario, simulate(prop.scenario))
    v_rec = recorded_view("recorded", base.ran, base.t0, base.scenario)
    span = max(_end(v) for v in (v_rec, v_today, v_prop))
    moved = moved_by if moved_by is not None else max(1.0, 0.05 * span)
    sooner, later = compare(v_today, v_prop, moved)
    views = [v_today, v_prop, v_rec]
    return Review(
        title="Scheduling review: today's layout vs the proposal",
        views=views,
        measures=[measure(v, starved_after, span) for v in views],
        starved_after=starved_after,
        moved_by=moved,
        sooner=sooner,
        later=later,
        fidelity=fidelity(v_rec, v_today),
        notes=_window_notes(base),
    )


def scenario_review(name: str, sc: Scenario, res: SimResult, *, starved_after: float) -> Review:
    """One scenario's simulated run, measured (``headway simulate --report``)."""
    v = sim_view(name, sc, res)
    span = _end(v)
    return Review(
        title=f"Simulated run of {name}",
        views=[v],
        measures=[measure(v, starved_after, span)],
        starved_after=starved_after,
        moved_by=0.0,
    )


def _end(v: View) -> float:
    return max([a.end or a.submit for a in v.actions] + [1e-9])


def _window_notes(r: Replay) -> list[str]:
    first = datetime.fromtimestamp(r.t0, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    notes = [f"{len(r.ran)} recorded actions, the first submitted {first}."]
    if r.skipped:
        left = ", ".join(f"{n} {k}" for k, n in sorted(r.skipped.items()))
        notes.append(f"Left out, never ran (nothing to replay): {left}.")
    if r.added_queues:
        notes.append(
            "Queues of the record missing from the layout, replayed with default settings: "
            + ", ".join(r.added_queues)
            + "."
        )
    return notes


# --- the terminal summary ------------------------------------------------------------


def summary(rv: Review, top: int = 5) -> str:
    """A short summary for a terminal (80 columns), with units and labelled columns."""
    out: list[str] = [rv.title, *(_wrap(n) for n in rv.notes), ""]
    head = f"{'QUEUE':<14}{'RUN':<10}{'ACTIONS':>7}{'WAIT P50':>10}{'WAIT P95':>10}"
    head += f"{'WAIT MAX':>10}{'GANG-HELD':>10}  STARVED"
    out.append(head)
    shown = [(v, m) for v, m in zip(rv.views, rv.measures, strict=True) if v.name != "recorded"]
    for q in rv.busy_queues():
        for i, (v, m) in enumerate(shown):
            qm = m.queues[q]
            out.append(
                f"{(q if i == 0 else ''):<14.14}{v.name:<10}{qm.admitted:>7}"
                f"{human_duration(qm.p50):>10}{human_duration(qm.p95):>10}"
                f"{human_duration(qm.max):>10}{human_duration(qm.gang_blocked):>10}"
                f"  {qm.starved}"
            )
    out.append(
        _wrap(
            f"GANG-HELD: time waited behind a gang's hold or reservation; STARVED: actions"
            f" that waited over {human_duration(rv.starved_after)}."
        )
    )
    out.append("")
    out.append(
        f"{'CLUSTER':<16}{'RESOURCE':<10}"
        + "".join(f"{'UTIL ' + v.name.upper():>18}" for v, _ in shown)
    )
    for c in rv.views[0].clusters:
        for res in shown[0][1].mean_utilization.get(c.name, {}):
            cells = "".join(
                f"{human_percent(m.mean_utilization[c.name].get(res)):>18}" for _, m in shown
            )
            out.append(f"{c.name:<16.16}{res:<10}{cells}")
    if len(shown) > 1:
        out.append("")
        out += _movers("sooner", rv.sooner, rv.moved_by, top)
        out += _movers("later", rv.later, rv.moved_by, top)
    if rv.fidelity is not None:
        out.append("")
        out += fidelity_lines(rv.fidelity)
    return "\n".join(out)


def _movers(word: str, ms: list[Mover], by: float, top: int) -> list[str]:
    lines = [f"Start {word} under the proposal (by {human_duration(by)} or more): {len(ms)}"]
    for m in ms[:top]:
        lines.append(
            f"  {m.id} ({m.queue}): waited {human_duration(m.wait_before)} ->"
            f" {human_duration(m.wait_after)}, {human_duration(abs(m.delta))} {word}"
        )
    if len(ms) > top:
        lines.append(f"  ... and {len(ms) - top} more (the report lists them all)")
    return lines


def fidelity_lines(f: Fidelity) -> list[str]:
    """The replay under today's layout against the record, in words and figures."""
    rho = "-" if f.order_correlation is None else f"{f.order_correlation:.2f}"
    lines = [
        _wrap(
            f"Replay fidelity (today's layout vs the record, {f.actions} actions): admission"
            f" order rank correlation {rho}, consecutive admissions kept in order"
            f" {human_percent(f.order_pairs_kept)}, same cluster"
            f" {human_percent(f.same_cluster)}."
        ),
        f"{'QUEUE':<14}{'WAIT ERROR (MEAN)':>18}{'RECORDED P50':>14}{'REPLAY P50':>12}",
    ]
    for q, e in f.wait_error.items():
        lines.append(
            f"{q:<14.14}{human_duration(e['mean_abs_error']):>18}"
            f"{human_duration(e['recorded_p50']):>14}{human_duration(e['replay_p50']):>12}"
        )
    lines.append(_wrap(FIDELITY_NOTE))
    return lines


def _wrap(text: str) -> str:
    return textwrap.fill(text, 80)


def simulate_summary(sc: Scenario, res: SimResult) -> str:
    """``headway simulate``'s summary: units (``12m 30s``, ``3.2 days``), labelled
    columns, and utilization per cluster as well as pooled."""
    d = res.doc
    s = d["summary"]
    slow = s["mean_bounded_slowdown"]
    lines = [
        f"{s['actions']} actions ({s['skipped']} skipped); makespan"
        f" {human_duration(s['makespan'])}, mean wait {human_duration(s['mean_wait'])},"
        f" mean bounded slowdown {'-' if slow is None else f'{slow:.1f}'}",
        "",
        f"{'QUEUE':<22}{'ADMITTED':>9}{'REJECTED':>9}{'PENDING':>8}{'WAIT P50':>10}"
        f"{'WAIT P95':>10}{'WAIT MAX':>10}",
    ]
    # A scenario with failures (``failures:``) has a failed count per queue.
    failures = any("failed" in q for q in d["queues"].values())
    if failures:
        lines[-1] += f"{'FAILED':>8}"
    for name, q in d["queues"].items():
        lines.append(
            f"{name:<22.22}{q['admitted']:>9}{q['rejected']:>9}{q['pending']:>8}"
            f"{human_duration(q['wait_p50']):>10}{human_duration(q['wait_p95']):>10}"
            f"{human_duration(q['wait_max']):>10}" + (f"{q['failed']:>8}" if failures else "")
        )
    m = measure(sim_view("run", sc, res), float("inf"))
    lines += ["", f"{'CLUSTER':<22}{'CPU USED':>10}{'GPU USED':>10}{'MEMORY USED':>12}"]
    for c in sc.clusters:
        u = m.mean_utilization.get(c.name, {})
        lines.append(
            f"{c.name:<22.22}{human_percent(u.get('cpu')):>10}{human_percent(u.get('gpu')):>10}"
            f"{human_percent(u.get('memory')):>12}"
        )
    pooled = ", ".join(
        f"{k} {human_percent(v)}" for k, v in d["utilization"].items() if v is not None
    )
    lines.append(f"all clusters, mean over the makespan: {pooled}")
    if s["unknown_capacity_passes"]:
        lines.append(
            f"admissions onto clusters of unknown capacity: {s['unknown_capacity_passes']}"
        )
    return "\n".join(lines)
