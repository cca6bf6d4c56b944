"""The audit of a fault run, from records the product does not keep for itself.

Inputs, each written by a different party:

* what the harness submitted (ids, queues, runs, pod shapes): the submitter's own list;
* the pod log: one JSON line per pod created or ended, appended by the cluster backends
  to a file that outlives their processes (``HEADWAY_POD_LOG``);
* the action histories: Temporal's record of each action workflow (how many executions,
  how it closed, every ``run_action`` dispatch with its scheduled and closed times, and
  the release markers);
* the queues' caps and the nodes' shapes, from the fleet file.

Pure functions over those records; the checks are unit-tested on made-up records in
``test_audit.py`` so a clean audit means the checks ran, not that they cannot fail.
"""

from __future__ import annotations

import json
import math
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from headway.scheduler.model import ClusterSpec, QueueSpec
from headway.scheduler.retry import ATTEMPT_SEP

from .workload import Planned, PodRes

__all__ = [
    "Dispatch",
    "Finding",
    "History",
    "PodLine",
    "Report",
    "audit",
    "node_capacities",
    "parse_pod_log",
]

INF = math.inf
#: States an action workflow may end in (``ActionResult.state``).
TERMINAL_STATES = frozenset({"succeeded", "failed", "cancelled", "rejected"})


@dataclass(frozen=True)
class PodLine:
    """One line of the pod log."""

    t: float
    cluster: str
    action: str
    pod: str
    node: str | None
    event: str  # created | bound | ended
    cpu_m: int
    mem: int
    gpu: int
    outcome: str | None
    incarnation: str | None
    dispatch: str | None = None  # the run_action dispatch that created the pod


def parse_pod_log(lines: Iterable[str]) -> tuple[list[PodLine], list[str]]:
    """The pod log's records, and the lines that are not records (a line torn by a
    ``kill -9`` in the middle of its write; reported, since it may hide a record)."""
    out: list[PodLine] = []
    bad: list[str] = []
    for raw in lines:
        line = raw.strip()
        if not line:
            continue
        try:
            d = json.loads(line)
            out.append(
                PodLine(
                    t=float(d["t"]),
                    cluster=str(d["cluster"]),
                    action=str(d["action"]),
                    pod=str(d["pod"]),
                    node=d.get("node"),
                    event=str(d["event"]),
                    cpu_m=int(d.get("cpu_m") or 0),
                    mem=int(d.get("mem") or 0),
                    gpu=int(d.get("gpu") or 0),
                    outcome=d.get("outcome"),
                    incarnation=d.get("incarnation"),
                    dispatch=d.get("dispatch"),
                )
            )
        except (ValueError, KeyError, TypeError):
            bad.append(line)
    return out, bad


@dataclass(frozen=True)
class Dispatch:
    """One ``run_action`` activity of an action's history (all its Temporal retries)."""

    cluster: str
    scheduled: float
    closed: float | None  # None: still open when the history was read
    attempts: int
    outcome: str  # completed | failed | timed_out | canceled | open


@dataclass
class History:
    """What Temporal recorded of one action id."""

    action_id: str
    executions: int  # workflow runs with this id (one, or it was started twice)
    status: str  # COMPLETED, FAILED, CANCELED, TERMINATED, TIMED_OUT, RUNNING
    state: str | None  # ActionResult.state from the result or the failure's details
    reason: str | None
    closed_at: float | None
    releases: int  # finish_lease local activities recorded
    dispatches: list[Dispatch] = field(default_factory=list)
    #: Releases per attempt (split by the requeue markers of hand-backs and retries);
    #: empty: one attempt, ``releases`` its count.
    attempt_releases: list[int] = field(default_factory=list)

    def released_once(self) -> bool:
        """Every attempt's lease released at most once, the last exactly once: an
        attempt followed by another may be released by the requeue itself."""
        per = self.attempt_releases or [self.releases]
        return all(n <= 1 for n in per[:-1]) and per[-1] == 1


@dataclass(frozen=True)
class Finding:
    kind: str
    subject: str
    detail: str

    def __str__(self) -> str:
        return f"[{self.kind}] {self.subject}: {self.detail}"


