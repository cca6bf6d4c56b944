"""The live door: ``LeaseStore.put_lease`` decides each submission (``scheduler.door``) in
the transaction that writes its lease, against the settings the scheduler pushed
(``set_door``), the queue's leases not yet ended and the buckets kept in SQL. SQLite, and
PostgreSQL when HEADWAY_TEST_POSTGRES_URL is set."""

from __future__ import annotations

import threading

import pytest
from headway.scheduler.door import QueueDoor
from headway.scheduler.model import QueueStatus, RateLimit
from headway.scheduler.reasons import Reason
from headway.store import WANTS_ENDS_CHANNEL, LeaseStore, Put

from .test_leases import spec


def put(s: LeaseStore, t: str, i: int, queue: str = "q", at: float = 0.0) -> Put:
    return s.put_lease(t, f"a{i}", queue, f"wf-a{i}", spec(i, queue), at)


def reasons(puts: list[Put]) -> list[Reason | None]:
    return [p.refused.reason if p.refused is not None else None for p in puts]


def test_without_a_door_every_submission_passes(store: LeaseStore, tenant: str) -> None:
    """A tenant whose scheduler never pushed its settings: its scheduler decides later."""
    got = put(store, tenant, 0, "no-such-queue")
    assert got.refused is None and got.nudge
    lease = store.sync(tenant, "s1", {}).leases[0]
    assert "door" not in lease  # the scheduler applies the door's rules itself


def test_unknown_and_draining_queues_are_refused(store: LeaseStore, tenant: str) -> None:
    store.set_door(tenant, None, {"q": QueueDoor(), "d": QueueDoor(QueueStatus.draining)})
    got = [put(store, tenant, 0, "nope"), put(store, tenant, 1, "d"), put(store, tenant, 2, "")]
    assert reasons(got) == [Reason.UnknownQueue, Reason.QueueDraining, Reason.UnknownQueue]
    assert got[0].refused is not None and got[0].refused.detail == "queue 'nope' does not exist"
    assert not any(p.nudge for p in got)
    assert store.lease_count(tenant) == 0  # nothing written
    ok = put(store, tenant, 3, "q")
    assert ok.refused is None and ok.nudge
    # Taken in at the door: the scheduler is told not to decide the door's rules again.
    assert store.sync(tenant, "s1", {"q": 10}).leases[0]["door"] is True


def test_depth_counts_the_whole_backlog_pending_and_claimed(store: LeaseStore, tenant: str) -> None:
    """Depth 600, 700 submissions: exactly 100 refused, whatever the scheduler claimed."""
    store.set_door(tenant, None, {"q": QueueDoor(depth=600)})
    got = [put(store, tenant, i) for i in range(300)]
    store.sync(tenant, "s1", {"q": 250})  # 250 in the scheduler's window, 50 still pending
    got += [put(store, tenant, i) for i in range(300, 700)]
    assert reasons(got).count(Reason.QueueDepthExceeded) == 100
    assert reasons(got)[:600] == [None] * 600
    refused = got[600].refused
    assert refused is not None
    assert refused.detail == "queue 'q' holds 600 actions (waiting + running); its depth is 600"
    assert store.held_count(tenant, "q") == 600 == store.lease_count(tenant)


def test_an_end_frees_room_at_once(store: LeaseStore, tenant: str) -> None:
    store.set_door(tenant, None, {"q": QueueDoor(depth=2)})
    assert reasons([put(store, tenant, i) for i in range(3)]) == [
        None,
        None,
        Reason.QueueDepthExceeded,
    ]
    store.sync(tenant, "s1", {"q": 10})
    store.finish_lease(tenant, "a0", "finished")  # ended, not yet collected: not held
    assert put(store, tenant, 3).refused is None
    store.finish_lease(tenant, "a3", "cancelled")  # pending: deleted
    assert put(store, tenant, 4).refused is None
    assert put(store, tenant, 5).refused is not None


def test_a_retried_put_is_taken_again_uncharged(store: LeaseStore, tenant: str) -> None:
    """A put retried after its commit (lost answer) is not refused by its own lease."""
    store.set_door(tenant, RateLimit(1.0, 1.0), {"q": QueueDoor(depth=1)})
    first = put(store, tenant, 0, at=5.0)
    assert first.refused is None
    tokens = store.door(tenant)[""]["tokens"]
    again = put(store, tenant, 0, at=5.0)
    assert again.refused is None and again.nudge  # nudges again, as before the door
    assert store.door(tenant)[""]["tokens"] == tokens
    assert store.lease_count(tenant) == 1


