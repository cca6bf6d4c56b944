"""Ground truth: what happened, and nothing a policy derived.

The records of running and waiting work, queues and environments, and the events
that change them (the fleet, queues, the org's envelope, submit, cancel, finish,
expiry), with the read-only answers about them. An event tells the index layer what
it moved (``_touch``, ``_mark_head``, epochs); it decides nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from .common import _ZERO
from .door import Bucket, QueueDoor
from .door import decide as decide_door
from .fit import ClusterState, runs_of, sort_pods
from .index.records import _apply_due
from .model import QueueStatus, check_limits
from .policy.gates import _reads_running
from .reasons import Reason
from .resources import Pod, Usage

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping, Sequence
    from typing import Any

    from .common import _Reservation
    from .core import Scheduler
    from .fit import Runs
    from .index.records import _Class, _Eval, _ResvRecord
    from .model import ActionSpec, ClusterSpec, EnvironmentSpec, OrgLimits, QueueSpec


MAX_HISTORY_TASKS = 1024
"""Tasks whose runtime history (their last two runs) is kept: the ones that ended last.
About 40 bytes each in the carried state."""


class NodeReport(Protocol):
    """What a capacity report says of one node (``protocol.NodeCapacity`` fits this)."""

    name: str
    cpu_m: int
    memory: int
    ephemeral_storage: int
    gpu: int
    gpu_type: str | None
    free_cpu_m: int
    free_memory: int
    free_ephemeral_storage: int
    free_gpu: int


@dataclass(frozen=True, slots=True)
class Admitted:
    """A decision to start an action: where, on which nodes, and why it had waited."""

    action_id: str
    cluster: str
    nodes: tuple[str, ...]
    reasons: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Expired:
    """A waiting action withdrawn at its queue's ``max_queued_time`` (``QueuedTooLong``)."""

    action_id: str
    queue: str
    waited: float
    limit: float

    @property
    def detail(self) -> str:
        """For people: how long it waited, the limit, and what would have let it run."""
        return (
            f"waited {_secs(self.waited)} in queue {self.queue!r} without starting; its "
            f"max_queued_time is {_secs(self.limit)}: raise it (headway update queue "
            f"{self.queue} --max-queued-time D) or resubmit when the queue is shorter"
        )


def _secs(v: float) -> str:
    return f"{v:.0f} s" if v >= 10 else f"{v:.3g} s"


class PassError(Exception):
    """A pass raised (a bug: no input should make one). ``admitted`` are the decisions it
    had made, and applied, before it stopped; ``action_id`` the action it was deciding
    about then (None if it raised elsewhere). The caller rebuilds the core from its
    snapshot and tries again (see ``workflows.scheduler``)."""

    def __init__(self, admitted: list[Admitted], action_id: str | None) -> None:
        super().__init__(f"scheduler pass failed (deciding about action {action_id!r})")
        self.admitted = admitted
        self.action_id = action_id


def _deciding(exc: BaseException) -> str | None:
    """The action that ``_consider`` was deciding about when ``exc`` was raised under it.

    Read off the traceback after the fact, so that the hot path keeps no record of it."""
    from .core import Scheduler  # (at run time: core imports this module)

    tb = exc.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code is Scheduler._consider.__code__:
            a = tb.tb_frame.f_locals.get("a")
            if isinstance(a, _Action):
                return a.id
        tb = tb.tb_next
    return None


