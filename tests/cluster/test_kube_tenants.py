"""Pods of one action id under two tenants, and pods named before names carried the
tenant (issue #22): the Kubernetes backend against the fake API server.

Action ids are a tenant's own. Two tenants' actions of one id in one namespace get pods
and Services of their own, and one's cleanup never touches the other's. A worker
upgraded while an action ran finds that action's pods under the names it used to give
(``hw-<action>-<role>-<index>``) and follows them: never a second copy.
"""

from __future__ import annotations

import asyncio
import dataclasses
import re
from typing import Any

import pytest
from headway.activities.backends.base import pod_name, service_name
from headway.activities.backends.kubernetes import build_pods, build_service
from headway.activities.cluster import ClusterActivities
from headway.protocol import ActionEventKind as K
from headway.protocol import DispatchRequest, GangKind, PodSpec
from kubernetes import client as k8s

from .fake_kube import FakeKube
from .helpers import Recorder, attempt_env, request
from .test_exactly_once import DISPATCH_1, pod_posts, post_pod
from .test_kubernetes import NS, RUNNING, SCHEDULED, backend, patch_pod

_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")


# --- the names ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("tenant", "action", "role", "index"),
    [
        ("acme", "train", "main", 0),
        ("a", "b-c", "main", 0),
        ("a-b", "c", "main", 0),
        ("t" * 63, "x" * 200, "worker", 12),
        ("acme", "Run_42/Step.A", "ray-head", 0),
    ],
    ids=["plain", "dash-in-action", "dash-in-tenant", "longest", "unsanitized-id"],
)
def test_pod_and_service_names_are_dns_labels_carrying_the_tenant(
    tenant: str, action: str, role: str, index: int
) -> None:
    for name in (pod_name(action, role, index, tenant), service_name(action, tenant)):
        assert len(name) <= 63 and _DNS_LABEL.fullmatch(name), name
        assert name.startswith("hw-"), "a Service name must start with a letter"
    if len(tenant) < 20 and action.islower():
        assert pod_name(action, role, index, tenant).startswith(f"hw-{tenant}-{action}-{role}-")


def test_names_differ_by_tenant_and_where_the_tenant_ends() -> None:
    names = {
        pod_name("train", "main", 0, "acme"),
        pod_name("train", "main", 0, "other"),
        # The same text joined: tenant a, action b-c and tenant a-b, action c.
        pod_name("b-c", "main", 0, "a"),
        pod_name("c", "main", 0, "a-b"),
        pod_name("train", "main", 0),  # before tenants were part of names
    }
    assert len(names) == 5, names
    assert service_name("b-c", "a") != service_name("c", "a-b")
    # The names before tenants are what they always were: a worker still adopts them.
    assert pod_name("train", "main", 0) == "hw-train-main-0"
    assert service_name("train") == "hw-train"


def test_a_gang_service_selects_its_own_tenants_pods_only() -> None:
    req = for_tenant(gang("g"), "acme")
    svc = build_service(req, NS)
    assert svc["spec"]["selector"] == {"headway.io/action": "g", "headway.io/tenant": "acme"}
    pods = build_pods(req, NS)
    assert {p["spec"]["subdomain"] for p in pods} == {svc["metadata"]["name"]}
    for p in pods:
        labels = p["metadata"]["labels"]
        assert all(labels.get(k) == v for k, v in svc["spec"]["selector"].items())


# --- two tenants, one action id ----------------------------------------------------------


def for_tenant(req: DispatchRequest, tenant: str) -> DispatchRequest:
    req = dataclasses.replace(req, tenant=tenant, workflow_id=f"wf-{tenant}-{req.action_id}")
    req.namespace = NS
    return req


def gang(action_id: str) -> DispatchRequest:
    return request(
        action_id,
        [PodSpec(role="worker", index=i, cpu_m=500) for i in range(2)],
        kind=GangKind.REPLICAS,
    )


def live_names(kube: FakeKube, plural: str = "pods") -> list[str]:
    return sorted(str(p["metadata"]["name"]) for p in kube.live(plural))


async def test_two_tenants_same_action_id_have_their_own_pods_and_cleanup(
    kube: FakeKube, api_client: k8s.ApiClient
) -> None:
    b = await backend(api_client)
    try:
        a, z = for_tenant(gang("train"), "acme"), for_tenant(gang("train"), "zeta")
        names_a = await b.create_pods(a, dispatch="wf-acme-train/r/1")
        names_z = await b.create_pods(z, dispatch="wf-zeta-train/r/1")
        assert not set(names_a) & set(names_z)
        assert live_names(kube) == sorted(names_a + names_z), "each its own, none adopted"
        assert live_names(kube, "services") == sorted(
            [service_name("train", "acme"), service_name("train", "zeta")]
        )
        found = {(h.tenant, h.action_id) for h in await b.headway_pods()}
        assert found == {("acme", "train"), ("zeta", "train")}

        assert await b.delete_pods("train", NS, tenant="acme") == 2
        async with asyncio.timeout(5):
            while live_names(kube) != sorted(names_z):
                await asyncio.sleep(0.02)
        assert live_names(kube, "services") == [service_name("train", "zeta")]
        assert sorted(await b.live_pods("train", "wf-zeta-train/r/1")) == sorted(names_z)
    finally:
        await b.close()


