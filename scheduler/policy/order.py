"""Ordering: which queue is visited first (``_qkey``), and which cluster an action
tries first (``_order_key``, ``_placement_order``).
"""

from __future__ import annotations

from bisect import bisect_left
from typing import TYPE_CHECKING

from ..common import _FIRST, _SCAN_MIN

if TYPE_CHECKING:
    from typing import Any

    from ..core import Scheduler
    from ..fit import ClusterState
    from ..truth import _Queue


def _qkey(q: _Queue) -> tuple[Any, ...]:
    """A queue's place in the visiting order (it has work waiting): priority, its head's
    submit time, its name; the queue last (never compared: names are unique)."""
    return (-q.spec.priority, q.waiting[0].submit, q.spec.name, q)


def _order_key(c: ClusterState) -> tuple[Any, ...]:
    """``Scheduler._placement_order``'s key for an action with no environment.

    Kept on the cluster while its free state (its version) and ``known`` stand: the
    key is asked for again and again (orders, re-checks, reservations), and one tuple
    shared by them all is less work, and fewer young objects for the collector, than
    one each.
    """
    at = c.version if c.known else -1 - c.version
    if c.okey_at == at:
        return c.okey
    k = (1, 0, -c.tgpu, -c.tcpu, c.name) if c.known else (1, 1, 0, 0, c.name)
    c.okey = k
    c.okey_at = at
    return k


def _mark_head(self: Scheduler, q: _Queue) -> None:
    """``q``'s head may have changed (or it may have joined or left the visiting
    order): the next pass puts it back where it now goes."""
    if self._qdirty is not None:
        self._qdirty[q] = None


def _reorder(self: Scheduler) -> None:
    """Bring the visiting order up to date: all of it after a policy change, else
    only the queues whose head may have changed (an admission moves one queue's
    head: sorting every queue again after it was a tenth of an admitting event).

    Equal priority: the queue whose next action was submitted first, then by name.
    File order breaks ties within a queue only. (Names are unique, so the queue
    itself is never compared.)
    """
    dirty = self._qdirty
    keyed = self._qkeyed
    order = self._qorder
    keys = self._qkeys
    if dirty is None:
        keyed = [_qkey(q) for q in self.queues.values() if q.waiting]
        keyed.sort()
        self._qkeyed = keyed
        self._qkeys = {k[2]: k for k in keyed}
        order = [k[3] for k in keyed]
    else:
        for q in dirty:
            name = q.spec.name
            old = keys.pop(name, None)
            if old is not None:
                # Keys are unique (the name is in them): this finds it exactly.
                i = bisect_left(keyed, old)
                del keyed[i]
                del order[i]
            if q.waiting and self.queues.get(name) is q:
                k = _qkey(q)
                i = bisect_left(keyed, k)
                keyed.insert(i, k)
                order.insert(i, q)
                keys[name] = k
    self._qorder = order
    self._qdirty = {}


def _placement_order(
    self: Scheduler, cs: list[ClusterState], env: str | None
) -> list[ClusterState]:
    pref = self.undeclared_env.get(env) if env else None
    if not pref:
        return sorted(cs, key=_order_key)
    return sorted(cs, key=lambda c: (0 if pref.get(c.name) else 1, *_order_key(c)[1:]))


def _base_order(
    self: Scheduler, sel: tuple[str, ...] | None, elig: list[ClusterState] | None
) -> list[ClusterState]:
    """``_placement_order(elig, None)`` for selector ``sel`` (``elig``: its healthy
    clusters, None: found here if needed), kept while the capacity log stands
    still. Callers must not change it."""
    cap_end = self._cap_base + len(self._cap_log)
    hit = self._orders.get(sel)
    if hit is not None:
        if hit[0] == cap_end:
            return hit[1]
        moved = self._soft_since(hit[0], len(hit[1]) // 4) if hit[2] else None
        if moved is not None:
            # Only the clusters in ``moved`` changed, and only in free capacity: the
            # same clusters, the others keep their keys. Keys are unique (the name
            # ends them), so taking the moved ones out and putting them back where
            # their new keys go is the sort itself.
            base, keys, kd = hit[1][:], hit[2][:], dict(hit[3])
            for n in moved:
                k = kd.get(n)
                if k is None:
                    continue  # not one of ``elig``
                i = bisect_left(keys, k)
                del keys[i]
                c = base.pop(i)
                k = kd[n] = _order_key(c)
                i = bisect_left(keys, k)
                keys.insert(i, k)
                base.insert(i, c)
            self._orders[sel] = (cap_end, base, keys, kd)
            return base
    if elig is None:
        elig = [
            c
            for c in (
                self.clusters.values()
                if sel is None
                else (self.clusters[n] for n in sel if n in self.clusters)
            )
            if c.healthy
        ]
    if len(elig) <= _SCAN_MIN:
        base = sorted(elig, key=_order_key)
        self._orders[sel] = (cap_end, base, [], {})
        return base
    # ``_placement_order(elig, None)``, keeping the keys.
    pairs = sorted([(_order_key(c), c) for c in elig], key=_FIRST)
    base = [c for _, c in pairs]
    self._orders[sel] = (cap_end, base, [k for k, _ in pairs], {c.name: k for k, c in pairs})
    return base
