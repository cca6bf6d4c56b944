"""The policy tables' rows: each case a tiny fleet, queues and workload (YAML built by
``tests/scheduler/helpers``), and the result expected for it, worked out BY HAND from the
spec; the reasoning is in the comment above each case. Defaults (see ``helpers``):
``make_cluster(name)`` is one node ``{cpu 64, 512Gi, "H200:8"}``; ``job(...)`` is one pod
``{cpu 1, 1Gi}`` plus the GPU given.

Every table runs against both engines (``engines.py``): ``check(case, engine)``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest

from ..helpers import by_id, make_cluster, make_queue
from .engines import run_on

NCC = "NoClusterCapacity"
HFG = "HeldForGang"
BFW = "BackfillWindow"


def h(n: int) -> str:
    return f"H200:{n}"


@dataclass
class Case:
    id: str
    text: str
    actions: dict[str, dict[str, Any]]
    summary: dict[str, Any] = field(default_factory=dict)
    queues: dict[str, dict[str, Any]] = field(default_factory=dict)
    utilization: dict[str, Any] = field(default_factory=dict)

    def param(self) -> Any:
        return pytest.param(self, id=self.id)


def S(
    start: float,
    end: float | None = None,
    cluster: str | None = None,
    reasons: list[str] | None = None,
) -> dict[str, Any]:
    """An action that started (status succeeded)."""
    d: dict[str, Any] = {"start": start, "status": "succeeded"}
    if end is not None:
        d["end"] = end
    if cluster is not None:
        d["cluster"] = cluster
    if reasons is not None:
        d["reasons"] = reasons
    return d


def REJ(reason: str) -> dict[str, Any]:
    return {"status": "rejected", "reasons": [reason], "start": None, "end": None, "cluster": None}


def PEND(reasons: list[str]) -> dict[str, Any]:
    return {"status": "pending", "reasons": reasons, "start": None, "end": None, "cluster": None}


C1 = [make_cluster("c1")]
Q = [make_queue("q")]


def check(case: Case, engine: str) -> None:
    """The scenario run on ``engine`` gives what ``case`` expects."""
    doc = run_on(engine, case.text)
    got = by_id(doc)
    problems = []
    for aid, exp in case.actions.items():
        a = got[aid]
        for k, v in exp.items():
            if a[k] != v:
                problems.append(f"{aid}.{k}: expected {v!r}, got {a[k]!r}")
    for k, v in case.summary.items():
        if doc["summary"][k] != pytest.approx(v):
            problems.append(f"summary.{k}: expected {v!r}, got {doc['summary'][k]!r}")
    for qn, exp in case.queues.items():
        for k, v in exp.items():
            if doc["queues"][qn][k] != pytest.approx(v):
                problems.append(f"queues.{qn}.{k}: expected {v!r}, got {doc['queues'][qn][k]!r}")
    for k, v in case.utilization.items():
        if doc["utilization"][k] != pytest.approx(v):
            problems.append(f"utilization.{k}: expected {v!r}, got {doc['utilization'][k]!r}")
    assert not problems, "\n".join(problems)
