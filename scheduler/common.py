"""Small values shared by the core's modules: constants, key getters, and the
reservation record a backfill head leaves on a cluster.
"""

from __future__ import annotations

from operator import attrgetter, itemgetter

from .fit import ClusterState
from .resources import Usage

_ZERO = Usage()


_INF = float("inf")


_POS = attrgetter("pos")


_BY_TIME_SEQ = itemgetter(0, 1)


_FIRST = itemgetter(0)


_NAME = attrgetter("name")


# more than it saves), and ``Scheduler._base_order`` sorts them afresh.
_SCAN_MIN = 4


# clusters to hold.
_ScanOut = tuple[tuple[float, ClusterState, ClusterState | None] | None, list[str]]


# storage, gpu by then).
_Step = tuple[float, int, int, int, int, int]


class _Reservation:
    """A head's reservation: when, and (EASY) what its projected placement leaves.

    ``shared``: ``extra`` is a cached projection (see ``Scheduler._earliest_fit``),
    copied only when an admission first uses it up (``Scheduler._use_up``).
    """

    __slots__ = ("extra", "head", "shared", "time")

    def __init__(
        self, time: float, extra: ClusterState | None, head: str, shared: bool = False
    ) -> None:
        self.time = time
        self.extra = extra
        self.head = head
        self.shared = shared
