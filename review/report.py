"""The review as one self-contained HTML file: tables, and charts where people would
rather look than read.

Charts are drawn by matplotlib (the optional extra ``headway[report]``): it is
well kept, runs offline, draws static SVG without a browser or a JavaScript runtime,
and needs nothing at view time. Each chart is an SVG embedded as a ``data:`` URI in an
``<img>``, so the file opens anywhere with no network, and each SVG keeps its own ids
(inline SVGs in one page would share glyph and clip-path ids).

Charts: wait CDF per queue (one line per run), utilization over time per cluster and
resource (per run), queue depth over time (per run), and a Gantt-like view of the gangs
(multi-pod actions): each bar a gang from its start to its end, coloured by cluster,
after a grey stretch for its wait.
"""

from __future__ import annotations

import base64
import html
import io
from collections.abc import Sequence
from typing import Any

import matplotlib

matplotlib.use("Agg")  # no display: render to files only
import matplotlib.pyplot as plt
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle

from .compare import Measures, View
from .review import FIDELITY_NOTE, Review
from .units import human_duration, human_percent

__all__ = ["render"]

#: Each run's colour in every chart (matplotlib's tab10: blue, orange, grey).
RUN_COLOURS = {"today": "#1f77b4", "proposal": "#ff7f0e", "recorded": "#7f7f7f"}
#: The most gangs drawn in the Gantt view (the longest waits first).
GANTT_MAX = 60


def render(rv: Review) -> str:
    """The report's HTML text."""
    plt.rcParams.update({"svg.hashsalt": "headway-review", "font.size": 9})
    parts = [_head(rv.title), f"<h1>{_e(rv.title)}</h1>"]
    parts += [f"<p class=note>{_e(n)}</p>" for n in rv.notes]
    parts.append(_queue_table(rv))
    parts.append(_chart("wait-cdf", "Wait per queue (CDF)", _wait_cdf(rv)))
    parts.append(_util_table(rv))
    parts.append(_chart("utilization", "Utilization over time", _utilization(rv)))
    parts.append(_chart("queue-depth", "Queue depth over time", _depth(rv)))
    gantt = _gantt(rv)
    if gantt is not None:
        parts.append(_chart("gangs", "Gangs: wait (grey) and run, by cluster", gantt))
    if len([v for v in rv.views if v.name != "recorded"]) > 1:
        parts.append(_movers_table("sooner", rv))
        parts.append(_movers_table("later", rv))
    if rv.fidelity is not None:
        parts.append(_fidelity(rv))
    parts.append("</body></html>\n")
    return "\n".join(parts)


def _e(x: object) -> str:
    return html.escape(str(x))


