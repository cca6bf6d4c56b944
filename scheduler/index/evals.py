"""``_evals_still``: a visit's fits, re-checked only where capacity moved; ``_flip``
changes a reason in place.
"""

from __future__ import annotations

from bisect import bisect_left
from typing import TYPE_CHECKING

from ..common import _POS, _SCAN_MIN
from ..index.orders import _order_key
from ..index.records import _HELD, _NO_CHANGE, _OPEN, _apply_due, _flip_as
from ..model import Algorithm
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
    gets a full visit, which replaces them all. In phases: (1) the changed clusters
    with room per demand (``_changed_rooms``); (2) each fit: a blocked one asks only
    whether there is room anywhere (``_blocked_still``), another walks every cluster
    with room (``_walked_still``); (3) the views of the clusters read
    (``_views_after``).
    """
    ds, now_room, dkeys = _changed_rooms(self, changed)
    if not ds:
        return True
    room = self._room
    # Per demand: the clusters with room (for a fit that walks them all), as they
    # will be: the changed ones leave, those of them with room now come back.
    for rs in q.rooms.values():
        rs.difference_update(changed)
    # Fits whose "no room anywhere" became "room, but every cluster with it turns
    # the action away", where that only changes the reason of the members that
    # shared the answer (see ``_flip``): their records, changed as they go. Their
    # members are given the new reason once the whole check passes (``_still``).
    acted: list[set[int]] = []  # see ``_alone``, made once if needed
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
        if e.blocked:
            if not _blocked_still(self, q, e, dr, changed, acted):
                return False
        elif not _walked_still(
            self, q, e, dr, changed, dkeys, now, own, head_key, head_went, acted
        ):
            return False
    _views_after(self, q, ds)
    return True


def _changed_rooms(
    self: Scheduler, changed: set[str] | frozenset[str]
) -> tuple[list[ClusterState], dict[int, list[ClusterState]], dict[str, tuple[Any, ...]]]:
    """``_evals_still``'s first phase: the healthy clusters of ``changed``, those with
    room per demand (filled in as asked), and their placement order keys.

    Queues standing at the same place in the log share ``changed`` (``_changes``)
    and, capacity being the same for them, which of its clusters have room."""
    hit = self._dr_cache.get(id(changed))
    if hit is None or hit[0] is not changed:
        clusters = self.clusters
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
    return hit[1], hit[2], hit[3]


def _blocked_still(
    self: Scheduler,
    q: _Queue,
    e: _Eval,
    dr: list[ClusterState],
    changed: set[str] | frozenset[str],
    acted: list[set[int]],
) -> bool:
    """A blocked fit: only "is there room anywhere" counts, and any cluster with room
    will do (``dr``: the changed ones with room now)."""
    first = e.first
    if first is not None and first not in changed:
        return True
    if dr:
        if first is None:
            if (
                q.spec.algorithm is not Algorithm.strict
                or not self._classes_as_now(q)
                or (q.mixed and not self._alone(q, e, acted))
            ):
                return False  # NoClusterCapacity would become HeldForGang
            e.reason = Reason.HeldForGang
            self._flips.append(e)
        e.first = dr[0].name
        e.fkey = None
    elif first is not None:
        return False  # its witness lost room: the others are not known
    return True


def _walked_still(
    self: Scheduler,
    q: _Queue,
    e: _Eval,
    dr: list[ClusterState],
    changed: set[str] | frozenset[str],
    dkeys: dict[str, tuple[Any, ...]],
    now: float,
    own: tuple[str, _Reservation] | None,
    head_key: tuple[float, int] | None,
    head_went: bool,
    acted: list[set[int]],
) -> bool:
    """A fit that walked every cluster with room: none may take the action now, and
    the first in placement order gives the reason."""
    rooms = q.rooms[e.dkey]
    if not _none_takes(self, q, e, dr, rooms, now, own, head_key):
        return False
    first = e.first
    if not rooms:
        return first is None or _room_went(self, q, e, head_went, acted)
    if first is None:
        return _room_came(self, q, e, rooms, head_went, acted)
    return _first_now(self, q, e, first, rooms, dr, changed, dkeys)


def _none_takes(
    self: Scheduler,
    q: _Queue,
    e: _Eval,
    dr: list[ClusterState],
    rooms: set[str],
    now: float,
    own: tuple[str, _Reservation] | None,
    head_key: tuple[float, int] | None,
) -> bool:
    """Does every changed cluster with room (``dr``) still turn ``e``'s actions away
    (held, or a reservation from above or by the queue's own head)? Each joins
    ``rooms`` as it is read."""
    holds = self._holds
    resv = self._resv
    own_held = q.resv_rec.held if q.resv_rec is not None else _NO_CHANGE
    own_name = own[0] if own is not None else None
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
    return True


def _room_went(
    self: Scheduler, q: _Queue, e: _Eval, head_went: bool, acted: list[set[int]]
) -> bool:
    """Room went: NoClusterCapacity now. That changes nothing but the reason for a
    greedy queue's fit, or a reserving queue's past its head (which reserved
    already); a strict queue's would block, a reserving queue's head (or one before
    it) would reserve."""
    algo = q.spec.algorithm
    if (
        algo is Algorithm.strict
        or head_went
        or not self._classes_as_now(q)
        or (q.mixed and not self._alone(q, e, acted))
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
    self._flips.append(e)
    return True


def _room_came(
    self: Scheduler,
    q: _Queue,
    e: _Eval,
    rooms: set[str],
    head_went: bool,
    acted: list[set[int]],
) -> bool:
    """A fit that found no room finds some now, every cluster of it turning the
    action away (checked before): its reason changes in place."""
    if not self._classes_as_now(q) or (q.mixed and not self._alone(q, e, acted)):
        return False  # a reason changed in place (see ``_flip``)
    algo = q.spec.algorithm
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
    e.reason = Reason.HeldForGang if bn in self._holds else Reason.BackfillWindow
    e.first = bn
    e.fkey = _order_key(best)
    self._flips.append(e)
    return True


def _first_now(
    self: Scheduler,
    q: _Queue,
    e: _Eval,
    first: str,
    rooms: set[str],
    dr: list[ClusterState],
    changed: set[str] | frozenset[str],
    dkeys: dict[str, tuple[Any, ...]],
) -> bool:
    """A fit that found room, and still does: the first cluster in placement order
    now must turn it away for the same reason."""
    clusters = self.clusters
    if first in rooms and first not in changed:
        # The order is by free capacity: only the changed clusters moved in it.
        if not dr:
            return True  # the same first cluster, turning it away as before
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
        own_held = q.resv_rec.held if q.resv_rec is not None else _NO_CHANGE
        if bn in own_held:
            return False
        r = Reason.HeldForGang if bn in self._holds else Reason.BackfillWindow
        if r is not e.reason:
            return False
    e.first = bn
    e.fkey = bk
    return True


def _views_after(self: Scheduler, q: _Queue, ds: list[ClusterState]) -> None:
    """``_evals_still``'s last phase: the views (holds and reservations as read) of
    the changed clusters some fit now has room on; the others' go."""
    holds = self._holds
    resv = self._resv
    views = q.views
    rooms_of = q.rooms
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
