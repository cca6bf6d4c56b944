"""Builders for scheduler tests: small scenarios as YAML text, run through ``simulate``.

Tables stay readable by describing a scenario with a few helpers::

    scenario(
        clusters=[make_cluster("c1", gpus=8)],
        queues=[make_queue("q", algorithm="strict")],
        workload=[job("a", "q", 0, 100, gpu="H200:4")],
    )

Every builder returns plain dicts; ``scenario`` dumps them to YAML so the whole path
(parsing included) is exercised, exactly as ``headway simulate`` would.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml
from headway.scheduler import (
    ActionSpec,
    Algorithm,
    ClusterSpec,
    NodeGroup,
    Priority,
    QueueSpec,
    Scheduler,
)
from headway.scheduler.resources import Pod
from headway.scheduler.scenario import load_scenario
from headway.scheduler.simulator import simulate

HERE = Path(__file__).resolve().parent
SHARED = Path(__file__).resolve().parents[2].parent / "shared"


def shared_or_copy(shared_rel: str, local: Path) -> Path:
    """The shared file/folder if it exists, else the copy kept in this folder."""
    p = SHARED / shared_rel
    return p if p.exists() else local


def node_group(
    name: str = "n",
    count: int = 1,
    cpu: Any = 64,
    memory: Any = "512Gi",
    gpu: Any = None,
    eph: Any = None,
) -> dict[str, Any]:
    shape: dict[str, Any] = {"cpu": cpu, "memory": memory}
    if gpu is not None:
        shape["gpu"] = gpu
    if eph is not None:
        shape["ephemeral_storage"] = eph
    return {"name": name, "count": count, "shape": shape}


def make_cluster(
    name: str,
    gpus: int | None = 8,
    gpu_type: str | None = "H200",
    nodes: int = 1,
    cpu: Any = 64,
    memory: Any = "512Gi",
    groups: list[dict[str, Any]] | None = None,
    reports_capacity: bool | None = None,
) -> dict[str, Any]:
    """A cluster of ``nodes`` identical nodes with ``gpus`` GPUs each (typed unless
    ``gpu_type`` is None); or explicit ``groups``."""
    if groups is None:
        gpu: Any = None
        if gpus:
            gpu = f"{gpu_type}:{gpus}" if gpu_type else gpus
        groups = [node_group("g", nodes, cpu, memory, gpu)]
    c: dict[str, Any] = {"name": name, "node_groups": groups}
    if reports_capacity is not None:
        c["reports_capacity"] = reports_capacity
    return c


def make_queue(
    name: str, priority: str = "high", algorithm: str = "greedy", **knobs: Any
) -> dict[str, Any]:
    q: dict[str, Any] = {"name": name, "priority": priority, "algorithm": algorithm}
    q.update(knobs)
    return q


def res(cpu: Any = 1, memory: Any = "1Gi", gpu: Any = None, eph: Any = None) -> dict[str, Any]:
    r: dict[str, Any] = {}
    if cpu is not None:
        r["cpu"] = cpu
    if memory is not None:
        r["memory"] = memory
    if gpu is not None:
        r["gpu"] = gpu
    if eph is not None:
        r["ephemeral_storage"] = eph
    return r


def job(
    id: str,
    queue: str,
    submit: float,
    duration: float,
    gpu: Any = None,
    cpu: Any = 1,
    memory: Any = "1Gi",
    **extra: Any,
) -> dict[str, Any]:
    """A single-pod action (add ``replicas=N`` for a gang, or pass ``ray=``/``spark=``
    with ``resources=None``)."""
    j: dict[str, Any] = {"id": id, "queue": queue, "submit": submit, "duration": duration}
    resources = extra.pop("resources", "default")
    if resources == "default":
        j["resources"] = res(cpu, memory, gpu)
    elif resources is not None:
        j["resources"] = resources
    j.update(extra)
    return j


def scenario(
    clusters: list[dict[str, Any]],
    queues: list[dict[str, Any]],
    workload: list[dict[str, Any]],
    org: dict[str, Any] | None = None,
    environments: list[dict[str, Any]] | None = None,
    events: list[dict[str, Any]] | None = None,
) -> str:
    doc: dict[str, Any] = {"clusters": clusters, "queues": queues}
    if org is not None:
        doc["org"] = org
    if environments is not None:
        doc["environments"] = environments
    doc["workload"] = workload
    if events is not None:
        doc["events"] = events
    return yaml.safe_dump(doc, sort_keys=False)


def run(text: str) -> dict[str, Any]:
    """Parse and simulate a scenario; the result document."""
    return simulate(load_scenario(text, "test.yaml")).doc


def by_id(doc: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {a["id"]: a for a in doc["actions"]}


def timeline(doc: dict[str, Any]) -> dict[str, tuple[Any, Any, Any, str]]:
    """id -> (start, end, cluster, status)."""
    return {a["id"]: (a["start"], a["end"], a["cluster"], a["status"]) for a in doc["actions"]}


def submitter(s: Scheduler) -> Callable[[str, str, tuple[Pod, ...], float], None]:
    """``add(queue, action_id, pods, estimate)``: submit to ``s`` at time 0, in call
    order (seq 1, 2, ...), and assert the core accepts it."""
    seq = itertools.count(1)

    def add(queue: str, aid: str, pods: tuple[Pod, ...], est: float) -> None:
        a = ActionSpec(aid, queue, pods, submit=0.0, seq=next(seq), estimate=est)
        assert s.submit(a, 0.0) is None

    return add


def apply_op(s: Scheduler, op: tuple[Any, ...], seq: int, estimate: float | None = None) -> float:
    """Apply one event to ``s``: ``("finish" | "cancel", action_id, t)`` or
    ``("submit", queue, action_id, pod or pods, t)`` (submitted with ``seq`` and
    ``estimate``). Returns ``t``, for the pass that follows."""
    t: float = op[-1]
    if op[0] == "finish":
        s.finish(op[1], t)
    elif op[0] == "cancel":
        assert s.cancel(op[1], t)
    elif op[0] == "submit":
        pods = op[3] if isinstance(op[3], tuple) else (op[3],)
        a = ActionSpec(op[2], op[1], pods, submit=t, seq=seq, estimate=estimate)
        assert s.submit(a, t) is None
    return t


def one_node_taken(node: Pod, *queues: QueueSpec) -> Scheduler:
    """A scheduler over one cluster ``a`` of one ``node``, which the action ``f`` of the
    critical greedy queue ``fill`` has taken (estimated to end at t=100); ``queues``
    come after ``fill``."""
    s = Scheduler(
        [ClusterSpec("a", (NodeGroup("g", 1, node),))],
        [QueueSpec("fill", priority=Priority.critical, algorithm=Algorithm.greedy), *queues],
    )
    assert s.submit(ActionSpec("f", "fill", (node,), seq=0, estimate=100.0), 0.0) is None
    assert len(s.schedule(0.0)) == 1
    return s
