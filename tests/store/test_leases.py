"""LeaseStore against SQLite, and PostgreSQL when HEADWAY_TEST_POSTGRES_URL is set."""

from __future__ import annotations

import asyncio
import os
import sqlite3
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from headway.store import DONE_CHANNEL, LeaseStore, Nudge, Put, queue_channel

PG = os.environ.get("HEADWAY_TEST_POSTGRES_URL")
BACKENDS = ["sqlite", *(["postgresql"] if PG else [])]


def spec(i: int, queue: str = "q") -> dict[str, object]:
    return {"id": f"a{i}", "queue": queue, "pods": [{"cpu": 100, "memory": 1}]}


def put(store: LeaseStore, tenant: str, i: int, queue: str = "q") -> bool:
    """A put's nudge (no door here: every put is taken in)."""
    got = store.put_lease(tenant, f"a{i}", queue, f"wf-a{i}", spec(i, queue), float(i))
    assert got.refused is None
    return got.nudge


def nudges(results: list[Nudge | Put] | None) -> list[Nudge] | None:
    """A batch's answers with each put's as the Nudge it asks for."""
    if results is None:
        return None
    return [(Nudge.NOW if r.nudge else Nudge.NONE) if isinstance(r, Put) else r for r in results]


def sync_beside(threads: list[threading.Thread], step: Callable[[int], object]) -> int:
    """Start ``threads``; call ``step(1)``, ``step(2)``, ... while any runs. Returns the
    number of steps (the next sync token number is one more)."""
    for t in threads:
        t.start()
    n = 0
    while any(t.is_alive() for t in threads):
        n += 1
        step(n)
    for t in threads:
        t.join()
    return n


def test_only_the_first_submitter_nudges_until_the_scheduler_reads(
    store: LeaseStore, tenant: str
) -> None:
    assert put(store, tenant, 0) is True
    assert [put(store, tenant, i) for i in range(1, 50)] == [False] * 49
    res = store.sync(tenant, "run:1", {"q": 10})
    assert [d["id"] for d in res.leases] == [f"a{i}" for i in range(10)]
    assert res.leases[0]["workflow_id"] == "wf-a0" and res.leases[3]["submit"] == 3.0
    assert res.more == ["q"]
    # Leases are left behind: the scheduler comes back for them by itself, and a new
    # one could not be claimed before them anyway, so the flag stays set.
    assert store.flag(tenant, queue_channel("q")) is True
    assert put(store, tenant, 50) is False
    res = store.sync(tenant, "run:2", {"q": 100})
    assert len(res.leases) == 41 and res.more == []
    assert store.flag(tenant, queue_channel("q")) is False
    assert put(store, tenant, 51) is True  # the scheduler read the queue dry: nudge again


def test_full_window_keeps_flag_set_so_submitters_stay_silent(
    store: LeaseStore, tenant: str
) -> None:
    put(store, tenant, 0)
    res = store.sync(tenant, "run:1", {"q": 0})
    assert res.leases == [] and res.more == ["q"]
    assert put(store, tenant, 1) is False


def test_a_full_window_whose_leases_were_all_cancelled_leaves_no_flag_behind(
    store: LeaseStore, tenant: str
) -> None:
    """The scheduler gives the queue no room (its window is full) and finds nothing
    pending: the flag is cleared, though the queue is not read."""
    assert put(store, tenant, 0) is True
    assert store.finish_lease(tenant, "a0", "cancelled") is Nudge.NONE
    res = store.sync(tenant, "run:1", {"q": 0})
    assert res.leases == [] and res.more == []
    assert put(store, tenant, 1) is True  # else a1 would wait for a refill never due


def test_retried_sync_returns_the_same_claims(store: LeaseStore, tenant: str) -> None:
    for i in range(5):
        put(store, tenant, i)
    first = store.sync(tenant, "run:7", {"q": 3})
    again = store.sync(tenant, "run:7", {"q": 3})
    assert [d["id"] for d in again.leases] == [d["id"] for d in first.leases] == ["a0", "a1", "a2"]
    nxt = store.sync(tenant, "run:8", {"q": 3})
    assert [d["id"] for d in nxt.leases] == ["a3", "a4"]
    assert nxt.more == []


