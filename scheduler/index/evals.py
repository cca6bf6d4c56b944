"""``_evals_still``: a visit's fits, re-checked only where capacity moved; ``_flip``
changes a reason in place.
"""

from __future__ import annotations

from bisect import bisect_left
from typing import TYPE_CHECKING

from ..common import _POS, _SCAN_MIN
from ..index.records import _HELD, _NO_CHANGE, _OPEN, _apply_due, _flip_as
from ..model import Algorithm
from ..policy.order import _order_key
from ..reasons import Reason

if TYPE_CHECKING:
    from typing import Any

    from ..common import _Reservation
    from ..core import Scheduler
    from ..fit import ClusterState, Runs
    from ..index.records import _Eval
    from ..truth import _Action, _Queue


def _evals_still(
    self: Scheduler,
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
    self: Scheduler,
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


def _first_of(self: Scheduler, names: set[str]) -> ClusterState:
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
