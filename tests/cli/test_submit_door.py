"""``headway submit`` answers at the door (issue #23): exit 0 when the queue took the action
in, 3 when a queue's or the tenant's policy refused it (unknown queue, draining, depth),
4 when rate limited (with when to retry); the reason, the limit behind it and what to
change on stderr, never a traceback; nothing left behind.

Against a real Temporal dev server with the control-plane worker and one simulated
cluster worker as ``headway worker ...`` child processes, as in ``test_e2e``; each test
in a tenant of its own.
"""

from __future__ import annotations

import asyncio
import json
import re
import uuid
from collections.abc import Iterator

import pytest
from click.testing import CliRunner, Result
from headway.cli._common import load_fleet
from headway.cli._stack import Stack, _headway, wait_ready
from headway.cli.main import cli
from temporalio.testing import WorkflowEnvironment

pytestmark = pytest.mark.integration

CLUSTER = "door-cpu"
FLEET = f"""\
clusters:
  - name: {CLUSTER}
    node_groups:
      - {{name: c, count: 2, shape: {{cpu: 16, memory: 64Gi}}}}
queues:
  - name: default
"""


@pytest.fixture(scope="module")
def stack(
    temporal_env: WorkflowEnvironment, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Stack]:
    address = temporal_env.client.service_client.config.target_host
    data_dir = tmp_path_factory.mktemp("door")
    fleet_path = data_dir / "fleet.yaml"
    fleet_path.write_text(FLEET)
    s = Stack(data_dir, address, None)
    try:
        common = ["--address", address]
        s.spawn(
            "control-plane",
            _headway(
                *common,
                "worker",
                "control-plane",
                "--fleet",
                str(fleet_path),
                "--database-url",
                f"sqlite:///{data_dir / 'headway.db'}",
            ),
        )
        s.spawn(
            f"cluster-{CLUSTER}",
            _headway(*common, "worker", "cluster", "--name", CLUSTER, "--fleet", str(fleet_path)),
        )
        asyncio.run(wait_ready(s, load_fleet(fleet_path)))
        yield s
    finally:
        s.stop()


@pytest.fixture
def tenant() -> str:
    return f"door{uuid.uuid4().hex[:8]}"


def hw(stack: Stack, tenant: str, *args: str) -> Result:
    return CliRunner().invoke(cli, ["--address", stack.address, "--tenant", tenant, *args])


def submit(stack: Stack, tenant: str, *args: str) -> Result:
    return hw(stack, tenant, "submit", "--cpu", "1", "--memory", "1Gi", *args)


def answered(res: Result) -> None:
    """The command ended by itself with an answer, not by an exception."""
    assert res.exception is None or isinstance(res.exception, SystemExit), res.output
    assert "Traceback" not in res.output


def ok(res: Result) -> Result:
    assert res.exit_code == 0, res.output
    return res


def test_accepted_is_exit_0_with_the_state(stack: Stack, tenant: str) -> None:
    ok(hw(stack, tenant, "create", "queue", "default"))
    res = ok(submit(stack, tenant, "--id", "a1", "--duration", "0"))
    assert re.search(r"submitted a1 to queue 'default' \((waiting|running)", res.stdout)
    assert res.stderr == ""


def test_unknown_queue_exits_3_with_the_reason_and_what_to_change(
    stack: Stack, tenant: str
) -> None:
    ok(hw(stack, tenant, "create", "queue", "default"))
    res = submit(stack, tenant, "--id", "u1", "--queue", "nope")
    answered(res)
    assert res.exit_code == 3, res.output
    assert res.stdout == ""
    assert "rejected u1 (UnknownQueue): queue 'nope' does not exist" in res.stderr
    assert "what to change: create it (headway create queue nope)" in res.stderr