class _Action:
    __slots__ = (
        "_last",
        "_reasons",
        "charged",
        "ck",
        "ck_est",
        "cls",
        "cluster",
        "dkey",
        "env",
        "env_declared",
        "est",
        "est_end",
        "id",
        "inst",
        "nodes",
        "pods",
        "pos",
        "queue",
        "rel",
        "run",
        "runs",
        "seq",
        "spec",
        "start",
        "state",
        "submit",
        "task",
        "usage",
    )

    def __init__(self, spec: ActionSpec, dkey: int, pods: tuple[Pod, ...]) -> None:
        self.spec = spec
        self.id = spec.id
        self.queue = spec.queue
        self.run = spec.run_id
        self.task = spec.task_id
        self.seq = spec.seq
        self.submit = spec.submit
        self.pods = pods
        self.runs = runs_of(pods)
        self.dkey = dkey
        self.usage = Usage.of(pods)
        self.env = spec.environment
        self.env_declared = False
        self.state = "waiting"
        self._reasons: list[str] = []
        self._last: str | None = None
        self.cluster: str | None = None
        self.nodes: list[int] = []
        self.start = 0.0
        self.est: float | None = None
        self.est_end: float | None = None
        self.charged = False
        self.inst: _EnvInstance | None = None
        # Decision classes (see Scheduler._visit), interned to ints at submit.
        self.ck = 0
        self.ck_est = 0
        # Its class in its queue's grouping, and its place in the queue (see _Class).
        self.cls: _Class | None = None
        self.pos = 0
        # Its last entry in a cluster's releases (see ``Scheduler._releases``).
        self.rel: tuple[float, int, Runs, list[int], Usage] | None = None

    # A reason given to a whole stretch of a class is recorded on the class (see
    # ``_Class.settle``), so the fields may lag behind: every read goes through these.
    @property
    def last(self) -> str | None:
        c = self.cls
        if c is not None:
            if c.q.due:
                _apply_due(c.q)
            if c.lazy:
                c.sync(self)
        return self._last

    @last.setter
    def last(self, r: str | None) -> None:
        self._last = r

    @property
    def reasons(self) -> list[str]:
        c = self.cls
        if c is not None:
            if c.q.due:
                _apply_due(c.q)
            if c.lazy:
                c.sync(self)
        return self._reasons

    @reasons.setter
    def reasons(self, rs: list[str]) -> None:
        self._reasons = rs

    def note(self, reason: str) -> None:
        """Record a reason (the fields must be up to date: see ``_Class.sync``)."""
        if reason != self._last:
            self._last = reason
            if reason not in self._reasons:
                self._reasons.append(reason)


class _Queue:
    __slots__ = (
        "blocked_head",
        "cap_pos",
        "cls",
        "cls_mode",
        "due",
        "epoch",
        "evals",
        "fragile",
        "hist_dep",
        "horizon",
        "hsig",
        "hsig_n",
        "hsig_of",
        "hz",
        "last_hist",
        "last_holds",
        "last_resv",
        "last_sig",
        "last_started",
        "last_up_len",
        "mixed",
        "next_pos",
        "resv_rec",
        "rooms",
        "run_counts",
        "running",
        "runs_ok",
        "spec",
        "stale",
        "tail",
        "usage",
        "views",
        "waiting",
    )

    def __init__(self, spec: QueueSpec) -> None:
        self.spec = spec
        self.waiting: list[_Action] = []
        self.running = 0
        self.run_counts: dict[str, int] = {}
        self.usage = Usage()
        self.blocked_head: str | None = None
        # Incremental passes: what the last visit saw and did.
        self.epoch = 0
        self.last_sig: tuple[Any, ...] | None = None
        self.last_started = 0
        # The last visit admitted work and still kept its records: its answers were
        # found at more than one capacity (see ``Scheduler._pass``).
        self.mixed = False
        # Every hold the visit asked for, even one an earlier queue already made: if
        # that earlier hold goes, this queue's takes its place.
        self.last_holds: tuple[tuple[str, str], ...] = ()
        self.last_resv: tuple[tuple[str, _Reservation], ...] = ()
        # Where in the scheduler's capacity log the last visit stood (see ``_changes``).
        self.cap_pos = -1
        # What the last visit's answers depend on, beyond its signature (see ``_still``):
        # each fit it made (``_Eval``); for every cluster where a fit found room (and
        # read the holds and reservations there), what those were before this queue;
        # whether an answer read the task history (an estimate from it); whether it
        # read anything else the shortcut cannot vouch for.
        self.evals: list[_Eval] = []
        self.views: dict[str, tuple[Any, ...]] = {}
        # Per demand, every cluster where a fit that walked them all found room.
        self.rooms: dict[int, set[str]] = {}
        # Clusters whose capacity changed while every cluster the queue may use was
        # held from above (see ``Scheduler._held_still``): the fits' reasons were checked,
        # but where each found room (``first``, ``rooms``, ``views``) was not brought up to
        # date there. The next full check takes them as changed; None: none.
        self.stale: frozenset[str] | None = None
        # ``_held_still``'s summary of ``evals``: per demand, whether its fits found room
        # (``2 * dkey + room``, in order), interned; and the list and length it is of.
        self.hsig: tuple[int, ...] | None = None
        self.hsig_of: list[_Eval] | None = None
        self.hsig_n = 0
        self.hist_dep = True
        self.fragile = True
        self.last_hist = -1
        # The head's reservation, if the visit made one: see ``_VisitResv``.
        self.resv_rec: _ResvRecord | None = None
        # Until when (on the caller's clock) the last visit's answers hold unchanged:
        # per cluster, for the answers read there (``hz``), and the earliest of them.
        # A cluster whose answers expired is looked at again as if its capacity had
        # changed (see ``Scheduler._pass``), so the others' answers need not go too.
        self.horizon = float("inf")
        self.hz: dict[str, float] = {}
        self.last_up_len = -1
        # How many actions were appended to ``waiting`` since the last visit, if that is
        # all that changed the epoch; -1 once anything else did (see ``_visit_tail``).
        self.tail = -1
        # The waiting actions grouped by decision class (built lazily by a visit; None:
        # not built, or out of date). ``cls_mode`` is the grouping's (estimate, run).
        self.cls: dict[Any, _Class] = {}
        self.cls_mode: tuple[bool, bool] | None = None
        self.next_pos = 0
        # False once a visit recorded reasons without keeping the classes' runs.
        self.runs_ok = True
        # Reasons changed in place under a held fleet (``Scheduler._held_flip``) not
        # yet given to the classes' members: per flip, oldest first, three items (not
        # a tuple each: fewer young objects): the fit, its new reason, and whether it
        # went to the fit's own action alone. They are given (``_apply_due``) before
        # anything reads or changes the classes: a member's fields, a visit, an action
        # joining or leaving a class, a flip made at once.
        self.due: list[Any] = []


