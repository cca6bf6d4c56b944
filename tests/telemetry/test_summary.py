"""The Web UI's texts about an action (``headway.workflows.summary``)."""

from __future__ import annotations

import pytest
from headway.scheduler.resources import Pod
from headway.workflows import summary

_GI = 2**30
H100 = Pod(cpu=8000, memory=64 * _GI, gpu=8, gpu_type="H100")


@pytest.mark.parametrize(
    ("pods", "text"),
    [
        pytest.param([H100, H100], "2×H100:8", id="a-two-node-gang"),
        pytest.param([Pod(gpu=4)], "1×4 GPU", id="untyped-gpus"),
        pytest.param([Pod(cpu=500, memory=256 * 2**20)], "1×cpu 500m, 256Mi", id="a-cpu-pod"),
        pytest.param(
            [Pod(cpu=4000, memory=16 * _GI), H100, H100],
            "1×cpu 4, 16Gi + 2×H100:8",
            id="a-ray-head-and-gpu-workers",
        ),
        pytest.param([Pod()], "1×no resources", id="an-empty-pod"),
    ],
)
def test_demand_in_a_few_characters(pods: list[Pod], text: str) -> None:
    assert summary.demand(pods) == text


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param(
            summary.admitted("2×H100:8", "gpu-h200", 12.4, ["NoClusterCapacity", "HeldForGang"]),
            "2×H100:8 on gpu-h200 after 12 s: NoClusterCapacity, HeldForGang",
            id="admitted-after-waiting",
        ),
        pytest.param(
            summary.admitted("1×cpu 1", "cpu", 0.01, []),
            "1×cpu 1 on cpu after 0 s",
            id="admitted-at-once",
        ),
        pytest.param(
            summary.waiting(
                "2×H100:8", "train", "HeldForGang", ["NoClusterCapacity", "HeldForGang"]
            ),
            "2×H100:8 waiting in train: HeldForGang (before: NoClusterCapacity)",
            id="waiting-with-an-earlier-reason",
        ),
        pytest.param(
            summary.waiting("2×H100:8", "train", None, []),
            "2×H100:8 waiting in train",
            id="waiting-before-any-pass",
        ),
        pytest.param(
            summary.ended("failed", "OOMKilled", "1×H100:1 on gpu-h100 after 0 s"),
            "failed (OOMKilled): 1×H100:1 on gpu-h100 after 0 s",
            id="failed-says-why",
        ),
        pytest.param(
            summary.ended("succeeded", "Succeeded", "1×cpu 1 on cpu after 0 s"),
            "succeeded: 1×cpu 1 on cpu after 0 s",
            id="succeeded-says-it-once",
        ),
        pytest.param(
            summary.ended("rejected", "UnknownQueue", ""),
            "rejected (UnknownQueue)",
            id="rejected-before-anything",
        ),
        pytest.param(
            summary.static_summary("train", [H100, H100]),
            "2×H100:8 in train",
            id="the-static-summary",
        ),
    ],
)
def test_what_the_web_ui_says(text: str, expected: str) -> None:
    assert text == expected
