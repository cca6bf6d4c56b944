"""The scheduling policy as one plain pass: the reference the fast core is checked against.

``reference_pass(snapshot, now)`` decides what ``Scheduler.schedule(now)`` decides, from
the same ground truth (``Scheduler.to_snapshot()``), written to be read rather than to be
fast. It remembers nothing from one call to the next and shares no code with the
incremental machinery (``core``, the grouped node index of ``fit``, ``insight``): every
count, sum and fit is worked out again from the running actions and each node's free
capacity, every time it is asked. The rules are those of ``shared/specs/simulate.md``
("Semantics the result must follow") and README.md ("How the scheduler decides").

How a read goes, top down:

- ``reference_pass``: one scheduling cycle. Idle environments past their ``idle_ttl`` go,
  then passes run until one starts nothing; a draining queue left empty becomes drained.
- ``_Pass.run``: one pass. Queues are visited by priority, then the one whose oldest
  waiting action was submitted first, then by name; holds and reservations start empty.
- ``_Pass.visit``: one queue, its waiting actions oldest first (submit time, then file
  order), each decided by ``_Pass.consider``; a strict queue's blocked head stops the
  rest of it.
- ``_Pass.consider``: one action: the gates in order (``gate``), then an existing warm
  environment (``_Pass.in_environment``) or a fit onto the first cluster in placement
  order that has room and that no hold or reservation forbids (``_Pass.place``); a head
  without room holds (``strict``) or reserves (``backfill``, ``easy``: ``_Pass.reserve``).

Below them: the gates, the placement order, best-fit placement (``best_fit``), and the
projection of when a gang would fit as running work ends by its estimates
(``_Pass.earliest_fit``).

Where the spec says less than a decision needs, the reference follows the core's
observable behaviour on the worked examples, and says so where it does: a reserving head
holds, as under strict, a cluster where its reservation cannot be worked out because
running work there has no estimate, and also one where it never fits (pods from outside
Headway keep part of it). EASY's projection takes the nodes busy now first pod by pod,
as the head's pods go in. An action that outlasts several EASY reservations on one
cluster must fit, node by node, in what each of them leaves (and uses each up).

Scale: a pass here costs what the spec's loop costs read literally (every action, every
cluster, every node, pod by pod). It is meant for tests and small scenarios, not a trace.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .model import (
    ActionSpec,
    Algorithm,
    ClusterSpec,
    DemandKind,
    EnvironmentSpec,
    OrgLimits,
    QueueSpec,
    RateLimit,
)
from .model import QueueStatus as Status
from .reasons import Reason
from .resources import Pod, Usage

__all__ = [
    "Admission",
    "Cluster",
    "Decisions",
    "EnvInstance",
    "Running",
    "State",
    "Waiting",
    "best_fit",
    "load_state",
    "one_pass",
    "reference_pass",
    "reference_submit",
]

# A node's free capacity, in the order of a snapshot's free vectors. It may be below zero
# on a node a capacity report found overcommitted (a pod from outside Headway).
CPU, MEMORY, EPH, GPU = 0, 1, 2, 3
Free = list[int]


# ---------------------------------------------------------------------------- the state


@dataclass
class Cluster:
    name: str
    healthy: bool
    known: bool  # False: the cluster reports no capacity ("unknown means open")
    node_names: list[str]
    caps: list[Pod]  # each node's allocatable (its shape)
    free: list[Free]  # each node's free capacity now

    @property
    def types(self) -> list[str | None]:
        """Each node's GPU type (None: bare-count GPUs, or none)."""
        return [p.gpu_type for p in self.caps]

    def total_free(self, dim: int) -> int:
        """Free capacity summed over the nodes; an overcommitted node adds nothing."""
        return sum(max(f[dim], 0) for f in self.free)


@dataclass
class Waiting:
    spec: ActionSpec
    pods: tuple[Pod, ...]  # largest first
    reasons: list[str]  # every distinct reason it was held back for, in order
    last: str | None  # the reason of its latest pass

    @property
    def id(self) -> str:
        return self.spec.id


@dataclass
class Running:
    spec: ActionSpec
    pods: tuple[Pod, ...]  # largest first; ``nodes[i]`` holds ``pods[i]``
    cluster: str
    nodes: list[int]  # empty: in an environment, or on a cluster of unknown capacity
    start: float
    est_end: float | None  # None: no estimate when it started
    charged: bool  # its demand counts against its queue's max_resources
    instance: str | None  # the declared environment it runs inside

    @property
    def id(self) -> str:
        return self.spec.id


