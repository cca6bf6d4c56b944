"""Answers under holds and reservations from queues above: ``_held_still`` (a fleet held
from above), ``_held_flip`` (reasons changed in place), ``_resv_now``/``_resv_move``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..common import _INF, _SCAN_MIN, _Reservation
from ..index.orders import _order_key
from ..index.records import _DUE_MAX, _HELD, _NO_CHANGE, _OPEN, _apply_due, _ResvRecord
from ..model import Algorithm
from ..reasons import Reason

if TYPE_CHECKING:
    from collections.abc import Sequence
    from typing import Any

    from ..core import Scheduler
    from ..fit import ClusterState, Runs
    from ..index.records import _Eval, _HeldFlips
    from ..truth import _Action, _Queue


def _held_still(
    self: Scheduler,
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
    if q.resv_rec is not None:
        self._counts.held_rechecks += 1
    if q.mixed:
        self._counts.held_rechecks_mixed += 1
    sel = q.spec.clusters
    evals = q.evals
    verdict = _held_verdict(self, q)
    if verdict is None:
        return None
    hsig, got = verdict
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
        rn = _held_resv(self, rec, changed, now, sel)
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
            self._counts.held_flips += 1
            self._counts.held_flips_head_went += head_went
            horizon, read_hist = got_h
            hist = hist or read_hist
    if ok:
        q.horizon = horizon
        q.hist_dep = q.hist_dep or hist
        q.last_hist = self._hist_epoch
        q.stale = _stale_with(self, q.stale, changed)
    return ok


def _held_verdict(self: Scheduler, q: _Queue) -> tuple[tuple[int, ...], bool] | None:
    """``_held_still``'s first phase: the summary of ``q``'s fits (demand, room or
    not), and whether each demand's answer under a held fleet is as recorded (None:
    the fits cannot be summed up so)."""
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
    return hsig, got


def _held_resv(
    self: Scheduler,
    rec: _ResvRecord,
    changed: set[str] | frozenset[str],
    now: float,
    sel: tuple[str, ...] | None,
) -> tuple[Any, ...]:
    """``_held_still``'s reservation phase: ``_resv_answer`` for ``rec``, as
    (changed, log end, environment epoch, ok or None, moved, horizon, horizons, read
    the history).

    Records alike read alike: what ``_resv_now`` answers for a record, and the
    horizons it reads, depend only on the record's fields, the changed clusters, the
    selector, capacity and environments (the log's end and the environment epoch date
    them within a pass), so queues whose records are alike share one answer."""
    cap_end = self._cap_base + len(self._cap_log)
    env = self._env_epoch
    rk = (rec.dkey, rec.easy, rec.where, rec.time, rec.key, rec.held, sel, id(changed))
    rn = self._resv_cache.get(rk)
    if rn is None or rn[0] is not changed or rn[1] != cap_end or rn[2] != env:
        rn = self._resv_answer(rec, changed, now, sel)
        rn = self._resv_cache[rk] = (changed, cap_end, env, *rn)
    return rn


def _stale_with(
    self: Scheduler, prev: frozenset[str] | None, changed: set[str] | frozenset[str]
) -> frozenset[str]:
    """``q.stale`` (``prev``) joined with ``changed``: shared by the queues that stood
    alike (held queues in a row mostly did: the last answer first)."""
    hit = self._stale_last
    if hit is None or hit[0] is not prev or hit[1] is not changed:
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
    return hit[2]


def _held_flips(
    self: Scheduler,
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
    self: Scheduler, q: _Queue, found: dict[int, str], changed: set[str] | frozenset[str]
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
    self: Scheduler,
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
    self: Scheduler,
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
    self._counts.reservation_answers += 1
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
                    self._counts.reservations_found_by_walk += 1
                    ok, moved = True, (best[1], best[0], best[2])
        return (ok, moved, self._horizon, self._vhz, self._vhist)
    finally:
        self._horizon, self._vhist, self._vhz = outer_h, outer_hist, outer_hz


def _held_summary(self: Scheduler, q: _Queue) -> tuple[int, ...] | None:
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


def _new_head(self: Scheduler, q: _Queue, now: float, all_held: bool = False) -> bool:
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
    if self.incremental and len(elig) > _SCAN_MIN and not (env and self.undeclared_env.get(env)):
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


def _views_same(self: Scheduler, q: _Queue, changed: set[str] | frozenset[str]) -> bool:
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


def _room(self: Scheduler, c: ClusterState, dkey: int, runs: Runs) -> bool:
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


def _view(self: Scheduler, name: str, own_hold: bool = False, own_resv: int = 0) -> tuple[Any, ...]:
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
    self: Scheduler, mine: list[tuple[Any, ...]], rooms: dict[int, set[str]]
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
    self: Scheduler,
    sel: tuple[str, ...] | None,
    rec: _ResvRecord,
    changed: set[str] | frozenset[str],
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
    self: Scheduler,
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
    self: Scheduler,
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
