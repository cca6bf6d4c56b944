"""Warm (reusable) environments end to end, and many tasks through the batch API: real
programs against the control plane and the simulated clusters on a real Temporal dev
server. A reusable environment is declared to the tenant's scheduler at its first
submit, placed once (its footprint counted once against its queue's quota), serves its
actions in its pool's long-lived processes, and is torn down after its idle time."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest
from headway.cli._stack import Stack
from headway.workflows import client as hw
from waiting import eventually

from .conftest import UI, run_program
from .test_tasks_live import _actions, _client

pytestmark = pytest.mark.integration

WARM_PROGRAM = """\
import asyncio, json, os, sys
import headway

pool = headway.TaskEnvironment(
    name="warm-pool",
    resources=headway.Resources(cpu=2, memory="1Gi"),
    reusable=headway.ReusePolicy(replicas=2, concurrency=4, idle_ttl="6s"),
)

@pool.task
async def where(i: int, go: str) -> int:
    while not os.path.exists(go):  # held until the test has looked at the pool
        await asyncio.sleep(0.05)
    return os.getpid()

async def main(go: str) -> list[int]:
    runs = await asyncio.gather(*(
        headway.with_runcontext(queue="warm", name=f"warm-{i}").run_async(where, i=i, go=go)
        for i in range(20)
    ))
    return list(await asyncio.gather(*(r.result() for r in runs)))

if __name__ == "__main__":
    print(json.dumps(asyncio.run(main(sys.argv[1]))))
"""


def _start(stack: Stack, directory: Path, source: str, *args: str) -> subprocess.Popen[str]:
    path = directory / "prog.py"
    path.write_text(textwrap.dedent(source))
    env = {**os.environ, "HEADWAY_TEMPORAL_ADDRESS": stack.address, "HEADWAY_UI_URL": UI}
    return subprocess.Popen(
        [sys.executable, str(path), *args],
        cwd=directory,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


def _query(stack: Stack, fn: Any) -> Any:
    async def ask() -> Any:
        return await fn(await _client(stack))

    return asyncio.run(ask())


def test_a_warm_environment_serves_twenty_actions_in_two_processes(stack: Stack, tmp_path: Path):
    # A quota of 4 CPUs: the pool's footprint (2 x 2 CPU), counted once, fits; eight
    # actions charged 2 CPUs each would not.
    _query(
        stack,
        lambda c: hw.upsert_queue(c, "default", {"name": "warm", "max_resources": {"cpu": 4000}}),
    )
    go = tmp_path / "go"
    prog = _start(stack, tmp_path, WARM_PROGRAM, str(go))
    try:

        def full() -> dict[str, Any] | None:
            q = _query(stack, lambda c: hw.get_queues(c, "default"))["warm"]
            busy = q["waiting_by_reason"].get("EnvironmentBusy", 0)
            return q if q["running"] == 8 and busy == 12 else None

        q = eventually(
            full,
            "8 actions running in the pool and 12 EnvironmentBusy",
            120,
            show=lambda: (
                _query(stack, lambda c: hw.get_queues(c, "default"))["warm"],
                prog.poll() is not None and prog.communicate(),
            ),
        )
        # The footprint, once: 2 replicas x (2 CPU, 1Gi), however many run inside.
        assert q["usage"]["cpu_m"] == 4000
        assert q["usage"]["memory"] == 2 * 2**30
        go.write_text("")
        out, err = prog.communicate(timeout=240)
    finally:
        if prog.poll() is None:
            prog.kill()
            prog.wait()
    assert prog.returncode == 0, err
    pids = json.loads(out)
    assert len(pids) == 20
    assert len(set(pids)) == 2  # every action ran in one of the pool's two processes
    reasons = [
        d.result.reasons
        for i in range(20)
        for d in asyncio.run(_actions(stack, f"warm-{i}")).values()
        if d.result is not None
    ]
    assert len(reasons) == 20
    assert sum("EnvironmentBusy" in r for r in reasons) == 12

    def torn_down() -> bool | None:
        q = _query(stack, lambda c: hw.get_queues(c, "default"))["warm"]
        envs = _query(stack, lambda c: hw.get_snapshot(c, "default"))["snapshot"]["envs"]
        gone = q["usage"]["cpu_m"] == 0 and not envs and not any(_alive(p) for p in set(pids))
        return True if gone else None

    # The pool's idle_ttl (6 s) after its last action: the scheduler's quota back, and
    # the worker's processes stopped.
    eventually(torn_down, "the pool torn down after its idle time", 60)


def _readme_warm_example() -> str:
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    section = readme.split("### Warm environments", 1)[1]
    return section.split("```python\n", 1)[1].split("```", 1)[0]


def test_the_readmes_warm_example_runs_as_written(stack: Stack, tmp_path: Path):
    out = run_program(stack, tmp_path, _readme_warm_example(), timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.lines == ["2470 from 2 processes"]


def test_another_shape_of_an_environment_in_use_is_refused(stack: Stack, tmp_path: Path):
    out = run_program(
        stack,
        tmp_path,
        """\
        import asyncio, os
        import headway

        def env(replicas):
            return headway.TaskEnvironment(
                name="shape-pool",
                resources=headway.Resources(cpu="100m"),
                reusable=headway.ReusePolicy(replicas=replicas, concurrency=1, idle_ttl=60),
            )

        one, two = env(1), env(2)

        @one.task
        async def nap(go: str) -> int:
            while not os.path.exists(go):
                await asyncio.sleep(0.05)
            return 1

        @two.task
        async def other() -> int:
            return 2

        if __name__ == "__main__":
            go = os.path.join(os.getcwd(), "go")
            run = headway.with_runcontext(name="shape-1").run(nap, go=go)
            try:
                headway.with_runcontext(name="shape-2").run(other)
            except ValueError as exc:
                print(exc)
            open(go, "w").close()
            print(run.wait())
        """,
    )
    assert out.returncode == 0, out.stderr
    assert out.lines[0].startswith("reusable: environment 'shape-pool' is declared with another")
    assert "replicas: 1 -> 2" in out.lines[0]
    assert out.lines[1] == "1"
    # Nothing half-submitted: the refused call left no action behind.
    assert asyncio.run(_actions(stack, "shape-2", expect=0)) == {}


KEPT_PROGRAM = """\
import asyncio, os, sys
import headway