def test_ends_are_handed_over_once_and_collected(store: LeaseStore, tenant: str) -> None:
    for i in range(3):
        put(store, tenant, i)
    store.sync(tenant, "r:1", {"q": 10}, wants_ends=True)
    assert store.finish_lease(tenant, "a0", "finished") is Nudge.NOW
    assert store.finish_lease(tenant, "a1", "cancelled") is Nudge.NONE  # flag already set
    assert store.finish_lease(tenant, "a0", "finished") is Nudge.NOW  # retry: still unclaimed
    res = store.sync(tenant, "r:2", {"q": 10})
    assert res.done == [["a0", "finished"], ["a1", "cancelled"]]
    assert store.flag(tenant, DONE_CHANNEL) is False
    assert store.sync(tenant, "r:2", {"q": 10}).done == res.done  # retry
    store.sync(tenant, "r:3", {"q": 10})
    assert store.lease_count(tenant) == 1  # a0, a1 collected once consumed


def test_ends_of_a_sync_whose_task_may_be_lost_stay_for_its_retry(
    store: LeaseStore, tenant: str
) -> None:
    """Two syncs chained in one workflow task that is then lost (issue #20): the second
    must not collect the first's ends, or the first's retry would not find them."""
    for i in range(3):
        put(store, tenant, i)
    store.sync(tenant, "r:1", {"q": 10})
    store.finish_lease(tenant, "a0", "finished")
    first = store.sync(tenant, "r:2", {"q": 10})
    assert first.done == [["a0", "finished"]]
    store.finish_lease(tenant, "a1", "finished")
    second = store.sync(tenant, "r:3", {"q": 10}, keep=["r:2"])
    assert second.done == [["a1", "finished"]]
    assert store.sync(tenant, "r:2", {"q": 10}).done == first.done  # the lost task's retry
    # Once r:2 and r:3 are in the history, the next sync collects both.
    store.sync(tenant, "r:4", {"q": 10})
    assert store.lease_count(tenant) == 1


def test_a_retried_sync_answers_exactly_as_its_first_try(store: LeaseStore, tenant: str) -> None:
    """A workflow task lost after its sync ran may already have acted on the answer (an
    admission delivered): the retry must lead the scheduler to the same decisions."""
    empty = store.sync(tenant, "r:1", {"q": 10})
    assert (empty.leases, empty.done, empty.more, empty.more_done) == ([], [], [], False)
    for i in range(3):
        put(store, tenant, i)
    first = store.sync(tenant, "r:2", {"q": 1}, keep=["r:1"])
    assert [d["id"] for d in first.leases] == ["a0"] and first.more == ["q"]
    store.sync(tenant, "r:3", {"q": 10}, keep=["r:1", "r:2"])  # claims a1, a2
    again = store.sync(tenant, "r:2", {"q": 1})
    assert (again.leases, again.more) == (first.leases, ["q"])
    assert store.sync(tenant, "r:1", {"q": 10}).leases == []  # not the leases of today
    # Once no sync names them as perhaps lost, their answers go.
    store.sync(tenant, "r:4", {"q": 10})
    assert store.sync(tenant, "r:2", {"q": 1}).more == []  # read back from claims only


def test_cancel_before_claim_drops_silently_and_reject_deletes(
    store: LeaseStore, tenant: str
) -> None:
    put(store, tenant, 0)
    put(store, tenant, 1)
    assert store.finish_lease(tenant, "a0", "cancelled") is Nudge.NONE
    res = store.sync(tenant, "r:1", {"q": 10})
    assert [d["id"] for d in res.leases] == ["a1"]
    assert store.finish_lease(tenant, "a1", "rejected") is Nudge.NONE
    assert store.lease_count(tenant) == 0
    with pytest.raises(ValueError, match="kind"):
        store.finish_lease(tenant, "a1", "exploded")