@dataclass
class Report:
    """The audit's figures and everything it found wrong."""

    actions: int
    states: Counter[str]
    ended_once: int
    lost: list[str]
    twice: list[str]
    queue_overshoots: list[Finding]
    node_overshoots: list[Finding]
    findings: list[Finding]
    pods_created: int
    pod_lines: int
    torn_lines: int
    created_late: int  # created lines stamped after the pod's bound line (see _pod_lives)
    first_created: float | None
    last_ended: float | None

    @property
    def ok(self) -> bool:
        return not self.findings

    def figures(self) -> dict[str, Any]:
        return {
            "actions": self.actions,
            "states": dict(self.states),
            "ended_once": self.ended_once,
            "lost": len(self.lost),
            "twice": len(self.twice),
            "queue_overshoots": len(self.queue_overshoots),
            "node_overshoots": len(self.node_overshoots),
            "pods_created": self.pods_created,
            "created_logged_late": self.created_late,
            "findings": len(self.findings),
        }


def node_capacities(clusters: Sequence[ClusterSpec]) -> dict[tuple[str, str], PodRes]:
    """(cluster, node) -> allocatable, with the simulated backend's node names
    (``<group>-<index>``)."""
    out: dict[tuple[str, str], PodRes] = {}
    for c in clusters:
        for g in c.node_groups:
            for i in range(g.count):
                out[(c.name, f"{g.name}-{i}")] = PodRes(g.shape.cpu, g.shape.memory, g.shape.gpu)
    return out


# --- interval sweeps --------------------------------------------------------------------


@dataclass(frozen=True)
class _Span:
    start: float
    end: float
    key: str
    payload: Any


def _sweep(
    spans: Iterable[_Span], over: Callable[[dict[str, Any]], list[str]]
) -> list[tuple[float, str, list[str]]]:
    """Walk the spans in time order and call ``over(alive)`` after each start; return
    one entry per episode of each violation (its first moment, the violation, the keys
    alive then). Ends sort before starts at the same instant: something that ended at t
    does not overlap what started at t."""
    points: list[tuple[float, int, _Span]] = []
    for s in spans:
        if s.end <= s.start:
            continue  # held for no time (seen bound and ended at once): overlaps nothing
        points.append((s.start, 1, s))
        points.append((s.end, 0, s))
    points.sort(key=lambda p: (p[0], p[1]))
    alive: dict[str, Any] = {}
    open_episodes: set[str] = set()
    out: list[tuple[float, str, list[str]]] = []
    for t, kind, s in points:
        if kind == 0:
            alive.pop(s.key, None)
        else:
            alive[s.key] = s.payload
        now = set(over(alive))
        for v in sorted(now - open_episodes):
            out.append((t, v, sorted(alive)))
        open_episodes = now
    return out


@dataclass(frozen=True)
class _Held:
    """What one admitted action holds against its queue."""

    action: str
    run: str
    cpu_m: int
    mem: int
    gpu: int  # all GPUs
    typed_gpu: dict[str, int]


def _held(p: Planned) -> _Held:
    n = p.replicas
    typed = {p.gpu_type: p.pod.gpu * n} if p.gpu_type and p.pod.gpu else {}
    return _Held(p.action_id, p.run, p.pod.cpu_m * n, p.pod.mem * n, p.pod.gpu * n, typed)


