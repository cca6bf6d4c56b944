"""Submitting an id that exists is idempotent (issue #20).

The same submission of an existing id, running or ended, answers with that action and
exits 0 (``exists ... (unchanged, <state>)``, its result when it ended); a different
submission is an error naming the id and each field that differs; never a hang (a second
workflow for the id waiting for an admission that never comes), never a traceback.

Against a real Temporal dev server with the control-plane worker and one simulated
cluster worker as `headway worker ...` child processes, as in ``test_e2e``.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
from collections.abc import Awaitable, Callable, Iterator

import pytest
from click.testing import CliRunner, Result
from headway import protocol
from headway.cli._common import load_fleet
from headway.cli._stack import Stack, _headway, wait_ready
from headway.cli.main import cli
from headway.protocol import DemandRequest, SubmitRequest
from headway.sdk import Client, Resources, Task
from headway.sdk.client import ActionConflictError
from headway.workflows.client import _differences
from temporalio.client import Client as TemporalClient
from temporalio.testing import WorkflowEnvironment

TENANT = "idem"
CLUSTER = "idem-cpu"
FLEET = f"""\
clusters:
  - name: {CLUSTER}
    node_groups:
      - {{name: c, count: 2, shape: {{cpu: 16, memory: 64Gi}}}}
queues:
  - name: default
  - name: other
