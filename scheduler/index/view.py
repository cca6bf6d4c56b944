"""The index layer's public surface: what its remembered answers say, read without its
private names. Nothing here changes what the scheduler decides; an answer read here is
the one the next visit would read (made if it is not kept), so a test can tell a kept
answer from one made again by identity.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..core import Scheduler
    from ..fit import ClusterState


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
    pass (at most ``policy.backfill.HOLD_PAIRS_MAX``)."""
    return len(s._hold_pairs)