class _EnvInstance:
    __slots__ = (
        "active",
        "cluster",
        "expires_at",
        "nodes",
        "pods",
        "queue",
        "running",
        "runs",
        "spec",
        "usage",
    )

    def __init__(
        self,
        spec: EnvironmentSpec,
        cluster: str,
        nodes: list[int],
        pods: tuple[Pod, ...],
        queue: str,
    ) -> None:
        self.spec = spec
        self.cluster = cluster
        self.nodes = nodes
        self.pods = pods
        self.runs = runs_of(pods)
        self.queue = queue
        self.usage = Usage.of(pods)
        self.active = 0
        self.running: dict[str, _Action] = {}
        self.expires_at: float | None = None


def _pod_row(p: Pod) -> list[Any]:
    return [p.cpu, p.memory, p.eph, p.gpu, p.gpu_type]


def _row_pod(r: Sequence[Any]) -> Pod:
    return Pod(r[0], r[1], r[2], r[3], r[4])


def _dec(d: dict[str, int], k: str) -> None:
    n = d.get(k, 0) - 1
    if n <= 0:
        d.pop(k, None)
    else:
        d[k] = n


def _validate_queue(spec: QueueSpec) -> None:
    if not spec.name or not isinstance(spec.name, str):
        raise ValueError(f"name: {spec.name!r} is not a queue name")
    check_limits(spec)


def _remap(nodes: Sequence[int], old_names: Sequence[str], index: Mapping[str, int]) -> list[int]:
    """Node indices under a report's new node list: -1 for a node it no longer names,
    and for one already gone from an earlier report (-1 stays -1)."""
    return [index.get(old_names[i], -1) if 0 <= i < len(old_names) else -1 for i in nodes]


def add_cluster(self: Scheduler, spec: ClusterSpec) -> None:
    """Add a cluster, or replace the spec of a known one (keeping what runs there)."""
    old = self.clusters.get(spec.name)
    c = ClusterState(spec, index=len(self.clusters) if old is None else old.index)
    if old is not None:
        c.healthy = old.healthy
        # Caches keyed by (index, version) must not mistake the new state for the old.
        c.version = old.version + 1
    self.clusters[spec.name] = c
    self._touch(spec.name, hard=True)
    self.on_cluster.setdefault(spec.name, {})
    self._could_hold = {k: v for k, v in self._could_hold.items() if k[0] != c.index}
    if old is not None:
        self._retake(c)


