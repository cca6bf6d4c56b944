"""Remembered answers per selector and demand: healthy clusters (``_eligible_of``),
clusters with room (``_cands_of``), those not held (``_unheld``).
"""

from __future__ import annotations

from itertools import compress
from typing import TYPE_CHECKING

from ..common import _INF, _NAME, _SCAN_MIN
from ..index.records import _NO_CHANGE, _NO_ROOM, _Cands
from ..policy.gates import gap_allows

if TYPE_CHECKING:
    from typing import Any

    from ..common import _Reservation
    from ..core import Scheduler
    from ..fit import ClusterState, Runs
    from ..truth import _Action, _Queue


def _eligible(self: Scheduler, q: _Queue, healthy_only: bool = True) -> list[ClusterState]:
    """The clusters of ``q``'s selector (healthy ones only, unless told), in the
    selector's order. Callers must not change the list: the healthy ones are kept
    per selector until a hard change (health, the fleet), for every visit."""
    return self._eligible_of(q.spec.clusters, healthy_only)


def _eligible_of(
    self: Scheduler, sel: tuple[str, ...] | None, healthy_only: bool = True
) -> list[ClusterState]:
    """``_eligible`` for selector ``sel``."""
    if healthy_only:
        hit = self._eligibles.get(sel)
        if hit is not None and self._kept_since_hard(hit[0]):
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


def _cands_of(
    self: Scheduler, nr_key: tuple[Any, int], runs: Runs, elig: list[ClusterState] | None
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
                self._counts.fleet_list_reads += 1
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


def _unheld(
    self: Scheduler, nr_key: tuple[Any, int], order: list[ClusterState]
) -> list[ClusterState]:
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


def _allowed(
    self: Scheduler,
    a: _Action,
    now: float,
    rs: list[_Reservation],
    runs: Runs,
    c: ClusterState,
) -> list[_Reservation] | None:
    """``policy.gates.gap_allows`` for ``a`` (None: it may not start on ``c`` under
    ``rs``; else the reservations whose EASY extra it uses up), with what the answer
    read noted for the visit: the task's history (no declared estimate), and until when
    on the clock it stands. An action with no estimate is never backfilled."""
    if a.spec.estimate is None:
        self._vhist = True  # an estimate from the task's history
    est = self.estimate(a.task, a.spec.estimate)
    if est is None:
        return None
    need, until = gap_allows(est, now, rs, runs, c)
    if until < _INF:
        self._note_window(c.name, until)
    return need
