"""kmock's Kubernetes emulator, extended where it falls short of a real API server.

kmock 0.8 serves a real HTTP API that the official client talks to unchanged, but it
leaves a created object's namespace empty, has no resourceVersion, ignores label/field
selectors and ``timeoutSeconds``, and cannot expire a watch. The subclass below adds just
that: a global resourceVersion stamped on every change, an event log that watches replay
from a given resourceVersion (410 Gone once it has been compacted away), selectors,
server-side watch timeouts with bookmarks, 403 for resources a test forbids, and
finalizers as watchers see them (a DELETE marks, the last finalizer's removal deletes). For
fault tests it can fail the next deletes of a resource with a 500, and lose a node the
way a cluster does (:meth:`FakeKube.lose_node`: the pod garbage collector marks the
node's pods and deletes them, then the node goes), and cordon, taint or mark a node
NotReady (:meth:`FakeKube.cordon`, :meth:`FakeKube.taint`, :meth:`FakeKube.set_ready`). A
test may also play kube-scheduler and kubelet (:meth:`FakeKube.bind_pending`,
:meth:`FakeKube.run_scheduler`): pending pods are bound honouring scheduling gates,
nodeSelector, required node affinity, taints, cordons and free room, spreading like the
default scheduler.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import os
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import attrs
import kmock
from kmock._internal import enums, rendering

#: Where ``headway.sdk.run`` writes its outcome (the termination-message path in a pod).
_OUTPUT_ENV = "HEADWAY_OUTPUT_FILE"

_WRITE = {
    enums.action.CREATE: "ADDED",
    enums.action.UPDATE: "MODIFIED",
    enums.action.DELETE: "DELETED",
}


def _lookup(obj: dict[str, Any], path: str) -> Any:
    cur: Any = obj
    for part in path.split("."):
        cur = cur.get(part) if isinstance(cur, dict) else None
    return cur


def _selector_matches(labels: dict[str, str], selector: str) -> bool:
    for term in filter(None, (t.strip() for t in selector.split(","))):
        if "!=" in term:
            k, v = term.split("!=", 1)
            if labels.get(k.strip()) == v.strip():
                return False
        elif "=" in term:
            k, v = term.replace("==", "=").split("=", 1)
            if labels.get(k.strip()) != v.strip():
                return False
        elif term.startswith("!"):
            if term[1:] in labels:
                return False
        elif term not in labels:
            return False
    return True


def _fields_match(obj: dict[str, Any], selector: str) -> bool:
    for term in filter(None, (t.strip() for t in selector.split(","))):
        if "!=" in term:
            k, v = term.split("!=", 1)
            if str(_lookup(obj, k) or "") == v:
                return False
        elif "=" in term:
            k, v = term.replace("==", "=").split("=", 1)
            if str(_lookup(obj, k) or "") != v:
                return False
    return True


def _quantity(value: Any, parse: Any) -> int:
    return int(parse(value or 0, "fake"))


def _requests(pod: dict[str, Any]) -> list[int]:
    """(cpu_m, memory, gpu) the pod's containers request."""
    from headway.scheduler.resources import parse_cpu, parse_memory

    total = [0, 0, 0]
    for c in (pod.get("spec") or {}).get("containers") or []:
        r = (c.get("resources") or {}).get("requests") or {}
        lim = (c.get("resources") or {}).get("limits") or {}
        total[0] += _quantity(r.get("cpu"), parse_cpu)
        total[1] += _quantity(r.get("memory"), parse_memory)
        total[2] += _quantity(r.get("nvidia.com/gpu", lim.get("nvidia.com/gpu")), parse_memory)
    return total


def _allocatable(node: dict[str, Any]) -> list[int]:
    from headway.scheduler.resources import parse_cpu, parse_memory

    alloc = (node.get("status") or {}).get("allocatable") or {}
    return [
        _quantity(alloc.get("cpu"), parse_cpu),
        _quantity(alloc.get("memory"), parse_memory),
        _quantity(alloc.get("nvidia.com/gpu"), parse_memory),
    ]


