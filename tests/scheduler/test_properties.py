"""Property tests over random fleets, queues and workloads, driving ``Scheduler`` directly.

After every scheduling cycle, from what the scheduler reported (``Admitted``: cluster and
node of every pod) and nothing of its internals except the free vectors:

- no queue exceeds max_resources or its concurrency caps; the org stays in its envelope;
- no node holds more than its shape; every pod fits its node (typed GPUs on that type);
  a gang is placed whole on one cluster; the free vectors never go negative;
- strict priority at the moment of a pass: a waiting action whose last reason is a gate or
  NoClusterCapacity would still be blocked with every lower-priority start of that cycle
  undone (a lower-priority queue never takes what a higher one could have started with);
- running work is never preempted: an action, once started, runs until we finish it;
- the same input gives byte-identical JSON; a snapshot round-trip mid-run continues with
  the same decisions as the original.
"""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from headway.scheduler import (
    ActionSpec,
    Algorithm,
    ClusterSpec,
    NodeGroup,
    OrgLimits,
    Priority,
    QueueSpec,
    Quota,
    Scheduler,
    Usage,
)
from headway.scheduler.fit import runs_of, sort_pods
from headway.scheduler.model import ray_demand, replicas_demand, spark_demand
from headway.scheduler.resources import Pod
from headway.scheduler.scenario import Scenario, WorkItem
from headway.scheduler.simulator import render_json, simulate
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

GI = 2**30
TYPES = ["H200", "A100", None]  # None: bare-count GPUs

SETTINGS = settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


@dataclass
class World:
    clusters: list[ClusterSpec]
    queues: list[QueueSpec]
    org: OrgLimits
    work: list[WorkItem]


@st.composite
def node_shape(draw: st.DrawFn) -> Pod:
    gpus = draw(st.sampled_from([0, 2, 4, 8]))
    gtype = draw(st.sampled_from(TYPES)) if gpus else None
    return Pod(
        cpu=draw(st.sampled_from([4, 8, 16])) * 1000,
        memory=draw(st.sampled_from([16, 64])) * GI,
        gpu=gpus,
        gpu_type=gtype,
    )


@st.composite
def clusters(draw: st.DrawFn) -> list[ClusterSpec]:
    n = draw(st.integers(1, 3))
    out = []
    for i in range(n):
        groups = tuple(
            NodeGroup(f"g{j}", draw(st.integers(1, 3)), draw(node_shape()))
            for j in range(draw(st.integers(1, 3)))
        )
        known = draw(st.sampled_from([True, True, True, True, False]))
        out.append(ClusterSpec(f"c{i}", groups, known))
    return out


@st.composite
def pod(draw: st.DrawFn) -> Pod:
    gpus = draw(st.sampled_from([0, 0, 1, 2, 4]))
    gtype = draw(st.sampled_from(TYPES)) if gpus else None
    return Pod(
        cpu=draw(st.sampled_from([500, 1000, 2000, 4000])),
        memory=draw(st.sampled_from([1, 4, 8])) * GI,
        gpu=gpus,
        gpu_type=gtype,
    )


