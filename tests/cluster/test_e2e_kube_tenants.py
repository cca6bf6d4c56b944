"""Two tenants submitting the same action id to one Kubernetes cluster (issue #22), end
to end: the fake API server, a real Temporal dev server, the real control plane and
cluster worker in this process. Pods are named for the tenant, so each tenant's action
has pods of its own in the one namespace.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from headway.activities.backends.base import ACTION_ANNOTATION, TENANT_LABEL, pod_name
from headway.workflows import client as hw
from temporalio.testing import WorkflowEnvironment

from .fake_kube import FakeKube
from .test_e2e_arbiter import (
    NS,
    _is,
    kube_plane,
    state_of,
    submit_request,
    until,
)


def _meta(pod: dict[str, Any]) -> dict[str, Any]:
    return pod.get("metadata") or {}


async def _phase(kube: FakeKube, name: str) -> str | None:
    """The live pod's phase ("Deleting" once marked for deletion); None when gone."""
    for p in kube.live("pods"):
        if _meta(p).get("name") == name:
            if _meta(p).get("deletionTimestamp"):
                return "Deleting"
            return str((p.get("status") or {}).get("phase") or "Pending")
    return None


async def _succeed(kube: FakeKube, name: str) -> None:
    url = f"/api/v1/namespaces/{NS}/pods/{name}"
    async with kube.patch(url, json={"status": {"phase": "Succeeded"}}) as resp:
        assert resp.status == 200, await resp.text()


async def _kubelet(
    kube: FakeKube,
    stop: asyncio.Event,
    finishes: Any,
    seen: dict[tuple[str, str], set[str]],
    after_s: float = 0.5,
) -> None:
    """The kubelet's end of the pods ``finishes(pod)`` picks: Succeeded ``after_s``
    after they run. Records every Headway pod's uid by (tenant, action) in ``seen``."""
    running_since: dict[str, float] = {}
    while not stop.is_set():
        now = time.monotonic()
        for p in kube.live("pods"):
            meta = _meta(p)
            action = (meta.get("annotations") or {}).get(ACTION_ANNOTATION)
            if action is None:
                continue
            tenant = str((meta.get("labels") or {}).get(TENANT_LABEL, ""))
            seen.setdefault((tenant, str(action)), set()).add(str(meta.get("uid")))
            name = str(meta.get("name"))
            running = (p.get("status") or {}).get("phase") == "Running"
            if running and finishes(p) and now - running_since.setdefault(name, now) >= after_s:
                await _succeed(kube, name)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), 0.05)


# --- two tenants, one action id ----------------------------------------------------------


@pytest.mark.asyncio
async def test_two_tenants_submitting_one_action_id_to_one_kubernetes_cluster_run_apart(
    temporal_env: WorkflowEnvironment, kube: FakeKube, tmp_path: Path
) -> None:
    """Tenants A and B both submit ``train-1`` to one cluster worker serving both, pods
    in one namespace. Each gets a pod of its own; A's ends first and its cleanup leaves
    B's pod running; both succeed, each in one attempt."""
    client = temporal_env.client
    first, second = f"sa-{uuid.uuid4().hex[:6]}", f"sb-{uuid.uuid4().hex[:6]}"
    seen: dict[tuple[str, str], set[str]] = {}

    def firsts(pod: dict[str, Any]) -> bool:
        return (_meta(pod).get("labels") or {}).get(TENANT_LABEL) == first

    def extra(stop: asyncio.Event) -> list[Any]:
        # kube-scheduler (binds and runs), and the kubelet finishing A's pods only.
        return [kube.run_scheduler(stop), _kubelet(kube, stop, firsts, seen)]

    plane = kube_plane(
        client, kube, tmp_path, "k8s-same-id", [first, second], extra, refuse_other_tenants=True
    )
    async with plane:
        a = await hw.submit(client, submit_request(first, "train-1", "1"))
        b = await hw.submit(client, submit_request(second, "train-1", "1"))
        mine, theirs = pod_name("train-1", "main", 0, first), pod_name("train-1", "main", 0, second)
        await until(lambda: _is(_phase(kube, theirs), "Running"), "B's pod running")
        res_a = await asyncio.wait_for(hw.wait_result(a), 120)
        assert res_a.state == "succeeded", res_a
        await until(lambda: _is(_phase(kube, mine), None), "A's pod cleaned up")
        assert await _phase(kube, theirs) == "Running", "A's cleanup left B's pod alone"
        await _succeed(kube, theirs)
        res_b = await asyncio.wait_for(hw.wait_result(b), 120)
        assert res_b.state == "succeeded", res_b
        for tenant in (first, second):
            st = await state_of(client, tenant, "train-1")
            assert [x.outcome for x in st.attempts] == ["Succeeded"], (tenant, st.attempts)
            assert len(seen[(tenant, "train-1")]) == 1, "one pod each, created once"
        await until(lambda: _is(_phase(kube, theirs), None), "B's pod cleaned up")
        print(f"one id, two tenants: pods {mine} and {theirs}, both succeeded once")