def _head(title: str) -> str:
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>{_e(title)}</title>
<style>
body {{ font-family: system-ui, sans-serif; margin: 24px; color: #222; max-width: 1400px; }}
table {{ border-collapse: collapse; margin: 8px 0 20px; }}
th, td {{ border: 1px solid #ccc; padding: 3px 8px; text-align: right; }}
th {{ background: #f2f2f2; }} td:first-child, th:first-child {{ text-align: left; }}
figure {{ margin: 8px 0 24px; }} figure img {{ max-width: 100%; }}
p.note {{ margin: 2px 0; color: #444; }}
</style></head><body>"""


def _views(rv: Review) -> list[tuple[View, Measures]]:
    return list(zip(rv.views, rv.measures, strict=True))


def _queue_table(rv: Review) -> str:
    vm = _views(rv)
    starved = f"starved (&gt; {_e(human_duration(rv.starved_after))})"
    rows = [
        "<h2>Per queue</h2><table><tr><th>queue</th><th>run</th><th>actions</th>"
        f"<th>wait p50</th><th>wait p95</th><th>wait max</th><th>blocked behind gangs</th>"
        f"<th>{starved}</th></tr>"
    ]
    for q in rv.busy_queues():
        for v, m in vm:
            qm = m.queues[q]
            rows.append(
                f"<tr><td>{_e(q)}</td><td>{_e(v.name)}</td><td>{qm.admitted}</td>"
                f"<td>{human_duration(qm.p50)}</td><td>{human_duration(qm.p95)}</td>"
                f"<td>{human_duration(qm.max)}</td><td>{human_duration(qm.gang_blocked)}</td>"
                f"<td>{qm.starved}</td></tr>"
            )
    rows.append("</table>")
    return "\n".join(rows)


def _util_table(rv: Review) -> str:
    vm = _views(rv)
    head = "".join(f"<th>{_e(v.name)}</th>" for v, _ in vm)
    rows = [
        f"<h2>Utilization (mean over the window)</h2><table><tr><th>cluster</th>"
        f"<th>resource</th>{head}</tr>"
    ]
    for c in rv.views[0].clusters:
        for res in vm[0][1].mean_utilization.get(c.name, {}):
            cells = "".join(
                f"<td>{human_percent(m.mean_utilization[c.name].get(res))}</td>" for _, m in vm
            )
            rows.append(f"<tr><td>{_e(c.name)}</td><td>{_e(res)}</td>{cells}</tr>")
    rows.append("</table>")
    return "\n".join(rows)


def _movers_table(word: str, rv: Review) -> str:
    ms = rv.sooner if word == "sooner" else rv.later
    rows = [
        f"<h2>Start {word} under the proposal (by {_e(human_duration(rv.moved_by))} or more):"
        f" {len(ms)}</h2><table><tr><th>action</th><th>queue</th><th>wait today</th>"
        f"<th>wait proposed</th><th>{word} by</th></tr>"
    ]
    for m in ms:
        rows.append(
            f"<tr><td>{_e(m.id)}</td><td>{_e(m.queue)}</td>"
            f"<td>{human_duration(m.wait_before)}</td><td>{human_duration(m.wait_after)}</td>"
            f"<td>{human_duration(abs(m.delta))}</td></tr>"
        )
    rows.append("</table>")
    return "\n".join(rows)


def _fidelity(rv: Review) -> str:
    f = rv.fidelity
    assert f is not None
    rho = "-" if f.order_correlation is None else f"{f.order_correlation:.2f}"
    rows = [
        "<h2>Replay fidelity: today's layout vs the record</h2>",
        f"<p>{f.actions} actions. Admission order rank correlation {rho}; consecutive"
        f" admissions kept in order {human_percent(f.order_pairs_kept)}; placed on the"
        f" cluster they ran on {human_percent(f.same_cluster)}.</p>",
        "<table><tr><th>queue</th><th>wait error (mean, absolute)</th><th>recorded p50</th>"
        "<th>replay p50</th></tr>",
    ]
    for q, e in f.wait_error.items():
        rows.append(
            f"<tr><td>{_e(q)}</td><td>{human_duration(e['mean_abs_error'])}</td>"
            f"<td>{human_duration(e['recorded_p50'])}</td>"
            f"<td>{human_duration(e['replay_p50'])}</td></tr>"
        )
    rows.append(f"</table><p class=note>{_e(FIDELITY_NOTE)}</p>")
    return "\n".join(rows)


# --- charts --------------------------------------------------------------------------


def _chart(name: str, caption: str, fig: Figure) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="svg", bbox_inches="tight")
    plt.close(fig)
    data = base64.b64encode(buf.getvalue()).decode("ascii")
    return (
        f'<figure data-chart="{name}"><figcaption><h2>{_e(caption)}</h2></figcaption>'
        f'<img alt="{_e(caption)}" src="data:image/svg+xml;base64,{data}"></figure>'
    )


def _time_unit(span: float) -> tuple[float, str]:
    """A unit that keeps a time axis readable: seconds, minutes, hours or days."""
    for size, label in ((86400.0, "days"), (3600.0, "hours"), (60.0, "minutes")):
        if span >= 3 * size:
            return size, label
    return 1.0, "seconds"


def _grid(n: int, cols: int = 3) -> tuple[int, int]:
    c = min(n, cols)
    return (n + c - 1) // c, c


def _colour(name: str) -> str:
    return RUN_COLOURS.get(name, "#2ca02c")


def _wait_cdf(rv: Review) -> Figure:
    queues = rv.busy_queues()
    allw = [w for m in rv.measures for q in m.queues.values() for w in q.waits]
    size, unit = _time_unit(max([*allw, 1.0]))
    rows, cols = _grid(len(queues))
    fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 2.8 * rows), squeeze=False)
    for i, q in enumerate(queues):
        ax = axes[i // cols][i % cols]
        for v, m in _views(rv):
            ws = sorted(m.queues[q].waits)
            if not ws:
                continue
            ys = [(k + 1) / len(ws) for k in range(len(ws))]
            ax.step([w / size for w in ws], ys, where="post", label=v.name, color=_colour(v.name))
        ax.set_title(q)
        ax.set_xlabel(f"wait ({unit})")
        ax.set_ylabel("share of actions")
        ax.set_ylim(0, 1.02)
        ax.grid(alpha=0.3)
        if ax.lines:
            ax.legend(loc="lower right", fontsize=8)
    _hide_rest(axes, len(queues), cols)
    fig.tight_layout()
    return fig


def _hide_rest(axes: Any, used: int, cols: int) -> None:
    for j in range(used, len(axes) * cols):
        axes[j // cols][j % cols].set_visible(False)


def _utilization(rv: Review) -> Figure:
    vm = [(v, m) for v, m in _views(rv)]
    clusters = [c.name for c in rv.views[0].clusters]
    size, unit = _time_unit(rv.measures[0].span)
    fig, axes = plt.subplots(
        len(clusters),
        len(vm),
        figsize=(4.6 * len(vm), 2.2 * len(clusters)),
        squeeze=False,
        sharey=True,
    )
    for r, c in enumerate(clusters):
        for k, (v, m) in enumerate(vm):
            ax = axes[r][k]
            ts = [t / size for t in m.times]
            for res, ys in m.utilization.get(c, {}).items():
                ax.plot(ts, [y * 100 for y in ys], label=res, linewidth=1.2)
            ax.set_title(f"{c}: {v.name}", fontsize=9)
            ax.set_ylim(0, 105)
            ax.set_ylabel("% used")
            ax.grid(alpha=0.3)
            if r == len(clusters) - 1:
                ax.set_xlabel(f"time ({unit})")
            if m.utilization.get(c):
                ax.legend(loc="upper right", fontsize=7)
    fig.tight_layout()
    return fig


def _depth(rv: Review) -> Figure:
    vm = _views(rv)
    size, unit = _time_unit(rv.measures[0].span)
    fig, axes = plt.subplots(1, len(vm), figsize=(4.6 * len(vm), 2.8), squeeze=False, sharey=True)
    for k, (v, m) in enumerate(vm):
        ax = axes[0][k]
        ts = [t / size for t in m.times]
        for q in rv.busy_queues():
            ax.step(ts, m.depth[q], where="post", label=q, linewidth=1.2)
        ax.set_title(v.name)
        ax.set_xlabel(f"time ({unit})")
        ax.set_ylabel("actions waiting")
        ax.grid(alpha=0.3)
        ax.legend(loc="upper right", fontsize=7)
    fig.tight_layout()
    return fig


def _gantt(rv: Review) -> Figure | None:
    vm = _views(rv)
    if not any(a.gang for v, _ in vm for a in v.actions):
        return None
    size, unit = _time_unit(rv.measures[0].span)
    palette = plt.get_cmap("tab10")
    clusters = [c.name for c in rv.views[0].clusters]
    colour = {c: palette((i + 3) % 10) for i, c in enumerate(clusters)}
    fig, axes = plt.subplots(1, len(vm), figsize=(4.6 * len(vm), 3.6), squeeze=False)
    for k, (v, _) in enumerate(vm):
        ax = axes[0][k]
        gangs = _top_gangs(v)
        for y, a in enumerate(gangs):
            start = a.start if a.start is not None else rv.measures[0].span
            ax.barh(y, (start - a.submit) / size, left=a.submit / size, color="#d9d9d9")
            if a.start is not None and a.end is not None:
                ax.barh(
                    y,
                    (a.end - a.start) / size,
                    left=a.start / size,
                    color=colour.get(a.cluster or "", "#444444"),
                )
        ax.set_yticks(range(len(gangs)))
        ax.set_yticklabels([f"{a.id} ({len(a.pods)})" for a in gangs], fontsize=6)
        ax.invert_yaxis()
        ax.set_title(v.name)
        ax.set_xlabel(f"time ({unit})")
        ax.grid(axis="x", alpha=0.3)
    handles = [Rectangle((0, 0), 1, 1, color=colour[c]) for c in clusters]
    fig.legend(handles, clusters, loc="lower center", ncol=len(clusters), fontsize=7)
    fig.tight_layout(rect=(0, 0.08, 1, 1))
    return fig


def _top_gangs(v: View) -> Sequence[Any]:
    gangs = [a for a in v.actions if a.gang]
    gangs.sort(key=lambda a: -(a.wait if a.wait is not None else float("inf")))
    return sorted(gangs[:GANTT_MAX], key=lambda a: (a.submit, a.id))