def _queue_violations(spec: QueueSpec) -> Callable[[dict[str, Any]], list[str]]:
    def over(alive: dict[str, Any]) -> list[str]:
        held: list[_Held] = list(alive.values())
        out: list[str] = []
        if spec.action_concurrency is not None and len(held) > spec.action_concurrency:
            out.append(f"action_concurrency {len(held)} > {spec.action_concurrency}")
        runs = {h.run for h in held}
        if spec.run_concurrency is not None and len(runs) > spec.run_concurrency:
            out.append(f"run_concurrency {len(runs)} > {spec.run_concurrency}")
        if spec.per_run_concurrency is not None:
            per = Counter(h.run for h in held)
            worst = max(per.values(), default=0)
            if worst > spec.per_run_concurrency:
                out.append(f"per_run_concurrency {worst} > {spec.per_run_concurrency}")
        q = spec.max_resources
        if q is not None:
            cpu = sum(h.cpu_m for h in held)
            mem = sum(h.mem for h in held)
            if q.cpu is not None and cpu > q.cpu:
                out.append(f"max_resources.cpu {cpu}m > {q.cpu}m")
            if q.memory is not None and mem > q.memory:
                out.append(f"max_resources.memory {mem} > {q.memory}")
            if q.gpu is not None:
                if q.gpu_type is None:
                    gpu = sum(h.gpu for h in held)
                else:
                    gpu = sum(h.typed_gpu.get(q.gpu_type, 0) for h in held)
                if gpu > q.gpu:
                    out.append(f"max_resources.gpu({q.gpu_type or 'any'}) {gpu} > {q.gpu}")
        return out

    return over


def _node_violations(cap: PodRes) -> Callable[[dict[str, Any]], list[str]]:
    def over(alive: dict[str, Any]) -> list[str]:
        pods: list[PodRes] = list(alive.values())
        out = []
        for what, used, have in (
            ("cpu_m", sum(p.cpu_m for p in pods), cap.cpu_m),
            ("mem", sum(p.mem for p in pods), cap.mem),
            ("gpu", sum(p.gpu for p in pods), cap.gpu),
        ):
            if used > have:
                out.append(f"{what} {used} > {have}")
        return out

    return over


@dataclass
class _PodLife:
    """One pod from its created line: where it was bound and how it ended."""

    created: PodLine
    node: str | None
    held_from: float | None  # when it began to hold its node's resources
    ended: PodLine | None = None
    #: Its end for the sweeps: the ended line's time; without one (a finding of its own),
    #: when its dispatch closed, else the end of the log. A pod that vanished with its
    #: worker is then counted as long as Headway can have thought it alive, not forever,
    #: so one lost line does not turn into every later admission's "overshoot".
    until: float = INF


_ORDER = {"creating": -1, "created": 0, "bound": 1, "ended": 2}


#: How much earlier than its "created" line a pod's first other line may be stamped and
#: still be that pod's: a backend that stamps "created" once its create call returned
#: can see the pod bound (by its informer) a moment before.
CREATED_SKEW_S = 1.0


def _pod_lives(lines: Sequence[PodLine]) -> tuple[list[_PodLife], list[str], int]:
    """The pods of one action, each from its created line to its ended line.

    Lines match a pod by name and the dispatch that created it; in time order, a
    ``bound`` or ``ended`` line belongs to the latest such pod not yet ended. Returns the
    pods, the log's problems, and how many created lines came (within
    ``CREATED_SKEW_S``) after the pod's first other line."""
    out: list[_PodLife] = []
    problems: list[str] = []
    late = 0
    by_key: dict[tuple[str, str | None], list[PodLine]] = defaultdict(list)
    for line in lines:
        by_key[(line.pod, line.dispatch)].append(line)
    for key_lines in by_key.values():
        todo = sorted(key_lines, key=lambda x: (x.t, _ORDER.get(x.event, 3)))
        life: _PodLife | None = None
        # A backend that logs its intent before the create call ("creating"; the
        # Kubernetes one): a pod seen without a created line after it was the intent's,
        # its worker killed between the call and the line.
        intent: PodLine | None = None
        i = 0
        while i < len(todo):
            line = todo[i]
            i += 1
            if line.event == "creating":
                intent = line
                continue
            if line.event == "created":
                intent = None
                if life is not None:
                    problems.append(f"{line.pod} created at {line.t:.3f} while still alive")
                life = _PodLife(line, line.node, line.t if line.node else None)
                out.append(life)
                continue
            if line.event not in ("bound", "ended"):
                problems.append(f"unknown event {line.event!r} of {line.pod}")
                continue
            if life is None:
                nxt = next((j for j in range(i, len(todo)) if todo[j].event == "created"), None)
                if nxt is not None and todo[nxt].t - line.t <= CREATED_SKEW_S:
                    # Logged late: the pod was created by then. Its life starts here.
                    late += 1
                    created = todo.pop(nxt)
                    life = _PodLife(created, None, None)
                elif intent is not None:
                    life, intent = _PodLife(intent, None, None), None
                else:
                    problems.append(
                        f"{line.pod} {line.event} at {line.t:.3f} (incarnation"
                        f" {line.incarnation}) without a created line: a creation the log"
                        " lost"
                    )
                    life = _PodLife(line, None, None)  # counted from its first line
                out.append(life)
            if line.event == "bound":
                if life.held_from is not None and life.node != line.node:
                    problems.append(f"{line.pod} bound twice ({life.node}, {line.node})")
                life.node = line.node
                life.held_from = line.t
            else:
                life.ended = line
                if life.node is None and line.node is not None:
                    # Bound without a bound line: it held the node from creation at most.
                    life.node, life.held_from = line.node, min(life.created.t, line.t)
                life = None
    return out, problems, late


