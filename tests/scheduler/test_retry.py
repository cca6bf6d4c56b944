"""Retries by failure class (issue #23): the rule the action workflow applies when an
attempt ends, and the queue's ``retry`` policy as files, JSON and the CLI give it."""

from __future__ import annotations

import re

import pytest
from click.testing import CliRunner
from headway.cli.main import cli
from headway.scheduler.model import QueueSpec, RetryPolicy
from headway.scheduler.resources import Pod
from headway.scheduler.retry import next_attempt

GI = 2**30
ONE = (Pod(cpu=1000, memory=GI),)


@pytest.mark.parametrize(
    ("policy", "kind", "used", "want"),
    [
        pytest.param(RetryPolicy(), "OOMKilled", {}, None, id="the-default-retries-nothing"),
        pytest.param(
            RetryPolicy(oom=2), "OOMKilled", {}, ("oom", 0.0, 2 * GI), id="an-oom-doubles-memory"
        ),
        pytest.param(
            RetryPolicy(oom=2, oom_factor=1.5),
            "OOMKilled",
            {"oom": 1},
            ("oom", 0.0, GI * 3 // 2),
            id="by-the-queues-factor",
        ),
        pytest.param(
            RetryPolicy(oom=5, oom_max_memory=3 * GI // 2),
            "OOMKilled",
            {},
            ("oom", 0.0, 3 * GI // 2),
            id="up-to-the-cap",
        ),
        pytest.param(
            RetryPolicy(oom=5, oom_max_memory=GI),
            "OOMKilled",
            {},
            None,
            id="at-the-cap-the-oom-stands",
        ),
        pytest.param(RetryPolicy(oom=2), "OOMKilled", {"oom": 2}, None, id="oom-retries-used"),
        pytest.param(RetryPolicy(lost=1), "Preempted", {}, ("lost", 0.0, GI), id="preempted"),
        pytest.param(RetryPolicy(lost=1), "NodeLost", {}, ("lost", 0.0, GI), id="node-lost"),
        pytest.param(RetryPolicy(lost=1), "PodLost", {}, ("lost", 0.0, GI), id="pod-lost"),
        pytest.param(RetryPolicy(lost=1), "Preempted", {"lost": 1}, None, id="lost-used"),
        pytest.param(
            RetryPolicy(failed=3, backoff=10),
            "Failed",
            {"failed": 2},
            ("failed", 40.0, GI),
            id="the-backoff-doubles",
        ),
        pytest.param(
            RetryPolicy(failed=3), "Failed", {"oom": 3}, ("failed", 30.0, GI), id="own-count"
        ),
        pytest.param(
            RetryPolicy(oom=9, lost=9, failed=9), "ImagePullFailed", {}, None, id="no-class"
        ),
        pytest.param(RetryPolicy(oom=9, lost=9, failed=9), "Succeeded", {}, None, id="success"),
        pytest.param(
            RetryPolicy(ready_timeout=60, backoff=5),
            "NotReady",
            {"not_ready": 1},
            ("not_ready", 10.0, GI),
            id="not-ready-backs-off-as-failed",
        ),
        pytest.param(
            RetryPolicy(ready_timeout=60), "NotReady", {"not_ready": 2}, None, id="not-ready-used"
        ),
    ],
)
def test_the_next_attempt_by_failure_class(
    policy: RetryPolicy, kind: str, used: dict[str, int], want: tuple[str, float, int] | None
) -> None:
    got = next_attempt(policy, kind, used, ONE)
    if want is None:
        assert got is None
        return
    assert got is not None
    assert (got.cls, got.delay, got.pods[0].memory) == want
    assert got.pods[0].cpu == 1000  # only memory ever changes


def test_every_pod_of_a_gang_gets_more_memory() -> None:
    gang = (Pod(cpu=1000, memory=GI), Pod(cpu=2000, memory=4 * GI))
    got = next_attempt(RetryPolicy(oom=1, oom_max_memory=6 * GI), "OOMKilled", {}, gang)
    assert got is not None
    assert [p.memory for p in got.pods] == [2 * GI, 6 * GI]
    assert got.note == "memory 4Gi -> 6Gi (retry 1 of 1)"


@pytest.mark.parametrize(
    ("retry", "message"),
    [
        pytest.param({"oom": -1}, "retry.oom: -1 must be a non-negative integer", id="negative"),
        pytest.param({"lost": "x"}, "retry.lost: 'x' must be a non-negative integer", id="words"),
        pytest.param(
            {"oom_factor": 0.5}, "retry.oom_factor: 0.5 must be a number >= 1", id="shrink"
        ),
        pytest.param({"backoff": "soon"}, "retry.backoff: 'soon' is not a duration", id="backoff"),
        pytest.param({"oom_max_memory": "lots"}, "retry.oom_max_memory", id="memory"),
        pytest.param({"evicted": 1}, "retry.evicted: not a retry setting", id="unknown-key"),
        pytest.param({"ready_timeout": "-1"}, "retry.ready_timeout: '-1' must be >= 0", id="ready"),
        pytest.param({"not_ready": 1.5}, "retry.not_ready: 1.5 must be a non-negative", id="tries"),
        pytest.param(3, "retry: 3 is not a mapping", id="not-a-mapping"),
    ],
)
def test_a_bad_retry_policy_names_the_field_and_the_value(retry: object, message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        QueueSpec.from_dict({"name": "q", "retry": retry})


def test_the_file_form_reads_quantities_and_durations() -> None:
    got = QueueSpec.from_dict(
        {"name": "q", "retry": {"oom": 2, "oom_max_memory": "64Gi", "backoff": "2m"}}
    )
    assert got.retry == RetryPolicy(oom=2, oom_max_memory=64 * GI, backoff=120.0)


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        pytest.param(
            ["--retry-oom", "two"], "--retry-oom: 'two' is not a number of retries", id="count"
        ),
        pytest.param(
            ["--retry-oom-factor", "0.5"],
            "--retry-oom-factor: 0.5 must be a number >= 1",
            id="factor",
        ),
        pytest.param(
            ["--retry-backoff", "soon"], "--retry-backoff: 'soon' is not a duration", id="backoff"
        ),
    ],
)
def test_a_bad_retry_flag_names_the_flag_and_the_value(flags: list[str], message: str) -> None:
    res = CliRunner().invoke(cli, ["create", "queue", "q", *flags], terminal_width=200)
    assert res.exit_code == 2, res.output
    assert message in res.output
    assert "Traceback" not in res.output
