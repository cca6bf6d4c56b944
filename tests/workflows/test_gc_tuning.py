"""``headway.worker.gc_tuning``: a worker process freezes what it started with."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest
from headway.worker.gc_tuning import YOUNG_THRESHOLD, freeze_startup, set_young_threshold


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
        calls.append(f"body frozen={gc.get_freeze_count() > 0} young={gc.get_threshold()[0]}")

    monkeypatch.setattr(cli_worker, "connect_retrying", connect)
    monkeypatch.delenv("HEADWAY_GC_FREEZE", raising=False)
    monkeypatch.delenv("HEADWAY_GC_YOUNG", raising=False)
    before = gc.get_threshold()
    try:
        asyncio.run(cli_worker._serve(object(), body))  # type: ignore[arg-type]
    finally:
        gc.set_threshold(*before)
    assert calls == ["connect", f"body frozen=True young={YOUNG_THRESHOLD}"]


def test_the_worker_command_refuses_a_bad_young_threshold_before_connecting(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from click.testing import CliRunner
    from headway.cli.main import cli

    async def connect(cfg: object, timeout_s: float) -> object:
        raise AssertionError("connected despite the bad setting")

    from headway.cli import worker as cli_worker

    monkeypatch.setattr(cli_worker, "connect_retrying", connect)
    res = CliRunner().invoke(cli, ["worker", "control-plane"], env={"HEADWAY_GC_YOUNG": "lots"})
    assert res.exit_code != 0
    assert "HEADWAY_GC_YOUNG: 'lots' is not a whole number" in res.output


@pytest.fixture
def _threshold() -> Iterator[None]:
    before = gc.get_threshold()
    yield
    gc.set_threshold(*before)


@pytest.mark.usefixtures("_threshold")
@pytest.mark.parametrize(
    ("env", "young"),
    [
        pytest.param(None, YOUNG_THRESHOLD, id="default-raises-it-to-7000"),
        pytest.param("700", 700, id="python-default-on-request"),
        pytest.param(" 20000 ", 20_000, id="spaces-ignored"),
    ],
)
def test_set_young_threshold_changes_only_the_young_generation(
    monkeypatch: pytest.MonkeyPatch, env: str | None, young: int
) -> None:
    if env is None:
        monkeypatch.delenv("HEADWAY_GC_YOUNG", raising=False)
    else:
        monkeypatch.setenv("HEADWAY_GC_YOUNG", env)
    gc.set_threshold(700, 10, 10)
    assert set_young_threshold() == young
    assert gc.get_threshold() == (young, 10, 10)


@pytest.mark.usefixtures("_threshold")
@pytest.mark.parametrize("bad", ["0", "-5", "lots", "7e3"])
def test_a_bad_young_threshold_is_refused_by_name_and_value(
    monkeypatch: pytest.MonkeyPatch, bad: str
) -> None:
    monkeypatch.setenv("HEADWAY_GC_YOUNG", bad)
    gc.set_threshold(700, 10, 10)
    with pytest.raises(ValueError, match=f"HEADWAY_GC_YOUNG: '{bad}' is not a whole number"):
        set_young_threshold()
    assert gc.get_threshold() == (700, 10, 10)  # nothing changed
