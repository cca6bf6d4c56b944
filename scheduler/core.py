"""The admission pass: one owner per shard, one pass, no locks.

``Scheduler`` holds the whole picture of one shard in memory (every waiting action, every
queue and quota, every cluster's free capacity node by node) and decides, in one
deterministic pass over that snapshot, which actions start where. It does no I/O and
reads no clock: the caller passes ``now``. The scheduler workflow and ``headway
simulate`` drive this same class.

One scheduling cycle, in phases (after Kueue's ``schedule``):

1. order the queues: priority descending; among equals, the one whose next action was
   submitted first; then by name;
2. for each queue, filter clusters to its selector and to the healthy ones;
3. for each waiting action, oldest first, check the gates in order (action, run and
   per-run concurrency, ``max_resources``, the org envelope) - a failed gate is the
   action's reason for this pass;
4. find a cluster with room whose nodes fit every pod (best fit, all or nothing), in
   placement order, that no hold or reservation forbids;
5. admit (reserve counts and resources) or record the reason; a blocked head holds
   (``strict``) or reserves (``backfill``/``easy``) capacity for the rest of the pass;
6. repeat the pass until nothing more starts.

Ordering (which action next) is kept apart from fitting (``fit.ClusterState``); a "no" is
a ``Reason`` returned as data, never an exception.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from heapq import heapify, heappop, heappush
from itertools import compress
from operator import attrgetter, itemgetter
from typing import Any, Protocol

from .door import Bucket, QueueDoor
from .door import decide as decide_door
from .fit import ClusterState, Runs, runs_of, sort_pods, uniform
from .model import (
    ActionSpec,
    Algorithm,
    ClusterSpec,
    DemandKind,
    EnvironmentSpec,
    OrgLimits,
    QueueSpec,
    QueueStatus,
    check_limits,
)
from .reasons import Reason
from .resources import Pod, Usage

__all__ = ["Admitted", "NodeReport", "Scheduler"]

_ZERO = Usage()
_INF = float("inf")
_POS = attrgetter("pos")
_BY_TIME_SEQ = itemgetter(0, 1)
_FIRST = itemgetter(0)
_NAME = attrgetter("name")
# Fewer clusters than this: ``Scheduler._reserve`` walks them all (keeping the walk costs
# more than it saves), and ``Scheduler._base_order`` sorts them afresh.
_SCAN_MIN = 4
# ``Scheduler._scan``'s answer: the earliest fit (time, cluster, EASY extra), and the
# clusters to hold.
_ScanOut = tuple[tuple[float, ClusterState, ClusterState | None] | None, list[str]]
# ``Scheduler._held_flips``: the fits' summary once the demands that found room since
# have it, and for each such demand a cluster with room now.
_HeldFlips = tuple[tuple[int, ...], dict[int, str]]
# ``Scheduler._steps``: (time, releases given back by then, free cpu, memory, ephemeral
# storage, gpu by then).
_Step = tuple[float, int, int, int, int, int]
_LOG_MAX = 8192
# Heads whose hold pairs ``Scheduler._hold`` keeps.
_HOLD_PAIRS_MAX = 1024
_NO_CHANGE: frozenset[str] = frozenset()
# The clusters with room of a demand with none (shared: never changed in place).
_NO_ROOM: list[Any] = []
# Selectors of at most this many clusters are read cluster by cluster rather than
# through the capacity log (``Scheduler._any_room``).
_SEL_SMALL = 16
# Not in a cache (a cached answer may be None).
_UNKNOWN: Any = object()
# ``Scheduler._view`` of a held cluster, and of one with neither hold nor reservation.
_HELD: tuple[Any, ...] = (True,)
_OPEN: tuple[Any, ...] = (False, ())

INCREMENTAL = True
"""Default of ``Scheduler(incremental=...)``: False makes every visit the plain loop."""

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


def _catch_up(a: _Action, pend: tuple[str, ...], last: str | None) -> None:
    """Bring ``a``'s fields up to date with the notes a class recorded for it.

    ``pend`` is every reason noted since the fields were last written, once each in the
    order first noted, and ``last`` the latest: appending the ones ``a`` has not had
    yet is what noting them one by one would have done. Doing it twice changes nothing.
    """
    rl = a._reasons
    for x in pend:
        if x not in rl:
            rl.append(x)
    a._last = last


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


class _Class:
    """The waiting actions of one queue that share a decision class.

    While a visit's state is unchanged, every member of a class gets the answer the
    first of them got (see ``Scheduler._walk``). Members are kept in queue order, and
    their recorded reasons run-length encoded (every member from ``starts[k]`` up to
    the next start has ``last == reasons[k]``), so that giving a stretch of members the
    reason most of them already have costs nothing per member.

    Giving a long stretch a new reason costs nothing per member either: the run keeps
    what its members were noted since their fields were last written (``pend[k]``, see
    ``_catch_up``), and a member's fields catch up only when read (``sync``), when it
    leaves the class, or when the classes are rebuilt or walked member by member
    (``flush``). ``lazy``: whether any run has notes pending.
    """

    __slots__ = ("ck", "ck_est", "lazy", "m", "pend", "pk", "q", "reasons", "run", "starts")

    def __init__(self, pk: Any, a: _Action, q: _Queue) -> None:
        self.pk = pk
        # Its queue, whose changes not yet given (``_Queue.due``) a read of a member
        # gives first.
        self.q = q
        self.ck = a.ck
        self.ck_est = a.ck_est
        self.run = a.run
        self.m: list[_Action] = []
        self.starts: list[int] = []
        self.reasons: list[str | None] = []
        self.pend: list[tuple[str, ...]] = []
        self.lazy = False

    def append(self, a: _Action) -> None:
        """Add a member after the others (its fields must be up to date)."""
        self.m.append(a)
        if not self.reasons or self.reasons[-1] != a._last or self.pend[-1]:
            self.starts.append(len(self.m) - 1)
            self.reasons.append(a._last)
            self.pend.append(())

    def recount(self) -> None:
        """Rebuild the runs from the members (after reasons were set around them)."""
        self.flush()
        m = self.m
        self.m, self.starts, self.reasons, self.pend = [], [], [], []
        for a in m:
            self.append(a)

    def sync(self, a: _Action) -> None:
        """Bring member ``a``'s fields up to date."""
        i = bisect_left(self.m, a.pos, key=_POS)
        k = bisect_right(self.starts, i) - 1
        p = self.pend[k]
        if p:
            _catch_up(a, p, self.reasons[k])

    def flush(self) -> None:
        """Bring every member's fields up to date."""
        if not self.lazy:
            return
        st, rs, pd, m = self.starts, self.reasons, self.pend, self.m
        nk = len(st)
        for k in range(nk):
            p = pd[k]
            if p:
                r = rs[k]
                for a in m[st[k] : st[k + 1] if k + 1 < nk else len(m)]:
                    _catch_up(a, p, r)
        self._runs(st, rs, [()] * nk)
        self.lazy = False

    def _runs(self, st: list[int], rs: list[str | None], pd: list[tuple[str, ...]]) -> None:
        """Make the runs ``st``/``rs``/``pd``, neighbours alike merged, the class's own,
        written into its lists (kept from pass to pass: the collector need not walk new
        ones)."""
        ms, mr, mp = _merge_runs(st, rs, pd)
        self.starts[:] = ms
        self.reasons[:] = mr
        self.pend[:] = mp

    def settle(self, i: int, j: int, r: str) -> None:
        """Give members ``i`` to ``j - 1`` the reason ``r``: a run whose members have
        it already is left alone (``note`` would do nothing), a single member is noted
        at once, a longer stretch only records the note on its run."""
        st, rs, pd = self.starts, self.reasons, self.pend
        n = len(self.m)
        nk = len(st)
        k = bisect_right(st, i) - 1
        if rs[k] == r and j <= (st[k + 1] if k + 1 < nk else n):
            return
        m = self.m
        new_st = st[:k]
        new_rs = rs[:k]
        new_pd = pd[:k]
        if st[k] < i:
            new_st.append(st[k])
            new_rs.append(rs[k])
            new_pd.append(pd[k])
        kk = k
        while kk < nk and st[kk] < j:
            p = pd[kk]
            lo = st[kk] if st[kk] > i else i
            if rs[kk] != r:
                if j - i == 1:
                    a = m[i]
                    if p:
                        _catch_up(a, p, rs[kk])
                    a.note(r)
                    p = ()
                elif r not in p:
                    p = _noted(p, r)
            new_st.append(lo)
            new_rs.append(r)
            new_pd.append(p)
            kk += 1
        # Runs k..kk-1 overlap [i, j): keep what lies outside it.
        tail = st[kk] if kk < nk else n
        if j < tail:
            new_st.append(j)
            new_rs.append(rs[kk - 1])
            new_pd.append(pd[kk - 1])
        new_st += st[kk:]
        new_rs += rs[kk:]
        new_pd += pd[kk:]
        self._runs(new_st, new_rs, new_pd)
        self.lazy = any(self.pend)
        if self.lazy and len(self.starts) > 64:
            # Runs that differ only in what they have pending: write it out.
            self.flush()

    def settle_all(self, r: str) -> None:
        """``settle(0, len(m), r)`` for a class of two members or more: every run takes
        ``r``, so no run is split (the common case of a class whose first member's
        answer changed, see ``Scheduler._flip``). The lists are changed in place."""
        rs, pd = self.reasons, self.pend
        for k, x in enumerate(rs):
            if x != r:
                rs[k] = r
                p = pd[k]
                if r not in p:
                    pd[k] = _noted(p, r)
        # Every run has ``r`` now: neighbours with the same notes pending are one run.
        for k in range(1, len(pd)):
            if pd[k] == pd[k - 1]:
                self._runs(self.starts, rs, pd)
                break
        self.lazy = any(self.pend)
        if self.lazy and len(self.starts) > 64:
            self.flush()

    def remove(self, i: int) -> None:
        """Drop member ``i`` (admitted or cancelled), its fields brought up to date."""
        st, rs, pd = self.starts, self.reasons, self.pend
        k = bisect_right(st, i) - 1
        if pd[k]:
            _catch_up(self.m[i], pd[k], rs[k])
        del self.m[i]
        for x in range(k + 1, len(st)):
            st[x] -= 1
        if (st[k + 1] if k + 1 < len(st) else len(self.m)) == st[k]:
            del st[k]
            del rs[k]
            del pd[k]
            self._runs(st, rs, pd)
            self.lazy = any(self.pend)


# At most this many flips wait on a queue (``_Queue.due``).
_DUE_MAX = 64

# Runs' pending notes, one tuple per value: the values are few, and a class keeps its
# runs' notes from pass to pass (the collector need not walk a new tuple for each).
_NOTED: dict[tuple[tuple[str, ...], str], tuple[str, ...]] = {}


def _noted(p: tuple[str, ...], r: str) -> tuple[str, ...]:
    """``(*p, r)``, shared."""
    k = (p, r)
    got = _NOTED.get(k)
    if got is None:
        if len(_NOTED) > 4096:
            _NOTED.clear()  # only shares equal tuples: never let it grow unbounded
        got = _NOTED[k] = (*p, r)
    return got


def _flip_as(q: _Queue, e: _Eval, r: str, head: bool) -> None:
    """``Scheduler._flip`` with the fit's new reason ``r`` and whether it went to the
    fit's own action alone (``head``) as they were when the flip was made (it may be
    given later: see ``_Queue.due``)."""
    runs_ok = q.runs_ok
    for a in e.acts:
        c = a.cls
        assert c is not None
        m = c.m
        if runs_ok and not head and m[0] is a and len(m) > 1:
            # The common shape (a fit made by its class's first member, the whole
            # class taking its answer) without the search and bounds below.
            rs = c.reasons
            if len(rs) == 1:
                # ``settle_all`` of a class of one run, inlined: a flip under a
                # held fleet gives a new reason to thousands of such classes.
                pd = c.pend
                if rs[0] != r:
                    rs[0] = r
                    p = pd[0]
                    if r not in p:
                        got = _NOTED.get((p, r))
                        pd[0] = _noted(p, r) if got is None else got
                c.lazy = bool(pd[0])
            else:
                c.settle_all(r)
            continue
        # Most fits were made by their class's first member: no search then.
        i = 0 if m[0] is a else bisect_left(m, a.pos, key=_POS)
        j = i + 1 if head else len(m)
        if runs_ok:
            if i == 0 and j == len(m) and j > 1:
                c.settle_all(r)
            else:
                c.settle(i, j, r)
        else:
            # The runs are recounted before the next walk (see ``_visit``).
            for x in c.m[i:j]:
                x.note(r)


def _apply_due(q: _Queue) -> None:
    """Give the members of ``q``'s classes the flips made but not yet given, in order."""
    due = q.due
    for k in range(0, len(due), 3):
        _flip_as(q, due[k], due[k + 1], due[k + 2])
    # (The list is kept: a new one each time would be one more young object.)
    del due[:]


def _merge_runs(
    st: list[int], rs: list[str | None], pd: list[tuple[str, ...]]
) -> tuple[list[int], list[str | None], list[tuple[str, ...]]]:
    if not st:
        return st, rs, pd
    out_s = [st[0]]
    out_r = [rs[0]]
    out_p = [pd[0]]
    for x, r, p in zip(st[1:], rs[1:], pd[1:], strict=True):
        if r != out_r[-1] or p != out_p[-1]:
            out_s.append(x)
            out_r.append(r)
            out_p.append(p)
    return out_s, out_r, out_p


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


class _Reservation:
    """A head's reservation: when, and (EASY) what its projected placement leaves.

    ``shared``: ``extra`` is a cached projection (see ``Scheduler._earliest_fit``),
    copied only when an admission first uses it up (``Scheduler._use_up``).
    """

    __slots__ = ("extra", "head", "shared", "time")

    def __init__(
        self, time: float, extra: ClusterState | None, head: str, shared: bool = False
    ) -> None:
        self.time = time
        self.extra = extra
        self.head = head
        self.shared = shared


class _Eval:
    """One fit a visit made (an action that passed its gates), and how it ended.

    ``blocked``: the queue was already blocked (strict), so the walk stopped at the first
    cluster with room. ``first``: the first cluster with room in placement order (when
    blocked: just one with room), or None. ``reason``: the answer. ``acts``: the
    actions of every fit that ended alike (same demand, ``blocked``, ``first`` and
    reason; see ``Scheduler._eval``). ``fkey``: ``first``'s placement order key, once
    worked out (it stays while ``first``'s capacity does). ``blind``: made while no
    reservation stood, so the visit's memo gave its answer to actions of any estimate
    (``_memo_loop``, ``_walk``): a reservation read now may tell them apart.
    """

    __slots__ = ("a", "acts", "blind", "blocked", "dkey", "first", "fkey", "reason", "runs")

    def __init__(
        self,
        a: _Action,
        dkey: int,
        runs: Runs,
        blocked: bool,
        first: str | None,
        reason: Reason,
        blind: bool,
    ) -> None:
        self.a = a
        self.dkey = dkey
        self.runs = runs
        self.blocked = blocked
        self.first = first
        self.reason = reason
        self.blind = blind
        self.acts = [a]
        self.fkey: tuple[Any, ...] | None = None


def _merge_evals(seen: dict[tuple[Any, ...], _Eval], out: list[_Eval], evals: list[_Eval]) -> None:
    """Add ``evals`` to the groups in ``seen`` (new groups are appended to ``out``)."""
    for e in evals:
        k = (e.dkey, e.blocked, e.first, e.reason)
        g = seen.get(k)
        if g is None:
            seen[k] = e
            out.append(e)
        else:
            # (``e`` may stand for several fits already: see ``Scheduler._eval``.)
            g.acts.extend(e.acts)
            g.blind = g.blind or e.blind


class _ResvRecord:
    """A reserving head's reservation as its visit computed it: enough to tell, once
    capacity changed on a few clusters, whether ``_reserve`` would still make it."""

    __slots__ = ("dkey", "easy", "held", "key", "runs", "time", "where")

    def __init__(
        self,
        runs: Runs,
        dkey: int,
        easy: bool,
        where: ClusterState | None,
        time: float,
        held: frozenset[str],
    ) -> None:
        self.runs = runs
        self.dkey = dkey
        self.easy = easy
        # The reserved cluster (None: no cluster ever fits) and its placement-order
        # key then (capacity moves it in the order).
        self.where = where.name if where is not None else None
        self.key = _order_key(where) if where is not None else None
        self.time = time
        self.held = held  # clusters held instead (their reservation cannot be computed)


class _Cands:
    """``Scheduler._cands``' entry for a (selector, demand): the clusters with room, in
    placement order, and their names, as of capacity log position ``pos``. Brought up
    to date in place (a completion moves dozens every pass: no new objects for the
    collector to walk)."""

    __slots__ = ("names", "order", "pos")

    def __init__(self, pos: int, order: list[ClusterState], names: frozenset[str]) -> None:
        self.set(pos, order, names)

    def set(self, pos: int, order: list[ClusterState], names: frozenset[str]) -> None:
        self.pos = pos
        self.order = order
        self.names = names


class _Visit:
    """Scratch state of one queue's visit within a pass."""

    __slots__ = ("blocked", "elig", "order", "order_ver", "reserved", "reserving", "strict", "ver")

    def __init__(self, q: _Queue, elig: list[ClusterState]) -> None:
        algo = q.spec.algorithm
        self.strict = algo is Algorithm.strict
        self.reserving = algo is Algorithm.backfill or algo is Algorithm.easy
        self.elig = elig
        self.blocked = False
        self.reserved = False
        self.order: list[ClusterState] | None = None
        self.order_ver = -1
        # Bumped by anything that can change the next action's answer (an admission,
        # a hold, a reservation, the head blocking); keys the per-class memo.
        self.ver = 0


