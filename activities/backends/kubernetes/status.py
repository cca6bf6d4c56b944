"""Reading pods for the Kubernetes backend: what a pod's status says happened to it (an
:class:`~headway.protocol.ActionEventKind`), its effective requests, an SDK task's
outcome document, and the Headway annotations and labels it carries.
"""

from __future__ import annotations

import datetime
import json
from collections.abc import Callable
from typing import Any

from headway.protocol import ActionEventKind, PodSpec
from headway.scheduler.resources import QuantityError, parse_cpu, parse_memory

from ..base import ACTION_ANNOTATION, ACTION_LABEL, DISPATCH_ANNOTATION, TENANT_LABEL
from .pods import GPU_RESOURCE, TERMINATION_LOG

_K = ActionEventKind
_IMAGE_PULL_REASONS = frozenset({"ErrImagePull", "ImagePullBackOff", "InvalidImageName"})
#: Image-pull states that never resolve by waiting: failed at once.
_IMAGE_PULL_FATAL = frozenset({"InvalidImageName"})
# DisruptionTarget reasons of an eviction (the kubelet under node pressure, the eviction
# API in a drain), as opposed to a preemption for a higher-priority pod.
_EVICTION_REASONS = frozenset({"EvictionByEvictionAPI", "TerminationByKubelet"})
# DisruptionTarget reasons that mean the node went away rather than the pod being pushed
# out for someone else.
_NODE_GONE_REASONS = frozenset({"DeletionByPodGC", "DeletionByTaintManager"})
_FINISHED_PHASES = frozenset({"Succeeded", "Failed"})


def _conditions(pod: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c.get("type", ""): c for c in (pod.get("status") or {}).get("conditions") or []}


def translate_pod(
    pod: dict[str, Any], *, node_gone: bool = False
) -> tuple[ActionEventKind, int | None, str] | None:
    """What a pod's status says happened to it: ``(kind, exit_code, message)``.

    Args:
        pod: The pod as the API serves it (a JSON dict).
        node_gone: The node the pod was bound to no longer exists.

    Returns:
        The most telling event kind, or None when there is nothing to report yet.
    """
    status = pod.get("status") or {}
    phase = status.get("phase", "")
    reason = status.get("reason") or ""
    conds = _conditions(pod)
    statuses = list(status.get("initContainerStatuses") or []) + list(
        status.get("containerStatuses") or []
    )

    # Container-level causes first: an OOM kill also shows up as phase Failed.
    for cs in statuses:
        state = cs.get("state") or {}
        term = state.get("terminated") or {}
        if term.get("reason") == "OOMKilled":
            return _K.OOM_KILLED, term.get("exitCode", 137), f"container {cs.get('name')} OOMKilled"
        waiting = state.get("waiting") or {}
        if waiting.get("reason") in _IMAGE_PULL_REASONS:
            image = cs.get("image") or _spec_image(pod, cs.get("name"))
            detail = waiting.get("message") or waiting["reason"]
            return (
                _K.IMAGE_PULL_FAILED,
                None,
                f"image {image!r} could not be pulled: {waiting['reason']}: {detail}",
            )

    if reason == "Evicted":
        return _K.EVICTED, None, status.get("message") or reason
    disruption = conds.get("DisruptionTarget")
    if disruption is not None and disruption.get("status") == "True":
        message = disruption.get("message") or disruption.get("reason") or "disrupted"
        if disruption.get("reason") in _NODE_GONE_REASONS:
            return _K.NODE_LOST, None, message
        if disruption.get("reason") in _EVICTION_REASONS:
            return _K.EVICTED, None, message
        return _K.PREEMPTED, None, message
    if reason == "Preempting":
        return _K.PREEMPTED, None, status.get("message") or reason
    if reason == "NodeLost" or (node_gone and phase not in _FINISHED_PHASES):
        return _K.NODE_LOST, None, status.get("message") or "node lost"

    if phase == "Succeeded":
        return _K.SUCCEEDED, 0, "Completed"
    if _deleted_before_it_ended(pod):
        if node_gone:
            return _K.NODE_LOST, None, "node lost"
        return _K.POD_LOST, None, "PodLost: the pod was deleted before it ended"
    if phase == "Failed":
        code: int | None = None
        why = reason or "Failed"
        for cs in statuses:
            term = (cs.get("state") or {}).get("terminated") or {}
            if term.get("exitCode"):
                code = int(term["exitCode"])
                why = term.get("reason") or why
                break
        return _K.FAILED, code, status.get("message") or why
    if phase == "Running":
        return _K.RUNNING, None, ""
    scheduled = conds.get("PodScheduled")
    if scheduled is not None:
        if scheduled.get("status") == "True":
            return _K.SCHEDULED, None, f"bound to {(pod.get('spec') or {}).get('nodeName', '')}"
        if scheduled.get("reason") == "Unschedulable":
            return _K.UNSCHEDULABLE, None, scheduled.get("message") or "Unschedulable"
    return None


def _spec_image(pod: dict[str, Any], container: str | None) -> str:
    spec = pod.get("spec") or {}
    for c in list(spec.get("initContainers") or []) + list(spec.get("containers") or []):
        if c.get("name") == container:
            return str(c.get("image") or "")
    return ""


def _image_pull_reason(pod: dict[str, Any]) -> str | None:
    """The image-pull waiting reason of the pod's first container stuck on one."""
    status = pod.get("status") or {}
    for cs in list(status.get("initContainerStatuses") or []) + list(
        status.get("containerStatuses") or []
    ):
        reason = ((cs.get("state") or {}).get("waiting") or {}).get("reason")
        if reason in _IMAGE_PULL_REASONS:
            return str(reason)
    return None


