"""The queue knob registry is the one list: nothing derived from it can miss a knob, and a
new field of the queue spec cannot be added without it."""

from __future__ import annotations

import dataclasses
import re

import pytest
from click.testing import CliRunner
from headway.cli._specs import QUEUE_FIELDS, queue_from_entry, queue_to_entry
from headway.cli.main import cli
from headway.scheduler.model import (
    QUEUE_KNOBS,
    Algorithm,
    Knob,
    KnobKind,
    Priority,
    QueueSpec,
    QueueStatus,
    RateLimit,
    RetryPolicy,
)
from headway.scheduler.reasons import Reason
from headway.scheduler.resources import Quota
from headway.scheduler.scenario import queue_changes

NAMES = [k.name for k in QUEUE_KNOBS]

#: A queue with every knob away from its default, so a knob a codec drops shows.
EVERY_KNOB_SET = QueueSpec(
    name="q",
    priority=Priority.high,
    algorithm=Algorithm.easy,
    run_concurrency=3,
    action_concurrency=7,
    per_run_concurrency=2,
    depth=50,
    submit_rate=RateLimit(per_second=2.5, burst=10.0),
    max_queued_time=600.0,
    max_resources=Quota(cpu=8000, memory=2**34, eph=None, gpu=8, gpu_type="H100"),
    clusters=("c1", "c2"),
    status=QueueStatus.draining,
    retry=RetryPolicy(
        oom=2,
        oom_factor=1.5,
        oom_max_memory=2**36,
        lost=3,
        failed=1,
        backoff=5.0,
        ready_timeout=600.0,
        not_ready=1,
    ),
)


def test_every_field_of_the_queue_spec_is_a_knob_in_order() -> None:
    assert [f.name for f in dataclasses.fields(QueueSpec)] == NAMES


def test_every_knob_is_set_in_the_spec_used_here() -> None:
    defaults = QueueSpec(name="other")
    unset = [n for n in NAMES if getattr(EVERY_KNOB_SET, n) == getattr(defaults, n)]
    assert unset == [], "give every new knob a non-default value in EVERY_KNOB_SET"


def test_the_json_form_round_trips_every_knob() -> None:
    d = EVERY_KNOB_SET.to_dict()
    assert list(d) == NAMES
    assert QueueSpec.from_dict(d) == EVERY_KNOB_SET


def test_the_human_form_round_trips_every_knob() -> None:
    entry = queue_to_entry(EVERY_KNOB_SET)
    assert list(entry) == list(QUEUE_FIELDS) == NAMES
    assert queue_from_entry(entry) == EVERY_KNOB_SET


def test_the_scenario_schema_takes_every_knob_but_the_name() -> None:
    entry = queue_to_entry(EVERY_KNOB_SET)
    del entry["name"]
    assert set(queue_changes(entry)) == set(NAMES) - {"name"}


def test_the_cli_has_a_flag_for_every_knob_but_the_name() -> None:
    out = CliRunner().invoke(cli, ["create", "queue", "--help"], terminal_width=200).output
    flags = set(re.findall(r"--([a-z-]+)", out))
    for k in QUEUE_KNOBS:
        if k.kind is KnobKind.name:
            continue
        want = {
            KnobKind.quota: "max-cpu",
            KnobKind.clusters: "cluster",
            KnobKind.rate: "submit-rate",
            KnobKind.retry: "retry-oom",
        }.get(k.kind, k.name.replace("_", "-"))
        assert want in flags, f"no CLI flag for knob {k.name}"


@pytest.mark.parametrize("knob", QUEUE_KNOBS, ids=lambda k: k.name)
def test_every_knob_says_what_it_does_and_what_reads_it(knob: Knob) -> None:
    assert knob.help and knob.reads
    for gate in re.findall(r"gate (\w+)", knob.reads):
        assert gate in Reason.__members__, f"{gate} is not a Reason"


def test_a_bad_limit_names_the_knob_and_the_value() -> None:
    from headway.scheduler.model import check_limits

    with pytest.raises(ValueError, match=r"depth: -1 must be a non-negative integer"):
        check_limits(dataclasses.replace(EVERY_KNOB_SET, depth=-1))
    with pytest.raises(ValueError, match=r"depth: 1(0){23} is more than 1,000,000,000"):
        check_limits(dataclasses.replace(EVERY_KNOB_SET, depth=10**23))
    check_limits(dataclasses.replace(EVERY_KNOB_SET, depth=1_000_000_000))


@pytest.mark.parametrize(
    ("value", "want"),
    [
        pytest.param(600, 600.0, id="seconds"),
        pytest.param("90s", 90.0, id="seconds-suffix"),
        pytest.param("10m", 600.0, id="minutes"),
        pytest.param("2h", 7200.0, id="hours"),
        pytest.param("1d", 86400.0, id="days"),
        pytest.param(None, None, id="unlimited"),
    ],
)
def test_max_queued_time_reads_seconds_or_a_duration(value: object, want: float | None) -> None:
    assert QueueSpec.from_dict({"name": "q", "max_queued_time": value}).max_queued_time == want


@pytest.mark.parametrize(
    ("value", "message"),
    [
        pytest.param("soon", "max_queued_time: 'soon' is not a duration", id="words"),
        pytest.param(-1, "max_queued_time: -1 must be >= 0", id="negative"),
        pytest.param(True, "max_queued_time: True is not a duration", id="a-boolean"),
    ],
)
def test_a_bad_max_queued_time_names_the_knob_and_the_value(value: object, message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        QueueSpec.from_dict({"name": "q", "max_queued_time": value})