@dataclass
class EnvInstance:
    spec: EnvironmentSpec
    cluster: str
    nodes: list[int]  # where its footprint (largest first) was placed
    queue: str  # the queue that placed it: its footprint counts against that quota
    expires_at: float | None

    @property
    def pods(self) -> tuple[Pod, ...]:
        return largest_first(self.spec.footprint)


@dataclass
class State:
    """Ground truth: what a snapshot holds, as plain objects."""

    clusters: dict[str, Cluster]
    queues: dict[str, QueueSpec]
    org: OrgLimits
    env_specs: dict[str, EnvironmentSpec]
    envs: dict[str, EnvInstance]
    waiting: list[Waiting]
    running: list[Running]
    history: dict[str, list[float]]  # per task, its last (up to two) durations
    run_accepted: dict[str, int]
    tokens: float | None
    token_time: float
    queue_tokens: dict[str, tuple[float | None, float]]  # per queue: tokens, as of when
    unknown_capacity_passes: int


def load_state(snap: Mapping[str, Any]) -> State:
    """The state of a ``Scheduler.to_snapshot()`` document."""
    if snap.get("v") != 1:
        raise ValueError(f"snapshot: version {snap.get('v')!r} is not supported")
    # An action row: id, queue, run, task, submit, seq, estimate, environment, kind,
    # demand (an index into the table of demands), reasons, last reason, meta.
    demands = [largest_first([Pod(*row) for row in pods]) for pods in snap["demands"]]

    def spec_of(r: Sequence[Any]) -> ActionSpec:
        return ActionSpec(
            id=r[0],
            queue=r[1],
            pods=demands[r[9]],
            run=r[2],
            task=r[3],
            submit=r[4],
            seq=r[5],
            estimate=r[6],
            environment=r[7],
            kind=DemandKind(r[8]),
            meta=r[12] or {},
        )

    clusters = {}
    for c in snap["clusters"]:
        spec = ClusterSpec.from_dict(c["spec"])
        fc, fm, fe, fg = c["free"]
        clusters[spec.name] = Cluster(
            name=spec.name,
            healthy=c["healthy"],
            known=c["known"],
            node_names=list(c["names"]),
            caps=[Pod(*row) for row in c["caps"]],
            free=[[fc[i], fm[i], fe[i], fg[i]] for i in range(len(c["caps"]))],
        )
    env_specs = {e["name"]: EnvironmentSpec.from_dict(e) for e in snap["env_specs"]}
    return State(
        clusters=clusters,
        queues={q["name"]: QueueSpec.from_dict(q) for q in snap["queues"]},
        org=OrgLimits.from_dict(snap["org"]),
        env_specs=env_specs,
        envs={
            e["name"]: EnvInstance(
                env_specs[e["name"]], e["cluster"], list(e["nodes"]), e["queue"], e["expires_at"]
            )
            for e in snap["envs"]
        },
        waiting=[Waiting(spec_of(r), demands[r[9]], list(r[10]), r[11]) for r in snap["waiting"]],
        running=[
            Running(
                spec=spec_of(r),
                pods=demands[r[9]],
                cluster=cluster,
                nodes=list(nodes),
                start=start,
                est_end=est_end,
                charged=charged,
                instance=inst,
            )
            for r, cluster, nodes, start, _est, est_end, charged, inst in snap["running"]
        ],
        history={k: list(v) for k, v in snap["history"].items()},
        run_accepted=dict(snap["run_accepted"]),
        tokens=snap["tokens"],
        token_time=snap["token_time"],
        queue_tokens={n: (k, at) for n, (k, at) in (snap.get("queue_tokens") or {}).items()},
        unknown_capacity_passes=snap["unknown_capacity_passes"],
    )


# --------------------------------------------------------------------- fitting on nodes


def largest_first(pods: Sequence[Pod]) -> tuple[Pod, ...]:
    """By GPU, then CPU, memory, ephemeral storage; ties keep the declared order."""
    return tuple(sorted(pods, key=lambda p: (-p.gpu, -p.cpu, -p.memory, -p.eph)))


def _need(p: Pod) -> Free:
    return [p.cpu, p.memory, p.eph, p.gpu]


