"""The SDK's task environments end to end: real programs (their own interpreters) against
the control plane and the simulated clusters, on a real Temporal dev server. The task
code really runs, in a process per action on the cluster that admitted it."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from headway import protocol
from headway.cli._stack import Stack
from headway.workflows import client as hw
from temporalio.client import Client

from .conftest import UI, run_program

pytestmark = pytest.mark.integration

README_PROGRAM = """\
import headway

env = headway.TaskEnvironment(name="pipeline", resources=headway.Resources(cpu=1, memory="1Gi"))

@env.task
async def score(batch: list[int]) -> int:
    return sum(batch)

@env.task
async def heavy_task(batch: list[int]) -> int:
    return max(batch)

@env.task
async def main(batch: list[int]) -> int:
    fast = await score(batch)                                   # on the run's queue
    slow = await heavy_task.override(queue="backfill")(batch)   # routed at runtime
    return fast + slow

if __name__ == "__main__":
    run = headway.with_runcontext(queue="production").run(main, batch=[1, 2, 3])
    print(run.url)
    print(run.wait())
"""


async def _client(stack: Stack) -> Client:
    return await Client.connect(stack.address, data_converter=protocol.data_converter())


async def _actions(stack: Stack, run: str, expect: int = 1) -> dict[str, hw.ActionDetails]:
    client = await _client(stack)
    for _ in range(300):  # visibility lags the workflows by a moment
        rows = await hw.list_actions(client, "default", run=run, limit=None)
        if len(rows) >= expect and all(r.status != "running" for r in rows):
            break
        await asyncio.sleep(0.1)
    return {r.action_id: await hw.action_details(client, "default", r.action_id) for r in rows}


def test_the_readme_program_prints_its_link_and_9(stack: Stack, tmp_path: Path):
    readme = (Path(__file__).parents[2] / "README.md").read_text()
    assert README_PROGRAM in readme, "the README's SDK section is this program"
    out = run_program(stack, tmp_path, README_PROGRAM, name="pipeline.py")
    assert out.returncode == 0, out.stderr
    url, result = out.lines
    assert result == "9"
    assert url.startswith(f"{UI}/namespaces/default/workflows?query=HeadwayRun%3D%22")
    run = url.rsplit("%3D%22", 1)[1].removesuffix("%22")

    actions = asyncio.run(_actions(stack, run, expect=3))
    by_task = {d.request.task: d for d in actions.values() if d.request is not None}
    assert set(by_task) == {"pipeline.main", "pipeline.score", "pipeline.heavy_task"}
    main, score, heavy = (by_task[f"pipeline.{t}"] for t in ("main", "score", "heavy_task"))
    # One run, three actions, each admitted by its own queue.
    assert (main.queue, score.queue, heavy.queue) == ("production", "production", "backfill")
    assert all(d.state == "succeeded" and d.run == run for d in actions.values())
    # Children name their parent's workflow (shown in the Web UI's memo).
    assert score.memo.get("parent") == main.workflow_id
    assert heavy.memo.get("parent") == main.workflow_id
    assert "parent" not in main.memo
    # Each action's demand is its environment's, and its result is the task's return.
    assert main.request is not None
    assert main.request.demand.resources == {"cpu": 1, "memory": "1Gi"}
    outputs = {t: json.loads(d.result.output or "{}") for t, d in by_task.items() if d.result}
    assert outputs["pipeline.score"] == {"ok": True, "output": 6}
    assert outputs["pipeline.heavy_task"] == {"ok": True, "output": 3}
    assert outputs["pipeline.main"] == {"ok": True, "output": 9}


def test_a_child_failure_raises_in_the_parent(stack: Stack, tmp_path: Path):
    out = run_program(
        stack,
        tmp_path,
        """\
        import headway

        env = headway.TaskEnvironment(name="fails", resources=headway.Resources(cpu=1))

        @env.task
        async def child(n: int) -> int:
            raise ValueError(f"bad batch {n}")

        @env.task
        async def parent(n: int) -> int:
            try:
                return await child(n)
            except headway.TaskFailed as exc:
                raise RuntimeError(f"child said: {exc.error_type}: {exc.error_message}")

        if __name__ == "__main__":
            run = headway.with_runcontext(queue="default").run(parent, n=7)
            try:
                run.wait()
            except headway.TaskFailed as exc:
                print(exc.reason, exc.error_type, exc.error_message, sep="|")
        """,
    )
    assert out.returncode == 0, out.stderr
    assert out.lines == ["Failed|RuntimeError|child said: ValueError: bad batch 7"]


def test_an_unknown_queue_in_override_is_rejected_at_the_door(stack: Stack, tmp_path: Path):
    out = run_program(
        stack,
        tmp_path,
        """\
        import headway

        env = headway.TaskEnvironment(name="routes", resources=headway.Resources(cpu=1))

        @env.task
        async def child() -> int:
            return 1

        @env.task
        async def parent() -> str:
            try:
                await child.override(queue="no-such-queue")()
            except headway.UnknownQueue as exc:
                return f"{exc.reason} {exc.queue}"
            return "admitted?"

        if __name__ == "__main__":
            print(headway.with_runcontext(queue="default", name="route-1").run(parent).wait())
            try:
                headway.with_runcontext(queue="nowhere", name="route-2").run(child)
            except headway.UnknownQueue as exc:
                print(type(exc).__name__, exc.queue)
        """,
    )
    assert out.returncode == 0, out.stderr
    assert out.lines == ["UnknownQueue no-such-queue", "UnknownQueue nowhere"]
    # Nothing half-submitted: the refused actions hold nothing and ran nothing.
    refused = asyncio.run(_actions(stack, "route-2"))
    assert [d.state for d in refused.values()] == ["rejected"]
    route1 = asyncio.run(_actions(stack, "route-1", expect=2))
    assert sorted(d.state for d in route1.values()) == ["rejected", "succeeded"]


def test_a_clustered_task_runs_every_replica_with_its_rank(stack: Stack, tmp_path: Path):
    out = run_program(
        stack,
        tmp_path,
        f"""\
        import json, os
        import headway

        env = headway.ClusteredTaskEnvironment(
            name="train",
            resources=headway.Resources(cpu=2, memory="2Gi"),
            replicas=3,
            nproc_per_node=2,
            runtime=headway.TorchRun(),
        )

        @env.task
        async def train(steps: int) -> dict[str, str]:
            seen = {{k: os.environ[k] for k in
                    ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "NPROC_PER_NODE")}}
            with open(os.path.join({str(tmp_path)!r}, "rank-" + seen["RANK"]), "w") as fh:
                json.dump(seen, fh)
            return seen

        if __name__ == "__main__":
            print(json.dumps(headway.with_runcontext(queue="default").run(train, steps=1).wait()))
        """,
    )
    assert out.returncode == 0, out.stderr
    result = json.loads(out.lines[-1])
    ranks = {p.name: json.loads(p.read_text()) for p in tmp_path.glob("rank-*")}
    assert sorted(ranks) == ["rank-0", "rank-1", "rank-2"]
    assert {r["WORLD_SIZE"] for r in ranks.values()} == {"3"}
    assert len({r["MASTER_ADDR"] + ":" + r["MASTER_PORT"] for r in ranks.values()}) == 1
    assert {r["NPROC_PER_NODE"] for r in ranks.values()} == {"2"}
    assert result == ranks["rank-0"]  # the gang's result is rank 0's


def test_ray_and_spark_tasks_are_admitted_whole(stack: Stack, tmp_path: Path):
    out = run_program(
        stack,
        tmp_path,
        """\
        import os
        import headway

        ray = headway.RayEnvironment(
            name="ray",
            head=headway.Resources(cpu=2, memory="4Gi"),
            worker_groups=[(2, headway.Resources(cpu=1, memory="2Gi"))],
        )
        spark = headway.SparkEnvironment(
            name="spark",
            driver=headway.Resources(cpu=1, memory="2Gi"),
            executor=headway.Resources(cpu=1, memory="1Gi"),
            executors=3,
        )

        @ray.task
        async def on_ray() -> str:
            return "ray " + os.environ["WORLD_SIZE"]

        @spark.task
        async def on_spark() -> str:
            return "spark " + os.environ["WORLD_SIZE"]

        if __name__ == "__main__":
            ctx = headway.with_runcontext(queue="default", name="gangs-1")
            print(ctx.run(on_ray).wait())
            print(ctx.run(on_spark).wait())
        """,
    )
    assert out.returncode == 0, out.stderr
    # Every pod of the gang ran the function; the result is the head's (the driver's).
    assert out.lines == ["ray 3", "spark 4"]
    actions = asyncio.run(_actions(stack, "gangs-1", expect=2))
    demands = {d.request.task: d.request.demand for d in actions.values() if d.request}
    assert demands["ray.on_ray"].ray == {
        "head": {"cpu": 2, "memory": "4Gi"},
        "worker_groups": [{"replicas": 2, "resources": {"cpu": 1, "memory": "2Gi"}}],
    }
    assert demands["spark.on_spark"].spark == {
        "driver": {"cpu": 1, "memory": "2Gi"},
        "executor": {"cpu": 1, "memory": "1Gi"},
        "executors": 3,
    }


def test_map_fans_out_child_actions_with_backpressure(stack: Stack, tmp_path: Path):
    """60 tiny tasks through headway.map onto a queue 10 deep: the door refuses what does
    not fit (QueueFull), map submits it again later, and every result comes back in order."""

    async def shallow_queue() -> None:
        client = await _client(stack)
        await hw.upsert_queue(client, "default", {"name": "shallow", "depth": 10})

    asyncio.run(shallow_queue())
    out = run_program(
        stack,
        tmp_path,
        """\
        import headway

        env = headway.TaskEnvironment(name="fan", resources=headway.Resources(cpu="100m"))

        @env.task
        async def square(x: int) -> int:
            return x * x

        @env.task
        async def fan(n: int) -> list[int]:
            return await headway.map(square.override(queue="shallow"), range(n))

        if __name__ == "__main__":
            print(sum(headway.with_runcontext(queue="default", name="fan-1").run(fan, n=60).wait()))
        """,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr
    assert out.lines == [str(sum(x * x for x in range(60)))]
    actions = asyncio.run(_actions(stack, "fan-1", expect=61))
    done = [d for d in actions.values() if d.queue == "shallow" and d.state == "succeeded"]
    assert len(done) == 60
    # What the door refused was refused whole: rejected for the depth, holding nothing.
    refused = [d for d in actions.values() if d.state == "rejected"]
    assert all(d.reason == "QueueDepthExceeded" for d in refused)


def test_a_cancelled_run_raises_task_cancelled(stack: Stack, tmp_path: Path):
    out = run_program(
        stack,
        tmp_path,
        """\
        import asyncio
        import headway

        env = headway.TaskEnvironment(name="slow", resources=headway.Resources(cpu=1))

        @env.task
        async def nap() -> int:
            await asyncio.sleep(120)
            return 1

        if __name__ == "__main__":
            run = headway.with_runcontext(queue="default", name="cancel-1").run(nap)
            try:
                run.wait(timeout=1)
            except TimeoutError:
                print("still running")
            print(run.cancel())
            try:
                run.wait(timeout=60)
            except headway.TaskCancelled as exc:
                print(type(exc).__name__, exc.action_id)
        """,
    )
    assert out.returncode == 0, out.stderr
    assert out.lines == ["still running", "1", "TaskCancelled cancel-1-nap"]
