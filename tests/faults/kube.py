"""The Kubernetes side of the smaller fault run: the project's fake API server
(``tests/cluster/fake_kube.py``, served over HTTP from this process) and a kubelet
played by the test: it binds pods that fit, runs them for their action's duration and
marks them Succeeded; and, on cue, loses a node with its pods as the node lifecycle
controller and the pod GC would.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import copy
import datetime
import random
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from headway.activities.backends.base import ACTION_ANNOTATION
from headway.activities.backends.kubernetes import pod_requests
from headway.tests.cluster.fake_kube import FakeKube
from kmock._internal import rendering

from .workload import GI, Fault, Planned, PodRes, make_workload

__all__ = ["KUBE_FLEET_YAML", "FaultKube", "Kubelet", "kube_plan", "kubeconfig"]

NAMESPACE = "hw-faults"
CLUSTER = "kube"
NODE = PodRes(32_000, 256 * GI, 8)
NODES = 3

KUBE_FLEET_YAML = f"""\
clusters:
  - name: {CLUSTER}
    node_groups:
      - {{name: k, count: {NODES}, shape: {{cpu: 32, memory: 256Gi, gpu: "H100:8", ephemeral_storage: 1Ti}}}}
queues:
  - name: train
    priority: high
    algorithm: strict
    run_concurrency: 2
    max_resources: {{gpu: "H100:16"}}
  - name: eval
    priority: medium
    algorithm: backfill
    action_concurrency: 4
    max_resources: {{gpu: 6, cpu: 10}}
  - name: batch
    priority: low
    algorithm: easy
    action_concurrency: 6
    run_concurrency: 3
    max_resources: {{cpu: 24, memory: 96Gi}}