def task_output(pod: dict[str, Any]) -> str | None:
    """An SDK task pod's outcome document: its main container's termination message
    (None for a pod that runs no SDK task, or wrote nothing)."""
    spec = pod.get("spec") or {}
    main = next((c for c in spec.get("containers") or [] if c.get("name") == "main"), None)
    if main is None or main.get("terminationMessagePath") != TERMINATION_LOG:
        return None
    for cs in (pod.get("status") or {}).get("containerStatuses") or []:
        if cs.get("name") == "main":
            message = ((cs.get("state") or {}).get("terminated") or {}).get("message")
            return str(message) if message else None
    return None


def _task_failure(document: str) -> str | None:
    """``Type: message`` of a task's failure document (None: not one)."""
    try:
        doc = json.loads(document)
    except ValueError:
        return None
    err = doc.get("error") if isinstance(doc, dict) else None
    if not isinstance(err, dict):
        return None
    return f"{err.get('type', 'Error')}: {err.get('message', '')}".rstrip(": ")


def _deleted_before_it_ended(pod: dict[str, Any]) -> bool:
    """Marked for deletion while it ran (or was killed by the deletion): not finished,
    or Failed with every container terminated at or after the deletion was asked for
    (a Failed pod whose times are not all known keeps its own failure)."""
    deleted = _time((pod.get("metadata") or {}).get("deletionTimestamp"))
    if deleted is None:
        return False
    status = pod.get("status") or {}
    if status.get("phase") != "Failed":
        return True
    finished = [
        _time(((cs.get("state") or {}).get("terminated") or {}).get("finishedAt"))
        for cs in status.get("containerStatuses") or []
    ]
    known = [t for t in finished if t is not None]
    return bool(finished) and len(known) == len(finished) and max(known) >= deleted


def _time(value: Any) -> datetime.datetime | None:
    """An RFC 3339 time as the API serves it; None when absent or unreadable."""
    if not value:
        return None
    try:
        t = datetime.datetime.fromisoformat(str(value))
    except ValueError:
        return None
    return t if t.tzinfo is not None else t.replace(tzinfo=datetime.UTC)


def _quantity(value: Any, parse: Callable[[Any, str], int], what: str) -> int:
    try:
        return parse(value, what)
    except QuantityError:
        return 0


def pod_requests(pod: dict[str, Any]) -> tuple[int, int, int, int]:
    """A pod's effective requests (cpu_m, memory, ephemeral, gpu), as the scheduler counts
    them: the larger of the containers' sum and the largest init container, plus
    overhead."""

    def of(c: dict[str, Any]) -> tuple[int, int, int, int]:
        r = (c.get("resources") or {}).get("requests") or {}
        lim = (c.get("resources") or {}).get("limits") or {}
        gpu = r.get(GPU_RESOURCE, lim.get(GPU_RESOURCE, 0))
        return (
            _quantity(r.get("cpu", 0), parse_cpu, "cpu"),
            _quantity(r.get("memory", 0), parse_memory, "memory"),
            _quantity(r.get("ephemeral-storage", 0), parse_memory, "ephemeral-storage"),
            _quantity(gpu, parse_memory, GPU_RESOURCE),
        )

    spec = pod.get("spec") or {}
    total = [0, 0, 0, 0]
    for c in spec.get("containers") or []:
        total = [a + b for a, b in zip(total, of(c), strict=True)]
    for c in spec.get("initContainers") or []:
        total = [max(a, b) for a, b in zip(total, of(c), strict=True)]
    overhead = spec.get("overhead") or {}
    total[0] += _quantity(overhead.get("cpu", 0), parse_cpu, "cpu")
    total[1] += _quantity(overhead.get("memory", 0), parse_memory, "memory")
    return total[0], total[1], total[2], total[3]


def _action_of(pod: dict[str, Any]) -> str | None:
    meta = pod.get("metadata") or {}
    annotated = (meta.get("annotations") or {}).get(ACTION_ANNOTATION)
    if annotated:
        return str(annotated)
    labelled = (meta.get("labels") or {}).get(ACTION_LABEL)
    return str(labelled) if labelled else None


def _tenant_of(pod: dict[str, Any]) -> str:
    """The tenant label of a Headway pod (a tenant name is a valid label value as it
    is); "" when it has none."""
    return str(((pod.get("metadata") or {}).get("labels") or {}).get(TENANT_LABEL, ""))


def _owner_of(pod: dict[str, Any]) -> tuple[str, str] | None:
    """``(tenant, action id)`` of a Headway pod; None for any other pod."""
    action = _action_of(pod)
    return None if action is None else (_tenant_of(pod), action)


def _dispatch_of(pod: dict[str, Any]) -> str:
    return str(((pod.get("metadata") or {}).get("annotations") or {}).get(DISPATCH_ANNOTATION, ""))


def _requests_spec(pod: dict[str, Any]) -> PodSpec:
    cpu, memory, eph, gpu = pod_requests(pod)
    return PodSpec(role="", index=0, cpu_m=cpu, memory=memory, ephemeral_storage=eph, gpu=gpu)


def _uid(obj: dict[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("uid") or "")


def _key(obj: dict[str, Any]) -> tuple[str, str]:
    meta = obj.get("metadata") or {}
    return meta.get("namespace") or "", meta.get("name") or ""
