"""Remembered projections: ``policy/projection.py``'s answers kept from event to event, and
carried across admissions and completions, with the rules for when each still stands.

- One cluster's earliest fit for a demand (``_fit_cache``, by (cluster, demand, EASY);
  ``_earliest_fit``): stands while the cluster's version and the environments are as
  they were and the clock is between when it was found and its horizon
  (``validity._projection_stands``). Across admissions that each end by the time it
  found (``_chain``, ``_carried``), or completions of work it counted gone by then that
  leave too little free before it (``_fchain``, ``_freed``), it is carried to the
  cluster's new version. A plain backfill demand reads EASY's answer for the same
  demand (its time is the same) unless the demand is a gang of unlike pods.
- A cluster's releases (``_rel_cache``, ``_releases``): while its version, the
  environments and the clock are as they were; their free totals (``_rel_steps``,
  ``_steps``) and whether they leave it empty (``_rel_empty``): while the list is the
  same one.
- A demand placed on a cluster emptied (``_empties``, ``_empty_fit``): while its node
  list is the same (with EASY, its version too: the extra depends on what is busy now).
- A demand's total (``_needs``): for ever (a demand key names one demand).

``invalidate`` (``index/log.py``) forgets all of them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..policy.projection import (
    empty_fit,
    fit_on_empty,
    project_from,
    releases_on,
    steps_of,
)
from ..resources import Usage

if TYPE_CHECKING:
    from typing import Any

    from ..common import _Step
    from ..core import Scheduler
    from ..fit import ClusterState, Runs
    from ..policy.projection import Fit, Release


def _carried(
    self: Scheduler, c: ClusterState, key: tuple[int, int, bool], hit: tuple[Any, ...]
) -> tuple[Any, ...] | None:
    """A cached projection of ``c`` brought to its current version, if only
    admissions changed it since and each is expected to end by the time the
    projection found (see ``_chain``); else None.

    Such an action takes nodes and gives them back by then: before, the demand
    fits even less; from then on, node by node, the cluster is as it was. So the
    answer and EASY's extra stay; only the clock horizon may shrink (the action
    reaching its estimated end moves its release).
    """
    ch = self._chain.get(c.index)
    if ch is None or ch[1] != c.version or ch[0] > hit[0]:
        return None
    res = hit[4]
    if res is not None and ch[2] > res[0]:
        return None
    got = (c.version, hit[1], hit[2], min(hit[3], ch[3]), res)
    self._fit_cache[key] = got
    return got


def _freed(
    self: Scheduler, c: ClusterState, key: tuple[int, int, bool], hit: tuple[Any, ...], now: float
) -> tuple[Any, ...] | None:
    """A cached projection of ``c`` brought to its current version, if only
    completions changed it since, each of work the projection counted given back
    by the time it found (see ``_fchain``), and the work still running gives back
    too little, in total, for the demand before then; else None.

    The projection holds the cluster as it is at each time work ends: from the
    time it found on, node by node, the cluster is as it was (what ended was
    counted gone by then); before, it holds more, but ``_project_from`` places
    nothing where the totals fall short. So the answer and EASY's extra stay.
    (The clock window is the cached one: no running action reached its
    estimated end inside it, so the work still running ends when it did.)
    """
    fc = self._fchain.get(c.index)
    if fc is None or fc[1] != c.version or fc[0] > hit[0]:
        return None
    res = hit[4]
    if res is None or fc[2] > res[0]:
        return None
    if hit[1] != self._env_epoch or not hit[2] <= now <= hit[3]:
        return None
    need = self._needs.get(key[1])
    if need is None:
        return None
    releases, _ = self._releases(c, now)
    if releases is None:
        return None
    until = res[0]
    ncpu, nmem, neph, ngpu = need.cpu, need.memory, need.eph, need.gpu
    for t, _, fcpu, fmem, feph, fgpu in self._steps(c, releases):
        if t >= until:
            break
        if fcpu >= ncpu and fmem >= nmem and feph >= neph and fgpu >= ngpu:
            return None  # it may fit earlier now
    got = (c.version, hit[1], hit[2], hit[3], res)
    self._fit_cache[key] = got
    return got


def _chain_free(self: Scheduler, c: ClusterState, before: int, est_end: float | None) -> None:
    """Note a completion on ``c`` that moved it from version ``before`` on: the run
    of completions since ``_fchain``'s base, and the latest of their estimated ends
    (an action with no estimate ends the run)."""
    if est_end is None:
        self._fchain.pop(c.index, None)
        return
    fc = self._fchain.get(c.index)
    if fc is not None and fc[1] == before:
        self._fchain[c.index] = (fc[0], c.version, max(fc[2], est_end))
    else:
        self._fchain[c.index] = (before, c.version, est_end)


def _chain_admit(self: Scheduler, c: ClusterState, before: int, est_end: float | None) -> None:
    """Note an admission on ``c`` that moved it from version ``before`` on: the
    run of admissions since ``_chain``'s base, and when they are expected to end
    (latest, earliest). An action with no estimate ends the run."""
    if est_end is None:
        self._chain.pop(c.index, None)
        return
    ch = self._chain.get(c.index)
    if ch is not None and ch[1] == before:
        self._chain[c.index] = (ch[0], c.version, max(ch[2], est_end), min(ch[3], est_end))
    else:
        self._chain[c.index] = (before, c.version, est_end, est_end)


def _earliest_fit(
    self: Scheduler, c: ClusterState, runs: Runs, now: float, easy: bool, dkey: int
) -> Fit | None:
    """``policy.projection``'s answer for ``runs`` on ``c`` (the time it would fit, and
    EASY's extra), kept while the cluster and the clock leave it unchanged; until when
    it stands is noted for the visit in progress (``_note_window``)."""
    key = (c.index, dkey, easy)
    fit_cache = self._fit_cache
    hit = fit_cache.get(key)
    if hit is not None and hit[0] != c.version and not easy:
        # Not for EASY: its extra depends on which nodes are free now (the head's
        # projected placement takes busy-now nodes first), which both moved.
        hit = self._carried(c, key, hit) or self._freed(c, key, hit, now)
    if not easy and (hit is None or not self._projection_stands(hit, c, now)):
        # EASY's projection places the demand the same way, only for real (on
        # scratch): its time, valid over the same window, is this answer too.
        # Backfill and EASY queues asking for one demand project it once. Not for a
        # gang of unlike pods: EASY's placement puts a pod on a busy-now node among
        # equals, which can leave no node for the next pod where the plain best fit
        # finds one (reserving timeline 123 of the differential tests).
        sib = fit_cache.get((c.index, dkey, True)) if dkey not in self._unlike else None
        if sib is not None and self._projection_stands(sib, c, now):
            sres = sib[4]
            hit = fit_cache[key] = (
                sib[0],
                sib[1],
                sib[2],
                sib[3],
                None if sres is None else (sres[0], None),
            )
    if hit is not None and self._projection_stands(hit, c, now):
        self._note_window(c.name, hit[3])
        # The cached EASY extra is shared: ``_reserve`` copies the one it keeps.
        cached: Fit | None = hit[4]
        return cached
    res, horizon = self._project(c, runs, now, easy, dkey)
    fit_cache[key] = (c.version, self._env_epoch, now, horizon, res)
    self._note_window(c.name, horizon)
    return res


def _project(
    self: Scheduler, c: ClusterState, runs: Runs, now: float, easy: bool, dkey: int
) -> tuple[Fit | None, float]:
    """``policy.projection.project_from`` for ``runs`` on ``c``, from the remembered
    releases, their steps and the demand's total: (the answer, until when it stands: the
    earlier of the placement's and the releases' horizons)."""
    self._counts.projections += 1
    releases, until = self._releases(c, now)
    if releases is None:
        return None, until
    need = self._needs.get(dkey)
    if need is None:
        need = self._needs[dkey] = Usage()
        for p, k in runs:
            need.add_pod(p.scaled(k))

    def on_empty(t: float) -> tuple[Fit | None, float] | None:
        # Everything given back often leaves the cluster empty: then the answer is
        # the same every time, for every clock (``_empty_fit``).
        hit = self._rel_empty.get(c.index)
        if hit is None or hit[0] is not releases:
            free = c.released([(r[2], r[3]) for r in releases])
            hit = self._rel_empty[c.index] = (releases, free == c.capv)
        return self._empty_fit(c, runs, dkey, easy, t, now) if hit[1] else None

    res, h = project_from(c, runs, now, easy, releases, self._steps(c, releases), need, on_empty)
    return res, min(h, until)


def _releases(self: Scheduler, c: ClusterState, now: float) -> tuple[list[Release] | None, float]:
    """``policy.projection.releases_on`` for ``c`` (the releases, None if a running
    action has no estimate; until when they stand), the same for every demand projected
    on ``c`` until its capacity, the environments or the clock move: made once for all
    of them."""
    hit = self._rel_cache.get(c.index)
    if (
        hit is not None
        and hit[0] is c
        and hit[1] == c.version
        and hit[2] == self._env_epoch
        and hit[3] == now
    ):
        return hit[4], hit[5]
    releases, until = releases_on(
        c, self.on_cluster.get(c.name, {}).values(), self.envs.values(), now
    )
    self._rel_cache[c.index] = (c, c.version, self._env_epoch, now, releases, until)
    return releases, until


def _steps(self: Scheduler, c: ClusterState, releases: list[Release]) -> list[_Step]:
    """``policy.projection.steps_of`` for ``releases`` (``_releases``' list, made anew
    when ``c``'s capacity moves): summed once for every demand projected on ``c``,
    instead of once per demand."""
    self._counts.release_steps_read += 1
    hit = self._rel_steps.get(c.index)
    if hit is not None and hit[0] is releases:
        cached: list[_Step] = hit[1]
        return cached
    self._counts.release_steps_summed += 1
    steps = steps_of(c, releases)
    self._rel_steps[c.index] = (releases, steps)
    return steps


def _empty_fit(
    self: Scheduler, c: ClusterState, runs: Runs, dkey: int, easy: bool, t: float, now: float
) -> tuple[Fit | None, float]:
    """``policy.projection.fit_on_empty``: the placement on ``c`` emptied
    (``empty_fit``) depends on its nodes alone, so it is made once per cluster, node
    list and demand and shared (callers never change the extra they are given: see
    ``_earliest_fit``)."""
    key = (c.index, dkey, easy)
    hit = self._empties.get(key)
    # EASY's extra also depends on which nodes are free now (``ClusterState.now``).
    ver = c.version if easy else -1
    if hit is None or hit[0] is not c.cap or hit[3] != ver:
        placed, empty = empty_fit(c, runs, easy)
        hit = self._empties[key] = (c.cap, placed, empty, ver)
    return fit_on_empty(c, hit[1], hit[2], easy, t, now)