def fits(free: Free, gpu_type: str | None, p: Pod) -> bool:
    """Does one pod fit a node with this much free? Every resource the pod asks for must
    be free; a typed GPU demand fits only a node of that type (never bare-count GPUs)."""
    if p.gpu and p.gpu_type is not None and gpu_type != p.gpu_type:
        return False
    return (
        (not p.cpu or free[CPU] >= p.cpu)
        and (not p.memory or free[MEMORY] >= p.memory)
        and (not p.eph or free[EPH] >= p.eph)
        and (not p.gpu or free[GPU] >= p.gpu)
    )


def take(free: list[Free], pods: Sequence[Pod], nodes: Sequence[int], sign: int = 1) -> None:
    """Take ``pods[i]`` from node ``nodes[i]`` (``sign`` -1 gives them back). A node that
    is no longer there (a capacity report dropped it) is skipped."""
    for p, i in zip(pods, nodes, strict=False):
        if 0 <= i < len(free):
            for d, n in enumerate(_need(p)):
                free[i][d] -= sign * n


def best_fit(
    free: list[Free],
    types: Sequence[str | None],
    pods: Sequence[Pod],
    limit: list[Free] | None = None,
    now: list[Free] | None = None,
) -> list[int] | None:
    """Place a gang whole, or not at all: each pod, largest first, on the node with the
    least free GPU that holds it, then the least free CPU, then the first in node order.

    ``limit`` (EASY's extra): each pod must fit its node there too. ``now`` (EASY's
    projection of its head at the reservation time): among nodes that tie, those busy now
    (more free in ``free`` than in ``now``) go first, so what is free now stays free for
    work that can start now. Returns each pod's node; ``free`` and ``limit`` are left as
    they were.
    """
    scratch = [f[:] for f in free]
    lim = [f[:] for f in limit] if limit is not None else None
    out: list[int] = []
    for p in largest_first(pods):
        holding = [
            i
            for i in range(len(scratch))
            if fits(scratch[i], types[i], p) and (lim is None or fits(lim[i], types[i], p))
        ]
        if not holding:
            return None

        def tightest(i: int) -> tuple[int, int, bool, int]:
            f = scratch[i]
            idle = now is not None and all(f[d] <= now[i][d] for d in range(4))
            return (f[GPU], f[CPU], idle, i)

        i = min(holding, key=tightest)
        take(scratch, [p], [i])
        if lim is not None:
            take(lim, [p], [i])
        out.append(i)
    return out


def could_ever_hold(c: Cluster, pods: Sequence[Pod]) -> bool:
    """Would the gang fit on ``c`` emptied (its node shapes alone)? Unknown: yes."""
    if not c.known:
        return True
    return best_fit([_need(cap) for cap in c.caps], c.types, pods) is not None


def has_room(c: Cluster, pods: Sequence[Pod]) -> bool:
    """Room now: the placement succeeds for the whole gang. Unknown capacity is open."""
    return not c.known or best_fit(c.free, c.types, pods) is not None


# ------------------------------------------------------- what runs: counts and estimates


def usage_of(pods: Sequence[Pod]) -> Usage:
    u = Usage()
    for p in pods:
        u.add_pod(p)
    return u


def queue_usage(st: State, queue: str) -> Usage:
    """What counts against a queue's max_resources: its running actions' demand, and the
    footprint of every warm environment it placed (until the environment goes)."""
    u = Usage()
    for r in st.running:
        if r.spec.queue == queue and r.charged:
            u.add(usage_of(r.pods))
    for inst in st.envs.values():
        if inst.queue == queue:
            u.add(usage_of(inst.pods))
    return u


def estimate(st: State, a: ActionSpec) -> float | None:
    """The declared estimate; else the mean of the task's last two completed durations."""
    if a.estimate is not None:
        return a.estimate
    h = st.history.get(a.task_id)
    return sum(h) / len(h) if h else None