pool = headway.TaskEnvironment(
    name="kept-pool",
    resources=headway.Resources(cpu=1, memory="1Gi"),
    reusable=headway.ReusePolicy(replicas=1, concurrency=2, idle_ttl="60s"),
)

@pool.task
async def pid() -> int:
    return os.getpid()

async def main(go: str) -> None:
    first = await headway.with_runcontext(queue="kept-warm", name="kept-1").run_async(pid)
    print(await first.result(), flush=True)
    while not os.path.exists(go):  # the test restarts the scheduler meanwhile
        await asyncio.sleep(0.05)
    # This process declared the environment once: it does not declare it again.
    second = await headway.with_runcontext(queue="kept-warm", name="kept-2").run_async(pid)
    print(await second.result(), flush=True)

if __name__ == "__main__":
    asyncio.run(main(sys.argv[1]))
"""


def test_a_declared_environment_is_kept_by_a_scheduler_started_afresh(stack: Stack, tmp_path: Path):
    from headway import protocol

    spec = {"name": "kept-warm", "max_resources": {"cpu": 4000}}
    _query(stack, lambda c: hw.upsert_queue(c, "default", spec))
    go = tmp_path / "go"
    prog = _start(stack, tmp_path, KEPT_PROGRAM, str(go))
    try:
        assert prog.stdout is not None
        first = int(prog.stdout.readline() or "0")
        assert first, prog.poll() is not None and prog.communicate()

        async def terminate(c: Any) -> None:
            h = c.get_workflow_handle(protocol.scheduler_workflow_id("default"))
            await h.terminate(reason="a lost scheduler (test)")
            # The next change starts a fresh scheduler, from nothing but the store.
            await hw.upsert_queue(c, "default", spec)

        _query(stack, terminate)
        snap = _query(stack, lambda c: hw.get_snapshot(c, "default"))["snapshot"]
        assert "kept-pool" in [e["name"] for e in snap["env_specs"]]
        # The old run's placement of the pool went with it.
        assert "kept-pool" not in [e["name"] for e in snap["envs"]]
        go.write_text("")
        out, err = prog.communicate(timeout=120)
    finally:
        if prog.poll() is None:
            prog.kill()
            prog.wait()
    assert prog.returncode == 0, err
    # The second action ran in the pool's process on the worker, and the fresh scheduler
    # placed the pool for it (a placement it makes only for a declared environment).
    assert int(out.strip()) == first
    snap = _query(stack, lambda c: hw.get_snapshot(c, "default"))["snapshot"]
    assert ("kept-pool", "kept-warm") in [(e["name"], e["queue"]) for e in snap["envs"]]


@pytest.mark.timeout(1800)
def test_a_thousand_tiny_tasks_through_map_with_backpressure(stack: Stack, tmp_path: Path):
    """1,000 calls through ``headway.map`` onto a queue 50 deep, served by a warm pool:
    the door refuses what does not fit, map holds the rest back and submits it as its
    calls end, and every result comes back in order. Wall time and submit rate are
    printed (``-s``), not asserted."""
    _query(stack, lambda c: hw.upsert_queue(c, "default", {"name": "bulk", "depth": 50}))
    started = time.monotonic()
    out = run_program(
        stack,
        tmp_path,
        """\
        import headway

        env = headway.TaskEnvironment(name="fan-out", resources=headway.Resources(cpu="100m"))
        tiny = headway.TaskEnvironment(
            name="tiny-pool",
            resources=headway.Resources(cpu=1, memory="1Gi"),
            reusable=headway.ReusePolicy(replicas=2, concurrency=50, idle_ttl="10s"),
        )

        @tiny.task
        async def square(x: int) -> int:
            return x * x

        @env.task
        async def fan(n: int) -> list[int]:
            return await headway.map(square.override(queue="bulk"), range(n), concurrency=100)

        if __name__ == "__main__":
            run = headway.with_runcontext(queue="default", name="bulk-1").run(fan, n=1000)
            print(sum(run.wait(timeout=1800)))
        """,
        timeout=1800,
    )
    wall = time.monotonic() - started
    assert out.returncode == 0, out.stderr
    assert out.lines == [str(sum(x * x for x in range(1000)))]

    async def rows() -> list[hw.ActionRow]:
        return await hw.list_actions(await _client(stack), "default", run="bulk-1", limit=None)

    listed = eventually(
        lambda: r if len(r := asyncio.run(rows())) >= 1001 else None, "1,001 actions listed", 60
    )
    done = [r for r in listed if r.queue == "bulk" and r.state == "succeeded"]
    assert len(done) == 1000
    refused = [r for r in listed if r.state == "rejected"]
    assert all(r.reason == "QueueDepthExceeded" for r in refused)
    starts = sorted(r.started_at for r in listed if r.queue == "bulk" and r.started_at)
    span = starts[-1] - starts[0]
    print(
        f"\n1,000 tiny tasks: wall {wall:.1f} s, {len(starts)} submissions"
        f" ({len(refused)} refused for depth) over {span:.1f} s:"
        f" {len(starts) / span if span else 0:.1f}/s"
    )
