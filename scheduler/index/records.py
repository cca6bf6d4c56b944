"""The index layer's records: decision classes (``_Class``), what a fit read
(``_Eval``), a reservation's record (``_ResvRecord``), a demand's clusters with room
(``_Cands``), and what a visit depends on (``_Visit``).
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from typing import TYPE_CHECKING

from ..common import _POS
from ..index.orders import _order_key
from ..model import Algorithm

if TYPE_CHECKING:
    from typing import Any

    from ..fit import ClusterState, Runs
    from ..reasons import Reason
    from ..truth import _Action, _Queue


# have it, and for each such demand a cluster with room now.
_HeldFlips = tuple[tuple[int, ...], dict[int, str]]


_LOG_MAX = 8192


_NO_CHANGE: frozenset[str] = frozenset()


_NO_ROOM: list[Any] = []


# through the capacity log (``Scheduler._any_room``).
_SEL_SMALL = 16


_UNKNOWN: Any = object()


_HELD: tuple[Any, ...] = (True,)


_OPEN: tuple[Any, ...] = (False, ())


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