def _retake(self: Scheduler, c: ClusterState) -> None:
    for a in self.on_cluster.get(c.name, {}).values():
        if a.nodes:
            c.take(a.runs, a.nodes)
    for inst in self.envs.values():
        if inst.cluster == c.name and inst.nodes:
            c.take(inst.runs, inst.nodes)


def set_cluster_health(self: Scheduler, name: str, healthy: bool) -> None:
    """A down cluster takes no new work; what runs there runs on to its end."""
    self._cluster(name).healthy = healthy
    self._touch(name, hard=True)


def report_capacity(
    self: Scheduler, name: str, nodes: Sequence[NodeReport] | None, reflected: Iterable[str] = ()
) -> None:
    """Take a cluster worker's capacity report.

    The report is the truth for the pods it counts; reservations it does not yet
    reflect (admitted, pods not yet created) are subtracted again so they are neither
    double counted nor leaked. ``nodes`` None means the worker cannot read nodes:
    capacity unknown, and unknown means open.
    """
    c = self._cluster(name)
    # Node shapes may change too (what could ever hold a demand): a hard change.
    self._touch(name, hard=True)
    # What the cluster's node shapes could hold is asked again (unknown: anything).
    self._could_hold = {k: v for k, v in self._could_hold.items() if k[0] != c.index}
    if nodes is None:
        c.known = False
        return
    c.known = True
    caps = [Pod(n.cpu_m, n.memory, n.ephemeral_storage, n.gpu, n.gpu_type) for n in nodes]
    frees = [
        Pod(n.free_cpu_m, n.free_memory, n.free_ephemeral_storage, n.free_gpu, n.gpu_type)
        for n in nodes
    ]
    old_names = c.node_names
    names = [n.name for n in nodes]
    index = {n: i for i, n in enumerate(names)}
    c.set_nodes(caps, frees, names)
    done = set(reflected)
    for a in self.on_cluster.get(name, {}).values():
        if not a.nodes:
            continue
        remapped = _remap(a.nodes, old_names, index)
        if a.id in done:
            # The report already counts these pods: never take them again. A node it
            # no longer names (-1) has nothing of ours left to give back.
            a.nodes = remapped
            continue
        if all(i >= 0 for i in remapped):
            a.nodes = remapped
            c.take(a.runs, remapped)
        else:
            placed = c.place(a.runs, commit=True)
            a.nodes = placed if placed is not None else []
    for inst in self.envs.values():
        if inst.cluster == name and inst.nodes:
            remapped = _remap(inst.nodes, old_names, index)
            inst.nodes = remapped if all(i >= 0 for i in remapped) else []


def upsert_queue(self: Scheduler, spec: QueueSpec) -> None:
    """Create a queue or replace its policy. Never touches work in flight."""
    _validate_queue(spec)
    q = self.queues.get(spec.name)
    if q is None:
        self.queues[spec.name] = _Queue(spec)
    else:
        q.spec = spec
    self._qdirty = None
    self._spec_ver += 1


def update_queue(self: Scheduler, name: str, changes: Mapping[str, Any]) -> QueueSpec:
    """Replace the fields ``changes`` gives (scenario-file notation; None unsets)."""
    from .scenario import queue_changes  # local: scenario imports core's vocabulary

    q = self.queues.get(name)
    if q is None:
        raise ValueError(f"queue: {name!r} does not exist")
    spec = q.spec.with_changes(**queue_changes(changes, f"update_queue({name})"))
    self.upsert_queue(spec)
    return spec


def remove_queue(self: Scheduler, name: str) -> None:
    q = self.queues.get(name)
    if q is None:
        raise ValueError(f"queue: {name!r} does not exist")
    if q.waiting or q.running:
        raise ValueError(f"queue: {name!r} still holds actions; drain it first")
    del self.queues[name]
    self.queue_buckets.pop(name, None)
    # (Empty: if it is in the visiting order still, the cancel since marked it.)
    self._mark_head(q)
    self._spec_ver += 1


