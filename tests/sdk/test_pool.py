"""A warm environment's pool on the simulated cluster: the tasks of a reusable environment
run in ``replicas`` long-lived processes (``python -m headway.sdk.run --serve``), at most
``concurrency`` at a time in each, and the processes stop once the pool was idle for its
``idle_ttl``. Real processes, no Temporal."""

from __future__ import annotations

import asyncio
import json
import os
import signal
from pathlib import Path

import pytest
from headway.activities.backends.sim_task import POOLS, PoolShape, master_port, pool_shape
from headway.protocol import ActionEventKind as K
from headway.protocol import GangKind, PodSpec
from headway.tests.cluster.helpers import collect_until_terminal, request, sim

MODULE = """\
import asyncio, os
import headway

env = headway.TaskEnvironment(
    name="warm",
    reusable=headway.ReusePolicy(replicas=2, concurrency=4, idle_ttl=1),
)

RUNNING = 0
MOST = 0

@env.task
async def where(i: int) -> dict:
    global RUNNING, MOST
    RUNNING += 1
    MOST = max(MOST, RUNNING)
    await asyncio.sleep(0.3)
    RUNNING -= 1
    if i < 0:
        raise ValueError(f"negative: {i}")
    return {"pid": os.getpid(), "most": MOST}
"""


def pool_command(root: Path, action: str, i: int, *, idle_ttl: str = "1") -> list[str]:
    command = ["python", "-m", "headway.sdk.run", "--module", "warmtask", "--task", "where"]
    command += ["--root", str(root), "--action", action, "--run", "r", "--address", "x:1"]
    command += ["--pool", "warm", "--pool-replicas", "2", "--pool-concurrency", "4"]
    command += ["--pool-idle-ttl", idle_ttl, "--inputs", json.dumps({"i": i})]
    return command


def task_request(root: Path, action: str, i: int):  # type: ignore[no-untyped-def]
    pod = PodSpec(
        role="main", index=0, cpu_m=100, memory=2**20, command=pool_command(root, action, i)
    )
    return request(action, [pod], duration_s=None)


