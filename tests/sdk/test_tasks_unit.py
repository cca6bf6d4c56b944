"""Bad input to the SDK fails where it is given, naming the field and the value, before
anything is sent: these run with no server at all (the SDK is pointed at a closed port,
so a submission that got as far as connecting would fail differently)."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import headway
import pytest
from headway.cli._common import free_port
from headway.sdk.tasks import TaskTemplate

env = headway.TaskEnvironment(name="unit", resources=headway.Resources(cpu=1, memory="1Gi"))


@env.task
async def total(batch: list[int], scale: float = 1.0) -> float:
    return sum(batch) * scale


@pytest.fixture(autouse=True)
def nowhere() -> None:
    headway.init(address=f"127.0.0.1:{free_port()}")


def test_an_argument_that_is_not_json_is_refused_before_anything_is_sent():
    with pytest.raises(headway.SerializationError) as err:
        headway.with_runcontext(queue="default").run(total, batch={1, 2}, scale=1.0)  # type: ignore[arg-type]
    message = str(err.value)
    assert "argument 'batch' of task 'total'" in message and "{1, 2}" in message
    assert "set" in message
    with pytest.raises(headway.SerializationError, match="argument 'scale'"):
        headway.with_runcontext().run(total, batch=[1], scale=object())  # type: ignore[arg-type]


def test_arguments_that_do_not_fit_the_function_name_the_task():
    with pytest.raises(TypeError, match="task 'total': missing a required argument: 'batch'"):
        headway.with_runcontext().run(total)  # type: ignore[call-arg]


def test_a_function_that_is_not_async_is_refused_by_the_decorator():
    def plain(x: int) -> int:
        return x

    with pytest.raises(TypeError, match=r"'.*plain' is not an async function; define it with"):
        env.task(plain)  # type: ignore[arg-type]


def test_queue_names_are_checked_where_they_are_given():
    with pytest.raises(ValueError, match=r"override\(queue\): 'Not A Queue' is not a queue name"):
        total.override(queue="Not A Queue")
    with pytest.raises(ValueError, match="queue: 'UPPER' is not a queue name"):
        headway.with_runcontext(queue="UPPER")
    with pytest.raises(ValueError, match="replicas: 0 must be a whole number, at least 1"):
        headway.ClusteredTaskEnvironment("c", headway.Resources(cpu=1), replicas=0)
    with pytest.raises(ValueError, match="memory"):
        headway.Resources(cpu=1, memory="lots")


@pytest.mark.parametrize(
    ("policy", "message"),
    [
        pytest.param(
            {"replicas": 0}, "ReusePolicy.replicas: 0 must be a whole number", id="no replicas"
        ),
        pytest.param(
            {"replicas": 1.5},
            "ReusePolicy.replicas: 1.5 must be a whole number",
            id="half a replica",
        ),
        pytest.param(
            {"concurrency": True},
            "ReusePolicy.concurrency: True must be a whole number",
            id="a flag for a concurrency",
        ),
        pytest.param(
            {"idle_ttl": "5 minutes"},
            "ReusePolicy.idle_ttl: '5 minutes' is not a duration",
            id="a duration in words",
        ),
        pytest.param(
            {"idle_ttl": -1}, "ReusePolicy.idle_ttl: -1 must be a finite duration", id="negative"
        ),
        pytest.param(
            {"idle_ttl": float("nan")},
            "ReusePolicy.idle_ttl: nan must be a finite duration",
            id="not a number",
        ),
    ],
)
def test_a_bad_reuse_policy_names_its_field(policy: dict[str, object], message: str):
    with pytest.raises(ValueError, match=re.escape(message)):
        headway.ReusePolicy(**policy)  # type: ignore[arg-type]


def test_a_reusable_environment_declares_its_pool():
    warm = headway.TaskEnvironment(
        "warm",
        headway.Resources(cpu=2, memory="1Gi"),
        reusable=headway.ReusePolicy(replicas=2, concurrency=4, idle_ttl="5m"),
    )
    assert warm.environment_spec() == {
        "name": "warm",
        "resources": {"cpu": 2, "memory": "1Gi"},
        "replicas": 2,
        "concurrency": 4,
        "idle_ttl": 300.0,
    }
    assert env.environment_spec() is None
    with pytest.raises(TypeError, match=r"reusable: 2 is not a headway\.ReusePolicy"):
        headway.TaskEnvironment("w", reusable=2)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="name: 'a pool' is not the name of a reusable"):
        headway.TaskEnvironment("a pool", reusable=headway.ReusePolicy())


def test_override_leaves_the_task_as_it_was():
    moved = total.override(queue="backfill")
    assert (moved.queue, total.queue) == ("backfill", None)
    assert isinstance(moved, TaskTemplate) and moved.func is total.func


def test_an_unreachable_server_is_a_clear_error():
    with pytest.raises(headway.ServerUnreachable, match="address: cannot reach Temporal at"):
        headway.with_runcontext().run(total, batch=[1])


async def test_a_task_called_outside_a_run_is_its_function():
    assert await total([1, 2], scale=2.0) == 6.0


def test_demands_are_the_environments(tmp_path: Path):
    ray = headway.RayEnvironment(
        "r", head=headway.Resources(cpu=2), worker_groups=[(3, headway.Resources(gpu=1))]
    )
    assert ray.demand().ray == {
        "head": {"cpu": 2},
        "worker_groups": [{"replicas": 3, "resources": {"gpu": 1}}],
    }
    c = headway.ClusteredTaskEnvironment("c", headway.Resources(gpu="H100:8"), replicas=4)
    assert (c.demand().resources, c.demand().replicas) == ({"gpu": "H100:8"}, 4)


def test_the_entrypoint_writes_the_outcome_document(tmp_path: Path, monkeypatch):
    """`python -m headway.sdk.run` in-process: a task that raises is a failed outcome
    document (its type, message, traceback), exit code 1."""
    from headway.sdk import run as entry

    (tmp_path / "mymod.py").write_text(
        "import headway\n"
        "env = headway.TaskEnvironment(name='m')\n"
        "@env.task\n"
        "async def ok(x: int) -> int:\n    return x + 1\n"
        "@env.task\n"
        "async def bad(x: int) -> int:\n    raise KeyError(x)\n"
    )
    out = tmp_path / "out.json"
    monkeypatch.setenv("HEADWAY_OUTPUT_FILE", str(out))
    common = ["--module", "mymod", "--root", str(tmp_path), "--action", "a1", "--run", "r1"]
    common += ["--address", "127.0.0.1:1", "--inputs", '{"x": 41}']
    try:
        assert entry.main([*common, "--task", "ok"]) == 0
        assert json.loads(out.read_text()) == {"ok": True, "output": 42}
        assert entry.main([*common, "--task", "bad"]) == 1
        doc = json.loads(out.read_text())
        assert doc["ok"] is False and doc["error"]["type"] == "KeyError"
        assert "raise KeyError(x)" in doc["error"]["traceback"]
    finally:
        from headway.sdk.tasks import _CONTEXT

        _CONTEXT.set(None)
        sys.modules.pop("mymod", None)
        sys.path.remove(str(tmp_path))
