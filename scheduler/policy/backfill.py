"""Holds and reservations, as policy: a strict head with no room anywhere holds every
cluster that could ever take it (``holdable``); a backfill/EASY head reserves the
earliest cluster its projection fits (``choose_reservation``: the choice among clusters,
a pure function of the projections it is given); what a reservation leaves to an action
that outlasts several (``_joint_extra``).

``_reserve`` applies the choice in a pass: it asks the index layer for the projections
(``index/projections.py``'s ``_earliest_fit``, or ``index/reservations.py``'s ``_scan``,
the same walk remembered) and makes the holds and the reservation as the pass's effects
(``index/reservations.py``). ``_block`` stops a strict queue behind its head.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

from ..common import _FIRST, _INF, _SCAN_MIN, _Reservation
from ..index.records import _NO_CHANGE, _ResvRecord

if TYPE_CHECKING:
    from collections.abc import Sequence
    from typing import Any

    from ..common import _ScanOut
    from ..core import Scheduler
    from ..fit import ClusterState, Runs
    from ..index.records import _Visit
    from ..policy.projection import Fit
    from ..truth import _Action, _Queue


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


def holdable(elig: Iterable[ClusterState], could: Callable[[ClusterState], bool]) -> list[str]:
    """Where a strict head with no room anywhere holds: the clusters of ``elig`` (its
    selector's healthy ones, in order) that are known and whose node shapes could ever
    hold it (``could``)."""
    return [c.name for c in elig if c.known and could(c)]


def choose_reservation(
    fits: Iterable[tuple[str, Fit | None, Any, ClusterState]],
) -> _ScanOut:
    """The reservation a backfill/EASY head makes, from the projections it is given:
    ``fits`` holds, per cluster it may reserve (known, node shapes that could hold the
    head), (name, its earliest fit or None, its rank in placement order, the cluster).

    Returns (the earliest fit as (time, cluster, EASY's extra), ties to the first in
    placement order; None if none fits), and the clusters whose fit cannot be computed
    (a running action with no estimate), in placement order: the head holds those as
    under strict. What it read is exactly ``fits``: the caller notes until when each
    stands."""
    best: tuple[float, ClusterState, ClusterState | None] | None = None
    bk: Any = None
    held: list[tuple[Any, str]] = []
    for n, fit, k, c in fits:
        if fit is None:
            held.append((k, n))
        elif best is None or fit[0] < best[0] or (fit[0] == best[0] and k < bk):
            best, bk = (fit[0], c, fit[1]), k
    held.sort(key=_FIRST)
    return best, [n for _, n in held]


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
    """``head`` (of demand ``dkey``, selector ``sel``, healthy clusters ``elig``) found no
    room anywhere: reserve where ``choose_reservation`` says, hold where it cannot tell,
    and record what the choice read for the index layer (``_vresv``)."""
    env = head.env if not head.env_declared else None
    if self.incremental and not (env and self.undeclared_env.get(env)):
        if len(elig) > _SCAN_MIN:
            best, held = self._scan(sel, elig, runs, dkey, now, easy)
        else:
            best, held = choose_reservation(
                _fits(self, self._base_order(sel, elig), runs, dkey, now, easy)
            )
    else:
        order = self._placement_order(elig, env)
        best, held = choose_reservation(_fits(self, order, runs, dkey, now, easy))
    for n in held:
        self._hold(n, head.id)
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


def _fits(
    self: Scheduler, order: list[ClusterState], runs: Runs, dkey: int, now: float, easy: bool
) -> list[tuple[str, Fit | None, Any, ClusterState]]:
    """``choose_reservation``'s input over ``order`` (a placement order: ranked by
    position), the fits asked of the index layer in that order."""
    return [
        (c.name, self._earliest_fit(c, runs, now, easy, dkey), i, c)
        for i, c in enumerate(order)
        if c.known and self._could(c, runs, dkey)
    ]
