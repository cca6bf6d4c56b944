"""The PostgreSQL database of the store tests: a fresh one per test session.

``HEADWAY_TEST_POSTGRES_URL`` names a server and a database to connect through; the
tests run in a database of their own made there (dropped at the end), so nothing left by
an earlier run (a branch's migration, a killed run's rows) decides this one's outcome.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
from sqlalchemy import create_engine, make_url, text

from .test_leases import PG


@pytest.fixture(scope="session")
def pg_url() -> Iterator[str]:
    assert PG is not None
    name = f"hw_store_{uuid.uuid4().hex[:12]}"
    admin = create_engine(PG, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    try:
        yield make_url(PG).set(database=name).render_as_string(hide_password=False)
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()
