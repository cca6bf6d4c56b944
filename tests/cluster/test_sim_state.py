"""The simulated cluster outlives its worker: a state directory, resumed in wall time.

"The worker dies" here is ``close()`` (every simulated clock stops; nothing is written
on the way out), and the restarted worker is a new SimBackend on the same directory. The
real ``kill -9`` of a worker process is in ``test_worker_restart.py``.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from headway.activities.backends.base import PodRecord
from headway.activities.backends.sim import STATE_VERSION, SimBackend
from headway.protocol import TERMINAL_EVENTS, ActionEvent, PodSpec
from headway.protocol import ActionEventKind as K

from .helpers import collect_until_terminal, pod_of, request, sim


async def started(state: Path, **opts: Any) -> SimBackend:
    b = sim(state_dir=state, **opts)
    await b.start()
    return b


def state_of(b: SimBackend) -> dict[str, Any]:
    assert b.state_path is not None
    loaded: dict[str, Any] = json.loads(b.state_path.read_text())
    return loaded


async def test_a_restarted_cluster_resumes_a_running_pod_where_wall_time_says(tmp_path):
    first = await started(tmp_path, time_scale=0.02)  # the pod runs 1 s
    with first.subscribe() as q:
        await first.create_pods(request("r1", duration_s=50.0), dispatch="d1")
        while (await q.get()).kind is not K.RUNNING:
            pass
    (pod,) = state_of(first)["pods"]
    await first.close()

    second = await started(tmp_path, time_scale=0.02)
    try:
        assert second.pods("r1") == {pod_of("r1"): pod["node"]}
        assert second.created_count == first.created_count == 1
        with second.subscribe() as q:
            events = await collect_until_terminal(q, "r1")
        # It went on running: no second Scheduled or Running, just its end.
        assert [e.kind for e in events] == [K.SUCCEEDED]
        (after,) = state_of(second)["pods"]
        assert after["ends_at"] == pod["ends_at"], "its deadline is the one it was bound with"
    finally:
        await second.close()


@pytest.mark.parametrize(
    ("inject", "kind", "holds"),
    [
        (None, K.SUCCEEDED, False),
        ("oom", K.OOM_KILLED, False),
        ("fail", K.FAILED, False),
        ("preempt", K.PREEMPTED, False),
        ("node-lost", K.NODE_LOST, False),
        # An image that cannot be pulled keeps its pod bound until it is deleted.
        ("image-pull", K.IMAGE_PULL_FAILED, True),
    ],
)
async def test_pods_that_should_have_ended_while_no_worker_ran_end_at_once(
    tmp_path, inject, kind, holds
):
    first = await started(tmp_path, time_scale=0.01, node_recovery_s=1000)
    await first.create_pods(request("e1", duration_s=5.0, inject=inject), dispatch="d1")
    (pod,) = state_of(first)["pods"]
    await first.close()
    # Wait, with no worker, until the pod's end is past.
    await asyncio.sleep(max(0.0, pod["ends_at"] - first.clock()) + 0.05)

    second = await started(tmp_path, time_scale=0.01, node_recovery_s=1000)
    try:
        (last,) = await second.current_events("e1")
        while last.kind not in TERMINAL_EVENTS:  # it ends on the first turn of the loop
            await asyncio.sleep(0)
            (last,) = await second.current_events("e1")
        assert last.kind is kind
        cap = await second.capacity()
        assert ("e1" in cap.reflected_actions) is holds
        if inject == "node-lost":
            assert pod["node"] not in {n.name for n in cap.nodes or []}
    finally:
        await second.close()


async def test_a_lost_node_comes_back_when_due_even_across_a_restart(tmp_path):
    first = await started(tmp_path, time_scale=0.01)
    first.kill_node("cpu-1", recover_after_s=20)  # 0.2 s
    await first.close()
    second = await started(tmp_path, time_scale=0.01)
    try:
        assert "cpu-1" not in {n.name for n in (await second.capacity()).nodes or []}
        async with asyncio.timeout(5):
            while "cpu-1" not in {n.name for n in (await second.capacity()).nodes or []}:
                await second.wait_capacity_change(-1)
                await asyncio.sleep(0.02)
    finally:
        await second.close()


async def test_pending_pods_bind_after_a_restart_when_room_frees(tmp_path):
    first = await started(tmp_path, time_scale=0.01)
    big = [PodSpec(role="main", index=0, cpu_m=20_000)]  # one at a time, on gpu-0 only
    await first.create_pods(request("b1", big, duration_s=5.0), dispatch="d1")
    await first.create_pods(request("b2", big, duration_s=5.0), dispatch="d2")
    await first.create_pods(request("b3", big, duration_s=5.0), dispatch="d3")
    assert first.pods("b3") == {pod_of("b3"): None}
    await first.close()
    second = await started(tmp_path, time_scale=0.01)
    try:
        with second.subscribe() as q:
            events = await collect_until_terminal(q, "b3")
        assert [e.kind for e in events][-3:] == [K.SCHEDULED, K.RUNNING, K.SUCCEEDED]
        assert second.created_count == 3
    finally:
        await second.close()


@pytest.mark.parametrize(
    ("content", "reason"),
    [
        (b"{not json", "Expecting property name"),
        (json.dumps({"version": STATE_VERSION + 1, "cluster": "c1"}).encode(), "version"),
        (json.dumps({"version": STATE_VERSION, "cluster": "other"}).encode(), "'other'"),
        (json.dumps([1, 2]).encode(), "not a JSON object"),
        (
            json.dumps(
                {"version": STATE_VERSION, "cluster": "c1", "pods": [{"name": "x"}]}
            ).encode(),
            "'action_id'",
        ),
    ],
    ids=["not-json", "version", "other-cluster", "not-object", "pod-missing-field"],
)
def test_a_state_file_that_cannot_be_read_back_is_refused_by_name(tmp_path, content, reason):
    (tmp_path / "sim-c1.json").write_bytes(content)
    with pytest.raises(ValueError, match="state_dir") as err:
        sim(state_dir=tmp_path)
    assert str(tmp_path / "sim-c1.json") in str(err.value)
    assert reason in str(err.value)


async def test_the_state_file_is_replaced_whole_and_always_parses(tmp_path):
    b = await started(tmp_path, time_scale=0.01)
    try:
        seen: list[ActionEvent] = []
        with b.subscribe() as q:
            for i in range(5):
                await b.create_pods(request(f"w{i}", duration_s=2.0), dispatch=f"d{i}")
            async with asyncio.timeout(5):
                while sum(1 for e in seen if e.kind in TERMINAL_EVENTS) < 5:
                    seen.append(await q.get())
                    # Every state written along the way was complete JSON.
                    assert state_of(b)["version"] == STATE_VERSION
        assert [p.name for p in tmp_path.iterdir()] == ["sim-c1.json"], "no temporary left"
        assert sum(1 for e in seen if e.kind is K.SUCCEEDED) == 5
        records = state_of(b)["records"]
        assert isinstance(records, dict) and len(records) == 5
    finally:
        await b.close()


async def test_forget_drops_the_records_of_an_ended_action(tmp_path):
    b = await started(tmp_path)
    try:
        await b.create_pods(request("f1"), dispatch="d1")
        await b.delete_pods("f1")
        # Its pod is gone; what it was (where it ran, not ended) is remembered.
        assert await b.dispatch_record("f1", "d1") == {
            pod_of("f1"): PodRecord(pod_of("f1"), "cpu-0", None)
        }
        assert [h.action_id for h in await b.headway_pods()] == ["f1"]
        b.forget("f1")
        assert await b.dispatch_record("f1", "d1") == {}
        assert await b.headway_pods() == []
        assert state_of(b)["records"] == {}
    finally:
        await b.close()


def test_bad_options_are_named():
    with pytest.raises(ValueError, match="time_scale: -1"):
        sim(time_scale=-1)
    with pytest.raises(ValueError, match=r"startup_s: -0\.5"):
        sim(startup_s=-0.5)


def test_a_state_dir_that_is_a_file_is_refused_by_name(tmp_path):
    taken = tmp_path / "taken"
    taken.write_text("not a directory")
    with pytest.raises(ValueError, match="state_dir: cannot use") as err:
        sim(state_dir=taken)
    assert str(taken) in str(err.value)