def test_a_steady_stream_under_the_rate_is_never_refused(store: LeaseStore, tenant: str) -> None:
    store.set_door(tenant, RateLimit(10.0, 10.0), {"q": QueueDoor()})
    got = [put(store, tenant, i, at=1000.0 + i / 5) for i in range(50)]  # 5/s for 10 s
    assert reasons(got) == [None] * 50


def test_a_burst_over_the_rate_is_refused_at_once(store: LeaseStore, tenant: str) -> None:
    store.set_door(tenant, RateLimit(10.0, 10.0), {"q": QueueDoor()})
    got = [put(store, tenant, i, at=1000.0 + i / 30) for i in range(30)]  # 30/s for 1 s
    rs = reasons(got)
    assert rs[:10] == [None] * 10
    # Burst 10, then one token every 0.1 s of the remaining 29/30 s.
    assert rs.count(None) == 19 and rs.count(Reason.RateLimited) == 11
    limited = next(p.refused for p in got if p.refused is not None)
    assert limited is not None and limited.retry_after is not None
    assert 0 < limited.retry_after <= 0.1
    assert limited.detail == "the tenant's submit rate (10/s, burst 10) is exhausted"
    assert store.lease_count(tenant) == 19  # nothing left behind by the refused


def test_queue_rates_and_settings_changes(store: LeaseStore, tenant: str) -> None:
    store.set_door(tenant, None, {"q": QueueDoor(rate=RateLimit(0.0, 2.0)), "r": QueueDoor()})
    assert reasons([put(store, tenant, i, at=1.0) for i in range(3)]) == [
        None,
        None,
        Reason.RateLimited,
    ]
    assert put(store, tenant, 3, "r").refused is None  # another queue's bucket
    # Raising the burst keeps the bucket (empty) until it refills: a rate of 0 never does.
    store.set_door(tenant, None, {"q": QueueDoor(rate=RateLimit(1.0, 5.0))})
    assert store.door(tenant)["q"]["tokens"] == 0.0
    assert put(store, tenant, 4, at=1.5).refused is not None
    assert put(store, tenant, 5, at=2.0).refused is None
    # A queue left out of the settings has no door any more.
    assert put(store, tenant, 6, "r").refused is not None
    assert set(store.door(tenant)) == {"", "q"}


def test_a_batch_is_decided_in_its_order(store: LeaseStore, tenant: str) -> None:
    store.set_door(tenant, None, {"q": QueueDoor(depth=2), "r": QueueDoor(depth=1)})
    ops: list[tuple[str, tuple[object, ...]]] = [
        ("put", (tenant, f"a{i}", q, f"wf-a{i}", spec(i, q), 0.0))
        for i, q in enumerate(["q", "r", "q", "r", "q"])
    ]
    got = store.apply(ops)
    assert reasons([p for p in got if isinstance(p, Put)]) == [
        None,
        None,
        None,
        Reason.QueueDepthExceeded,
        Reason.QueueDepthExceeded,
    ]


def test_busy_says_work_waits_in_the_shard(store: LeaseStore, tenant: str) -> None:
    store.set_door(tenant, None, {"q": QueueDoor()})
    assert not put(store, tenant, 0).busy
    store.sync(tenant, "s1", {"q": 10}, wants_ends=True)
    assert store.flag(tenant, WANTS_ENDS_CHANNEL)
    assert put(store, tenant, 1).busy


def test_concurrent_submitters_never_pass_the_depth_or_the_burst(
    store: LeaseStore, tenant: str
) -> None:
    """Several workers at once (on PostgreSQL, concurrent transactions): the door's count
    and buckets are read and written by one of them at a time."""
    store.set_door(tenant, RateLimit(0.0, 40.0), {"q": QueueDoor(depth=30), "r": QueueDoor()})
    got: list[Put] = []
    lock = threading.Lock()

    def worker(w: int) -> None:
        for i in range(25):
            q = "q" if i % 2 else "r"
            ops: list[tuple[str, tuple[object, ...]]] = [
                ("put", (tenant, f"w{w}-{i}", q, "wf", spec(i, q), 1.0))
            ]
            res = store.apply(ops)
            with lock:
                got.extend(p for p in res if isinstance(p, Put))

    threads = [threading.Thread(target=worker, args=(w,)) for w in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    # 100 submissions, 40 tokens in all (the rate never refills), at most 30 in "q".
    assert sum(p.refused is None for p in got) == 40 == store.lease_count(tenant)
    assert store.held_count(tenant, "q") <= 30


def test_set_door_rejects_an_empty_queue_name(store: LeaseStore, tenant: str) -> None:
    with pytest.raises(ValueError, match="queue: '' is not a queue name"):
        store.set_door(tenant, None, {"": QueueDoor()})
