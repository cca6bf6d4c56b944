"""When a queue's remembered answers still stand: the index layer's one validity check.

A queue's last visit is kept (its decisions, reasons, and the holds and reservations it
made) iff ``_skip_visit`` says so, from what the visit read and what moved since:

- its signature (``_signature``: the queue's epoch and spec, the environment epoch, the
  org epoch when an org cap is set) and the task history (``_hist_epoch``);
- capacity: the clusters named in the capacity log since the visit (``_changes``), and
  those whose answers expired by the clock (``q.hz``, ``q.horizon``): ``_changed_since``;
- upstream: the holds and reservations of the queues before it this pass against last
  pass (``_effects``, ``_diverged``), or the views it read (``_views_same``);
- then the answers themselves, re-checked only where those moved: ``_stands`` (and
  ``_still``, ``_held_still``, ``_evals_still`` behind it).

The remembered answers shared by visits each carry the key they were made at; the rules
over those keys that are not the queue-visit check also live here:

- ``_kept_since_hard``: what only a hard change moves (the healthy clusters of a
  selector, ``_eligible_of``; the clusters that could hold a demand, ``_holdable``);
- ``_projection_stands``: a cluster's projection (``_earliest_fit``), while the cluster's
  version and the environments are as they were and the clock is in its window;
- ``_note_window`` and ``_note_horizons``: what a visit read on a cluster stands until a
  time on the clock (an estimated end, a backfill window closing), which is how a
  queue's answers expire (``q.hz``, ``q.horizon``; ``_changed_since``).

Others (clusters with room by capacity log position, placement orders, releases) are
described in docs/scheduler-internals.md.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..common import _INF
from .records import _NO_CHANGE, _UNKNOWN

if TYPE_CHECKING:
    from ..core import Scheduler
    from ..fit import ClusterState
    from ..truth import Admitted, _Queue


def _skip_visit(
    self: Scheduler, q: _Queue, sig: tuple[Any, ...], up: int, now: float, out: list[Admitted]
) -> int | None:
    """Phase 2: the actions ``q``'s kept answers let start (0 when only its holds and
    reservations are made again), or None when it must be visited."""
    diverged: int | None = self._diverged
    same_upstream = q.last_up_len == up and (diverged is None or diverged >= up)
    cap_end = self._cap_base + len(self._cap_log)
    # Actions only appended since the last visit: what it decided stands if
    # it would under the signature it had then (the epoch moved by the
    # appends alone); then only the new actions need deciding.
    tail = q.tail
    sig_was = sig
    if tail > 0:
        ls = q.last_sig
        if ls is not None and ls[0] + tail == q.epoch and self._classes_as_now(q):
            sig_was = (ls[0], *sig[1:])
        else:
            tail = 0
    if q.cap_pos == cap_end and now <= q.horizon:
        # Nothing moved and nothing expired, the commonest case (an event's pass
        # re-checks every queue): ``_changed_since`` and ``_stands`` inlined.
        if not (
            sig_was == q.last_sig
            and (not q.hist_dep or q.last_hist == self._hist_epoch)
            and (
                same_upstream or (self._all_held(q) if q.stale else self._views_same(q, _NO_CHANGE))
            )
        ):
            return None
    else:
        changed, expired = _changed_since(self, q, cap_end, now)
        if not _stands(self, q, sig_was, changed, expired, same_upstream, now):
            return None
    # Nothing this queue's outcome depends on has changed since its
    # last visit: same decisions, same reasons. Only its holds and
    # reservations, which bind the queues after it, need making again
    # (``_hold`` and ``_reserve_on``, minus the visit's own record).
    if q.last_holds or q.last_resv:
        _remake_effects(self, q)
    q.cap_pos = cap_end
    # Its records now stand for this pass's upstream (the views were
    # checked against it, or it is the last one's): the next pass
    # compares against this one.
    q.last_up_len = up
    if tail:
        return self._visit_tail(q, tail, sig, now, out, up)
    self.skipped_visits += 1
    return 0


def _changed_since(
    self: Scheduler, q: _Queue, cap_end: int, now: float
) -> tuple[frozenset[str] | set[str] | None, frozenset[str] | None]:
    """The clusters whose answers ``q``'s last visit read may have moved: capacity
    changed (``_changes``; None: anything may have) or answers expired by the clock
    (the second value)."""
    changed: frozenset[str] | set[str] | None
    if q.cap_pos == cap_end:
        changed = _NO_CHANGE
    else:
        # ``_changes``' answer for the queues visited together, if known.
        chg = self._chg_cache.get(q.cap_pos)
        if chg is not None and chg[0] == cap_end:
            sel = q.spec.clusters
            changed = chg[2].get(sel, _UNKNOWN)
            if changed is _UNKNOWN:
                # A selector the changes since missed (most, after one
                # completion): ``_changes``' answer without the call.
                names = self._selsets.get(sel) if sel is not None else None
                if names is not None and names.isdisjoint(chg[1]):
                    changed = chg[2][sel] = _NO_CHANGE
                else:
                    changed = self._changes(q)
        else:
            changed = self._changes(q)
    expired: frozenset[str] | None = None
    if now > q.horizon and changed is not None:
        # What was read on a cluster whose answers expired (a running
        # action reached its estimated end, a backfill window closed) is
        # looked at again as if its capacity had changed; what was read
        # elsewhere stands.
        expired = frozenset(n for n, h in q.hz.items() if now > h)
        if not expired:
            # Never so (``horizon`` is the earliest of ``hz``); were it, the
            # expired answer would be known nowhere: visit.
            changed = None
        else:
            ek = (id(changed), expired)
            got = self._exp_cache.get(ek)
            if got is None or got[0] is not changed:
                got = self._exp_cache[ek] = (changed, set(changed) | expired)
            changed = got[1]
    return changed, expired


def _stands(
    self: Scheduler,
    q: _Queue,
    sig_was: tuple[Any, ...],
    changed: frozenset[str] | set[str] | None,
    expired: frozenset[str] | None,
    same_upstream: bool,
    now: float,
) -> bool:
    """Do ``q``'s last visit's answers still stand? ``_still``, with its commonest
    cases inlined."""
    if not changed:
        # ``_still`` with no capacity change here, inlined: the common case.
        # (Records not up to date where capacity changed under a held fleet
        # stand while it is still held: see ``_held_still``.)
        return bool(
            changed is not None
            and sig_was == q.last_sig
            and (not q.hist_dep or q.last_hist == self._hist_epoch)
            and (same_upstream or (self._all_held(q) if q.stale else self._views_same(q, changed)))
        )
    if (
        sig_was == q.last_sig
        and (not q.hist_dep or q.last_hist == self._hist_epoch)
        and not q.fragile
        and not q.mixed
        and (len(self._holds) >= len(self.clusters) or self._all_held(q))
    ):
        # ``_still``'s held path, tried here first: most queues below a
        # fleet held from above end there, and a pass has many of them.
        # Its commonest success inlined (no reservation, nothing expired,
        # the verdict and the stale set worked out for a queue before): a
        # completion re-checks a hundred such queues.
        held = None
        hsig = q.hsig
        if (
            not expired
            and hsig is not None
            and q.resv_rec is None
            and q.hsig_of is q.evals
            and q.hsig_n == len(q.evals)
            and self._hsig_cache.get((q.spec.clusters, hsig)) is True
        ):
            # (Queues that stood alike in a row first; else any before.)
            prev_stale = q.stale
            hit = self._stale_last
            if hit is None or hit[0] is not prev_stale or hit[1] is not changed:
                hit = self._stale_cache.get((id(prev_stale), id(changed)))
            if hit is not None and hit[0] is prev_stale and hit[1] is changed:
                q.last_hist = self._hist_epoch
                q.stale = hit[2]
                held = True
        if held is None:
            held = self._held_still(q, changed, now, expired)
            self._counts.held_rechecks_settled += held is True
        if held is not None:
            return held
    return self._still(q, sig_was, changed, same_upstream, now, expired, False)


def _remake_effects(self: Scheduler, q: _Queue) -> None:
    """Phase 2, kept: ``q``'s holds and reservations made again from its last visit
    (``_hold``, ``_reserve_on`` and ``_effect`` inlined: every skipped queue does this
    in every pass)."""
    holds = self._holds
    effects = self._effects
    if len(holds) < len(self.clusters) and q.last_holds:
        # (Else every cluster is held already.)
        # An effect the same as the last pass's at its place is that
        # one, kept (fewer young objects for the collector to walk).
        # (Past the first difference too: one queue's moved
        # reservation leaves the effects after it mostly in place.)
        prev = self._prev_effects
        for cname, head in q.last_holds:
            if cname not in holds:
                holds[cname] = head
                i = len(effects)
                p = prev[i] if i < len(prev) else None
                if (
                    p is None
                    or p[0] != "h"
                    or p[1] != cname
                    or p[2] != head
                    or p[3] is not None
                    or p[4] is not None
                ):
                    if self._diverged is None:
                        self._diverged = i
                    effects.append(("h", cname, head, None, None))
                else:
                    effects.append(p)
    if q.last_resv:
        resv = self._resv
        prev = self._prev_effects
        for cname, r in q.last_resv:
            on = resv.get(cname)
            if on is None:
                resv[cname] = [r]
            else:
                on.append(r)
            ver = r.extra.version if r.extra is not None else -1
            i = len(effects)
            p = prev[i] if i < len(prev) else None
            if (
                p is None
                or p[0] != "r"
                or p[1] != cname
                or p[2] != r.time
                or p[3] != r.head
                or p[4] != ver
            ):
                if self._diverged is None:
                    self._diverged = i
            elif p[5] is r:
                effects.append(p)
                continue
            effects.append(("r", cname, r.time, r.head, ver, r))


def _kept_since_hard(self: Scheduler, made_at: int) -> bool:
    """Does an answer made at capacity log position ``made_at`` of the last hard change
    still stand? Health, node shapes and the fleet move only with a hard change."""
    return made_at == self._hard_at


def _projection_stands(
    self: Scheduler, entry: tuple[Any, ...], c: ClusterState, now: float
) -> bool:
    """Does a projection of ``c`` (``entry``: the cluster's version, the environment
    epoch, the clock it was made at and its horizon, then the answer) stand at ``now``?
    Only while ``c``'s capacity and the environments are as they were, and the clock is
    between when it was made and its horizon (a running action reaching its estimated
    end, a warm environment's teardown starting to move)."""
    return bool(
        entry[0] == c.version and entry[1] == self._env_epoch and entry[2] <= now <= entry[3]
    )


def _note_window(self: Scheduler, cname: str, until: float) -> None:
    """What the visit in progress read on cluster ``cname`` stands until ``until`` on
    the clock: the visit's horizon, and the cluster's (the earliest wins)."""
    if until < self._horizon:
        self._horizon = until
    vhz = self._vhz
    if until < vhz.get(cname, _INF):
        vhz[cname] = until


def _note_horizons(self: Scheduler, hz: dict[str, float], hmin: float) -> None:
    """``_note_window`` for many clusters at once (``hz``; ``hmin`` its earliest)."""
    if hmin < self._horizon:
        self._horizon = hmin
    vhz = self._vhz
    if not vhz:
        vhz.update(hz)
        return
    if vhz == hz:
        # (Commonly so: a reservation made again reads the fits it read before.)
        return
    for n, h in hz.items():
        if h < vhz.get(n, _INF):
            vhz[n] = h
