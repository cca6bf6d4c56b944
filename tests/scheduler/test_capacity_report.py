"""Capacity reports reconciled with reservations: no double counting, no leak."""

from __future__ import annotations

from dataclasses import dataclass

from headway.scheduler import (
    ActionSpec,
    Algorithm,
    ClusterSpec,
    NodeGroup,
    Pod,
    QueueSpec,
    Scheduler,
)

GI = 2**30


@dataclass
class Node:
    name: str
    cpu_m: int = 64_000
    memory: int = 256 * GI
    ephemeral_storage: int = 0
    gpu: int = 8
    gpu_type: str | None = "H100"
    free_cpu_m: int = 64_000
    free_memory: int = 256 * GI
    free_ephemeral_storage: int = 0
    free_gpu: int = 8


def setup() -> Scheduler:
    s = Scheduler(
        [ClusterSpec("c", (NodeGroup("n", 1, Pod(64_000, 256 * GI, 0, 8, "H100")),))],
        [QueueSpec("q", algorithm=Algorithm.greedy)],
    )
    a = ActionSpec("a", "q", (Pod(1000, GI, 0, 2, "H100"),))
    assert s.submit(a, 0.0) is None
    assert [x.action_id for x in s.schedule(0.0)] == ["a"]
    return s


def test_report_not_yet_reflecting_an_admission_keeps_its_reservation() -> None:
    s = setup()
    s.report_capacity("c", [Node("n-0")], reflected=[])  # pods not created yet
    assert s.clusters["c"].tgpu == 6


def test_report_reflecting_an_admission_is_not_double_counted() -> None:
    s = setup()
    s.report_capacity("c", [Node("n-0", free_gpu=6)], reflected=["a"])
    assert s.clusters["c"].tgpu == 6
    s.finish("a", 10.0)
    assert s.clusters["c"].tgpu == 8


def test_reflected_action_on_renamed_nodes_is_not_counted_twice() -> None:
    s = setup()
    s.report_capacity("c", [Node("other-0", free_gpu=6)], reflected=["a"])
    assert s.clusters["c"].tgpu == 6
    # Its old node is gone: finishing gives nothing back to a node that isn't there; the
    # next report is the truth.
    s.finish("a", 10.0)
    s.report_capacity("c", [Node("other-0", free_gpu=8)], reflected=[])
    assert s.clusters["c"].tgpu == 8


def test_unknown_capacity_opens_the_gate_and_is_counted() -> None:
    s = setup()
    s.report_capacity("c", None)
    b = ActionSpec("b", "q", (Pod(1000, GI, 0, 64, "H100"),))
    assert s.submit(b, 1.0) is None  # unknown means open, even for 64 GPU
    assert [x.action_id for x in s.schedule(1.0)] == ["b"]
    assert s.unknown_capacity_passes == 1