# --- the audit --------------------------------------------------------------------------


def audit(
    planned: Sequence[Planned],
    histories: Mapping[str, History],
    pod_lines: Sequence[PodLine],
    *,
    queues: Mapping[str, QueueSpec],
    nodes: Mapping[tuple[str, str], PodRes],
    torn_lines: int = 0,
    expect_success: bool = True,
) -> Report:
    """Check a run's records against each other and the configured limits.

    Args:
        planned: Every action the harness submitted.
        histories: Temporal's record per action id (absent: Temporal has no such action).
        pod_lines: The pod log, all clusters, in any order.
        queues: The queues' configuration (caps and quotas) during the run.
        nodes: Every node's allocatable, by (cluster, node).
        torn_lines: Pod log lines that did not parse.
        expect_success: Whether every action should have succeeded (no injected failures,
            and faults that Headway promises to survive): then any other end is a finding.
    """
    findings: list[Finding] = []
    by_id = {p.action_id: p for p in planned}
    if torn_lines:
        findings.append(
            Finding("pod-log", "torn lines", f"{torn_lines} line(s) of the pod log do not parse")
        )

    # 1. Ended exactly once, none lost (Temporal's record).
    states: Counter[str] = Counter()
    lost: list[str] = []
    ended_once = 0
    for p in planned:
        h = histories.get(p.action_id)
        if h is None:
            lost.append(p.action_id)
            findings.append(Finding("lost", p.action_id, "Temporal has no workflow for it"))
            continue
        if h.status == "RUNNING" or h.state not in TERMINAL_STATES:
            lost.append(p.action_id)
            findings.append(
                Finding(
                    "lost",
                    p.action_id,
                    f"not ended: status {h.status}, state {h.state}, reason {h.reason}",
                )
            )
            continue
        states[h.state if h.state != "failed" else f"failed:{h.reason}"] += 1
        once = h.executions == 1 and h.released_once()
        if once:
            ended_once += 1
        else:
            findings.append(
                Finding(
                    "ended-twice",
                    p.action_id,
                    f"{h.executions} workflow execution(s), {h.releases} release(s)"
                    f" over {max(1, len(h.attempt_releases))} attempt(s)",
                )
            )
        if expect_success and h.state != "succeeded":
            findings.append(Finding("not-succeeded", p.action_id, f"ended {h.state}: {h.reason}"))
        if h.status == "TERMINATED" or h.status == "TIMED_OUT":
            findings.append(Finding("closed-abnormally", p.action_id, h.status))

    # 2. The pod log against the histories: every pod inside a dispatch of its action,
    #    created once per dispatch, ended, shaped as submitted, on a real node.
    lines_by_action: dict[str, list[PodLine]] = defaultdict(list)
    for line in pod_lines:
        # An attempt after a hand-back or a retry (``ACTION~N``) is its action's: its
        # pods fall in that attempt's dispatch of the one history.
        lines_by_action[line.action.split(ATTEMPT_SEP, 1)[0]].append(line)
    for action in sorted(set(lines_by_action) - set(by_id)):
        findings.append(Finding("unknown-pod", action, "pods of an action nobody submitted"))

    twice: list[str] = []
    pod_spans: dict[str, list[_Span]] = defaultdict(list)  # queue -> action-attempt spans
    node_spans: dict[tuple[str, str], list[_Span]] = defaultdict(list)
    pods_created = 0
    created_late = 0
    first_created: float | None = None
    last_ended: float | None = None
    log_end = max((line.t for line in pod_lines), default=0.0)
    for action, lines in sorted(lines_by_action.items()):
        if action not in by_id:
            continue
        p = by_id[action]
        h = histories.get(action)
        dispatches = h.dispatches if h is not None else []
        pods, problems, late = _pod_lives(lines)
        findings += [Finding("pod-log", action, x) for x in problems]
        created_late += late
        # Attribute each pod to the dispatch (history) during which it was created.
        groups: dict[int, list[_PodLife]] = defaultdict(list)
        for life in pods:
            created, ended = life.created, life.ended
            pods_created += 1
            first_created = created.t if first_created is None else min(first_created, created.t)
            if ended is not None:
                last_ended = ended.t if last_ended is None else max(last_ended, ended.t)
            idx = next(
                (
                    i
                    for i, d in enumerate(dispatches)
                    if d.scheduled <= created.t <= (d.closed if d.closed is not None else INF)
                ),
                -1,
            )
            if idx < 0:
                findings.append(
                    Finding(
                        "pod-outside-dispatch",
                        action,
                        f"{created.pod} created at {created.t:.3f} on {created.cluster}"
                        f" (incarnation {created.incarnation}) outside every run_action"
                        f" dispatch {[(d.cluster, d.scheduled, d.closed) for d in dispatches]}",
                    )
                )
            else:
                d = dispatches[idx]
                if created.cluster != d.cluster:
                    findings.append(
                        Finding(
                            "wrong-cluster",
                            action,
                            f"{created.pod} created on {created.cluster}, dispatched to"
                            f" {d.cluster}",
                        )
                    )
                if ended is not None and d.closed is not None and ended.t > d.closed:
                    findings.append(
                        Finding(
                            "pod-outlived-dispatch",
                            action,
                            f"{created.pod} ended at {ended.t:.3f}, {ended.t - d.closed:.3f} s"
                            f" after its run_action closed ({d.outcome})",
                        )
                    )
            if ended is not None:
                life.until = ended.t
            elif idx >= 0 and dispatches[idx].closed is not None:
                life.until = dispatches[idx].closed or log_end
            else:
                life.until = log_end
            groups[idx].append(life)
            if ended is None:
                findings.append(
                    Finding(
                        "pod-never-ended",
                        action,
                        f"{created.pod} created at {created.t:.3f} by incarnation"
                        f" {created.incarnation}, node {life.node}: no ended line",
                    )
                )
            if (created.cpu_m, created.mem, created.gpu) != (p.pod.cpu_m, p.pod.mem, p.pod.gpu):
                findings.append(
                    Finding(
                        "pod-shape",
                        action,
                        f"{created.pod} logged {created.cpu_m}m/{created.mem}/{created.gpu}"
                        f" gpu, submitted {p.pod}",
                    )
                )
            if life.node is not None and (created.cluster, life.node) not in nodes:
                findings.append(Finding("unknown-node", action, f"{created.pod} on {life.node}"))
            if life.node is not None and life.held_from is not None:
                node_spans[(created.cluster, life.node)].append(
                    _Span(
                        life.held_from,
                        life.until,
                        f"{action}/{created.pod}@{created.t:.3f}",
                        PodRes(created.cpu_m, created.mem, created.gpu),
                    )
                )
        for idx, members in sorted(groups.items()):
            # Created twice within one attempt: by the history's dispatch, and by the
            # dispatch id the backend stamped (a retry must adopt, never re-create).
            names = Counter(m.created.pod for m in members)
            stamped = Counter((m.created.dispatch, m.created.pod) for m in members)
            dup = sorted(
                {n for n, k in names.items() if k > 1}
                | {n for (_, n), k in stamped.items() if k > 1}
            )
            if dup:
                twice.append(action)
                where = "" if idx < 0 else f" within dispatch {idx + 1} of {len(dispatches)}"
                findings.append(
                    Finding(
                        "run-twice",
                        action,
                        f"pod(s) {dup} created more than once{where}: "
                        + "; ".join(
                            f"{m.created.pod} at {m.created.t:.3f} by {m.created.incarnation}"
                            f" (dispatch {m.created.dispatch})"
                            for m in members
                            if m.created.pod in dup
                        ),
                    )
                )
            start = min(m.created.t for m in members)
            ends = [m.until for m in members]
            pod_spans[p.queue].append(_Span(start, max(ends), f"{action}#{idx}", _held(p)))
            # Judged on pods whose creation the log has: one seen first when a restarted
            # worker found it (its created line lost, a finding of its own) starts late.
            logged = [m for m in members if m.created.event in ("created", "creating")]
            if len({m.created.pod for m in logged}) > 1 and max(m.created.t for m in logged) > min(
                m.until for m in logged
            ):
                findings.append(
                    Finding(
                        "gang-split",
                        action,
                        "a gang member was created after another had ended: "
                        + ", ".join(
                            f"{m.created.pod} {m.created.t:.3f}-{e:.3f}"
                            for m, e in zip(members, ends, strict=True)
                        ),
                    )
                )
        # A succeeded action ran every member of its gang, and each ended in success.
        if h is not None and h.state == "succeeded":
            last = groups.get(len(dispatches) - 1, []) if dispatches else []
            if len({m.created.pod for m in last}) != p.replicas:
                findings.append(
                    Finding(
                        "missing-pods",
                        action,
                        f"succeeded, but its last dispatch created {len(last)} of"
                        f" {p.replicas} pods",
                    )
                )
            bad = [
                f"{m.created.pod}:{m.ended.outcome if m.ended else None}"
                for m in last
                if m.ended is None or (m.ended.outcome or "").lower() != "succeeded"
            ]
            if bad:
                findings.append(
                    Finding("outcome-mismatch", action, f"succeeded, but pods ended {bad}")
                )
    for q in planned:
        h = histories.get(q.action_id)
        if h is not None and h.state == "succeeded" and q.action_id not in lines_by_action:
            findings.append(Finding("missing-pods", q.action_id, "succeeded, no pod in the log"))

    # 3. No queue over a cap or quota at any moment: from the pods' lifetimes, and
    #    separately from the histories' dispatches (both lie inside the reservation).
    hist_spans: dict[str, list[_Span]] = defaultdict(list)
    for p in planned:
        h = histories.get(p.action_id)
        if h is None:
            continue
        for i, d in enumerate(h.dispatches):
            end = d.closed if d.closed is not None else INF
            hist_spans[p.queue].append(_Span(d.scheduled, end, f"{p.action_id}#{i}", _held(p)))
    queue_overshoots: list[Finding] = []
    for source, spans_by_queue in (("pod log", pod_spans), ("histories", hist_spans)):
        for queue, spans in sorted(spans_by_queue.items()):
            spec = queues.get(queue)
            if spec is None:
                continue
            for t, what, alive in _sweep(spans, _queue_violations(spec)):
                queue_overshoots.append(
                    Finding(
                        "queue-overshoot",
                        queue,
                        f"{what} at {t:.3f} ({source}); in flight: {', '.join(alive)}",
                    )
                )
    findings += queue_overshoots

    # 4. No node over its allocatable at any moment (pod lifetimes on each node).
    node_overshoots: list[Finding] = []
    for (cluster, node), spans in sorted(node_spans.items()):
        cap = nodes.get((cluster, node))
        if cap is None:
            continue
        for t, what, alive in _sweep(spans, _node_violations(cap)):
            node_overshoots.append(
                Finding(
                    "node-overshoot",
                    f"{cluster}/{node}",
                    f"{what} at {t:.3f}; pods: {', '.join(alive)}",
                )
            )
    findings += node_overshoots

    return Report(
        actions=len(planned),
        states=states,
        ended_once=ended_once,
        lost=lost,
        twice=twice,
        queue_overshoots=queue_overshoots,
        node_overshoots=node_overshoots,
        findings=findings,
        pods_created=pods_created,
        pod_lines=len(pod_lines),
        torn_lines=torn_lines,
        created_late=created_late,
        first_created=first_created,
        last_ended=last_ended,
    )
