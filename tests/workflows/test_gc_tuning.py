"""``headway.worker.gc_tuning``: a worker process freezes what it started with."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest
from headway.worker.gc_tuning import freeze_startup


@pytest.fixture(autouse=True)
def _unfrozen() -> Iterator[None]:
    gc.unfreeze()
    yield
    gc.unfreeze()


@pytest.mark.parametrize(
    ("env", "frozen"),
    [
        pytest.param(None, True, id="default-freezes"),
        pytest.param("1", True, id="on-freezes"),
        pytest.param("0", False, id="zero-turns-it-off"),
        pytest.param(" 0 ", False, id="zero-with-spaces-turns-it-off"),
    ],
)
def test_freeze_startup_moves_live_objects_out_of_the_collectors_way(
    monkeypatch: pytest.MonkeyPatch, env: str | None, frozen: bool
) -> None:
    if env is None:
        monkeypatch.delenv("HEADWAY_GC_FREEZE", raising=False)
    else:
        monkeypatch.setenv("HEADWAY_GC_FREEZE", env)
    alive = [object() for _ in range(10)]
    assert freeze_startup() is frozen
    assert (gc.get_freeze_count() > len(alive)) is frozen
    # A cycle made afterwards (an evicted workflow instance, say) is collected as before.
    cycle: list[object] = []
    cycle.append(cycle)
    del cycle
    assert gc.collect() >= 1


def test_the_worker_command_freezes_after_connecting(monkeypatch: pytest.MonkeyPatch) -> None:
    """``headway worker ...`` freezes once connected, before the worker body runs."""
    import asyncio

    from headway.cli import worker as cli_worker

    calls: list[str] = []

    async def connect(cfg: object, timeout_s: float) -> object:
        calls.append("connect")
        return object()

    async def body(client: object, stop: asyncio.Event) -> None:
        calls.append(f"body frozen={gc.get_freeze_count() > 0}")

    monkeypatch.setattr(cli_worker, "connect_retrying", connect)
    monkeypatch.delenv("HEADWAY_GC_FREEZE", raising=False)
    asyncio.run(cli_worker._serve(object(), body))  # type: ignore[arg-type]
    assert calls == ["connect", "body frozen=True"]
