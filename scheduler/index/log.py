"""The capacity log and the signatures: what moved since a remembered answer was made.

``_touch`` logs every cluster change (*hard* when more than free capacity changed),
``_changes`` answers which clusters moved since a log position, ``_signature`` is what a
queue's visit reads besides capacity.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..index.records import _LOG_MAX, _NO_CHANGE, _UNKNOWN
from ..policy.gates import _org_gated

if TYPE_CHECKING:
    from typing import Any

    from ..core import Scheduler
    from ..truth import _Queue


def _touch(self: Scheduler, name: str, hard: bool = False) -> None:
    """Note that cluster ``name`` changed (free capacity; ``hard``: more than that)."""
    log = self._cap_log
    at = self._cap_base + len(log)
    self._touched[name] = at
    if hard:
        self._hard_at = at
    log.append((name, hard))
    if len(log) > _LOG_MAX:
        # Queues that stood before the dropped entries get a full visit.
        drop = len(log) // 2
        del log[:drop]
        self._cap_base += drop


def invalidate(self: Scheduler) -> None:
    """Forget what incremental passes remember: the next pass visits every queue.

    Never needed for correctness (every input a visit reads is tracked); useful to
    measure a full pass, or to rule the incremental path out when debugging.
    """
    for q in self.queues.values():
        q.last_sig = None
        q.cap_pos = -1
    self._fit_cache.clear()
    self._scans.clear()
    self._rel_cache.clear()
    self._feasible.clear()
    self._unfit.clear()
    self._orders.clear()
    self._cands.clear()


def _changes(self: Scheduler, q: _Queue) -> frozenset[str] | set[str] | None:
    """Clusters of ``q``'s selector whose free capacity changed since its last visit.

    None if something more than free capacity changed there (health, a capacity
    report, a new spec), or if the log no longer reaches back that far.
    """
    pos = q.cap_pos - self._cap_base
    log = self._cap_log
    if pos < 0:
        return None
    if pos == len(log):
        return _NO_CHANGE
    # Queues visited together stand at the same place in the log: one answer for
    # all of them (callers only read it), and one read of the log for every
    # selector: each cluster it names, in the order first named, and whether an
    # entry for it was hard.
    end = self._cap_base + len(log)
    got = self._chg_cache.get(q.cap_pos)
    if got is None or got[0] != end:
        span: dict[str, bool] = {}
        for i in range(pos, len(log)):
            name, hard = log[i]
            if hard:
                span[name] = True
            elif name not in span:
                span[name] = False
        got = self._chg_cache[q.cap_pos] = (end, span, {})
    answers = got[2]
    sel = q.spec.clusters
    answer: frozenset[str] | set[str] | None = answers.get(sel, _UNKNOWN)
    if answer is not _UNKNOWN:
        return answer
    # A selector none of the changes touched shares the empty answer (no set per
    # selector per pass for the collector to walk): the set is made on the first
    # change it names.
    names = None
    if sel is not None:
        names = self._selsets.get(sel)
        if names is None:
            names = self._selset(sel)
    out: set[str] | None = None
    hard_seen = False
    for name, hard in got[1].items():
        if names is None or name in names:
            if hard:
                hard_seen = True
                break
            if out is None:
                out = {name}
            else:
                out.add(name)
    if hard_seen:
        answer = None
    elif out is None:
        answer = _NO_CHANGE
    else:
        answer = out
    answers[sel] = answer
    return answer


def _selset(self: Scheduler, sel: tuple[str, ...]) -> frozenset[str]:
    """Selector ``sel``'s cluster names, as a set (kept)."""
    names = self._selsets.get(sel)
    if names is None:
        names = self._selsets[sel] = frozenset(sel)
    return names


def _effect(self: Scheduler, e: tuple[Any, ...]) -> None:
    i = len(self._effects)
    if self._diverged is None:
        prev = self._prev_effects
        if i >= len(prev) or prev[i][:5] != e[:5]:
            self._diverged = i
    self._effects.append(e)


def _signature(self: Scheduler, q: _Queue) -> tuple[Any, ...]:
    """What a queue's visit depends on besides capacity (``_changes``), upstream
    holds and reservations, and the task history (``_Queue.hist_dep``)."""
    org = self.org
    orgd = _org_gated(org)
    return (q.epoch, q.spec, self._env_epoch, self._org_epoch if orgd else 0)


def _soft_since(self: Scheduler, pos: int, most: int) -> set[str] | None:
    """The clusters whose free capacity changed since capacity log position ``pos``,
    if nothing more than free capacity changed anywhere and at most ``most`` entries
    were logged since; else None (the log no longer reaches back that far, or a
    fresh answer is as cheap)."""
    i = pos - self._cap_base
    log = self._cap_log
    if i < 0 or len(log) - i > most:
        return None
    out: set[str] = set()
    for name, hard in log[i:]:
        if hard:
            return None
        out.add(name)
    return out
