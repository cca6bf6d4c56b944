"""The door: whether one submission is taken in, decided from plain data.

This is the rule, once. Two places take submissions and both call :func:`decide`:

* the core's ``Scheduler.submit`` (``headway simulate``, scenario files, the tests), with
  the queue's waiting and running actions as what it holds;
* the lease store's ``put_lease`` (the live door), in the same transaction that writes
  the lease, with the queue's lease rows not yet ended as what it holds (the store's
  backlog beyond the scheduler's window included) and the token buckets kept in SQL.

So a simulation and the live door cannot disagree on a submission given the same
settings, the same count and the same bucket states. Pure: no clock (the submission's
time is an argument), no I/O.

The checks, in order: the queue exists, it is active, it holds fewer than ``depth``
actions, and a token is in every bucket that applies (the tenant's ``submit_rate`` and
the queue's own). A submission takes one token from each bucket only when it is taken
in; a rejected one takes none. Buckets refill continuously at ``per_second`` up to
``burst``; a bucket never drawn from is full.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .model import QueueSpec, QueueStatus, RateLimit
from .reasons import Reason

__all__ = ["Bucket", "Decision", "QueueDoor", "decide", "refill", "retry_after"]


@dataclass(frozen=True, slots=True)
class Bucket:
    """A token bucket's state: ``tokens`` as of time ``at``; None: never drawn from (full)."""

    tokens: float | None = None
    at: float = 0.0


@dataclass(frozen=True, slots=True)
class QueueDoor:
    """What the door needs of a queue: its status, its depth and its own submit rate."""

    status: QueueStatus = QueueStatus.active
    depth: int | None = None
    rate: RateLimit | None = None

    @staticmethod
    def of(spec: QueueSpec) -> QueueDoor:
        return QueueDoor(spec.status, spec.depth, spec.submit_rate)


@dataclass(frozen=True, slots=True)
class Decision:
    """The door's answer.

    Attributes:
        reason: None when the submission is taken in, else why not (one of
            ``UnknownQueue``, ``QueueDraining``, ``QueueDepthExceeded``, ``RateLimited``).
        org: the tenant's bucket after this decision (what to keep).
        queue: the queue's bucket after this decision.
        retry_after: ``RateLimited`` only: seconds until every empty bucket has a token
            again (None: never, the rate is 0 or the burst below one token).
        detail: the facts behind a rejection, for people (names the limit and its value).
    """

    reason: Reason | None
    org: Bucket
    queue: Bucket
    retry_after: float | None = None
    detail: str = ""

    @property
    def accepted(self) -> bool:
        return self.reason is None


def refill(bucket: Bucket, rate: RateLimit, now: float) -> Bucket:
    """``bucket`` refilled up to ``now``.

    Time never runs backwards for a bucket: submissions decided out of their time order
    (concurrent submitters) refill nothing and leave ``at`` where it was, so no interval
    is ever counted twice.
    """
    if bucket.tokens is None:
        return Bucket(rate.burst, now)
    if now <= bucket.at:
        return Bucket(min(rate.burst, bucket.tokens), bucket.at)
    return Bucket(min(rate.burst, bucket.tokens + (now - bucket.at) * rate.per_second), now)


def retry_after(bucket: Bucket, rate: RateLimit) -> float | None:
    """Seconds until a refilled ``bucket`` holds one token (0 if it does; None: never)."""
    tokens = rate.burst if bucket.tokens is None else bucket.tokens
    if tokens >= 1.0:
        return 0.0
    if rate.burst < 1.0 or rate.per_second <= 0.0:
        return None
    return (1.0 - tokens) / rate.per_second


def decide(
    name: str,
    queue: QueueDoor | None,
    org_rate: RateLimit | None,
    held: int,
    org: Bucket,
    queue_bucket: Bucket,
    now: float,
) -> Decision:
    """Decide a submission to queue ``name`` at time ``now``.

    Args:
        name: the queue the submission names (for the detail).
        queue: the queue's door settings; None: there is no such queue.
        org_rate: the tenant's ``submit_rate`` (None: unlimited).
        held: the actions the queue holds now (waiting + running), this one not counted.
        org: the tenant's bucket as last kept.
        queue_bucket: the queue's bucket as last kept.
        now: the submission's time.
    """
    if queue is None:
        return Decision(
            Reason.UnknownQueue, org, queue_bucket, detail=f"queue {name!r} does not exist"
        )
    if queue.status is not QueueStatus.active:
        return Decision(
            Reason.QueueDraining,
            org,
            queue_bucket,
            detail=f"queue {name!r} is {queue.status.value} and accepts no new work",
        )
    if queue.depth is not None and held >= queue.depth:
        return Decision(
            Reason.QueueDepthExceeded,
            org,
            queue_bucket,
            detail=f"queue {name!r} holds {held} actions (waiting + running); its depth is "
            f"{queue.depth}",
        )
    # Both buckets are refilled (and so their time moves) whatever the answer, as the
    # core always kept its bucket; a token is taken from each only if both have one.
    new_org = refill(org, org_rate, now) if org_rate is not None else org
    new_q = refill(queue_bucket, queue.rate, now) if queue.rate is not None else queue_bucket
    short: list[tuple[str, Bucket, RateLimit]] = []
    if org_rate is not None and _tokens(new_org) < 1.0:
        short.append(("the tenant's submit rate", new_org, org_rate))
    if queue.rate is not None and _tokens(new_q) < 1.0:
        short.append((f"queue {name!r}'s submit rate", new_q, queue.rate))
    if short:
        waits = [retry_after(b, r) for _, b, r in short]
        wait = None if any(w is None for w in waits) else max(w for w in waits if w is not None)
        what = " and ".join(f"{label} ({_rate(r)})" for label, _, r in short)
        return Decision(
            Reason.RateLimited,
            new_org,
            new_q,
            retry_after=wait,
            detail=f"{what} is exhausted",
        )
    if org_rate is not None:
        new_org = Bucket(_tokens(new_org) - 1.0, new_org.at)
    if queue.rate is not None:
        new_q = Bucket(_tokens(new_q) - 1.0, new_q.at)
    return Decision(None, new_org, new_q)


def _tokens(b: Bucket) -> float:
    assert b.tokens is not None  # refilled
    return b.tokens


def _rate(r: RateLimit) -> str:
    return f"{_num(r.per_second)}/s, burst {_num(r.burst)}"


def _num(v: float) -> str:
    return str(int(v)) if math.isfinite(v) and v == int(v) else f"{v:g}"
