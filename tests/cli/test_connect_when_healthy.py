"""``headway up`` connects once the server's frontend is healthy: its port opens first,
and a connect then fails with "Frontend is not healthy yet" (seen in CI under load)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import click
import pytest
from headway.cli._stack import Stack, _connect_when_healthy


class _Options:
    """Fails its first ``failures`` connects as the bridge does while the frontend starts."""

    def __init__(self, failures: int) -> None:
        self.failures = failures
        self.calls = 0

    async def connect(self, interceptors: Any) -> str:
        self.calls += 1
        if self.calls <= self.failures:
            raise RuntimeError("Failed client connect: Frontend is not healthy yet")
        return "client"


def _deadline(s: float) -> float:
    return asyncio.get_running_loop().time() + s


async def test_a_frontend_not_healthy_yet_is_waited_for(tmp_path: Path) -> None:
    options = _Options(failures=2)
    stack = Stack(tmp_path, "127.0.0.1:1", None)
    assert await _connect_when_healthy(stack, options, _deadline(10)) == "client"
    assert options.calls == 3


async def test_a_frontend_never_healthy_fails_naming_the_server(tmp_path: Path) -> None:
    stack = Stack(tmp_path, "127.0.0.1:1", None)
    with pytest.raises(click.ClickException, match=r"127\.0\.0\.1:1 did not become ready"):
        await _connect_when_healthy(stack, _Options(failures=10**6), _deadline(0.5))
