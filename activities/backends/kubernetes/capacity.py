"""Capacity reading for the Kubernetes backend: what each node has, and has free for a
pod, from the informers' picture of the nodes and of every pod on the cluster
(Headway's of any tenant, or not Headway's at all).
"""

from __future__ import annotations

from collections.abc import Callable, Container, Mapping, Sequence
from typing import Any

from headway.activities.arbiter import unusable_reason
from headway.protocol import NodeCapacity, PodSpec
from headway.scheduler.resources import parse_cpu, parse_memory

from .pods import GPU_RESOURCE
from .status import _FINISHED_PHASES, _action_of, _quantity, _requests_spec, pod_requests

__all__ = ["node_capacity", "requests_by_node"]

#: Requests (cpu_m, memory, ephemeral storage, gpu).
Requests = tuple[int, int, int, int]


def node_capacity(
    node: dict[str, Any],
    used: Requests,
    tolerations: Sequence[Mapping[str, Any]],
    gpu_type_of: Callable[[Mapping[str, str]], str | None],
) -> NodeCapacity:
    """One node's allocatable, and free = allocatable - ``used`` (nothing free on a
    node a pod with ``tolerations`` cannot go to); ``gpu_type_of`` names its GPU type
    from its labels."""
    alloc = (node.get("status") or {}).get("allocatable") or {}
    labels = (node.get("metadata") or {}).get("labels") or {}
    cpu = _quantity(alloc.get("cpu", 0), parse_cpu, "cpu")
    memory = _quantity(alloc.get("memory", 0), parse_memory, "memory")
    eph = _quantity(alloc.get("ephemeral-storage", 0), parse_memory, "ephemeral-storage")
    gpu = _quantity(alloc.get(GPU_RESOURCE, 0), parse_memory, GPU_RESOURCE)
    # A node that takes no new pod (cordoned, NotReady, or tainted against pods like
    # Headway's) has nothing free: counting it would admit pods that stay Pending.
    unusable = unusable_reason(node, tolerations)
    usable = not unusable
    return NodeCapacity(
        name=(node.get("metadata") or {}).get("name", ""),
        cpu_m=cpu,
        memory=memory,
        ephemeral_storage=eph,
        gpu=gpu,
        gpu_type=gpu_type_of(labels) if gpu else None,
        free_cpu_m=max(cpu - used[0], 0) if usable else 0,
        free_memory=max(memory - used[1], 0) if usable else 0,
        free_ephemeral_storage=max(eph - used[2], 0) if usable else 0,
        free_gpu=max(gpu - used[3], 0) if usable else 0,
        unusable=unusable,
    )


def requests_by_node(
    pods: Mapping[tuple[str, str], dict[str, Any]], headway: Container[tuple[str, str]]
) -> tuple[dict[str, Requests], list[PodSpec]]:
    """The summed requests of the unfinished pods bound to each node, and the requests
    of Headway's pods (keyed in ``headway``, or labelled as an action's) that are not
    bound yet, in ``pods`` order (they take room first)."""
    used: dict[str, list[int]] = {}
    pending: list[PodSpec] = []
    for key, pod in pods.items():
        node = (pod.get("spec") or {}).get("nodeName")
        phase = (pod.get("status") or {}).get("phase")
        if phase in _FINISHED_PHASES:
            continue
        if not node:
            # Whichever informer saw it first (the all-pods one may be ahead) and
            # whichever worker made it. Others' pending pods may never bind: not counted.
            if key in headway or _action_of(pod) is not None:
                pending.append(_requests_spec(pod))
            continue
        u = used.setdefault(node, [0, 0, 0, 0])
        for i, q in enumerate(pod_requests(pod)):
            u[i] += q
    return {node: (u[0], u[1], u[2], u[3]) for node, u in used.items()}, pending