def _created_order(kube: FakeKube, pod: dict[str, Any]) -> int:
    """The resourceVersion the pod was created at (its place in the scheduling queue)."""
    meta = pod.get("metadata") or {}
    key = (meta.get("namespace"), meta.get("name"))
    return next(
        (
            rv
            for rv, plural, kind, obj in kube.log
            if plural == "pods"
            and kind == "ADDED"
            and ((obj.get("metadata") or {}).get("namespace"), obj["metadata"].get("name")) == key
        ),
        0,
    )


def _expression_matches(expr: dict[str, Any], value: str | None) -> bool:
    op, values = expr.get("operator"), expr.get("values") or []
    if op == "In":
        return value in values
    if op == "NotIn":
        return value not in values
    if op == "Exists":
        return value is not None
    if op == "DoesNotExist":
        return value is None
    raise ValueError(f"fake kube: operator {op!r} is not simulated")


def _feasible(pod: dict[str, Any], node: dict[str, Any]) -> bool:
    """Whether the pod may go to the node, resources aside (the filters of a real
    scheduler that Headway's pods meet: readiness, cordon, taints, selector, affinity)."""
    spec = pod.get("spec") or {}
    meta = node.get("metadata") or {}
    labels = meta.get("labels") or {}
    if (node.get("spec") or {}).get("unschedulable"):
        return False
    conditions = (node.get("status") or {}).get("conditions") or []
    if not any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions):
        return False
    for key, value in (spec.get("nodeSelector") or {}).items():
        if labels.get(key) != value:
            return False
    for taint in (node.get("spec") or {}).get("taints") or []:
        if taint.get("effect") not in ("NoSchedule", "NoExecute"):
            continue
        if not any(_tolerates(t, taint) for t in spec.get("tolerations") or []):
            return False
    required = ((spec.get("affinity") or {}).get("nodeAffinity") or {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution"
    ) or {}
    terms = required.get("nodeSelectorTerms") or []
    if terms:
        fields = {"metadata.name": meta.get("name")}
        # The terms are ORed; the requirements of one term ANDed.
        return any(
            all(
                _expression_matches(e, labels.get(e["key"]))
                for e in t.get("matchExpressions") or []
            )
            and all(
                _expression_matches(e, fields.get(e["key"])) for e in t.get("matchFields") or []
            )
            for t in terms
        )
    return True


def _tolerates(toleration: dict[str, Any], taint: dict[str, Any]) -> bool:
    if toleration.get("effect") and toleration["effect"] != taint.get("effect"):
        return False
    if not toleration.get("key"):
        return toleration.get("operator") == "Exists"
    if toleration["key"] != taint.get("key"):
        return False
    if toleration.get("operator", "Equal") == "Exists":
        return True
    return bool(toleration.get("value", "") == taint.get("value", ""))


@attrs.define(kw_only=True)
class FakeKube(kmock.KubernetesEmulator):
    """A kmock emulator that behaves enough like kube-apiserver for informers."""

    rv: int = 0
    compacted: int = 0
    log: list[tuple[int, str, str, dict[str, Any]]] = attrs.field(factory=list)
    forbidden: set[str] = attrs.field(factory=set)
    generation: int = 0
    changed: asyncio.Condition = attrs.field(factory=asyncio.Condition)
    watches_served: int = 0
    #: plural -> how many of the next DELETEs of that resource fail with a 500.
    failing_deletes: dict[str, int] = attrs.field(factory=dict)
    #: Every write request, as a line (time, verb, resource, namespace/name, outcome),
    #: for a test to keep beside its findings: who deleted what, and when.
    writes: list[str] = attrs.field(factory=list)
    #: Every DELETE: (plural, namespace/name, its gracePeriodSeconds or None).
    deletes: list[tuple[str, str, str | None]] = attrs.field(factory=list)
    #: Pod -> the node :meth:`bind_pending` bound it to.
    bindings: dict[str, str] = attrs.field(factory=dict)
    #: Every pod :meth:`bind_pending` found no node for (once per pass).
    unschedulable: list[str] = attrs.field(factory=list)

    # --- test controls --------------------------------------------------------------

    def drop_watches(self) -> None:
        """End every open watch stream (clients reconnect from their resourceVersion)."""
        self.generation += 1
        self._notify()

    def compact(self) -> None:
        """Forget history: a watch from an older resourceVersion gets 410 Gone."""
        self.compacted = self.rv

    def modify(self, plural: str, namespace: str | None, name: str, patch: dict[str, Any]) -> None:
        """Change an object server-side, in this very tick (as a kubelet would)."""
        obj = self._find(plural, namespace, name)
        obj.patch(patch)
        self._record(plural, "MODIFIED", obj.raw)

    def cordon(self, node: str, cordoned: bool = True) -> None:
        """``kubectl cordon`` (``cordoned=False``: uncordon)."""
        self.modify("nodes", None, node, {"spec": {"unschedulable": cordoned}})

    def taint(self, node: str, taints: list[dict[str, str]]) -> None:
        """Set the node's taints (``[]`` removes them all), e.g.
        ``[{"key": "nvidia.com/gpu", "effect": "NoSchedule"}]``."""
        self.modify("nodes", None, node, {"spec": {"taints": taints}})

    def set_ready(self, node: str, ready: bool) -> None:
        """The node's Ready condition, as its kubelet (or the node controller) sets it."""
        status = "True" if ready else "False"
        self.modify(
            "nodes", None, node, {"status": {"conditions": [{"type": "Ready", "status": status}]}}
        )

    async def lose_node(self, name: str) -> list[str]:
        """Lose a node with its pods, as the pod GC does on a real cluster: each pod bound
        to it is marked ``DisruptionTarget``/``DeletionByPodGC`` and deleted, then the
        node object is deleted. Returns the names of the pods that went."""
        gone: list[str] = []
        for pod in self.live("pods"):
            meta = pod.get("metadata") or {}
            if (pod.get("spec") or {}).get("nodeName") != name:
                continue
            url = f"/api/v1/namespaces/{meta.get('namespace')}/pods/{meta.get('name')}"
            conditions = [
                c
                for c in (pod.get("status") or {}).get("conditions") or []
                if c.get("type") != "DisruptionTarget"
            ]
            conditions.append(
                {
                    "type": "DisruptionTarget",
                    "status": "True",
                    "reason": "DeletionByPodGC",
                    "message": f"PodGC: node {name} no longer exists",
                }
            )
            async with self.patch(
                url, json={"status": {"phase": "Failed", "conditions": conditions}}
            ) as resp:
                assert resp.status == 200, await resp.text()
            async with self.delete(url) as resp:
                assert resp.status == 200, await resp.text()
            gone.append(str(meta.get("name")))
        async with self.delete(f"/api/v1/nodes/{name}") as resp:
            assert resp.status == 200, await resp.text()
        return gone

    # --- the in-cluster scheduler and kubelet, simulated ------------------------------

    def bind_pending(self, *, run: bool = True) -> list[tuple[str, str | None]]:
        """One pass of a kube-scheduler: every pending pod that no scheduling gate holds,
        oldest first, is bound to a feasible node (Ready, not cordoned, its taints
        tolerated, its nodeSelector and required node affinity met, room for its
        requests), scoring like the default ``LeastAllocated`` (the emptiest node wins,
        so unconstrained pods spread). A pod that fits nowhere gets ``PodScheduled``
        False/Unschedulable with a real scheduler's message. ``run``: the kubelet starts
        what was bound (phase Running). Returns (pod, node or None) per pod looked at."""
        nodes = {(n.get("metadata") or {}).get("name", ""): n for n in self.live("nodes")}
        used: dict[str, list[int]] = {name: [0, 0, 0] for name in nodes}
        pods = self.live("pods")
        for pod in pods:
            node = (pod.get("spec") or {}).get("nodeName")
            phase = (pod.get("status") or {}).get("phase")
            if node in used and phase not in ("Succeeded", "Failed"):
                used[node] = [a + b for a, b in zip(used[node], _requests(pod), strict=True)]
        out: list[tuple[str, str | None]] = []
        pending = [
            p
            for p in pods
            if not (p.get("spec") or {}).get("nodeName")
            and not (p.get("spec") or {}).get("schedulingGates")
            and not (p.get("metadata") or {}).get("deletionTimestamp")
        ]
        for pod in sorted(pending, key=lambda p: _created_order(self, p)):
            meta = pod.get("metadata") or {}
            want = _requests(pod)
            best: tuple[float, str] | None = None
            for name, node in sorted(nodes.items()):
                alloc = _allocatable(node)
                free = [a - u for a, u in zip(alloc, used[name], strict=True)]
                if not _feasible(pod, node) or any(w > f for w, f in zip(want, free, strict=True)):
                    continue
                # LeastAllocated: the share left free after placing, averaged.
                score = sum((f - w) / a for w, f, a in zip(want, free, alloc, strict=True) if a)
                if best is None or score > best[0]:
                    best = (score, name)
            ns, pod_name = meta.get("namespace"), meta.get("name", "")
            if best is None:
                self.modify(
                    "pods",
                    ns,
                    pod_name,
                    {
                        "status": {
                            "phase": "Pending",
                            "conditions": [
                                {
                                    "type": "PodScheduled",
                                    "status": "False",
                                    "reason": "Unschedulable",
                                    "message": f"0/{len(nodes)} nodes are available: no node"
                                    " fits the pod's requests, selector, affinity and taints.",
                                }
                            ],
                        }
                    },
                )
                self.unschedulable.append(pod_name)
                out.append((pod_name, None))
                continue
            node_name = best[1]
            used[node_name] = [a + b for a, b in zip(used[node_name], want, strict=True)]
            conditions = [{"type": "PodScheduled", "status": "True"}]
            self.modify(
                "pods",
                ns,
                pod_name,
                {
                    "spec": {"nodeName": node_name},
                    "status": {"phase": "Running" if run else "Pending", "conditions": conditions},
                },
            )
            self.bindings[pod_name] = node_name
            out.append((pod_name, node_name))
        return out

    async def run_scheduler(self, stop: asyncio.Event, interval: float = 0.05) -> None:
        """:meth:`bind_pending` until ``stop`` is set (a test's background task)."""
        while not stop.is_set():
            self.bind_pending()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), interval)

    async def run_kubelet(self, stop: asyncio.Event, workdir: Path) -> None:
        """kube-scheduler and a kubelet until ``stop``: pending pods are bound
        (:meth:`bind_pending`), and a bound pod whose container runs an SDK task
        (``python -m headway.sdk.run ...``) is run for real, as a local process with the
        container's environment; its termination-message file (a file under ``workdir``
        standing in for ``terminationMessagePath``) becomes the container's message, cut
        at 4096 bytes as a kubelet does, and its exit code the pod's phase. Other pods
        stay Running until the test ends them."""
        started: set[str] = set()
        running: set[asyncio.Task[None]] = set()
        try:
            while not stop.is_set():
                self.bind_pending()
                for pod in self.live("pods"):
                    name = (pod.get("metadata") or {}).get("name", "")
                    (container, *_) = (pod.get("spec") or {}).get("containers") or [{}]
                    command = container.get("command") or []
                    if (
                        name in started
                        or not (pod.get("spec") or {}).get("nodeName")
                        or command[1:3] != ["-m", "headway.sdk.run"]
                    ):
                        continue
                    started.add(name)
                    task = asyncio.create_task(self._run_container(pod, container, workdir))
                    running.add(task)
                    task.add_done_callback(running.discard)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), 0.05)
        finally:
            for task in list(running):
                task.cancel()

    async def _run_container(
        self, pod: dict[str, Any], container: dict[str, Any], workdir: Path
    ) -> None:
        meta = pod["metadata"]
        message_file = workdir / f"{meta['name']}.termination-log"
        env = {e["name"]: e["value"] for e in container.get("env") or [] if "value" in e}
        if container.get("terminationMessagePath"):
            env[_OUTPUT_ENV] = str(message_file)
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            *container["command"][1:],
            *(container.get("args") or []),
            env={**os.environ, **env},
            cwd=workdir,
        )
        code = await proc.wait()
        message = message_file.read_text()[:4096] if message_file.exists() else ""
        terminated = {"exitCode": code, "reason": "Completed" if code == 0 else "Error"}
        if message:
            terminated["message"] = message
        self.modify(
            "pods",
            meta.get("namespace"),
            meta["name"],
            {
                "status": {
                    "phase": "Succeeded" if code == 0 else "Failed",
                    "containerStatuses": [
                        {
                            "name": "main",
                            "image": container.get("image", ""),
                            "imageID": "",
                            "ready": False,
                            "restartCount": 0,
                            "state": {"terminated": terminated},
                        }
                    ],
                }
            },
        )

    def live(self, plural: str) -> list[dict[str, Any]]:
        """Current objects of a resource (raw dicts)."""
        return [
            obj.raw
            for (res, _, _), obj in self._objects.items()
            if res.plural == plural and not obj.deleted
        ]

    # --- internals ------------------------------------------------------------------

    def _notify(self) -> None:
        async def wake() -> None:
            async with self.changed:
                self.changed.notify_all()

        asyncio.get_running_loop().create_task(wake())

    def _record(self, plural: str, kind: str, raw: dict[str, Any]) -> None:
        self.rv += 1
        obj = copy.deepcopy(raw)
        obj.setdefault("metadata", {})["resourceVersion"] = str(self.rv)
        self.log.append((self.rv, plural, kind, obj))
        self._notify()

    def _stamped(self, plural: str, raw: dict[str, Any]) -> dict[str, Any]:
        meta = raw.get("metadata") or {}
        rv = 0
        for r, p, _, o in reversed(self.log):
            om = o.get("metadata") or {}
            if (
                p == plural
                and om.get("name") == meta.get("name")
                and om.get("namespace") == meta.get("namespace")
            ):
                rv = r
                break
        obj = copy.deepcopy(raw)
        obj.setdefault("metadata", {})["resourceVersion"] = str(rv)
        return obj

    def _find(self, plural: str, namespace: str | None, name: str | None) -> Any:
        for (res, ns, n), obj in self._objects.items():
            if res.plural == plural and (ns or None) == (namespace or None) and n == name:
                return obj
        return None

    async def _handle(self, request: rendering.Request) -> Any:
        res = request.resource
        if res is not None and res.plural in self.forbidden:
            raise kmock.KubernetesError(
                status=403, reason="Forbidden", message=f"{res.plural} is forbidden"
            )
        if (
            res is not None
            and request.action == enums.action.DELETE
            and self.failing_deletes.get(res.plural or "", 0) > 0
        ):
            self.failing_deletes[res.plural or ""] -= 1
            raise kmock.KubernetesError(
                status=500, reason="InternalError", message="etcdserver: request timed out"
            )
        kind = _WRITE.get(request.action) if res is not None and request.action else None
        name = request.name
        namespace = request.namespace
        if kind == "ADDED" and isinstance(request.data, dict):
            meta = request.data.setdefault("metadata", {})
            # kmock keeps only what the body says; the real server fills in the URL's
            # namespace, and informers filter on it.
            if request.namespace and not meta.get("namespace"):
                meta["namespace"] = request.namespace
            meta.setdefault("uid", f"uid-{meta.get('name')}-{self.rv}")
            meta.setdefault("creationTimestamp", time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
            name = meta.get("name")
            namespace = meta.get("namespace")
        if res is not None and request.action == enums.action.DELETE:
            grace = request.params.get("gracePeriodSeconds")
            self.deletes.append((res.plural or "", f"{namespace}/{name}", grace))
        response = await super()._handle(request)
        if kind is not None and res is not None:
            peer = request.headers.get("User-Agent", "")
            self.writes.append(
                f"{time.time():.3f} {kind} {res.plural} {namespace}/{name}"
                f" -> {response.status} {peer}".rstrip()
            )
        if kind is not None and res is not None and response.status < 300:
            obj = self._find(res.plural or "", namespace, name)
            if obj is not None:
                # What watchers see is what happened to the object, not what was asked:
                # a DELETE of an object with finalizers only marks it (MODIFIED), and
                # the PATCH that lifts its last finalizer removes it (DELETED).
                raw = obj.last.raw if obj.deleted else obj.raw
                self._record(
                    res.plural or "",
                    "DELETED" if obj.deleted else "MODIFIED" if kind == "DELETED" else kind,
                    raw,
                )
        return response

    def _visible(self, request: rendering.Request, obj: dict[str, Any]) -> bool:
        meta = obj.get("metadata") or {}
        if request.namespace is not None and meta.get("namespace") != request.namespace:
            return False
        labels = meta.get("labels") or {}
        if not _selector_matches(labels, request.params.get("labelSelector", "")):
            return False
        return _fields_match(obj, request.params.get("fieldSelector", ""))

    async def _serve_list(self, request: rendering.Request) -> rendering.Payload:
        assert request.resource is not None
        plural = request.resource.plural or ""
        items = [self._stamped(plural, o) for o in self.live(plural) if self._visible(request, o)]
        return {
            "apiVersion": "v1",
            "kind": "List",
            "metadata": {"resourceVersion": str(self.rv)},
            "items": items,
        }

    async def _serve_watch(self, request: rendering.Request) -> AsyncIterator[rendering.Payload]:
        assert request.resource is not None
        plural = request.resource.plural or ""
        self.watches_served += 1
        # A blank line, not b"": aiohttp holds the headers back until the first body
        # bytes, and a client still waiting for them cannot be interrupted the way a
        # real API server's watch (headers at once) can. Watch readers skip blank lines.
        yield b"\n"
        since = int(request.params.get("resourceVersion") or self.rv)
        if since < self.compacted:
            yield {
                "type": "ERROR",
                "object": {
                    "apiVersion": "v1",
                    "kind": "Status",
                    "status": "Failure",
                    "code": 410,
                    "reason": "Expired",
                    "message": f"too old resource version: {since} ({self.compacted})",
                },
            }
            return
        timeout = float(request.params.get("timeoutSeconds") or 3600)
        deadline = asyncio.get_running_loop().time() + timeout
        generation = self.generation
        pos = since

        def key(obj: dict[str, Any]) -> tuple[str, str]:
            meta = obj.get("metadata") or {}
            return (str(meta.get("namespace") or ""), str(meta.get("name") or ""))

        # What this watcher sees now: an object that stops matching its selectors is
        # DELETED for it, as kube-apiserver does (a pod turning Succeeded leaves a
        # ``status.phase!=Succeeded`` watch).
        shown = {key(o) for o in self.live(plural) if self._visible(request, o)}
        raw = request._raw_request
        while True:
            if self.generation != generation:
                return
            if raw is not None and (raw.transport is None or raw.transport.is_closing()):
                return  # the client went away
            for rv, p, kind, obj in self.log:
                if self.generation != generation:
                    return
                if rv > pos and p == plural:
                    pos = rv
                    if self._visible(request, obj):
                        if kind == "DELETED":
                            shown.discard(key(obj))
                        else:
                            shown.add(key(obj))
                        yield {"type": kind, "object": obj}
                    elif key(obj) in shown:
                        shown.discard(key(obj))
                        yield {"type": "DELETED", "object": obj}
            pos = max(pos, self.rv)
            left = deadline - asyncio.get_running_loop().time()
            if left <= 0:
                if request.params.get("allowWatchBookmarks") == "true":
                    yield {
                        "type": "BOOKMARK",
                        "object": {
                            "kind": "Pod",
                            "apiVersion": "v1",
                            "metadata": {"resourceVersion": str(self.rv)},
                        },
                    }
                return
            # Bounded waits: a change recorded while we were not yet waiting is seen on
            # the next pass instead of being lost.
            async with self.changed:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.changed.wait(), min(left, 0.2))
