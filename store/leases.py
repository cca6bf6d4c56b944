"""``LeaseStore``: the pending backlog of every shard, in SQL.

The seed's scheduler pass starts with "fetch up to n schedulable leases": a shard's
scheduler holds only a bounded window of each queue in memory and refills it from here.
That keeps a million-action backfill out of the scheduler workflow's history and
continue-as-new payload, while submitters and the scheduler meet through two cheap
primitives:

* :meth:`LeaseStore.put_lease` / :meth:`LeaseStore.finish_lease` (called by an action's
  workflow through a local activity) write a row and flip the channel's flag; they return
  True only when the caller must nudge the scheduler (the flag was clear). Submitters
  that find the flag already set stay silent: a nudge is already on its way or the
  scheduler knows the queue has more.
* :meth:`LeaseStore.sync` (called by the scheduler workflow through a local activity)
  clears every set flag, claims up to ``room`` pending leases per queue and every
  unclaimed end, and sets the flag again of each queue it leaves leases behind in (the
  scheduler comes back for those by itself, so their submitters may stay silent), in one
  transaction, under a deterministic token, so a retried sync returns exactly what the
  first attempt claimed.

Ends nothing waits for are announced lazily. An end matters to a decision only when
work waits (for the capacity, slot or quota it frees): any sync hands the scheduler every
end recorded so far, so a new lease is never decided against stale ends. The scheduler
therefore keeps a ``wants-ends`` flag up to date (set while its last pass left work
waiting), and the finisher that flips the ``done`` flag is told :attr:`Nudge.NOW` only
when that flag is set, else :attr:`Nudge.SOON`: nudge within a second unless some other
nudge reaches the scheduler first. Ends still reach it promptly enough for its gauges
and a draining queue's drained, at a fraction of the signals.

Lost-wakeup freedom: a submitter flips the flag *after* inserting in the same
transaction, and the scheduler clears the flag *before* reading in its transaction. Under
PostgreSQL's READ COMMITTED the row lock on the flag orders the two: either the
submitter's flip commits first (then the scheduler's read sees its lease) or the clear
commits first (then the submitter flips false -> true and nudges). SQLite serializes
writers (``BEGIN IMMEDIATE``), which gives the same order. The scheduler writes
``wants-ends`` before it clears ``done``, and a finisher reads ``wants-ends`` after it
flips ``done``: a finisher that still reads it clear flipped ``done`` before the sync's
clear went through, so that very sync collects its end.

SQLite is the default (``sqlite:///.headway/headway.db``); any SQLAlchemy URL works, e.g.
``postgresql+psycopg://user@host/db`` via ``HEADWAY_DATABASE_URL``.
"""

from __future__ import annotations

import enum
import json
import os
import sqlite3
import threading
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

from headway.scheduler.door import Bucket, Decision, QueueDoor, decide
from headway.scheduler.model import QueueStatus, RateLimit
from sqlalchemy import (
    Engine,
    Table,
    bindparam,
    create_engine,
    delete,
    event,
    func,
    insert,
    select,
    text,
    tuple_,
    update,
)
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Connection
from sqlalchemy.pool import StaticPool

from . import migrations
from .models import AdmissionRow, Base, DoorRow, FinishedRow, LeaseRow, ShardFlag, SyncRow

__all__ = [
    "DEFAULT_DATABASE_URL",
    "DONE_CHANNEL",
    "WANTS_ENDS_CHANNEL",
    "LeaseStore",
    "Nudge",
    "Put",
    "SyncResult",
    "queue_channel",
]

DEFAULT_DATABASE_URL = "sqlite:///.headway/headway.db"
#: SQLite: the WAL size (pages) at which a commit on the event loop's connection runs
#: the checkpoint itself (``apply_nowait``). The store's other connection checkpoints at
#: SQLite's default of 1,000 pages after its own commits (every sync), on a thread, with
#: the GIL released; on the loop a checkpoint held it for up to 27 ms and cost ~80 us
#: per commit on average (micro-bench, put + finish). This is the backstop for a process
#: whose only writes are the loop's.
NOWAIT_CHECKPOINT_PAGES = 10_000
#: The columns a new lease row is written with (``_put_lease``).
_LEASE_COLUMNS = ("tenant", "action_id", "queue", "workflow_id", "spec", "submitted_at", "status")
#: The columns of a finished action's record (``headway.store.history``).
FINISHED_COLUMNS = tuple(c.name for c in cast(Table, FinishedRow.__table__).columns)
DONE_CHANNEL = "done"
#: Set by the scheduler while work waits that an end could unblock (see module doc).
WANTS_ENDS_CHANNEL = "wants-ends"
#: The ends a lease is marked with (``done``); a rejected lease is deleted instead.
_MARKED_ENDS = ("finished", "cancelled")


class Nudge(enum.IntEnum):
    """What the caller of a store write must do about the scheduler."""

    #: Stay silent: a nudge is on its way, or the scheduler will come back by itself.
    NONE = 0
    #: Signal the scheduler now.
    NOW = 1
    #: An end no waiting work needs: signal within a second, unless a nudge sent after
    #: this write reaches the scheduler anyway (its sync collects the end).
    SOON = 2


@dataclass(frozen=True, slots=True)
class Put:
    """What a lease write answers (``put_lease``, or a ``put`` op of ``apply``).

    Attributes:
        nudge: the caller must nudge the scheduler (the queue's flag was clear, or the
            lease existed already: a retried call whose nudge may not have gone out).
        refused: the door's decision when it refused the submission (nothing was
            written); None when the lease was written (or existed).
        busy: the tenant's scheduler had work waiting at its last pass (``wants-ends``),
            so an admission is not to be expected within moments.
    """

    nudge: bool = False
    refused: Decision | None = None
    busy: bool = False


def queue_channel(queue: str) -> str:
    """Flag channel of new leases in ``queue``."""
    return f"q:{queue}"


@dataclass
class SyncResult:
    """What one sync hands the scheduler.

    Attributes:
        leases: newly claimed leases, oldest first per queue, as stored spec dicts (an
            ``ActionSpec.to_dict()`` without a meaningful ``seq``, plus ``workflow_id``).
        done: ``[action_id, "finished" | "cancelled"]`` for every end claimed.
        more: queues in which this sync left pending leases behind (room or the per-sync
            cap ran out); leases that arrive later nudge instead.
        more_done: ends remain unclaimed (the per-sync cap was hit).
    """

    leases: list[dict[str, Any]] = field(default_factory=list)
    done: list[list[str]] = field(default_factory=list)
    more: list[str] = field(default_factory=list)
    more_done: bool = False


