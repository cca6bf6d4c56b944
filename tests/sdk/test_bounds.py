"""The SDK refuses absurd demands where they are given, as the CLI does: zero GPUs of a
type, a pod larger than any machine, more pods than an action may have, times that are
not finite; a ValueError naming the field and the value, before anything is sent."""

from __future__ import annotations

import math
from typing import Any

import headway
import pytest
from headway.sdk import Task


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"gpu": "H100:0"}, "gpu: 'H100:0' asks for no GPUs of type H100"),
        ({"cpu": "1e400"}, "cpu: '1e400' is more than one pod may ask for (at most 10000 cores)"),
        ({"cpu": 1e400}, "cpu: inf is not a finite quantity"),
        ({"cpu": math.nan}, "cpu: nan is not a finite quantity"),
        ({"cpu": 10**400}, "cpu: 100000000000000000000"),
        ({"memory": "1e999999999"}, "memory: '1e999999999' is more than one pod may ask for"),
        ({"memory": "257Ti"}, "memory: '257Ti' is more than one pod may ask for (at most 256Ti)"),
        ({"ephemeral_storage": "1Ei"}, "ephemeral_storage: '1Ei' is more than one pod"),
        ({"gpu": 1025}, "gpu: 1025 is more than one pod may ask for (at most 1024)"),
        ({"gpu": "B200:99999999999999999999"}, "gpu: 'B200:99999999999999999999' is more than"),
    ],
    ids=lambda v: repr(v)[:40] if isinstance(v, dict) else None,
)
def test_an_absurd_pod_is_refused_naming_the_field(fields: dict[str, Any], message: str):
    with pytest.raises(ValueError) as err:
        headway.Resources(**fields)
    assert str(err.value).startswith(message), str(err.value)


def test_the_largest_pod_is_accepted():
    headway.Resources(cpu=10_000, memory="256Ti", ephemeral_storage="256Ti", gpu="H200:1024")
    headway.Resources(gpu=0)  # no GPUs of any type: a CPU pod


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: Task("t", replicas=99999999999999), "replicas: 99999999999999 is more pods"),
        (lambda: Task("t", replicas=0), "replicas: 0 must be a whole number, at least 1"),
        (lambda: Task("t", duration=math.nan), "duration: nan must be a finite number"),
        (lambda: Task("t", estimate=math.inf), "estimate: inf must be a finite number"),
        (lambda: Task("t", duration=400 * 86400), "duration: 34560000 must be a finite number"),
        (
            lambda: headway.ClusteredTaskEnvironment("g", replicas=10_001),
            "replicas: 10001 is more pods than one action may have (at most 10000)",
        ),
        (
            lambda: headway.RayEnvironment(
                "r",
                head=headway.Resources(cpu=1),
                worker_groups=[(6000, headway.Resources(cpu=1))] * 2,
            ),
            "pods (head + worker_groups): 12001 is more pods",
        ),
        (
            lambda: headway.SparkEnvironment(
                "s",
                driver=headway.Resources(cpu=1),
                executor=headway.Resources(cpu=1),
                executors=10**12,
            ),
            "executors: 1000000000000 is more pods",
        ),
        (
            lambda: headway.TaskEnvironment(
                "w", reusable=headway.ReusePolicy(replicas=10**6, concurrency=1)
            ),
            "ReusePolicy.replicas: 1000000 is more pods",
        ),
    ],
    ids=[
        "task-replicas",
        "task-replicas-0",
        "duration-nan",
        "estimate-inf",
        "duration-over-a-year",
        "gang",
        "ray",
        "spark",
        "reusable",
    ],
)
def test_absurd_counts_and_times_are_refused_naming_the_field(make: Any, message: str):
    with pytest.raises(ValueError) as err:
        make()
    assert str(err.value).startswith(message), str(err.value)


def test_a_task_estimate_must_be_finite():
    env = headway.TaskEnvironment(name="bounds")

    async def f() -> int:
        return 1

    f.__qualname__ = "f"
    with pytest.raises(ValueError, match="estimate: inf must be a finite number of seconds"):
        env.task(estimate=math.inf)(f)
