"""The store's schema through its migrations (Alembic): databases made before migrations
existed upgrade in place, keeping their rows; concurrent openers take turns; the models
and the migrations agree. SQLite, and PostgreSQL when HEADWAY_TEST_POSTGRES_URL is set
(each test in a database of its own)."""

from __future__ import annotations

import shutil
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from headway.scheduler.door import QueueDoor
from headway.scheduler.reasons import Reason
from headway.store import LeaseStore, migrations
from headway.store.config import ConfigStore
from headway.store.models import Base
from sqlalchemy import create_engine, inspect, text

from . import legacy_models
from .conftest import fresh_database
from .test_leases import PG

DATA = Path(__file__).parent / "data"
#: Made by the store at a297289 (``create_all``, before migrations): five leases of "q"
#: (a0, a1 claimed by sync "tok1", a0 then finished), one of "other" still pending, an
#: admission recorded for a1; all of tenant "old".
BEFORE_MIGRATIONS = DATA / "store-before-migrations.db"
#: Made by the store at r0003 (e785416): one pending lease of tenant "old" in queue "q",
#: the tenant's door and the queue's (depth 10); no configuration tables yet.
R0003 = DATA / "store-r0003.db"
BACKENDS = ["sqlite", *(["postgresql"] if PG else [])]


@pytest.fixture(params=BACKENDS)
def empty_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A URL of an empty database."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'm.db'}"
        return
    with fresh_database("hw_mig") as url:
        yield url


def tables(url: str) -> set[str]:
    engine = create_engine(url)
    try:
        return set(inspect(engine).get_table_names())
    finally:
        engine.dispose()


def test_a_new_database_is_made_at_the_newest_revision(empty_url: str) -> None:
    s = LeaseStore(empty_url)
    try:
        assert migrations.current(s.engine) == migrations.head() == "r0005"
    finally:
        s.close()
    assert tables(empty_url) == {
        "headway_leases",
        "headway_shard_flags",
        "headway_admissions",
        "headway_doors",
        "headway_syncs",
        "headway_tenants",
        "headway_configs",
        "headway_config_audit",
        "headway_finished",
        migrations.VERSION_TABLE,
    }


def test_the_models_and_the_migrations_agree(empty_url: str) -> None:
    """What the migrations make is what the models say (a column, an index, a type)."""
    s = LeaseStore(empty_url)
    try:
        with s.engine.connect() as conn:
            ctx = MigrationContext.configure(conn)
            diff = [
                d
                for d in compare_metadata(ctx, Base.metadata)
                if not (d[0] == "remove_table" and d[1].name == migrations.VERSION_TABLE)
            ]
        assert diff == []
    finally:
        s.close()


def check_upgraded(s: LeaseStore) -> None:
    """The rows of the database made before migrations, read through today's store."""
    assert migrations.current(s.engine) == migrations.head()
    assert s.lease_count("old") == 6
    assert s.pending_count("old", "q") == 3 and s.pending_count("old", "other") == 1
    assert s.admission("old", "a1") is not None
    # The claim survived: a retried sync with the same token answers the same leases.
    assert [d["id"] for d in s.sync("old", "tok1", {"q": 2}).leases] == ["a0", "a1"]
    # a0 ended: what "q" holds is the rest, which the door counts.
    assert s.held_count("old", "q") == 4
    # And the new table works on it: a door of depth 4 refuses the next one.
    s.set_door("old", None, {"q": QueueDoor(depth=4), "other": QueueDoor()})
    refused = s.put_lease("old", "a9", "q", "wf-a9", {"id": "a9"}, 10.0).refused
    assert refused is not None and refused.reason is Reason.QueueDepthExceeded
    assert s.put_lease("old", "b9", "other", "wf-b9", {"id": "b9"}, 10.0).refused is None
    assert s.lease_count("old") == 7


