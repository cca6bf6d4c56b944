"""Remembered reservation walks and holds: ``policy/backfill.py``'s answers kept from
event to event, and the pass's effects of holding and reserving, with the rules for when
each still stands.

- A reservation walk (``_scans``, by (selector, demand, EASY); ``_scan``): the fits of
  every cluster the head may reserve, with the capacity log position, environment epoch
  and clock they were found at. It stands while the environments are the same and the
  clock is between when it was made and the earliest of the fits' horizons; across
  changes of free capacity only (``_soft_since``) only the clusters that moved are asked
  again (their fits: ``index/projections._earliest_fit``). ``choose_reservation`` makes
  the answer from the fits.
- The clusters a strict head holds (``_holdables``, by (selector, demand);
  ``_holdable``): while no hard change happened (``validity._kept_since_hard``).
- The (cluster, head) pairs a visit's holds record (``_hold_pairs``): identities only,
  kept so that a head blocked pass after pass makes no new pairs; at most
  ``HOLD_PAIRS_MAX`` heads (then forgotten).

``invalidate`` (``index/log.py``) forgets the walks; ``from_snapshot`` starts with none.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..common import _INF
from ..index.orders import _order_key
from ..policy.backfill import choose_reservation, holdable

if TYPE_CHECKING:
    from collections.abc import Sequence
    from typing import Any

    from ..common import _Reservation, _ScanOut
    from ..core import Scheduler
    from ..fit import ClusterState, Runs


HOLD_PAIRS_MAX = 1024


def _holdable(
    self: Scheduler, sel: tuple[str, ...] | None, elig: list[ClusterState], runs: Runs, dkey: int
) -> list[str]:
    """``policy.backfill.holdable`` for demand ``dkey`` under selector ``sel`` (``elig``:
    its healthy clusters, in order). It moves only with a hard change (health, node
    shapes, the fleet), so every blocked head of the demand under the selector reads
    one list until then, instead of asking each cluster again."""
    key = (sel, dkey)
    hit = self._holdables.get(key)
    if hit is not None and self._kept_since_hard(hit[0]):
        names: list[str] = hit[1]
        return names
    names = holdable(elig, lambda c: self._could(c, runs, dkey))
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


def _scan(
    self: Scheduler,
    sel: tuple[str, ...] | None,
    elig: list[ClusterState],
    runs: Runs,
    dkey: int,
    now: float,
    easy: bool,
) -> _ScanOut:
    """``_reserve``'s walk over many clusters: ``choose_reservation`` over the fits of the
    clusters of ``elig`` the head may reserve (in placement order).

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
    """``_scan``'s answer from its fits by cluster (``choose_reservation``, ranked by
    placement order key), kept; ``note``: apply their clock horizons (fits not asked
    again this time)."""
    hz: dict[str, float] = {}
    hmin = _INF
    fits = []
    for n, (fit, k, c, h) in entries.items():
        hz[n] = h
        if h < hmin:
            hmin = h
        fits.append((n, fit, k, c))
    out = choose_reservation(fits)
    self._scans[ck] = (cap_end, self._env_epoch, now, entries, out, hz, hmin)
    if note:
        self._note_horizons(hz, hmin)
    return out
