"""Alembic's environment for the lease store.

``headway.store.migrations.upgrade`` hands its connection (in a transaction, under the
upgrade's lock) in ``config.attributes["connection"]``. Run from the ``alembic`` command
instead, the URL is ``sqlalchemy.url`` of its configuration, else
``$HEADWAY_DATABASE_URL``, else the store's default.
"""

from __future__ import annotations

import os

from alembic import context
from headway.store.leases import DEFAULT_DATABASE_URL
from headway.store.migrations import VERSION_TABLE
from headway.store.models import Base
from sqlalchemy import create_engine

config = context.config
conn = config.attributes.get("connection")
if conn is not None:
    context.configure(connection=conn, target_metadata=Base.metadata, version_table=VERSION_TABLE)
    with context.begin_transaction():
        context.run_migrations()
else:
    url = (
        config.get_main_option("sqlalchemy.url")
        or os.environ.get("HEADWAY_DATABASE_URL")
        or DEFAULT_DATABASE_URL
    )
    with create_engine(url).begin() as c:
        context.configure(connection=c, target_metadata=Base.metadata, version_table=VERSION_TABLE)
        context.run_migrations()