def test_a_sqlite_file_made_before_migrations_upgrades_in_place(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    shutil.copy(BEFORE_MIGRATIONS, path)
    assert tables(f"sqlite:///{path}") == {
        "headway_leases",
        "headway_shard_flags",
        "headway_admissions",
    }
    s = LeaseStore(f"sqlite:///{path}")
    try:
        check_upgraded(s)
    finally:
        s.close()
    # Opened again: at the newest revision already, nothing to do.
    LeaseStore(f"sqlite:///{path}").close()


def test_a_sqlite_file_of_the_r0003_schema_upgrades_and_keeps_its_rows(tmp_path: Path) -> None:
    """A database of the schema before configuration moved into SQL (a checked-in file
    made at r0003: a pending lease of tenant "old" in queue "q", its doors) gains the
    configuration tables and keeps what it had."""
    path = tmp_path / "r0003.db"
    shutil.copy(R0003, path)
    engine = create_engine(f"sqlite:///{path}")
    try:
        assert migrations.current(engine) == "r0003"
    finally:
        engine.dispose()
    s = LeaseStore(f"sqlite:///{path}")
    try:
        assert migrations.current(s.engine) == migrations.head()
        assert s.lease_count("old") == 1 and s.pending_count("old", "q") == 1
        assert s.door("old")["q"]["depth"] == 10
        config = ConfigStore(s)
        assert config.tenants() == [] and config.load("old") == {
            "queues": [],
            "org": None,
            "clusters": [],
            "environments": [],
        }
        config.save("old", {"q": {"name": "q", "depth": 10}}, None)
        assert config.tenants() == ["old"]
        assert config.load("old")["queues"] == [{"name": "q", "depth": 10}]
    finally:
        s.close()


def test_a_database_made_before_migrations_upgrades_in_place(
    empty_url: str, tmp_path: Path
) -> None:
    """The same with the models of that time (``legacy_models``), on either backend."""
    engine = create_engine(empty_url)
    legacy_models.Base.metadata.create_all(engine)
    # The rows from a copy, read with a plain engine (a LeaseStore would upgrade it).
    copy = tmp_path / "rows.db"
    shutil.copy(BEFORE_MIGRATIONS, copy)
    src = create_engine(f"sqlite:///{copy}")
    try:
        with src.connect() as a, engine.begin() as b:
            for table in legacy_models.Base.metadata.sorted_tables:
                rows = [dict(r._mapping) for r in a.execute(table.select())]
                if rows:
                    b.execute(table.insert(), rows)
            if b.dialect.name == "postgresql":  # ids were copied: move the sequence on
                b.execute(
                    text(
                        "SELECT setval(pg_get_serial_sequence('headway_leases', 'id'),"
                        " (SELECT max(id) FROM headway_leases))"
                    )
                )
    finally:
        src.dispose()
    engine.dispose()
    s = LeaseStore(empty_url)
    try:
        check_upgraded(s)
    finally:
        s.close()


def test_an_index_added_since_a_database_was_made_is_created_on_open(empty_url: str) -> None:
    s = LeaseStore(empty_url)
    with s.engine.begin() as conn:
        # As an older release made it: before migrations (no version table, no door),
        # and before this index.
        conn.exec_driver_sql("DROP INDEX ix_headway_leases_ended")
        conn.exec_driver_sql(f"DROP TABLE {migrations.VERSION_TABLE}")
        conn.exec_driver_sql("DROP TABLE headway_doors")
        conn.exec_driver_sql("DROP TABLE headway_syncs")
        for table in (
            "headway_config_audit",
            "headway_configs",
            "headway_tenants",
            "headway_finished",
        ):
            conn.exec_driver_sql(f"DROP TABLE {table}")
        conn.exec_driver_sql("DROP INDEX ix_headway_leases_held")
    s.close()
    s = LeaseStore(empty_url)
    try:
        indexes = {i["name"] for i in inspect(s.engine).get_indexes("headway_leases")}
        assert {"ix_headway_leases_ended", "ix_headway_leases_held"} <= indexes
        assert migrations.current(s.engine) == migrations.head()
    finally:
        s.close()


def test_concurrent_openers_take_turns(empty_url: str) -> None:
    """Workers starting at once on a new database: each opens it, none fails."""
    errors: list[BaseException] = []
    start = threading.Barrier(4)

    def open_it() -> None:
        try:
            start.wait()
            LeaseStore(empty_url).close()
        except BaseException as err:
            errors.append(err)

    threads = [threading.Thread(target=open_it) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    s = LeaseStore(empty_url)
    try:
        assert migrations.current(s.engine) == migrations.head()
    finally:
        s.close()