class _Prepared:
    """The statements of the hot paths, built once with bound parameters.

    SQLAlchemy caches compiled SQL, but a statement built afresh on every call still has
    its cache key worked out by walking the whole expression (measured: two thirds of
    ``finish_lease``'s time). Built once, the key is memoized on the statement object.
    The upserts exist only for dialects with ``INSERT ... ON CONFLICT`` (SQLite,
    PostgreSQL); elsewhere they are None and the store takes its generic path.
    """

    def __init__(self, dialect: str) -> None:
        leases = cast(Table, LeaseRow.__table__)
        t: Any = bindparam("t")
        lkey = (leases.c.tenant == t) & (leases.c.action_id == bindparam("a"))
        self._door_statements(dialect, t)
        self._held_statements(t, lkey)
        self._upserts(dialect, t)
        self._flag_statements(dialect, t)
        self._end_statements(dialect, t, lkey)
        self._sync_statements(dialect, t)
        #: SQLite: the hot path's statements as SQL text for the DBAPI cursor (see
        #: ``_DBAPIConn``), by ``id()`` of the statement object: (text, fixed params).
        self.dbapi_sql: dict[int, tuple[str, dict[str, Any]]] = {}
        if dialect == "sqlite":
            self._compile_hot()

    def _door_statements(self, dialect: str, t: Any) -> None:
        """The door: a tenant's and a queue's depth, status and token bucket."""
        doors = cast(Table, DoorRow.__table__)
        # The door: the tenant's row ("") and the queue's, tenant's first (the order in
        # which PostgreSQL locks them, see ``_door``).
        door_q: Any = (
            select(
                doors.c.queue,
                doors.c.status,
                doors.c.depth,
                doors.c.rate,
                doors.c.burst,
                doors.c.tokens,
                doors.c.token_time,
            )
            .where((doors.c.tenant == t) & doors.c.queue.in_(["", bindparam("q")]))
            .order_by(doors.c.queue)
        )
        self.door_rows = door_q
        self.door_rows_locked: Any = door_q.with_for_update() if dialect == "postgresql" else None
        self.door_bucket = (
            update(doors)
            .where((doors.c.tenant == t) & (doors.c.queue == bindparam("q")))
            .values(tokens=bindparam("k"), token_time=bindparam("at"))
        )

    def _held_statements(self, t: Any, lkey: Any) -> None:
        """Whether a lease exists, and what a queue holds."""
        leases = cast(Table, LeaseRow.__table__)
        self.lease_exists = select(leases.c.id).where(lkey)
        # What a queue holds: its leases not ended (pending, or claimed and neither
        # finished nor cancelled), counted up to ``n`` only (the depth): a seek in
        # ``ix_headway_leases_held`` that never reads more of a big backlog than that.
        held = (
            select(leases.c.id)
            .where(
                (leases.c.tenant == t)
                & (leases.c.queue == bindparam("q"))
                & leases.c.done.is_(None)
            )
            .limit(bindparam("n"))
            .subquery()
        )
        self.held = select(func.count()).select_from(held)

    def _upserts(self, dialect: str, t: Any) -> None:
        """The inserts that need ``INSERT ... ON CONFLICT`` (SQLite, PostgreSQL only)."""
        leases = cast(Table, LeaseRow.__table__)
        flags = cast(Table, ShardFlag.__table__)
        self.lease_insert: Any = None
        self.flip: Any = None
        self.finished_insert: Any = None
        if dialect in ("sqlite", "postgresql"):
            ins: Any = sqlite.insert if dialect == "sqlite" else postgresql.insert
            self.lease_insert = ins(leases).on_conflict_do_nothing().returning(leases.c.id)
            # The record of a finished action: the first end written stands.
            self.finished_insert = ins(cast(Table, FinishedRow.__table__)).on_conflict_do_nothing()
            # Insert the flag set, or set it only where it was clear: a row comes back
            # exactly when the flag went from absent or clear to set.
            self.flip = (
                ins(flags)
                .values(tenant=t, channel=bindparam("c"), dirty=True)
                .on_conflict_do_update(
                    index_elements=[flags.c.tenant, flags.c.channel],
                    set_={"dirty": True},
                    where=flags.c.dirty.is_(False),
                )
                .returning(flags.c.tenant)
            )

    def _flag_statements(self, dialect: str, t: Any) -> None:
        """The shard's flags: which queues have new work, group-commit locks."""
        flags = cast(Table, ShardFlag.__table__)
        self.lock_flags: Any = None
        self.ensure_flags: Any = None
        if dialect == "postgresql":
            # Group commits take their flag rows up front, in the sync's order (see
            # LeaseStore.apply): create the missing ones, then lock them all, sorted.
            keys: Any = bindparam("keys", expanding=True)
            self.ensure_flags = (
                postgresql.insert(flags)
                .values(tenant=bindparam("t"), channel=bindparam("c"), dirty=False)
                .on_conflict_do_nothing()
            )
            self.lock_flags = (
                select(flags.c.tenant)
                .where(tuple_(flags.c.tenant, flags.c.channel).in_(keys))
                .order_by(flags.c.tenant, flags.c.channel)
                .with_for_update()
            )
        dirty_q: Any = select(flags.c.channel).where(
            (flags.c.tenant == t) & flags.c.dirty.is_(True) & flags.c.channel.like("q:%")
        )
        if dialect == "postgresql":
            dirty_q = dirty_q.with_for_update()
        self.dirty_queue_flags = dirty_q.order_by(flags.c.channel)
        self.flag_value = select(flags.c.dirty).where(
            (flags.c.tenant == t) & (flags.c.channel == bindparam("c"))
        )
        self.set_flag = (
            update(flags)
            .where((flags.c.tenant == t) & (flags.c.channel == bindparam("c")))
            .values(dirty=bindparam("v"))
        )
        self.clear = (
            update(flags)
            .where((flags.c.tenant == t) & (flags.c.channel == bindparam("c")))
            .values(dirty=False)
        )

    def _end_statements(self, dialect: str, t: Any, lkey: Any) -> None:
        """An action's end: its admission row, its lease deleted or marked done."""
        leases = cast(Table, LeaseRow.__table__)
        admissions = cast(Table, AdmissionRow.__table__)
        # A retried dispatch rewrites the same rows: insert, or replace what is there
        # (one statement for the batch, where delete + insert compiled an IN list anew
        # for every batch).
        self.admission_upsert: Any = None
        if dialect in ("sqlite", "postgresql"):
            ins_a: Any = (sqlite.insert if dialect == "sqlite" else postgresql.insert)(admissions)
            self.admission_upsert = ins_a.values(
                tenant=t, action_id=bindparam("a"), admission=bindparam("j")
            ).on_conflict_do_update(
                index_elements=[admissions.c.tenant, admissions.c.action_id],
                set_={"admission": ins_a.excluded.admission},
            )
        self.admission_delete = delete(admissions).where(
            (admissions.c.tenant == t) & (admissions.c.action_id == bindparam("a"))
        )
        self.lease_delete = delete(leases).where(lkey)
        self.pending_delete = delete(leases).where(lkey & (leases.c.status == "pending"))
        # Claimed leases only: a pending one is deleted instead (it never held anything).
        self.mark_done = (
            update(leases)
            .where(lkey & (leases.c.status == "claimed") & leases.c.done.is_(None))
            .values(done=bindparam("k"))
        )
        self.done_claim = select(leases.c.done_claim).where(lkey)

    def _sync_statements(self, dialect: str, t: Any) -> None:
        """The scheduler's sync: collect ends, claim pending leases, read them back."""
        leases = cast(Table, LeaseRow.__table__)
        admissions = cast(Table, AdmissionRow.__table__)
        ids: Any = bindparam("ids", expanding=True)
        collected = (
            (leases.c.tenant == t)
            & leases.c.done_claim.is_not(None)
            & (leases.c.done_claim != bindparam("tok"))
        )
        # An admission row goes with its lease, once the scheduler has collected the end
        # (one statement per sync rather than one per finished action).
        self.collected_admissions_delete = delete(admissions).where(
            (admissions.c.tenant == t)
            & admissions.c.action_id.in_(select(leases.c.action_id).where(collected))
        )
        self.collected_delete = delete(leases).where(collected)
        # ... but for the claims of syncs whose results may not be in the scheduler's
        # history yet (``keep``): a retry of such a sync must find its ends again.
        keep_tokens: Any = bindparam("keep", expanding=True)
        kept = (
            collected
            & leases.c.done_claim.not_in(keep_tokens)
            & (leases.c.claim.is_(None) | leases.c.claim.not_in(keep_tokens))
        )
        self.collected_admissions_delete_kept = delete(admissions).where(
            (admissions.c.tenant == t)
            & admissions.c.action_id.in_(select(leases.c.action_id).where(kept))
        )
        self.collected_delete_kept = delete(leases).where(kept)
        self.done_ids = (
            select(leases.c.id)
            .where(
                (leases.c.tenant == t)
                # Spelled so that planners without statistics (SQLite) seek
                # ix_headway_leases_ended: done IS NOT NULL as equalities (a rejected
                # lease is deleted, never marked), and done_claim IS NULL through a
                # function, or "tenant and done_claim IS NULL", true of every pending
                # lease, looks the better index.
                & leases.c.done.in_(_MARKED_ENDS)
                & (func.coalesce(leases.c.done_claim, "") == "")
                & (leases.c.status == "claimed")
            )
            .order_by(leases.c.id)
            .limit(bindparam("n"))
        )
        self.claim_done = (
            update(leases).where(leases.c.id.in_(ids)).values(done_claim=bindparam("tok"))
        )
        self.done_rows = (
            select(leases.c.action_id, leases.c.done)
            .where(leases.c.id.in_(ids))
            .order_by(leases.c.id)
        )
        self.pending_ids = (
            select(leases.c.id)
            .where(
                (leases.c.tenant == t)
                & (leases.c.status == "pending")
                & (leases.c.queue == bindparam("q"))
            )
            .order_by(leases.c.id)
            .limit(bindparam("n"))
        )
        self.claim = (
            update(leases)
            .where(leases.c.id.in_(ids) & (leases.c.status == "pending"))
            .values(status="claimed", claim=bindparam("tok"))
        )
        self.pending_queues: Any = (
            select(leases.c.queue)
            .where((leases.c.tenant == t) & (leases.c.status == "pending"))
            .group_by(leases.c.queue)
            .order_by(leases.c.queue)
        )
        if dialect in ("sqlite", "postgresql"):
            # The same answer by skipping through the pending index one queue at a time
            # (a "loose index scan"): a seek per queue instead of reading every pending
            # row, which under a million-lease backlog took ~230 ms per sync, all of it
            # inside the write transaction other tenants' submissions wait for.
            self.pending_queues = text(
                "WITH RECURSIVE q(name) AS ("
                " SELECT MIN(queue) FROM headway_leases"
                "  WHERE tenant = :t AND status = 'pending'"
                " UNION ALL"
                " SELECT (SELECT MIN(queue) FROM headway_leases"
                "   WHERE tenant = :t AND status = 'pending' AND queue > q.name)"
                "  FROM q WHERE q.name IS NOT NULL)"
                " SELECT name FROM q WHERE name IS NOT NULL ORDER BY name"
            )
        self.claimed = (
            select(leases.c.spec, leases.c.workflow_id, leases.c.submitted_at)
            .where((leases.c.tenant == t) & (leases.c.claim == bindparam("tok")))
            .order_by(leases.c.id)
        )
        self.claimed_done = (
            select(leases.c.action_id, leases.c.done)
            .where((leases.c.tenant == t) & (leases.c.done_claim == bindparam("tok")))
            .order_by(leases.c.id)
        )

    def _compile_hot(self) -> None:
        """SQLite's hot statements compiled once to SQL text for the DBAPI cursor."""
        named = sqlite.dialect(paramstyle="named")
        hot: list[tuple[Any, list[str] | None]] = [
            (self.door_rows, None),
            (self.door_bucket, None),
            (self.lease_exists, None),
            (self.held, None),
            (self.lease_insert, list(_LEASE_COLUMNS)),
            (self.flip, None),
            (self.flag_value, None),
            (self.mark_done, None),
            (self.pending_delete, None),
            (self.done_claim, None),
            (self.admission_delete, None),
            (self.lease_delete, None),
            (self.finished_insert, list(FINISHED_COLUMNS)),
        ]
        for stmt, keys in hot:
            compiled = stmt.compile(dialect=named, column_keys=keys)
            # Values fixed in the statement itself (literals such as 'pending');
            # a parameter left out by a caller stays missing and fails loudly.
            fixed = {
                name: compiled.params[name]
                for bind, name in compiled.bind_names.items()
                if not bind.required
            }
            self.dbapi_sql[id(stmt)] = (str(compiled), fixed)