@pytest.mark.parametrize(
    ("wants", "expected"),
    [
        pytest.param(None, Nudge.SOON, id="scheduler-never-said-so-nudge-soon"),
        pytest.param(False, Nudge.SOON, id="nothing-waits-nudge-soon"),
        pytest.param(True, Nudge.NOW, id="work-waits-nudge-now"),
    ],
)
def test_an_end_nudges_now_only_while_work_waits(
    store: LeaseStore, tenant: str, wants: bool | None, expected: Nudge
) -> None:
    for i in range(3):
        put(store, tenant, i)
    store.sync(tenant, "r:1", {"q": 10}, wants_ends=wants)
    assert store.finish_lease(tenant, "a0", "finished") is expected
    assert store.finish_lease(tenant, "a1", "finished") is Nudge.NONE  # done flag set
    # A later sync (any nudge) collects both ends, whatever the lazy nudge became.
    res = store.sync(tenant, "r:2", {"q": 10}, wants_ends=not wants)
    assert res.done == [["a0", "finished"], ["a1", "finished"]]
    assert store.finish_lease(tenant, "a2", "finished") is (Nudge.SOON if wants else Nudge.NOW)


def test_wants_ends_is_left_alone_unless_given(store: LeaseStore, tenant: str) -> None:
    for i in range(2):
        put(store, tenant, i)
    store.sync(tenant, "r:1", {"q": 10}, wants_ends=True)
    store.sync(tenant, "r:2", {"q": 10})  # an older scheduler: says nothing
    assert store.finish_lease(tenant, "a0", "finished") is Nudge.NOW


def test_a_lease_cancelled_before_its_claim_leaves_no_flag_behind(
    store: LeaseStore, tenant: str
) -> None:
    """Its put set the queue's flag; the sync that finds nothing must still clear it."""
    assert put(store, tenant, 0) is True
    assert store.finish_lease(tenant, "a0", "cancelled") is Nudge.NONE
    res = store.sync(tenant, "r:1", {"q": 10})  # the nudge of a0's put arrives
    assert res.leases == [] and res.more == []
    assert store.flag(tenant, queue_channel("q")) is False
    assert put(store, tenant, 1) is True  # else a1 would wait for someone else's nudge


def test_concurrent_finishers_never_lose_a_wakeup_while_work_waits(
    store: LeaseStore, tenant: str
) -> None:
    """With work waiting, every end is collected by a sync that started after it, or
    announced by a NOW nudge."""
    for i in range(160):
        put(store, tenant, i)
    store.sync(tenant, "r:0", {"q": 1000}, wants_ends=True)
    told: list[str] = []
    lock = threading.Lock()

    def finish(lo: int, hi: int) -> None:
        for i in range(lo, hi):
            r = store.finish_lease(tenant, f"a{i}", "finished")
            assert r is not Nudge.SOON
            if r is Nudge.NOW:
                with lock:
                    told.append(f"a{i}")

    threads = [threading.Thread(target=finish, args=(k * 40, k * 40 + 40)) for k in range(4)]
    collected: list[str] = []
    sync_beside(
        threads,
        lambda n: collected.extend(
            a for a, _ in store.sync(tenant, f"r:{n}", {}, wants_ends=True).done
        ),
    )
    # Ends left for one more sync must have been announced: the first of them after
    # the previous sync's clear was told to nudge.
    rest = [a for a, _ in store.sync(tenant, "r:last", {}, wants_ends=True).done]
    assert not rest or any(a in told for a in rest)
    assert sorted(collected + rest) == sorted(f"a{i}" for i in range(160))
    assert told  # the first end after the first sync at least


def test_put_is_idempotent_and_unknown_queues_use_default_room(
    store: LeaseStore, tenant: str
) -> None:
    put(store, tenant, 0, queue="other")
    assert put(store, tenant, 0, queue="other") is True  # a retry nudges again
    res = store.sync(tenant, "r:1", {}, default_room=5)
    assert [d["id"] for d in res.leases] == ["a0"]


def test_tenants_are_separate(store: LeaseStore, tenant: str) -> None:
    other = tenant + "x"
    put(store, tenant, 0)
    put(store, other, 0)
    assert [d["id"] for d in store.sync(tenant, "r:1", {"q": 5}).leases] == ["a0"]
    assert store.pending_count(other) == 1
    assert store.pending_count(tenant) == 0


