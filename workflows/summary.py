"""What an action's workflow says about itself in the Temporal Web UI (user metadata).

A person looking at an action in the Web UI, without Headway's CLI, reads its queue, its
demand, where it ran and what it waited for: the workflow's static summary and details
(set at start), its current details (updated as it waits, is admitted and ends), and a
summary per activity. Pure functions of the action's data, so the workflow calls them
deterministically and the texts are tested on their own.

    2×H100:8 in train                                      (static summary)
    2×H100:8 waiting in train: HeldForGang                 (current details, waiting)
    2×H100:8 on gpu-h200 after 12 s: NoClusterCapacity, HeldForGang   (admitted)
    succeeded: 2×H100:8 on gpu-h200 after 12 s: NoClusterCapacity, HeldForGang
"""

from __future__ import annotations

from collections.abc import Sequence

from headway.scheduler.resources import Pod

__all__ = [
    "admitted",
    "demand",
    "ended",
    "pod_shape",
    "static_details",
    "static_summary",
    "waiting",
]

_GI = 2**30
_MI = 2**20


def _cpu(millicores: int) -> str:
    return f"{millicores // 1000}" if millicores % 1000 == 0 else f"{millicores}m"


def _bytes(n: int) -> str:
    if n % _GI == 0:
        return f"{n // _GI}Gi"
    if n % _MI == 0:
        return f"{n // _MI}Mi"
    return str(n)


def pod_shape(p: Pod) -> str:
    """One pod in a few characters: its GPUs if it has any (``H100:8``), else its CPU
    and memory (``cpu 2, 8Gi``)."""
    if p.gpu:
        return f"{p.gpu_type}:{p.gpu}" if p.gpu_type else f"{p.gpu} GPU"
    parts = [f"cpu {_cpu(p.cpu)}"] if p.cpu else []
    if p.memory:
        parts.append(_bytes(p.memory))
    return ", ".join(parts) or "no resources"


def demand(pods: Sequence[Pod]) -> str:
    """The pods as ``N×shape``, runs of equal shapes together: ``2×H100:8``, or a Ray
    cluster's ``1×cpu 4, 16Gi + 2×H100:8``."""
    groups: list[tuple[str, int]] = []
    for p in pods:
        shape = pod_shape(p)
        if groups and groups[-1][0] == shape:
            groups[-1] = (shape, groups[-1][1] + 1)
        else:
            groups.append((shape, 1))
    return " + ".join(f"{n}×{shape}" for shape, n in groups) or "no pods"


def static_summary(queue: str, pods: Sequence[Pod]) -> str:
    """The one line the Web UI lists the action with: ``2×H100:8 in train``."""
    return f"{demand(pods)} in {queue}"


def static_details(
    *, tenant: str, queue: str, run: str, task: str, kind: str, pods: Sequence[Pod]
) -> str:
    """What the action is, as Temporal markdown (set once, at start)."""
    return "\n".join(
        [
            f"**queue** {queue} · **tenant** {tenant} · **run** {run} · **task** {task}",
            f"**demand** {demand(pods)} ({len(pods)} pod{'s' if len(pods) != 1 else ''}, {kind})",
            "Why it waits, while it waits: `headway why <action-id>`.",
        ]
    )


def waiting(demand_text: str, queue: str, reason: str | None, reasons: Sequence[str]) -> str:
    """While it waits: the current reason, and the others it waited for so far."""
    text = f"{demand_text} waiting in {queue}"
    if reason:
        text += f": {reason}"
    earlier = [r for r in reasons if r != reason]
    if earlier:
        text += f" (before: {', '.join(earlier)})"
    return text


def admitted(demand_text: str, cluster: str, wait_s: float, reasons: Sequence[str]) -> str:
    """Where it runs, after how long, and what it waited for."""
    text = f"{demand_text} on {cluster} after {wait_s:.0f} s"
    return f"{text}: {', '.join(reasons)}" if reasons else text


def ended(state: str, reason: str | None, before: str) -> str:
    """How it ended, then what it was: ``failed (OOMKilled): 1×H100:1 on gpu-h100 ...``."""
    head = state if not reason or reason.lower() == state else f"{state} ({reason})"
    return f"{head}: {before}" if before else head
