"""The door (``scheduler.door.decide``): tables of submissions and their answers, and the
core's ``Scheduler.submit`` answering exactly as the door does."""

from __future__ import annotations

import math

import pytest
from headway.scheduler import Scheduler
from headway.scheduler.door import Bucket, Decision, QueueDoor, decide, refill, retry_after
from headway.scheduler.model import (
    ActionSpec,
    ClusterSpec,
    NodeGroup,
    OrgLimits,
    QueueSpec,
    QueueStatus,
    RateLimit,
)
from headway.scheduler.reasons import Reason
from headway.scheduler.resources import Pod

ACTIVE = QueueDoor()
FULL = Bucket()


def d(
    queue: QueueDoor | None = ACTIVE,
    *,
    org_rate: RateLimit | None = None,
    held: int = 0,
    org: Bucket = FULL,
    qb: Bucket = FULL,
    now: float = 100.0,
) -> Decision:
    return decide("q", queue, org_rate, held, org, qb, now)


@pytest.mark.parametrize(
    ("queue", "held", "want"),
    [
        (None, 0, Reason.UnknownQueue),
        (QueueDoor(QueueStatus.draining), 0, Reason.QueueDraining),
        (QueueDoor(QueueStatus.drained), 0, Reason.QueueDraining),
        (QueueDoor(depth=600), 599, None),
        (QueueDoor(depth=600), 600, Reason.QueueDepthExceeded),
        (QueueDoor(depth=600), 700, Reason.QueueDepthExceeded),
        (QueueDoor(depth=0), 0, Reason.QueueDepthExceeded),
        (QueueDoor(depth=None), 10**9, None),
        # Draining is checked before the depth.
        (QueueDoor(QueueStatus.draining, depth=1), 5, Reason.QueueDraining),
    ],
)
def test_queue_rules(queue: QueueDoor | None, held: int, want: Reason | None) -> None:
    got = d(queue, held=held)
    assert got.reason == want
    assert got.accepted is (want is None)
    # No rate limit: the buckets are left as they were.
    assert (got.org, got.queue) == (FULL, FULL)


def test_details_name_the_queue_and_the_limit() -> None:
    assert d(None).detail == "queue 'q' does not exist"
    assert d(QueueDoor(QueueStatus.draining)).detail == (
        "queue 'q' is draining and accepts no new work"
    )
    assert d(QueueDoor(depth=600), held=600).detail == (
        "queue 'q' holds 600 actions (waiting + running); its depth is 600"
    )
    limited = d(org_rate=RateLimit(10, 10), org=Bucket(0.5, 100.0))
    assert limited.detail == "the tenant's submit rate (10/s, burst 10) is exhausted"


R10 = RateLimit(per_second=10.0, burst=10.0)


@pytest.mark.parametrize(
    ("org", "now", "want", "tokens_after", "wait"),
    [
        # Never drawn from: full, one taken.
        (FULL, 5.0, None, 9.0, None),
        # Empty, no time passed: rejected; 0.1 s to the next token.
        (Bucket(0.0, 5.0), 5.0, Reason.RateLimited, 0.0, 0.1),
        # Refilled by 0.05 s at 10/s: half a token, still short.
        (Bucket(0.0, 5.0), 5.05, Reason.RateLimited, 0.5, 0.05),
        # Refilled by 0.25 s: two and a half tokens, one taken.
        (Bucket(0.0, 5.0), 5.25, None, 1.5, None),
        # Refilled for a long time: capped at the burst, one taken.
        (Bucket(0.0, 5.0), 500.0, None, 9.0, None),
        # Out of time order (a concurrent submitter decided later): no refill.
        (Bucket(0.5, 5.0), 4.0, Reason.RateLimited, 0.5, 0.05),
    ],
)
def test_org_rate_bucket(
    org: Bucket, now: float, want: Reason | None, tokens_after: float, wait: float | None
) -> None:
    got = d(org_rate=R10, org=org, now=now)
    assert got.reason == want
    assert got.org.tokens == pytest.approx(tokens_after)
    assert got.org.at == max(now, org.at if org.tokens is not None else now)
    if wait is None:
        assert got.retry_after is None
    else:
        assert got.retry_after == pytest.approx(wait)


def test_rate_is_charged_only_when_taken_in() -> None:
    org = Bucket(3.0, 100.0)
    for queue, held in ((None, 0), (QueueDoor(QueueStatus.draining), 0), (QueueDoor(depth=1), 1)):
        got = d(queue, org_rate=R10, held=held, org=org)
        assert not got.accepted
        assert got.org == org  # untouched: no token taken, no time moved