# --- a worker upgraded while an action ran ------------------------------------------------


async def test_a_retry_on_an_upgraded_worker_adopts_the_gang_its_predecessor_named_without_the_tenant(
    kube: FakeKube, api_client: k8s.ApiClient
) -> None:
    """The old worker created and released the gang under the old names and died; its
    last heartbeat named them. The retry, on a worker that names pods for the tenant,
    creates nothing, follows the old pods to the end and removes them and their
    Service."""
    req = for_tenant(gang("up"), "t1")
    old = build_pods(req, NS, dispatch=DISPATCH_1, legacy=True)
    old_names = [p["metadata"]["name"] for p in old]
    assert old_names == ["hw-up-worker-0", "hw-up-worker-1"]
    async with kube.post(
        f"/api/v1/namespaces/{NS}/services", json=build_service(req, NS, legacy=True)
    ) as resp:
        assert resp.status < 300, await resp.text()
    for body in old:
        del body["spec"]["schedulingGates"]
        await post_pod(kube, body)
        await patch_pod(kube, body["metadata"]["name"], SCHEDULED)
        await patch_pod(kube, body["metadata"]["name"], RUNNING)
    beat = {"dispatch": DISPATCH_1, "created": old_names, "pods": {}}
    b = await backend(api_client)
    try:
        posts = pod_posts(kube)
        rec = Recorder()
        acts = ClusterActivities(b, signaler=rec, heartbeat_s=0.05)
        beats: list[Any] = []
        task = asyncio.create_task(attempt_env(2, [beat], beats=beats).run(acts.run_action, req))
        await rec.wait_for(K.RUNNING)
        assert beats[0]["created"] == old_names, "it follows the pods by their old names"
        for name in old_names:
            await patch_pod(kube, name, {"status": {"phase": "Succeeded"}})
        result = await asyncio.wait_for(task, 10)
        assert result.kind is K.SUCCEEDED, result
        assert pod_posts(kube) == posts, "nothing created under the new names"
        assert live_names(kube) == [] and live_names(kube, "services") == []
    finally:
        await b.close()


async def test_an_upgraded_worker_completes_a_held_gang_under_its_old_names(
    kube: FakeKube, api_client: k8s.ApiClient
) -> None:
    """The old worker created one pod of a gang (held by its gate) and died: the retry
    creates the other under the old scheme too, so the gang finds itself by name."""
    req = for_tenant(gang("half"), "t1")
    first = build_pods(req, NS, dispatch=DISPATCH_1, legacy=True)[0]
    await post_pod(kube, first)
    b = await backend(api_client)
    try:
        acts = ClusterActivities(b, signaler=Recorder(), heartbeat_s=0.05)
        task = asyncio.create_task(attempt_env(2).run(acts.run_action, req))
        async with asyncio.timeout(5):
            while not (
                len(kube.live("pods")) == 2
                and not any(p["spec"].get("schedulingGates") for p in kube.live("pods"))
            ):
                await asyncio.sleep(0.05)
        assert live_names(kube) == ["hw-half-worker-0", "hw-half-worker-1"]
        second = next(p for p in kube.live("pods") if p["metadata"]["name"].endswith("-1"))
        env = {e["name"]: e["value"] for e in second["spec"]["containers"][0]["env"]}
        assert env["MASTER_ADDR"] == f"hw-half-worker-0.hw-half.{NS}.svc"
        for name in live_names(kube):
            await patch_pod(kube, name, {"status": {"phase": "Succeeded"}})
        assert (await asyncio.wait_for(task, 10)).kind is K.SUCCEEDED
    finally:
        await b.close()


async def test_a_first_attempt_adopts_its_old_named_pod_and_replaces_another_dispatchs(
    kube: FakeKube, api_client: k8s.ApiClient
) -> None:
    """Before the upgrade: one action's pod created with no dispatch recorded (adopted,
    by its old name), and another's left by an earlier dispatch (stale: replaced by this
    dispatch's, under the new name, as a pod of the same name would be)."""
    mine, other = for_tenant(request("one"), "t1"), for_tenant(request("two"), "t1")
    await post_pod(kube, build_pods(mine, NS, legacy=True)[0])
    await post_pod(kube, build_pods(other, NS, dispatch="wf/run-0/9", legacy=True)[0])
    b = await backend(api_client)
    try:
        assert await b.create_pods(mine) == ["hw-one-main-0"]
        assert live_names(kube) == ["hw-one-main-0", "hw-two-main-0"], "none created"

        names = await b.create_pods(other, dispatch=DISPATCH_1)
        assert names == [pod_name("two", "main", 0, "t1")]
        assert live_names(kube) == sorted(["hw-one-main-0", *names]), "the stale pod went"
    finally:
        await b.close()