def gate(st: State, q: QueueSpec, a: ActionSpec, demand: Usage) -> Reason | None:
    """The first gate the action fails, in the documented order, or None."""
    mine = [r for r in st.running if r.spec.queue == q.name]
    runs = {r.spec.run_id for r in mine}
    run = a.run_id
    if q.action_concurrency is not None and len(mine) >= q.action_concurrency:
        return Reason.ActionConcurrency
    if q.run_concurrency is not None and run not in runs and len(runs) >= q.run_concurrency:
        return Reason.RunConcurrency
    in_run = sum(1 for r in mine if r.spec.run_id == run)
    if q.per_run_concurrency is not None and in_run >= q.per_run_concurrency:
        return Reason.PerRunConcurrency
    if q.max_resources is not None and q.max_resources.exceeded_by(queue_usage(st, q.name), demand):
        return Reason.MaxResources
    org = st.org
    if org.max_concurrent_actions is not None and len(st.running) >= org.max_concurrent_actions:
        return Reason.OrgConcurrentActions
    org_runs = {r.spec.run_id for r in st.running}
    if (
        org.max_concurrent_runs is not None
        and run not in org_runs
        and len(org_runs) >= org.max_concurrent_runs
    ):
        return Reason.OrgConcurrentRuns
    return None


# ----------------------------------------------------------------- where work may go


def eligible(st: State, q: QueueSpec, healthy_only: bool = True) -> list[Cluster]:
    """The clusters of the queue's selector (any, if it has none), healthy ones only."""
    names = list(st.clusters) if q.clusters is None else q.clusters
    cs = [st.clusters[n] for n in names if n in st.clusters]
    return [c for c in cs if c.healthy or not healthy_only]


def placement_order(st: State, cs: Sequence[Cluster], env: str | None) -> list[Cluster]:
    """Clusters in the order an action tries them: where another action of its (not
    declared) environment runs now; then known capacity before unknown; then the most
    free GPU, the most free CPU, the name."""
    near = set()
    if env is not None and env not in st.env_specs:
        near = {r.cluster for r in st.running if r.spec.environment == env}

    def key(c: Cluster) -> tuple[bool, bool, int, int, str]:
        if not c.known:
            return (c.name not in near, True, 0, 0, c.name)
        return (c.name not in near, False, -c.total_free(GPU), -c.total_free(CPU), c.name)

    return sorted(cs, key=key)


# ------------------------------------------------------------------------ decisions


@dataclass(frozen=True)
class Admission:
    """As ``core.Admitted``: where the action starts and why it had waited."""

    action_id: str
    cluster: str
    nodes: tuple[str, ...]
    reasons: tuple[str, ...]


@dataclass
class Decisions:
    admitted: list[Admission]
    # Per waiting action: its reason now, and every distinct reason it has had.
    waiting: dict[str, tuple[str | None, tuple[str, ...]]]
    state: State  # after the cycle
    passes: int


@dataclass
class _Reservation:
    """A blocked head's reservation on one cluster: the time it would fit there, and
    (EASY) what its projected placement then leaves free on each node."""

    time: float
    head: str
    extra: list[Free] | None


@dataclass
class _Visit:
    queue: QueueSpec
    clusters: list[Cluster]  # the queue's eligible clusters (selector, healthy)
    blocked: bool = False  # strict: its head could not start, nothing later starts
    reserved: bool = False  # backfill/easy: its head has made its reservation

    @property
    def strict(self) -> bool:
        return self.queue.algorithm is Algorithm.strict

    @property
    def reserving(self) -> bool:
        return self.queue.algorithm in (Algorithm.backfill, Algorithm.easy)


