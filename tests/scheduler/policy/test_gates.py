"""The gates' one table (``policy.gates.GATES``): its order is the reasons' order, each
gate's limit is a knob that says it is read by that gate, and the index layer's
shortcuts over the gates agree with what the table says each gate reads."""

from __future__ import annotations

from dataclasses import fields, replace
from typing import Any

import pytest
from headway.scheduler.model import QUEUE_KNOBS, OrgLimits, QueueSpec
from headway.scheduler.policy.gates import GATES, Gate, _reads_running
from headway.scheduler.reasons import GATE_ORDER, Reason
from headway.scheduler.resources import Quota

# A value that turns each limit on (the gate's own test of it is in test_rules.py).
ON: dict[str, Any] = {
    "action_concurrency": 1,
    "run_concurrency": 1,
    "per_run_concurrency": 1,
    "max_resources": Quota(cpu=1000),
    "max_concurrent_actions": 1,
    "max_concurrent_runs": 1,
}


def test_the_table_is_the_gate_order_and_the_fit_comes_last() -> None:
    assert (*(g.reason for g in GATES), Reason.NoClusterCapacity) == GATE_ORDER


@pytest.mark.parametrize("gate", GATES, ids=lambda g: g.reason.value)
def test_each_limit_is_a_field_of_its_scope(gate: Gate) -> None:
    scope = QueueSpec if gate.scope == "queue" else OrgLimits
    assert gate.limit in {f.name for f in fields(scope)}, gate
    assert gate.limit in ON, f"give {gate.limit} a value in ON"


@pytest.mark.parametrize(
    "gate", [g for g in GATES if g.scope == "queue"], ids=lambda g: g.reason.value
)
def test_a_queue_knob_says_which_gate_reads_it(gate: Gate) -> None:
    (knob,) = [k for k in QUEUE_KNOBS if k.name == gate.limit]
    # (what else reads it follows a semicolon)
    assert knob.reads.split(";")[0] == f"gate {gate.reason.value}"


@pytest.mark.parametrize(
    "gate", [g for g in GATES if g.scope == "queue"], ids=lambda g: g.reason.value
)
def test_an_end_revisits_a_queue_whose_gate_reads_its_running_work(gate: Gate) -> None:
    # ``_reads_running`` decides whether an action's end revisits its queue: every
    # queue gate reads the queue's running work (its count, its runs or its usage).
    assert gate.reads & {"running", "runs", "usage"}
    spec = replace(QueueSpec("q"), **{gate.limit: ON[gate.limit]})
    assert _reads_running(spec)


def test_a_queue_with_no_limit_set_reads_no_running_work() -> None:
    assert not _reads_running(QueueSpec("q"))
