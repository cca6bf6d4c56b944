"""Remembered orders: the queues' visiting order and the clusters' placement order per
selector, kept from pass to pass, and the one place that says when each still stands.
The rules they remember are pure functions of ``policy/order.py`` (``queue_key``,
``cluster_key``, ``placement_order``).

- A cluster's key (``_order_key``): kept on the cluster (``okey``, ``okey_at``) while
  its free state (its ``version``) and ``known`` stand.
- The visiting order (``_qorder``, ``_qkeyed``, ``_qkeys``): stands but for the queues
  marked since (``_qdirty``, by ``_mark_head`` wherever a head may have changed, a queue
  joined or left); ``_qdirty`` None (a policy changed: ``upsert_queue``,
  ``remove_queue``) sorts all of it again (``_reorder``).
- The placement order of a selector's healthy clusters (``_orders``): stands while the
  capacity log's end is the same; across changes of free capacity only (``_soft_since``)
  the clusters that moved are put back where their new keys go; else made again.
  ``invalidate`` forgets it.
"""

from __future__ import annotations

from bisect import bisect_left
from typing import TYPE_CHECKING

from ..common import _FIRST, _SCAN_MIN
from ..policy.order import cluster_key, placement_order, queue_key

if TYPE_CHECKING:
    from typing import Any

    from ..core import Scheduler
    from ..fit import ClusterState
    from ..truth import _Queue


def _order_key(c: ClusterState) -> tuple[Any, ...]:
    """``policy.order.cluster_key``, kept on the cluster while its free state (its
    version) and ``known`` stand: the key is asked for again and again (orders,
    re-checks, reservations), and one tuple shared by them all is less work, and fewer
    young objects for the collector, than one each."""
    at = c.version if c.known else -1 - c.version
    if c.okey_at == at:
        return c.okey
    k = cluster_key(c)
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
    File order breaks ties within a queue only (see ``queue_key``)."""
    dirty = self._qdirty
    keyed = self._qkeyed
    order = self._qorder
    keys = self._qkeys
    if dirty is None:
        keyed = [queue_key(q) for q in self.queues.values() if q.waiting]
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
                k = queue_key(q)
                i = bisect_left(keyed, k)
                keyed.insert(i, k)
                order.insert(i, q)
                keys[name] = k
    self._qorder = order
    self._qdirty = {}


def _placement_order(
    self: Scheduler, cs: list[ClusterState], env: str | None
) -> list[ClusterState]:
    """``policy.order.placement_order`` for an action of environment ``env``, with the
    clusters' kept keys (made anew per call: callers may keep it)."""
    pref = self.undeclared_env.get(env) if env else None
    return placement_order(cs, pref, _order_key)


def _base_order(
    self: Scheduler, sel: tuple[str, ...] | None, elig: list[ClusterState] | None
) -> list[ClusterState]:
    """``placement_order(elig, None)`` for selector ``sel`` (``elig``: its healthy
    clusters, None: found here if needed), kept while the capacity log stands
    still (see the module's docstring). Callers must not change it."""
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
        base = placement_order(elig, None, _order_key)
        self._orders[sel] = (cap_end, base, [], {})
        return base
    # ``placement_order(elig, None)``, keeping the keys.
    pairs = sorted([(_order_key(c), c) for c in elig], key=_FIRST)
    base = [c for _, c in pairs]
    self._orders[sel] = (cap_end, base, [k for k, _ in pairs], {c.name: k for k, c in pairs})
    return base