def test_a_pod_larger_than_every_node_is_rejected_at_submit_without_wait(
    stack: Stack, tenant: str
) -> None:
    # The door takes it in; the scheduler's first pass refuses it within moments, and
    # submit reports that answer (exit 3), not "submitted".
    ok(hw(stack, tenant, "create", "queue", "default"))
    res = hw(stack, tenant, "submit", "--cpu", "100", "--memory", "1Gi", "--id", "big1")
    answered(res)
    assert res.exit_code == 3, res.output
    assert res.stdout == ""
    assert "rejected big1 (Unschedulable)" in res.stderr, res.stderr
    # A submission that fits is still "submitted", exit 0.
    res = ok(submit(stack, tenant, "--id", "fits1", "--duration", "0"))
    assert "submitted fits1 to queue 'default'" in res.stdout


def test_draining_queue_exits_3(stack: Stack, tenant: str) -> None:
    ok(hw(stack, tenant, "create", "queue", "closing"))
    ok(hw(stack, tenant, "drain", "queue", "closing"))
    res = submit(stack, tenant, "--id", "d1", "--queue", "closing")
    answered(res)
    assert res.exit_code == 3, res.output
    # Draining, or drained already (it holds nothing): either way it takes nothing new.
    assert re.search(
        r"rejected d1 \(QueueDraining\): queue 'closing' is drain(ing|ed) and accepts no new",
        res.stderr,
    ), res.stderr
    assert "headway resume queue closing" in res.stderr
    # Reopened: the same id goes in (a rejected id may be submitted again).
    ok(hw(stack, tenant, "resume", "queue", "closing"))
    res = ok(submit(stack, tenant, "--id", "d1", "--queue", "closing", "--duration", "0"))
    assert "submitted d1 to queue 'closing'" in res.stdout


def test_depth_rejects_exactly_the_excess_of_a_batch(stack: Stack, tenant: str) -> None:
    """Depth 20, 25 submissions in one --count batch: 5 rejected (nothing is admitted)."""
    ok(hw(stack, tenant, "create", "queue", "q", "--depth", "20", "--action-concurrency", "0"))
    res = submit(stack, tenant, "--queue", "q", "--id", "x", "--count", "25")
    answered(res)
    assert res.exit_code == 3, res.output
    assert len(re.findall(r"^submitted x-\d+ ", res.stdout, re.M)) == 20
    assert len(re.findall(r"^rejected x-\d+ \(QueueDepthExceeded\)", res.stderr, re.M)) == 5
    assert "queue 'q' holds 20 actions (waiting + running); its depth is 20" in res.stderr
    assert "5 of 25 submissions rejected (above)" in res.stderr
    assert "headway update queue q --depth N" in res.stderr
    # Let the queue run dry, so that nothing of this tenant outlives the test.
    ok(hw(stack, tenant, "update", "queue", "q", "--action-concurrency", "unlimited"))
    asyncio.run(idle(stack, tenant, "q"))


async def idle(stack: Stack, tenant: str, queue: str, timeout_s: float = 60.0) -> None:
    """Wait until ``queue`` holds nothing (every action of the test has ended)."""
    from headway import protocol
    from headway.workflows import client as hwc
    from temporalio.client import Client

    client = await Client.connect(stack.address, data_converter=protocol.data_converter())
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout_s
    while True:
        q = (await hwc.get_queues(client, tenant))[queue]
        if (q["waiting"], q["running"]) == (0, 0):
            return
        assert loop.time() < end, q
        await asyncio.sleep(0.2)


