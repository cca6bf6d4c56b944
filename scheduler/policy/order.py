"""Ordering, as pure rules over ground truth: which queue is visited first
(``queue_key``), and which cluster an action tries first (``cluster_key``,
``placement_order``).

Nothing here remembers anything: the orders kept from pass to pass (the visiting order,
the placement order per selector) and when they still stand are the index layer's,
``scheduler/index/orders.py``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from typing import Any

    from ..fit import ClusterState
    from ..truth import _Queue


def queue_key(q: _Queue) -> tuple[Any, ...]:
    """A queue's place in the visiting order (it has work waiting): priority
    descending; among equals, the queue whose head was submitted first; then by name.
    The queue itself ends the key and is never compared (names are unique)."""
    return (-q.spec.priority, q.waiting[0].submit, q.spec.name, q)


def cluster_key(c: ClusterState) -> tuple[Any, ...]:
    """A cluster's place in the placement order of an action with no environment:
    clusters of known capacity first, then the most free GPU, then CPU, then the name
    (unique, so no two keys are equal)."""
    if c.known:
        return (1, 0, -c.tgpu, -c.tcpu, c.name)
    return (1, 1, 0, 0, c.name)


def placement_order(
    cs: Iterable[ClusterState],
    pref: Mapping[str, int] | None,
    key: Callable[[ClusterState], tuple[Any, ...]] = cluster_key,
) -> list[ClusterState]:
    """The clusters ``cs`` in the order an action tries them: those where its warm
    undeclared environment runs (``pref``: cluster -> instances) first, then by
    ``cluster_key``. ``key`` is ``cluster_key`` or an equal one (the index layer passes
    the key kept on each cluster)."""
    if not pref:
        return sorted(cs, key=key)
    return sorted(cs, key=lambda c: (0 if pref.get(c.name) else 1, *key(c)[1:]))