def test_concurrent_submitters_never_lose_a_wakeup(store: LeaseStore, tenant: str) -> None:
    """Whatever the interleaving: every lease is either claimed or announced by a nudge."""
    nudges: list[int] = []
    lock = threading.Lock()

    def submit(lo: int, hi: int) -> None:
        for i in range(lo, hi):
            if put(store, tenant, i):
                with lock:
                    nudges.append(i)

    threads = [threading.Thread(target=submit, args=(k * 40, k * 40 + 40)) for k in range(4)]
    claimed: list[str] = []
    n = sync_beside(
        threads,
        lambda n: claimed.extend(d["id"] for d in store.sync(tenant, f"r:{n}", {"q": 7}).leases),
    )
    # After the last submitter, a nudge or the "more" answer must lead to the rest.
    while True:
        n += 1
        res = store.sync(tenant, f"r:{n}", {"q": 1000})
        claimed += [d["id"] for d in res.leases]
        if not res.more:
            break
    assert sorted(claimed) == sorted(f"a{i}" for i in range(160))
    assert len(nudges) < 160


def test_bulk_load(store: LeaseStore, tenant: str) -> None:
    rows = ((f"b{i}", "bulk", f"wf{i}", spec(i, "bulk"), float(i)) for i in range(5000))
    assert store.put_many(tenant, rows) == 5000
    assert store.pending_count(tenant, "bulk") == 5000
    res = store.sync(tenant, "r:1", {"bulk": 500}, max_leases=2000)
    assert len(res.leases) == 500 and res.more == ["bulk"]


def test_group_commit_matches_calls_one_after_another(store: LeaseStore, tenant: str) -> None:
    ops: list[tuple[str, tuple[object, ...]]] = [
        ("put", (tenant, f"a{i}", "q", f"wf-a{i}", spec(i), float(i))) for i in range(3)
    ]
    # Only the first put flips the flag; a repeated put (a retry) must nudge again.
    N, NOW = Nudge.NONE, Nudge.NOW
    assert nudges(store.apply([*ops, ops[0]])) == [NOW, N, N, NOW]
    r = store.sync(tenant, "s1", {"q": 10}, wants_ends=True)
    assert [d["id"] for d in r.leases] == ["a0", "a1", "a2"]
    assert nudges(
        store.apply(
            [("finish", (tenant, "a0", "finished")), ("finish", (tenant, "a1", "cancelled"))]
        )
    ) == [NOW, N]
    with pytest.raises(ValueError):
        store.apply([("finish", (tenant, "a2", "bogus"))])
    assert sorted(store.sync(tenant, "s2", {"q": 10}).done) == [
        ["a0", "finished"],
        ["a1", "cancelled"],
    ]


@pytest.mark.parametrize(
    "already_set",
    [pytest.param(False, id="flags-clear-before-the-batch"), pytest.param(True, id="q-flag-set")],
)
def test_group_commit_flips_each_channel_once_per_queue_and_tenant(
    store: LeaseStore, tenant: str, already_set: bool
) -> None:
    other = tenant + "-b"
    if already_set:
        assert put(store, tenant, 100, "q") is True  # sets q's flag before the batch
    ops: list[tuple[str, tuple[object, ...]]] = [
        ("put", (tenant, "a1", "q", "wf-a1", spec(1), 1.0)),
        ("put", (tenant, "a2", "r", "wf-a2", spec(2, "r"), 2.0)),
        ("put", (other, "a3", "q", "wf-a3", spec(3), 3.0)),
        ("put", (tenant, "a4", "q", "wf-a4", spec(4), 4.0)),
        ("put", (tenant, "a5", "r", "wf-a5", spec(5, "r"), 5.0)),
    ]
    # One nudge per (tenant, channel) whose flag this batch found clear, from its first op.
    first = Nudge.NONE if already_set else Nudge.NOW
    assert nudges(store.apply(ops)) == [first, Nudge.NOW, Nudge.NOW, Nudge.NONE, Nudge.NONE]
    assert store.flag(tenant, queue_channel("q")) and store.flag(tenant, queue_channel("r"))
    assert store.flag(other, queue_channel("q"))
    store.sync(tenant, "s1", {"q": 10, "r": 10})
    assert not store.flag(tenant, queue_channel("q"))
    assert store.flag(other, queue_channel("q"))  # another tenant's flag is its own


