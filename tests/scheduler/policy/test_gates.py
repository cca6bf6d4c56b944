"""The gates' one table (``policy.gates.GATES``): its order is the reasons' order, each
gate's limit is a knob that says it is read by that gate, ``_gate`` asks the table (a
row changed there is what the pass asks), and what the index layer knows of the gates
is what the table says each gate reads."""

from __future__ import annotations

from dataclasses import fields, replace
from typing import Any

import pytest
from headway.scheduler import ActionSpec, ClusterSpec, NodeGroup, Pod, Scheduler
from headway.scheduler.model import QUEUE_KNOBS, OrgLimits, QueueSpec
from headway.scheduler.policy import gates
from headway.scheduler.policy.gates import (
    GATES,
    Gate,
    _any_gate_on,
    _org_gated,
    _reads_running,
    _reads_runs,
    gates_on,
)
from headway.scheduler.reasons import GATE_ORDER, Reason
from headway.scheduler.resources import Quota

# A value that turns each limit on (each gate's rule is in test_concurrency_and_quotas.py).
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


@pytest.mark.parametrize("gate", GATES, ids=lambda g: g.reason.value)
def test_a_gate_is_on_exactly_when_its_limit_is_set(gate: Gate) -> None:
    spec, org = QueueSpec("q"), OrgLimits()
    if gate.scope == "queue":
        spec = replace(spec, **{gate.limit: ON[gate.limit]})
    else:
        org = replace(org, **{gate.limit: ON[gate.limit]})
    assert gates_on(spec, org) == [gate]
    assert _reads_runs(spec, org) == ("runs" in gate.reads)
    assert _org_gated(org) == (gate.scope == "org")
    assert _any_gate_on(spec, org)
    assert not _any_gate_on(QueueSpec("q"), OrgLimits())


def test_the_pass_asks_the_table_in_its_order(monkeypatch: pytest.MonkeyPatch) -> None:
    # Two rows that always fail, on limits that are set: the first row's reason is the
    # action's, whatever the checks of the shipped table would say.
    def always(*_: Any) -> bool:
        return True

    monkeypatch.setattr(
        gates,
        "GATES",
        (
            Gate(Reason.MaxResources, "action_concurrency", "queue", frozenset(), always),
            Gate(Reason.ActionConcurrency, "action_concurrency", "queue", frozenset(), always),
        ),
    )
    node = Pod(cpu=1000, memory=2**30)
    s = Scheduler([ClusterSpec("c", (NodeGroup("n", 1, node),))], [QueueSpec("q")])
    s.upsert_queue(QueueSpec("q", action_concurrency=5))
    assert s.submit(ActionSpec("a", "q", (node,)), 0) is None
    assert s.schedule(0) == []
    assert s.reasons("a") == [Reason.MaxResources.value]