@dataclass
class _Pass:
    st: State
    now: float
    # Made as the pass visits queues; binding what is considered after them.
    holds: dict[str, str] = field(default_factory=dict)  # cluster -> holding head
    reservations: dict[str, list[_Reservation]] = field(default_factory=dict)
    admitted: list[Admission] = field(default_factory=list)

    def run(self) -> list[Admission]:
        st = self.st

        def order(q: QueueSpec) -> tuple[int, float, str]:
            head = min(a.spec.submit for a in st.waiting if a.spec.queue == q.name)
            return (-q.priority, head, q.name)

        busy = [q for q in st.queues.values() if any(a.spec.queue == q.name for a in st.waiting)]
        for q in sorted(busy, key=order):
            self.visit(q)
        return self.admitted

    def visit(self, q: QueueSpec) -> None:
        v = _Visit(q, eligible(self.st, q))
        mine = [a for a in self.st.waiting if a.spec.queue == q.name]
        mine.sort(key=lambda a: (a.spec.submit, a.spec.seq))
        for a in mine:
            r = self.consider(v, a)
            if r is not None:
                note(a, r)

    def consider(self, v: _Visit, a: Waiting) -> Reason | None:
        """Admit ``a`` (None) or say why not."""
        st = self.st
        env = a.spec.environment
        declared = env is not None and env in st.env_specs
        inst = st.envs.get(env) if declared and env is not None else None
        # What the action needs placed: nothing inside a running environment; the
        # environment's footprint if it is declared and not placed yet; else its own pods.
        pods: tuple[Pod, ...]
        if inst is not None:
            pods = ()
        elif declared and env is not None:
            pods = largest_first(st.env_specs[env].footprint)
        else:
            pods = a.pods
        r = gate(st, v.queue, a.spec, usage_of(pods))
        if r is None and inst is not None:
            r = self.in_environment(v, a, inst)
        elif r is None:
            r = self.place(v, a, pods, env if not declared else None)
        if r is not None and v.strict:
            v.blocked = True
        return r

    def in_environment(self, v: _Visit, a: Waiting, inst: EnvInstance) -> Reason | None:
        """An action of a placed environment: no room or quota needed, but its queue must
        be allowed the environment's cluster, whose holds and reservations apply."""
        c = self.st.clusters.get(inst.cluster)
        if c is None or all(x.name != c.name for x in v.clusters):
            return Reason.NoClusterCapacity
        if v.blocked or c.name in self.holds:
            return Reason.HeldForGang
        if c.name in self.reservations and self.backfills(a, c, ()) is None:
            return Reason.BackfillWindow
        inside = sum(1 for r in self.st.running if r.instance == inst.spec.name)
        if inside >= inst.spec.slots:
            return Reason.EnvironmentBusy
        inst.expires_at = None
        self.admit(a, c, [], instance=inst.spec.name)
        return None

    def place(self, v: _Visit, a: Waiting, pods: tuple[Pod, ...], env: str | None) -> Reason | None:
        """The first cluster in placement order with room that no hold or reservation
        forbids takes the gang; else the reason of the first one with room."""
        roomy = [c for c in placement_order(self.st, v.clusters, env) if has_room(c, pods)]
        if not roomy:
            self.no_room(v, a, pods)
            return Reason.NoClusterCapacity
        if v.blocked:
            return Reason.HeldForGang  # behind the blocked head of its strict queue
        first: Reason | None = None
        for c in roomy:
            if c.name in self.holds:
                first = first or Reason.HeldForGang
                continue
            uses: list[_Reservation] = []
            if c.name in self.reservations:
                allowed = self.backfills(a, c, pods)
                if allowed is None:
                    first = first or Reason.BackfillWindow
                    continue
                uses = allowed
            self.start_on(v, a, c, pods, uses)
            return None
        assert first is not None
        return first

    def start_on(
        self, v: _Visit, a: Waiting, c: Cluster, pods: tuple[Pod, ...], uses: list[_Reservation]
    ) -> None:
        """Place the gang on ``c`` (known capacity: best fit, within the EASY extras it
        uses, which it then uses up) and start ``a``; the first action of a declared
        environment places the environment's footprint and runs inside it."""
        nodes: list[int] = []
        if c.known:
            limit = _narrowest([u.extra for u in uses if u.extra is not None])
            got = best_fit(c.free, c.types, pods, limit=limit)
            assert got is not None  # it has room, and backfills() checked the limit
            nodes = got
            take(c.free, pods, nodes)
            for u in uses:
                assert u.extra is not None
                take(u.extra, pods, nodes)
        env = a.spec.environment
        if env is not None and env in self.st.env_specs:
            spec = self.st.env_specs[env]
            self.st.envs[env] = EnvInstance(spec, c.name, nodes, v.queue.name, None)
            self.admit(a, c, [], instance=env)
        else:
            self.admit(a, c, nodes, instance=None)

    def no_room(self, v: _Visit, a: Waiting, pods: tuple[Pod, ...]) -> None:
        """The first head without room anywhere: a strict one holds every eligible
        cluster whose node shapes could hold it; a backfill or EASY one reserves."""
        if v.strict and not v.blocked:
            for c in v.clusters:
                if c.known and could_ever_hold(c, pods):
                    self.hold(c.name, a.id)
        elif v.reserving and not v.reserved:
            v.reserved = True
            self.reserve(v, a, pods)

    def hold(self, cluster: str, head: str) -> None:
        self.holds.setdefault(cluster, head)

    def reserve(self, v: _Visit, head: Waiting, pods: tuple[Pod, ...]) -> None:
        """The earliest time, over the eligible clusters, at which the head would fit as
        running work ends by its estimates (ties: placement order). A cluster where that
        cannot be worked out (running work without an estimate), or where the head
        never fits, is held instead, as under strict."""
        st = self.st
        env = head.spec.environment
        easy = v.queue.algorithm is Algorithm.easy
        best: tuple[float, Cluster, list[Free] | None] | None = None
        for c in placement_order(st, v.clusters, env if env not in st.env_specs else None):
            if not c.known or not could_ever_hold(c, pods):
                continue
            fit = self.earliest_fit(c, pods, easy)
            if fit is None:
                self.hold(c.name, head.id)
            elif best is None or fit[0] < best[0]:
                best = (fit[0], c, fit[1])
        if best is not None:
            t, c, extra = best
            self.reservations.setdefault(c.name, []).append(_Reservation(t, head.id, extra))

    def earliest_fit(
        self, c: Cluster, pods: tuple[Pod, ...], easy: bool
    ) -> tuple[float, list[Free] | None] | None:
        """When ``pods`` would fit on ``c``: the first time, as running work gives its
        nodes back at its estimated end (one past its estimate: now), at which they do;
        with EASY, what the head's projected placement then leaves free. None if a
        running action there has no estimate, or the gang never fits."""
        st, now = self.st, self.now
        here = [r for r in st.running if r.cluster == c.name]
        if any(r.est_end is None for r in here):
            return None

        def gone_at(r: Running) -> float:
            assert r.est_end is not None  # (checked above)
            return max(r.est_end, now)  # one past its estimate ends now

        releases = [(gone_at(r), r.pods, r.nodes) for r in here if r.nodes]
        for inst in st.envs.values():
            if inst.cluster != c.name or not inst.nodes:
                continue
            ends = [gone_at(r) for r in here if r.instance == inst.spec.name]
            if ends:
                # It goes idle_ttl after its last action ends.
                t = max(ends) + inst.spec.idle_ttl
            else:
                t = inst.expires_at if inst.expires_at is not None else now
            releases.append((max(t, now), inst.pods, inst.nodes))
        types = c.types
        for t in sorted({rel[0] for rel in releases}):
            then = [f[:] for f in c.free]
            for t_end, gone, where in releases:
                if t_end <= t:
                    take(then, gone, where, sign=-1)
            nodes = best_fit(then, types, pods, now=c.free if easy else None)
            if nodes is not None:
                if not easy:
                    return t, None
                take(then, pods, nodes)
                return t, then
        return None

    def backfills(self, a: Waiting, c: Cluster, pods: tuple[Pod, ...]) -> list[_Reservation] | None:
        """May ``a`` start on ``c`` under its reservations? It must be gone by each
        reservation's time (estimated end <= it), or (EASY) also fit now in what that
        head's projected placement leaves. None: no; else the reservations whose extra
        it uses up. An action with no estimate is never backfilled."""
        est = estimate(self.st, a.spec)
        if est is None:
            return None
        end = self.now + est
        outlasts = [r for r in self.reservations[c.name] if end > r.time]
        if any(r.extra is None for r in outlasts):
            return None
        if outlasts and pods:
            limit = _narrowest([r.extra for r in outlasts if r.extra is not None])
            if best_fit(c.free, c.types, pods, limit=limit) is None:
                return None
        return outlasts

    def admit(self, a: Waiting, c: Cluster, nodes: list[int], instance: str | None) -> None:
        """Start ``a`` on ``c`` (on ``nodes``, or inside warm environment ``instance``): it
        keeps the estimate it has now."""
        st = self.st
        est = estimate(st, a.spec)
        st.waiting.remove(a)
        st.running.append(
            Running(
                spec=a.spec,
                pods=a.pods,
                cluster=c.name,
                nodes=nodes,
                start=self.now,
                est_end=self.now + est if est is not None else None,
                charged=instance is None,
                instance=instance,
            )
        )
        if not c.known:
            st.unknown_capacity_passes += 1
        self.admitted.append(
            Admission(a.id, c.name, tuple(c.node_names[i] for i in nodes), tuple(a.reasons))
        )