def test_in_process_admission_is_durable_until_its_end_is_collected(
    store: LeaseStore, tenant: str
) -> None:
    put(store, tenant, 1)
    put(store, tenant, 2)
    store.sync(tenant, "s1", {"q": 10})
    adm = {"action_id": "a1", "cluster": "c1", "node_hints": [], "decided_at": 1.0, "reasons": []}
    adm2 = {**adm, "action_id": "a2"}
    store.record_admissions(tenant, {"a1": adm, "a2": adm2})
    store.record_admissions(tenant, {"a1": adm})  # a retried dispatch
    assert store.admission(tenant, "a1") == adm
    assert store.admission(tenant, "a3") is None
    assert store.finish_lease(tenant, "a1", "finished") == Nudge.SOON
    # The end is recorded; the row goes with the lease once the scheduler has the end.
    assert store.admission(tenant, "a1") == adm
    assert store.sync(tenant, "s2", {"q": 10}).done == [["a1", "finished"]]
    assert store.sync(tenant, "s2", {"q": 10}).done == [["a1", "finished"]]  # a retry
    assert store.admission(tenant, "a1") == adm
    store.sync(tenant, "s3", {"q": 10})
    assert store.admission(tenant, "a1") is None
    assert store.lease_count(tenant) == 1
    assert store.admission(tenant, "a2") == adm2  # still running: kept


@pytest.mark.parametrize(
    "claimed",
    [
        pytest.param(False, id="pending lease deleted"),
        pytest.param(True, id="claimed lease marked"),
    ],
)
def test_a_repeated_finish_changes_nothing(store: LeaseStore, tenant: str, claimed: bool) -> None:
    put(store, tenant, 1)
    if claimed:
        store.sync(tenant, "s1", {"q": 10})
    first = store.finish_lease(tenant, "a1", "cancelled")
    assert first == (Nudge.SOON if claimed else Nudge.NONE)
    # A retried finish: nudges again while the end is unclaimed (its nudge may be lost).
    assert store.finish_lease(tenant, "a1", "finished") == first
    assert store.lease_count(tenant) == int(claimed)
    done = store.sync(tenant, "s2", {"q": 10}).done
    assert done == ([["a1", "cancelled"]] if claimed else [])
    assert store.finish_lease(tenant, "a1", "finished") == Nudge.NONE  # collected: silent


@pytest.mark.parametrize(
    "n_queues", [pytest.param(1, id="one-queue"), pytest.param(7, id="seven-queues")]
)
def test_sync_finds_every_queue_with_pending_leases_in_name_order(
    store: LeaseStore, tenant: str, n_queues: int
) -> None:
    names = [f"q{k}" for k in reversed(range(n_queues))]
    for i, q in enumerate(names * 3):
        put(store, tenant, i, q)
    res = store.sync(tenant, "s1", dict.fromkeys(names, 1))
    assert res.more == sorted(names)  # each queue left two behind
    assert sorted({d["queue"] for d in res.leases}) == sorted(names)


def test_workers_batching_several_queues_in_any_order_never_deadlock(
    store: LeaseStore, tenant: str
) -> None:
    """Group commits of several workers (threads: on PostgreSQL, concurrent
    transactions) write flags of several queues in opposite orders while a scheduler
    syncs them all; every lease is claimed and no transaction is aborted."""
    queues = [f"q{k}" for k in range(6)]
    errors: list[BaseException] = []

    def worker(w: int) -> None:
        order = queues if w % 2 else queues[::-1]
        try:
            for i in range(100):
                store.apply(
                    [("put", (tenant, f"w{w}-{i}-{q}", q, "wf", spec(i, q), 1.0)) for q in order]
                )
        except BaseException as err:  # a deadlock aborts the batch
            errors.append(err)

    threads = [threading.Thread(target=worker, args=(w,)) for w in range(4)]
    claims: list[int] = []
    n = sync_beside(
        threads,
        lambda n: claims.append(
            len(store.sync(tenant, f"r:{n}", dict.fromkeys(queues, 50)).leases)
        ),
    )
    claimed = sum(claims)
    while True:
        n += 1
        res = store.sync(tenant, f"r:{n}", dict.fromkeys(queues, 1000), max_leases=10_000)
        claimed += len(res.leases)
        if not res.more:
            break
    assert errors == []
    assert claimed == 4 * 100 * len(queues)


