"""The record of what ran, as a scenario: ``headway export workload`` and the replays.

A recorded action becomes a workload entry of the scenario schema (``shared/specs/
simulate.md``): its submit time (seconds from the window's first submission), its
actual duration (admission to end), its declared demand, run, task, estimate and
environment. An action that never ran (cancelled or rejected while it waited) has no
duration to replay and is left out (counted). The layout (clusters, queues, org limits)
is the tenant's as stored, over the fleet file's clusters.

A proposal (``headway review --proposal``) is a YAML file of the same notation that
changes the layout: ``queues:`` (each names a queue of the layout and gives the fields
it changes), ``org:`` (the fields it changes) and ``clusters:`` (replaces them all).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import yaml
from headway.scheduler.model import (
    ActionSpec,
    ClusterSpec,
    DemandKind,
    EnvironmentSpec,
    OrgLimits,
    QueueSpec,
)
from headway.scheduler.resources import Pod
from headway.scheduler.scenario import (
    Scenario,
    ScenarioError,
    WorkItem,
    parse_fleet,
    queue_changes,
)
from headway.store.history import Finished

__all__ = [
    "Layout",
    "ProposalError",
    "Replay",
    "apply_proposal",
    "build_replay",
    "layout_doc",
    "scenario_doc",
]


class ProposalError(ValueError):
    """A proposal that cannot apply; the message names the file, field and value."""


@dataclass
class Layout:
    """Clusters, queues (by name, in order) and org limits: what a replay runs under."""

    clusters: list[ClusterSpec]
    queues: list[QueueSpec]
    org: OrgLimits = field(default_factory=OrgLimits)
    environments: list[EnvironmentSpec] = field(default_factory=list)

    def queue_names(self) -> list[str]:
        return [q.name for q in self.queues]


@dataclass
class Replay:
    """A recorded window as a scenario, and what was left out of it."""

    scenario: Scenario
    #: When the window's first action was submitted (epoch seconds): time 0 of the replay.
    t0: float
    #: The recorded actions that are in the workload, in its order.
    ran: list[Finished]
    #: Actions that never ran (no duration to replay), by outcome.
    skipped: dict[str, int]
    #: Queues the record names that the layout lacks, added with default settings.
    added_queues: list[str]


def build_replay(rows: Sequence[Finished], layout: Layout) -> Replay:
    """The recorded actions that ran, as a scenario under ``layout``.

    Raises:
        ValueError: ``rows`` holds no action that ran.
    """
    ran = [r for r in rows if r.admitted_at is not None]
    skipped: dict[str, int] = {}
    for r in rows:
        if r.admitted_at is None:
            skipped[r.outcome] = skipped.get(r.outcome, 0) + 1
    if not ran:
        raise ValueError("no action in the window ran (nothing to replay)")
    t0 = min(r.submitted_at for r in ran)
    queues = list(layout.queues)
    known = {q.name for q in queues}
    added = sorted({r.queue for r in ran} - known)
    queues += [QueueSpec(name=n) for n in added]
    work = [
        WorkItem(
            ActionSpec(
                id=r.action_id,
                queue=r.queue,
                pods=tuple(Pod.from_dict(p) for p in r.pods),
                run=r.run or r.action_id,
                task=r.task or r.action_id,
                submit=_ms(r.submitted_at - t0),
                seq=i,
                estimate=r.estimate,
                environment=r.environment,
                kind=DemandKind(r.kind),
            ),
            _ms(r.duration or 0.0),
        )
        for i, r in enumerate(ran)
    ]
    sc = Scenario(list(layout.clusters), queues, layout.org, list(layout.environments), work)
    return Replay(sc, t0, ran, skipped, added)


def _ms(x: float) -> float:
    # Milliseconds are as fine as the record's clocks are; the file stays readable.
    return round(max(x, 0.0), 3)


# --- the scenario file -------------------------------------------------------------


def _cpu(m: int) -> str | int:
    return m // 1000 if m % 1000 == 0 else f"{m}m"


def _bytes(n: int) -> str | int:
    for suffix, size in (("Ti", 2**40), ("Gi", 2**30), ("Mi", 2**20), ("Ki", 2**10)):
        if n and n % size == 0:
            return f"{n // size}{suffix}"
    return n


def pod_entry(p: Pod) -> dict[str, Any]:
    """A pod (or node) shape in the file notation (Kubernetes units)."""
    out: dict[str, Any] = {"cpu": _cpu(p.cpu), "memory": _bytes(p.memory)}
    if p.gpu:
        out["gpu"] = f"{p.gpu_type}:{p.gpu}" if p.gpu_type else p.gpu
    if p.eph:
        out["ephemeral_storage"] = _bytes(p.eph)
    return out


def layout_doc(layout: Layout) -> dict[str, Any]:
    """``clusters:``, ``queues:``, ``org:`` (and ``environments:``) in the file notation."""
    from headway.cli._specs import queue_to_entry

    doc: dict[str, Any] = {
        "clusters": [
            {
                "name": c.name,
                "node_groups": [
                    {"name": g.name, "count": g.count, "shape": pod_entry(g.shape)}
                    for g in c.node_groups
                ],
                **({} if c.reports_capacity else {"reports_capacity": False}),
            }
            for c in layout.clusters
        ],
        "queues": [
            {k: v for k, v in queue_to_entry(q).items() if v is not None} for q in layout.queues
        ],
    }
    org = {k: v for k, v in layout.org.to_dict().items() if v is not None}
    if org:
        doc["org"] = org
    if layout.environments:
        doc["environments"] = [
            {
                "name": e.name,
                "resources": pod_entry(e.resources),
                "replicas": e.replicas,
                "concurrency": e.concurrency,
                "idle_ttl": e.idle_ttl,
            }
            for e in layout.environments
        ]
    return doc


def scenario_doc(replay: Replay) -> dict[str, Any]:
    """The replay as a scenario document (``headway simulate`` runs it as it is)."""
    sc = replay.scenario
    doc = layout_doc(Layout(sc.clusters, sc.queues, sc.org, sc.environments))
    doc["workload"] = [_work_entry(w, r) for w, r in zip(sc.workload, replay.ran, strict=True)]
    return doc


def _work_entry(w: WorkItem, r: Finished) -> dict[str, Any]:
    s = w.spec
    entry: dict[str, Any] = {"id": s.id, "queue": s.queue, "submit": s.submit}
    if s.run != s.id:
        entry["run"] = s.run
    if s.task != s.id:
        entry["task"] = s.task
    entry["duration"] = w.duration
    if s.estimate is not None:
        entry["estimate"] = s.estimate
    entry.update(_demand_entry(r))
    if s.environment is not None:
        entry["environment"] = s.environment
    return entry


def _demand_entry(r: Finished) -> dict[str, Any]:
    """The demand as declared; from the pods if the declaration is missing."""
    declared = {k: v for k, v in r.demand.items() if k in ("resources", "replicas", "ray", "spark")}
    if declared:
        return declared
    pods = [Pod.from_dict(p) for p in r.pods]
    if len(pods) == 1:
        return {"resources": pod_entry(pods[0])}
    return {"resources": pod_entry(pods[0]), "replicas": len(pods)}


def dump(doc: Mapping[str, Any], header: str = "") -> str:
    """YAML text, with ``header`` as comment lines on top."""
    body = yaml.safe_dump(dict(doc), sort_keys=False, default_flow_style=None, width=100)
    head = "".join(f"# {line}\n" if line else "#\n" for line in header.splitlines())
    return head + body


# --- proposals ---------------------------------------------------------------------


_PROPOSAL_KEYS = ("queues", "org", "clusters", "environments")


def apply_proposal(layout: Layout, text: str, source: str) -> Layout:
    """``layout`` changed by the proposal in ``text``.

    Raises:
        ProposalError: not YAML, an unknown key, a queue the layout lacks, a bad value
            (each named with its file, field and value).
    """
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ProposalError(f"{source}: not valid YAML: {' '.join(str(exc).split())}") from None
    if doc is None:
        doc = {}
    if not isinstance(doc, dict):
        raise ProposalError(f"{source}: expected a mapping with {', '.join(_PROPOSAL_KEYS)}")
    for k in doc:
        if k not in _PROPOSAL_KEYS:
            raise ProposalError(
                f"{source}: {k}: not a proposal field (fields: {', '.join(_PROPOSAL_KEYS)})"
            )
    out = replace(layout)
    if doc.get("clusters") is not None or doc.get("environments") is not None:
        out = _with_fleet(out, doc, source)
    if doc.get("queues") is not None:
        out = replace(out, queues=_changed_queues(out, doc["queues"], source))
    if doc.get("org") is not None:
        out = replace(out, org=_changed_org(out.org, doc["org"], source))
    return out


def _changed_queues(layout: Layout, entries: Any, source: str) -> list[QueueSpec]:
    if not isinstance(entries, list):
        raise ProposalError(f"{source}: queues: expected a list of queues, got {entries!r}")
    by_name = {q.name: q for q in layout.queues}
    clusters = {c.name for c in layout.clusters}
    for i, e in enumerate(entries):
        where = f"{source}: queues[{i}]"
        if not isinstance(e, dict):
            raise ProposalError(f"{where}: expected a mapping with a name, got {e!r}")
        name = e.get("name")
        if name not in by_name:
            raise ProposalError(
                f"{where}.name: {name!r} is not a queue of the recorded layout"
                f" (queues: {', '.join(by_name)})"
            )
        try:
            fields = queue_changes({k: v for k, v in e.items() if k != "name"}, f"queues[{i}]")
        except ScenarioError as exc:
            msg = str(exc).removeprefix(f"queues[{i}]: ")
            raise ProposalError(f"{source}: {msg}") from None
        sel = fields.get("clusters")
        for c in sel or ():
            if c not in clusters:
                raise ProposalError(
                    f"{where}.clusters: {c!r} is not a cluster of the fleet"
                    f" (clusters: {', '.join(sorted(clusters))})"
                )
        by_name[name] = by_name[name].with_changes(**fields)
    return list(by_name.values())


def _changed_org(org: OrgLimits, entry: Any, source: str) -> OrgLimits:
    if not isinstance(entry, dict):
        raise ProposalError(f"{source}: org: expected a mapping, got {entry!r}")
    merged = {**org.to_dict(), **entry}
    text = yaml.safe_dump({"clusters": [], "org": merged})
    try:
        return parse_fleet(text, f"{source} (org)").org
    except ScenarioError as exc:
        raise ProposalError(str(exc)) from None


def _with_fleet(layout: Layout, doc: Mapping[str, Any], source: str) -> Layout:
    fleet: dict[str, Any] = {
        "clusters": doc.get("clusters") or layout_doc(layout)["clusters"],
    }
    if doc.get("environments") is not None:
        fleet["environments"] = doc["environments"]
    try:
        parsed = parse_fleet(yaml.safe_dump(fleet), source)
    except ScenarioError as exc:
        raise ProposalError(str(exc)) from None
    envs = parsed.environments if doc.get("environments") is not None else layout.environments
    return replace(layout, clusters=parsed.clusters, environments=envs)