def test_a_lowered_burst_caps_the_kept_tokens() -> None:
    assert refill(Bucket(9.0, 5.0), RateLimit(1.0, 2.0), 5.0) == Bucket(2.0, 5.0)
    assert refill(Bucket(9.0, 5.0), RateLimit(1.0, 2.0), 4.0) == Bucket(2.0, 5.0)


@pytest.mark.parametrize(
    ("rate", "bucket", "want"),
    [
        (RateLimit(0.0, 5.0), Bucket(0.0, 0.0), None),  # never refills
        (RateLimit(1.0, 0.5), Bucket(0.5, 0.0), None),  # never holds a whole token
        (RateLimit(2.0, 5.0), Bucket(0.0, 0.0), 0.5),
        (RateLimit(2.0, 5.0), Bucket(1.5, 0.0), 0.0),
    ],
)
def test_retry_after(rate: RateLimit, bucket: Bucket, want: float | None) -> None:
    assert retry_after(bucket, rate) == want


def test_queue_and_org_buckets_take_a_token_only_together() -> None:
    q = QueueDoor(rate=RateLimit(1.0, 1.0))
    first = d(q, org_rate=R10, now=0.0)
    assert first.accepted
    assert (first.org.tokens, first.queue.tokens) == (9.0, 0.0)
    # The queue's bucket is empty: rejected, and the org's token stays.
    second = d(q, org_rate=R10, org=first.org, qb=first.queue, now=0.5)
    assert second.reason is Reason.RateLimited
    assert second.detail == "queue 'q''s submit rate (1/s, burst 1) is exhausted"
    assert second.org.tokens == pytest.approx(10.0)  # refilled (to the burst), none taken
    assert second.retry_after == pytest.approx(0.5)
    # Both empty: the wait is the longer one, and both are named.
    both = d(q, org_rate=R10, org=Bucket(0.0, 0.0), qb=Bucket(0.0, 0.0), now=0.0)
    assert both.retry_after == pytest.approx(1.0)
    assert "the tenant's submit rate" in both.detail and "queue 'q''s" in both.detail


def stream(rate: RateLimit, times: list[float]) -> list[Reason | None]:
    """Fold a stream of submissions through the door, keeping the bucket as the store does."""
    bucket = FULL
    out: list[Reason | None] = []
    for t in times:
        got = decide("q", ACTIVE, rate, 0, bucket, FULL, t)
        bucket = got.org
        out.append(got.reason)
    return out


def test_a_steady_stream_under_the_limit_is_never_rejected() -> None:
    # 5/s for 100 s against 10/s, burst 10 (the numbers).
    times = [i / 5 for i in range(500)]
    assert stream(R10, times) == [None] * 500


def test_a_burst_over_the_limit_is_cut_at_the_burst_plus_the_refill() -> None:
    # 30/s for one second: the 10 of the burst, then one every 0.1 s.
    times = [i / 30 for i in range(30)]
    got = stream(R10, times)
    accepted = sum(r is None for r in got)
    # Burst 10 at t=0, then a token every 0.1 s up to t=29/30: 9 more.
    assert accepted == 10 + math.floor((29 / 30) * 10)
    assert got[:10] == [None] * 10
    assert all(r in (None, Reason.RateLimited) for r in got)


# --- the core answers as the door does --------------------------------------------------

GI = 2**30


def core(queue: QueueSpec, org: OrgLimits) -> Scheduler:
    s = Scheduler(clusters=[ClusterSpec("c", (NodeGroup("n", 1, Pod(cpu=1000, memory=GI)),))])
    s.upsert_queue(queue)
    s.set_org(org)
    return s


def action(i: int, queue: str = "q", t: float = 0.0) -> ActionSpec:
    return ActionSpec(f"a{i}", queue, (Pod(cpu=500, memory=GI),), submit=t, seq=i)


def test_the_core_rejects_as_the_door_does() -> None:
    """A stream against depth and an org rate: the core's answers are the door's fold."""
    rate = RateLimit(4.0, 3.0)
    s = core(QueueSpec("q", depth=6), OrgLimits(submit_rate=rate))
    times = [i * 0.1 for i in range(40)]
    bucket, held = FULL, 0
    for i, t in enumerate(times):
        want = decide("q", QueueDoor(depth=6), rate, held, bucket, FULL, t)
        bucket = want.org
        got = s.submit(action(i, t=t), t)
        assert got == want.reason, (i, t)
        held += want.accepted
        assert (s.tokens, s.token_time) == (bucket.tokens, bucket.at)
    assert held == 6


