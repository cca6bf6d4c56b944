"""Migrations of the lease store's schema (Alembic).

:func:`upgrade` brings a database to the newest revision; ``LeaseStore`` calls it when it
opens one, so a worker, the CLI or a test never runs against an older schema. The
revisions are in ``versions/``:

* ``r0001``: the baseline, the schema the store made before it had migrations
  (``create_all``). Written with ``if_not_exists``, so a database made by that code (no
  version table) is upgraded by the same path as an empty one: what it has is kept, an
  index it lacks (added to the code after the database was made) is created.
* ``r0002``: the door (``headway_doors``) and the index it counts held leases with.
* ``r0003``: sync answers (``headway_syncs``), so a retried sync answers as its first try.
* ``r0004``: configuration (``headway_tenants``, ``headway_configs``) and its audit trail
  (``headway_config_audit``).
* ``r0005``: the record of what ran (``headway_finished``), for export and review.

A schema change is a new revision here (``alembic revision -m ...`` with this directory
as ``script_location``, or a file written by hand) and the matching change of
``store/models.py``; ``tests/store/test_migrations.py`` checks that the two agree.

Concurrent openers (several workers starting at once) take turns: the upgrade runs in
one transaction, under a transaction-scoped advisory lock on PostgreSQL; on SQLite the
database's own write lock orders them, and an opener told "database is locked" tries
again. Each reads the revision inside its transaction.
"""

from __future__ import annotations

import time
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Engine, text
from sqlalchemy.exc import OperationalError

__all__ = ["HERE", "VERSION_TABLE", "config", "current", "head", "upgrade"]

HERE = Path(__file__).parent
#: Alembic's version table, named for Headway so it cannot clash in a shared database.
VERSION_TABLE = "headway_alembic_version"
# pg_advisory_xact_lock key of the upgrade ("headway" in ASCII, as a number).
_PG_LOCK_KEY = 0x68656164776179


def config() -> Config:
    """An Alembic configuration for this directory (no ``alembic.ini`` needed)."""
    cfg = Config()
    cfg.set_main_option("script_location", str(HERE))
    return cfg


def head() -> str:
    """The newest revision."""
    rev = ScriptDirectory.from_config(config()).get_current_head()
    assert rev is not None
    return rev


def current(engine: Engine) -> str | None:
    """The revision a database is at (None: none recorded)."""
    with engine.connect() as conn:
        return MigrationContext.configure(
            conn, opts={"version_table": VERSION_TABLE}
        ).get_current_revision()


def upgrade(engine: Engine, revision: str = "head") -> None:
    """Upgrade the database of ``engine`` to ``revision`` (default: the newest).

    On SQLite, an opener whose read transaction meets another's write gets "database is
    locked" at once (SQLite returns busy instead of waiting when waiting could deadlock):
    it tries again, briefly backing off; the upgrade reads the revision afresh each time.
    """
    for attempt in range(_SQLITE_TRIES):
        try:
            _upgrade(engine, revision)
            return
        except OperationalError as err:
            locked = "database is locked" in str(err)
            if engine.dialect.name != "sqlite" or not locked or attempt == _SQLITE_TRIES - 1:
                raise
            time.sleep(0.05 * (attempt + 1))


_SQLITE_TRIES = 20


def _upgrade(engine: Engine, revision: str) -> None:
    cfg = config()
    with engine.begin() as conn:
        if conn.dialect.name == "postgresql":
            conn.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": _PG_LOCK_KEY})
        # env.py runs the revisions on this connection, in this transaction.
        cfg.attributes["connection"] = conn
        command.upgrade(cfg, revision)
