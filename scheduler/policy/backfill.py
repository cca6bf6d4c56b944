"""Holds and reservations: a strict head holds every cluster that could ever take it
(``_block``, ``_holdable``, ``_hold_all``); a backfill/EASY head reserves the earliest
cluster its projection fits (``_reserve``: the choice among clusters; ``_scan`` the same
walk over many, remembered; one cluster's earliest fit is ``index/projections.py``'s
``_earliest_fit``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..common import _FIRST, _INF, _SCAN_MIN, _Reservation
from ..index.orders import _order_key
from ..index.records import _NO_CHANGE, _ResvRecord

if TYPE_CHECKING:
    from collections.abc import Sequence
    from typing import Any

    from ..common import _ScanOut
    from ..core import Scheduler
    from ..fit import ClusterState, Runs
    from ..index.records import _Visit
    from ..truth import _Action, _Queue


HOLD_PAIRS_MAX = 1024


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


def _holdable(
    self: Scheduler, sel: tuple[str, ...] | None, elig: list[ClusterState], runs: Runs, dkey: int
) -> list[str]:
    """The clusters of ``elig`` (selector ``sel``'s healthy ones, in order) that are
    known and whose node shapes could hold demand ``dkey``: where a strict head
    with no room anywhere holds. They move only with a hard change (health, node
    shapes, the fleet), so every blocked head of the demand under the selector
    reads one list until then, instead of asking each cluster again."""
    key = (sel, dkey)
    hit = self._holdables.get(key)
    if hit is not None and self._kept_since_hard(hit[0]):
        names: list[str] = hit[1]
        return names
    names = [c.name for c in elig if c.known and self._could(c, runs, dkey)]
    self._holdables[key] = (self._hard_at, names)
    return names


def _hold_all(self: Scheduler, names: Sequence[str], head: str) -> None:
    """Hold each of ``names`` for ``head``, in order (a strict head holds many)."""
    by_head = self._hold_pairs.get(head)
    if by_head is None:
        if len(self._hold_pairs) >= HOLD_PAIRS_MAX:
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


def _hold(self: Scheduler, cname: str, head: str) -> None:
    self._hold_all((cname,), head)


def _reserve_on(self: Scheduler, cname: str, r: _Reservation) -> None:
    self._resv.setdefault(cname, []).append(r)
    ver = r.extra.version if r.extra is not None else -1
    self._effect(("r", cname, r.time, r.head, ver, r))


def _block(self: Scheduler, q: _Queue, a: _Action, v: _Visit) -> None:
    """A strict queue's head could not start: nothing later in the queue starts."""
    if v.strict and not v.blocked:
        v.blocked = True
        v.ver += 1
        q.blocked_head = a.id


def _reserve(
    self: Scheduler,
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
    self: Scheduler,
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
            self._counts.reservation_walks_kept_across_clock += hit[2] < now
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
            self._counts.reservation_walks_kept_across_clock += hit[2] < now
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
    self: Scheduler,
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
