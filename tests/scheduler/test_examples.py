"""The worked examples beside simulate.md, each run through ``simulate`` and compared to its
``.expect.json``: start, end, cluster, status, exact reasons, and max_inflight invariants
checked over the whole timeline.

The examples live in ``shared/specs/examples``; a copy is kept in ``examples/`` here so the
tests run where ``shared/`` is absent.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from headway.scheduler.resources import parse_cpu, parse_gpu, parse_memory
from headway.scheduler.scenario import Scenario, load_scenario
from headway.scheduler.simulator import simulate

from .helpers import HERE, shared_or_copy

EXAMPLES = shared_or_copy("specs/examples", HERE / "examples")
FILES = sorted(EXAMPLES.glob("*.yaml"))


def test_examples_are_found() -> None:
    assert len(FILES) >= 5, f"no examples under {EXAMPLES}"
    local = sorted(p.name for p in (HERE / "examples").glob("*"))
    shared = sorted(p.name for p in EXAMPLES.glob("*"))
    # the local copy is complete (same files as the shared folder when it exists)
    assert set(shared) <= set(local)


def _demand(sc: Scenario, aid: str, resource: str) -> int:
    item = next(w for w in sc.workload if w.spec.id == aid)
    pods = item.spec.pods
    if resource == "cpu":
        return sum(p.cpu for p in pods)
    if resource == "memory":
        return sum(p.memory for p in pods)
    if resource == "gpu":
        return sum(p.gpu for p in pods)
    if resource == "ephemeral_storage":
        return sum(p.eph for p in pods)
    raise AssertionError(f"unknown resource {resource!r}")


def _limit(resource: str, value: Any) -> int:
    if resource == "cpu":
        return parse_cpu(value)
    if resource in ("memory", "ephemeral_storage"):
        return parse_memory(value)
    if resource == "gpu":
        return parse_gpu(value)[0]
    return int(value)


def check_max_inflight(sc: Scenario, doc: dict[str, Any], inv: dict[str, Any]) -> None:
    """At every instant something starts, what is in flight stays within the limit."""
    qname, resource = inv["queue"], inv["resource"]
    limit = _limit(resource, inv["limit"])
    started = [a for a in doc["actions"] if a["start"] is not None]
    mine = [a for a in started if qname == "*" or a["queue"] == qname]
    for t in sorted({a["start"] for a in started}):
        live = [
            a for a in mine if a["start"] <= t and (t < a["end"] or a["start"] == a["end"] == t)
        ]
        if resource == "actions":
            used = len(live)
        elif resource == "runs":
            used = len({a["run"] for a in live})
        else:
            used = sum(_demand(sc, a["id"], resource) for a in live)
        assert used <= limit, f"t={t}: {qname} {resource} in flight {used} > {limit}"


@pytest.mark.parametrize("path", FILES, ids=[p.stem for p in FILES])
def test_example(path: Path) -> None:
    expect = json.loads(_expect_path(path).read_text())
    sc = load_scenario(path.read_text(), str(path))
    doc = simulate(sc).doc
    got = {a["id"]: a for a in doc["actions"]}
    problems = []
    for aid, exp in expect["actions"].items():
        assert aid in got, f"{aid} missing from the result"
        a = got[aid]
        for key in ("start", "end", "cluster", "status"):
            if key in exp and a[key] != exp[key]:
                problems.append(f"{aid}.{key}: expected {exp[key]!r}, got {a[key]!r}")
        if "reasons_exact" in exp and a["reasons"] != exp["reasons_exact"]:
            problems.append(
                f"{aid}.reasons: expected {exp['reasons_exact']!r}, got {a['reasons']!r}"
            )
    assert not problems, "\n".join(problems)
    for inv in expect.get("invariants", []):
        assert inv["type"] == "max_inflight", inv
        check_max_inflight(sc, doc, inv)


def _expect_path(path: Path) -> Path:
    return path.parent / (path.stem + ".expect.json")