"""


class FaultKube(FakeKube):
    """The project's fake API server, with watches that honour selectors as
    kube-apiserver does when an object changes: one that stops matching the watch's
    selector is sent as DELETED, one that starts matching as ADDED.

    The base fake filters each event by the object's new state alone, so a watch on
    ``status.phase!=Succeeded`` (the backend's every-pod informer, for capacity) never
    hears that a pod finished or went: the backend would count finished pods against its
    nodes until the next relist, and report a full cluster that is idle.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # rv -> the object as it was before that event (None: it did not exist).
        self.previous: dict[int, dict[str, Any] | None] = {}
        self._latest: dict[tuple[str, str | None, str | None], dict[str, Any]] = {}

    def _record(self, plural: str, kind: str, raw: dict[str, Any]) -> None:
        meta = raw.get("metadata") or {}
        key = (plural, meta.get("namespace"), meta.get("name"))
        super()._record(plural, kind, raw)
        self.previous[self.rv] = self._latest.get(key)
        if kind == "DELETED":
            self._latest.pop(key, None)
        else:
            self._latest[key] = self.log[-1][3]

    async def _serve_watch(self, request: rendering.Request) -> AsyncIterator[rendering.Payload]:
        assert request.resource is not None
        plural = request.resource.plural or ""
        self.watches_served += 1
        yield b""
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
        loop = asyncio.get_running_loop()
        deadline = loop.time() + float(request.params.get("timeoutSeconds") or 3600)
        generation = self.generation
        pos = since
        raw = request._raw_request
        while True:
            if self.generation != generation:
                return
            if raw is not None and (raw.transport is None or raw.transport.is_closing()):
                return  # the client went away
            start = bisect.bisect_right([e[0] for e in self.log], pos)
            for rv, p, kind, obj in self.log[start:]:
                pos = rv
                if p != plural:
                    continue
                before = self.previous.get(rv)
                was = before is not None and self._visible(request, before)
                now = self._visible(request, obj)
                if kind == "DELETED":
                    if was or now:
                        yield {"type": "DELETED", "object": obj}
                elif now:
                    yield {"type": kind if was or kind == "ADDED" else "ADDED", "object": obj}
                elif was:
                    assert before is not None
                    gone = copy.deepcopy(before)
                    gone.setdefault("metadata", {})["resourceVersion"] = str(rv)
                    yield {"type": "DELETED", "object": gone}
            left = deadline - loop.time()
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
            # A short sleep, not the base's condition: a waiter timed out on that
            # condition can fail to take its lock back and end the stream with an error.
            await asyncio.sleep(min(left, 0.05))


def kubeconfig(path: Path, url: str) -> Path:
    """A kubeconfig for the fake API server (plain HTTP, no credentials)."""
    path.write_text(
        f"""\
apiVersion: v1
kind: Config
clusters:
  - name: fake
    cluster: {{server: "{url.rstrip("/")}"}}
users:
  - name: nobody
    user: {{}}
contexts:
  - name: fake
    context: {{cluster: fake, user: nobody, namespace: {NAMESPACE}}}
current-context: fake
"""
    )
    return path


def kube_plan(
    rng: random.Random, clusters: list[str], *, actions: int = 60
) -> tuple[list[Planned], list[Fault]]:
    """A smaller workload and four faults: the control plane during submission, the
    server, the cluster worker alone, and the cluster worker while a node and its pods
    go (``lose-node``: see :meth:`Kubelet.lose_node`)."""
    planned = make_workload(rng, actions, prefix="k")
    target = f"cluster-{clusters[0]}"
    times = sorted(rng.uniform(0, 6) + base for base in (3, 12, 22, 32))
    kinds = [("control-plane", "control-plane"), ("server", "temporal-server")]
    kinds += [("cluster", target), ("lose-node", target)]
    rest = kinds[1:]
    rng.shuffle(rest)
    kinds = kinds[:1] + rest  # the control plane first: during submission
    faults = [
        Fault(round(at, 2), kind, name, round(rng.uniform(1.0, 3.0), 2), at < 12)
        for at, (kind, name) in zip(times, kinds, strict=True)
    ]
    return planned, faults


def _killed() -> dict[str, Any]:
    """The status a kubelet gives a pod whose containers it killed for its deletion."""
    now = datetime.datetime.now(tz=datetime.UTC).isoformat()
    return {
        "status": {
            "phase": "Failed",
            "containerStatuses": [
                {
                    "name": "main",
                    "image": "busybox",
                    "imageID": "docker.io/library/busybox@sha256:0",
                    "ready": False,
                    "restartCount": 0,
                    "started": False,
                    "state": {
                        "terminated": {"reason": "Error", "exitCode": 137, "finishedAt": now}
                    },
                }
            ],
        }
    }


@dataclass
class _PodState:
    seen: int  # first-seen order: pending pods bind oldest first
    bound_at: float | None = None
    running_at: float | None = None


@dataclass
class Kubelet:
    """Plays the kube-scheduler and the kubelets of the fake cluster."""

    kube: FakeKube
    durations: dict[str, float]  # action id -> how long its pods run
    startup_s: float = 0.2
    nodes: set[str] = field(default_factory=set)
    #: Actions whose running pods were lost with a node.
    victims: dict[str, str] = field(default_factory=dict)  # action -> node
    errors: list[str] = field(default_factory=list)
    log: list[str] = field(default_factory=list)  # nodes lost and added, with times
    _state: dict[str, _PodState] = field(default_factory=dict)

    async def add_node(self, name: str) -> None:
        node = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": name, "labels": {"nvidia.com/gpu.product": "H100"}},
            "status": {
                "allocatable": {
                    "cpu": str(NODE.cpu_m // 1000),
                    "memory": f"{NODE.mem // GI}Gi",
                    "ephemeral-storage": "1Ti",
                    "pods": "110",
                    "nvidia.com/gpu": str(NODE.gpu),
                },
                "conditions": [{"type": "Ready", "status": "True"}],
            },
        }
        async with self.kube.post("/api/v1/nodes", json=node) as resp:
            assert resp.status < 300, await resp.text()
        self.nodes.add(name)
        self.log.append(f"{time.time():.3f} node {name} added")

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            try:
                self.tick(time.time())
            except Exception as exc:
                # The fake cluster's own failure, not Headway's: kept for the test to
                # fail on, and the kubelet goes on (a real one would).
                self.errors.append(f"{type(exc).__name__}: {exc}")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 0.05)

    def tick(self, now: float) -> None:
        pods = [p for p in self.kube.live("pods") if _ns(p) == NAMESPACE]
        used: dict[str, list[int]] = {n: [0, 0, 0] for n in self.nodes}
        for p in pods:
            node = (p.get("spec") or {}).get("nodeName")
            if node in used and _phase(p) not in ("Succeeded", "Failed"):
                cpu, mem, _eph, gpu = pod_requests(p)
                for i, v in enumerate((cpu, mem, gpu)):
                    used[node][i] += v
        for p in pods:
            uid = str(p["metadata"].get("uid"))
            if uid not in self._state:
                self._state[uid] = _PodState(len(self._state))
        # Oldest first, as the kube-scheduler's queue would.
        for p in sorted(pods, key=lambda x: self._state[str(x["metadata"].get("uid"))].seen):
            meta = p["metadata"]
            st = self._state[str(meta.get("uid"))]
            node = (p.get("spec") or {}).get("nodeName")
            phase = _phase(p)
            if phase in ("Succeeded", "Failed"):
                continue
            if meta.get("deletionTimestamp"):
                # Deleted (held by a finalizer): the kubelet kills its containers.
                self.kube.modify("pods", NAMESPACE, meta["name"], _killed())
                continue
            if node is None:
                if (p.get("spec") or {}).get("schedulingGates"):
                    continue  # held (a gang not yet whole): the kube-scheduler waits
                cpu, mem, _eph, gpu = pod_requests(p)
                fits = [
                    n
                    for n in sorted(self.nodes)
                    if used[n][0] + cpu <= NODE.cpu_m
                    and used[n][1] + mem <= NODE.mem
                    and used[n][2] + gpu <= NODE.gpu
                ]
                if not fits:
                    continue
                n = fits[0]
                for i, v in enumerate((cpu, mem, gpu)):
                    used[n][i] += v
                st.bound_at = now
                self.kube.modify(
                    "pods",
                    NAMESPACE,
                    meta["name"],
                    {
                        "spec": {"nodeName": n},
                        "status": {
                            "phase": "Pending",
                            "conditions": [{"type": "PodScheduled", "status": "True"}],
                        },
                    },
                )
            elif node not in self.nodes:
                continue  # its node is gone; the pod GC deletes it
            elif phase != "Running":
                if now >= (st.bound_at or now) + self.startup_s:
                    st.running_at = now
                    self.kube.modify(
                        "pods", NAMESPACE, meta["name"], {"status": {"phase": "Running"}}
                    )
            else:
                action = (meta.get("annotations") or {}).get(ACTION_ANNOTATION, "")
                if now >= (st.running_at or now) + self.durations.get(action, 1.0):
                    self.kube.modify(
                        "pods",
                        NAMESPACE,
                        meta["name"],
                        {
                            "status": {
                                "phase": "Succeeded",
                                "containerStatuses": [
                                    # Every field a kubelet sets: the client rejects a
                                    # status without the required ones.
                                    {
                                        "name": "main",
                                        "image": "busybox",
                                        "imageID": "docker.io/library/busybox@sha256:0",
                                        "ready": False,
                                        "restartCount": 0,
                                        "started": False,
                                        "state": {
                                            "terminated": {"reason": "Completed", "exitCode": 0}
                                        },
                                    }
                                ],
                            }
                        },
                    )

    def running_somewhere(self) -> bool:
        """Whether a Headway pod runs (or is bound) on a node now."""
        return any(
            _ns(p) == NAMESPACE
            and (p.get("spec") or {}).get("nodeName") in self.nodes
            and _phase(p) not in ("Succeeded", "Failed")
            for p in self.kube.live("pods")
        )

    async def lose_node(self) -> str | None:
        """The node running the most Headway pods goes away with its pods, the way the
        fake cluster loses one (``FakeKube.lose_node``: the pod GC marks them and deletes
        them, then the node goes). Returns its name (None when nothing runs anywhere)."""
        by_node: dict[str, list[dict[str, Any]]] = {}
        for p in self.kube.live("pods"):
            node = (p.get("spec") or {}).get("nodeName")
            if (
                _ns(p) == NAMESPACE
                and node in self.nodes
                and _phase(p) not in ("Succeeded", "Failed")
            ):
                by_node.setdefault(node, []).append(p)
        if not by_node:
            return None
        node = max(sorted(by_node), key=lambda n: len(by_node[n]))
        self.nodes.discard(node)
        for p in by_node[node]:
            annotations = p["metadata"].get("annotations") or {}
            self.victims[annotations.get(ACTION_ANNOTATION, "")] = node
        gone = []
        for p in by_node[node]:
            # As FakeKube.lose_node (the pod GC's marks, then the delete), but a pod
            # deleted meanwhile (a delete in flight from the killed worker) is no error.
            name = p["metadata"]["name"]
            if not any(x["metadata"]["name"] == name for x in self.kube.live("pods")):
                continue
            conditions = [
                c
                for c in (p.get("status") or {}).get("conditions") or []
                if c.get("type") != "DisruptionTarget"
            ]
            conditions.append(
                {
                    "type": "DisruptionTarget",
                    "status": "True",
                    "reason": "DeletionByPodGC",
                    "message": f"PodGC: node {node} no longer exists",
                }
            )
            self.kube.modify(
                "pods", NAMESPACE, name, {"status": {"phase": "Failed", "conditions": conditions}}
            )
            async with self.kube.delete(f"/api/v1/namespaces/{NAMESPACE}/pods/{name}") as r:
                assert r.status in (200, 404), await r.text()
            gone.append(name)
        async with self.kube.delete(f"/api/v1/nodes/{node}") as r:
            assert r.status == 200, await r.text()
        self.log.append(f"{time.time():.3f} node {node} lost with {', '.join(gone)}")
        return node


def _ns(pod: dict[str, Any]) -> str | None:
    ns = (pod.get("metadata") or {}).get("namespace")
    return str(ns) if ns is not None else None


def _phase(pod: dict[str, Any]) -> str:
    return str((pod.get("status") or {}).get("phase") or "")