@pytest.mark.parametrize(
    "lose",
    [
        pytest.param(lambda c: c.invalidate(), id="invalidated-connection-is-replaced"),
        pytest.param(lambda c: c.close(), id="closed-connection-is-replaced"),
    ],
)
def test_sqlite_store_replaces_its_kept_connection_when_it_is_lost(
    tmp_path: Path, tenant: str, lose: Callable[[Any], None]
) -> None:
    s = LeaseStore(f"sqlite:///{tmp_path / 'kept.db'}")
    try:
        assert put(s, tenant, 0)
        kept = s._conn
        assert kept is not None
        lose(kept)
        # Nothing written before is lost, and the next call works on a new connection.
        assert s.pending_count(tenant) == 1
        assert not put(s, tenant, 1)  # the flag is still set: no second nudge
        assert s._conn is not kept
        assert [d["id"] for d in s.sync(tenant, "t1", {"q": 5}).leases] == ["a0", "a1"]
    finally:
        s.close()


@pytest.mark.parametrize(
    "inline",
    [pytest.param(False, id="apply-on-a-thread"), pytest.param(True, id="apply_nowait-inline")],
)
def test_sqlite_store_rolls_back_a_failed_transaction_and_goes_on(
    tmp_path: Path, tenant: str, monkeypatch: pytest.MonkeyPatch, inline: bool
) -> None:
    s = LeaseStore(f"sqlite:///{tmp_path / 'kept.db'}")
    apply = s.apply_nowait if inline else s.apply

    def broken(*args: Any, **kwargs: Any) -> Nudge:
        raise RuntimeError("disk full")

    try:
        assert put(s, tenant, 0)
        with monkeypatch.context() as m:
            m.setattr(s, "_finish_lease", broken)
            with pytest.raises(RuntimeError, match="disk full"):
                apply([*_puts(tenant, 1), ("finish", (tenant, "a0", "finished"))])
        assert s.pending_count(tenant) == 1  # the batch's put was rolled back with it
        assert nudges(apply(_puts(tenant, 1))) == [Nudge.NONE]  # and the connection goes on
        assert s.pending_count(tenant) == 2
    finally:
        s.close()


def _puts(tenant: str, *ids: int) -> list[tuple[str, tuple[object, ...]]]:
    return [("put", (tenant, f"a{i}", "q", f"wf-a{i}", spec(i), float(i))) for i in ids]


def test_apply_nowait_commits_inline_exactly_as_apply(store: LeaseStore, tenant: str) -> None:
    assert put(store, tenant, 0)  # opens the store's connection
    N, NOW = Nudge.NONE, Nudge.NOW
    if store.dialect != "sqlite":
        # Every statement is a network round trip: never on the caller's thread.
        assert store.apply_nowait(_puts(tenant, 1)) is None
        assert store.pending_count(tenant) == 1
        return
    # The same answers as test_group_commit_matches_calls_one_after_another.
    assert nudges(store.apply_nowait([*_puts(tenant, 1, 2), _puts(tenant, 1)[0]])) == [N, N, NOW]
    r = store.sync(tenant, "s1", {"q": 10}, wants_ends=True)
    assert [d["id"] for d in r.leases] == ["a0", "a1", "a2"]
    ends = [("finish", (tenant, "a0", "finished")), ("finish", (tenant, "a1", "cancelled"))]
    assert nudges(store.apply_nowait(ends)) == [NOW, N]
    with pytest.raises(ValueError, match="bogus"):
        store.apply_nowait([("finish", (tenant, "a2", "bogus"))])
    assert sorted(store.sync(tenant, "s2", {"q": 10}).done) == [
        ["a0", "finished"],
        ["a1", "cancelled"],
    ]


def test_apply_nowait_declines_before_the_store_has_a_connection(tmp_path: Path) -> None:
    s = LeaseStore(f"sqlite:///{tmp_path / 'new.db'}")
    try:
        assert s.apply_nowait(_puts("t", 0)) is None  # the thread's path connects
        assert s.pending_count("t") == 0
    finally:
        s.close()