async def _run(backend, req):  # type: ignore[no-untyped-def]
    with backend.subscribe() as q:
        await backend.create_pods(req, dispatch="d-" + req.action_id)
        return await collect_until_terminal(q, req.action_id, timeout=60)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie is gone for our purpose (reaped by asyncio's child watcher soon).
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


@pytest.mark.parametrize(
    ("flags", "shape"),
    [
        pytest.param([], None, id="a task of its own process has no pool"),
        pytest.param(
            [
                "--pool",
                "warm",
                "--pool-replicas",
                "2",
                "--pool-concurrency",
                "4",
                "--pool-idle-ttl",
                "300",
            ],
            PoolShape("default", "warm", 2, 4, 300.0, ()),
            id="a reusable environment's task names its pool's shape",
        ),
        pytest.param(
            ["--pool", "warm", "--pool-replicas", "two"],
            None,
            id="a shape that is not one runs in a fresh process",
        ),
    ],
)
def test_the_pool_is_read_from_the_tasks_command(flags: list[str], shape: PoolShape | None):
    command = ["python", "-m", "headway.sdk.run", "--module", "m", "--task", "t", *flags]
    assert pool_shape([*command, "--inputs", "{}"]) == shape


async def test_twenty_actions_run_in_the_pools_two_processes_then_it_is_torn_down(tmp_path: Path):
    (tmp_path / "warmtask.py").write_text(MODULE)
    b = sim(state_dir=tmp_path / "state")
    await b.start()
    try:
        ends = await asyncio.gather(
            *(_run(b, task_request(tmp_path, f"w{i}", i)) for i in range(20))
        )
        outs = [json.loads(e[-1].output or "") for e in ends]
        assert all(e[-1].kind is K.SUCCEEDED for e in ends)
        results = [o["output"] for o in outs]
        pids = {r["pid"] for r in results}
        assert len(pids) == 2  # both replicas served, and nothing else
        assert pids == set(POOLS.pids()["warm"])
        # No process ran more than its concurrency at once.
        assert max(r["most"] for r in results) <= 4
        # A failure in the task is that action's outcome; the pool goes on serving.
        bad = (await _run(b, task_request(tmp_path, "bad", -1)))[-1]
        assert (bad.kind, bad.message) == (K.FAILED, "ValueError: negative: -1")
        again = (await _run(b, task_request(tmp_path, "again", 1)))[-1]
        assert json.loads(again.output or "")["output"]["pid"] in pids
        # Idle for its idle_ttl (1 s): torn down, its processes stopped.
        for _ in range(100):
            if "warm" not in POOLS.pids() and not any(_alive(p) for p in pids):
                break
            await asyncio.sleep(0.1)
        assert "warm" not in POOLS.pids()
        assert not any(_alive(p) for p in pids)
        # The next task places it anew.
        anew = (await _run(b, task_request(tmp_path, "anew", 2)))[-1]
        fresh = set(POOLS.pids()["warm"])
        assert json.loads(anew.output or "")["output"]["pid"] in fresh - pids
        # Its processes killed from outside: the next task starts the pool again.
        for pid in fresh:
            os.kill(pid, signal.SIGKILL)
        # Until the pool has seen them end (their output closed): a task handed over in
        # the instant between a process's death and that is the process's own, and ends
        # as a task whose process was killed does.
        for _ in range(100):
            if not any(_alive(p) for p in fresh) and "warm" not in POOLS.pids():
                break
            await asyncio.sleep(0.1)
        assert "warm" not in POOLS.pids()
        after = (await _run(b, task_request(tmp_path, "after", 3)))[-1]
        assert after.kind is K.SUCCEEDED
        assert json.loads(after.output or "")["output"]["pid"] not in fresh | pids
    finally:
        await POOLS.close()
        await b.close()


ENV_MODULE = """\
import asyncio, json, os
import headway

env = headway.TaskEnvironment(
    name="envs",
    reusable=headway.ReusePolicy(replicas=1, concurrency=4, idle_ttl=1),
)

NAMES = ["RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT",
         "HEADWAY_ACTION_ID", "HEADWAY_POD", "COLOUR", "FLAVOUR"]

@env.task
async def seen(out: str) -> int:
    first = {n: os.environ.get(n) for n in NAMES}
    os.environ["MINE"] = first["HEADWAY_POD"]  # a call's own write stays its own
    await asyncio.sleep(0.5)  # the other calls run meanwhile, in this same process
    after = {n: os.getenv(n) for n in NAMES + ["MINE"]}
    with open(os.path.join(out, first["HEADWAY_POD"] + ".json"), "w") as fh:
        json.dump({"first": first, "after": after, "pid": os.getpid()}, fh)
    return os.getpid()
"""


def env_request(root: Path, action: str, out: Path, colours: list[str]):  # type: ignore[no-untyped-def]
    command = ["python", "-m", "headway.sdk.run", "--module", "envtask", "--task", "seen"]
    command += ["--root", str(root), "--action", action, "--run", "r", "--address", "x:1"]
    command += ["--env", "FLAVOUR=mint", "--pool", "envs", "--pool-replicas", "1"]
    command += ["--pool-concurrency", "4", "--pool-idle-ttl", "1"]
    command += ["--inputs", json.dumps({"out": str(out)})]
    pods = [
        PodSpec(role="worker", index=i, cpu_m=100, memory=2**20, command=command, env={"COLOUR": c})
        for i, c in enumerate(colours)
    ]
    kind = GangKind.REPLICAS if len(pods) > 1 else GangKind.SINGLE
    return request(action, pods, kind=kind, duration_s=None)


async def test_each_call_in_a_pool_process_sees_its_own_pods_environment(tmp_path: Path):
    # A gang of two and a single action, all three calls at once in the pool's one
    # process: each sees its rank, world size, rendezvous address and its pod's own
    # variables, as a fresh process would, before and after the others ran.
    (tmp_path / "envtask.py").write_text(ENV_MODULE)
    out = tmp_path / "seen"
    out.mkdir()
    b = sim(state_dir=tmp_path / "state")
    await b.start()
    try:
        ends = await asyncio.gather(
            _run(b, env_request(tmp_path, "gang", out, ["red", "blue"])),
            _run(b, env_request(tmp_path, "solo", out, ["green"])),
        )
        assert [e[-1].kind for e in ends] == [K.SUCCEEDED, K.SUCCEEDED]
    finally:
        await POOLS.close()
        await b.close()
    seen = [json.loads(p.read_text()) for p in sorted(out.iterdir())]
    assert len(seen) == 3 and len({s["pid"] for s in seen}) == 1  # one process served all
    by_action: dict[str, list[dict[str, str]]] = {}
    for s in seen:
        assert {k: v for k, v in s["after"].items() if k != "MINE"} == s["first"]
        assert s["after"]["MINE"] == s["first"]["HEADWAY_POD"]
        by_action.setdefault(s["first"]["HEADWAY_ACTION_ID"], []).append(s["first"])
    gang = sorted(by_action["gang"], key=lambda e: e["RANK"])
    (solo,) = by_action["solo"]
    assert [(e["RANK"], e["WORLD_SIZE"], e["COLOUR"]) for e in gang] == [
        ("0", "2", "red"),
        ("1", "2", "blue"),
    ]
    assert (solo["RANK"], solo["WORLD_SIZE"], solo["COLOUR"]) == ("0", "1", "green")
    for e in [*gang, solo]:
        assert (e["MASTER_ADDR"], e["LOCAL_RANK"], e["FLAVOUR"]) == ("127.0.0.1", "0", "mint")
        # The port is per tenant and action (the request's tenant is "t1").
        assert e["MASTER_PORT"] == str(master_port(f"t1/{e['HEADWAY_ACTION_ID']}"))
    assert "MINE" not in os.environ  # the worker's own environment is untouched


def test_a_calls_environment_is_its_own_over_the_processes():
    # The pool process's os.environ (headway.sdk.run._CallEnviron): a call reads its own
    # variables first, writes and deletes only its own, and outside a call it is the
    # process's environment.
    import contextvars

    from headway.sdk.run import _CALL_ENV, _CallEnviron

    base = {"HOME": "/root", "SHARED": "process"}
    environ = _CallEnviron(base)

    def in_call() -> None:
        _CALL_ENV.set({"SHARED": "call", "RANK": "3"})
        assert environ["SHARED"] == "call" and environ.get("RANK") == "3"
        assert environ["HOME"] == "/root"
        environ["MINE"] = "x"
        del environ["HOME"]
        assert "HOME" not in environ and environ.get("HOME") is None
        assert environ.copy() == {"SHARED": "call", "RANK": "3", "MINE": "x"}
        assert len(environ) == 3
        with pytest.raises(KeyError):
            del environ["HOME"]

    contextvars.copy_context().run(in_call)
    assert base == {"HOME": "/root", "SHARED": "process"}  # the process's is untouched
    assert dict(environ) == base
    environ["OUTSIDE"] = "y"  # outside a call: the process's own
    assert base["OUTSIDE"] == "y"