class _DBAPIRows:
    """What the hot path reads of a ``CursorResult`` (``first``, ``rowcount``), over a
    DBAPI cursor."""

    __slots__ = ("_cur",)

    def __init__(self, cur: Any) -> None:
        self._cur = cur

    @property
    def rowcount(self) -> int:
        return int(self._cur.rowcount)

    def first(self) -> Any:
        # All rows: a RETURNING statement left unfinished would hold up the COMMIT.
        rows = self._cur.fetchall()
        return rows[0] if rows else None

    def all(self) -> list[Any]:
        return list(self._cur.fetchall())


class _DBAPIConn:
    """``Connection.execute`` for the hot path's statements, on the DBAPI connection.

    SQLite only. The SQL is SQLAlchemy's, compiled once per statement by the SQLite
    dialect (``_Prepared.dbapi_sql``); only the execution skips SQLAlchemy's per-call
    work (execution context, events, result wrapping), which cost twice the statements
    themselves: a put + finish took 0.88 ms of CPU through ``Connection.execute`` and
    0.40 ms through the cursor (micro-bench on a file database, same statements). Any
    other statement goes through ``fallback``, the ``Connection`` whose transaction this
    runs in (None: the caller runs the transaction on the DBAPI connection itself, and
    every statement must be a prepared one).
    """

    __slots__ = ("_fallback", "_raw", "_sql")

    def __init__(
        self, raw: Any, sql: Mapping[int, tuple[str, dict[str, Any]]], fallback: Connection | None
    ) -> None:
        self._raw = raw
        self._sql = sql
        self._fallback = fallback

    def execute(self, stmt: Any, params: Mapping[str, Any] | None = None) -> Any:
        found = self._sql.get(id(stmt))
        if found is None:
            if self._fallback is None:
                raise LookupError(f"not prepared for the DBAPI connection: {stmt}")
            return self._fallback.execute(stmt, params)
        text_, fixed = found
        args = {**fixed, **params} if fixed and params else params or fixed
        return _DBAPIRows(self._raw.execute(text_, args))