def opt(s: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.one_of(st.none(), s)


@st.composite
def queues(draw: st.DrawFn, cnames: list[str]) -> list[QueueSpec]:
    out = []
    for i in range(draw(st.integers(1, 3))):
        quota = None
        if draw(st.booleans()):
            gq = draw(opt(st.integers(1, 12)))
            cq = draw(opt(st.integers(2, 24)))
            quota = Quota(
                cpu=cq * 1000 if cq is not None else None,
                gpu=gq,
                gpu_type=draw(st.sampled_from(TYPES)) if gq is not None else None,
            )
        sel = None
        if draw(st.booleans()):
            sel = tuple(sorted(draw(st.sets(st.sampled_from(cnames), min_size=1))))
        out.append(
            QueueSpec(
                name=f"q{i}",
                priority=draw(st.sampled_from(list(Priority))),
                algorithm=draw(st.sampled_from(list(Algorithm))),
                run_concurrency=draw(opt(st.integers(1, 4))),
                action_concurrency=draw(opt(st.integers(1, 6))),
                per_run_concurrency=draw(opt(st.integers(1, 3))),
                depth=draw(opt(st.integers(1, 12))),
                max_resources=quota,
                clusters=sel,
            )
        )
    return out


@st.composite
def demand(draw: st.DrawFn) -> tuple[Pod, ...]:
    kind = draw(st.sampled_from(["single", "single", "replicas", "ray", "spark"]))
    if kind == "single":
        return (draw(pod()),)
    if kind == "replicas":
        return replicas_demand(draw(pod()), draw(st.integers(2, 4)))
    if kind == "ray":
        groups = [(draw(st.integers(1, 3)), draw(pod())) for _ in range(draw(st.integers(1, 2)))]
        return ray_demand(draw(pod()), groups)
    return spark_demand(draw(pod()), draw(pod()), draw(st.integers(1, 4)))


@st.composite
def worlds(draw: st.DrawFn) -> World:
    cs = draw(clusters())
    qs = draw(queues([c.name for c in cs]))
    org = OrgLimits(
        max_concurrent_runs=draw(opt(st.integers(1, 5))),
        max_concurrent_actions=draw(opt(st.integers(1, 8))),
        max_actions_per_run=draw(opt(st.integers(1, 6))),
    )
    work = []
    for i in range(draw(st.integers(1, 30))):
        dur = draw(st.sampled_from([0, 5, 10, 30, 60, 200]))
        est_mode = draw(st.sampled_from(["none", "exact", "over", "under"]))
        est = {"none": None, "exact": dur, "over": dur * 2 + 5, "under": dur / 2}[est_mode]
        spec = ActionSpec(
            id=f"a{i}",
            queue=f"q{draw(st.integers(0, len(qs) - 1))}",
            pods=draw(demand()),
            run=f"r{draw(st.integers(0, 4))}",
            task=f"t{draw(st.integers(0, 2))}",
            submit=float(draw(st.sampled_from([0, 0, 5, 10, 20, 40, 80]))),
            seq=i,
            estimate=None if est is None else float(est),
        )
        work.append(WorkItem(spec, float(dur)))
    work.sort(key=lambda w: (w.spec.submit, w.spec.seq))
    return World(cs, qs, org, work)


# --------------------------------------------------------------------------- a driver


@dataclass
class Running:
    spec: ActionSpec
    cluster: str
    nodes: tuple[str, ...]
    start: float
    end: float
    at_call: int


class Driver:
    """The simulator's loop, kept minimal, recording every decision."""

    def __init__(self, w: World) -> None:
        self.w = w
        self.s = Scheduler(w.clusters, w.queues, w.org)
        self.qspec = {q.name: q for q in w.queues}
        self.cspec = {c.name: c for c in w.clusters}
        self.running: dict[str, Running] = {}
        self.started: set[str] = set()
        self.decisions: list[tuple[float, str, str, tuple[str, ...]]] = []
        self.calls = 0

    def times(self) -> list[float]:
        return sorted({w.spec.submit for w in self.w.work})

    def step(self, now: float, subs: list[WorkItem], check: bool = True) -> None:
        first = True
        while True:
            done = [r for r in self.running.values() if r.end <= now]
            if not first and not done:
                return
            for r in sorted(done, key=lambda r: (r.end, r.spec.seq)):
                assert self.s.state(r.spec.id) == "running", "preempted before its end"
                self.s.finish(r.spec.id, now)
                del self.running[r.spec.id]
            if first:
                for wi in subs:
                    self.s.submit(wi.spec, now)
            first = False
            for r in self.running.values():
                assert self.s.state(r.spec.id) == "running"
            self.calls += 1
            adm = self.s.schedule(now)
            dur = {wi.spec.id: wi.duration for wi in self.w.work}
            for a in adm:
                assert a.action_id not in self.started, f"{a.action_id} started twice"
                self.started.add(a.action_id)
                spec = next(wi.spec for wi in self.w.work if wi.spec.id == a.action_id)
                self.running[a.action_id] = Running(
                    spec, a.cluster, a.nodes, now, now + dur[a.action_id], self.calls
                )
                self.decisions.append((now, a.action_id, a.cluster, a.nodes))
            if check:
                self.check(now, adm)

    def next_end(self) -> float | None:
        return min((r.end for r in self.running.values()), default=None)

    def run(self, upto: int | None = None) -> None:
        """All submissions (or the first ``upto`` distinct submit times), then drain."""
        pending = list(self.w.work)
        times = self.times()
        if upto is not None:
            times = times[:upto]
        for t in times:
            while (e := self.next_end()) is not None and e < t:
                self.step(e, [])
            self.step(t, [wi for wi in pending if wi.spec.submit == t])
        if upto is None:
            while (e := self.next_end()) is not None:
                self.step(e, [])

    # ----------------------------------------------------------------------- invariants

    def check(self, now: float, adm: list[Any]) -> None:
        by_q: dict[str, list[Running]] = defaultdict(list)
        for r in self.running.values():
            by_q[r.spec.queue].append(r)
        for qn, rs in by_q.items():
            q = self.qspec[qn]
            if q.max_resources is not None:
                assert not q.max_resources.exceeded_by(
                    Usage.of(p for r in rs for p in r.spec.pods), Usage()
                ), qn
            if q.action_concurrency is not None:
                assert len(rs) <= q.action_concurrency
            if q.run_concurrency is not None:
                assert len({r.spec.run_id for r in rs}) <= q.run_concurrency
            if q.per_run_concurrency is not None:
                per: dict[str, int] = defaultdict(int)
                for r in rs:
                    per[r.spec.run_id] += 1
                assert max(per.values()) <= q.per_run_concurrency
        org = self.w.org
        if org.max_concurrent_actions is not None:
            assert len(self.running) <= org.max_concurrent_actions
        if org.max_concurrent_runs is not None:
            assert len({r.spec.run_id for r in self.running.values()}) <= org.max_concurrent_runs
        # nodes: reconstruct per-node usage from the placements
        used: dict[tuple[str, str], list[int]] = defaultdict(lambda: [0, 0, 0])
        for r in self.running.values():
            c = self.cspec[r.cluster]
            q = self.qspec[r.spec.queue]
            assert q.clusters is None or r.cluster in q.clusters
            if not c.reports_capacity:
                continue
            pods = sort_pods(r.spec.pods)
            assert len(r.nodes) == len(pods), "gang not placed whole"
            shapes = {f"{g.name}-{i}": g.shape for g in c.node_groups for i in range(g.count)}
            for p, n in zip(pods, r.nodes, strict=True):
                shape = shapes[n]
                if p.gpu and p.gpu_type is not None:
                    assert shape.gpu_type == p.gpu_type, (p, n, shape)
                u = used[(r.cluster, n)]
                u[0] += p.cpu
                u[1] += p.memory
                u[2] += p.gpu
                assert u[0] <= shape.cpu and u[1] <= shape.memory and u[2] <= shape.gpu
        for cs in self.s.clusters.values():
            assert min(cs.fcpu + cs.fmem + cs.fgpu + cs.feph, default=0) >= 0
        self.check_priority(now)

    def check_priority(self, now: float) -> None:
        """No waiting action that a lower-priority start of this cycle could have gone to."""
        call_starts = [r for r in self.running.values() if r.at_call == self.calls]
        if not call_starts:
            return
        gate_or_room = {
            "ActionConcurrency", "RunConcurrency", "PerRunConcurrency", "MaxResources",
            "OrgConcurrentActions", "OrgConcurrentRuns", "NoClusterCapacity",
        }  # fmt: skip
        stats = self.s.queue_stats()
        for wi in self.w.work:
            sid = wi.spec.id
            if self.s.state(sid) != "waiting" or self.s.reason(sid) not in gate_or_room:
                continue
            # Held back by a hold or reservation at some point: a lower-priority start may
            # legitimately have taken room under the backfill rules since.
            if {"HeldForGang", "BackfillWindow"} & set(self.s.reasons(sid)):
                continue
            # Behind the blocked head of its own strict queue: never starts before it.
            q = self.qspec[wi.spec.queue]
            head = stats[q.name]["blocked_head"]
            if q.algorithm is Algorithm.strict and head not in (None, sid):
                continue
            hp = self.qspec[wi.spec.queue].priority
            undo = [r for r in call_starts if self.qspec[r.spec.queue].priority < hp]
            if not undo:
                continue
            assert not self.could_start(wi.spec, undo), (
                f"t={now}: {sid} ({hp.name}) waits while lower-priority"
                f" {[r.spec.id for r in undo]} started"
            )

    def could_start(self, spec: ActionSpec, undo: list[Running]) -> bool:
        gone = {r.spec.id for r in undo}
        live = [r for r in self.running.values() if r.spec.id not in gone]
        q = self.qspec[spec.queue]
        mine = [r for r in live if r.spec.queue == q.name]
        runs_q = {r.spec.run_id for r in mine}
        if q.action_concurrency is not None and len(mine) >= q.action_concurrency:
            return False
        if (
            q.run_concurrency is not None
            and spec.run_id not in runs_q
            and len(runs_q) >= q.run_concurrency
        ):
            return False
        if (
            q.per_run_concurrency is not None
            and sum(r.spec.run_id == spec.run_id for r in mine) >= q.per_run_concurrency
        ):
            return False
        if q.max_resources is not None and q.max_resources.exceeded_by(
            Usage.of(p for r in mine for p in r.spec.pods), Usage.of(spec.pods)
        ):
            return False
        org = self.w.org
        if org.max_concurrent_actions is not None and len(live) >= org.max_concurrent_actions:
            return False
        org_runs = {r.spec.run_id for r in live}
        if (
            org.max_concurrent_runs is not None
            and spec.run_id not in org_runs
            and len(org_runs) >= org.max_concurrent_runs
        ):
            return False
        runs = runs_of(sort_pods(spec.pods))
        for c in self.s.clusters.values():
            if not c.healthy or (q.clusters is not None and c.name not in q.clusters):
                continue
            if not c.known:
                return True
            scratch = c.clone()
            for r in undo:
                if r.cluster == c.name and r.nodes:
                    idx = [c.node_names.index(n) for n in r.nodes]
                    scratch.give(runs_of(sort_pods(r.spec.pods)), idx)
            if scratch.place(runs, commit=False) is not None:
                return True
        return False


# --------------------------------------------------------------------------- properties


@SETTINGS
@given(worlds())
def test_invariants_hold_after_every_cycle(w: World) -> None:
    d = Driver(w)
    d.run()
    # everything started ran to its end; nothing left running
    assert not d.running


@SETTINGS
@given(worlds())
def test_simulate_never_preempts_and_is_byte_identical(w: World) -> None:
    sc = Scenario(w.clusters, w.queues, w.org, [], w.work, [])
    r1 = simulate(sc)
    r2 = simulate(Scenario(w.clusters, w.queues, w.org, [], list(w.work), []))
    assert render_json(r1) == render_json(r2)
    dur = {wi.spec.id: wi.duration for wi in w.work}
    for a in r1.doc["actions"]:
        if a["start"] is not None:
            assert a["end"] == a["start"] + dur[a["id"]]
            assert a["start"] >= a["submit"]
            assert a["status"] == "succeeded"
        else:
            assert a["status"] in ("pending", "rejected") and a["end"] is None


@SETTINGS
@given(worlds(), st.integers(1, 6))
def test_snapshot_round_trip_continues_with_the_same_decisions(w: World, cut: int) -> None:
    times = sorted({wi.spec.submit for wi in w.work})
    cut = min(cut, len(times))
    a = Driver(w)
    a.run(upto=cut)
    b = Driver(w)
    b.run(upto=cut)
    # replace b's scheduler with one rebuilt from a JSON round-trip of its snapshot
    snap = json.loads(json.dumps(b.s.to_snapshot()))
    b.s = Scheduler.from_snapshot(snap)
    assert json.loads(json.dumps(b.s.to_snapshot())) == snap
    for d in (a, b):
        rest = times[cut:]
        for t in rest:
            while (e := d.next_end()) is not None and e < t:
                d.step(e, [], check=False)
            d.step(t, [wi for wi in w.work if wi.spec.submit == t], check=False)
        while (e := d.next_end()) is not None:
            d.step(e, [], check=False)
    assert a.decisions == b.decisions
    for wi in w.work:
        assert a.s.reasons(wi.spec.id) == b.s.reasons(wi.spec.id)