def _narrowest(extras: Sequence[list[Free]]) -> list[Free] | None:
    """What is free in every one of ``extras``, node by node (None: no extra)."""
    if not extras:
        return None
    return [[min(x[i][d] for x in extras) for d in range(4)] for i in range(len(extras[0]))]


def note(a: Waiting, r: str) -> None:
    """The action's reason this pass: its latest, and once in its list."""
    a.last = r
    if r not in a.reasons:
        a.reasons.append(r)


def one_pass(st: State, now: float) -> list[Admission]:
    """One pass over ``st`` (changed in place): what it admits."""
    return _Pass(st, now).run()


def expire_environments(st: State, now: float) -> list[str]:
    """Idle environments whose idle_ttl has passed give their nodes back."""
    gone = []
    for name, inst in list(st.envs.items()):
        idle = not any(r.instance == name for r in st.running)
        if idle and inst.expires_at is not None and inst.expires_at <= now:
            c = st.clusters.get(inst.cluster)
            if c is not None:
                take(c.free, inst.pods, inst.nodes, sign=-1)
            del st.envs[name]
            gone.append(name)
    return gone


def reference_pass(snapshot: Mapping[str, Any], now: float) -> Decisions:
    """``Scheduler.schedule(now)`` on the state ``snapshot`` holds, decided plainly."""
    st = load_state(snapshot)
    expire_environments(st, now)
    admitted: list[Admission] = []
    passes = 0
    while True:
        passes += 1
        got = one_pass(st, now)
        admitted += got
        if not got:
            break
    for name, q in st.queues.items():
        holds_work = any(a.spec.queue == name for a in st.waiting) or any(
            r.spec.queue == name for r in st.running
        )
        if q.status is Status.draining and not holds_work:
            st.queues[name] = q.with_changes(status=Status.drained)
    waiting = {a.id: (a.last, tuple(a.reasons)) for a in st.waiting}
    return Decisions(admitted, waiting, st, passes)