class Scheduler:
    """The whole state of one shard and the pass that decides over it.

    Args:
        clusters: the fleet known up front (node groups per cluster).
        queues: initial queues.
        org: the tenant's envelope.
        environments: declared reusable environments.
        incremental: False turns every shortcut off (no skipped visits, no decision
            classes: each waiting action decided on its own, oldest first). Decisions
            and reasons are the same either way; the plain form is the reference the
            differential tests compare against. None: the module's ``INCREMENTAL``.
    """

    # ``_walk`` gives a class the answer of one alike but for its estimate, when that
    # fit read no reservation (the tests turn it off to compare the records).
    _SHARE_ALIKE = True

    def __init__(
        self,
        clusters: Sequence[ClusterSpec] = (),
        queues: Sequence[QueueSpec] = (),
        org: OrgLimits | None = None,
        environments: Sequence[EnvironmentSpec] = (),
        incremental: bool | None = None,
    ) -> None:
        self.incremental = INCREMENTAL if incremental is None else incremental
        self.clusters: dict[str, ClusterState] = {}
        self.queues: dict[str, _Queue] = {}
        self.org = org or OrgLimits()
        self.env_specs: dict[str, EnvironmentSpec] = {e.name: e for e in environments}
        self.envs: dict[str, _EnvInstance] = {}
        self.actions: dict[str, _Action] = {}
        self.on_cluster: dict[str, dict[str, _Action]] = {}
        self.org_running = 0
        self.org_run_counts: dict[str, int] = {}
        self.run_accepted: dict[str, int] = {}
        self.tokens: float | None = None
        self.token_time = 0.0
        # Each rate-limited queue's own token bucket (``door.Bucket``), by queue; a queue
        # not here has a full one.
        self.queue_buckets: dict[str, Bucket] = {}
        self.history: dict[str, list[float]] = {}
        self.undeclared_env: dict[str, dict[str, int]] = {}
        self.unknown_capacity_passes = 0
        # The same per cluster, as data for the control plane's metrics and warnings
        # (the core itself neither logs nor exports).
        self.unknown_capacity_by_cluster: dict[str, int] = {}
        self.passes = 0
        self.skipped_visits = 0
        # Visits that decided only the actions appended since the last (``_visit_tail``).
        self.tail_visits = 0
        self._admissions = 0
        # Epochs: bumped whenever something a queue's visit depends on changes.
        # Which clusters' capacity changed, in order: (name, hard). A hard change (health,
        # a report, a new spec) may change more than free capacity. Queues keep their
        # position in it (``_Queue.cap_pos``); ``_cap_base`` counts entries dropped.
        self._cap_log: list[tuple[str, bool]] = []
        self._cap_base = 0
        # Per cluster, the log position of its latest entry; and of the latest hard one
        # (anywhere): what moved since a position, without reading the log.
        self._touched: dict[str, int] = {}
        self._hard_at = -1
        self._selsets: dict[tuple[str, ...], frozenset[str]] = {}
        # ``_changes``' answers within a pass: per log position, the log's end they were
        # read up to, each cluster named since (whether hard), and the answer by selector.
        self._chg_cache: dict[
            int, tuple[int, dict[str, bool], dict[Any, frozenset[str] | set[str] | None]]
        ] = {}
        # ``_evals_still``'s changed clusters that are healthy, which have room for each
        # demand, and their placement order keys, per ``_changes`` answer (by identity)
        # within a pass.
        self._dr_cache: dict[
            int,
            tuple[
                Any,
                list[ClusterState],
                dict[int, list[ClusterState]],
                dict[str, tuple[Any, ...]],
            ],
        ] = {}
        # What the visit in progress depends on (copied to its queue when it ends).
        self._vevals: list[_Eval] = []
        # ``_vevals`` by how they ended (``_merge_evals``' key): a fit that ends like
        # one before joins its record as it is made (see ``_eval``).
        self._vseen: dict[tuple[Any, ...], _Eval] = {}
        self._vrooms: dict[int, set[str]] = {}
        self._vhist = False
        self._vfragile = False
        self._vholds: list[tuple[str, str]] = []
        # Per head, per cluster: the (cluster, head) pair its visits record, kept from
        # pass to pass. A blocked head holds the same clusters every pass: a full pass
        # would otherwise make thousands of pairs that outlive it, and the collector
        # walks each of them (see ``_hold``).
        self._hold_pairs: dict[str, dict[str, tuple[str, str]]] = {}
        # Per (selector, demand): ``_holdable``'s answer, with the capacity log
        # position of the last hard change it stands at.
        self._holdables: dict[tuple[Any, int], tuple[int, list[str]]] = {}
        # Per selector: ``_eligible``'s healthy clusters, with the capacity log position
        # of the last hard change they stand at.
        self._eligibles: dict[Any, tuple[int, list[ClusterState]]] = {}
        self._vresv: _ResvRecord | None = None
        # ``_evals_still``'s fits whose reason changes in place (see ``_flip``), and
        # whether a strict head's fit among them no longer holds clusters.
        self._flips: list[_Eval] = []
        self._unhold = False
        self._env_epoch = 0
        self._org_epoch = 0
        self._hist_epoch = 0
        self._dkeys: dict[Any, int] = {}
        # Demands of unlike pods (a cpu-heavy pod and a memory-heavy one): best fit of
        # such a gang is not monotone in free capacity (another admission can move its
        # first pod elsewhere and make room for the second), so "no room" is never
        # remembered for them within a pass (``_infeasible``, ``_noroom``); answers
        # dated by a cluster's version (one free state) still are.
        self._unlike: set[int] = set()
        self._classes: dict[tuple[Any, ...], int] = {}
        self._could_hold: dict[tuple[int, int], bool] = {}
        # The queues in visiting order, their sort keys in the same order and by queue
        # name, and the queues whose head may have changed since (``_mark_head``): each
        # is put back where its key now goes. None: a policy changed (a priority, a
        # queue added or removed), sort them all again.
        self._qorder: list[_Queue] = []
        self._qkeyed: list[tuple[Any, ...]] = []
        self._qkeys: dict[str, tuple[Any, ...]] = {}
        # (A dict, not a set: processed in the order marked, not by object address. The
        # result is the same either way; the order of work is reproducible too.)
        self._qdirty: dict[_Queue, None] | None = None
        # The queues that were draining when a policy last changed (``upsert_queue``,
        # ``remove_queue`` bump ``_spec_ver``): only a policy change makes one draining,
        # so these are all that ``schedule`` need look at to settle.
        self._spec_ver = 0
        self._draining: list[_Queue] = []
        self._draining_at = -1
        for c in clusters:
            self.add_cluster(c)
        for q in queues:
            self.upsert_queue(q)
        # per-pass scratch
        self._holds: dict[str, str] = {}  # cluster -> the head holding it
        self._resv: dict[str, list[_Reservation]] = {}
        self._infeasible: set[tuple[int, int]] = set()
        # Per (cluster, demand): the cluster version at which it last had room, or
        # had none. A version names one free state (``add_cluster`` keeps versions
        # rising), so these answers carry over from pass to pass.
        self._feasible: dict[tuple[int, int], int] = {}
        self._unfit: dict[tuple[int, int], int] = {}
        self._noroom: set[tuple[Any, int]] = set()
        # Per selector: the placement order (no environment); per (selector, demand):
        # the clusters in it with room. Each with the capacity log's end when made:
        # every change to a cluster is logged (``_touch``), so while the log stands
        # still they hold, from pass to pass.
        # (With each cluster's key, as a list in order and by name.)
        self._orders: dict[
            Any, tuple[int, list[ClusterState], list[tuple[Any, ...]], dict[str, tuple[Any, ...]]]
        ] = {}
        self._cands: dict[tuple[Any, int], _Cands] = {}
        # Per (selector, demand): ``_unheld``'s answer for a ``_cands`` list, within a pass.
        self._unheld_cache: dict[
            tuple[Any, int], tuple[list[ClusterState], int, list[ClusterState]]
        ] = {}
        self._fit_cache: dict[tuple[int, int, bool], tuple[Any, ...]] = {}
        # Per (selector, demand, EASY): ``_scan``'s fits, by cluster, with the capacity
        # log position, environment epoch and clock they were found at.
        self._scans: dict[
            tuple[Any, int, bool],
            tuple[int, int, float, dict[str, Any], _ScanOut, dict[str, float], float],
        ] = {}
        # Per (cluster, demand, EASY): the demand placed on the cluster emptied, with
        # the node list it was made for (see ``_empty_fit``).
        self._empties: dict[tuple[int, int, bool], tuple[Any, bool, ClusterState, int]] = {}
        # Per cluster: whether giving back all of ``_releases``' list (the one named)
        # empties it.
        self._rel_empty: dict[int, tuple[Any, bool]] = {}
        # Per cluster: the free totals after each distinct time of ``_releases``' list
        # (the one named), shared by every demand projected there (see ``_steps``).
        self._rel_steps: dict[int, tuple[Any, list[_Step]]] = {}
        # Per demand: its total.
        self._needs: dict[int, Usage] = {}
        # Per cluster: (base, last, latest end, earliest end) of the run of admissions
        # that moved it from version ``base`` to ``last`` with nothing else between, and
        # when those actions are expected to end (see ``_carried``).
        self._chain: dict[int, tuple[int, int, float, float]] = {}
        # Per cluster: (base, last, latest estimated end) of the run of completions that
        # moved it from version ``base`` to ``last`` with nothing else between (see
        # ``_freed``).
        self._fchain: dict[int, tuple[int, int, float]] = {}
        # Per cluster: its releases in time order as of (state, version, env epoch, now),
        # shared by the projections of every demand there (see ``_releases``).
        self._rel_cache: dict[int, tuple[Any, ...]] = {}
        self._horizon = _INF
        # ``_horizon`` per cluster read (see ``_Queue.hz``), for the visit in progress.
        self._vhz: dict[str, float] = {}
        # Per pass: a ``_changes`` answer (by identity) joined with clusters whose
        # answers expired, shared by the queues that have both alike.
        self._exp_cache: dict[tuple[int, frozenset[str]], tuple[Any, set[str]]] = {}
        # Per pass: ``_all_held``'s answers, by (selector, number of holds).
        self._held_cache: dict[tuple[Any, int], bool] = {}
        # Per pass: ``_held_still``'s verdict on the fits, by (selector, fits' summary).
        self._hsig_cache: dict[tuple[Any, tuple[int, ...]], bool] = {}
        # Per pass: where that verdict failed, how the answers moved (``_held_flips``),
        # by (selector, fits' summary, changed set's identity), with the changed set.
        self._hflip_cache: dict[
            tuple[Any, tuple[int, ...], int], tuple[Any, _HeldFlips | None]
        ] = {}
        self._hsig_intern: dict[tuple[int, ...], tuple[int, ...]] = {}
        # Per pass: ``q.stale`` joined with a changed set, by their identities (queues
        # that stood alike share the answer).
        self._stale_cache: dict[tuple[int, int], tuple[Any, Any, frozenset[str]]] = {}
        self._stale_last: tuple[Any, Any, frozenset[str]] | None = None
        # Per pass: ``_soft_since(pos, 64)`` by (pos, log end), for ``_any_room``.
        self._moved_cache: dict[tuple[int, int], set[str] | None] = {}
        # Per pass: ``_held_still``'s answer for a reservation record, by what the
        # answer reads (see there).
        self._resv_cache: dict[tuple[Any, ...], tuple[Any, ...]] = {}
        self._effects: list[tuple[Any, ...]] = []
        self._prev_effects: list[tuple[Any, ...]] = []
        self._diverged: int | None = None
        # What the last ``_consider`` that gave a reason read (see there).
        self._cnames: frozenset[str] | None = None
        self._cgate: Reason | None = None
        self._crec: _Eval | None = None
        self._cread = False

    # ------------------------------------------------------------------ config

    def add_cluster(self, spec: ClusterSpec) -> None:
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

    def _retake(self, c: ClusterState) -> None:
        for a in self.on_cluster.get(c.name, {}).values():
            if a.nodes:
                c.take(a.runs, a.nodes)
        for inst in self.envs.values():
            if inst.cluster == c.name and inst.nodes:
                c.take(inst.runs, inst.nodes)

    def set_cluster_health(self, name: str, healthy: bool) -> None:
        """A down cluster takes no new work; what runs there runs on to its end."""
        self._cluster(name).healthy = healthy
        self._touch(name, hard=True)

    def report_capacity(
        self, name: str, nodes: Sequence[NodeReport] | None, reflected: Iterable[str] = ()
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

    def upsert_queue(self, spec: QueueSpec) -> None:
        """Create a queue or replace its policy. Never touches work in flight."""
        _validate_queue(spec)
        q = self.queues.get(spec.name)
        if q is None:
            self.queues[spec.name] = _Queue(spec)
        else:
            q.spec = spec
        self._qdirty = None
        self._spec_ver += 1

    def update_queue(self, name: str, changes: Mapping[str, Any]) -> QueueSpec:
        """Replace the fields ``changes`` gives (scenario-file notation; None unsets)."""
        from .scenario import queue_changes  # local: scenario imports core's vocabulary

        q = self.queues.get(name)
        if q is None:
            raise ValueError(f"queue: {name!r} does not exist")
        spec = q.spec.with_changes(**queue_changes(changes, f"update_queue({name})"))
        self.upsert_queue(spec)
        return spec

    def remove_queue(self, name: str) -> None:
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

    def set_org(self, org: OrgLimits) -> None:
        self.org = org
        self._org_epoch += 1
        # Every queue's visit read the old limits. (The signatures' org part cannot tell:
        # it is 0 for a limit-free org and for a limited one's first epoch alike.) Rare:
        # a configuration change.
        for q in self.queues.values():
            q.epoch += 1
            q.tail = -1

    def _touch(self, name: str, hard: bool = False) -> None:
        """Note that cluster ``name`` changed (free capacity; ``hard``: more than that)."""
        log = self._cap_log
        at = self._cap_base + len(log)
        self._touched[name] = at
        if hard:
            self._hard_at = at
        log.append((name, hard))
        if len(log) > _LOG_MAX:
            # Queues that stood before the dropped entries get a full visit.
            drop = len(log) // 2
            del log[:drop]
            self._cap_base += drop

    def _cluster(self, name: str) -> ClusterState:
        c = self.clusters.get(name)
        if c is None:
            raise ValueError(f"cluster: {name!r} is not in the fleet")
        return c

    # ------------------------------------------------------------------ actions

    def _dkey(self, pods: tuple[Pod, ...]) -> int:
        # A long gang of one pod object is keyed by (pod, count): hashing the tuple
        # hashes every pod. (An equal gang of distinct objects may get another key:
        # keys only share work between equal demands, they never tell them apart.)
        key: Any = (pods[0], len(pods)) if uniform(pods) else pods
        k = self._dkeys.get(key)
        if k is None:
            k = self._dkeys[key] = len(self._dkeys)
            if any(p != pods[0] for p in pods):
                self._unlike.add(k)
        return k

    def _classify(self, a: _Action) -> None:
        k = (a.dkey, a.env)
        a.ck = self._classes.setdefault(k, len(self._classes))
        ke = (a.dkey, a.env, a.spec.estimate, a.task if a.spec.estimate is None else None)
        a.ck_est = self._classes.setdefault(ke, len(self._classes))

    def estimate(self, task: str, declared: float | None) -> float | None:
        """Declared estimate, else the mean of the task's last two completed runs."""
        if declared is not None:
            return declared
        h = self.history.get(task)
        if not h:
            return None
        return sum(h) / len(h)

    def _eligible(self, q: _Queue, healthy_only: bool = True) -> list[ClusterState]:
        """The clusters of ``q``'s selector (healthy ones only, unless told), in the
        selector's order. Callers must not change the list: the healthy ones are kept
        per selector until a hard change (health, the fleet), for every visit."""
        return self._eligible_of(q.spec.clusters, healthy_only)

    def _eligible_of(
        self, sel: tuple[str, ...] | None, healthy_only: bool = True
    ) -> list[ClusterState]:
        """``_eligible`` for selector ``sel``."""
        if healthy_only:
            hit = self._eligibles.get(sel)
            if hit is not None and hit[0] == self._hard_at:
                cached: list[ClusterState] = hit[1]
                return cached
        cs = (
            self.clusters.values()
            if sel is None
            else [self.clusters[n] for n in sel if n in self.clusters]
        )
        out = [c for c in cs if c.healthy or not healthy_only]
        if healthy_only:
            self._eligibles[sel] = (self._hard_at, out)
        return out

    def _could(self, c: ClusterState, runs: Runs, dkey: int) -> bool:
        k = (c.index, dkey)
        v = self._could_hold.get(k)
        if v is None:
            v = self._could_hold[k] = c.could_hold(runs)
        return v

    def _keep_queue_bucket(self, name: str, bucket: Bucket) -> None:
        """Keep queue ``name``'s bucket as the door left it (a full one is not kept)."""
        if bucket.tokens is None:
            self.queue_buckets.pop(name, None)
        else:
            self.queue_buckets[name] = bucket

    def submit(self, action: ActionSpec, now: float, *, door: bool = True) -> Reason | None:
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

    def cancel(self, action_id: str, now: float) -> bool:
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

    def finish(self, action_id: str, now: float, record: bool = True) -> None:
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

    def expire_environments(self, now: float) -> list[str]:
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

    def expire_waiting(self, now: float) -> list[Expired]:
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

    def _next_expiry(self) -> float | None:
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

    def next_wakeup(self) -> float | None:
        """The earliest time at which ``schedule`` must run again without an event
        (an idle environment's expiry, a waiting action's ``max_queued_time``)."""
        expiry = self._next_expiry()
        if not self.envs:
            return expiry
        ts = [
            i.expires_at for i in self.envs.values() if i.active == 0 and i.expires_at is not None
        ]
        if expiry is not None:
            ts.append(expiry)
        return min(ts) if ts else None

    def invalidate(self) -> None:
        """Forget what incremental passes remember: the next pass visits every queue.

        Never needed for correctness (every input a visit reads is tracked); useful to
        measure a full pass, or to rule the incremental path out when debugging.
        """
        for q in self.queues.values():
            q.last_sig = None
            q.cap_pos = -1
        self._fit_cache.clear()
        self._scans.clear()
        self._rel_cache.clear()
        self._feasible.clear()
        self._unfit.clear()
        self._orders.clear()
        self._cands.clear()

    def _settle_status(self, q: _Queue) -> None:
        if q.spec.status is QueueStatus.draining and not q.waiting and q.running == 0:
            q.spec = q.spec.with_changes(status=QueueStatus.drained)

    # ------------------------------------------------------------------ the pass

    def schedule(self, now: float) -> list[Admitted]:
        """One scheduling cycle: passes until nothing more starts.

        Raises ``PassError`` (with what was admitted before) if anything inside raises.
        """
        out: list[Admitted] = []
        try:
            self.expire_environments(now)
            while self._pass(now, out):
                pass
            draining = QueueStatus.draining
            if self._draining_at != self._spec_ver:
                self._draining = [q for q in self.queues.values() if q.spec.status is draining]
                self._draining_at = self._spec_ver
            for q in self._draining:
                if q.spec.status is draining:
                    self._settle_status(q)
        except Exception as e:
            raise PassError(out, _deciding(e)) from e
        return out

    def _mark_head(self, q: _Queue) -> None:
        """``q``'s head may have changed (or it may have joined or left the visiting
        order): the next pass puts it back where it now goes."""
        if self._qdirty is not None:
            self._qdirty[q] = None

    def _reorder(self) -> None:
        """Bring the visiting order up to date: all of it after a policy change, else
        only the queues whose head may have changed (an admission moves one queue's
        head: sorting every queue again after it was a tenth of an admitting event).

        Equal priority: the queue whose next action was submitted first, then by name.
        File order breaks ties within a queue only. (Names are unique, so the queue
        itself is never compared.)
        """
        dirty = self._qdirty
        keyed = self._qkeyed
        order = self._qorder
        keys = self._qkeys
        if dirty is None:
            keyed = [_qkey(q) for q in self.queues.values() if q.waiting]
            keyed.sort()
            self._qkeyed = keyed
            self._qkeys = {k[2]: k for k in keyed}
            order = [k[3] for k in keyed]
        else:
            for q in dirty:
                name = q.spec.name
                old = keys.pop(name, None)
                if old is not None:
                    # Keys are unique (the name is in them): this finds it exactly.
                    i = bisect_left(keyed, old)
                    del keyed[i]
                    del order[i]
                if q.waiting and self.queues.get(name) is q:
                    k = _qkey(q)
                    i = bisect_left(keyed, k)
                    keyed.insert(i, k)
                    order.insert(i, q)
                    keys[name] = k
        self._qorder = order
        self._qdirty = {}

    def _pass(self, now: float, out: list[Admitted]) -> int:
        self.passes += 1
        if self._qdirty is None or self._qdirty:
            self._reorder()
        order = self._qorder
        self._holds = {}
        self._resv = {}
        self._infeasible = set()
        self._noroom = set()
        self._unheld_cache = {}
        self._chg_cache = {}
        self._dr_cache = {}
        self._exp_cache = {}
        self._held_cache = {}
        self._hsig_cache = {}
        self._hflip_cache = {}
        self._stale_cache = {}
        self._stale_last = None
        self._moved_cache = {}
        self._resv_cache = {}
        # Holds and reservations bind the queues after the one that made them. A queue
        # may be skipped only if what came before it this pass is what came before it
        # last pass: track where this pass's effects first differ from the last's.
        self._prev_effects = self._effects
        self._effects = []
        self._diverged = None
        started = 0
        incremental = self.incremental
        holds = self._holds
        n_clusters = len(self.clusters)
        effects = self._effects
        chg_cache = self._chg_cache
        hsig_cache = self._hsig_cache
        selsets = self._selsets
        # ``_signature`` inlined; the epochs move as earlier queues admit work.
        org = self.org
        orgd = org.max_concurrent_actions is not None or org.max_concurrent_runs is not None
        for q in order:
            sig = (q.epoch, q.spec, self._env_epoch, self._org_epoch if orgd else 0)
            up = len(effects)
            diverged: int | None = self._diverged
            same_upstream = q.last_up_len == up and (diverged is None or diverged >= up)
            cap_end = self._cap_base + len(self._cap_log)
            if incremental and (not q.last_started or q.mixed):
                # Actions only appended since the last visit: what it decided stands if
                # it would under the signature it had then (the epoch moved by the
                # appends alone); then only the new actions need deciding.
                tail = q.tail
                sig_was = sig
                if tail > 0:
                    ls = q.last_sig
                    if ls is not None and ls[0] + tail == q.epoch and self._classes_as_now(q):
                        sig_was = (ls[0], *sig[1:])
                    else:
                        tail = 0
                changed: frozenset[str] | set[str] | None
                if q.cap_pos == cap_end:
                    changed = _NO_CHANGE
                else:
                    # ``_changes``' answer for the queues visited together, if known.
                    chg = chg_cache.get(q.cap_pos)
                    if chg is not None and chg[0] == cap_end:
                        sel = q.spec.clusters
                        changed = chg[2].get(sel, _UNKNOWN)
                        if changed is _UNKNOWN:
                            # A selector the changes since missed (most, after one
                            # completion): ``_changes``' answer without the call.
                            names = selsets.get(sel) if sel is not None else None
                            if names is not None and names.isdisjoint(chg[1]):
                                changed = chg[2][sel] = _NO_CHANGE
                            else:
                                changed = self._changes(q)
                    else:
                        changed = self._changes(q)
                expired: frozenset[str] | None = None
                if now > q.horizon and changed is not None:
                    # What was read on a cluster whose answers expired (a running
                    # action reached its estimated end, a backfill window closed) is
                    # looked at again as if its capacity had changed; what was read
                    # elsewhere stands.
                    expired = frozenset(n for n, h in q.hz.items() if now > h)
                    if not expired:
                        # Never so (``horizon`` is the earliest of ``hz``); were it, the
                        # expired answer would be known nowhere: visit.
                        changed = None
                    else:
                        ek = (id(changed), expired)
                        got = self._exp_cache.get(ek)
                        if got is None or got[0] is not changed:
                            got = self._exp_cache[ek] = (changed, set(changed) | expired)
                        changed = got[1]
                if not changed:
                    # ``_still`` with no capacity change here, inlined: the common case.
                    # (Records not up to date where capacity changed under a held fleet
                    # stand while it is still held: see ``_held_still``.)
                    still = (
                        changed is not None
                        and sig_was == q.last_sig
                        and (not q.hist_dep or q.last_hist == self._hist_epoch)
                        and (
                            same_upstream
                            or (self._all_held(q) if q.stale else self._views_same(q, changed))
                        )
                    )
                elif (
                    sig_was == q.last_sig
                    and (not q.hist_dep or q.last_hist == self._hist_epoch)
                    and not q.fragile
                    and not q.mixed
                    and (len(holds) >= n_clusters or self._all_held(q))
                ):
                    # ``_still``'s held path, tried here first: most queues below a
                    # fleet held from above end there, and a pass has many of them.
                    # Its commonest success inlined (no reservation, nothing expired,
                    # the verdict and the stale set worked out for a queue before): a
                    # completion re-checks a hundred such queues.
                    held = None
                    hsig = q.hsig
                    if (
                        not expired
                        and hsig is not None
                        and q.resv_rec is None
                        and q.hsig_of is q.evals
                        and q.hsig_n == len(q.evals)
                        and hsig_cache.get((q.spec.clusters, hsig)) is True
                    ):
                        # (Queues that stood alike in a row first; else any before.)
                        prev_stale = q.stale
                        hit = self._stale_last
                        if hit is None or hit[0] is not prev_stale or hit[1] is not changed:
                            hit = self._stale_cache.get((id(prev_stale), id(changed)))
                        if hit is not None and hit[0] is prev_stale and hit[1] is changed:
                            q.last_hist = self._hist_epoch
                            q.stale = hit[2]
                            held = True
                    if held is None:
                        held = self._held_still(q, changed, now, expired)
                    if held is None:
                        still = self._still(q, sig_was, changed, same_upstream, now, expired, False)
                    else:
                        still = held
                else:
                    still = self._still(q, sig_was, changed, same_upstream, now, expired, False)
                if still:
                    # Nothing this queue's outcome depends on has changed since its
                    # last visit: same decisions, same reasons. Only its holds and
                    # reservations, which bind the queues after it, need making again
                    # (``_hold`` and ``_reserve_on``, minus the visit's own record).
                    if len(holds) < n_clusters and q.last_holds:
                        # (Else every cluster is held already.) ``_effect`` inlined, as
                        # for reservations below.
                        # An effect the same as the last pass's at its place is that
                        # one, kept (fewer young objects for the collector to walk).
                        # (Past the first difference too: one queue's moved
                        # reservation leaves the effects after it mostly in place.)
                        prev = self._prev_effects
                        for cname, head in q.last_holds:
                            if cname not in holds:
                                holds[cname] = head
                                i = len(effects)
                                p = prev[i] if i < len(prev) else None
                                if (
                                    p is None
                                    or p[0] != "h"
                                    or p[1] != cname
                                    or p[2] != head
                                    or p[3] is not None
                                    or p[4] is not None
                                ):
                                    if self._diverged is None:
                                        self._diverged = i
                                    effects.append(("h", cname, head, None, None))
                                else:
                                    effects.append(p)
                    if q.last_resv:
                        # ``_reserve_on`` and ``_effect`` inlined: every skipped
                        # reserving queue remakes its reservation, in every pass.
                        resv = self._resv
                        prev = self._prev_effects
                        for cname, r in q.last_resv:
                            on = resv.get(cname)
                            if on is None:
                                resv[cname] = [r]
                            else:
                                on.append(r)
                            ver = r.extra.version if r.extra is not None else -1
                            i = len(effects)
                            p = prev[i] if i < len(prev) else None
                            if (
                                p is None
                                or p[0] != "r"
                                or p[1] != cname
                                or p[2] != r.time
                                or p[3] != r.head
                                or p[4] != ver
                            ):
                                if self._diverged is None:
                                    self._diverged = i
                            elif p[5] is r:
                                effects.append(p)
                                continue
                            effects.append(("r", cname, r.time, r.head, ver, r))
                    q.cap_pos = cap_end
                    # Its records now stand for this pass's upstream (the views were
                    # checked against it, or it is the last one's): the next pass
                    # compares against this one.
                    q.last_up_len = up
                    if tail:
                        started += self._visit_tail(q, tail, sig, now, out, up)
                        continue
                    self.skipped_visits += 1
                    continue
            n_effects = up
            q.last_up_len = up
            q.tail = 0
            # The state as the visit finds it: holds and reservations made by the visit
            # itself are its output, not its input. (What a visit that admitted work
            # changed is in the capacity log, or its records are dropped: see below.)
            q.last_sig = sig
            q.last_hist = self._hist_epoch
            q.cap_pos = self._cap_base + len(self._cap_log)
            q.stale = None
            self._start_visit_records()
            n = self._visit(q, now, out)
            q.horizon = self._horizon
            q.hz = self._vhz
            # Fits asked for outside a visit (``insight``) must not touch its records.
            self._vhz = {}
            started += n
            q.last_started = n
            mine = self._effects[n_effects:]
            q.last_holds = tuple(self._vholds)
            q.last_resv = tuple((e[1], e[5]) for e in mine if e[0] == "r")
            # A visit that admitted work found its answers at more than one capacity:
            # each at the capacity its admissions before it left. The clusters they
            # took are in the capacity log past the visit's start, so the next check
            # reads those again, as changed, and finds every answer as it would be
            # now. What else an admission moves must not matter: the queue's running
            # work (its gates), the org's (its envelope), environments (``fragile``).
            # Reasons changed in place are not made from such records (see
            # ``_evals_still``): a class member's answer may differ from the one
            # before it there.
            q.mixed = bool(n) and not (self._vfragile or orgd or _reads_running(q.spec))
            if q.mixed:
                q.last_sig = (q.epoch, q.spec, self._env_epoch, 0)
                q.tail = 0
            if n and not q.mixed:
                # Never skipped next time (see above): nothing to record.
                q.evals, q.rooms, q.views = [], {}, {}
            else:
                q.evals = self._vevals
                q.rooms = self._vrooms
                q.views = self._views_before(mine, q.rooms) if q.rooms else {}
            q.hist_dep = self._vhist
            q.fragile = self._vfragile
            q.resv_rec = self._vresv
        return started

    def _classes_as_now(self, q: _Queue) -> bool:
        """Are ``q``'s decision classes (if built) grouped as a visit now would group
        them (see ``_visit``)? A fit's reason changed in place goes to the later
        members of its class (``_flip``), appended ones included: that is right only
        if the class is one a visit now would answer alike (with reservations about,
        estimates part of it)."""
        if q.cls_mode is None:
            return True
        spec = q.spec
        algo = spec.algorithm
        run_gates = (
            spec.run_concurrency is not None
            or spec.per_run_concurrency is not None
            or self.org.max_concurrent_runs is not None
        )
        reserving = algo is Algorithm.backfill or algo is Algorithm.easy
        return q.cls_mode == (bool(self._resv) or reserving, run_gates)

    def _visit_tail(
        self, q: _Queue, k: int, sig: tuple[Any, ...], now: float, out: list[Admitted], up: int
    ) -> int:
        """Decide the ``k`` actions appended to ``q`` since its last visit, whose other
        answers were just found to stand (``_still``), and extend its records.

        A visit takes the queue in order, and every action before these would get the
        answer it has, with nothing admitted among them (that is what the check
        found): so these meet the state as it stands now, with the queue's own holds
        and reservations made again, and its block or reservation as it was. Each is
        decided on its own, not from a class memo (whose answers are the same by
        construction).
        """
        self.tail_visits += 1
        if q.due:
            _apply_due(q)  # before the records are extended (a fit's actions may grow)
        v = _Visit(q, self._eligible(q))
        if q.blocked_head is not None:
            # Only a strict queue's block or a reserving queue's reservation names it.
            v.blocked = v.strict
            v.reserved = v.reserving
        self._start_visit_records()
        w = q.waiting
        tail = w[len(w) - k :]
        started = 0
        for a in tail:
            r = self._consider(q, a, v, now, out)
            if r is None:
                started += 1
                continue
            c = a.cls
            if c is not None and q.runs_ok:
                i = bisect_left(c.m, a.pos, key=_POS)
                c.settle(i, i + 1, r)
            else:
                a.note(r)
        if started:
            for a in tail:
                if a.state != "waiting" and a.cls is not None:
                    self._unlist(q, a)
            q.waiting = [a for a in w if a.state == "waiting"]
        mine = self._effects[up:]
        q.last_holds += tuple(self._vholds)
        q.last_resv = tuple((e[1], e[5]) for e in mine if e[0] == "r")
        if self._horizon < q.horizon:
            q.horizon = self._horizon
        hz = q.hz
        for n, h in self._vhz.items():
            if h < hz.get(n, _INF):
                hz[n] = h
        self._vhz = {}
        q.last_sig = sig
        q.last_started = started
        q.tail = 0
        q.hist_dep = q.hist_dep or self._vhist
        q.last_hist = self._hist_epoch
        q.fragile = q.fragile or self._vfragile
        if self._vresv is not None:
            q.resv_rec = self._vresv
        org = self.org
        orgd = org.max_concurrent_actions is not None or org.max_concurrent_runs is not None
        if started:
            # As for a full visit that admitted work (see ``_pass``).
            if self._vfragile or orgd or _reads_running(q.spec):
                q.evals, q.rooms, q.views = [], {}, {}
                q.mixed = False  # nothing recorded: the next pass visits
                return started
            q.mixed = True
            q.last_sig = (q.epoch, q.spec, self._env_epoch, 0)
        # Fits that ended alike share a record (as ``_eval`` makes them).
        evals = q.evals
        seen: dict[tuple[Any, ...], _Eval] = {}
        for e in evals:
            seen.setdefault((e.dkey, e.blocked, e.first, e.reason), e)
        _merge_evals(seen, evals, self._vevals)
        rooms = q.rooms
        new: set[str] = set()
        for dkey, rs in self._vrooms.items():
            have = rooms.get(dkey)
            if have is None:
                rooms[dkey] = rs
            else:
                have |= rs
            new |= rs
        new.difference_update(q.views)
        if new:
            q.views.update(self._views_before(mine, {0: new}))
        return started

    def _changes(self, q: _Queue) -> frozenset[str] | set[str] | None:
        """Clusters of ``q``'s selector whose free capacity changed since its last visit.

        None if something more than free capacity changed there (health, a capacity
        report, a new spec), or if the log no longer reaches back that far.
        """
        pos = q.cap_pos - self._cap_base
        log = self._cap_log
        if pos < 0:
            return None
        if pos == len(log):
            return _NO_CHANGE
        # Queues visited together stand at the same place in the log: one answer for
        # all of them (callers only read it), and one read of the log for every
        # selector: each cluster it names, in the order first named, and whether an
        # entry for it was hard.
        end = self._cap_base + len(log)
        got = self._chg_cache.get(q.cap_pos)
        if got is None or got[0] != end:
            span: dict[str, bool] = {}
            for i in range(pos, len(log)):
                name, hard = log[i]
                if hard:
                    span[name] = True
                elif name not in span:
                    span[name] = False
            got = self._chg_cache[q.cap_pos] = (end, span, {})
        answers = got[2]
        sel = q.spec.clusters
        answer: frozenset[str] | set[str] | None = answers.get(sel, _UNKNOWN)
        if answer is not _UNKNOWN:
            return answer
        # A selector none of the changes touched shares the empty answer (no set per
        # selector per pass for the collector to walk): the set is made on the first
        # change it names.
        names = None
        if sel is not None:
            names = self._selsets.get(sel)
            if names is None:
                names = self._selset(sel)
        out: set[str] | None = None
        hard_seen = False
        for name, hard in got[1].items():
            if names is None or name in names:
                if hard:
                    hard_seen = True
                    break
                if out is None:
                    out = {name}
                else:
                    out.add(name)
        if hard_seen:
            answer = None
        elif out is None:
            answer = _NO_CHANGE
        else:
            answer = out
        answers[sel] = answer
        return answer

    def _still(
        self,
        q: _Queue,
        sig: tuple[Any, ...],
        changed: set[str] | frozenset[str],
        same_upstream: bool,
        now: float,
        expired: frozenset[str] | None = None,
        try_held: bool = True,
    ) -> bool:
        """Would a visit of ``q`` now answer exactly as its last did?

        Its signature must match, and its answers must still hold where they read the
        task history, upstream holds and reservations, or capacity on the clusters in
        ``changed``:

        - holds and reservations are read only at clusters with room (``q.views``), so
          only those must look as they did (``same_upstream`` vouches for all at once);
        - a fit's answer reads capacity only through which clusters have room for it,
          taken in placement order: the first with room gives the reason (a queue that
          is already blocked only asks whether there is one). Clusters outside
          ``changed`` keep their room and their relative order, so only the changed
          ones need a look (``_evals_still``);
        - a strict head's holds follow node shapes (a hard change otherwise); a
          reserving head's reservation is recomputed on the changed clusters;
        - answers that hold only until some time (``q.hz``) read the clock through
          one cluster each: the clusters in ``expired`` (also in ``changed``) are read
          again, which gives their answers new times;
        - when every cluster the queue may use is held from above, only whether each
          demand has room anywhere is read (``_held_still``), and the records of where
          fits found room wait in ``q.stale`` until a full check takes them as changed.

        On success the records are brought up to date, as if the visit had been made.
        ``try_held``: False when the caller found the held path does not apply, or
        tried it already (``_pass``).
        """
        if sig != q.last_sig:
            return False
        if q.hist_dep and q.last_hist != self._hist_epoch:
            return False
        if try_held and changed and not q.fragile and not q.mixed and self._all_held(q):
            held = self._held_still(q, changed, now, expired)
            if held is not None:
                return held
        stale = q.stale
        if stale:
            # The records are brought up to date where they were not, as if those
            # clusters had changed now (they did since the records were).
            changed = stale.union(changed)
        if not same_upstream and not self._views_same(q, changed):
            return False
        if not changed:
            return True
        if q.fragile:
            return False
        outer_h, outer_hist, outer_hz = self._horizon, self._vhist, self._vhz
        hz = q.hz
        if expired:
            # The check reads these clusters again and records what it finds; on
            # failure the visit replaces the records anyway.
            for n in expired:
                del hz[n]
            self._horizon = min(hz.values(), default=_INF)
        else:
            self._horizon = q.horizon
        self._vhz = hz
        self._vhist = False
        self._flips = []
        self._unhold = False
        rec = q.resv_rec
        ok = True
        moved: tuple[ClusterState, float, ClusterState | None] | None = None
        own: tuple[str, _Reservation] | None = None
        head_went = False
        if rec is not None:
            # The reservation the visit would make now, which its actions after the
            # head read where they find room. A head with room now would not reserve
            # (and projections assume none: see ``_carried``), so that goes first.
            clusters = self.clusters
            holds = self._holds
            for n in changed:
                c = clusters.get(n)
                if c is not None and c.healthy and self._room(c, rec.dkey, rec.runs):
                    head_went = True
                    if n not in holds:
                        # The head would start there, or be turned away by a
                        # reservation (which it may fit beside): not told here.
                        ok = False
                        break
            if not head_went:
                ok, moved = self._resv_now(rec, changed, now, q.spec.clusters)
                if ok and rec.where is not None and len(q.last_resv) == 1:
                    old_name, old = q.last_resv[0]
                    own = (
                        (old_name, old)
                        if moved is None
                        else (
                            moved[0].name,
                            _Reservation(moved[1], moved[2], old.head, shared=True),
                        )
                    )
            elif ok:
                # The head is turned away where it now has room (every such cluster
                # is held): see ``_new_head``.
                ok = (
                    not q.mixed
                    and not rec.held
                    and not q.last_holds
                    and len(q.last_resv) == 1
                    and self._classes_as_now(q)
                    and self._evals_still(q, changed, now, None, head_went=True)
                    and self._new_head(q, now)
                )
        if ok and not head_went:
            ok = self._evals_still(q, changed, now, own)
        if ok and moved is not None:
            assert rec is not None
            ok = self._resv_move(q, rec, moved, changed)
        if ok:
            q.horizon = self._horizon
            q.hz = self._vhz
            q.hist_dep = q.hist_dep or self._vhist
            q.last_hist = self._hist_epoch
            q.stale = None
            for e in self._flips:
                self._flip(q, e)
            if self._unhold:
                q.last_holds = ()
        if self._flips or not ok:
            # Reasons changed in place (``_flip``): ``_held_still``'s summary of them
            # goes. (A failed check may have changed some before failing.) Reasons
            # that changed together stand together for a while: the summary is made
            # again now, in the pass that changed them, not in the next.
            q.hsig = None
            if ok:
                self._held_summary(q)
        self._horizon, self._vhist, self._vhz = outer_h, outer_hist, outer_hz
        return ok

    def _all_held(self, q: _Queue) -> bool:
        """Is every healthy cluster of ``q``'s selector held (by the queues before it:
        ``q`` remakes its own holds only once it is found unchanged)?"""
        holds = self._holds
        clusters = self.clusters
        if len(holds) >= len(clusters):
            return True  # holds name clusters of the fleet: every one is held
        sel = q.spec.clusters
        # Within a pass holds are only added: their count dates the answer.
        key = (sel, len(holds))
        got = self._held_cache.get(key)
        if got is None:
            got = True
            for n in clusters if sel is None else sel:
                c = clusters.get(n)
                if c is not None and c.healthy and n not in holds:
                    got = False
                    break
            self._held_cache[key] = got
        return got

    def _any_room(self, sel: tuple[str, ...] | None, dkey: int, runs: Runs) -> bool:
        """Would a fit of demand ``dkey`` under selector ``sel`` find a cluster with
        room now (as ``_consider`` asks it)?"""
        nr_key = (sel, dkey)
        if nr_key in self._noroom:
            return False
        hit = self._cands.get(nr_key)
        cap_end = self._cap_base + len(self._cap_log)
        if hit is not None and hit.pos != cap_end:
            # Only whether there is one: an unmoved cluster that had room still has it
            # (a change of health is a hard change), else a moved one must have it now.
            # (The list itself is brought up to date by the next walk that needs it.)
            pos = hit.pos
            if self._hard_at < pos:
                # The common answer, told by when each cluster last moved: the moved
                # set (a read of the log since ``pos``) is needed only if every
                # cluster of the list moved.
                touched = self._touched
                for n in hit.names:
                    if touched.get(n, -1) < pos:
                        return True
                if sel is not None and len(sel) <= _SEL_SMALL:
                    # A small selector: its clusters that moved since, told the same
                    # way, rather than the moved set (a read of the log since ``pos``,
                    # which most of the fleet wrote to since this one was asked).
                    clusters = self.clusters
                    for n in sel:
                        if touched.get(n, -1) >= pos:
                            c = clusters.get(n)
                            if c is not None and c.healthy and self._room(c, dkey, runs):
                                return True
                    hit.set(cap_end, _NO_ROOM, _NO_CHANGE)  # as below
                    return False
            # Lists made together stand at one log position: one answer for them.
            mk = (pos, cap_end)
            moved = self._moved_cache.get(mk, _UNKNOWN)
            if moved is _UNKNOWN:
                moved = self._moved_cache[mk] = self._soft_since(pos, 64)
            if moved is not None:
                for n in hit.names:
                    if n not in moved:
                        return True
                clusters = self.clusters
                names = None if sel is None else self._selset(sel)
                for n in moved:
                    if names is not None and n not in names:
                        continue
                    c = clusters.get(n)
                    if c is not None and c.healthy and self._room(c, dkey, runs):
                        return True
                # No cluster has room now (the unmoved ones had none and stand): the
                # list is brought up to date as empty, so that the next question
                # looks only at what moves after this, not again at all that moved
                # since the list was made (a demand with no room anywhere is asked
                # after every completion, and the moved set only grows).
                hit.set(cap_end, _NO_ROOM, _NO_CHANGE)
                return False
        return bool(self._cands_of(nr_key, runs, None).order)

    def _selset(self, sel: tuple[str, ...]) -> frozenset[str]:
        """Selector ``sel``'s cluster names, as a set (kept)."""
        names = self._selsets.get(sel)
        if names is None:
            names = self._selsets[sel] = frozenset(sel)
        return names

    def _held_still(
        self,
        q: _Queue,
        changed: set[str] | frozenset[str],
        now: float,
        expired: frozenset[str] | None,
    ) -> bool | None:
        """``_still`` for a queue that finds every cluster it may use held from above.

        A held cluster turns every action away before anything else is read there, so
        a visit now reads capacity only as whether a demand has room anywhere (the
        answer is ``HeldForGang`` if so, ``NoClusterCapacity`` if not, for blocked and
        unblocked fits alike), and, for a reserving queue, through its head's
        reservation. If every recorded fit's reason is its demand's answer now, the
        visit would answer as the last did; only the reservation is made again (as
        ``_still`` does). Which cluster each fit found first, and where it found room,
        are not brought up to date: ``changed`` joins ``q.stale`` instead, and a later
        full check takes those clusters as changed. This is the common case of a
        fleet held by a strict head above: the changed clusters may move in the
        placement order of every fit below it, but no answer moves.

        Returns None when the answers cannot be told this way (some would change, or a
        fit's reason is one a held fleet never gives): ``_still``'s full check then
        decides, with nothing changed here. Else whether the visit would answer alike
        (records updated as ``_still`` updates them).
        """
        sel = q.spec.clusters
        evals = q.evals
        hsig = q.hsig
        if hsig is None or q.hsig_of is not evals or q.hsig_n != len(evals):
            hsig = self._held_summary(q)
            if hsig is None:
                return None
        # Queues with the same selector and demands share the verdict within a pass.
        vk = (sel, hsig)
        got = self._hsig_cache.get(vk)
        if got is None:
            got = True
            runs_of_d = {e.dkey: e.runs for e in evals}
            for k in hsig:
                d = k >> 1
                if self._any_room(sel, d, runs_of_d[d]) is not bool(k & 1):
                    got = False
                    break
            self._hsig_cache[vk] = got
        flips: _HeldFlips | None = None
        to_flip: list[_Eval] | None = []
        if not got:
            # Some demand found room since (a completion under the held fleet): its
            # fits' answer is HeldForGang now, if nothing but their reason moves.
            fk = (sel, hsig, id(changed))
            fhit = self._hflip_cache.get(fk)
            if fhit is None or fhit[0] is not changed:
                fhit = self._hflip_cache[fk] = (
                    changed,
                    self._held_flips(sel, hsig, evals, changed),
                )
            flips = fhit[1]
            if flips is None:
                return None
            to_flip = self._held_flips_apply(q, flips[1], changed)
            if to_flip is None:
                return None
        rec = q.resv_rec
        # A reserving head whose demand found room reserves no more: the reservation
        # is made anew below (``_new_head``), not checked.
        head_went = flips is not None and rec is not None and rec.dkey in flips[1]
        rn: tuple[Any, ...] | None = None
        if rec is not None and not head_went:
            # Records alike read alike: what ``_resv_now`` answers for a record, and
            # the horizons it reads, depend only on the record's fields, the changed
            # clusters, the selector, capacity and environments (the log's end and the
            # environment epoch date them within a pass), so queues whose records are
            # alike share one answer.
            cap_end = self._cap_base + len(self._cap_log)
            env = self._env_epoch
            rk = (rec.dkey, rec.easy, rec.where, rec.time, rec.key, rec.held, sel, id(changed))
            rn = self._resv_cache.get(rk)
            if rn is None or rn[0] is not changed or rn[1] != cap_end or rn[2] != env:
                rn = self._resv_answer(rec, changed, now, sel)
                rn = self._resv_cache[rk] = (changed, cap_end, env, *rn)
            if rn[3] is None:
                return None
        hz = q.hz
        if expired:
            for n in expired:
                del hz[n]
            horizon = min(hz.values(), default=_INF)
        else:
            horizon = q.horizon
        ok = True
        if rn is not None:
            assert rec is not None
            ok, moved, rh, rhz = rn[3], rn[4], rn[5], rn[6]
            if rh < horizon:
                horizon = rh
            for n, h in rhz.items():
                if h < hz.get(n, _INF):
                    hz[n] = h
            if ok and moved is not None:
                ok = self._resv_move(q, rec, moved, changed)
        hist = rn is not None and rn[7]
        if ok and flips is not None:
            assert to_flip is not None
            got_h = self._held_flip(q, flips, head_went, to_flip, now, horizon, hz)
            if got_h is None:
                ok = False
            else:
                horizon, read_hist = got_h
                hist = hist or read_hist
        if ok:
            q.horizon = horizon
            q.hist_dep = q.hist_dep or hist
            q.last_hist = self._hist_epoch
            prev = q.stale
            hit = self._stale_last
            if hit is None or hit[0] is not prev or hit[1] is not changed:
                # (Held queues in a row mostly stood alike: the last answer first.)
                sk = (id(prev), id(changed))
                hit = self._stale_cache.get(sk)
                if hit is None or hit[0] is not prev or hit[1] is not changed:
                    hit = self._stale_cache[sk] = (
                        prev,
                        changed,
                        (
                            frozenset(changed)
                            if prev is None
                            else prev
                            if changed <= prev
                            else prev.union(changed)
                        ),
                    )
                self._stale_last = hit
            q.stale = hit[2]
        return ok

    def _held_flips(
        self,
        sel: tuple[str, ...] | None,
        hsig: tuple[int, ...],
        evals: list[_Eval],
        changed: set[str] | frozenset[str],
    ) -> _HeldFlips | None:
        """Where ``_held_still``'s verdict failed for fits summarized as ``hsig`` under
        selector ``sel``: the summary as it is now, and each demand that had no room
        anywhere and has some now, with a cluster of ``changed`` where it has (room
        comes only where capacity changed). None if some demand lost its room, or its
        room is not on a changed cluster (both left to the full check).
        """
        runs_of_d = {e.dkey: e.runs for e in evals}
        keys: list[int] = []
        found: dict[int, str] = {}
        clusters = self.clusters
        names = None if sel is None else self._selset(sel)
        for k in hsig:
            d = k >> 1
            had = bool(k & 1)
            runs = runs_of_d[d]
            if self._any_room(sel, d, runs) is had:
                keys.append(k)
                continue
            if had:
                return None
            for n in changed:
                c = clusters.get(n)
                if (
                    c is not None
                    and c.healthy
                    and (names is None or n in names)
                    and self._room(c, d, runs)
                ):
                    found[d] = n
                    break
            else:
                return None
            keys.append(k | 1)
        key = tuple(sorted(keys))
        intern = self._hsig_intern
        if len(intern) > 4096:
            intern.clear()
        return intern.setdefault(key, key), found

    def _held_flips_apply(
        self, q: _Queue, found: dict[int, str], changed: set[str] | frozenset[str]
    ) -> list[_Eval] | None:
        """The fits of ``q`` that ``_held_flip`` gives their new reason (those of the
        demands in ``found``, in order: found once, for both), or None if it may not.
        It may exactly where ``_evals_still`` would change them in place (see
        ``_flip``): the classes grouped as a visit now would group them; a strict
        queue's fits (its head's only loses its holds); a greedy queue's; a reserving
        queue's past its head, or its head's own when the head reserved plainly (it
        then reserves anew, ``_new_head``). And the cluster found with room must be
        one the records will take as changed (``q.stale``), as they would have had
        the full check set it."""
        if not self._classes_as_now(q):
            return None
        algo = q.spec.algorithm
        rec = q.resv_rec
        head: str | None = None
        if algo is Algorithm.strict or algo is Algorithm.greedy:
            if rec is not None:
                return None
        else:
            if rec is None or rec.held or not q.last_resv:
                return None
            if rec.dkey in found:
                if q.last_holds or len(q.last_resv) != 1:
                    return None
            else:
                head = q.blocked_head
        prev = q.stale
        out = []
        for e in q.evals:
            w = found.get(e.dkey)
            if w is None:
                continue
            if w not in changed and (prev is None or w not in prev):
                return None
            if head is not None:
                for a in e.acts:
                    if a.id == head:
                        return None
            out.append(e)
        return out

    def _held_flip(
        self,
        q: _Queue,
        flips: _HeldFlips,
        head_went: bool,
        to_flip: list[_Eval],
        now: float,
        horizon: float,
        hz: dict[str, float],
    ) -> tuple[float, bool] | None:
        """Give ``q``'s fits of the demands that found room (``to_flip``, from
        ``_held_flips_apply``) the answer HeldForGang, as ``_still``'s full check would: a
        strict head's holds go; a reserving head that went reserves anew.

        Returns the queue's clock horizon and whether the task history was read, or
        None if the visit would not answer as the records now say (they were changed:
        the queue must be visited).
        """
        new_hsig, found = flips
        strict = q.spec.algorithm is Algorithm.strict
        unhold = False
        for e in to_flip:
            e.reason = Reason.HeldForGang
            # (A cluster the next full check takes as changed: see ``_held_flips_apply``.)
            e.first = found[e.dkey]
            e.fkey = None
            if strict and not e.blocked:
                unhold = True
        read_hist = False
        if head_went:
            outer_h, outer_hist, outer_hz = self._horizon, self._vhist, self._vhz
            self._horizon, self._vhist, self._vhz = horizon, False, hz
            try:
                ok = self._new_head(q, now, all_held=True)
                horizon, read_hist = self._horizon, self._vhist
            finally:
                self._horizon, self._vhist, self._vhz = outer_h, outer_hist, outer_hz
            if not ok:
                q.hsig = None
                return None
        # The records (``e.reason``) change now; their members' reasons when next read
        # or changed (``_Queue.due``): a completion that gives a demand room under a
        # held fleet changes hundreds of classes in a hundred queues, most of which
        # nothing reads before their reasons change again. (Kept short: a queue left
        # alone long enough gives them at once.)
        due = q.due
        for e in to_flip:
            due += (e, e.reason, strict and not e.blocked)
        if len(due) > 3 * _DUE_MAX:
            _apply_due(q)
        if unhold:
            q.last_holds = ()
        q.hsig = new_hsig
        q.hsig_of = q.evals
        q.hsig_n = len(q.evals)
        return horizon, read_hist

    def _resv_answer(
        self,
        rec: _ResvRecord,
        changed: set[str] | frozenset[str],
        now: float,
        sel: tuple[str, ...] | None,
    ) -> tuple[Any, ...]:
        """``_held_still``'s reading of a reserving queue's record: (None,) if the head
        has room on a changed cluster (it would not reserve: ``_still``'s
        ``head_went``); else ``_resv_now``'s (ok, moved), or ``_scan``'s where that
        cannot tell, with the earliest horizon and the horizons by cluster it read, and
        whether it read the task history."""
        clusters = self.clusters
        for n in changed:
            c = clusters.get(n)
            if c is not None and c.healthy and self._room(c, rec.dkey, rec.runs):
                return (None,)
        outer_h, outer_hist, outer_hz = self._horizon, self._vhist, self._vhz
        self._horizon = _INF
        self._vhz = {}
        self._vhist = False
        try:
            ok, moved = self._resv_now(rec, changed, now, sel)
            if not ok and rec.where is not None and not rec.held and self.incremental:
                # The reservation got worse where it was, and the second best is not
                # known from the changed clusters alone: ``_reserve``'s walk finds it
                # (kept per selector and demand, so the queues below a strict head
                # whose holds moved share it). Under a held fleet no fit reads the
                # reservation, so only where it goes matters, not who read it before.
                # (Records are not made for heads of environments: ``fragile``.)
                elig = self._eligible_of(sel)
                if len(elig) > _SCAN_MIN:
                    best, held = self._scan(sel, elig, rec.runs, rec.dkey, now, rec.easy)
                    if best is not None and not held:
                        ok, moved = True, (best[1], best[0], best[2])
            return (ok, moved, self._horizon, self._vhz, self._vhist)
        finally:
            self._horizon, self._vhist, self._vhz = outer_h, outer_hist, outer_hz

    def _held_summary(self, q: _Queue) -> tuple[int, ...] | None:
        """``_held_still``'s summary of ``q``'s fits (kept in ``q.hsig``): each demand's
        key, doubled, plus whether its fits found room (``HeldForGang``) or not
        (``NoClusterCapacity``), sorted; None if some fit's reason is neither, or a
        demand's fits disagree. (Keyed by demand key alone: hashing the pods costs
        more.)"""
        evals = q.evals
        want: dict[int, bool] = {}
        for e in evals:
            r = e.reason
            if r is Reason.HeldForGang:
                w = True
            elif r is Reason.NoClusterCapacity:
                w = False
            else:
                return None
            if want.setdefault(e.dkey, w) is not w:
                return None
        if len(want) == 1:
            ((d, w),) = want.items()
            key: tuple[int, ...] = (2 * d + w,)
        else:
            key = tuple(sorted([2 * d + w for d, w in want.items()]))
        intern = self._hsig_intern
        if len(intern) > 4096:
            intern.clear()  # only shares equal summaries: never let it grow unbounded
        hsig = q.hsig = intern.setdefault(key, key)
        q.hsig_of = evals
        q.hsig_n = len(evals)
        return hsig

    def _new_head(self, q: _Queue, now: float, all_held: bool = False) -> bool:
        """A reserving queue whose head now has room on a changed cluster: would a visit
        answer as the records (just checked with ``head_went``) say, and with which
        head and reservation? Updates ``q``'s head and reservation if it would.

        Only when every cluster where a fit of the queue finds room is held (from
        above, or the check already failed): then no fit reads a reservation, the old
        head's or a new one's, and every action's answer is its demand's (turned away
        at the first cluster with room, or no room at all) wherever in the queue the
        reservation is made. The old head is turned away, and reserves nothing; the
        first action that finds no room anywhere (a fit of its own: a visit decides
        each class's first member after a reservation) reserves instead, as
        ``_reserve`` would now, at the state the visit would meet it in: what came
        before the queue, nothing of its own.

        ``all_held``: the caller found every healthy cluster of the queue's selector
        held (``_all_held``), so every cluster with room is (no cluster leaves the
        fleet's healthy part without a hard change, which a check never gets past).
        """
        holds = self._holds
        if not all_held:
            for rs in q.rooms.values():
                for n in rs:
                    if n not in holds:
                        return False
        head: _Action | None = None
        he: _Eval | None = None
        hk: tuple[float, int] | None = None
        for e in q.evals:
            if e.reason is Reason.NoClusterCapacity:
                for a in e.acts:
                    k = (a.submit, a.seq)
                    if hk is None or k < hk:
                        head, he, hk = a, e, k
        if head is None or he is None:
            return False  # none: no reservation at all (see ``_flip``)
        easy = q.spec.algorithm is Algorithm.easy
        elig = self._eligible(q)
        env = head.env if not head.env_declared else None
        if (
            self.incremental
            and len(elig) > _SCAN_MIN
            and not (env and self.undeclared_env.get(env))
        ):
            # ``_reserve``'s walk, without the effects it makes (and the pass would only
            # take back): the reservation it would make, if it makes just that.
            best, held = self._scan(q.spec.clusters, elig, he.runs, he.dkey, now, easy)
            if held or best is None:
                return False
            q.blocked_head = head.id
            q.resv_rec = _ResvRecord(he.runs, he.dkey, easy, best[1], best[0], _NO_CHANGE)
            q.last_resv = ((best[1].name, _Reservation(best[0], best[2], head.id, shared=True)),)
            return True
        # ``_reserve`` makes its holds and reservation as effects of the pass; the pass
        # makes them again from the records (see ``_pass``): take them back here.
        effects = self._effects
        n_eff = len(effects)
        diverged = self._diverged
        vholds, vresv = self._vholds, self._vresv
        self._vholds = []
        self._reserve(head, he.runs, he.dkey, q.spec.clusters, elig, now, easy)
        rec = self._vresv
        made = effects[n_eff:]
        del effects[n_eff:]
        for x in reversed(made):
            if x[0] == "h":
                del holds[x[1]]
            else:
                on = self._resv[x[1]]
                on.pop()
                if not on:
                    del self._resv[x[1]]
        self._diverged = diverged
        self._vholds, self._vresv = vholds, vresv
        if rec is None or rec.held or rec.where is None or len(made) != 1:
            return False
        q.blocked_head = head.id
        q.resv_rec = rec
        q.last_resv = ((rec.where, made[0][5]),)
        return True

    def _views_same(self, q: _Queue, changed: set[str] | frozenset[str]) -> bool:
        """Do the holds and reservations at the clusters where ``q``'s last visit found
        room (outside ``changed``) look as they did then?"""
        if q.fragile:
            # An action of a running environment reads the holds and reservations of
            # the environment's cluster, room or not: they are not among the views.
            return False
        holds, resv = self._holds, self._resv
        for name, view in q.views.items():
            # ``_view``'s common answers inlined: most clusters are held, or bare.
            if name in holds:
                if view is not _HELD and view != _HELD and name not in changed:
                    return False
            elif name not in resv:
                if view is not _OPEN and view != _OPEN and name not in changed:
                    return False
            elif name not in changed and self._view(name) != view:
                return False
        return True

    def _room(self, c: ClusterState, dkey: int, runs: Runs) -> bool:
        """Has ``c`` room for the demand now (the pass's fit caches, shared)?"""
        if not c.known:
            return True
        ik = (c.index, dkey)
        if ik in self._infeasible:
            return False
        ver = c.version
        if self._feasible.get(ik) == ver:
            return True
        if self._unfit.get(ik) == ver or c.place(runs, commit=False) is None:
            # Capacity only shrinks within a pass: no need to ask again (for a demand
            # whose best fit is monotone).
            if dkey not in self._unlike:
                self._infeasible.add(ik)
            self._unfit[ik] = ver
            return False
        self._feasible[ik] = ver
        return True

    def _evals_still(
        self,
        q: _Queue,
        changed: set[str] | frozenset[str],
        now: float,
        own: tuple[str, _Reservation] | None = None,
        head_went: bool = False,
    ) -> bool:
        """Would each of ``q``'s recorded fits end as it did, capacity having changed on
        ``changed``? (See ``_still``.) Updates the records if so.

        ``own``: the reservation the queue's head would make now (cluster, reservation),
        which binds the queue's actions after the head.

        ``head_went``: a reserving queue's head now has room on a changed cluster, so it
        no longer reserves (see ``_new_head``): its fit, and the others that found no
        room, may find room now; none may lose it (the head would move back).

        The records are updated in place as the check goes: when it fails, the queue
        gets a full visit, which replaces them all.
        """
        clusters = self.clusters
        # Queues standing at the same place in the log share ``changed`` (``_changes``)
        # and, capacity being the same for them, which of its clusters have room.
        hit = self._dr_cache.get(id(changed))
        if hit is None or hit[0] is not changed:
            ds: list[ClusterState] = []
            for n in changed:
                c = clusters.get(n)
                if c is not None and c.healthy:
                    ds.append(c)
            hit = self._dr_cache[id(changed)] = (
                changed,
                ds,
                {},
                {c.name: _order_key(c) for c in ds},
            )
        ds = hit[1]
        dkeys: dict[str, tuple[Any, ...]] = hit[3]
        if not ds:
            return True
        now_room: dict[int, list[ClusterState]] = hit[2]
        room = self._room
        holds = self._holds
        resv = self._resv
        own_held = q.resv_rec.held if q.resv_rec is not None else _NO_CHANGE
        # Per demand: the clusters with room (for a fit that walks them all), as they
        # will be: the changed ones leave, those of them with room now come back.
        rooms_of = q.rooms
        for rs in rooms_of.values():
            rs.difference_update(changed)
        # Fits whose "no room anywhere" became "room, but every cluster with it turns
        # the action away", where that only changes the reason of the members that
        # shared the answer (see ``_flip``): their records, changed as they go. Their
        # members are given the new reason once the whole check passes (``_still``).
        algo = q.spec.algorithm
        flips = self._flips
        mixed = q.mixed
        acted: list[set[int]] = []  # see ``_alone``, made once if needed
        own_name = own[0] if own is not None else None
        head_key: tuple[float, int] | None = None
        if own is not None:
            h = self.actions.get(q.blocked_head or "")
            if h is None:
                return False
            head_key = (h.submit, h.seq)
        for e in q.evals:
            dkey = e.dkey
            dr = now_room.get(dkey)
            if dr is None:
                runs = e.runs
                dr = now_room[dkey] = [c for c in ds if room(c, dkey, runs)]
            first = e.first
            if e.blocked:
                # Only "is there room anywhere" counts, and any cluster with room will do.
                if first is not None and first not in changed:
                    continue
                if dr:
                    if first is None:
                        if (
                            algo is not Algorithm.strict
                            or not self._classes_as_now(q)
                            or (mixed and not self._alone(q, e, acted))
                        ):
                            return False  # NoClusterCapacity would become HeldForGang
                        e.reason = Reason.HeldForGang
                        flips.append(e)
                    e.first = dr[0].name
                    e.fkey = None
                elif first is not None:
                    return False  # its witness lost room: the others are not known
                continue
            # The walk reads every cluster with room: none may take the action, and
            # the first in placement order gives the reason.
            rooms = rooms_of[dkey]
            for c in dr:
                name = c.name
                if name in own_held:
                    return False
                if name not in holds:
                    upr = resv.get(name)
                    if e.blind and (upr or name == own_name):
                        # A reservation the fit did not meet: only its own actions are
                        # known, not the others of other estimates that shared it.
                        return False
                    if name == own_name:
                        assert own is not None and head_key is not None
                        # Only the actions after the head meet its reservation.
                        with_own = [*upr, own[1]] if upr else [own[1]]
                        for a in e.acts:
                            after = (a.submit, a.seq) > head_key
                            got = with_own if after else upr
                            if not got or self._allowed(a, now, got, e.runs, c) is not None:
                                return False  # it would start there
                    elif not upr or self._any_allowed(e.acts, now, upr, e.runs, c):
                        return False  # it would start there
                rooms.add(name)
            if not rooms:
                if first is not None:
                    # Room went: NoClusterCapacity now. That changes nothing but the
                    # reason for a greedy queue's fit, or a reserving queue's past its
                    # head (which reserved already); a strict queue's would block, a
                    # reserving queue's head (or one before it) would reserve.
                    if (
                        algo is Algorithm.strict
                        or head_went
                        or not self._classes_as_now(q)
                        or (mixed and not self._alone(q, e, acted))
                    ):
                        return False
                    if algo is not Algorithm.greedy:
                        if not q.last_resv:
                            return False  # see ``_flip``
                        h = self.actions.get(q.blocked_head or "")
                        if h is None:
                            return False
                        hk = (h.submit, h.seq)
                        for a in e.acts:
                            if (a.submit, a.seq) <= hk:
                                return False
                    e.reason = Reason.NoClusterCapacity
                    e.first = None
                    e.fkey = None
                    flips.append(e)
                continue
            if first is None:
                if not self._classes_as_now(q) or (mixed and not self._alone(q, e, acted)):
                    return False  # a reason changed in place (see ``_flip``)
                if algo is Algorithm.strict:
                    # The head's fit (a strict queue's only one before its block): it
                    # blocks all the same, only without holding clusters.
                    self._unhold = True
                elif algo is not Algorithm.greedy:
                    # Past a reserving queue's head, as past a strict one's block; the
                    # head's own fit would not reserve any more.
                    if not q.last_resv:
                        return False  # see ``_flip``
                    head = q.blocked_head
                    for a in e.acts:
                        if a.id == head and not head_went:
                            return False
                # Every cluster with room is a changed one, and turns it away (above):
                # held, or reserved from above or by the queue's own head.
                best = self._first_of(rooms)
                bn = best.name
                e.reason = Reason.HeldForGang if bn in holds else Reason.BackfillWindow
                e.first = bn
                e.fkey = _order_key(best)
                flips.append(e)
                continue
            if first in rooms and first not in changed:
                # The order is by free capacity: only the changed clusters moved in it.
                if not dr:
                    continue  # the same first cluster, turning it away as before
                best = clusters[first]
                bk = e.fkey
                if bk is None:
                    bk = _order_key(best)
                for c in dr:
                    k = dkeys[c.name]
                    if k < bk:
                        best, bk = c, k
            elif first in rooms and e.fkey is not None and dkeys[first] <= e.fkey:
                # The first cluster moved up in the order (it freed capacity): the
                # others that did not change stay behind where it was, so the first
                # now is the first of the changed ones (it among them).
                best = clusters[first]
                bk = dkeys[first]
                for c in dr:
                    k = dkeys[c.name]
                    if k < bk:
                        best, bk = c, k
            else:
                best = self._first_of(rooms)
                bk = _order_key(best)
            bn = best.name
            if bn != first or bn in changed:
                # A cluster that turns the action away: held, else reserved.
                if bn in own_held:
                    return False
                r = Reason.HeldForGang if bn in holds else Reason.BackfillWindow
                if r is not e.reason:
                    return False
            e.first = bn
            e.fkey = bk
        views = q.views
        for c in ds:
            n = c.name
            for rs in rooms_of.values():
                if n in rs:
                    # ``_view``'s common answers inlined: most clusters are held, or bare.
                    if n in holds:
                        views[n] = _HELD
                    elif n not in resv:
                        views[n] = _OPEN
                    else:
                        views[n] = self._view(n)
                    break
            else:
                views.pop(n, None)
        return True

    def _any_allowed(
        self,
        acts: list[_Action],
        now: float,
        rs: list[_Reservation],
        runs: Runs,
        c: ClusterState,
    ) -> bool:
        """Would any of ``acts`` be allowed on ``c`` under ``rs`` (``_allowed``)?

        An action enters ``_allowed`` only through its estimate: the declared one, or
        its task's history (fixed within a pass). Actions alike in that get the same
        answer and note the same (clock horizons, the history read), so each such
        estimate is asked once.
        """
        seen: set[tuple[float | None, str | None]] = set()
        for a in acts:
            d = a.spec.estimate
            k = (d, a.task if d is None else None)
            if k in seen:
                continue
            seen.add(k)
            if self._allowed(a, now, rs, runs, c) is not None:
                return True
        return False

    def _first_of(self, names: set[str]) -> ClusterState:
        """The cluster of ``names`` (healthy ones, at least one) first in placement
        order: ``min`` by ``_order_key``, read off the fleet's kept order (which
        carries capacity changes cheaply, see ``_base_order``) when ``names`` is a
        good part of it."""
        clusters = self.clusters
        if 8 * len(names) < len(clusters) or len(clusters) <= _SCAN_MIN:
            return min((clusters[n] for n in names), key=_order_key)
        for c in self._base_order(None, None):
            if c.name in names:
                return c
        raise AssertionError("names outside the healthy fleet")  # pragma: no cover

    @staticmethod
    def _alone(q: _Queue, e: _Eval, acted: list[set[int]]) -> bool:
        """In records found at more than one capacity (``_Queue.mixed``), may fit
        ``e``'s new reason go to the class members after its actions (``_flip``)?

        Only if none of them was decided on its own (after a state change, by a fit
        of its own): each then had the answer of the action before it, and shares
        its new one. (Such records come from a queue without gates on running work,
        so every action decided on its own made a fit.) ``acted`` keeps the actions
        of every fit, made on first use.
        """
        if not acted:
            acted.append({id(a) for x in q.evals for a in x.acts})
        ids = acted[0]
        for a in e.acts:
            c = a.cls
            if c is None:
                return False
            m = c.m
            for x in m[bisect_left(m, a.pos, key=_POS) + 1 :]:
                if id(x) in ids:
                    return False
        return True

    @staticmethod
    def _flip(q: _Queue, e: _Eval) -> None:
        """Give the members that shared fit ``e``'s answer its new reason.

        Only a greedy queue's fit that found no room, or a strict queue's fit after its
        head blocked, or a reserving queue's after its head reserved: none changes
        anything but the reason (a greedy visit that admits nothing has no state
        change; past a strict queue's block, or a reserving queue's reservation, there
        is none), so each of its actions' answer went to every later member of its
        class. And a strict queue's head, whose answer went to it alone: it blocks the
        queue as before, only its holds go (``_still``). The classes must be grouped
        as a visit now would (``_classes_as_now``), and a reserving queue's head must
        have made a reservation: until one exists, the visit's memo ignores estimates
        (``_memo_loop``), so an answer may have gone to members of other classes
        (which keep their estimate) too.
        """
        if q.due:
            _apply_due(q)  # in the order they were made
        # A strict queue's head blocks it: its answer went to it alone.
        _flip_as(q, e, e.reason, not e.blocked and q.spec.algorithm is Algorithm.strict)

    def _view(self, name: str, own_hold: bool = False, own_resv: int = 0) -> tuple[Any, ...]:
        """What a fit reads of the holds and reservations on cluster ``name``: whether
        it is held, and each reservation's time and EASY extra (its free vectors).
        ``own_*``: effects of the queue being visited, left out (it remakes them)."""
        if name in self._holds and not own_hold:
            # A held cluster turns every action away before its reservations are read.
            return _HELD
        rs: Sequence[_Reservation] = self._resv.get(name, ())
        if not rs:
            return _OPEN
        if own_resv:
            rs = rs[: len(rs) - own_resv]
        return (
            False,
            tuple(
                (
                    r.time,
                    None
                    if r.extra is None
                    else (
                        tuple(r.extra.fcpu),
                        tuple(r.extra.fmem),
                        tuple(r.extra.feph),
                        tuple(r.extra.fgpu),
                    ),
                )
                for r in rs
            ),
        )

    def _views_before(
        self, mine: list[tuple[Any, ...]], rooms: dict[int, set[str]]
    ) -> dict[str, tuple[Any, ...]]:
        """``_view`` of each cluster where the visit just made found room, as it was
        before the visit (``mine``: the visit's own effects)."""
        own_h: set[str] = set()
        own_r: dict[str, int] = {}
        for e in mine:
            if e[0] == "h":
                own_h.add(e[1])
            else:
                own_r[e[1]] = own_r.get(e[1], 0) + 1
        holds, resv = self._holds, self._resv
        out: dict[str, tuple[Any, ...]] = {}
        for n in set().union(*rooms.values()):
            # Inline ``_view``'s common answers: most clusters are held, or bare.
            if n in holds and n not in own_h:
                out[n] = _HELD
            elif n not in resv:
                out[n] = _OPEN
            else:
                out[n] = self._view(n, n in own_h, own_r.get(n, 0))
        return out

    def _all_read(
        self, sel: tuple[str, ...] | None, rec: _ResvRecord, changed: set[str] | frozenset[str]
    ) -> bool:
        """Is every cluster ``_reserve`` would look at for ``rec``'s demand (selector
        ``sel``, healthy, known, with node shapes that hold it) in ``changed``?"""
        clusters = self.clusters
        for name in clusters if sel is None else sel:
            if name in changed:
                continue
            c = clusters.get(name)
            if c is not None and c.healthy and c.known and self._could(c, rec.runs, rec.dkey):
                return False
        return True

    def _resv_now(
        self,
        rec: _ResvRecord,
        changed: set[str] | frozenset[str],
        now: float,
        sel: tuple[str, ...] | None,
    ) -> tuple[bool, tuple[ClusterState, float, ClusterState | None] | None]:
        """What ``_reserve`` would reserve now, capacity having changed on ``changed``.

        Clusters outside ``changed`` give the same earliest fits (the queue's horizon
        bounds how long those stay valid) in the same relative order, so the best of
        them is still ``rec.where``, or no worse than it was if that changed itself:
        only a changed cluster can beat it. (If it got worse, the best is known only
        where every cluster it could go to changed: ``sel`` is the queue's selector.)
        Returns (False, None) if that cannot be
        told without a visit (or the clusters held instead would change); else
        (True, None) if the reservation stays as it is, or (True, (cluster, time,
        EASY extra)) for the one ``_reserve`` would make now.
        """
        no = (False, None)
        where = rec.where
        clusters = self.clusters
        best: ClusterState | None = None
        best_t = rec.time
        best_k = rec.key
        moved: tuple[ClusterState, float, ClusterState | None] | None = None
        if where is not None:
            best = clusters.get(where)
            if best is None:
                return no
            if where in changed:
                # Its fit may have moved either way: the unchanged clusters were no
                # better than (rec.time, rec.key), so it still beats them if it is
                # still as good; otherwise the second best is not known.
                if not best.healthy or not best.known:
                    return no
                fit = self._earliest_fit(best, rec.runs, now, rec.easy, rec.dkey)
                if fit is None:
                    return no
                k = _order_key(best)
                if (
                    fit[0] > best_t or (fit[0] == best_t and k > best_k)  # type: ignore[operator]
                ) and not self._all_read(sel, rec, changed):
                    return no
                best_t, best_k = fit[0], k
                moved = (best, fit[0], fit[1])
        for name in changed:
            if name == where:
                continue
            c = clusters.get(name)
            if c is None or not c.healthy or not c.known:
                continue
            if not self._could(c, rec.runs, rec.dkey):
                continue
            fit = self._earliest_fit(c, rec.runs, now, rec.easy, rec.dkey)
            if fit is None:
                if name not in rec.held:
                    return no
                continue
            if name in rec.held or best is None:
                return no
            t = fit[0]
            if t < best_t:
                best_t, best_k = t, _order_key(c)
                moved = (c, t, fit[1])
            elif t == best_t:
                k = _order_key(c)
                if k < best_k:  # type: ignore[operator]
                    best_k = k
                    moved = (c, t, fit[1])
        return True, moved

    def _resv_move(
        self,
        q: _Queue,
        rec: _ResvRecord,
        moved: tuple[ClusterState, float, ClusterState | None],
        changed: set[str] | frozenset[str],
    ) -> bool:
        """Move ``q``'s reservation as ``_reserve`` would now, if its decisions stay.

        The reservation binds the queue's own later actions only where a fit reads
        it: at a cluster with room for one of its walks (``q.rooms``) that no hold
        turns away first. The fits were checked against the new reservation on the
        clusters in ``changed`` (``_evals_still``), where it now is; if the old one
        was elsewhere and read so, the answers there are not known.
        """
        if len(q.last_resv) != 1:
            return False
        old_name, old = q.last_resv[0]
        c, t, extra = moved
        if (
            old_name not in changed
            and old_name not in self._holds
            and any(old_name in rs for rs in q.rooms.values())
        ):
            return False
        rec.where = c.name
        rec.key = _order_key(c)
        rec.time = t
        # Admissions use EASY's extra up: it is copied when one first does. The queue's
        # own reservation is moved in place (a completion moves a few every pass: no
        # new objects for the collector). Only last pass's effects hold it besides,
        # and they are compared field by field.
        old.time = t
        old.extra = extra
        old.shared = True
        if old_name != c.name:
            q.last_resv = ((c.name, old),)
        return True

    def _effect(self, e: tuple[Any, ...]) -> None:
        i = len(self._effects)
        if self._diverged is None:
            prev = self._prev_effects
            if i >= len(prev) or prev[i][:5] != e[:5]:
                self._diverged = i
        self._effects.append(e)

    def _holdable(
        self, sel: tuple[str, ...] | None, elig: list[ClusterState], runs: Runs, dkey: int
    ) -> list[str]:
        """The clusters of ``elig`` (selector ``sel``'s healthy ones, in order) that are
        known and whose node shapes could hold demand ``dkey``: where a strict head
        with no room anywhere holds. They move only with a hard change (health, node
        shapes, the fleet), so every blocked head of the demand under the selector
        reads one list until then, instead of asking each cluster again."""
        key = (sel, dkey)
        hit = self._holdables.get(key)
        if hit is not None and hit[0] == self._hard_at:
            names: list[str] = hit[1]
            return names
        names = [c.name for c in elig if c.known and self._could(c, runs, dkey)]
        self._holdables[key] = (self._hard_at, names)
        return names

    def _hold_all(self, names: Sequence[str], head: str) -> None:
        """Hold each of ``names`` for ``head``, in order (a strict head holds many)."""
        by_head = self._hold_pairs.get(head)
        if by_head is None:
            if len(self._hold_pairs) >= _HOLD_PAIRS_MAX:
                # Heads change as work starts: never let it grow unbounded.
                self._hold_pairs.clear()
            by_head = self._hold_pairs[head] = {}
        vholds = self._vholds
        holds = self._holds
        for n in names:
            pair = by_head.get(n)
            if pair is None:
                pair = by_head[n] = (n, head)
            vholds.append(pair)
            if n not in holds:
                holds[n] = head
                self._effect(("h", n, head, None, None))

    def _hold(self, cname: str, head: str) -> None:
        self._hold_all((cname,), head)

    def _reserve_on(self, cname: str, r: _Reservation) -> None:
        self._resv.setdefault(cname, []).append(r)
        ver = r.extra.version if r.extra is not None else -1
        self._effect(("r", cname, r.time, r.head, ver, r))

    def _signature(self, q: _Queue) -> tuple[Any, ...]:
        """What a queue's visit depends on besides capacity (``_changes``), upstream
        holds and reservations, and the task history (``_Queue.hist_dep``)."""
        org = self.org
        orgd = org.max_concurrent_actions is not None or org.max_concurrent_runs is not None
        return (q.epoch, q.spec, self._env_epoch, self._org_epoch if orgd else 0)

    def _placement_order(self, cs: list[ClusterState], env: str | None) -> list[ClusterState]:
        pref = self.undeclared_env.get(env) if env else None
        if not pref:
            return sorted(cs, key=_order_key)
        return sorted(cs, key=lambda c: (0 if pref.get(c.name) else 1, *_order_key(c)[1:]))

    def _base_order(
        self, sel: tuple[str, ...] | None, elig: list[ClusterState] | None
    ) -> list[ClusterState]:
        """``_placement_order(elig, None)`` for selector ``sel`` (``elig``: its healthy
        clusters, None: found here if needed), kept while the capacity log stands
        still. Callers must not change it."""
        cap_end = self._cap_base + len(self._cap_log)
        hit = self._orders.get(sel)
        if hit is not None:
            if hit[0] == cap_end:
                return hit[1]
            moved = self._soft_since(hit[0], len(hit[1]) // 4) if hit[2] else None
            if moved is not None:
                # Only the clusters in ``moved`` changed, and only in free capacity: the
                # same clusters, the others keep their keys. Keys are unique (the name
                # ends them), so taking the moved ones out and putting them back where
                # their new keys go is the sort itself.
                base, keys, kd = hit[1][:], hit[2][:], dict(hit[3])
                for n in moved:
                    k = kd.get(n)
                    if k is None:
                        continue  # not one of ``elig``
                    i = bisect_left(keys, k)
                    del keys[i]
                    c = base.pop(i)
                    k = kd[n] = _order_key(c)
                    i = bisect_left(keys, k)
                    keys.insert(i, k)
                    base.insert(i, c)
                self._orders[sel] = (cap_end, base, keys, kd)
                return base
        if elig is None:
            elig = [
                c
                for c in (
                    self.clusters.values()
                    if sel is None
                    else (self.clusters[n] for n in sel if n in self.clusters)
                )
                if c.healthy
            ]
        if len(elig) <= _SCAN_MIN:
            base = sorted(elig, key=_order_key)
            self._orders[sel] = (cap_end, base, [], {})
            return base
        # ``_placement_order(elig, None)``, keeping the keys.
        pairs = sorted([(_order_key(c), c) for c in elig], key=_FIRST)
        base = [c for _, c in pairs]
        self._orders[sel] = (cap_end, base, [k for k, _ in pairs], {c.name: k for k, c in pairs})
        return base

    def _soft_since(self, pos: int, most: int) -> set[str] | None:
        """The clusters whose free capacity changed since capacity log position ``pos``,
        if nothing more than free capacity changed anywhere and at most ``most`` entries
        were logged since; else None (the log no longer reaches back that far, or a
        fresh answer is as cheap)."""
        i = pos - self._cap_base
        log = self._cap_log
        if i < 0 or len(log) - i > most:
            return None
        out: set[str] = set()
        for name, hard in log[i:]:
            if hard:
                return None
            out.add(name)
        return out

    def _gate(self, q: _Queue, a: _Action, demand: Usage) -> Reason | None:
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
        if (
            org.max_concurrent_actions is not None
            and self.org_running >= org.max_concurrent_actions
        ):
            return Reason.OrgConcurrentActions
        if (
            org.max_concurrent_runs is not None
            and a.run not in self.org_run_counts
            and len(self.org_run_counts) >= org.max_concurrent_runs
        ):
            return Reason.OrgConcurrentRuns
        return None

    def _start_visit_records(self) -> None:
        """Empty what a visit records for the next pass (see ``_visit`` and its callers)."""
        self._horizon = _INF
        self._vhz = {}
        self._vevals = []
        self._vseen = {}
        self._vrooms = {}
        self._vhist = self._vfragile = False
        self._vholds = []
        self._vresv = None

    def _visit(self, q: _Queue, now: float, out: list[Admitted]) -> int:
        """Phases 3-5 for one queue: gates, fit, admit or record why not."""
        if q.due:
            _apply_due(q)  # before the walk reads the classes and extends the records
        v = _Visit(q, self._eligible(q))
        spec = q.spec
        q.blocked_head = None
        if not self.incremental:
            started = 0
            for a in q.waiting:
                r = self._consider(q, a, v, now, out)
                if r is None:
                    started += 1
                else:
                    a.note(r)
            if started:
                q.waiting = [a for a in q.waiting if a.state == "waiting"]
            return started
        org = self.org
        run_gates = (
            spec.run_concurrency is not None
            or spec.per_run_concurrency is not None
            or org.max_concurrent_runs is not None
        )
        # Actions alike in everything the decision reads (demand, environment, run
        # where run caps apply, estimate where reservations apply) get the same answer
        # while the state is unchanged: decide once per class, not once per action.
        # Reservations exist for this visit if an earlier queue made one, or once this
        # queue makes its own (only a reserving queue does).
        mode = (bool(self._resv) or v.reserving, run_gates)
        if q.cls_mode != mode:
            self._build_classes(q, mode)
        if 2 * len(q.cls) > len(q.waiting):
            # Classes of one or two: walking them costs more than the plain loop.
            return self._memo_loop(q, v, now, out, run_gates)
        if not q.runs_ok:
            for c in q.cls.values():
                c.recount()
            q.runs_ok = True
        return self._walk(q, v, now, out, run_gates)

    def _memo_loop(
        self, q: _Queue, v: _Visit, now: float, out: list[Admitted], run_gates: bool
    ) -> int:
        """Every waiting action in queue order, answering from a per-class memo."""
        memo: dict[Any, tuple[int, Reason]] = {}
        # Where reservations apply, an action's estimate matters too. It is a function
        # of the declared estimate, or else of the task's history (fixed within a pass).
        resv = self._resv
        started = 0
        ver = v.ver
        get = memo.get
        # Reasons are recorded past the classes' runs: recount them before a walk.
        q.runs_ok = False
        self._flush(q)
        for a in q.waiting:
            key: Any = a.ck_est if resv else a.ck
            if run_gates:
                key = (key, a.run)
            m = get(key)
            if m is not None and m[0] == ver:
                if m[1] != a._last:
                    a.note(m[1])
                continue
            r = self._consider(q, a, v, now, out)
            if r is None:
                started += 1
                ver = v.ver
                continue
            a.note(r)
            if v.ver == ver:
                memo[key] = (ver, r)
            else:
                ver = v.ver
        if started:
            for a in q.waiting:
                if a.state != "waiting":
                    self._unlist(q, a)
            q.waiting = [a for a in q.waiting if a.state == "waiting"]
        return started

    def _walk(self, q: _Queue, v: _Visit, now: float, out: list[Admitted], run_gates: bool) -> int:
        """The memo loop's decisions, made per class instead of per action.

        The loop gives an action the memo's answer for its class if no state change
        (``v.ver``) happened since that answer was computed. So between two state
        changes, all members of a class after the first get the first one's answer.
        The walk merges the classes' heads in queue order (a heap by position) and
        only evaluates an action where the loop would have: a class whose answer is
        known opens a stretch of members that all get it, and the next state change
        (at the position of the action that caused it) closes every open stretch;
        each class's first member after that position is then due again. Closing a
        stretch touches only members whose last reason differs (``_Class.settle``).

        An admission changes less than most state changes: the capacity of the one
        cluster it took (capacity only shrinks within a pass) and the counters the
        gates read. An answer that read neither (its fit found no room there, and its
        gates answer as before) is what the fit would give again: it is carried past
        the admission (``_carry``) instead of made again. Its stretches stay open
        (their members owed the answer are settled when the class is next due), and
        the fit the loop would have made is recorded as it would have been (the
        first member due after the admission joins the answer's ``_Eval``).
        """
        # Per key: [version it stands at, answer, clusters its fit found room on (None:
        # never carried), the action whose fit it is, its gates' answer, its record,
        # whether the loop's next fit of the key is still to be recorded].
        memo: dict[Any, list[Any]] = {}
        # While reservations stand, the memo is by estimate too (``_Class.ck_est``): per
        # class without it (``ck``), an entry of the memo whose fit read no reservation.
        alike: dict[Any, list[Any]] = {}
        share = self._SHARE_ALIKE
        # Read each time: this queue's own reservation (a state change) may add one.
        resv = self._resv
        started = 0
        ver = v.ver
        spec = q.spec
        org = self.org
        gated = (
            spec.action_concurrency is not None
            or spec.max_resources is not None
            or run_gates
            or org.max_concurrent_actions is not None
        )
        # (position, index, class, first member owed ``rr`` or -1, ``rr``): positions
        # are unique, so entries never compare past the first field.
        heap: list[tuple[int, int, _Class, int, Any]] = [
            (c.m[0].pos, 0, c, -1, None) for c in q.cls.values()
        ]
        heapify(heap)
        # Stretches of classes whose answer is known: (class, first member, answer, key).
        opened: list[tuple[_Class, int, Reason, Any]] = []
        admitted: list[_Action] = []
        while heap:
            pos, i, c, j0, rr = heappop(heap)
            key: Any = c.ck_est if resv else c.ck
            if run_gates:
                key = (key, c.run)
            m = memo.get(key)
            if m is not None and m[0] == ver:
                r0: Reason = m[1]
                if m[6]:
                    # Carried past an admission: the loop would have made the fit again
                    # here (its memo was out of date), and recorded it.
                    m[6] = False
                    g = m[5]
                    if g is not None:
                        g.acts.append(c.m[i])
                        if not resv:
                            g.blind = True
                if j0 >= 0:
                    if rr == r0:
                        opened.append((c, j0, r0, key))
                        continue
                    c.settle(j0, i, rr)
                opened.append((c, i, r0, key))
                continue
            if j0 >= 0:
                c.settle(j0, i, rr)
            a = c.m[i]
            if resv and share:
                b = alike.get((c.ck, c.run) if run_gates else c.ck)
                if b is not None and b[0] == ver:
                    # An action alike but for its estimate got this answer, at this
                    # state, without reading a reservation: the fit would end as its
                    # did, for this estimate too. Recorded as the fit would have been.
                    r = b[1]
                    g = b[5]
                    if g is not None:
                        g.acts.append(a)
                    memo[key] = [ver, r, b[2], a, b[4], g, False]
                    opened.append((c, i, r, key))
                    continue
            r = self._consider(q, a, v, now, out)
            if r is None:
                started += 1
                admitted.append(a)
                nv = v.ver
                if memo and not a.env:
                    self._carry(q, memo, ver, nv, a.cluster, gated)
            else:
                if v.ver == ver:
                    names = self._cnames if not a.env else None
                    m = memo[key] = [
                        ver,
                        r,
                        names,
                        a,
                        None if names is None else self._cgate,
                        self._crec,
                        False,
                    ]
                    if resv and names is not None and not self._cread:
                        alike[(c.ck, c.run) if run_gates else c.ck] = m
                    # The member decided opens the stretch itself: one settle for it
                    # and the members that follow with the same answer, not two.
                    opened.append((c, i, r, key))
                    continue
                c.settle(i, i + 1, r)
                nv = v.ver
            # A state change at ``pos``: what was known holds up to here only (but for
            # answers carried past it, whose stretches stay open).
            for oc, j0, rr, k in opened:
                om = oc.m
                j = bisect_right(om, pos, lo=j0, key=_POS)
                if memo[k][0] == nv:
                    if j < len(om):
                        heappush(heap, (om[j].pos, j, oc, j0, rr))
                    else:
                        oc.settle(j0, j, rr)
                    continue
                if j > j0:
                    oc.settle(j0, j, rr)
                if j < len(om):
                    heappush(heap, (om[j].pos, j, oc, -1, None))
            ver = nv
            opened = []
            if i + 1 < len(c.m):
                heappush(heap, (c.m[i + 1].pos, i + 1, c, -1, None))
        for oc, j0, rr, _k in opened:
            oc.settle(j0, len(oc.m), rr)
        if started:
            for a in admitted:
                self._unlist(q, a)
            w = q.waiting
            if started <= 16:
                for a in admitted:
                    del w[bisect_left(w, a.pos, key=_POS)]
            else:
                q.waiting = [a for a in w if a.state == "waiting"]
        return started

    def _carry(
        self,
        q: _Queue,
        memo: dict[Any, list[Any]],
        ver: int,
        nv: int,
        cname: str | None,
        gated: bool,
    ) -> None:
        """``_walk``'s answers standing at version ``ver`` that an admission on cluster
        ``cname`` (which moved the version to ``nv``) leaves as they are: carried to
        ``nv``.

        An admission (of an action without environment) takes capacity on ``cname``
        alone, uses up only the reservations there, and moves the gates' counters:
        holds, reservations, the visit's block stay. A fit that found no room on
        ``cname`` finds none there now, and the same clusters with room, in the same
        order, everywhere else (only ``cname``'s key moved in the placement order): the
        same answer, if the gates still let it through (and if the demand's best fit is
        monotone: not for a gang of unlike pods). A gate's answer is asked again.
        """
        for m in memo.values():
            if m[0] != ver:
                continue
            names = m[2]
            rep: _Action = m[3]
            if names is None or cname in names or rep.dkey in self._unlike:
                # (Unlike pods: room elsewhere can come back, see ``_unlike``.)
                continue
            if gated and self._gate(q, rep, rep.usage) is not m[4]:
                continue
            m[0] = nv
            m[6] = True

    # --- decision classes ------------------------------------------------------------

    def _build_classes(self, q: _Queue, mode: tuple[bool, bool]) -> None:
        """Group a queue's waiting actions by decision class (``mode``: whether the
        estimate, and the run, are part of the class) and number their positions."""
        self._flush(q)
        q.cls = {}
        q.cls_mode = mode
        q.runs_ok = True
        for i, a in enumerate(q.waiting):
            a.pos = i
            self._enlist(q, a, mode)
        q.next_pos = len(q.waiting)

    def _enlist(self, q: _Queue, a: _Action, mode: tuple[bool, bool]) -> None:
        if q.due:
            _apply_due(q)  # a flip reaches the members it found, not one that came later
        base = a.ck_est if mode[0] else a.ck
        pk = (base, a.run) if mode[1] else base
        c = q.cls.get(pk)
        if c is None:
            c = q.cls[pk] = _Class(pk, a, q)
        c.append(a)
        a.cls = c

    def _flush(self, q: _Queue) -> None:
        """Bring the fields of every waiting action of ``q`` up to date (see _Class)."""
        if q.due:
            _apply_due(q)
        for c in q.cls.values():
            if c.lazy:
                c.flush()

    def _unlist(self, q: _Queue, a: _Action) -> None:
        if q.due:
            _apply_due(q)
        c = a.cls
        assert c is not None
        c.remove(bisect_left(c.m, a.pos, key=_POS))
        if not c.m:
            del q.cls[c.pk]
        a.cls = None

    def _block(self, q: _Queue, a: _Action, v: _Visit) -> None:
        """A strict queue's head could not start: nothing later in the queue starts."""
        if v.strict and not v.blocked:
            v.blocked = True
            v.ver += 1
            q.blocked_head = a.id

    def _consider(
        self, q: _Queue, a: _Action, v: _Visit, now: float, out: list[Admitted]
    ) -> Reason | None:
        """Decide one action: admit it (returns None) or return why not.

        An answer other than an admission leaves, for ``_walk``: the clusters its fit
        found room on (``_cnames``; None: not known), its gates' answer (``_cgate``),
        the fit's record (``_crec``), and whether the fit read a reservation (``_cread``:
        the only place the action's estimate enters it).
        """
        self._cnames = None
        inst = self.envs.get(a.env) if a.env_declared and a.env else None
        if inst is not None:
            demand = _ZERO
            pods: tuple[Pod, ...] = ()
            runs: Runs = ()
        elif a.env_declared and a.env:
            pods = sort_pods(self.env_specs[a.env].footprint)
            runs = runs_of(pods)
            demand = Usage.of(pods)
        else:
            pods = a.pods
            runs = a.runs
            demand = a.usage
        r = self._gate(q, a, demand)
        if r is not None:
            self._cnames = _NO_CHANGE
            self._cgate = r
            self._crec = None
            self._cread = False
            self._block(q, a, v)
            return r
        holds = self._holds
        resv = self._resv
        if inst is not None:
            self._vfragile = True
            c = self.clusters.get(inst.cluster)
            if c is None or c not in v.elig:
                r = Reason.NoClusterCapacity
            elif v.blocked or c.name in holds:
                r = Reason.HeldForGang
            elif c.name in resv and self._allowed(a, now, resv[c.name], (), c) is None:
                r = Reason.BackfillWindow
            elif inst.active >= inst.spec.slots:
                r = Reason.EnvironmentBusy
            else:
                self._admit(q, a, c, [], inst, now, out)
                v.ver += 1
                return None
            self._block(q, a, v)
            return r
        # --- fit: clusters in placement order; the first with room that no hold or
        # reservation forbids takes the whole gang.
        pref = a.env if a.env and not a.env_declared and a.env in self.undeclared_env else None
        dkey = a.dkey if not a.env_declared else self._dkey(pods)
        if a.env:
            # Where environments run sways the placement order: no shortcut past it.
            self._vfragile = True
        blocked = v.blocked
        first: str | None = None
        # The clusters with room that a walk reads, once per demand and visit: records
        # are kept only of a visit that admitted nothing, and in one capacity stood
        # still, so every walk of a demand saw the same ones (see ``_still``).
        rooms: set[str] | None = None
        if not blocked and dkey not in self._vrooms:
            rooms = self._vrooms[dkey] = set()
        infeasible = self._infeasible
        feasible = self._feasible
        nr_key = (q.spec.clusters, dkey)
        checked = False  # every cluster of ``order`` is known to have room
        # Then: their names; or none, known to have room (no order to walk).
        names: frozenset[str] | None = None
        if nr_key in self._noroom:
            order = []
            names = _NO_CHANGE
        elif pref is not None:
            order = self._placement_order(v.elig, pref)
        elif self.incremental:
            # The order depends on the selector and on what was admitted (the pass
            # fixes health), and so does which clusters have room (within a pass only
            # an admission changes capacity): keep just those, once per pass, demand
            # and admission, so that walks need not ask each cluster again.
            hit = self._cands_of(nr_key, runs, v.elig)
            order = hit.order
            names = hit.names
            checked = True
        else:
            if v.order is None or v.order_ver != self._admissions:
                v.order = self._placement_order(v.elig, None)
                v.order_ver = self._admissions
            order = v.order
        room = False
        read = False  # a reservation was read (the action's estimate)
        first_block: Reason | None = None
        chosen: ClusterState | None = None
        extras: list[_Reservation] = []
        if checked:
            # The plain walk below, with what it would skip left out: every cluster of
            # ``order`` has room, and a held one turns the action away before anything
            # else is read there, so only the unheld ones are walked. Nothing chosen:
            # the walk read them all, and the first gave the reason.
            if order:
                room = True
                first = order[0].name
                if not blocked:
                    for c in self._unheld(nr_key, order):
                        rs = resv.get(c.name)
                        if rs:
                            read = True
                            need = self._allowed(a, now, rs, runs, c)
                            if need is None:
                                continue
                            extras = need
                        chosen = c
                        break
                    else:
                        if rooms is not None:
                            assert names is not None
                            rooms.update(names)
                        first_block = (
                            Reason.HeldForGang if first in holds else Reason.BackfillWindow
                        )
            order = []
        for c in order:
            if c.known and not checked:
                ik = (c.index, dkey)
                if ik in infeasible:
                    continue
                if feasible.get(ik) != c.version:
                    if self._unfit.get(ik) == c.version or c.place(runs, commit=False) is None:
                        # Capacity only shrinks within a pass: no need to ask again
                        # (for a demand whose best fit is monotone).
                        if dkey not in self._unlike:
                            infeasible.add(ik)
                        self._unfit[ik] = c.version
                        continue
                    feasible[ik] = c.version
            room = True
            if first is None:
                first = c.name
            if v.blocked:
                break
            # Not blocked: the walk reads the holds and reservations of every cluster
            # with room (until one takes the action).
            if rooms is not None:
                rooms.add(c.name)
            if c.name in holds:
                first_block = first_block or Reason.HeldForGang
                continue
            rs = resv.get(c.name)
            if rs:
                need = self._allowed(a, now, rs, runs, c)
                if need is None:
                    first_block = first_block or Reason.BackfillWindow
                    continue
                extras = need
            chosen = c
            break
        if chosen is not None:
            if rooms is not None:
                # A walk that places the action stops there: it did not read every
                # cluster with room, so the next walk of this demand records them.
                del self._vrooms[dkey]
            before = chosen.version
            if chosen.known:
                limit = _joint_extra(extras) if extras else None
                nodes = chosen.place(runs, commit=True, limit=limit)
                assert nodes is not None
                for used in extras:
                    self._use_up(used, runs, nodes)
            else:
                nodes = []
            new_inst = None
            if a.env_declared and a.env:
                new_inst = _EnvInstance(
                    self.env_specs[a.env], chosen.name, nodes, pods, q.spec.name
                )
                self.envs[a.env] = new_inst
                q.usage.add(new_inst.usage)
            self._admit(q, a, chosen, nodes, new_inst, now, out)
            if chosen.known and new_inst is None:
                self._chain_admit(chosen, before, a.est_end)
            v.ver += 1
            return None
        self._cnames = names
        self._cgate = None
        self._cread = read
        if room:
            r = first_block or Reason.HeldForGang
            self._eval(a, dkey, runs, blocked, first, r, not resv)
            self._block(q, a, v)
            return r
        self._eval(a, dkey, runs, blocked, None, Reason.NoClusterCapacity, not resv)
        # Capacity only shrinks within a pass: no cluster of this selector will have room
        # for this demand again in it (when its best fit is monotone).
        if dkey not in self._unlike:
            self._noroom.add(nr_key)
        if v.strict and not v.blocked:
            self._block(q, a, v)
            self._hold_all(self._holdable(q.spec.clusters, v.elig, runs, dkey), a.id)
        elif v.reserving and not v.reserved:
            v.reserved = True
            v.ver += 1
            q.blocked_head = a.id
            self._reserve(
                a, runs, dkey, q.spec.clusters, v.elig, now, q.spec.algorithm is Algorithm.easy
            )
        return Reason.NoClusterCapacity

    def _eval(
        self,
        a: _Action,
        dkey: int,
        runs: Runs,
        blocked: bool,
        first: str | None,
        reason: Reason,
        blind: bool,
    ) -> None:
        """Record a fit the visit made: in the record of the fits that ended alike
        before it, if any (a full pass makes thousands of fits, that end in a few
        records: grouped as they come, not made one by one and grouped after).

        Checking them again (``_evals_still``) reads the same clusters and holds for
        each, in any order; only a reservation's verdict depends on the action (its
        estimate), so each record keeps its actions.
        """
        k = (dkey, blocked, first, reason)
        g = self._vseen.get(k)
        if g is None:
            g = self._vseen[k] = _Eval(a, dkey, runs, blocked, first, reason, blind)
            self._vevals.append(g)
        else:
            g.acts.append(a)
            if blind:
                g.blind = True
        self._crec = g

    def _cands_of(
        self, nr_key: tuple[Any, int], runs: Runs, elig: list[ClusterState] | None
    ) -> _Cands:
        """The clusters of selector ``nr_key[0]`` with room for demand ``nr_key[1]``, in
        placement order (and their names): the ``_cands`` entry, made or brought up to
        date. ``elig``: the selector's healthy clusters (None: found if needed)."""
        cap_end = self._cap_base + len(self._cap_log)
        hit = self._cands.get(nr_key)
        if hit is None or hit.pos != cap_end:
            dkey = nr_key[1]
            base = self._base_order(nr_key[0], elig)
            moved = None
            if hit is not None and len(base) > _SCAN_MIN:
                moved = self._soft_since(hit.pos, len(base) // 4)
                had = hit.names
            keep: frozenset[str] | None = None
            if moved is None:
                sel = nr_key[0]
                if sel is not None and len(base) > _SCAN_MIN:
                    # The whole fleet's entry for the demand has every healthy cluster
                    # with room, and is brought up to date by the clusters that moved
                    # alone: selectors read it instead of asking each of their clusters
                    # (after a completion, dozens of selectors ask of the same few).
                    anyr = self._cands_of((None, dkey), runs, None).names
                    order = list(compress(base, map(anyr.__contains__, map(_NAME, base))))
                else:
                    order = [c for c in base if self._room(c, dkey, runs)]
            else:
                # Only the moved clusters' room may have changed: ask them, and take the
                # others as they were. The filter runs in C (a completion brings dozens
                # of entries up to date every pass, each over up to the whole fleet).
                kd = self._orders[nr_key[0]][3]
                clusters = self.clusters
                keep = had
                for n in moved:
                    if n in kd:
                        if self._room(clusters[n], dkey, runs):
                            if n not in keep:
                                keep = keep | {n}
                        elif n in keep:
                            keep = keep - {n}
                order = list(compress(base, map(keep.__contains__, map(_NAME, base))))
            if not order:
                order, names = _NO_ROOM, _NO_CHANGE
            elif hit is not None and hit.order == order:
                # (Room where there was: the list and names as they are.)
                order, names = hit.order, hit.names
            else:
                names = frozenset(map(_NAME, order)) if keep is None else keep
            if hit is None:
                hit = self._cands[nr_key] = _Cands(cap_end, order, names)
            else:
                hit.set(cap_end, order, names)
        return hit

    def _unheld(self, nr_key: tuple[Any, int], order: list[ClusterState]) -> list[ClusterState]:
        """The clusters of ``order`` (a ``_cands`` list) that no hold of this pass
        names, in order. Holds only come within a pass: their count dates the answer."""
        n = len(self._holds)
        if not n:
            return order
        hit = self._unheld_cache.get(nr_key)
        if hit is not None and hit[0] is order and hit[1] == n:
            return hit[2]
        holds = self._holds
        out = [c for c in order if c.name not in holds]
        self._unheld_cache[nr_key] = (order, n, out)
        return out

    def _admit(
        self,
        q: _Queue,
        a: _Action,
        c: ClusterState,
        nodes: list[int],
        inst: _EnvInstance | None,
        now: float,
        out: list[Admitted],
    ) -> None:
        a.state = "running"
        a.cluster = c.name
        a.start = now
        a.est = self.estimate(a.task, a.spec.estimate)
        a.est_end = now + a.est if a.est is not None else None
        if inst is not None:
            a.inst = inst
            inst.active += 1
            inst.running[a.id] = a
            inst.expires_at = None
            a.nodes = []
        else:
            a.nodes = nodes
            a.charged = True
            q.usage.add(a.usage)
        q.running += 1
        q.run_counts[a.run] = q.run_counts.get(a.run, 0) + 1
        self.org_running += 1
        self.org_run_counts[a.run] = self.org_run_counts.get(a.run, 0) + 1
        self.on_cluster[c.name][a.id] = a
        if a.env and not a.env_declared:
            per = self.undeclared_env.setdefault(a.env, {})
            per[c.name] = per.get(c.name, 0) + 1
        if not c.known:
            self.unknown_capacity_passes += 1
            n = self.unknown_capacity_by_cluster.get(c.name, 0)
            self.unknown_capacity_by_cluster[c.name] = n + 1
        self._admissions += 1
        self._mark_head(q)
        self._touch(c.name)
        self._org_epoch += 1
        self._env_epoch += inst is not None
        q.epoch += 1
        q.tail = -1
        names = c.node_names
        out.append(
            Admitted(
                a.id,
                c.name,
                tuple(names[i] for i in a.nodes if i < len(names)),
                tuple(a.reasons),
            )
        )

    # --- holds and reservations -------------------------------------------------------

    def _allowed(
        self,
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

    @staticmethod
    def _use_up(r: _Reservation, runs: Runs, nodes: list[int]) -> None:
        """An admission under ``r`` takes ``nodes`` out of its EASY extra."""
        x = r.extra
        assert x is not None
        if r.shared:
            r.extra = x = x.clone()
            r.shared = False
        x.take(runs, nodes)

    def _release_time(self, a: _Action, now: float) -> float | None:
        """When a running action is expected to end; one past its estimate ends "now"."""
        if a.est_end is None:
            return None
        return a.est_end if a.est_end > now else now

    def _reserve(
        self,
        head: _Action,
        runs: Runs,
        dkey: int,
        sel: tuple[str, ...] | None,
        elig: list[ClusterState],
        now: float,
        easy: bool,
    ) -> None:
        best: tuple[float, ClusterState, ClusterState | None] | None = None
        held: list[str] = []
        env = head.env if not head.env_declared else None
        if self.incremental and not (env and self.undeclared_env.get(env)):
            if len(elig) > _SCAN_MIN:
                best, held = self._scan(sel, elig, runs, dkey, now, easy)
                for n in held:
                    self._hold(n, head.id)
                order = []
            else:
                order = self._base_order(sel, elig)
        else:
            order = self._placement_order(elig, env)
        for c in order:
            if not c.known or not self._could(c, runs, dkey):
                continue
            fit = self._earliest_fit(c, runs, now, easy, dkey)
            if fit is None:
                # A running action with no estimate: the reservation cannot be
                # computed, so the head holds this cluster as under strict.
                self._hold(c.name, head.id)
                held.append(c.name)
                continue
            t, extra = fit
            if best is None or t < best[0]:
                best = (t, c, extra)
        self._vresv = _ResvRecord(
            runs,
            dkey,
            easy,
            best[1] if best is not None else None,
            best[0] if best is not None else _INF,
            frozenset(held) if held else _NO_CHANGE,
        )
        if best is not None:
            # Admissions use EASY's extra up: it is copied when one first does.
            self._reserve_on(best[1].name, _Reservation(best[0], best[2], head.id, shared=True))

    def _scan(
        self,
        sel: tuple[str, ...] | None,
        elig: list[ClusterState],
        runs: Runs,
        dkey: int,
        now: float,
        easy: bool,
    ) -> _ScanOut:
        """``_reserve``'s walk: the earliest fit over the clusters of ``elig`` (in
        placement order, the first of the earliest), and the clusters where none can be
        computed (to hold, in placement order).

        Every reserving head of the demand under the selector walks the same clusters:
        their fits are kept per (selector, demand, EASY) with the capacity log position,
        the environments and the clock they were found at, so that a later walk asks
        again only of the clusters whose capacity moved since. Each fit's clock horizon
        is kept too, and applied again as ``_earliest_fit`` would (see ``_vhz``): a fit
        stands from when it was found until its horizon (as ``_earliest_fit`` keeps it),
        so the walk's fits stand while the clock stays before the earliest of them.
        """
        cap_end = self._cap_base + len(self._cap_log)
        ck = (sel, dkey, easy)
        hit = self._scans.get(ck)
        if hit is not None and hit[1] == self._env_epoch and hit[2] <= now <= hit[6]:
            entries = hit[3]
            if hit[0] == cap_end:
                # Nothing moved: the same answer, and the same notes of the clock.
                self._note_horizons(hit[5], hit[6])
                return hit[4]
            moved = self._soft_since(hit[0], len(entries))
            if moved is not None:
                fit_cache = self._fit_cache
                for n in moved:
                    e = entries.get(n)
                    if e is None:
                        # Not walked: another selector's, or unknown, or its node shapes
                        # never hold the demand (neither moves without a hard change).
                        continue
                    c = e[2]
                    fit = self._earliest_fit(c, runs, now, easy, dkey)
                    h = fit_cache[(c.index, dkey, easy)][3]
                    entries[n] = (fit, _order_key(c), c, h)
                return self._scanned(ck, cap_end, now, entries, True)
        entries = {}
        fit_cache = self._fit_cache
        for c in self._base_order(sel, elig):
            if not c.known or not self._could(c, runs, dkey):
                continue
            fit = self._earliest_fit(c, runs, now, easy, dkey)
            entries[c.name] = (fit, _order_key(c), c, fit_cache[(c.index, dkey, easy)][3])
        return self._scanned(ck, cap_end, now, entries, False)

    def _scanned(
        self,
        ck: tuple[Any, int, bool],
        cap_end: int,
        now: float,
        entries: dict[str, Any],
        note: bool,
    ) -> _ScanOut:
        """``_scan``'s answer from its fits by cluster, kept; ``note``: apply their
        clock horizons (fits not asked again this time)."""
        best: tuple[float, ClusterState, ClusterState | None] | None = None
        bk: tuple[Any, ...] = ()
        held: list[tuple[tuple[Any, ...], str]] = []
        hz: dict[str, float] = {}
        hmin = _INF
        for n, (fit, k, c, h) in entries.items():
            hz[n] = h
            if h < hmin:
                hmin = h
            if fit is None:
                held.append((k, n))
            elif best is None or fit[0] < best[0] or (fit[0] == best[0] and k < bk):
                best, bk = (fit[0], c, fit[1]), k
        held.sort(key=_FIRST)
        out: _ScanOut = (best, [n for _, n in held])
        self._scans[ck] = (cap_end, self._env_epoch, now, entries, out, hz, hmin)
        if note:
            self._note_horizons(hz, hmin)
        return out

    def _note_horizons(self, hz: dict[str, float], hmin: float) -> None:
        """Note clock horizons by cluster as ``_earliest_fit`` does (the earliest wins)."""
        if hmin < self._horizon:
            self._horizon = hmin
        vhz = self._vhz
        if not vhz:
            vhz.update(hz)
            return
        if vhz == hz:
            # (Commonly so: a reservation made again reads the fits it read before.)
            return
        for n, h in hz.items():
            if h < vhz.get(n, _INF):
                vhz[n] = h

    def _earliest_fit(
        self, c: ClusterState, runs: Runs, now: float, easy: bool, dkey: int
    ) -> tuple[float, ClusterState | None] | None:
        """``_project``, cached while the cluster and the clock leave it unchanged."""
        key = (c.index, dkey, easy)
        fit_cache = self._fit_cache
        hit = fit_cache.get(key)
        if hit is not None and hit[0] != c.version and not easy:
            # Not for EASY: its extra depends on which nodes are free now (the head's
            # projected placement takes busy-now nodes first), which both moved.
            hit = self._carried(c, key, hit) or self._freed(c, key, hit, now)
        if not easy and (
            hit is None
            or hit[0] != c.version
            or hit[1] != self._env_epoch
            or not hit[2] <= now <= hit[3]
        ):
            # EASY's projection places the demand the same way, only for real (on
            # scratch): its time, valid over the same window, is this answer too.
            # Backfill and EASY queues asking for one demand project it once.
            sib = fit_cache.get((c.index, dkey, True))
            if (
                sib is not None
                and sib[0] == c.version
                and sib[1] == self._env_epoch
                and sib[2] <= now <= sib[3]
            ):
                sres = sib[4]
                hit = fit_cache[key] = (
                    sib[0],
                    sib[1],
                    sib[2],
                    sib[3],
                    None if sres is None else (sres[0], None),
                )
        if (
            hit is not None
            and hit[0] == c.version
            and hit[1] == self._env_epoch
            and hit[2] <= now <= hit[3]
        ):
            res = hit[4]
        else:
            outer = self._horizon
            self._horizon = _INF
            res = self._project(c, runs, now, easy, dkey)
            # The projection holds until a running action reaches its estimated end
            # (it would then end "now" instead).
            horizon = self._horizon
            rel = self._rel_cache.get(c.index)
            if (
                rel is not None
                and rel[5] is not None
                and rel[0] is c
                and rel[1] == c.version
                and rel[2] == self._env_epoch
                and rel[3] == now
            ):
                horizon = min(horizon, rel[5])
            else:
                for a in self.on_cluster.get(c.name, {}).values():
                    if a.est_end is not None and now < a.est_end < horizon:
                        horizon = a.est_end
            self._fit_cache[key] = (c.version, self._env_epoch, now, horizon, res)
            self._horizon = min(outer, horizon)
            vhz = self._vhz
            if horizon < vhz.get(c.name, _INF):
                vhz[c.name] = horizon
            return res
        if hit[3] < self._horizon:
            self._horizon = hit[3]
        vhz = self._vhz
        if hit[3] < vhz.get(c.name, _INF):
            vhz[c.name] = hit[3]
        # The cached EASY extra is shared: ``_reserve`` copies the one it keeps.
        cached: tuple[float, ClusterState | None] | None = res
        return cached

    def _carried(
        self, c: ClusterState, key: tuple[int, int, bool], hit: tuple[Any, ...]
    ) -> tuple[Any, ...] | None:
        """A cached projection of ``c`` brought to its current version, if only
        admissions changed it since and each is expected to end by the time the
        projection found (see ``_chain``); else None.

        Such an action takes nodes and gives them back by then: before, the demand
        fits even less; from then on, node by node, the cluster is as it was. So the
        answer and EASY's extra stay; only the clock horizon may shrink (the action
        reaching its estimated end moves its release).
        """
        ch = self._chain.get(c.index)
        if ch is None or ch[1] != c.version or ch[0] > hit[0]:
            return None
        res = hit[4]
        if res is not None and ch[2] > res[0]:
            return None
        got = (c.version, hit[1], hit[2], min(hit[3], ch[3]), res)
        self._fit_cache[key] = got
        return got

    def _freed(
        self, c: ClusterState, key: tuple[int, int, bool], hit: tuple[Any, ...], now: float
    ) -> tuple[Any, ...] | None:
        """A cached projection of ``c`` brought to its current version, if only
        completions changed it since, each of work the projection counted given back
        by the time it found (see ``_fchain``), and the work still running gives back
        too little, in total, for the demand before then; else None.

        The projection holds the cluster as it is at each time work ends: from the
        time it found on, node by node, the cluster is as it was (what ended was
        counted gone by then); before, it holds more, but ``_project_from`` places
        nothing where the totals fall short. So the answer and EASY's extra stay.
        (The clock window is the cached one: no running action reached its
        estimated end inside it, so the work still running ends when it did.)
        """
        fc = self._fchain.get(c.index)
        if fc is None or fc[1] != c.version or fc[0] > hit[0]:
            return None
        res = hit[4]
        if res is None or fc[2] > res[0]:
            return None
        if hit[1] != self._env_epoch or not hit[2] <= now <= hit[3]:
            return None
        need = self._needs.get(key[1])
        if need is None:
            return None
        releases = self._releases(c, now)
        if releases is None:
            return None
        until = res[0]
        ncpu, nmem, neph, ngpu = need.cpu, need.memory, need.eph, need.gpu
        for t, _, fcpu, fmem, feph, fgpu in self._steps(c, releases):
            if t >= until:
                break
            if fcpu >= ncpu and fmem >= nmem and feph >= neph and fgpu >= ngpu:
                return None  # it may fit earlier now
        got = (c.version, hit[1], hit[2], hit[3], res)
        self._fit_cache[key] = got
        return got

    def _chain_free(self, c: ClusterState, before: int, est_end: float | None) -> None:
        """Note a completion on ``c`` that moved it from version ``before`` on: the run
        of completions since ``_fchain``'s base, and the latest of their estimated ends
        (an action with no estimate ends the run)."""
        if est_end is None:
            self._fchain.pop(c.index, None)
            return
        fc = self._fchain.get(c.index)
        if fc is not None and fc[1] == before:
            self._fchain[c.index] = (fc[0], c.version, max(fc[2], est_end))
        else:
            self._fchain[c.index] = (before, c.version, est_end)

    def _chain_admit(self, c: ClusterState, before: int, est_end: float | None) -> None:
        """Note an admission on ``c`` that moved it from version ``before`` on: the
        run of admissions since ``_chain``'s base, and when they are expected to end
        (latest, earliest). An action with no estimate ends the run."""
        if est_end is None:
            self._chain.pop(c.index, None)
            return
        ch = self._chain.get(c.index)
        if ch is not None and ch[1] == before:
            self._chain[c.index] = (ch[0], c.version, max(ch[2], est_end), min(ch[3], est_end))
        else:
            self._chain[c.index] = (before, c.version, est_end, est_end)

    def _project(
        self, c: ClusterState, runs: Runs, now: float, easy: bool, dkey: int
    ) -> tuple[float, ClusterState | None] | None:
        """When would ``runs`` fit on ``c``, as running work ends by its estimates?

        Returns (time, EASY's projected extra or None), or None if it cannot be computed
        (a running action with no estimate) or never fits.
        """
        releases = self._releases(c, now)
        if releases is None:
            return None
        need = self._needs.get(dkey)
        if need is None:
            need = self._needs[dkey] = Usage()
            for p, k in runs:
                need.add_pod(p.scaled(k))
        return self._project_from(c, runs, now, easy, releases, need, dkey)

    def _releases(
        self, c: ClusterState, now: float
    ) -> list[tuple[float, int, Runs, list[int], Usage]] | None:
        """What running work on ``c`` gives back and when, in time order (None: a running
        action has no estimate). The same for every demand projected on ``c`` until its
        capacity, the environments or the clock move: computed once for all of them."""
        hit = self._rel_cache.get(c.index)
        if (
            hit is not None
            and hit[0] is c
            and hit[1] == c.version
            and hit[2] == self._env_epoch
            and hit[3] == now
        ):
            cached: list[tuple[float, int, Runs, list[int], Usage]] | None = hit[4]
            return cached
        releases: list[tuple[float, int, Runs, list[int], Usage]] = []
        # The earliest estimated end still ahead: projections here hold until then
        # (see ``_earliest_fit``).
        nxt = _INF
        for a in self.on_cluster.get(c.name, {}).values():
            t = self._release_time(a, now)
            if t is None:
                self._rel_cache[c.index] = (c, c.version, self._env_epoch, now, None, None)
                return None
            e = a.est_end
            if e is not None and now < e < nxt:
                nxt = e
            if a.nodes:
                # The entry it had, while it stands: a cluster whose capacity moved
                # lists the same releases again, mostly (fewer young objects for the
                # collector to walk).
                r = a.rel
                if r is None or r[0] != t or r[3] is not a.nodes:
                    r = a.rel = (t, a.seq, a.runs, a.nodes, a.usage)
                releases.append(r)
        for inst in self.envs.values():
            if inst.cluster != c.name or not inst.nodes:
                continue
            if inst.active:
                ends = [self._release_time(x, now) for x in inst.running.values()]
                if any(e is None for e in ends):
                    return None
                t = max(e for e in ends if e is not None) + inst.spec.idle_ttl
            else:
                t = inst.expires_at if inst.expires_at is not None else now
            releases.append((max(t, now), -1, inst.runs, inst.nodes, inst.usage))
        releases.sort(key=_BY_TIME_SEQ)
        self._rel_cache[c.index] = (c, c.version, self._env_epoch, now, releases, nxt)
        return releases

    def _project_from(
        self,
        c: ClusterState,
        runs: Runs,
        now: float,
        easy: bool,
        releases: list[tuple[float, int, Runs, list[int], Usage]],
        need: Usage,
        dkey: int,
    ) -> tuple[float, ClusterState | None] | None:
        proj: ClusterState | None = None
        applied = 0
        n = len(releases)
        ncpu, nmem, neph, ngpu = need.cpu, need.memory, need.eph, need.gpu
        for t, i, fcpu, fmem, feph, fgpu in self._steps(c, releases):
            # Totals are necessary for a fit: only then is it worth placing pod by pod.
            if fcpu < ncpu or fmem < nmem or feph < neph or fgpu < ngpu:
                continue
            if proj is None:
                if i == n:
                    # Everything given back often leaves the cluster empty: then the
                    # answer is the same every time, for every clock (``_empty_fit``).
                    hit = self._rel_empty.get(c.index)
                    if hit is None or hit[0] is not releases:
                        free = c.released([(r[2], r[3]) for r in releases])
                        hit = self._rel_empty[c.index] = (releases, free == c.capv)
                    if hit[1]:
                        return self._empty_fit(c, runs, dkey, easy, t, now)
                proj = c.projected([(r[2], r[3]) for r in releases[:i]])
            else:
                for r in releases[applied:i]:
                    proj.give(r[2], r[3])
            applied = i
            # The projection is scratch: with EASY, placing the head in it for real
            # leaves exactly the extra it does not need.
            proj.now = c if easy else None
            placed = proj.place(runs, commit=easy) is not None
            proj.now = None
            if placed:
                if t <= now:
                    # It fits once overdue work is counted gone: the reservation is
                    # "now", which moves with the clock.
                    self._horizon = now
                return t, proj if easy else None
        return None

    def _steps(
        self, c: ClusterState, releases: list[tuple[float, int, Runs, list[int], Usage]]
    ) -> list[_Step]:
        """``c``'s free totals as ``releases`` (``_releases``' list) give work back, one
        step per distinct time. They depend on the list alone (it is made anew when
        ``c``'s capacity moves), not on the demand: summed once for every demand
        projected on ``c``, instead of once per demand."""
        hit = self._rel_steps.get(c.index)
        if hit is not None and hit[0] is releases:
            cached: list[_Step] = hit[1]
            return cached
        fcpu, fmem, feph, fgpu = c.tcpu, c.tmem, c.teph, c.tgpu
        steps: list[_Step] = []
        i = 0
        n = len(releases)
        while i < n:
            t = releases[i][0]
            while i < n and releases[i][0] == t:
                u = releases[i][4]
                fcpu += u.cpu
                fmem += u.memory
                feph += u.eph
                fgpu += u.gpu
                i += 1
            steps.append((t, i, fcpu, fmem, feph, fgpu))
        self._rel_steps[c.index] = (releases, steps)
        return steps

    def _empty_fit(
        self, c: ClusterState, runs: Runs, dkey: int, easy: bool, t: float, now: float
    ) -> tuple[float, ClusterState | None] | None:
        """``_project_from``'s answer where the demand is placed on ``c`` emptied at
        ``t``: placement on an empty cluster depends on its nodes alone, so it is
        made once per cluster, node list and demand and shared (callers never change
        the extra they are given: see ``_earliest_fit``)."""
        key = (c.index, dkey, easy)
        hit = self._empties.get(key)
        # EASY's extra also depends on which nodes are free now (``ClusterState.now``).
        ver = c.version if easy else -1
        if hit is None or hit[0] is not c.cap or hit[3] != ver:
            empty = c.with_free((c.capv[0][:], c.capv[1][:], c.capv[2][:], c.capv[3][:]))
            if easy:
                empty.now = c
            placed = empty.place(runs, commit=easy) is not None
            empty.now = None
            hit = self._empties[key] = (c.cap, placed, empty, ver)
        if not hit[1]:
            return None
        if t <= now:
            # As in ``_project_from``: a reservation "now" moves with the clock.
            self._horizon = now
        if not easy:
            return t, None
        # What a fresh projection would be: ``c``'s identity and version, one placement on.
        x = c._shell()
        e = hit[2]
        x.fcpu, x.fmem, x.feph, x.fgpu, x.groups = e.fcpu, e.fmem, e.feph, e.fgpu, e.groups
        x.tcpu, x.tmem, x.teph, x.tgpu = e.tcpu, e.tmem, e.teph, e.tgpu
        x.version = c.version + 1
        return t, x

    # ------------------------------------------------------------------ introspection

    def state(self, action_id: str) -> str | None:
        a = self.actions.get(action_id)
        return a.state if a is not None else None

    def reason(self, action_id: str) -> str | None:
        a = self.actions.get(action_id)
        return a.last if a is not None and a.state == "waiting" else None

    def reasons(self, action_id: str) -> list[str]:
        a = self.actions.get(action_id)
        return list(a.reasons) if a is not None else []

    def waiting_count(self, queue: str) -> int:
        q = self.queues.get(queue)
        return len(q.waiting) if q else 0

    def running_count(self, queue: str) -> int:
        q = self.queues.get(queue)
        return q.running if q else 0

    def queue_stats(self) -> dict[str, dict[str, Any]]:
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

    def waiting_reasons(self, per_queue: int = 200) -> dict[str, tuple[str, list[str]]]:
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

    # ------------------------------------------------------------------ snapshots

    def to_snapshot(self) -> dict[str, Any]:
        """The whole state as plain JSON types, compact enough to carry across
        continue-as-new: demands are interned in a table and actions are rows."""
        demand_ix: dict[tuple[Pod, ...], int] = {}
        demands: list[list[list[Any]]] = []

        def dix(pods: tuple[Pod, ...]) -> int:
            k = demand_ix.get(pods)
            if k is None:
                k = demand_ix[pods] = len(demands)
                demands.append([_pod_row(p) for p in pods])
            return k

        for q in self.queues.values():
            self._flush(q)

        def row(a: _Action) -> list[Any]:
            sp = a.spec
            return [
                sp.id,
                sp.queue,
                sp.run,
                sp.task,
                sp.submit,
                sp.seq,
                sp.estimate,
                sp.environment,
                sp.kind.value,
                dix(a.pods),
                a.reasons,
                a.last,
                dict(sp.meta) if sp.meta else None,
            ]

        waiting = [row(a) for q in self.queues.values() for a in q.waiting]
        running = []
        for a in self.actions.values():
            if a.state == "running":
                running.append(
                    [
                        row(a),
                        a.cluster,
                        a.nodes,
                        a.start,
                        a.est,
                        a.est_end,
                        a.charged,
                        a.inst.spec.name if a.inst is not None else None,
                    ]
                )
        clusters = [
            {
                "spec": c.spec.to_dict(),
                "healthy": c.healthy,
                "known": c.known,
                "names": c.node_names,
                "caps": [_pod_row(p) for p in c.cap],
                "free": [c.fcpu, c.fmem, c.feph, c.fgpu],
            }
            for c in self.clusters.values()
        ]
        envs = [
            {
                "name": n,
                "cluster": i.cluster,
                "nodes": i.nodes,
                "queue": i.queue,
                "expires_at": i.expires_at,
            }
            for n, i in self.envs.items()
        ]
        return {
            "v": 1,
            "clusters": clusters,
            "queues": [q.spec.to_dict() for q in self.queues.values()],
            "org": self.org.to_dict(),
            "env_specs": [e.to_dict() for e in self.env_specs.values()],
            "envs": envs,
            "demands": demands,
            "waiting": waiting,
            "running": running,
            "run_accepted": self.run_accepted,
            "tokens": self.tokens,
            "token_time": self.token_time,
            "queue_tokens": {n: [b.tokens, b.at] for n, b in sorted(self.queue_buckets.items())},
            "history": self.history,
            "unknown_capacity_passes": self.unknown_capacity_passes,
            # Only when there is one, so snapshots of fleets that always report are
            # unchanged (and older snapshots, without it, load as none).
            **(
                {"unknown_capacity_by_cluster": dict(self.unknown_capacity_by_cluster)}
                if self.unknown_capacity_by_cluster
                else {}
            ),
        }

    @staticmethod
    def from_snapshot(d: Mapping[str, Any], incremental: bool | None = None) -> Scheduler:
        """Rebuild a scheduler from ``to_snapshot`` output (nothing remembered)."""
        if d.get("v") != 1:
            raise ValueError(f"snapshot: version {d.get('v')!r} is not supported")
        s = Scheduler(
            [ClusterSpec.from_dict(c["spec"]) for c in d["clusters"]],
            [QueueSpec.from_dict(q) for q in d["queues"]],
            OrgLimits.from_dict(d["org"]),
            [EnvironmentSpec.from_dict(e) for e in d["env_specs"]],
            incremental=incremental,
        )
        for cd in d["clusters"]:
            c = s.clusters[cd["spec"]["name"]]
            caps = [_row_pod(r) for r in cd["caps"]]
            fc, fm, fe, fg = cd["free"]
            frees = [Pod(fc[i], fm[i], fe[i], fg[i], caps[i].gpu_type) for i in range(len(caps))]
            c.set_nodes(caps, frees, cd["names"])
            c.healthy = cd["healthy"]
            c.known = cd["known"]
        # Health and ``known`` were set here, not by a hard change: nothing kept may
        # stand from before.
        s._eligibles.clear()
        s._holdables.clear()
        demands = [tuple(_row_pod(r) for r in pods) for pods in d["demands"]]

        def action(r: list[Any]) -> _Action:
            spec = ActionSpec(
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
            a = _Action(spec, s._dkey(demands[r[9]]), demands[r[9]])
            a.env_declared = spec.environment is not None and spec.environment in s.env_specs
            a.reasons = list(r[10])
            a.last = r[11]
            s._classify(a)
            s.actions[a.id] = a
            return a

        for e in d["envs"]:
            spec = s.env_specs[e["name"]]
            pods = sort_pods(spec.footprint)
            inst = _EnvInstance(spec, e["cluster"], list(e["nodes"]), pods, e["queue"])
            inst.expires_at = e["expires_at"]
            s.envs[e["name"]] = inst
            q = s.queues.get(inst.queue)
            if q is not None:
                q.usage.add(inst.usage)
        for r in d["waiting"]:
            a = action(r)
            s.queues[a.queue].waiting.append(a)
        for r, cluster, nodes, start, est, est_end, charged, inst_name in d["running"]:
            a = action(r)
            a.state = "running"
            a.cluster = cluster
            a.nodes = list(nodes)
            a.start = start
            a.est = est
            a.est_end = est_end
            a.charged = charged
            q = s.queues[a.queue]
            q.running += 1
            q.run_counts[a.run] = q.run_counts.get(a.run, 0) + 1
            if charged:
                q.usage.add(a.usage)
            s.org_running += 1
            s.org_run_counts[a.run] = s.org_run_counts.get(a.run, 0) + 1
            s.on_cluster.setdefault(cluster, {})[a.id] = a
            if inst_name is not None:
                inst = s.envs[inst_name]
                a.inst = inst
                inst.active += 1
                inst.running[a.id] = a
            elif a.env and not a.env_declared:
                per = s.undeclared_env.setdefault(a.env, {})
                per[cluster] = per.get(cluster, 0) + 1
        s.run_accepted = dict(d["run_accepted"])
        s.tokens = d["tokens"]
        s.token_time = d["token_time"]
        # Snapshots from before per-queue rates have no queue buckets.
        s.queue_buckets = {n: Bucket(k, at) for n, (k, at) in (d.get("queue_tokens") or {}).items()}
        s.history = {k: list(v) for k, v in d["history"].items()}
        s.unknown_capacity_passes = d["unknown_capacity_passes"]
        s.unknown_capacity_by_cluster = dict(d.get("unknown_capacity_by_cluster") or {})
        return s


def _reads_running(spec: QueueSpec) -> bool:
    """Do the queue's gates read its running work (count, runs, resources)?"""
    return (
        spec.action_concurrency is not None
        or spec.run_concurrency is not None
        or spec.per_run_concurrency is not None
        or spec.max_resources is not None
    )


def _qkey(q: _Queue) -> tuple[Any, ...]:
    """A queue's place in the visiting order (it has work waiting): priority, its head's
    submit time, its name; the queue last (never compared: names are unique)."""
    return (-q.spec.priority, q.waiting[0].submit, q.spec.name, q)


def _order_key(c: ClusterState) -> tuple[Any, ...]:
    """``Scheduler._placement_order``'s key for an action with no environment.

    Kept on the cluster while its free state (its version) and ``known`` stand: the
    key is asked for again and again (orders, re-checks, reservations), and one tuple
    shared by them all is less work, and fewer young objects for the collector, than
    one each.
    """
    at = c.version if c.known else -1 - c.version
    if c.okey_at == at:
        return c.okey
    k = (1, 0, -c.tgpu, -c.tcpu, c.name) if c.known else (1, 1, 0, 0, c.name)
    c.okey = k
    c.okey_at = at
    return k


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


def _joint_extra(need: Sequence[_Reservation]) -> ClusterState:
    """What the EASY extras of every reservation in ``need`` leave on each node at once:
    an action that outlasts several reservations must fit in all of their extras."""
    first = need[0].extra
    assert first is not None
    if len(need) == 1:
        return first
    joint = [first.fcpu[:], first.fmem[:], first.feph[:], first.fgpu[:]]
    for r in need[1:]:
        x = r.extra
        assert x is not None
        for mine, theirs in zip(joint, (x.fcpu, x.fmem, x.feph, x.fgpu), strict=True):
            for i, v in enumerate(theirs):
                if v < mine[i]:
                    mine[i] = v
    return first.with_free((joint[0], joint[1], joint[2], joint[3]))
