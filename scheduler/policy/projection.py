"""Projection, as pure rules: when a demand would fit on a cluster as running work ends by
its estimates, and until when on the clock that answer stands.

- ``releases_on``: what the running work on a cluster gives back and when, in time order,
  and the earliest estimated end still ahead (the answer's horizon);
- ``steps_of``: the cluster's free totals after each distinct release time;
- ``project_from``: the first of those times at which the demand fits, node by node (with
  EASY, the head placed in the projection for real: what it leaves is the reservation's
  extra), returned with until when it stands;
- ``empty_fit`` / ``fit_on_empty``: the same answer where everything given back leaves
  the cluster empty (it depends on the node list alone).

Nothing here remembers an answer or writes into the scheduler: the projections kept from
event to event, and when they stand, are the index layer's
(``scheduler/index/projections.py``; ``index/validity._projection_stands``). (One write
remains, not an answer: ``releases_on`` reuses each action's release tuple while it is
equal, ``_Action.rel``, so as not to make a new one every time.)
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

from ..common import _BY_TIME_SEQ, _INF

if TYPE_CHECKING:
    from ..common import _Step
    from ..fit import ClusterState, Runs
    from ..resources import Usage
    from ..truth import _Action, _EnvInstance

#: One release: (time, the action's sequence number, or -1 for an environment; its runs,
#: its nodes, its usage).
Release = tuple[float, int, "Runs", list[int], "Usage"]
#: A projection's answer: (the time the demand fits, EASY's extra or None); None: never.
Fit = tuple[float, "ClusterState | None"]


def release_time(a: _Action, now: float) -> float | None:
    """When a running action is expected to end; one past its estimate ends "now"
    (None: it has no estimate)."""
    if a.est_end is None:
        return None
    return a.est_end if a.est_end > now else now


def env_horizon(inst: _EnvInstance, now: float) -> float:
    """Until when an active environment's projected teardown (``idle_ttl`` after the
    last estimated end of its running actions) holds: that last end while it is ahead;
    ``now`` once every one is overdue (each then ends "now", so the teardown moves with
    the clock)."""
    last = max((x.est_end for x in inst.running.values() if x.est_end is not None), default=None)
    if last is None or last <= now:
        return now
    return last


def releases_on(
    c: ClusterState, running: Iterable[_Action], envs: Iterable[_EnvInstance], now: float
) -> tuple[list[Release] | None, float]:
    """What the running work on ``c`` (``running``; ``envs``: every environment) gives
    back and when, in time order (None: a running action has no estimate, so no
    projection can be made), and until when on the clock that stands: the earliest
    estimated end still ahead, or an active environment's ``env_horizon``, whichever
    comes first (past it, that work ends "now" instead)."""
    out: list[Release] = []
    until = _INF
    unknown = False
    for a in running:
        t = release_time(a, now)
        e = a.est_end
        if e is not None and now < e < until:
            until = e
        if t is None:
            unknown = True
        elif a.nodes:
            # The entry it had, while it stands (``_Action.rel``): a cluster whose
            # capacity moved lists the same releases again, mostly (fewer young objects
            # for the collector to walk).
            r = a.rel
            if r is None or r[0] != t or r[3] is not a.nodes:
                r = a.rel = (t, a.seq, a.runs, a.nodes, a.usage)
            out.append(r)
    for inst in envs:
        if inst.cluster != c.name or not inst.nodes:
            continue
        if inst.active:
            until = min(until, env_horizon(inst, now))
            ends = [release_time(x, now) for x in inst.running.values()]
            if any(e is None for e in ends):
                unknown = True
                continue
            t = max(e for e in ends if e is not None) + inst.spec.idle_ttl
        else:
            t = inst.expires_at if inst.expires_at is not None else now
        out.append((max(t, now), -1, inst.runs, inst.nodes, inst.usage))
    if unknown:
        return None, until
    out.sort(key=_BY_TIME_SEQ)
    return out, until


def steps_of(c: ClusterState, releases: list[Release]) -> list[_Step]:
    """``c``'s free totals as ``releases`` give work back, one step per distinct time:
    (time, releases given back by then, free cpu, memory, ephemeral storage, gpu). They
    depend on the list alone, not on the demand."""
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
    return steps


#: ``project_from``'s question to its caller once everything is given back at ``t``: the
#: answer for the demand placed on the cluster emptied, or None if it is not then empty.
OnEmpty = Callable[[float], "tuple[Fit | None, float] | None"]


def project_from(
    c: ClusterState,
    runs: Runs,
    now: float,
    easy: bool,
    releases: list[Release],
    steps: list[_Step],
    need: Usage,
    on_empty: OnEmpty | None = None,
) -> tuple[Fit | None, float]:
    """When ``runs`` (of total ``need``) fit on ``c`` as ``releases`` (``steps``: their
    ``steps_of``) give work back: the answer (None: never), and until when it stands
    for the placement alone: ``now`` if it fits once overdue work is counted gone (the
    reservation is "now", which moves with the clock), else ``_INF`` (the releases'
    own horizon is ``releases_on``'s). ``on_empty``: asked first where everything given
    back may leave ``c`` empty; its answer, if not None, is the answer (the caller may
    remember it: on an empty cluster it depends on the node list alone)."""
    proj: ClusterState | None = None
    applied = 0
    n = len(releases)
    ncpu, nmem, neph, ngpu = need.cpu, need.memory, need.eph, need.gpu
    for t, i, fcpu, fmem, feph, fgpu in steps:
        # Totals are necessary for a fit: only then is it worth placing pod by pod.
        if fcpu < ncpu or fmem < nmem or feph < neph or fgpu < ngpu:
            continue
        if proj is None:
            if i == n and on_empty is not None:
                got = on_empty(t)
                if got is not None:
                    return got
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
            return (t, proj if easy else None), (now if t <= now else _INF)
    return None, _INF


def empty_fit(c: ClusterState, runs: Runs, easy: bool) -> tuple[bool, ClusterState]:
    """``runs`` placed on ``c`` with every node empty (with EASY for real, busy-now
    nodes first): whether it fits, and the emptied cluster it was placed on (with EASY,
    what the placement leaves)."""
    empty = c.with_free((c.capv[0][:], c.capv[1][:], c.capv[2][:], c.capv[3][:]))
    if easy:
        empty.now = c
    placed = empty.place(runs, commit=easy) is not None
    empty.now = None
    return placed, empty


def fit_on_empty(
    c: ClusterState, placed: bool, empty: ClusterState, easy: bool, t: float, now: float
) -> tuple[Fit | None, float]:
    """``project_from``'s answer where ``c`` is empty at ``t``, from ``empty_fit``'s
    (``placed``, ``empty``; never changed here), with until when it stands."""
    if not placed:
        return None, _INF
    # As in ``project_from``: a reservation "now" moves with the clock.
    until = now if t <= now else _INF
    if not easy:
        return (t, None), until
    # What a fresh projection would be: ``c``'s identity and version, one placement on.
    x = c._shell()
    e = empty
    x.fcpu, x.fmem, x.feph, x.fgpu, x.groups = e.fcpu, e.fmem, e.feph, e.fgpu, e.groups
    x.tcpu, x.tmem, x.teph, x.tgpu = e.tcpu, e.tmem, e.teph, e.tgpu
    x.version = c.version + 1
    return (t, x), until