def test_the_core_answers_unknown_and_draining_queues_through_the_door() -> None:
    s = core(QueueSpec("q", status=QueueStatus.draining), OrgLimits())
    assert s.submit(action(0, queue="nope"), 0.0) is Reason.UnknownQueue
    assert s.submit(action(1), 0.0) is Reason.QueueDraining


def test_a_submission_the_live_door_took_in_skips_the_door_in_the_core() -> None:
    s = core(QueueSpec("q", depth=1), OrgLimits(submit_rate=RateLimit(1.0, 1.0)))
    assert s.submit(action(0), 0.0) is None
    # Over the depth and the rate in the core's view, but decided already at the door
    # (against the store's backlog): taken, and the core's bucket is not charged.
    tokens = s.tokens
    assert s.submit(action(1), 0.0, door=False) is None
    assert s.tokens == tokens
    # An unknown queue is still unknown.
    assert s.submit(action(2, queue="nope"), 0.0, door=False) is Reason.UnknownQueue


# --- a queue's own submit rate ----------------------------------------------------------


def test_the_core_keeps_each_queues_bucket_as_the_door_does() -> None:
    """A stream to a queue with its own rate (and the org's): the core's answers and its
    kept queue bucket are the door's fold, and a second queue's bucket is its own."""
    q_rate, org_rate = RateLimit(2.0, 3.0), RateLimit(8.0, 10.0)
    s = core(QueueSpec("q", submit_rate=q_rate), OrgLimits(submit_rate=org_rate))
    s.upsert_queue(QueueSpec("free"))
    door = QueueDoor(rate=q_rate)
    org, qb = FULL, FULL
    answers = []
    for i, t in enumerate(i * 0.1 for i in range(30)):
        want = decide("q", door, org_rate, i, org, qb, t)
        org, qb = want.org, want.queue
        assert s.submit(action(i, t=t), t) == want.reason, (i, t)
        assert s.queue_buckets["q"] == qb
        answers.append(want.reason)
    # Burst 3 at t=0, then a token every 0.5 s up to t=2.9: 5 more.
    assert answers.count(None) == 3 + 5
    # The queue without a rate of its own is limited by the org's bucket only.
    assert s.submit(action(100, queue="free", t=3.0), 3.0) is None
    assert "free" not in s.queue_buckets


def test_a_queues_bucket_survives_a_snapshot_round_trip() -> None:
    s = core(QueueSpec("q", submit_rate=RateLimit(1.0, 2.0)), OrgLimits())
    assert [s.submit(action(i), 0.0) for i in range(3)] == [None, None, Reason.RateLimited]
    again = Scheduler.from_snapshot(s.to_snapshot())
    assert again.queue_buckets == s.queue_buckets == {"q": Bucket(0.0, 0.0)}
    # Continued from the snapshot: still empty at t=0.5, a token again at t=1.
    assert again.submit(action(3, t=0.5), 0.5) is Reason.RateLimited
    assert again.submit(action(4, t=1.0), 1.0) is None


def test_a_snapshot_from_before_queue_rates_loads_with_full_buckets() -> None:
    s = core(QueueSpec("q", submit_rate=RateLimit(1.0, 1.0)), OrgLimits())
    snap = s.to_snapshot()
    del snap["queue_tokens"]
    assert Scheduler.from_snapshot(snap).queue_buckets == {}


def test_a_removed_queue_forgets_its_bucket() -> None:
    s = core(QueueSpec("q", submit_rate=RateLimit(1.0, 1.0)), OrgLimits())
    s.upsert_queue(QueueSpec("gone", submit_rate=RateLimit(1.0, 1.0)))
    assert s.submit(action(0, queue="gone"), 0.0) is None
    assert "gone" in s.queue_buckets
    s.cancel("a0", 0.0)
    s.remove_queue("gone")
    assert "gone" not in s.queue_buckets
    # A queue of that name made again starts with a full bucket.
    s.upsert_queue(QueueSpec("gone", submit_rate=RateLimit(1.0, 1.0)))
    assert s.submit(action(1, queue="gone"), 0.0) is None
