"""The cluster worker as the final arbiter of its own capacity (issue #22).

The scheduler admits an action against the last capacity report it heard; by the time
the dispatch reaches the cluster worker, the room may be gone (another tenant's pods, a
pod Headway does not know, a node cordoned, tainted or NotReady). Before it creates
anything, the worker checks the admission against its live view (:func:`misfit`); when
the pods no longer fit, it creates nothing and hands the admission back, so nothing
Headway dispatches ever waits as a pending pod for capacity Headway knew was not there.

A cluster whose capacity is unknown (its worker cannot read nodes) has no live view; it
is checked against the node shapes its fleet entry declares (:func:`larger_than_shapes`),
which no waiting can change: such a misfit is *permanent* (see ``Verdict``).

Pure: no I/O, no clock. Quantities are the wire's canonical integers (``PodSpec``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from headway.protocol import NodeCapacity, PodSpec
from headway.scheduler.resources import Pod

__all__ = [
    "Verdict",
    "larger_than_shapes",
    "misfit",
    "pod_text",
    "tolerates",
    "unusable_reason",
]


@dataclass(frozen=True)
class Verdict:
    """Why an admission cannot be created now. ``permanent``: no change of the cluster's
    load can make it fit (a pod larger than every node shape), so handing it back to a
    cluster the scheduler would choose again is pointless."""

    message: str
    permanent: bool = False


def pod_text(p: PodSpec) -> str:
    """``main-0 (cpu 4000m, memory 16Gi, gpu H100:8)``: a pod and what it asks."""
    parts = [f"cpu {p.cpu_m}m", f"memory {_mem(p.memory)}"]
    if p.ephemeral_storage:
        parts.append(f"ephemeral-storage {_mem(p.ephemeral_storage)}")
    if p.gpu:
        parts.append(f"gpu {p.gpu_type + ':' if p.gpu_type else ''}{p.gpu}")
    return f"{p.role}-{p.index} ({', '.join(parts)})"


def _mem(n: int) -> str:
    for suffix, size in (("Ti", 2**40), ("Gi", 2**30), ("Mi", 2**20), ("Ki", 2**10)):
        if n >= size and n % size == 0:
            return f"{n // size}{suffix}"
    return str(n)


def _typed_mismatch(p: PodSpec, gpu_type: str | None) -> bool:
    return bool(p.gpu and p.gpu_type is not None and gpu_type != p.gpu_type)


def _short(p: PodSpec, free: list[int], gpu_type: str | None) -> list[str]:
    """What ``p`` lacks on a node with ``free`` [cpu, memory, eph, gpu] left."""
    if _typed_mismatch(p, gpu_type):
        return ["node(s) didn't match Pod's node affinity/selector"]
    return [
        what
        for want, have, what in (
            (p.cpu_m, free[0], "Insufficient cpu"),
            (p.memory, free[1], "Insufficient memory"),
            (p.ephemeral_storage, free[2], "Insufficient ephemeral-storage"),
            (p.gpu, free[3], "Insufficient nvidia.com/gpu"),
        )
        if want > have
    ]


def misfit(
    pods: Sequence[PodSpec], nodes: Sequence[NodeCapacity], pending: Sequence[PodSpec] = ()
) -> Verdict | None:
    """Whether every pod of a gang finds a node with room at once; None when it does.

    Args:
        pods: the admitted action's pods.
        nodes: the live view, free per node (a node that takes no new pods, cordoned,
            NotReady or tainted, has nothing free and says why in ``unusable``).
        pending: pods this worker created that are not bound yet: they take room first.

    Returns:
        None, or why not, in the kube-scheduler's words (``0/3 nodes are available:
        1 Insufficient cpu, 2 node(s) were cordoned``) for the first pod left without a
        node, largest pods placed first, each on the fitting node with least room left.
    """
    free = {
        n.name: [n.free_cpu_m, n.free_memory, n.free_ephemeral_storage, n.free_gpu] for n in nodes
    }
    kinds = {n.name: n.gpu_type for n in nodes}
    unusable = {n.name: n.unusable for n in nodes if n.unusable}

    def take(p: PodSpec) -> bool:
        fits = [
            name
            for name, f in free.items()
            if name not in unusable and not _short(p, f, kinds[name])
        ]
        if not fits:
            return False
        best = min(fits, key=lambda name: (free[name][3], free[name][0], name))
        f = free[best]
        f[0] -= p.cpu_m
        f[1] -= p.memory
        f[2] -= p.ephemeral_storage
        f[3] -= p.gpu
        return True

    for p in pending:
        take(p)  # a pending pod that finds no room holds none
    for p in sorted(
        pods, key=lambda p: (p.gpu, p.cpu_m, p.memory, p.ephemeral_storage), reverse=True
    ):
        if take(p):
            continue
        counts: dict[str, int] = {}
        for name, f in free.items():
            for why in [unusable[name]] if name in unusable else _short(p, f, kinds[name]):
                counts[why] = counts.get(why, 0) + 1
        detail = ", ".join(f"{n} {why}" for why, n in sorted(counts.items()))
        gang = f" (gang of {len(pods)})" if len(pods) > 1 else ""
        return Verdict(
            f"pod {pod_text(p)}{gang} fits no node now: 0/{len(nodes)} nodes are available"
            + (f": {detail}" if detail else "")
        )
    return None


def larger_than_shapes(pods: Sequence[PodSpec], shapes: Sequence[Pod]) -> Verdict | None:
    """For a cluster of unknown capacity: a pod no declared node shape could hold even
    empty (a permanent misfit), else None. No shapes declared: nothing to check."""
    if not shapes:
        return None
    for p in pods:
        if any(
            not _typed_mismatch(p, s.gpu_type)
            and p.cpu_m <= s.cpu
            and p.memory <= s.memory
            and p.ephemeral_storage <= s.eph
            and p.gpu <= s.gpu
            for s in shapes
        ):
            continue
        largest = max(shapes, key=lambda s: s.sort_key())
        big = f"cpu {largest.cpu}m, memory {_mem(largest.memory)}" + (
            f", gpu {largest.gpu_type + ':' if largest.gpu_type else ''}{largest.gpu}"
            if largest.gpu
            else ""
        )
        return Verdict(
            f"pod {pod_text(p)} is larger than every node shape the fleet declares for this"
            f" cluster (largest: {big}); its capacity is unknown, so the scheduler would"
            " choose it again",
            permanent=True,
        )
    return None


#: Taint effects that keep a new pod off a node (``PreferNoSchedule`` only steers).
_BLOCKING_EFFECTS = frozenset({"NoSchedule", "NoExecute"})


def tolerates(toleration: Mapping[str, Any], taint: Mapping[str, Any]) -> bool:
    """Whether one toleration matches one taint, as the kube-scheduler decides it."""
    effect = toleration.get("effect") or ""
    if effect and effect != taint.get("effect"):
        return False
    key = toleration.get("key") or ""
    if (toleration.get("operator") or "Equal") == "Exists":
        return not key or key == taint.get("key")
    return key == taint.get("key") and (toleration.get("value") or "") == (taint.get("value") or "")


def unusable_reason(node: Mapping[str, Any], tolerations: Sequence[Mapping[str, Any]] = ()) -> str:
    """Why a new pod with ``tolerations`` cannot go to ``node`` ("" it can): cordoned,
    NotReady, or a ``NoSchedule``/``NoExecute`` taint none of them tolerates, in the
    kube-scheduler's words."""
    if (node.get("spec") or {}).get("unschedulable"):
        return "node(s) were unschedulable"
    conditions = (node.get("status") or {}).get("conditions") or [
        {"type": "Ready", "status": "True"}
    ]
    if not any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions):
        return "node(s) were not ready"
    for taint in (node.get("spec") or {}).get("taints") or []:
        if taint.get("effect") not in _BLOCKING_EFFECTS:
            continue
        if not any(tolerates(t, taint) for t in tolerations):
            value = taint.get("value")
            return (
                f"node(s) had untolerated taint {{{taint.get('key')}:"
                f" {value if value else 'present'}}}"
            )
    return ""
