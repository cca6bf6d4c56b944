"""The seed's three failure stories, each with the queue setting that fixes it.

The scenario files live in ``examples/stories/`` (shipped for ``headway simulate``);
each runs the broken and the fixed configuration side by side on disjoint clusters.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from headway.scheduler.scenario import load_scenario
from headway.scheduler.simulator import simulate

STORIES = Path(__file__).resolve().parents[2] / "examples" / "stories"


def run(name: str) -> dict[str, dict[str, Any]]:
    path = STORIES / name
    doc = simulate(load_scenario(path.read_text(), str(path))).doc
    return {a["id"]: a for a in doc["actions"]}


def test_one_backfill_eats_production_fixed_by_priority_and_quota() -> None:
    acts = run("one-backfill-eats-production.yaml")
    # Before: production waits until the backlog's second wave ends.
    assert acts["prod-b-1"]["start"] == 1200.0
    assert acts["prod-b-1"]["reasons"] == ["NoClusterCapacity"]
    # After: the quota kept half the cluster free, so production starts on submit.
    assert acts["prod-a-1"]["start"] == 60.0
    assert acts["prod-a-2"]["start"] == 60.0
    assert acts["bf-a-03"]["reasons"] == ["MaxResources"]


def test_multi_gpu_job_never_starts_fixed_by_backfill() -> None:
    acts = run("multi-gpu-job-never-starts.yaml")
    greedy_wait = acts["train-g"]["start"] - acts["train-g"]["submit"]
    backfill_wait = acts["train-b"]["start"] - acts["train-b"]["submit"]
    # Greedy: the 2-GPU stream keeps starting; the gang waits for the stream to stop.
    assert acts["train-g"]["start"] > 990
    # Backfill: a reservation lets room accumulate; stream work that would not be gone
    # by then waits with BackfillWindow.
    assert backfill_wait * 5 < greedy_wait
    assert "BackfillWindow" in acts["sb-04"]["reasons"]


@pytest.mark.parametrize(
    ("action", "status", "reasons"),
    [
        pytest.param(
            "h200-wrong-queue",
            "rejected",
            ["Unschedulable"],
            id="typed-gpu-nowhere-in-selector-rejected",
        ),
        pytest.param(
            "sixteen-gpu-pod", "rejected", ["Unschedulable"], id="pod-larger-than-any-node-rejected"
        ),
        pytest.param(
            "h100-3",
            "succeeded",
            ["NoClusterCapacity"],
            id="beyond-capacity-waits-in-queue-not-pending-pod",
        ),
        pytest.param("h200-fixed", "succeeded", [], id="selector-including-h200-cluster-runs-it"),
    ],
)
def test_error_is_a_pending_pod_answered_in_the_control_plane(
    action: str, status: str, reasons: list[str]
) -> None:
    a = run("error-is-a-pending-pod.yaml")[action]
    assert a["status"] == status
    assert a["reasons"] == reasons
