"""The PostgreSQL database of the store tests: a fresh one per test session.

``HEADWAY_TEST_POSTGRES_URL`` names a server and a database to connect through; the
tests run in a database of their own made there (dropped at the end), so nothing left by
an earlier run (a branch's migration, a killed run's rows) decides this one's outcome.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from headway.store import LeaseStore
from sqlalchemy import create_engine, make_url, text

from .test_leases import BACKENDS, PG


@contextlib.contextmanager
def fresh_database(prefix: str) -> Iterator[str]:
    """The URL of a new, empty PostgreSQL database on ``PG``'s server, dropped after."""
    assert PG is not None
    name = f"{prefix}_{uuid.uuid4().hex[:12]}"
    admin = create_engine(PG, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    try:
        yield make_url(PG).set(database=name).render_as_string(hide_password=False)
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


@pytest.fixture(scope="session")
def pg_url() -> Iterator[str]:
    with fresh_database("hw_store") as url:
        yield url


@pytest.fixture(params=BACKENDS)
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[LeaseStore]:
    """A store on SQLite (a file of this test's), and on the session's PostgreSQL."""
    url = (
        f"sqlite:///{tmp_path / 'l.db'}"
        if request.param == "sqlite"
        else request.getfixturevalue("pg_url")
    )
    s = LeaseStore(url)
    yield s
    s.close()


@pytest.fixture
def tenant() -> str:
    # Unique per test: the PostgreSQL database is shared by the session's tests.
    return f"t{uuid.uuid4().hex[:10]}"
