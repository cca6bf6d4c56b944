"""An SDK task's pod on the simulated cluster: a real process running the task, its
outcome on the terminal event, and never a second run after the worker restarts."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

from headway.activities.backends.base import pod_name
from headway.protocol import ActionEventKind as K
from headway.protocol import PodSpec
from headway.tests.cluster.helpers import collect_until_terminal, request, sim

MODULE = """\
import asyncio, os
import headway

env = headway.TaskEnvironment(name="sim")

@env.task
async def double(x: int) -> int:
    with open(os.path.join(os.path.dirname(__file__), f"ran-{x}"), "a") as fh:
        fh.write(os.environ["RANK"] + "\\n")
    if x < 0:
        raise ValueError(f"negative: {x}")
    if x > 100:
        await asyncio.sleep(60)
    return 2 * x
"""


def task_request(root: Path, action: str, x: int):
    command = ["python", "-m", "headway.sdk.run", "--module", "simtask", "--task", "double"]
    command += ["--root", str(root), "--action", action, "--run", "r", "--address", "x:1"]
    command += ["--inputs", json.dumps({"x": x})]
    pod = PodSpec(role="main", index=0, cpu_m=100, memory=2**20, command=command)
    return request(action, [pod], duration_s=None)


async def _run(backend, req):
    with backend.subscribe() as q:
        await backend.create_pods(req, dispatch="d-" + req.action_id)
        return await collect_until_terminal(q, req.action_id, timeout=60)


async def test_the_pod_runs_the_task_and_its_outcome_is_the_terminal_events(tmp_path: Path):
    (tmp_path / "simtask.py").write_text(MODULE)
    b = sim(state_dir=tmp_path / "state")
    await b.start()
    try:
        ok = (await _run(b, task_request(tmp_path, "ok", 21)))[-1]
        assert (ok.kind, ok.exit_code) == (K.SUCCEEDED, 0)
        assert json.loads(ok.output or "") == {"ok": True, "output": 42}
        bad = (await _run(b, task_request(tmp_path, "bad", -1)))[-1]
        assert (bad.kind, bad.exit_code, bad.message) == (K.FAILED, 1, "ValueError: negative: -1")
        assert json.loads(bad.output or "")["error"]["type"] == "ValueError"
        assert (tmp_path / "ran-21").read_text() == "0\n"  # once, as rank 0
        log = tmp_path / "state" / "tasks-c1" / f"{pod_name('bad', 'main', 0, 't1')}.log"
        assert "ValueError: negative: -1" in log.read_text()
    finally:
        await b.close()
        sys.modules.pop("simtask", None)


async def test_a_task_running_when_its_worker_stops_is_lost_not_run_again(tmp_path: Path):
    (tmp_path / "simtask.py").write_text(MODULE)
    first = sim(state_dir=tmp_path / "state")
    await first.start()
    req = task_request(tmp_path, "long", 500)
    with first.subscribe() as q:
        await first.create_pods(req, dispatch="d1")
        while (await q.get()).kind is not K.RUNNING:
            pass
    for _ in range(100):  # the process is up once it wrote its mark
        if (tmp_path / "ran-500").exists():
            break
        await asyncio.sleep(0.1)
    await first.close()

    second = sim(state_dir=tmp_path / "state")
    with second.subscribe() as q:
        await second.start()
        events = await collect_until_terminal(q, "long", timeout=30)
    try:
        assert events[-1].kind is K.POD_LOST
        assert "not run again" in events[-1].message
        assert (tmp_path / "ran-500").read_text() == "0\n"  # it ran once
    finally:
        await second.close()