def test_apply_nowait_declines_while_another_thread_is_in_a_transaction(
    tmp_path: Path, tenant: str
) -> None:
    s = LeaseStore(f"sqlite:///{tmp_path / 'busy.db'}")
    try:
        assert put(s, tenant, 0)
        assert s._lock is not None
        with s._lock:  # what another thread's `_tx` holds
            assert s.apply_nowait(_puts(tenant, 1)) is None
        assert s.pending_count(tenant) == 1  # nothing written by the declined call
        assert nudges(s.apply_nowait(_puts(tenant, 1))) == [Nudge.NONE]
        assert s.pending_count(tenant) == 2
    finally:
        s.close()


def test_apply_nowait_never_waits_for_another_process_writer(tmp_path: Path, tenant: str) -> None:
    path = tmp_path / "shared.db"
    s = LeaseStore(f"sqlite:///{path}")
    other = sqlite3.connect(path, isolation_level=None)
    try:
        assert put(s, tenant, 0)
        other.execute("BEGIN IMMEDIATE")  # another process's writer holds the write lock
        out: list[object] = []
        t = threading.Thread(target=lambda: out.append(s.apply_nowait(_puts(tenant, 1))))
        t.start()
        # With the store's own busy timeout (60 s) it would still be waiting here.
        t.join(timeout=30)
        assert not t.is_alive() and out == [None]
        assert s._conn is not None
        dbapi: Any = s._conn.connection.dbapi_connection
        busy = dbapi.execute("PRAGMA busy_timeout").fetchone()
        assert busy == (60_000,)  # every other caller still waits its turn
        other.execute("ROLLBACK")
        # The connection is usable at once, inline and through the thread's path.
        assert nudges(s.apply_nowait(_puts(tenant, 1))) == [Nudge.NONE]
        assert not put(s, tenant, 2)
        assert s.pending_count(tenant) == 3
    finally:
        other.close()
        s.close()


@pytest.mark.parametrize(
    ("busy", "n", "threaded"),
    [
        pytest.param(False, 2, 0, id="small-uncontended-batch-commits-on-the-loop"),
        pytest.param(True, 2, 1, id="busy-store-goes-to-a-thread"),
        pytest.param(False, 9, 1, id="a-burst-goes-to-a-thread-not-holding-the-loop"),
    ],
)
async def test_group_commit_takes_the_thread_only_when_it_must(
    tmp_path: Path, tenant: str, busy: bool, n: int, threaded: int
) -> None:
    from headway.activities.store import _GroupCommit

    s = LeaseStore(f"sqlite:///{tmp_path / 'gc.db'}")
    try:
        assert put(s, tenant, 0)
        gc = _GroupCommit(s)
        assert gc.INLINE_MAX == 8  # the table's batch sizes stand on either side of it
        assert s._lock is not None
        if busy:
            # Held by "another thread" until the commit has gone to a thread to wait.
            s._lock.acquire()
            asyncio.get_running_loop().call_later(0.05, s._lock.release)
        ops = _puts(tenant, *range(1, n + 1))
        results = await asyncio.gather(*(gc.submit(kind, args) for kind, args in ops))
        assert nudges(list(results)) == [Nudge.NONE] * n  # one batch: the flag was set by a0
        assert gc.threaded == threaded
        assert s.pending_count(tenant) == n + 1
    finally:
        s.close()


@pytest.mark.parametrize(
    "how",
    [
        pytest.param("invalidated", id="invalidated-by-sqlalchemy"),
        pytest.param("closed", id="dbapi-connection-failing-under-it"),
    ],
)
def test_apply_nowait_replaces_its_connection_when_it_is_lost(
    tmp_path: Path, tenant: str, how: str
) -> None:
    s = LeaseStore(f"sqlite:///{tmp_path / 'lost.db'}")
    try:
        assert put(s, tenant, 0)
        assert nudges(s.apply_nowait(_puts(tenant, 1))) == [Nudge.NONE]
        fast = s._nowait
        assert fast is not None and fast is not s._conn
        if how == "invalidated":
            fast.invalidate()
        else:
            # Every call on it fails now (as on an I/O error): the failing call says so,
            # and only that one.
            fast.connection.dbapi_connection.close()  # type: ignore[union-attr]
            with pytest.raises(sqlite3.ProgrammingError):
                s.apply_nowait(_puts(tenant, 2))
        assert nudges(s.apply_nowait(_puts(tenant, 2))) == [Nudge.NONE]
        assert s._nowait is not fast
        assert s.pending_count(tenant) == 3
    finally:
        s.close()


