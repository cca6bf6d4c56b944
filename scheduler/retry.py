"""Retries by failure class (issue #23): what an action's next attempt is, if any.

Pure: the action workflow asks it when an attempt ended badly, with the queue's
``RetryPolicy`` and the retries each class has used so far, and gets the next attempt's
pods (memory raised after an OOM), how long to wait before requeueing it, and a line
saying why, or None: the failure stands.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from .model import RetryPolicy
from .resources import Pod

__all__ = [
    "ATTEMPT_SEP",
    "FAILURE_KINDS",
    "LOST_KINDS",
    "NOT_READY_KIND",
    "OOM_KIND",
    "Retry",
    "attempt_id",
    "failure_class",
    "next_attempt",
]

#: Ends that lose the work through no fault of its own: requeued at the head.
LOST_KINDS = frozenset({"Preempted", "Evicted", "NodeLost", "PodLost"})
OOM_KIND = "OOMKilled"
#: The application's own failure (a non-zero exit).
FAILED_KIND = "Failed"
#: Pods not all running within the queue's ``ready_timeout`` after dispatch.
NOT_READY_KIND = "NotReady"
#: Longest wait between two retries of an application failure.
MAX_BACKOFF_S = 3600.0
#: Every end a retry policy has a class for.
FAILURE_KINDS = frozenset({OOM_KIND, FAILED_KIND, NOT_READY_KIND, *LOST_KINDS})

#: Separates an action's id from its attempt number in the id of attempt 2 and later
#: (``train-7~2``): each attempt is a lease, an admission and pods of its own.
ATTEMPT_SEP = "~"


def attempt_id(action_id: str, number: int) -> str:
    """The id attempt ``number`` (1 first) of ``action_id`` is leased and dispatched as."""
    return action_id if number <= 1 else f"{action_id}{ATTEMPT_SEP}{number}"


@dataclass(frozen=True, slots=True)
class Retry:
    """The next attempt: its failure class, wait before requeueing, pods, and why."""

    cls: str  # "oom" | "lost" | "failed" | "not_ready"
    delay: float
    pods: tuple[Pod, ...]
    note: str


def failure_class(kind: str) -> str | None:
    """``oom``, ``lost``, ``failed`` or ``not_ready`` for an end of that class; None for
    any other."""
    if kind == OOM_KIND:
        return "oom"
    if kind in LOST_KINDS:
        return "lost"
    if kind == FAILED_KIND:
        return "failed"
    if kind == NOT_READY_KIND:
        return "not_ready"
    return None


def next_attempt(
    policy: RetryPolicy, kind: str, used: Mapping[str, int], pods: Sequence[Pod]
) -> Retry | None:
    """The attempt after one that ended ``kind``, or None when the end stands.

    Args:
        policy: the queue's retry policy.
        kind: how the attempt ended (an ``ActionEventKind`` value).
        used: retries used so far, by class.
        pods: the ended attempt's pods.
    """
    cls = failure_class(kind)
    if cls is None:
        return None
    allowed = {
        "oom": policy.oom,
        "lost": policy.lost,
        "failed": policy.failed,
        "not_ready": policy.not_ready,
    }[cls]
    n = used.get(cls, 0)
    if n >= allowed:
        return None
    count = f"retry {n + 1} of {allowed}"
    if cls == "lost":
        return Retry(cls, 0.0, tuple(pods), f"requeued at the head ({count})")
    if cls in ("failed", "not_ready"):
        delay = min(policy.backoff * 2**n, MAX_BACKOFF_S)
        return Retry(cls, delay, tuple(pods), f"retried after {delay:g}s ({count})")
    raised = tuple(_raise_memory(p, policy) for p in pods)
    if raised == tuple(pods):
        return None  # no more memory to give (at the cap, or none requested)
    before = max(p.memory for p in pods)
    after = max(p.memory for p in raised)
    note = f"memory {_gi(before)} -> {_gi(after)} ({count})"
    return Retry(cls, 0.0, raised, note)


def _raise_memory(pod: Pod, policy: RetryPolicy) -> Pod:
    want = math.ceil(pod.memory * policy.oom_factor)
    if policy.oom_max_memory is not None:
        want = min(want, max(policy.oom_max_memory, pod.memory))
    return replace(pod, memory=want)


def _gi(n: int) -> str:
    for suffix, size in (("Ti", 2**40), ("Gi", 2**30), ("Mi", 2**20), ("Ki", 2**10)):
        if n >= size and n % size == 0:
            return f"{n // size}{suffix}"
    return str(n)
