"""Fair share of one control-plane worker between shards (tenants).

Every shard's scheduler hands its admissions to this worker's dispatch activity, which
signals the action workflows. A shard draining a big backlog can keep that up at several
hundred signals a second, and each signal costs the worker and the Temporal server CPU
(and the dev server's one history shard, its writes). Another shard's five-action run
then waits behind that work at every step, though it asks for almost nothing.

So, while another shard has *interactive* work on this worker (an action of it wrote or
ended its lease within ``active_s``), a shard's signals are paced by a token bucket:
``burst`` at once, then ``rate`` per second. Alone, a shard is never paced: the policy is
work-conserving, like Armada's per-queue scheduling rate but only under contention.
Admissions handed over in-process (the action still waits in its first task) are not
signals and are never paced, so a small shard's own admissions do not wait at all.

Measured (bench/scheduler_history.py isolation): a 5-action run of one shard took
1.3-1.6x as long while another shard drained a 10k backlog in bites without pacing, and
1.06-1.11x with it (the 10k drained in 9.5-12.7 s, against ~20 s in 500-lease pieces).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

__all__ = ["DEFAULT_CONTENDED_RATE", "ShardFairness"]

#: Signals per second a shard may send while another shard has interactive work.
DEFAULT_CONTENDED_RATE = 100.0


@dataclass
class _Bucket:
    tokens: float
    at: float


class ShardFairness:
    """Paces a shard's signals while another shard has interactive work on this worker.

    Args:
        rate: signals per second per shard while contended; 0 turns pacing off.
        burst: signals a shard may send at once before the rate applies.
        active_s: how long after its latest lease write or end a shard counts as
            having interactive work.
        clock: monotonic seconds (a seam for tests).
        sleep: awaitable sleep (a seam for tests).
    """

    def __init__(
        self,
        rate: float = DEFAULT_CONTENDED_RATE,
        burst: int = 20,
        active_s: float = 1.0,
        *,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        if not rate >= 0:
            raise ValueError(f"rate: {rate!r} is not a number of signals per second >= 0")
        if burst < 1:
            raise ValueError(f"burst: {burst!r} is not a positive number of signals")
        self.rate = float(rate)
        self.burst = burst
        self.active_s = active_s
        self._clock = clock
        self._sleep = sleep
        self._active: dict[str, float] = {}
        self._buckets: dict[str, _Bucket] = {}
        #: Waits for a token so far, and the seconds waited in all (stats, tests).
        self.waits = 0
        self.waited_s = 0.0

    def touch(self, tenant: str) -> None:
        """``tenant`` has interactive work now (an action wrote or ended its lease)."""
        self._active[tenant] = self._clock()

    def contended(self, tenant: str) -> bool:
        """Whether another shard had interactive work within ``active_s``."""
        now = self._clock()
        stale = [t for t, at in self._active.items() if now - at >= self.active_s]
        for t in stale:
            del self._active[t]
        return any(t != tenant for t in self._active)

    def now(self) -> float:
        """This policy's clock (monotonic seconds)."""
        return self._clock()

    async def pace(self, tenant: str, until: float | None = None) -> None:
        """Wait until ``tenant`` may send one more signal.

        Args:
            tenant: the sending shard.
            until: on this policy's clock (``now()``), when pacing stops for this
                sender: no wait reaches past it, and after it signals go at once. A
                dispatch sets it within its own timeout, so that however low the rate,
                a paced batch is never cut off by its timeout and retried (paced again)
                for ever.
        """
        if self.rate <= 0:
            return
        if not self.contended(tenant):
            # Uncontended: full speed, and a full burst when contention starts.
            self._buckets.pop(tenant, None)
            return
        now = self._clock()
        if until is not None and now >= until:
            return
        b = self._buckets.get(tenant)
        if b is None:
            b = self._buckets[tenant] = _Bucket(float(self.burst), now)
        b.tokens = min(float(self.burst), b.tokens + (now - b.at) * self.rate)
        b.at = now
        # Take the token now, even one not there yet: concurrent senders queue up one
        # interval apart instead of all waking for the same token.
        b.tokens -= 1
        if b.tokens >= 0:
            return
        wait = -b.tokens / self.rate
        if until is not None:
            wait = min(wait, until - now)
        self.waits += 1
        self.waited_s += wait
        await self._sleep(wait)