class LeaseStore:
    """Pending leases and shard flags in SQL (SQLite or PostgreSQL)."""

    def __init__(self, url: str | None = None, *, engine: Engine | None = None) -> None:
        """Open (and create if needed) the store.

        Args:
            url: SQLAlchemy URL; defaults to ``$HEADWAY_DATABASE_URL`` or a SQLite file
                under ``.headway/``. ``sqlite://`` (no path) is one shared in-memory db.
            engine: an existing engine instead of ``url``.
        """
        if engine is None:
            url = url or os.environ.get("HEADWAY_DATABASE_URL") or DEFAULT_DATABASE_URL
            engine = _make_engine(url)
        self.engine = engine
        self._prep = _Prepared(engine.dialect.name)
        # SQLite allows one writer at a time; serializing in-process avoids busy retries
        # (and the in-memory database shares one connection between threads). With every
        # call serialized, one connection kept open serves them all: checking one out of
        # the pool per transaction (a new ``Connection``, its event dispatch, the pool's
        # reset on return) cost more than the statements of a lease write (py-spy, e2e
        # bench: 0.64 of the store's 0.95 ms per action).
        self._lock: threading.Lock | None = (
            threading.Lock() if engine.dialect.name == "sqlite" else None
        )
        self._conn: Connection | None = None
        #: SQLite: the connection of ``apply_nowait`` (busy timeout 0), also kept.
        self._nowait: Connection | None = None
        # The schema is the migrations' (one at a time, under a lock: see there): an
        # empty database is made, an older one upgraded, a current one left as it is.
        migrations.upgrade(engine)

    @property
    def dialect(self) -> str:
        return self.engine.dialect.name

    def close(self) -> None:
        """Close the kept connection and release the connection pool."""
        if self._lock is not None:
            with self._lock:
                for conn in (self._conn, self._nowait):
                    if conn is not None:
                        conn.close()
                self._conn = self._nowait = None
        self.engine.dispose()

    @contextmanager
    def _tx(self) -> Iterator[Connection]:
        """One transaction, committed on success and rolled back on error.

        SQLite: serialized in-process, on the one kept connection (opened again if it
        was invalidated); its ``BEGIN IMMEDIATE`` comes from the engine's begin event.
        PostgreSQL: a pooled connection per transaction, concurrent.
        """
        if self._lock is None:
            with self.engine.begin() as conn:
                yield conn
            return
        with self._lock:
            kept = self._conn
            if kept is None or kept.closed or kept.invalidated:
                if kept is not None:
                    kept.close()
                kept = self._conn = self.engine.connect()
            try:
                with kept.begin():
                    yield kept
            except sqlite3.Error:
                # Raised by a statement on the DBAPI cursor (``_DBAPIConn``), which
                # SQLAlchemy's disconnect check never saw: the next transaction starts
                # on a new connection rather than failing on this one.
                kept.invalidate()
                raise

    def _hot(self, conn: Connection) -> Connection | _DBAPIConn:
        """Where the hot path's statements run in ``conn``'s transaction (see
        ``_DBAPIConn``): on SQLite the DBAPI connection, elsewhere ``conn`` itself."""
        sql = self._prep.dbapi_sql
        return _DBAPIConn(conn.connection.dbapi_connection, sql, conn) if sql else conn

    # --- submitters ---------------------------------------------------------------

    def put_lease(
        self,
        tenant: str,
        action_id: str,
        queue: str,
        workflow_id: str,
        spec: Mapping[str, Any],
        submitted_at: float,
    ) -> Put:
        """Decide a submission at the door and, taken in, record its pending lease
        (idempotent) and flip its queue's flag; one transaction.

        The door (``headway.scheduler.door``) decides against the tenant's settings as
        its scheduler last pushed them (``set_door``), the queue's leases not yet ended,
        and the token buckets kept here, at ``submitted_at``; a refused submission
        writes no lease. A lease that exists already (a retried call) is taken again
        without being decided or charged again. A tenant whose scheduler never pushed
        its settings has no door yet: everything passes (its scheduler decides later).

        Returns:
            The ``Put``: whether the caller must nudge the scheduler, or the door's
            refusal.
        """
        res = self.apply([("put", (tenant, action_id, queue, workflow_id, spec, submitted_at))])[0]
        assert isinstance(res, Put)
        return res

    def _put_lease(
        self,
        conn: Connection | _DBAPIConn,
        tenant: str,
        action_id: str,
        queue: str,
        workflow_id: str,
        spec: Mapping[str, Any],
        submitted_at: float,
        *,
        flips: set[tuple[str, str]] | None = None,
        busy: dict[str, bool] | None = None,
        door: bool = True,
    ) -> Put:
        decided = self._door(conn, tenant, action_id, queue, submitted_at) if door else None
        if decided is not None and not decided.accepted:
            return Put(refused=decided)
        body = dict(spec)
        if decided is not None or not door:
            # Taken in at the door: the scheduler does not decide the door's rules again.
            body["door"] = True
        row = {
            "tenant": tenant,
            "action_id": action_id,
            "queue": queue,
            "workflow_id": workflow_id,
            "spec": json.dumps(body, separators=(",", ":")),
            "submitted_at": submitted_at,
            "status": "pending",
        }
        if self._prep.lease_insert is not None:
            inserted = conn.execute(self._prep.lease_insert, row).first() is not None
        else:  # pragma: no cover - other dialects
            inserted = self._insert_ignore(conn, LeaseRow, row)
        flipped = self._flip(conn, tenant, queue_channel(queue), flips)
        waits = busy.get(tenant) if busy is not None else None
        if waits is None:
            got = conn.execute(
                self._prep.flag_value, {"t": tenant, "c": WANTS_ENDS_CHANNEL}
            ).first()
            waits = bool(got[0]) if got is not None else False
            if busy is not None:
                busy[tenant] = waits
        return Put(nudge=flipped or not inserted, busy=waits)

    def _door(
        self,
        conn: Connection | _DBAPIConn,
        tenant: str,
        action_id: str,
        queue: str,
        now: float,
    ) -> Decision | None:
        """The door's decision on a submission, its buckets written; None: no door.

        None also for a lease that exists already (a retried write): it was taken in
        once, and is neither decided nor charged again.
        """
        prep = self._prep
        key = {"t": tenant, "q": queue}
        rows = conn.execute(prep.door_rows, key).all()
        if not rows or rows[0][0] != "":
            return None  # no door for this tenant yet (its scheduler never pushed one)
        if prep.door_rows_locked is not None and _limited(rows, queue):
            # PostgreSQL: concurrent writers of this tenant's buckets (or counters of
            # this queue) take turns on its rows, the tenant's first; unlimited
            # tenants and queues never wait here.
            rows = conn.execute(prep.door_rows_locked, key).all()
        if conn.execute(prep.lease_exists, {"t": tenant, "a": action_id}).first() is not None:
            return None
        org = rows[0]
        mine = next((r for r in rows[1:] if r[0] == queue), None) if queue else None
        door = None
        if mine is not None:
            door = QueueDoor(QueueStatus(mine[1]), mine[2], _rate(mine[3], mine[4]))
        held = 0
        if door is not None and door.depth is not None:
            # Counted up to the depth only: that answers "at the depth?" at any backlog.
            counted = conn.execute(prep.held, {**key, "n": door.depth}).first()
            held = int(counted[0]) if counted is not None else 0
        org_bucket = Bucket(org[5], org[6])
        q_bucket = Bucket(mine[5], mine[6]) if mine is not None else Bucket()
        d = decide(queue, door, _rate(org[3], org[4]), held, org_bucket, q_bucket, now)
        for name, before, after in (("", org_bucket, d.org), (queue, q_bucket, d.queue)):
            if after != before:
                conn.execute(
                    prep.door_bucket, {**key, "q": name, "k": after.tokens, "at": after.at}
                )
        return d

    def set_door(
        self, tenant: str, org_rate: RateLimit | None, queues: Mapping[str, QueueDoor]
    ) -> None:
        """Replace the tenant's door settings with these (the scheduler's, after a change).

        The tenant's submit rate, and each queue's status, depth and rate; a queue left
        out has no door any more (submissions to it are ``UnknownQueue``). The token
        buckets are kept across changes of settings (a lowered burst caps them at the
        next decision, as in the core).
        """
        for name in queues:
            if not name:
                raise ValueError(f"queue: {name!r} is not a queue name")
        doors = cast(Table, DoorRow.__table__)
        settings: list[dict[str, Any]] = [
            {"queue": "", "status": None, "depth": None, **_rate_cols(org_rate)}
        ]
        settings += [
            {"queue": n, "status": q.status.value, "depth": q.depth, **_rate_cols(q.rate)}
            for n, q in sorted(queues.items())
        ]
        with self._tx() as conn:
            mine = DoorRow.tenant == tenant
            lock: Any = select(DoorRow.queue).where(mine).order_by(DoorRow.queue)
            if self.dialect == "postgresql":
                lock = lock.with_for_update()
            have = {r[0] for r in conn.execute(lock)}
            gone = sorted(have - {s["queue"] for s in settings})
            if gone:
                conn.execute(delete(DoorRow).where(mine & DoorRow.queue.in_(gone)))
            for row in settings:
                cols = {k: row[k] for k in ("status", "depth", "rate", "burst")}
                if row["queue"] in have:
                    conn.execute(
                        update(doors)
                        .where((doors.c.tenant == tenant) & (doors.c.queue == row["queue"]))
                        .values(**cols)
                    )
                else:
                    self._insert_ignore(
                        conn,
                        DoorRow,
                        {"tenant": tenant, "queue": row["queue"], **cols, "token_time": 0.0},
                    )

    def door(self, tenant: str) -> dict[str, dict[str, Any]]:
        """The tenant's door rows by queue ("": the tenant's own), as stored."""
        with self._tx() as conn:
            rows = conn.execute(
                select(
                    DoorRow.queue,
                    DoorRow.status,
                    DoorRow.depth,
                    DoorRow.rate,
                    DoorRow.burst,
                    DoorRow.tokens,
                    DoorRow.token_time,
                ).where(DoorRow.tenant == tenant)
            ).all()
        keys = ("status", "depth", "rate", "burst", "tokens", "token_time")
        return {r[0]: dict(zip(keys, r[1:], strict=True)) for r in rows}

    def held_count(self, tenant: str, queue: str) -> int:
        """The leases of ``queue`` not yet ended (what its depth is compared with)."""
        with self._tx() as conn:
            return int(
                conn.execute(
                    select(func.count()).where(
                        (LeaseRow.tenant == tenant)
                        & (LeaseRow.queue == queue)
                        & LeaseRow.done.is_(None)
                    )
                ).scalar_one()
            )

    def apply(self, ops: Sequence[tuple[str, tuple[Any, ...]]]) -> list[Nudge | Put]:
        """Several ``put_lease`` / ``finish_lease`` calls in one transaction (group commit).

        ``ops`` are ``("put", put_lease args)``, ``("finish", finish_lease args)`` or
        ``("record", (values,))`` (a finished action's record, ``headway.store.history``:
        one row of ``FINISHED_COLUMNS``, written unless the action has one); results are
        what the calls would return one after another, in order (a put's ``Put``, a
        finish's ``Nudge``, a record's ``Nudge.NONE``); the door decides the puts in their
        order.
        """
        _check_ops(ops)
        with self._tx() as conn:
            return self._apply_in(conn, ops)

    def apply_nowait(self, ops: Sequence[tuple[str, tuple[Any, ...]]]) -> list[Nudge | Put] | None:
        """``apply`` on the calling thread when it cannot wait for anyone; else None.

        For the worker's event loop, whose group commits were each handed to a thread
        and back: ~0.2 ms of CPU per hand-off (thread wake-up, GIL hand-over, the
        result's trip back to the loop), twice per action, more than the SQLite
        transaction itself (~0.15 ms). So with SQLite, when the store's lock is free (no
        other thread of this process is in a transaction) and the database's write lock
        is free too (tried with a zero busy timeout, so another process's writer never
        blocks the loop), the batch commits right here. Anything else returns None at
        once, and the caller takes the thread as before. PostgreSQL: always None (each
        statement is a network round trip).

        Raises:
            ValueError: an op is malformed (as ``apply``).
        """
        _check_ops(ops)
        lock = self._lock
        if lock is None or not lock.acquire(blocking=False):
            return None
        try:
            if self._conn is None:
                return None  # the store's first transaction goes the thread's way
            fast = self._nowait
            if fast is None or fast.closed or fast.invalidated:
                if fast is not None:
                    fast.close()
                fast = self._nowait = self.engine.connect()
                # Its own connection, so that the zero busy timeout is set once, not
                # around every batch (each statement also hands the GIL over once).
                dbapi: Any = fast.connection.dbapi_connection
                dbapi.execute("PRAGMA busy_timeout = 0")
                dbapi.execute(f"PRAGMA wal_autocheckpoint = {NOWAIT_CHECKPOINT_PAGES}")
            # The transaction too runs on the DBAPI connection, which only this method
            # uses: SQLAlchemy's begin (its event, then BEGIN IMMEDIATE through
            # exec_driver_sql) and commit were half of this call's CPU (py-spy, e2e loop).
            raw: Any = fast.connection.dbapi_connection
            try:
                try:
                    raw.execute("BEGIN IMMEDIATE")
                except sqlite3.OperationalError as err:
                    if "database is locked" not in str(err):
                        raise
                    return None
                try:
                    out = self._apply_in(_DBAPIConn(raw, self._prep.dbapi_sql, None), ops)
                    raw.execute("COMMIT")
                except BaseException:
                    if raw.in_transaction:
                        raw.execute("ROLLBACK")
                    raise
            except sqlite3.Error:
                # SQLAlchemy's own check for a lost connection does not see these calls:
                # the next call starts on a new connection rather than failing on this one.
                fast.invalidate()
                raise
            return out
        finally:
            lock.release()

    def _apply_in(
        self, conn: Connection | _DBAPIConn, ops: Sequence[tuple[str, tuple[Any, ...]]]
    ) -> list[Nudge | Put]:
        if isinstance(conn, Connection):
            self._lock_flags(conn, ops)
            hot = self._hot(conn)
        else:
            hot = conn  # SQLite (no flag locks to take)
        # One flag write per channel per batch: after the first op of a channel has
        # flipped (or found set) its flag, it stays set until this commit, so the later
        # ops' flips would all answer "already set" anyway. ``wants-ends`` is read once
        # per tenant (nothing in a batch writes it).
        flips: set[tuple[str, str]] = set()
        busy: dict[str, bool] = {}
        out: list[Nudge | Put] = []
        for kind, args in ops:
            if kind == "put":
                out.append(self._put_lease(hot, *args, flips=flips, busy=busy))
            elif kind == "requeue":
                out.append(self._requeue(hot, *args, flips=flips, busy=busy))
            elif kind == "finish":
                out.append(self._finish_lease(hot, *args, flips=flips))
            else:
                self._record_finished(hot, *args)
                out.append(Nudge.NONE)
        return out

    def _record_finished(self, conn: Connection | _DBAPIConn, values: Mapping[str, Any]) -> None:
        """Insert a finished action's record (``headway.store.history``) unless its
        tenant and action id have one."""
        if self._prep.finished_insert is None:  # pragma: no cover - other dialects
            if isinstance(conn, Connection):
                self._insert_ignore(conn, FinishedRow, dict(values))
            return
        conn.execute(self._prep.finished_insert, values)

    def requeue(
        self,
        tenant: str,
        ended: str,
        action_id: str,
        queue: str,
        workflow_id: str,
        spec: Mapping[str, Any],
        submitted_at: float,
    ) -> Put:
        """End the lease ``ended`` (finished) and put ``action_id``'s in one transaction:
        the next attempt of an action that failed retryably (``RetryPolicy``).

        The new lease passes no door (the action was taken in once; its depth slot
        passes from one lease to the other) and carries ``submitted_at`` as given (the
        action's first submit time: it waits at the head of its queue). Idempotent as a
        put and a finish are.

        Returns:
            The ``Put``: ``nudge`` when either write needs the scheduler told (one nudge
            serves both: a sync claims ends and leases alike).
        """
        args = (tenant, ended, action_id, queue, workflow_id, spec, submitted_at)
        res = self.apply([("requeue", args)])[0]
        assert isinstance(res, Put)
        return res

    def _requeue(
        self,
        conn: Connection | _DBAPIConn,
        tenant: str,
        ended: str,
        action_id: str,
        queue: str,
        workflow_id: str,
        spec: Mapping[str, Any],
        submitted_at: float,
        *,
        flips: set[tuple[str, str]] | None = None,
        busy: dict[str, bool] | None = None,
    ) -> Put:
        end = self._finish_lease(conn, tenant, ended, "finished", flips=flips)
        put = self._put_lease(
            conn,
            tenant,
            action_id,
            queue,
            workflow_id,
            spec,
            submitted_at,
            flips=flips,
            busy=busy,
            door=False,
        )
        return Put(nudge=put.nudge or end is not Nudge.NONE, busy=put.busy)

    def put_many(
        self,
        tenant: str,
        rows: Iterable[tuple[str, str, str, Mapping[str, Any], float]],
        *,
        chunk: int = 20_000,
    ) -> int:
        """Bulk-load pending leases ``(action_id, queue, workflow_id, spec, submitted_at)``.

        For backfills and benchmarks: rows must be new (no idempotency), and the caller
        nudges once afterwards if the returned flags say so. Returns the number of rows.
        """
        n = 0
        queues: set[str] = set()
        batch: list[dict[str, Any]] = []
        table = cast(Table, LeaseRow.__table__)
        with self._tx() as conn:
            for action_id, queue, workflow_id, spec, at in rows:
                queues.add(queue)
                batch.append(
                    {
                        "tenant": tenant,
                        "action_id": action_id,
                        "queue": queue,
                        "workflow_id": workflow_id,
                        "spec": json.dumps(dict(spec), separators=(",", ":")),
                        "submitted_at": at,
                        "status": "pending",
                        "claim": None,
                        "done": None,
                        "done_claim": None,
                    }
                )
                if len(batch) >= chunk:
                    conn.execute(table.insert(), batch)
                    n += len(batch)
                    batch = []
            if batch:
                conn.execute(table.insert(), batch)
                n += len(batch)
            for q in sorted(queues):
                self._flip(conn, tenant, queue_channel(q))
            if self.dialect == "postgresql":
                # Fresh statistics, so the planner seeks through the pending index at
                # once rather than after autovacuum notices the bulk load.
                conn.exec_driver_sql("ANALYZE headway_leases")
        return n

    def finish_lease(self, tenant: str, action_id: str, kind: str) -> Nudge:
        """Record that an action ended (``finished``), was cancelled, or was rejected.

        A lease the scheduler never claimed is simply deleted (it never held anything);
        a rejected one too (the scheduler already forgot it). Otherwise ``done`` is set
        once and the ``done`` flag flipped.

        Returns:
            Whether and when the caller must nudge the scheduler: :attr:`Nudge.NOW` when
            this flipped the ``done`` flag while work waits (``wants-ends``),
            :attr:`Nudge.SOON` when it flipped it and nothing waits.
        """
        _check_kind(kind)
        with self._tx() as conn:
            return self._finish_lease(self._hot(conn), tenant, action_id, kind)

    def _finish_lease(
        self,
        conn: Connection | _DBAPIConn,
        tenant: str,
        action_id: str,
        kind: str,
        *,
        flips: set[tuple[str, str]] | None = None,
    ) -> Nudge:
        prep = self._prep
        key = {"t": tenant, "a": action_id}
        if kind == "rejected":
            conn.execute(prep.admission_delete, key)
            conn.execute(prep.lease_delete, key)
            return Nudge.NONE
        # A claimed lease (the common end) is marked in one statement; its admission row
        # is deleted with it when the scheduler has collected the end (``sync``). A
        # pending lease never had an admission (admissions follow claims).
        if not conn.execute(prep.mark_done, {**key, "k": kind}).rowcount:
            if conn.execute(prep.pending_delete, key).rowcount:
                return Nudge.NONE
            # Already marked (a retry) or gone: nudge again only if still unclaimed.
            row = conn.execute(prep.done_claim, key).first()
            if row is None or row[0] is not None:
                return Nudge.NONE
        elif not self._flip(conn, tenant, DONE_CHANNEL, flips):
            return Nudge.NONE
        # Read after the flip (see the module doc for why this order loses no wakeup).
        wants = conn.execute(prep.flag_value, {"t": tenant, "c": WANTS_ENDS_CHANNEL}).first()
        return Nudge.NOW if wants is not None and wants[0] else Nudge.SOON

    # --- in-process admissions -------------------------------------------------------

    def record_admissions(self, tenant: str, admissions: Mapping[str, Mapping[str, Any]]) -> None:
        """Durably record admissions about to be handed over in-process (not signalled).

        A retried first workflow task of such an action reads its admission back with
        :meth:`admission`. Idempotent (a retried dispatch rewrites the same rows).
        """
        if not admissions:
            return
        rows = [
            {"t": tenant, "a": a, "j": json.dumps(dict(d), separators=(",", ":"))}
            for a, d in admissions.items()
        ]
        with self._tx() as conn:
            if self._prep.admission_upsert is not None:
                conn.execute(self._prep.admission_upsert, rows)
                return
            conn.execute(  # pragma: no cover - other dialects
                delete(AdmissionRow).where(
                    (AdmissionRow.tenant == tenant) & AdmissionRow.action_id.in_(list(admissions))
                )
            )
            conn.execute(  # pragma: no cover
                cast(Table, AdmissionRow.__table__).insert(),
                [{"tenant": r["t"], "action_id": r["a"], "admission": r["j"]} for r in rows],
            )

    def admission(self, tenant: str, action_id: str) -> dict[str, Any] | None:
        """The admission recorded for ``action_id`` by :meth:`record_admissions`, if any."""
        with self._tx() as conn:
            row = conn.execute(
                select(AdmissionRow.admission).where(
                    (AdmissionRow.tenant == tenant) & (AdmissionRow.action_id == action_id)
                )
            ).first()
        return cast(dict[str, Any], json.loads(row[0])) if row else None

    # --- the scheduler ------------------------------------------------------------

    def sync(
        self,
        tenant: str,
        token: str,
        room: Mapping[str, int],
        *,
        default_room: int = 500,
        max_leases: int = 2000,
        max_done: int = 5000,
        forget: Sequence[str] = (),
        wants_ends: bool | None = None,
        keep: Sequence[str] = (),
    ) -> SyncResult:
        """Claim new leases and ends for the scheduler, idempotently per ``token``.

        Args:
            tenant: the shard.
            token: unique per sync call of the scheduler (deterministic: run id + counter);
                a retry with the same token returns exactly what the first attempt claimed.
            room: free window slots per queue; a queue with 0 room is not read, and its
                flag ends set if it has pending leases (so submitters stay silent until
                the window drains), clear if it has none.
            default_room: room of queues the scheduler does not know (to be rejected).
            max_leases: cap of leases per sync, to bound the activity result payload.
            max_done: cap of ends per sync.
            forget: action ids whose leases the scheduler dropped (workflow gone).
            wants_ends: the scheduler's ``wants-ends`` (whether its last pass left work
                waiting); None leaves the flag as it is.
            keep: tokens of earlier syncs whose results may not be recorded in the
                scheduler's history yet (their workflow task may still be lost): the ends
                they claimed stay. Every other earlier claim was applied for good, and
                its rows go.
        """
        with self._tx() as conn:
            prior = self._answered(conn, tenant, token)
            if prior is not None:  # this very sync committed before (forget included)
                return prior
            prep = self._prep
            out = SyncResult()
            # Flags first, lease rows last: group commits lock in the same order (see
            # _lock_flags), so the two never deadlock on PostgreSQL.
            if wants_ends is not None:
                self._set_flag(conn, tenant, WANTS_ENDS_CHANNEL, wants_ends)
            self._clear(conn, tenant, DONE_CHANNEL)
            # Every set queue flag is cleared before the scan below reads leases (what a
            # submitter commits after that nudges by itself), and set again only for a
            # queue this sync leaves leases behind in: the scheduler comes back for
            # those by itself. A flag with nothing behind it (its lease was cancelled
            # before its claim) must not stay set, or the queue's next submitter would
            # stay silent.
            dirty = [r[0][2:] for r in conn.execute(prep.dirty_queue_flags, {"t": tenant})]
            for queue in dirty:
                self._clear(conn, tenant, queue_channel(queue))
            ids = [r[0] for r in conn.execute(prep.done_ids, {"t": tenant, "n": max_done + 1})]
            out.more_done = len(ids) > max_done
            ids = ids[:max_done]
            budget = max_leases
            claims: list[int] = []
            more: list[str] = []
            for queue in self._pending_queues(conn, tenant):
                want = min(room.get(queue, default_room), budget)
                if want <= 0:
                    more.append(queue)
                    continue
                rows = conn.execute(
                    prep.pending_ids, {"t": tenant, "q": queue, "n": want + 1}
                ).all()
                got = [r[0] for r in rows[:want]]
                if len(rows) > want:
                    more.append(queue)
                claims += got
                budget -= len(got)
            for queue in sorted(set(dirty) & set(more)):  # rows locked above already
                self._flip_row(conn, tenant, queue_channel(queue))
            # Lease rows.
            if forget:
                conn.execute(
                    delete(LeaseRow).where(
                        (LeaseRow.tenant == tenant) & LeaseRow.action_id.in_(list(forget))
                    )
                )
                conn.execute(
                    delete(AdmissionRow).where(
                        (AdmissionRow.tenant == tenant) & AdmissionRow.action_id.in_(list(forget))
                    )
                )
            # Ends the scheduler applied in an earlier sync are durable in its history.
            if keep:
                args = {"t": tenant, "tok": token, "keep": list(keep)}
                conn.execute(prep.collected_admissions_delete_kept, args)
                conn.execute(prep.collected_delete_kept, args)
            else:
                conn.execute(prep.collected_admissions_delete, {"t": tenant, "tok": token})
                conn.execute(prep.collected_delete, {"t": tenant, "tok": token})
            if ids:
                conn.execute(prep.claim_done, {"ids": ids, "tok": token})
                out.done = [[a, str(d)] for a, d in conn.execute(prep.done_rows, {"ids": ids})]
            if claims:
                conn.execute(prep.claim, {"ids": claims, "tok": token})
            out.leases = self._leases_claimed(conn, tenant, token)
            out.more = more
            self._remember(conn, tenant, token, out, keep)
            return out

    # --- introspection ------------------------------------------------------------

    def pending_count(self, tenant: str, queue: str | None = None) -> int:
        """Leases not yet claimed by the scheduler."""
        cond = (LeaseRow.tenant == tenant) & (LeaseRow.status == "pending")
        if queue is not None:
            cond = cond & (LeaseRow.queue == queue)
        with self._tx() as conn:
            return int(conn.execute(select(func.count()).where(cond)).scalar_one())

    def lease_count(self, tenant: str) -> int:
        """All lease rows of a tenant (pending, claimed, or ended but not yet collected)."""
        with self._tx() as conn:
            return int(
                conn.execute(select(func.count()).where(LeaseRow.tenant == tenant)).scalar_one()
            )

    def flag(self, tenant: str, channel: str) -> bool:
        """Current value of a shard flag (False if never set)."""
        with self._tx() as conn:
            row = conn.execute(
                select(ShardFlag.dirty).where(
                    (ShardFlag.tenant == tenant) & (ShardFlag.channel == channel)
                )
            ).first()
            return bool(row[0]) if row else False

    # --- internals ----------------------------------------------------------------

    def _insert_ignore(
        self, conn: Connection | _DBAPIConn, model: type[Base], values: dict[str, Any]
    ) -> bool:
        table = cast(Table, model.__table__)
        stmt: Any
        if self.dialect == "postgresql":
            stmt = postgresql.insert(table).values(**values).on_conflict_do_nothing()
        elif self.dialect == "sqlite":
            stmt = sqlite.insert(table).values(**values).on_conflict_do_nothing()
        else:  # pragma: no cover - other dialects: best effort
            exists = conn.execute(
                select(func.count())
                .select_from(table)
                .where(
                    *[
                        table.c[k] == v
                        for k, v in values.items()
                        if k in ("tenant", "action_id", "channel")
                    ]
                )
            ).scalar_one()
            if exists:
                return False
            stmt = table.insert().values(**values)
        # rowcount is unreliable with (implicit) RETURNING; ask for a row instead.
        pk = next(iter(table.primary_key))
        return conn.execute(stmt.returning(pk)).first() is not None

    def _flip(
        self,
        conn: Connection | _DBAPIConn,
        tenant: str,
        channel: str,
        flips: set[tuple[str, str]] | None = None,
    ) -> bool:
        """Set a channel's flag; True if it was clear (the caller must nudge).

        ``flips``: channels this transaction has set already (skipped: still set).
        """
        if flips is not None:
            if (tenant, channel) in flips:
                return False
            flips.add((tenant, channel))
        return self._flip_row(conn, tenant, channel)

    def _flip_row(self, conn: Connection | _DBAPIConn, tenant: str, channel: str) -> bool:
        if self._prep.flip is not None:
            return conn.execute(self._prep.flip, {"t": tenant, "c": channel}).first() is not None
        self._insert_ignore(conn, ShardFlag, {"tenant": tenant, "channel": channel, "dirty": False})
        return bool(
            conn.execute(
                update(ShardFlag)
                .where(
                    (ShardFlag.tenant == tenant)
                    & (ShardFlag.channel == channel)
                    & ShardFlag.dirty.is_(False)
                )
                .values(dirty=True)
            ).rowcount
        )

    def _lock_flags(self, conn: Connection, ops: Sequence[tuple[str, tuple[Any, ...]]]) -> None:
        """PostgreSQL: lock the flag rows a batch may write, first and in sorted order.

        A sync locks flags first (``done``, then queues by name) and lease rows after;
        a batch that wrote leases and flags op by op, several queues in any order,
        deadlocked against it and against other workers' batches (measured: 3 of ~1,600
        batches of four workers). Taken this way, every transaction locks flags in one
        order and before lease rows. SQLite serializes writers anyway.
        """
        if self._prep.lock_flags is None:
            return
        keys: set[tuple[str, str]] = set()
        for kind, args in ops:
            if kind == "put":
                keys.add((args[0], queue_channel(args[2])))
            elif kind == "requeue":  # an end and a put
                keys.add((args[0], DONE_CHANNEL))
                keys.add((args[0], queue_channel(args[3])))
            elif kind == "finish" and args[2] != "rejected":
                keys.add((args[0], DONE_CHANNEL))
            # A record writes no flag.
        ordered = sorted(keys)
        for t, c in ordered:
            conn.execute(self._prep.ensure_flags, {"t": t, "c": c})
        conn.execute(self._prep.lock_flags, {"keys": ordered})

    def _set_flag(self, conn: Connection, tenant: str, channel: str, value: bool) -> None:
        if not conn.execute(self._prep.set_flag, {"t": tenant, "c": channel, "v": value}).rowcount:
            self._insert_ignore(
                conn, ShardFlag, {"tenant": tenant, "channel": channel, "dirty": value}
            )

    def _clear(self, conn: Connection, tenant: str, channel: str) -> None:
        conn.execute(self._prep.clear, {"t": tenant, "c": channel})

    def _pending_queues(self, conn: Connection, tenant: str) -> list[str]:
        return [r[0] for r in conn.execute(self._prep.pending_queues, {"t": tenant})]

    def _leases_claimed(self, conn: Connection, tenant: str, token: str) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        for spec, wf_id, at in conn.execute(self._prep.claimed, {"t": tenant, "tok": token}):
            d = json.loads(spec)
            d["workflow_id"] = wf_id
            d["submit"] = at
            out.append(d)
        return out

    def _answered(self, conn: Connection, tenant: str, token: str) -> SyncResult | None:
        """What sync ``token`` answered, if it committed: its claims, read back, and the
        rest as recorded (computed again, a retry could answer otherwise than the first
        try, whose answer a lost workflow task may already have acted on)."""
        row = conn.execute(
            select(SyncRow.more, SyncRow.more_done).where(
                (SyncRow.tenant == tenant) & (SyncRow.token == token)
            )
        ).first()
        prior = self._claimed_by(conn, tenant, token)
        if row is None:
            # Committed before sync answers were kept (or never): the claims tell.
            if prior is not None:
                prior.more = self._pending_queues(conn, tenant)
            return prior
        prior = prior or SyncResult()
        prior.more, prior.more_done = json.loads(row.more), bool(row.more_done)
        return prior

    def _remember(
        self, conn: Connection, tenant: str, token: str, out: SyncResult, keep: Sequence[str]
    ) -> None:
        """Keep this sync's answer while its workflow task may be lost (``keep`` names the
        earlier ones that may be); forget every other."""
        conn.execute(
            delete(SyncRow).where((SyncRow.tenant == tenant) & SyncRow.token.not_in([token, *keep]))
        )
        conn.execute(
            insert(SyncRow).values(
                tenant=tenant, token=token, more=json.dumps(out.more), more_done=out.more_done
            )
        )

    def _claimed_by(self, conn: Connection, tenant: str, token: str) -> SyncResult | None:
        leases = self._leases_claimed(conn, tenant, token)
        done = [
            [a, str(d)]
            for a, d in conn.execute(self._prep.claimed_done, {"t": tenant, "tok": token})
        ]
        if not leases and not done:
            return None
        return SyncResult(leases=leases, done=done)