def test_rate_limited_exits_4_with_when_to_retry(stack: Stack, tenant: str) -> None:
    ok(hw(stack, tenant, "create", "queue", "default"))
    # One submission per 100 s, a burst of one: the second is refused at once.
    ok(hw(stack, tenant, "update", "org", "--submit-rate", "0.01", "--submit-burst", "1"))
    ok(submit(stack, tenant, "--id", "r1", "--duration", "0"))
    res = submit(stack, tenant, "--id", "r2", "--json")
    answered(res)
    assert res.exit_code == 4, res.output
    line = json.loads(res.stderr.strip().splitlines()[-1])
    assert (line["id"], line["state"], line["reason"]) == ("r2", "rejected", "RateLimited")
    assert 0 < line["retry_after"] <= 100
    text = submit(stack, tenant, "--id", "r3")
    assert text.exit_code == 4, text.output
    assert "rejected r3 (RateLimited): the tenant's submit rate (0.01/s, burst 1)" in text.stderr
    assert re.search(r"retry after \d+ s", text.stderr), text.stderr


def test_a_queues_own_rate_is_set_by_flags_and_its_rejection_names_it(
    stack: Stack, tenant: str
) -> None:
    # One submission per 100 s to this queue, a burst of one; the tenant is unlimited.
    ok(hw(stack, tenant, "create", "queue", "slow", "--submit-rate", "0.01", "--submit-burst", "1"))
    shown = hw(stack, tenant, "describe", "queue", "slow")
    ok(shown)
    assert re.search(r"submit_rate:\s+0.01/s, burst 1\b", shown.output), shown.output
    ok(submit(stack, tenant, "--queue", "slow", "--id", "q1", "--duration", "0"))
    res = submit(stack, tenant, "--queue", "slow", "--id", "q2")
    answered(res)
    assert res.exit_code == 4, res.output
    assert "rejected q2 (RateLimited): queue 'slow''s submit rate (0.01/s, burst 1)" in res.stderr
    assert re.search(r"retry after \d+ s", res.stderr), res.stderr
    assert "headway update queue slow --submit-rate R --submit-burst B" in res.stderr
    assert "update org" not in res.stderr
    # Raised live by a flag (the burst kept): the next submission goes in.
    ok(hw(stack, tenant, "update", "queue", "slow", "--submit-rate", "100"))
    ok(submit(stack, tenant, "--queue", "slow", "--id", "q3", "--duration", "0"))
    # 'unlimited' unsets it.
    ok(hw(stack, tenant, "update", "queue", "slow", "--submit-rate", "unlimited"))
    shown = hw(stack, tenant, "describe", "queue", "slow")
    assert re.search(r"submit_rate:\s+unlimited", shown.output), shown.output
    asyncio.run(idle(stack, tenant, "slow"))


def test_an_action_waiting_past_max_queued_time_exits_3_with_wait(
    stack: Stack, tenant: str
) -> None:
    # Nothing starts on this queue; an action may wait a second.
    ok(
        hw(
            stack,
            tenant,
            "create",
            "queue",
            "brief",
            "--action-concurrency",
            "0",
            "--max-queued-time",
            "1s",
        )
    )
    shown = ok(hw(stack, tenant, "describe", "queue", "brief"))
    assert re.search(r"max_queued_time:\s+1s\b", shown.output), shown.output
    res = submit(stack, tenant, "--queue", "brief", "--id", "e1", "--wait")
    answered(res)
    assert res.exit_code == 3, res.output
    assert "submitted e1 to queue 'brief' (waiting)" in res.stdout
    assert "rejected e1 (QueuedTooLong): waited " in res.stderr
    assert "in queue 'brief' without starting; its max_queued_time is 1 s" in res.stderr
    assert "what to change: resubmit when the queue is shorter" in res.stderr
    # Unset: an action waits as long as it takes.
    ok(hw(stack, tenant, "update", "queue", "brief", "--max-queued-time", "unlimited"))
    shown = ok(hw(stack, tenant, "describe", "queue", "brief"))
    assert re.search(r"max_queued_time:\s+unlimited", shown.output), shown.output


def test_a_bad_max_queued_time_names_the_flag(stack: Stack, tenant: str) -> None:
    res = hw(stack, tenant, "create", "queue", "brief", "--max-queued-time", "soon")
    assert res.exit_code == 2, res.output
    assert "--max-queued-time: 'soon' is not a duration" in res.output
