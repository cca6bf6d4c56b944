"""Fair share of a control-plane worker between shards: pacing under contention only."""

from __future__ import annotations

import asyncio
import dataclasses
from datetime import timedelta
from typing import cast

import pytest
from headway.activities.dispatch import DispatchActivities
from headway.activities.fairness import ShardFairness
from temporalio.client import Client
from temporalio.testing import ActivityEnvironment

from .test_dispatch import FakeTemporal, batch


class FakeClock:
    """Monotonic seconds that move only when a paced sender sleeps."""

    def __init__(self) -> None:
        self.now = 100.0
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.now

    async def sleep(self, s: float) -> None:
        self.slept.append(s)
        self.now += s


def make_fairness(clock: FakeClock, rate: float = 10.0, burst: int = 3) -> ShardFairness:
    return ShardFairness(rate, burst, active_s=1.0, clock=clock, sleep=clock.sleep)


async def send_times(f: ShardFairness, clock: FakeClock, tenant: str, n: int) -> list[float]:
    out = []
    for _ in range(n):
        await f.pace(tenant)
        out.append(round(clock.now - 100.0, 6))
    return out


@pytest.mark.parametrize(
    ("touch", "expected"),
    [
        pytest.param(None, [0.0] * 6, id="alone-never-paced"),
        pytest.param("bulk", [0.0] * 6, id="its-own-lease-writes-do-not-count"),
        pytest.param(
            "small", [0.0, 0.0, 0.0, 0.1, 0.2, 0.3], id="another-shard-active-burst-then-rate"
        ),
    ],
)
async def test_pace_by_contention(touch: str | None, expected: list[float]) -> None:
    clock = FakeClock()
    f = make_fairness(clock)
    times = []
    for _ in range(6):
        if touch is not None:
            f.touch(touch)  # that shard keeps writing leases meanwhile
        await f.pace("bulk")
        times.append(round(clock.now - 100.0, 6))
    assert times == expected


async def test_another_shard_quiet_for_active_s_no_longer_counts() -> None:
    clock = FakeClock()
    f = make_fairness(clock)
    f.touch("small")
    clock.now += 1.0
    assert await send_times(f, clock, "bulk", 6) == [1.0] * 6
    assert clock.slept == []


async def test_contention_that_ends_mid_wait_lets_the_rest_go_at_full_speed() -> None:
    clock = FakeClock()
    f = make_fairness(clock, rate=1.0, burst=1)
    f.touch("small")
    assert await send_times(f, clock, "bulk", 1) == [0.0]  # the burst
    # The next token is 1 s away; by then "small" has been quiet for active_s.
    assert await send_times(f, clock, "bulk", 4) == [1.0, 1.0, 1.0, 1.0]


async def test_rate_zero_turns_pacing_off() -> None:
    clock = FakeClock()
    f = make_fairness(clock, rate=0.0)
    f.touch("small")
    assert await send_times(f, clock, "bulk", 10) == [0.0] * 10
    assert clock.slept == []


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        pytest.param({"rate": -1.0}, "rate: -1.0", id="negative-rate"),
        pytest.param({"rate": float("nan")}, "rate: nan", id="nan-rate"),
        pytest.param({"burst": 0}, "burst: 0", id="zero-burst"),
    ],
)
def test_bad_settings_name_the_field(kwargs: dict[str, float], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        ShardFairness(**kwargs)  # type: ignore[arg-type]


async def test_dispatch_paces_a_bulk_shard_only_while_another_shard_is_active() -> None:
    clock = FakeClock()
    fair = make_fairness(clock, rate=10.0, burst=5)
    fake = FakeTemporal(delay=0)
    acts = DispatchActivities(cast(Client, fake), fairness=fair)
    env = ActivityEnvironment()
    await env.run(acts.dispatch, batch("bulk", [f"x{i}" for i in range(30)]))
    assert clock.slept == []  # alone: full speed
    fair.touch("interactive")
    await env.run(acts.dispatch, batch("bulk", [f"y{i}" for i in range(8)]))
    # 5 at once, then 10/s: 3 more tokens, 0.3 s in all (the shard stays contended).
    assert round(sum(clock.slept), 6) == 0.3
    assert len(fake.signalled) == 38
    # The interactive shard's own few signals are within its burst: no wait.
    before = len(clock.slept)
    fair.touch("bulk")
    await env.run(acts.dispatch, batch("interactive", ["a0", "a1"]))
    assert len(clock.slept) == before


async def test_a_paced_shard_holds_no_slot_of_the_shared_budget() -> None:
    """Another shard's signals go out while the paced one sleeps for its next token."""
    fair = ShardFairness(rate=5.0, burst=1, active_s=10.0)
    fake = FakeTemporal(delay=0.001)
    acts = DispatchActivities(cast(Client, fake), concurrency=1, fairness=fair)
    env = ActivityEnvironment()
    fair.touch("interactive")
    bulk = asyncio.create_task(env.run(acts.dispatch, batch("bulk", [f"b{i}" for i in range(4)])))
    await asyncio.sleep(0.05)  # bulk sent its burst and sleeps 0.2 s for the next token
    fair.touch("bulk")
    await env.run(acts.dispatch, batch("interactive", ["a0"]))
    assert "a0" in fake.signalled and len([s for s in fake.signalled if s.startswith("b")]) < 4
    await bulk
    assert len(fake.signalled) == 5


async def test_pacing_stops_at_until_and_no_wait_reaches_past_it() -> None:
    clock = FakeClock()
    f = make_fairness(clock, rate=1.0, burst=1)
    f.touch("small")
    times = []
    for _ in range(5):
        f.touch("small")
        await f.pace("bulk", until=102.5)
        times.append(round(clock.now - 100.0, 6))
    # The burst, two tokens 1 s apart, a wait cut at 2.5 s, then full speed.
    assert times == [0.0, 1.0, 2.0, 2.5, 2.5]


@pytest.mark.parametrize(
    ("timeout_s", "slept_s"),
    [
        pytest.param(30.0, 9.9, id="batch-fits-its-budget-paced-throughout"),
        pytest.param(4.0, 2.0, id="slow-rate-pacing-ends-at-half-the-timeout"),
    ],
)
async def test_a_paced_dispatch_never_outlives_its_timeout(
    timeout_s: float, slept_s: float
) -> None:
    """However low the contended rate, a batch is sent within its attempt's timeout (a
    batch cut off by its timeout would be retried, and paced again, for ever)."""
    clock = FakeClock()
    # The interactive shard stays active throughout.
    fair = ShardFairness(10.0, 1, active_s=100.0, clock=clock, sleep=clock.sleep)
    fake = FakeTemporal(delay=0)
    acts = DispatchActivities(cast(Client, fake), fairness=fair)
    env = ActivityEnvironment()
    env.info = dataclasses.replace(env.info, start_to_close_timeout=timedelta(seconds=timeout_s))
    fair.touch("interactive")
    await env.run(acts.dispatch, batch("bulk", [f"x{i}" for i in range(100)]))
    assert len(fake.signalled) == 100
    assert round(clock.now - 100.0, 6) == slept_s
