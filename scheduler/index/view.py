"""The index layer's public surface: what its remembered answers say, read without its
private names. Nothing here changes what the scheduler decides; an answer read here is
the one the next visit would read (made if it is not kept), so a test can tell a kept
answer from one made again by identity.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from ..fit import runs_of
from ..index.orders import _order_key

if TYPE_CHECKING:
    from ..core import Scheduler
    from ..fit import ClusterState
    from ..resources import Pod


@dataclass(slots=True)
class Counts:
    """Work the core did since it was made, counted where it is done (the counts are
    never read by a decision; a test reads them through ``counts`` to tell an answer
    reused from one made again).

    Attributes:
        fits: actions decided by the full decision (gates, then the fit): an action
            given a kept answer, or its class's answer, is not counted.
        records_made: records of a visit's fits made (fits that end alike join one
            record as they come, so this counts records, not fits).
        held_rechecks: reserving queues re-checked by the held-fleet path (every
            cluster the queue may use held from above) after a change.
        reservation_answers: reservation answers worked out for those re-checks
            (alike queues share one within a pass).
        stretches_settled: runs of a decision class's members given one answer at once
            (a class decided once, and its members after it given that answer, is one).
        fleet_list_reads: selectors' lists of clusters with room for a demand made
            from the whole fleet's list (brought up to date by the clusters that moved)
            instead of asking each of their clusters.
        reservations_found_by_walk: held-fleet re-checks whose reservation got worse
            where it was, answered by the reservation walk (kept per selector and
            demand) instead of a full visit of the queue.
        visits: queues visited in full (their waiting actions walked).
        projections: projections made of when a demand would fit on a cluster as its
            running work ends (a projection kept for the cluster's state is not).
        release_steps_read: reads of a cluster's free totals step by step as its
            running work ends; release_steps_summed: those summed afresh (the rest
            were the list kept for the same releases, shared between demands).
        held_flips: queues under a held fleet whose fits' reasons were changed in
            place (a demand found room anywhere, or none) instead of a full check;
            held_flips_head_went: those where a reserving head that found room went.
        held_rechecks_settled: held-fleet re-checks (of any queue) that found the
            visit would answer as the last did (a re-check shared inline with a queue
            that stood alike before it is not counted).
        held_rechecks_mixed: held-fleet re-checks of records found at more than one
            capacity (a visit that admitted); such records are re-checked in full.
        full_rechecks_mixed_under_held_fleet: full re-checks of such records while
            every cluster of the fleet was held.
        reservation_walks_kept_across_clock: a reserving head's walk over the
            clusters answered from a walk made at an earlier clock (its fits kept,
            only the clusters that moved asked again).
    """

    fits: int = 0
    records_made: int = 0
    held_rechecks: int = 0
    reservation_answers: int = 0
    stretches_settled: int = 0
    fleet_list_reads: int = 0
    reservations_found_by_walk: int = 0
    visits: int = 0
    projections: int = 0
    release_steps_read: int = 0
    release_steps_summed: int = 0
    held_flips: int = 0
    held_flips_head_went: int = 0
    held_rechecks_settled: int = 0
    held_rechecks_mixed: int = 0
    full_rechecks_mixed_under_held_fleet: int = 0
    reservation_walks_kept_across_clock: int = 0


def counts(s: Scheduler) -> Counts:
    """A copy of ``s``'s work counts (see ``Counts``) as they stand now."""
    return replace(s._counts)


def reservations(s: Scheduler) -> list[tuple[str, float, str]]:
    """The reservations of the latest pass as (cluster, start time, head), sorted."""
    return sorted((c, r.time, r.head) for c, rs in s._resv.items() for r in rs)


def healthy_clusters(s: Scheduler, queue: str, healthy_only: bool = True) -> list[ClusterState]:
    """The clusters of ``queue``'s selector a visit reads (healthy ones only unless
    ``healthy_only`` is False): kept per selector until a hard change."""
    return s._eligible(s.queues[queue], healthy_only)


def holdable_clusters(s: Scheduler, queue: str, action_id: str) -> list[str]:
    """Where waiting action ``action_id`` of ``queue``, a strict head with no room
    anywhere, holds: the known healthy clusters of the selector whose node shapes could
    hold its demand. Kept per (selector, demand) until a hard change."""
    q = s.queues[queue]
    a = s.actions[action_id]
    return s._holdable(q.spec.clusters, s._eligible(q), a.runs, a.dkey)


def holds(s: Scheduler) -> dict[str, str]:
    """The clusters held in the latest pass, each with the head holding it."""
    return dict(s._holds)


def hold_records_kept(s: Scheduler) -> int:
    """How many blocked heads have their (cluster, head) hold records kept for the next
    pass (at most ``index.reservations.HOLD_PAIRS_MAX``)."""
    return len(s._hold_pairs)


def held_summary_current(s: Scheduler, queue: str) -> bool | None:
    """Whether ``queue``'s kept held-fleet summary of its fits (demand by demand, room
    or none) is the one made afresh from its fits' reasons now; None if no kept
    summary stands for its current records."""
    q = s.queues[queue]
    kept = q.hsig
    if kept is None or q.hsig_of is not q.evals or q.hsig_n != len(q.evals):
        return None
    q.hsig = None
    try:
        return s._held_summary(q) == kept
    finally:
        q.hsig = kept


def kept_projection(
    s: Scheduler, cluster: str, action_id: str, easy: bool = False
) -> tuple[float, bool] | None:
    """The projection kept for ``action_id``'s demand on ``cluster`` (EASY's if ``easy``):
    (the time it would fit, whether EASY's extra was found there), or None if it never
    fits or cannot be computed. Raises KeyError if none is kept."""
    key = (s.clusters[cluster].index, s.actions[action_id].dkey, easy)
    if key not in s._fit_cache:
        raise KeyError(f"no projection kept for {action_id!r} on {cluster!r} (easy={easy})")
    res = s._fit_cache[key][4]
    return None if res is None else (res[0], res[1] is not None)


def release_steps(s: Scheduler, cluster: str) -> list[tuple[float, int, int, int, int, int]]:
    """``cluster``'s kept free totals as its running work ends, one step per distinct
    time: (time, releases up to it, free cpu, memory, ephemeral storage, gpu). Empty if
    none is kept."""
    hit = s._rel_steps.get(s.clusters[cluster].index)
    return [] if hit is None else list(hit[1])


@dataclass(frozen=True)
class RoomList:
    """A list of the clusters of a selector with room for a demand.

    Attributes:
        clusters: their names, in placement order.
        current: whether it stands at the end of the capacity log (no cluster moved
            since it was made or brought up to date).
    """

    clusters: tuple[str, ...]
    current: bool


def _room_key(s: Scheduler, selector: tuple[str, ...] | None, pods: tuple[Pod, ...]) -> Any:
    return (selector, s._dkey(pods))


def _as_room_list(s: Scheduler, entry: Any) -> RoomList:
    names = tuple(c.name for c in entry.order)
    assert frozenset(names) == entry.names  # the list and its names agree
    return RoomList(names, entry.pos == s._cap_base + len(s._cap_log))


def room_list(s: Scheduler, selector: tuple[str, ...] | None, pods: tuple[Pod, ...]) -> RoomList:
    """The list of ``selector``'s clusters (None: the fleet) with room for ``pods`` a
    walk reads now: the kept one brought up to date, or made (and kept, as a walk keeps
    it)."""
    return _as_room_list(s, s._cands_of(_room_key(s, selector, pods), runs_of(pods), None))


def kept_room_list(
    s: Scheduler, selector: tuple[str, ...] | None, pods: tuple[Pod, ...]
) -> RoomList | None:
    """The kept list of ``room_list`` as it stands (not brought up to date), or None."""
    hit = s._cands.get(_room_key(s, selector, pods))
    return None if hit is None else _as_room_list(s, hit)


def room_list_afresh(
    s: Scheduler, selector: tuple[str, ...] | None, pods: tuple[Pod, ...]
) -> RoomList:
    """``room_list`` made from scratch, asking every cluster; the kept list is left as
    it was."""
    key = _room_key(s, selector, pods)
    kept = s._cands.pop(key, None)
    try:
        return _as_room_list(s, s._cands_of(key, runs_of(pods), None))
    finally:
        if kept is None:
            s._cands.pop(key, None)
        else:
            s._cands[key] = kept


def room_anywhere(s: Scheduler, selector: tuple[str, ...] | None, pods: tuple[Pod, ...]) -> bool:
    """Whether a fit of ``pods`` under ``selector`` would find a cluster with room now,
    asked as at the start of a pass (the pass's own answers set aside, then put back).
    Answered, as the re-checks answer it, from the kept list and what moved since; a
    kept list found to have no room is brought up to date (empty)."""
    noroom, moved = s._noroom, s._moved_cache
    s._noroom, s._moved_cache = set(), {}
    try:
        return s._any_room(selector, s._dkey(pods), runs_of(pods))
    finally:
        s._noroom, s._moved_cache = noroom, moved


def all_held(s: Scheduler, queue: str) -> bool:
    """Whether every healthy cluster ``queue`` may use is held in the latest pass (its
    visit then reads capacity only as whether each demand has room anywhere)."""
    cache = s._held_cache
    s._held_cache = {}
    try:
        return s._all_held(s.queues[queue])
    finally:
        s._held_cache = cache


def placement_key(c: ClusterState) -> tuple[Any, ...]:
    """``c``'s key in placement order, kept for its free state (and whether its nodes
    are known): the same object until either moves, so a test can tell it kept."""
    return _order_key(c)


def kept_held_summary(s: Scheduler, queue: str) -> tuple[int, ...] | None:
    """``queue``'s kept held-fleet summary of its fits (see ``held_summary_current``),
    or None if none is kept."""
    return s.queues[queue].hsig


def effects_stand(s: Scheduler) -> bool:
    """Whether every effect of the latest pass (a hold or a reservation, in the order
    made; kept from the pass before where alike) says what the pass's holds and
    reservations are: a hold's cluster held by its head, a reservation's the very
    reservation on its cluster, with its time, head and EASY version."""
    for e in s._effects:
        if e[0] == "h":
            if s._holds.get(e[1]) != e[2] or e[3:] != (None, None):
                return False
            continue
        r = e[5]
        if not any(x is r for x in s._resv.get(e[1], ())):
            return False
        ver = r.extra.version if r.extra is not None else -1
        if e[2:5] != (r.time, r.head, ver):
            return False
    return True


def effects_kept(s: Scheduler) -> int:
    """How many effects of the latest pass are the pass before's, kept (not made
    again)."""
    prev = {id(e) for e in s._prev_effects}
    return sum(id(e) in prev for e in s._effects)


def effects(s: Scheduler) -> list[tuple[Any, ...]]:
    """The holds and reservations the latest pass made, in order: ("h", cluster, head,
    None) for a hold, ("r", cluster, start time, head) for a reservation."""
    return [e[:4] for e in s._effects]
