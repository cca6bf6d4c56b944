"""Projection: when a demand would fit on a cluster as running work ends by its estimates
(``_project``: ``_releases`` in time order, ``_steps``, ``_project_from``), and the
shortcuts that carry a projection across admissions and completions (``_carried``,
``_freed``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..common import _BY_TIME_SEQ, _INF
from ..resources import Usage

if TYPE_CHECKING:
    from typing import Any

    from ..common import _Step
    from ..core import Scheduler
    from ..fit import ClusterState, Runs
    from ..truth import _EnvInstance


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
    releases = self._releases(c, now)
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


def _project(
    self: Scheduler, c: ClusterState, runs: Runs, now: float, easy: bool, dkey: int
) -> tuple[float, ClusterState | None] | None:
    """When would ``runs`` fit on ``c``, as running work ends by its estimates?

    Returns (time, EASY's projected extra or None), or None if it cannot be computed
    (a running action with no estimate) or never fits.
    """
    self._counts.projections += 1
    releases = self._releases(c, now)
    if releases is None:
        return None
    need = self._needs.get(dkey)
    if need is None:
        need = self._needs[dkey] = Usage()
        for p, k in runs:
            need.add_pod(p.scaled(k))
    return self._project_from(c, runs, now, easy, releases, need, dkey)


def _releases(
    self: Scheduler, c: ClusterState, now: float
) -> list[tuple[float, int, Runs, list[int], Usage]] | None:
    """What running work on ``c`` gives back and when, in time order (None: a running
    action has no estimate). The same for every demand projected on ``c`` until its
    capacity, the environments or the clock move: computed once for all of them."""
    hit = self._rel_cache.get(c.index)
    if (
        hit is not None
        and hit[0] is c
        and hit[1] == c.version
        and hit[2] == self._env_epoch
        and hit[3] == now
    ):
        cached: list[tuple[float, int, Runs, list[int], Usage]] | None = hit[4]
        return cached
    releases: list[tuple[float, int, Runs, list[int], Usage]] = []
    # The earliest estimated end still ahead: projections here hold until then
    # (see ``_earliest_fit``).
    nxt = _INF
    for a in self.on_cluster.get(c.name, {}).values():
        t = self._release_time(a, now)
        if t is None:
            self._rel_cache[c.index] = (c, c.version, self._env_epoch, now, None, None)
            return None
        e = a.est_end
        if e is not None and now < e < nxt:
            nxt = e
        if a.nodes:
            # The entry it had, while it stands: a cluster whose capacity moved
            # lists the same releases again, mostly (fewer young objects for the
            # collector to walk).
            r = a.rel
            if r is None or r[0] != t or r[3] is not a.nodes:
                r = a.rel = (t, a.seq, a.runs, a.nodes, a.usage)
            releases.append(r)
    for inst in self.envs.values():
        if inst.cluster != c.name or not inst.nodes:
            continue
        if inst.active:
            ends = [self._release_time(x, now) for x in inst.running.values()]
            if any(e is None for e in ends):
                return None
            nxt = min(nxt, _env_horizon(inst, now))
            t = max(e for e in ends if e is not None) + inst.spec.idle_ttl
        else:
            t = inst.expires_at if inst.expires_at is not None else now
        releases.append((max(t, now), -1, inst.runs, inst.nodes, inst.usage))
    releases.sort(key=_BY_TIME_SEQ)
    self._rel_cache[c.index] = (c, c.version, self._env_epoch, now, releases, nxt)
    return releases


def _env_horizon(inst: _EnvInstance, now: float) -> float:
    """Until when an active environment's projected teardown (``idle_ttl`` after the
    last estimated end of its running actions) holds: that last end while it is ahead;
    ``now`` once every one is overdue (each then ends "now", so the teardown moves with
    the clock)."""
    last = max((x.est_end for x in inst.running.values() if x.est_end is not None), default=None)
    if last is None or last <= now:
        return now
    return last


def _project_from(
    self: Scheduler,
    c: ClusterState,
    runs: Runs,
    now: float,
    easy: bool,
    releases: list[tuple[float, int, Runs, list[int], Usage]],
    need: Usage,
    dkey: int,
) -> tuple[float, ClusterState | None] | None:
    proj: ClusterState | None = None
    applied = 0
    n = len(releases)
    ncpu, nmem, neph, ngpu = need.cpu, need.memory, need.eph, need.gpu
    for t, i, fcpu, fmem, feph, fgpu in self._steps(c, releases):
        # Totals are necessary for a fit: only then is it worth placing pod by pod.
        if fcpu < ncpu or fmem < nmem or feph < neph or fgpu < ngpu:
            continue
        if proj is None:
            if i == n:
                # Everything given back often leaves the cluster empty: then the
                # answer is the same every time, for every clock (``_empty_fit``).
                hit = self._rel_empty.get(c.index)
                if hit is None or hit[0] is not releases:
                    free = c.released([(r[2], r[3]) for r in releases])
                    hit = self._rel_empty[c.index] = (releases, free == c.capv)
                if hit[1]:
                    return self._empty_fit(c, runs, dkey, easy, t, now)
            proj = c.projected([(r[2], r[3]) for r in releases[:i]])
        else:
            for r in releases[applied:i]:
                proj.give(r[2], r[3])
        applied = i
        # The projection is scratch: with EASY, placing the head in it for real
        # leaves exactly the extra it does not need.
        proj.now = c if easy else None
        placed = proj.place(runs, commit=easy) is not None
        proj.now = None
        if placed:
            if t <= now:
                # It fits once overdue work is counted gone: the reservation is
                # "now", which moves with the clock.
                self._horizon = now
            return t, proj if easy else None
    return None


def _steps(
    self: Scheduler, c: ClusterState, releases: list[tuple[float, int, Runs, list[int], Usage]]
) -> list[_Step]:
    """``c``'s free totals as ``releases`` (``_releases``' list) give work back, one
    step per distinct time. They depend on the list alone (it is made anew when
    ``c``'s capacity moves), not on the demand: summed once for every demand
    projected on ``c``, instead of once per demand."""
    self._counts.release_steps_read += 1
    hit = self._rel_steps.get(c.index)
    if hit is not None and hit[0] is releases:
        cached: list[_Step] = hit[1]
        return cached
    self._counts.release_steps_summed += 1
    fcpu, fmem, feph, fgpu = c.tcpu, c.tmem, c.teph, c.tgpu
    steps: list[_Step] = []
    i = 0
    n = len(releases)
    while i < n:
        t = releases[i][0]
        while i < n and releases[i][0] == t:
            u = releases[i][4]
            fcpu += u.cpu
            fmem += u.memory
            feph += u.eph
            fgpu += u.gpu
            i += 1
        steps.append((t, i, fcpu, fmem, feph, fgpu))
    self._rel_steps[c.index] = (releases, steps)
    return steps


def _empty_fit(
    self: Scheduler, c: ClusterState, runs: Runs, dkey: int, easy: bool, t: float, now: float
) -> tuple[float, ClusterState | None] | None:
    """``_project_from``'s answer where the demand is placed on ``c`` emptied at
    ``t``: placement on an empty cluster depends on its nodes alone, so it is
    made once per cluster, node list and demand and shared (callers never change
    the extra they are given: see ``_earliest_fit``)."""
    key = (c.index, dkey, easy)
    hit = self._empties.get(key)
    # EASY's extra also depends on which nodes are free now (``ClusterState.now``).
    ver = c.version if easy else -1
    if hit is None or hit[0] is not c.cap or hit[3] != ver:
        empty = c.with_free((c.capv[0][:], c.capv[1][:], c.capv[2][:], c.capv[3][:]))
        if easy:
            empty.now = c
        placed = empty.place(runs, commit=easy) is not None
        empty.now = None
        hit = self._empties[key] = (c.cap, placed, empty, ver)
    if not hit[1]:
        return None
    if t <= now:
        # As in ``_project_from``: a reservation "now" moves with the clock.
        self._horizon = now
    if not easy:
        return t, None
    # What a fresh projection would be: ``c``'s identity and version, one placement on.
    x = c._shell()
    e = hit[2]
    x.fcpu, x.fmem, x.feph, x.fgpu, x.groups = e.fcpu, e.fmem, e.feph, e.fgpu, e.groups
    x.tcpu, x.tmem, x.teph, x.tgpu = e.tcpu, e.tmem, e.teph, e.tgpu
    x.version = c.version + 1
    return t, x