def set_org(self: Scheduler, org: OrgLimits) -> None:
    self.org = org
    self._org_epoch += 1
    # Every queue's visit read the old limits. (The signatures' org part cannot tell:
    # it is 0 for a limit-free org and for a limited one's first epoch alike.) Rare:
    # a configuration change.
    for q in self.queues.values():
        q.epoch += 1
        q.tail = -1


def _cluster(self: Scheduler, name: str) -> ClusterState:
    c = self.clusters.get(name)
    if c is None:
        raise ValueError(f"cluster: {name!r} is not in the fleet")
    return c


def estimate(self: Scheduler, task: str, declared: float | None) -> float | None:
    """Declared estimate, else the mean of the task's last two completed runs."""
    if declared is not None:
        return declared
    h = self.history.get(task)
    if not h:
        return None
    return sum(h) / len(h)


def _keep_queue_bucket(self: Scheduler, name: str, bucket: Bucket) -> None:
    """Keep queue ``name``'s bucket as the door left it (a full one is not kept)."""
    if bucket.tokens is None:
        self.queue_buckets.pop(name, None)
    else:
        self.queue_buckets[name] = bucket


def submit(self: Scheduler, action: ActionSpec, now: float, *, door: bool = True) -> Reason | None:
    """Enqueue an action. Returns None if accepted, else the rejection reason.

    ``door``: apply the door's rules here (``scheduler.door``: the queue's status and
    depth, the submit rate). False for a submission the live door (the lease store)
    took in already: it was decided then, against the store's whole backlog.
    """
    q = self.queues.get(action.queue)
    if q is not None and action.id in self.actions:
        raise ValueError(f"action: {action.id!r} is already known")
    if door or q is None:
        held = len(q.waiting) + q.running if q is not None else 0
        d = decide_door(
            action.queue,
            QueueDoor.of(q.spec) if q is not None else None,
            self.org.submit_rate,
            held,
            Bucket(self.tokens, self.token_time),
            self.queue_buckets.get(action.queue, Bucket()),
            now,
        )
        self.tokens, self.token_time = d.org.tokens, d.org.at
        self._keep_queue_bucket(action.queue, d.queue)
        if d.reason is not None:
            return d.reason
    assert q is not None  # the door answers UnknownQueue
    spec = q.spec
    run = action.run_id
    cap = self.org.max_actions_per_run
    if cap is not None and self.run_accepted.get(run, 0) >= cap:
        return Reason.FanOutExceeded
    pods = sort_pods(action.pods)
    a = _Action(action, self._dkey(pods), pods)
    env = self.env_specs.get(action.environment) if action.environment else None
    a.env_declared = env is not None
    if env is not None and action.environment not in self.envs:
        check = sort_pods(env.footprint)
        ck = self._dkey(check)
        cr = runs_of(check)
        need = Usage.of(check)
    elif env is not None:
        check = ()
    else:
        # The action's own demand, keyed and grouped already (a long gang of one
        # pod object is scanned once, not once per helper).
        check, ck, cr, need = pods, a.dkey, a.runs, a.usage
    if check:
        mr = spec.max_resources
        if mr is not None and mr.exceeded_by(_ZERO, need):
            return Reason.Unschedulable
        if not any(self._could(c, cr, ck) for c in self._eligible(q, healthy_only=False)):
            return Reason.Unschedulable
    if action.run or cap is not None:
        # All time, as the fan-out limit counts. Without a fan-out limit, an action
        # without a run (its own run) is not recorded: that would grow the carried
        # state by an entry per action ever accepted (a drained 40k-action backlog
        # carried 636 KB of them into continue-as-new).
        self.run_accepted[run] = self.run_accepted.get(run, 0) + 1
    self._classify(a)
    self.actions[a.id] = a
    w = q.waiting
    if not w or (w[-1].submit, w[-1].seq) <= (a.submit, a.seq):
        if not w:
            # A queue joins the visiting order. (Appended behind others, the head,
            # and so the order, stay.)
            self._mark_head(q)
        w.append(a)
        if q.tail >= 0:
            q.tail += 1
        if q.cls_mode is not None:
            a.pos = q.next_pos
            q.next_pos += 1
            self._enlist(q, a, q.cls_mode)
    else:
        from bisect import insort

        insort(w, a, key=lambda x: (x.submit, x.seq))
        self._flush(q)
        q.cls_mode = None  # positions are renumbered when the classes are rebuilt
        q.tail = -1
        self._mark_head(q)  # it may be the new head
    q.epoch += 1
    return None


