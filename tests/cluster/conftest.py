"""Fixtures for the cluster-worker tests: a kmock-based kube API over real HTTP."""

from __future__ import annotations

from collections.abc import AsyncIterator

import kmock
import pytest_asyncio
from kubernetes import client as k8s

from .fake_kube import FakeKube


@pytest_asyncio.fixture
async def kube() -> AsyncIterator[FakeKube]:
    async with FakeKube() as server, kmock.Server(server):
        yield server
        # End the streams of clients that did not hang up, or the server waits for them.
        server.drop_watches()


@pytest_asyncio.fixture
async def api_client(kube: FakeKube) -> AsyncIterator[k8s.ApiClient]:
    cfg = k8s.Configuration()
    cfg.host = str(kube.url).rstrip("/")
    client = k8s.ApiClient(cfg)
    yield client