def test_checkpoints_run_on_the_thread_path_not_on_the_loop(tmp_path: Path, tenant: str) -> None:
    path = tmp_path / "wal.db"
    s = LeaseStore(f"sqlite:///{path}")
    probe = sqlite3.connect(path, isolation_level=None)

    def wal_frames() -> int:
        """Frames in the WAL not yet copied to the database (checkpoints them, so the
        next writer starts the WAL afresh)."""
        busy, log, _done = probe.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
        assert busy == 0
        return int(log)

    try:
        assert put(s, tenant, 0)
        wal_frames()
        # Well past SQLite's 1,000-page default: commits on the loop never checkpoint.
        for i in range(1, 301):
            assert nudges(s.apply_nowait(_puts(tenant, i))) == [Nudge.NONE]
        assert wal_frames() > 1_000
        for i in range(301, 601):
            assert nudges(s.apply_nowait(_puts(tenant, i))) == [Nudge.NONE]
        s.sync(tenant, "s1", {"q": 1})  # the thread's connection checkpoints after it
        assert nudges(s.apply_nowait(_puts(tenant, 601))) == [Nudge.NONE]
        assert wal_frames() < 100
        assert s.pending_count(tenant) == 601
    finally:
        probe.close()
        s.close()


@pytest.mark.parametrize(
    "inline", [pytest.param(False, id="apply"), pytest.param(True, id="nowait")]
)
def test_sqlite_hot_path_runs_every_statement_on_the_dbapi_cursor(
    tmp_path: Path, tenant: str, inline: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    from sqlalchemy.engine import Connection

    s = LeaseStore(f"sqlite:///{tmp_path / 'hot.db'}")
    try:
        assert put(s, tenant, 0)
        s.sync(tenant, "s1", {"q": 10})

        def through_sqlalchemy(*_: object, **__: object) -> None:
            raise AssertionError("a hot-path statement went through Connection.execute")

        monkeypatch.setattr(Connection, "execute", through_sqlalchemy)
        ops: list[tuple[str, tuple[object, ...]]] = [
            *_puts(tenant, 1),
            *_puts(tenant, 1),  # a retried put: nudges again
            ("finish", (tenant, "a0", "finished")),  # claimed: marked
            ("finish", (tenant, "a0", "finished")),  # a retry, still unclaimed: again
            ("finish", (tenant, "a1", "cancelled")),  # pending: deleted
            *_puts(tenant, 2),
            ("finish", (tenant, "a2", "rejected")),
        ]
        N, NOW, SOON = Nudge.NONE, Nudge.NOW, Nudge.SOON
        got = nudges(s.apply_nowait(ops) if inline else s.apply(ops))
        assert got == [NOW, NOW, SOON, SOON, N, N, N]
        monkeypatch.undo()
        assert s.lease_count(tenant) == 1 and s.pending_count(tenant) == 0
        assert s.sync(tenant, "s2", {"q": 10}).done == [["a0", "finished"]]
    finally:
        s.close()


def test_the_kept_connection_is_replaced_after_a_dbapi_error(
    tmp_path: Path, tenant: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from headway.store.leases import _DBAPIConn

    s = LeaseStore(f"sqlite:///{tmp_path / 'kept-lost.db'}")
    try:
        assert put(s, tenant, 0)
        kept = s._conn
        assert kept is not None

        def io_error(*_: object) -> None:
            raise sqlite3.OperationalError("disk I/O error")

        with monkeypatch.context() as m:
            # On the DBAPI cursor: SQLAlchemy's disconnect check never sees it.
            m.setattr(_DBAPIConn, "execute", io_error)
            with pytest.raises(sqlite3.OperationalError, match="disk I/O"):
                s.apply(_puts(tenant, 1))
        assert nudges(s.apply(_puts(tenant, 1))) == [Nudge.NONE]
        assert s._conn is not kept
        assert s.pending_count(tenant) == 2
    finally:
        s.close()