def _rate(per_second: float | None, burst: float | None) -> RateLimit | None:
    return RateLimit(per_second, burst) if per_second is not None and burst is not None else None


def _rate_cols(rate: RateLimit | None) -> dict[str, float | None]:
    if rate is None:
        return {"rate": None, "burst": None}
    return {"rate": rate.per_second, "burst": rate.burst}


def _limited(rows: Sequence[Any], queue: str) -> bool:
    """Whether a submission to ``queue`` reads or writes door state (so must lock it)."""
    org = rows[0]
    if org[3] is not None:
        return True
    return any(r[0] == queue and (r[2] is not None or r[3] is not None) for r in rows[1:])


def _check_ops(ops: Sequence[tuple[str, tuple[Any, ...]]]) -> None:
    for kind, args in ops:
        if kind == "finish":
            _check_kind(args[2])
        elif kind == "record":
            missing = set(FINISHED_COLUMNS) - set(args[0])
            if missing:
                raise ValueError(f"record: missing {', '.join(sorted(missing))}")
        elif kind not in ("put", "requeue"):
            raise ValueError(f"op: {kind!r} is not put, requeue, finish or record")


def _check_kind(kind: str) -> None:
    if kind not in (*_MARKED_ENDS, "rejected"):
        raise ValueError(f"kind: {kind!r} is not one of finished, cancelled, rejected")


def _make_engine(url: str) -> Engine:
    if not url.startswith("sqlite"):
        return create_engine(url, pool_pre_ping=True)
    path = url.split("///", 1)[1] if "///" in url else ""
    if path and path != ":memory:":
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        engine = create_engine(
            url, connect_args={"timeout": 60, "check_same_thread": False}, pool_size=8
        )
    else:
        # One shared connection: every thread must see the same in-memory database.
        engine = create_engine(
            "sqlite://",
            connect_args={"check_same_thread": False},
            poolclass=StaticPool,
        )

    # pysqlite's own transaction handling begins lazily and upgrades read locks to write
    # locks mid-transaction, which deadlocks concurrent writers; take the write lock up
    # front instead (SQLAlchemy's documented recipe).
    @event.listens_for(engine, "connect")
    def _connect(dbapi_conn: Any, _record: Any) -> None:
        dbapi_conn.isolation_level = None
        if path and path != ":memory:":
            dbapi_conn.execute("PRAGMA journal_mode=WAL")
            dbapi_conn.execute("PRAGMA synchronous=NORMAL")

    @event.listens_for(engine, "begin")
    def _begin(conn: Connection) -> None:
        conn.exec_driver_sql("BEGIN IMMEDIATE")

    return engine
