"""Do a queue's remembered answers still stand? ``_still`` (the visit as a whole),
``_visit_tail`` (only actions appended since), ``_classes_as_now``.
"""

from __future__ import annotations

from bisect import bisect_left
from typing import TYPE_CHECKING

from ..common import _INF, _POS, _Reservation
from ..index.records import (
    _NO_CHANGE,
    _NO_ROOM,
    _SEL_SMALL,
    _UNKNOWN,
    _apply_due,
    _merge_evals,
    _Visit,
)
from ..model import Algorithm
from ..policy.gates import _org_gated, _reads_running, _reads_runs

if TYPE_CHECKING:
    from typing import Any

    from ..core import Scheduler
    from ..fit import ClusterState, Runs
    from ..index.records import _Eval, _ResvRecord
    from ..truth import Admitted, _Queue


def _classes_as_now(self: Scheduler, q: _Queue) -> bool:
    """Are ``q``'s decision classes (if built) grouped as a visit now would group
    them (see ``_visit``)? A fit's reason changed in place goes to the later
    members of its class (``_flip``), appended ones included: that is right only
    if the class is one a visit now would answer alike (with reservations about,
    estimates part of it)."""
    if q.cls_mode is None:
        return True
    spec = q.spec
    algo = spec.algorithm
    run_gates = _reads_runs(spec, self.org)
    reserving = algo is Algorithm.backfill or algo is Algorithm.easy
    return q.cls_mode == (bool(self._resv) or reserving, run_gates)


def _visit_tail(
    self: Scheduler,
    q: _Queue,
    k: int,
    sig: tuple[Any, ...],
    now: float,
    out: list[Admitted],
    up: int,
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
    orgd = _org_gated(org)
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


def _still(
    self: Scheduler,
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
    if q.mixed and len(self._holds) == len(self.clusters):
        self._counts.full_rechecks_mixed_under_held_fleet += 1
    if sig != q.last_sig:
        return False
    if q.hist_dep and q.last_hist != self._hist_epoch:
        return False
    if try_held and changed and not q.fragile and not q.mixed and self._all_held(q):
        held = self._held_still(q, changed, now, expired)
        self._counts.held_rechecks_settled += held is True
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
        ok, moved, own, head_went = _resv_still(self, q, rec, changed, now)
    if ok and not head_went:
        ok = self._evals_still(q, changed, now, own)
    if ok and moved is not None:
        assert rec is not None
        ok = self._resv_move(q, rec, moved, changed)
    _keep_records(self, q, ok)
    self._horizon, self._vhist, self._vhz = outer_h, outer_hist, outer_hz
    return ok


def _resv_still(
    self: Scheduler, q: _Queue, rec: _ResvRecord, changed: set[str] | frozenset[str], now: float
) -> tuple[
    bool,
    tuple[ClusterState, float, ClusterState | None] | None,
    tuple[str, _Reservation] | None,
    bool,
]:
    """``_still``'s reservation phase: does the reserving head's answer stand (and
    where its reservation moves to, and the one its actions after it read), or did the
    head find room (then, whether the queue's answers stand under a new head)?"""
    ok = True
    moved: tuple[ClusterState, float, ClusterState | None] | None = None
    own: tuple[str, _Reservation] | None = None
    head_went = False
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
    return ok, moved, own, head_went


def _keep_records(self: Scheduler, q: _Queue, ok: bool) -> None:
    """``_still``'s last phase: on success, the records brought up to date as if the
    visit had been made (reasons changed in place, holds let go); either way, the
    held summary goes where reasons changed."""
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


def _all_held(self: Scheduler, q: _Queue) -> bool:
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


def _any_room(self: Scheduler, sel: tuple[str, ...] | None, dkey: int, runs: Runs) -> bool:
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
