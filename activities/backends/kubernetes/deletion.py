"""Deleting pods on the Kubernetes API server, Headway's way: the deletion first (with
its grace period), then Headway's finalizer lifted with a tested JSON patch, so a pod is
never gone without the record of its end, and another controller's finalizer stays.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from .pods import FINALIZER

__all__ = ["read_pod", "remove_pod", "wait_gone"]


async def read_pod(api: k8s.CoreV1Api, ns: str, name: str) -> dict[str, Any] | None:
    """The pod as the API server has it now; None when there is none."""
    try:
        resp: Any = await asyncio.to_thread(
            api.read_namespaced_pod, name, ns, _preload_content=False
        )
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise
    pod: dict[str, Any] = json.loads(resp.data)
    return pod


async def wait_gone(api: k8s.CoreV1Api, ns: str, name: str, timeout_s: float) -> None:
    """Wait until the pod (of an earlier dispatch) is gone; TimeoutError after
    ``timeout_s``."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while await read_pod(api, ns, name) is not None:
        if loop.time() >= deadline:
            raise TimeoutError(
                f"pod {ns}/{name} of an earlier dispatch still exists after {timeout_s:g} s"
            )
        await asyncio.sleep(0.1)


async def remove_pod(api: k8s.CoreV1Api, ns: str, pod: dict[str, Any], *, grace_s: int = 0) -> None:
    """Delete the pod (SIGTERM, then ``grace_s`` seconds before SIGKILL; a stale pod
    being replaced stops at once) and lift Headway's finalizer (it goes).

    The deletion first: a kill between the two leaves the pod marked for deletion,
    which the garbage collection finishes; never a running pod without its record.
    """
    name = pod["metadata"]["name"]
    if not (pod.get("metadata") or {}).get("deletionTimestamp"):
        try:
            await asyncio.to_thread(
                api.delete_namespaced_pod, name, ns, grace_period_seconds=grace_s
            )
        except ApiException as exc:
            if exc.status == 404:
                return
            raise
    for _ in range(3):
        finalizers = list((pod.get("metadata") or {}).get("finalizers") or [])
        if FINALIZER not in finalizers:
            return
        i = finalizers.index(FINALIZER)
        # A JSON patch with a test: only Headway's own finalizer goes, whatever
        # another controller added meanwhile (a failed test reads the pod again).
        patch = [
            {"op": "test", "path": f"/metadata/finalizers/{i}", "value": FINALIZER},
            {"op": "remove", "path": f"/metadata/finalizers/{i}"},
        ]
        try:
            await asyncio.to_thread(api.patch_namespaced_pod, name, ns, patch)
            return
        except ApiException as exc:
            if exc.status == 404:
                return
            if exc.status not in (409, 422, 500):
                raise
        fresh = await read_pod(api, ns, name)
        if fresh is None:
            return
        pod = fresh
    raise RuntimeError(f"pod {ns}/{name}: its finalizer could not be lifted")