def reference_expired(snapshot: Mapping[str, Any], now: float) -> list[str]:
    """``Scheduler.expire_waiting``'s answer on the state ``snapshot`` holds: per queue
    (in the snapshot's order), its waiting actions that have waited its
    ``max_queued_time`` at ``now`` and that a pass has decided about, oldest first."""
    st = load_state(snapshot)
    out: list[str] = []
    for name, q in st.queues.items():
        limit = q.max_queued_time
        if limit is None:
            continue
        mine = [a.spec for a in st.waiting if a.spec.queue == name and a.last is not None]
        due = [a for a in mine if now - a.queued_since >= limit]
        out += [a.id for a in sorted(due, key=lambda a: (a.submit, a.seq))]
    return out


def _tokens_at(rate: RateLimit, tokens: float | None, at: float, now: float) -> float:
    """A token bucket's tokens at ``now``: it starts full and refills continuously up to
    its burst; time never runs backwards for it (a submission dated before the last
    refills nothing)."""
    if tokens is None:
        return rate.burst
    return min(rate.burst, tokens + max(now - at, 0.0) * rate.per_second)


def reference_submit(snapshot: Mapping[str, Any], action: ActionSpec, now: float) -> Reason | None:
    """``Scheduler.submit``'s answer for ``action`` on the state ``snapshot`` holds: the
    first submission check it fails, in the documented order, or None (accepted)."""
    st = load_state(snapshot)
    q = st.queues.get(action.queue)
    if q is None:
        return Reason.UnknownQueue
    if q.status is not Status.active:
        return Reason.QueueDraining
    held = sum(1 for a in st.waiting if a.spec.queue == q.name)
    held += sum(1 for r in st.running if r.spec.queue == q.name)
    if q.depth is not None and held >= q.depth:
        return Reason.QueueDepthExceeded
    org_rate = st.org.submit_rate
    if org_rate is not None and _tokens_at(org_rate, st.tokens, st.token_time, now) < 1.0:
        return Reason.RateLimited
    q_rate = q.submit_rate
    if q_rate is not None:
        q_tokens, q_time = st.queue_tokens.get(q.name, (None, 0.0))
        if _tokens_at(q_rate, q_tokens, q_time, now) < 1.0:
            return Reason.RateLimited
    cap = st.org.max_actions_per_run
    if cap is not None and st.run_accepted.get(action.run_id, 0) >= cap:
        return Reason.FanOutExceeded
    env = action.environment
    if env is not None and env in st.env_specs:
        if env in st.envs:
            return None  # it runs inside the placed environment: nothing to fit
        pods = largest_first(st.env_specs[env].footprint)
    else:
        pods = largest_first(action.pods)
    if q.max_resources is not None and q.max_resources.exceeded_by(Usage(), usage_of(pods)):
        return Reason.Unschedulable
    if not any(could_ever_hold(c, pods) for c in eligible(st, q, healthy_only=False)):
        return Reason.Unschedulable
    return None