def cancel(self: Scheduler, action_id: str, now: float) -> bool:
    """Withdraw a waiting action, or release a running one. False if unknown."""
    a = self.actions.get(action_id)
    if a is None:
        return False
    if a.state == "waiting":
        q = self.queues[a.queue]
        q.waiting.remove(a)
        if q.cls_mode is not None:
            self._unlist(q, a)
        q.epoch += 1
        q.tail = -1
        self._mark_head(q)
        del self.actions[action_id]
        self._settle_status(q)
        return True
    self.finish(action_id, now, record=False)
    return True


def finish(self: Scheduler, action_id: str, now: float, record: bool = True) -> None:
    """A running action ended (any outcome): release it and learn its runtime."""
    a = self.actions.get(action_id)
    if a is None or a.state != "running":
        return
    del self.actions[action_id]
    a.state = "done"
    self._org_epoch += 1
    q = self.queues.get(a.queue)
    c = self.clusters.get(a.cluster or "")
    if c is not None:
        self._touch(c.name)
    if a.inst is not None:
        inst = a.inst
        inst.active -= 1
        inst.running.pop(a.id, None)
        if inst.active == 0:
            inst.expires_at = now + inst.spec.idle_ttl
        self._env_epoch += 1
    elif a.nodes and c is not None:
        before = c.version
        c.give(a.runs, a.nodes)
        self._chain_free(c, before, a.est_end)
    if q is not None:
        if _reads_running(q.spec):
            # Its gates read its running work. (Otherwise a visit reads what ended
            # only as capacity freed, which ``_touch`` logs, and as the org's
            # running work, which ``_org_epoch`` tracks: the epoch may stand.)
            q.epoch += 1
            q.tail = -1
        q.running -= 1
        _dec(q.run_counts, a.run)
        if a.charged:
            q.usage.add(a.usage, -1)
    self.org_running -= 1
    _dec(self.org_run_counts, a.run)
    if c is not None:
        self.on_cluster[c.name].pop(a.id, None)
    if a.env and not a.env_declared and a.cluster:
        per = self.undeclared_env.get(a.env)
        if per is not None:
            _dec(per, a.cluster)
            if not per:
                del self.undeclared_env[a.env]
    if record:
        # Kept for the MAX_HISTORY_TASKS tasks that ended last (most recent at the
        # end): a task defaults to the action's id, and without a bound every action
        # ever finished would stay in the carried state.
        hist = self.history
        h = hist.pop(a.task, None) or []
        h.append(now - a.start)
        if len(h) > 2:
            del h[0]
        hist[a.task] = h
        if len(hist) > MAX_HISTORY_TASKS:
            del hist[next(iter(hist))]
        self._hist_epoch += 1
    if q is not None:
        self._settle_status(q)


def expire_environments(self: Scheduler, now: float) -> list[str]:
    """Tear down idle environments whose ``idle_ttl`` has passed. Returns their names."""
    if not self.envs:
        return []  # the common case (an SWF trace): asked at every instant
    gone = []
    for name, inst in list(self.envs.items()):
        if inst.active == 0 and inst.expires_at is not None and inst.expires_at <= now:
            c = self.clusters.get(inst.cluster)
            if c is not None and inst.nodes:
                c.give(inst.runs, inst.nodes)
            q = self.queues.get(inst.queue)
            if q is not None:
                q.usage.add(inst.usage, -1)
            del self.envs[name]
            gone.append(name)
            self._touch(inst.cluster)
            self._env_epoch += 1
    return gone