"""


# --- the comparison, without a server --------------------------------------------------


def _req(**kw: object) -> SubmitRequest:
    base: dict[str, object] = {
        "action_id": "a",
        "queue": "default",
        "demand": DemandRequest(resources={"cpu": "1", "memory": "1Gi"}),
    }
    return SubmitRequest(**{**base, **kw})  # type: ignore[arg-type]


def test_the_same_demand_spelled_differently_is_the_same_submission() -> None:
    other = _req(demand=DemandRequest(resources={"cpu": "1000m", "memory": 2**30}))
    assert _differences(_req(), other) == []


def test_the_revision_stamp_is_not_part_of_a_submission() -> None:
    assert _differences(_req(revision=1), _req(revision=2)) == []


def test_differences_name_each_field_with_both_values() -> None:
    other = _req(queue="other", demand=DemandRequest(resources={"cpu": "2", "memory": "1Gi"}))
    assert _differences(_req(), other) == [
        ("demand.resources.cpu", "1", "2"),
        ("queue", "default", "other"),
    ]
    assert _differences(_req(), _req(labels={"team": "x"})) == [("labels.team", None, "x")]


# --- live -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def stack(
    temporal_env: WorkflowEnvironment, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Stack]:
    """The control-plane worker and one simulated cluster worker, tenant ``idem``."""
    address = temporal_env.client.service_client.config.target_host
    data_dir = tmp_path_factory.mktemp("idem")
    fleet_path = data_dir / "fleet.yaml"
    fleet_path.write_text(FLEET)
    s = Stack(data_dir, address, None)
    try:
        common = ["--address", address, "--tenant", TENANT]
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
        asyncio.run(wait_ready(s, load_fleet(fleet_path), tenant=TENANT))
        yield s
    finally:
        s.stop()


def hw(stack: Stack, *args: str) -> Result:
    return CliRunner().invoke(cli, ["--address", stack.address, "--tenant", TENANT, *args])


def submit(stack: Stack, action_id: str, *args: str) -> Result:
    """``headway submit --id ACTION_ID`` with a small CPU action, plus ``args``."""
    return hw(stack, "submit", "--id", action_id, "--cpu", "1", "--memory", "1Gi", *args)


def clean_exit(res: Result) -> None:
    """The command ended by itself (exit code, message), not by an exception."""
    assert res.exception is None or isinstance(res.exception, SystemExit), res.output
    assert "Traceback" not in res.output


async def runs_of(client: TemporalClient, action_id: str) -> int:
    """How many workflow runs exist for the action's id (one, if it was never started
    again)."""
    wid = protocol.action_workflow_id(TENANT, action_id)
    return len([w async for w in client.list_workflows(f"WorkflowId = '{wid}'")])


async def queue_stats(client: TemporalClient, queue: str) -> dict[str, int]:
    from headway.workflows import client as hwc

    q = (await hwc.get_queues(client, TENANT))[queue]
    return {"waiting": q["waiting"], "running": q["running"]}


async def eventually(
    probe: Callable[[], Awaitable[object]], want: object, timeout_s: float
) -> None:
    """Wait until ``probe()`` answers ``want`` (ends reach the scheduler lazily, within
    about a second); fail with the last answer if it never does."""
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout_s
    while (got := await probe()) != want:
        if loop.time() > end:
            raise AssertionError(f"{got!r} never became {want!r}")
        await asyncio.sleep(0.2)


async def connect(stack: Stack) -> TemporalClient:
    return await TemporalClient.connect(stack.address, data_converter=protocol.data_converter())


@pytest.mark.integration
async def test_resubmitting_an_ended_id_answers_with_its_result(stack: Stack) -> None:
    first = await asyncio.to_thread(submit, stack, "done-1", "--duration", "0", "--wait")
    assert first.exit_code == 0, first.output
    assert "submitted done-1" in first.output and "state=succeeded" in first.output

    again = await asyncio.to_thread(submit, stack, "done-1", "--duration", "0")
    clean_exit(again)
    assert again.exit_code == 0, again.output
    assert "exists done-1 on queue 'default' (unchanged, succeeded)" in again.output
    assert "done-1: action_id=done-1, state=succeeded" in again.output

    # --wait answers at once with the same result; --json says it was not created.
    waited = await asyncio.to_thread(submit, stack, "done-1", "--duration", "0", "--wait")
    assert waited.exit_code == 0, waited.output
    assert "done-1: " in waited.output and "state=succeeded" in waited.output
    js = await asyncio.to_thread(submit, stack, "done-1", "--duration", "0", "--json")
    assert js.exit_code == 0, js.output
    line = json.loads(js.stdout.strip().splitlines()[-1])
    assert (line["created"], line["state"], line["result"]["state"]) == (
        False,
        "succeeded",
        "succeeded",
    )

    # Nothing was started again: no second workflow waiting, unseen, for ever.
    client = await connect(stack)
    assert await runs_of(client, "done-1") == 1
    # ... and the queue drains: the one run's end is collected, nothing else waits.
    await eventually(
        lambda: queue_stats(client, "default"), {"waiting": 0, "running": 0}, timeout_s=30
    )


@pytest.mark.integration
async def test_resubmitting_a_running_id_answers_with_that_action(stack: Stack) -> None:
    first = await asyncio.to_thread(submit, stack, "live-1", "--duration", "3")
    assert first.exit_code == 0, first.output
    again = await asyncio.to_thread(submit, stack, "live-1", "--duration", "3")
    clean_exit(again)
    assert again.exit_code == 0, again.output
    assert "exists live-1 on queue 'default' (unchanged, " in again.output
    # Still going when answered: a state, no result line.
    assert "live-1: action_id=" not in again.output
    waited = await asyncio.to_thread(submit, stack, "live-1", "--duration", "3", "--wait")
    assert waited.exit_code == 0, waited.output
    assert "live-1: " in waited.output and "state=succeeded" in waited.output
    assert await runs_of(await connect(stack), "live-1") == 1


@pytest.mark.integration
async def test_a_failed_id_resubmitted_with_wait_exits_non_zero(stack: Stack) -> None:
    first = await asyncio.to_thread(
        submit, stack, "bad-1", "--duration", "0", "--inject", "fail", "--wait"
    )
    assert first.exit_code == 1, first.output
    # Without --wait the submission itself is fine (it exists, unchanged): exit 0.
    again = await asyncio.to_thread(submit, stack, "bad-1", "--duration", "0", "--inject", "fail")
    assert again.exit_code == 0, again.output
    assert "(unchanged, failed)" in again.output
    waited = await asyncio.to_thread(
        submit, stack, "bad-1", "--duration", "0", "--inject", "fail", "--wait"
    )
    clean_exit(waited)
    assert waited.exit_code == 1 and "an action did not succeed" in waited.output
    assert await runs_of(await connect(stack), "bad-1") == 1


@pytest.mark.integration
async def test_a_conflicting_submission_names_the_id_and_fields(stack: Stack) -> None:
    first = await asyncio.to_thread(submit, stack, "conf-1", "--duration", "0", "--wait")
    assert first.exit_code == 0, first.output

    res = await asyncio.to_thread(
        hw, stack, "submit", "--id", "conf-1", "--cpu", "2", "--memory", "1Gi", "--queue", "other"
    )
    clean_exit(res)
    assert res.exit_code == 1, res.output
    assert "action 'conf-1' (tenant 'idem') already exists (succeeded)" in res.output
    assert "demand.resources.cpu: '1' there, '2' here" in res.output
    assert "queue: 'default' there, 'other' here" in res.output
    assert "submit under a new id" in res.output
    # The existing action is as it was.
    client = await connect(stack)
    assert await runs_of(client, "conf-1") == 1
    handle = client.get_workflow_handle(protocol.action_workflow_id(TENANT, "conf-1"))
    assert (await handle.describe()).status is not None


@pytest.mark.integration
async def test_the_console_command_exits_1_on_a_conflict_without_a_traceback(
    stack: Stack,
) -> None:
    first = await asyncio.to_thread(submit, stack, "proc-1", "--duration", "0")
    assert first.exit_code == 0, first.output
    args = ["--address", stack.address, "--tenant", TENANT, "submit", "--id", "proc-1"]
    same = await asyncio.to_thread(
        subprocess.run,
        _headway(*args, "--cpu", "1", "--memory", "1Gi", "--duration", "0"),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert same.returncode == 0, same.stderr
    assert "exists proc-1 on queue 'default' (unchanged, " in same.stdout
    other = await asyncio.to_thread(
        subprocess.run,
        _headway(*args, "--cpu", "1", "--memory", "2Gi", "--duration", "0"),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert other.returncode == 1, other.stdout + other.stderr
    assert "Traceback" not in other.stderr
    assert other.stderr.startswith("Error: action 'proc-1' (tenant 'idem') already exists")
    assert "demand.resources.memory: '1Gi' there, '2Gi' here" in other.stderr


@pytest.mark.integration
async def test_a_count_batch_submits_the_rest_and_fails_for_the_conflict(stack: Stack) -> None:
    first = await asyncio.to_thread(
        hw, stack, "submit", "--id", "batch-1", "--cpu", "2", "--duration", "0"
    )
    assert first.exit_code == 0, first.output
    # Copies are batch-0, batch-1, batch-2: batch-1 exists with 2 CPUs.
    res = await asyncio.to_thread(
        hw, stack, "submit", "--id", "batch", "--count", "3", "--cpu", "1", "--duration", "0"
    )
    clean_exit(res)
    assert res.exit_code == 1, res.output
    assert "submitted batch-0" in res.stdout and "submitted batch-2" in res.stdout
    assert "action 'batch-1' (tenant 'idem') already exists" in res.stderr
    assert "1 of 3 ids exist with a different submission" in res.stderr


@pytest.mark.integration
async def test_sdk_submit_is_idempotent_by_id(stack: Stack) -> None:
    hw_client = await Client.connect(stack.address, tenant=TENANT)
    task = Task("sdk", Resources(cpu=1, memory="1Gi"), duration=0)
    run = hw_client.with_runcontext(queue="default", run="sdk-run")

    # Submitted concurrently five times: one action, started once.
    subs = await asyncio.gather(*(run.submit(task, id="sdk-1") for _ in range(5)))
    assert sorted(a.created for a in subs) == [False, False, False, False, True]
    results = [await a.result() for a in subs]
    assert {r.state for r in results} == {"succeeded"}
    # Every answer is the same run (a started handle knows it as result_run_id).
    assert len({a.handle.run_id or a.handle.result_run_id for a in subs}) == 1
    assert await runs_of(hw_client.temporal, "sdk-1") == 1

    # Ended: the same submission (its CPU spelled "1000m") is that action and its result.
    again = await run.submit(
        task.override(resources=Resources(cpu="1000m", memory="1Gi")), id="sdk-1"
    )
    assert not again.created and again.state == "succeeded"
    assert again.ended is not None and again.ended.state == "succeeded"

    # A different submission raises, naming the id and the field; nothing changes.
    with pytest.raises(ActionConflictError) as err:
        await run.submit(task.override(image="python:3.12"), id="sdk-1")
    assert (err.value.tenant, err.value.action_id, err.value.state) == (
        TENANT,
        "sdk-1",
        "succeeded",
    )
    assert err.value.differences == [("image", "busybox", "python:3.12")]
    assert "action 'sdk-1'" in str(err.value) and "image: 'busybox' there" in str(err.value)
    assert await runs_of(hw_client.temporal, "sdk-1") == 1


@pytest.mark.integration
async def test_a_terminated_id_answers_as_failed_not_with_a_traceback(stack: Stack) -> None:
    first = await asyncio.to_thread(submit, stack, "term-1", "--duration", "60")
    assert first.exit_code == 0, first.output
    client = await connect(stack)
    handle = client.get_workflow_handle(protocol.action_workflow_id(TENANT, "term-1"))
    await handle.terminate(reason="operator")
    res = await asyncio.to_thread(submit, stack, "term-1", "--duration", "60", "--wait")
    clean_exit(res)
    assert res.exit_code == 1, res.output
    assert "(unchanged, failed)" in res.output
    assert "reason=Terminated" in res.output and "message=operator" in res.output