def expire_waiting(self: Scheduler, now: float) -> list[Expired]:
    """Withdraw every waiting action that has waited its queue's ``max_queued_time``
    (``QueuedTooLong``), oldest first per queue; what was withdrawn.

    A rule of its own, run before ``schedule`` by each driver (the scheduler
    workflow, ``simulate``): an action whose time is up at ``now`` does not start at
    ``now``. Only an action a pass has decided about (it has a reason) expires: each
    gets one pass at least, so a limit of 0 means "start at once or never", and one
    taken from the store's backlog after its time is up still gets its chance.
    """
    out: list[Expired] = []
    for q in self.queues.values():
        limit = q.spec.max_queued_time
        if limit is None or not q.waiting:
            continue
        due = sorted(
            (a for a in q.waiting if now - a.spec.queued_since >= limit and a.last is not None),
            key=lambda a: (a.spec.submit, a.spec.seq),
        )
        for a in due:
            self.cancel(a.id, now)
            out.append(Expired(a.id, q.spec.name, now - a.spec.queued_since, limit))
    return out


def _next_expiry(self: Scheduler) -> float | None:
    """When the next waiting action a pass decided about reaches its queue's
    ``max_queued_time`` (one not yet decided about gets its pass first)."""
    ts = [
        a.spec.queued_since + limit
        for q in self.queues.values()
        if (limit := q.spec.max_queued_time) is not None
        for a in q.waiting
        if a.last is not None
    ]
    return min(ts, default=None)


def next_wakeup(self: Scheduler) -> float | None:
    """The earliest time at which ``schedule`` must run again without an event
    (an idle environment's expiry, a waiting action's ``max_queued_time``)."""
    expiry = self._next_expiry()
    if not self.envs:
        return expiry
    ts = [i.expires_at for i in self.envs.values() if i.active == 0 and i.expires_at is not None]
    if expiry is not None:
        ts.append(expiry)
    return min(ts) if ts else None


def _settle_status(self: Scheduler, q: _Queue) -> None:
    if q.spec.status is QueueStatus.draining and not q.waiting and q.running == 0:
        q.spec = q.spec.with_changes(status=QueueStatus.drained)


def state(self: Scheduler, action_id: str) -> str | None:
    a = self.actions.get(action_id)
    return a.state if a is not None else None


def reason(self: Scheduler, action_id: str) -> str | None:
    a = self.actions.get(action_id)
    return a.last if a is not None and a.state == "waiting" else None


def reasons(self: Scheduler, action_id: str) -> list[str]:
    a = self.actions.get(action_id)
    return list(a.reasons) if a is not None else []


def waiting_count(self: Scheduler, queue: str) -> int:
    q = self.queues.get(queue)
    return len(q.waiting) if q else 0


def running_count(self: Scheduler, queue: str) -> int:
    q = self.queues.get(queue)
    return q.running if q else 0


def queue_stats(self: Scheduler) -> dict[str, dict[str, Any]]:
    """Per queue: its policy, what waits and runs, its usage and a blocking head."""
    out: dict[str, dict[str, Any]] = {}
    for name, q in self.queues.items():
        self._flush(q)
        reasons: dict[str, int] = {}
        for a in q.waiting:
            if a.last:
                reasons[a.last] = reasons.get(a.last, 0) + 1
        head = self.actions.get(q.blocked_head) if q.blocked_head else None
        out[name] = {
            "spec": q.spec.to_dict(),
            "waiting": len(q.waiting),
            "running": q.running,
            "runs": len(q.run_counts),
            "usage": {
                "cpu_m": q.usage.cpu,
                "memory": q.usage.memory,
                "ephemeral_storage": q.usage.eph,
                "gpu": q.usage.gpu,
            },
            "blocked_head": q.blocked_head,
            # Pods of the blocked head: more than one is a gang holding its queue.
            "blocked_head_pods": len(head.pods) if head is not None else 0,
            "waiting_by_reason": reasons,
        }
    return out


def waiting_reasons(self: Scheduler, per_queue: int = 200) -> dict[str, tuple[str, list[str]]]:
    """The first ``per_queue`` waiting actions of each queue that the last pass gave
    a reason: that reason, and every distinct reason it has waited for so far (shown
    on the action while it waits). Bounded so the answer stays small (a query's
    result is one payload) whatever the backlog: the heads are what people look at."""
    out: dict[str, tuple[str, list[str]]] = {}
    for q in self.queues.values():
        self._flush(q)
        for a in q.waiting[:per_queue]:
            if a.last:
                out[a.id] = (a.last, list(a.reasons))
    return out
