"""The cluster worker as final arbiter, and cluster health, end to end (issue #22).

A real Temporal dev server, the real control plane (both workflows, the lease store) and
the real cluster worker, in this process: on the Kubernetes backend against the fake API
server (the test plays the kubelet), and on the simulated backend.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import pytest
from click.testing import CliRunner
from headway.activities.backends.sim import SimBackend
from headway.cli.main import cli
from headway.protocol import DemandRequest, DispatchRequest, NodeCapacity, PodSpec, SubmitRequest
from headway.scheduler import ClusterSpec, NodeGroup, Pod, QueueSpec
from headway.worker.cluster import run_cluster_worker
from headway.worker.control_plane import run_control_plane_worker
from headway.workflows import action as action_mod
from headway.workflows import client as hw
from headway.workflows import shared
from temporalio.client import Client
from temporalio.testing import WorkflowEnvironment

from .fake_kube import FakeKube
from .helpers import kube_control_plane

NS = "hw-arbiter"
GI = 2**30
T = TypeVar("T")


async def until(probe: Callable[[], Awaitable[T | None]], what: str, timeout: float = 60) -> T:
    """``probe()``'s first answer that is not None; fails naming ``what``."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while True:
        try:
            got = await probe()
        except Exception as exc:  # not started yet, a query racing a task
            got, last = None, exc
        if got is not None:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what} (last error: {last})")
        await asyncio.sleep(0.2)


def one_node_fleet(name: str) -> list[ClusterSpec]:
    return [ClusterSpec(name, (NodeGroup("n", 1, Pod(cpu=4000, memory=16 * GI)),))]


def submit_request(tenant: str, action_id: str, cpu: str, **kw: Any) -> SubmitRequest:
    return SubmitRequest(
        action_id=action_id,
        queue="q",
        tenant=tenant,
        demand=DemandRequest(resources={"cpu": cpu, "memory": "1Gi"}),
        estimate_s=30,
        **kw,
    )


async def state_of(client: Client, tenant: str, action_id: str) -> Any:
    return await hw.action_state(client, tenant, action_id)


async def free_cpu(client: Client, tenant: str, cluster: str) -> int | None:
    fleet = await hw.get_fleet(client, tenant)
    view = fleet["capacity"].get(cluster) or {}
    return view.get("free_cpu_m") if view.get("known") else None


# --- Kubernetes ------------------------------------------------------------------------


async def add_node(kube: FakeKube, name: str) -> None:
    body = {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name},
        "status": {
            "allocatable": {"cpu": "4", "memory": "16Gi", "pods": "110"},
            "conditions": [{"type": "Ready", "status": "True"}],
        },
    }
    async with kube.post("/api/v1/nodes", json=body) as resp:
        assert resp.status < 300, await resp.text()


async def add_foreign_pod(kube: FakeKube, name: str, cpu: str) -> None:
    """A pod Headway knows nothing of, already bound to the node."""
    body = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "others"},
        "spec": {
            "nodeName": "n1",
            "containers": [{"name": "c", "image": "x", "resources": {"requests": {"cpu": cpu}}}],
        },
        "status": {"phase": "Running"},
    }
    async with kube.post("/api/v1/namespaces/others/pods", json=body) as resp:
        assert resp.status < 300, await resp.text()


async def headway_pod(kube: FakeKube, action_id: str) -> str | None:
    """A pod of the action, of any attempt (``ACTION`` or ``ACTION~N``)."""
    for p in kube.live("pods"):
        meta = p.get("metadata", {})
        of = str(meta.get("annotations", {}).get("headway.io/action-id", ""))
        if of == action_id or of.startswith(action_id + "~"):
            return str(meta["name"])
    return None


async def play_kubelet(kube: FakeKube, name: str) -> None:
    """Bind, run and finish one pod, as the kubelet would."""
    url = f"/api/v1/namespaces/{NS}/pods/{name}"
    for patch in (
        {"spec": {"nodeName": "n1"}, "status": {"phase": "Pending"}},
        {"status": {"phase": "Running"}},
        {"status": {"phase": "Succeeded"}},
    ):
        async with kube.patch(url, json=patch) as resp:
            assert resp.status == 200, await resp.text()


@contextlib.asynccontextmanager
async def kube_plane(
    client: Client,
    kube: FakeKube,
    tmp_path: Path,
    cluster: str,
    tenants: list[str],
    extra: Callable[[asyncio.Event], list[Awaitable[Any]]] = lambda stop: [],
    **worker_kw: Any,
) -> AsyncIterator[tuple[list[ClusterSpec], asyncio.Event]]:
    """The control plane and a Kubernetes cluster worker (against the fake API server,
    one 4-CPU node ``n1``) for ``tenants``, with each tenant's queue ``q``; ``extra``
    makes more background work to run until the end (e.g. the fake's scheduler)."""
    await add_node(kube, "n1")
    fleet = one_node_fleet(cluster)
    async with kube_control_plane(
        client, kube.url, tmp_path, cluster, NS, fleet, tenants, extra, **worker_kw
    ) as stop:
        for t in tenants:
            await hw.ensure_scheduler(client, t, fleet)
            await hw.upsert_queue(client, t, QueueSpec("q").to_dict())
        for t in tenants:
            await until(
                lambda t=t: _is(free_cpu(client, t, cluster), 4000),  # type: ignore[misc]
                f"{t}: the first capacity report",
            )
        yield fleet, stop


@pytest.mark.asyncio
async def test_kubernetes_hands_back_when_a_foreign_pod_took_the_room_and_respects_taints_and_cordons(
    temporal_env: WorkflowEnvironment, kube: FakeKube, tmp_path: Path
) -> None:
    client = temporal_env.client
    tenant = f"arb-{uuid.uuid4().hex[:8]}"
    cluster = "k8s-arb"
    # Reports lag the cluster by 3 s (the debounce): long enough for the scheduler to
    # admit on a view a foreign pod has just made stale.
    async with kube_plane(client, kube, tmp_path, cluster, [tenant], debounce_s=3.0):
        # 1. A pod Headway does not know takes 3 of the 4 CPUs; the scheduler has not
        # heard yet and admits a 2-CPU action. The worker creates nothing and hands it
        # back; it waits in its queue until the room returns, then runs.
        await add_foreign_pod(kube, "intruder", "3")
        h = await hw.submit(client, submit_request(tenant, "hb-1", "2"))
        st = await until(
            lambda: _when(state_of(client, tenant, "hb-1"), lambda s: len(s.attempts) > 1),
            "the hand-back",
        )
        first = st.attempts[0]
        assert first.outcome == "CapacityChanged", st.attempts
        assert "Insufficient cpu" in first.message, first
        assert await headway_pod(kube, "hb-1") is None  # nothing was created
        why = await until(
            lambda: _when(
                hw.why(client, tenant, "hb-1"), lambda w: w.get("reason") == "NoClusterCapacity"
            ),
            "waiting for room after the hand-back",
        )
        assert "CapacityChanged" in why["handed_back"], why
        # As the user sees it: `headway why` and `headway describe action`.
        said = await headway_cli(client, tenant, "why", "hb-1")
        assert "handed_back: attempt 1 ended CapacityChanged on k8s-arb" in said, said
        assert "reason: NoClusterCapacity" in said, said
        described = await headway_cli(client, tenant, "describe", "action", "hb-1")
        assert "CapacityChanged" in described and "hb-1~2" in described, described
        print(f"$ headway why hb-1\n{said}\n$ headway describe action hb-1\n{described}")
        assert (await state_of(client, tenant, "hb-1")).state == "waiting"
        async with kube.delete("/api/v1/namespaces/others/pods/intruder") as resp:
            assert resp.status == 200
        pod = await until(lambda: headway_pod(kube, "hb-1"), "the pods once room returned")
        await play_kubelet(kube, pod)
        res = await asyncio.wait_for(hw.wait_result(h), 60)
        assert res.state == "succeeded", res
        assert "CapacityChanged" in res.reasons, res
        st = await state_of(client, tenant, "hb-1")
        assert [a.outcome for a in st.attempts] == ["CapacityChanged", "Succeeded"]

        # 2. A taint without a matching toleration, then a cordon: the node is not free,
        # the action waits for room instead of being created as a pending pod.
        marks: list[tuple[str, Callable[[], None], Callable[[], None]]] = [
            (
                "taint",
                lambda: kube.taint("n1", [{"key": "nvidia.com/gpu", "effect": "NoSchedule"}]),
                lambda: kube.taint("n1", []),
            ),
            ("cordon", lambda: kube.cordon("n1"), lambda: kube.cordon("n1", False)),
            ("not-ready", lambda: kube.set_ready("n1", False), lambda: kube.set_ready("n1", True)),
        ]
        for label, mark, undo in marks:
            mark()
            await until(lambda: _is(free_cpu(client, tenant, cluster), 0), f"{label}: no room")
            action = f"{label}-1"
            h = await hw.submit(client, submit_request(tenant, action, "1"))
            await until(
                lambda a=action: _when(  # type: ignore[misc]
                    hw.why(client, tenant, a), lambda w: w.get("reason") == "NoClusterCapacity"
                ),
                f"{label}: waiting for room",
            )
            await asyncio.sleep(1.0)
            assert await headway_pod(kube, action) is None, label
            undo()
            pod = await until(lambda a=action: headway_pod(kube, a), f"{label}: lifted, it runs")  # type: ignore[misc]
            await play_kubelet(kube, pod)
            res = await asyncio.wait_for(hw.wait_result(h), 60)
            assert res.state == "succeeded", (label, res)


async def headway_cli(client: Client, tenant: str, *args: str) -> str:
    """``headway ARGS`` against this test's server, as a user runs it (its own loop)."""
    address = client.service_client.config.target_host
    result = await asyncio.to_thread(
        CliRunner().invoke, cli, ["--address", address, "--tenant", tenant, *args]
    )
    assert result.exit_code == 0, result.output
    return str(result.output)


async def _is(value: Awaitable[T], want: T) -> bool | None:
    return True if await value == want else None


async def _when(value: Awaitable[T], ok: Callable[[T], bool]) -> T | None:
    got = await value
    return got if ok(got) else None


# --- the simulated backend, and cluster health ----------------------------------------


@pytest.mark.asyncio
async def test_sim_a_silenced_worker_makes_its_cluster_down_and_back_and_its_running_action_is_adopted(
    temporal_env: WorkflowEnvironment, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    client = temporal_env.client
    tenant = f"hl-{uuid.uuid4().hex[:8]}"
    cluster = "sim-hl"
    fleet = one_node_fleet(cluster)
    # Silent for 4 s: down. Workers report every second (the resync), so a live one is
    # never taken for silent.
    monkeypatch.setattr(shared.HEALTH, "cluster_silent_s", 4.0)
    state_dir = tmp_path / "sim"
    cp_stop = asyncio.Event()
    control = asyncio.create_task(
        run_control_plane_worker(
            client,
            database_url=f"sqlite:///{tmp_path / 'leases.db'}",
            fleet=fleet,
            stop=cp_stop,
            cluster_silent_s=4.0,
        )
    )

    def start_worker() -> tuple[asyncio.Event, asyncio.Task[None], SimBackend]:
        backend = SimBackend(fleet[0], time_scale=1.0, startup_s=0.1, state_dir=state_dir)
        stop = asyncio.Event()
        task = asyncio.create_task(
            run_cluster_worker(client, cluster, backend, tenants=[tenant], stop=stop, resync_s=1.0)
        )
        return stop, task, backend

    w_stop, worker, backend = start_worker()
    try:
        await hw.ensure_scheduler(client, tenant, fleet)
        await hw.upsert_queue(client, tenant, QueueSpec("q").to_dict())
        await until(lambda: _is(free_cpu(client, tenant, cluster), 4000), "first report")

        # 1. The same arbiter on the simulated backend: a cordon the scheduler has not
        # heard of yet is caught by the worker (reports are the debounce away; the pass
        # is on the last one). Here the cordon reaches the report first: it waits.
        backend.cordon("n-0")
        await until(lambda: _is(free_cpu(client, tenant, cluster), 0), "cordoned: no room")
        c = await hw.submit(client, submit_request(tenant, "cordoned-1", "1", duration_s=0.5))
        await until(
            lambda: _when(
                hw.why(client, tenant, "cordoned-1"),
                lambda w: w.get("reason") == "NoClusterCapacity",
            ),
            "waiting while cordoned",
        )
        assert backend.pods("cordoned-1") == {}
        backend.cordon("n-0", False)
        assert (await asyncio.wait_for(hw.wait_result(c), 60)).state == "succeeded"

        # 2. A long action runs; its worker goes silent; the cluster goes down.
        long = await hw.submit(client, submit_request(tenant, "long-1", "1", duration_s=20))
        await until(
            lambda: _when(state_of(client, tenant, "long-1"), lambda s: s.state == "running"),
            "long-1 running",
        )
        await until(lambda: _when(_pods(backend, "long-1"), bool), "long-1's pod bound")
        w_stop.set()
        await asyncio.wait_for(worker, 30)
        down = await until(
            lambda: _when(hw.get_fleet(client, tenant), lambda f: cluster in f["down"]),
            "the cluster down",
        )
        assert cluster in down["down"]

        # 3. New work waits, and says why: every cluster its queue may use is down.
        w = await hw.submit(client, submit_request(tenant, "waits-1", "1", duration_s=0.5))
        why = await until(
            lambda: _when(
                hw.why(client, tenant, "waits-1"), lambda w: w.get("reason") == "ClusterDown"
            ),
            "ClusterDown in why",
        )
        assert cluster in why["message"] and "silent" in why["message"], why
        print("why waits-1:", why)

        # 4. The worker returns: the cluster is up, the running action is adopted and
        # succeeds (not run twice), and the waiting one runs.
        w_stop, worker, backend = start_worker()
        await until(
            lambda: _when(hw.get_fleet(client, tenant), lambda f: cluster not in f["down"]),
            "the cluster up again",
        )
        res = await asyncio.wait_for(hw.wait_result(long), 90)
        assert res.state == "succeeded", res
        st = await state_of(client, tenant, "long-1")
        assert [a.outcome for a in st.attempts] == ["Succeeded"], st.attempts  # adopted
        assert (await asyncio.wait_for(hw.wait_result(w), 60)).state == "succeeded"

        # 5. An admission to a cluster whose worker has just gone (not yet down): no
        # worker takes the dispatch, so it is handed back after the silence interval
        # and waits for the cluster to return.
        w_stop.set()
        await asyncio.wait_for(worker, 30)
        d = await hw.submit(client, submit_request(tenant, "dead-1", "1", duration_s=0.5))
        st = await until(
            lambda: _when(state_of(client, tenant, "dead-1"), lambda s: len(s.attempts) > 1),
            "the dispatch nobody took handed back",
        )
        assert st.attempts[0].outcome == "CapacityChanged", st.attempts
        assert "no worker of cluster" in st.attempts[0].message, st.attempts
        w_stop, worker, backend = start_worker()
        assert (await asyncio.wait_for(hw.wait_result(d), 60)).state == "succeeded"
    finally:
        w_stop.set()
        cp_stop.set()
        await asyncio.wait_for(asyncio.gather(worker, control, return_exceptions=True), 60)


async def test_a_cluster_no_worker_ever_reported_goes_down_once_its_work_waited_and_the_work_moves(
    temporal_env: WorkflowEnvironment, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A declared cluster without a report is unknown, and open: work is sent there. With
    no worker to take it, the dispatch is handed back after the silence interval, and
    the cluster goes down (not chosen again) until a worker reports; the action then
    runs where its queue's selector, changed live, now lets it."""
    client = temporal_env.client
    tenant = f"uh-{uuid.uuid4().hex[:8]}"
    fleet = [*one_node_fleet("ghost"), *one_node_fleet("real")]
    monkeypatch.setattr(shared.HEALTH, "cluster_silent_s", 3.0)
    cp_stop, w_stop = asyncio.Event(), asyncio.Event()
    control = asyncio.create_task(
        run_control_plane_worker(
            client,
            database_url=f"sqlite:///{tmp_path / 'leases.db'}",
            fleet=fleet,
            stop=cp_stop,
            cluster_silent_s=3.0,
        )
    )
    backend = SimBackend(fleet[1], time_scale=1.0, startup_s=0.1, state_dir=tmp_path / "sim")
    worker = asyncio.create_task(
        run_cluster_worker(client, "real", backend, tenants=[tenant], stop=w_stop, resync_s=1.0)
    )
    try:
        await hw.ensure_scheduler(client, tenant, fleet)
        await hw.upsert_queue(client, tenant, QueueSpec("q", clusters=("ghost",)).to_dict())
        await until(lambda: _is(free_cpu(client, tenant, "real"), 4000), "real's first report")
        h = await hw.submit(client, submit_request(tenant, "lost-1", "1", duration_s=0.5))
        st = await until(
            lambda: _when(state_of(client, tenant, "lost-1"), lambda s: len(s.attempts) > 1),
            "the dispatch nobody took handed back",
        )
        assert st.attempts[0].cluster == "ghost", st.attempts
        assert "no worker of cluster" in st.attempts[0].message, st.attempts
        fleet_now = await hw.get_fleet(client, tenant)
        assert "ghost" in fleet_now["down"] and "real" not in fleet_now["down"], fleet_now
        why = await until(
            lambda: _when(
                hw.why(client, tenant, "lost-1"), lambda w: w.get("reason") == "ClusterDown"
            ),
            "ClusterDown in why",
        )
        assert "ghost (no worker of it has reported)" in why["message"], why
        # Still waiting a while later: not sent to the down cluster again.
        await asyncio.sleep(4)
        st = await state_of(client, tenant, "lost-1")
        assert st.state == "waiting" and len(st.attempts) == 2, st.attempts
        await hw.upsert_queue(client, tenant, QueueSpec("q", clusters=("ghost", "real")).to_dict())
        res = await asyncio.wait_for(hw.wait_result(h), 60)
        assert res.state == "succeeded", res
        st = await state_of(client, tenant, "lost-1")
        assert [a.cluster for a in st.attempts] == ["ghost", "real"], st.attempts
    finally:
        w_stop.set()
        cp_stop.set()
        await asyncio.wait_for(asyncio.gather(worker, control, return_exceptions=True), 60)


async def _pods(backend: SimBackend, action_id: str) -> dict[str, str | None]:
    return {k: v for k, v in backend.pods(action_id).items() if v}


@pytest.mark.asyncio
async def test_sim_hands_back_an_admission_a_cordon_made_stale(
    temporal_env: WorkflowEnvironment, tmp_path: Path
) -> None:
    client = temporal_env.client
    tenant = f"sh-{uuid.uuid4().hex[:8]}"
    cluster = "sim-hb"
    fleet = one_node_fleet(cluster)
    backend = SimBackend(fleet[0], time_scale=1.0, startup_s=0.1)
    stop = asyncio.Event()
    tasks = [
        asyncio.create_task(
            run_control_plane_worker(
                client, database_url=f"sqlite:///{tmp_path / 'leases.db'}", fleet=fleet, stop=stop
            )
        ),
        asyncio.create_task(
            run_cluster_worker(
                client, cluster, backend, tenants=[tenant], stop=stop, debounce_s=3.0
            )
        ),
    ]
    try:
        await hw.ensure_scheduler(client, tenant, fleet)
        await hw.upsert_queue(client, tenant, QueueSpec("q").to_dict())
        await until(lambda: _is(free_cpu(client, tenant, cluster), 4000), "first report")
        backend.cordon("n-0")  # heard 3 s from now; the admission comes first
        h = await hw.submit(client, submit_request(tenant, "sim-hb-1", "1", duration_s=0.5))
        st = await until(
            lambda: _when(state_of(client, tenant, "sim-hb-1"), lambda s: len(s.attempts) > 1),
            "the hand-back",
        )
        assert st.attempts[0].outcome == "CapacityChanged", st.attempts
        assert "node(s) were unschedulable" in st.attempts[0].message
        assert backend.created_count == 0
        backend.cordon("n-0", False)
        res = await asyncio.wait_for(hw.wait_result(h), 60)
        assert res.state == "succeeded", res
    finally:
        stop.set()
        await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 60)


class FickleSim(SimBackend):
    """A cluster whose room keeps going before the pods get there: it reports room,
    and its arbiter never finds any (the worst case the hand-back bound is for)."""

    async def live_view(
        self, req: DispatchRequest
    ) -> tuple[list[NodeCapacity], list[PodSpec]] | None:
        view = await super().live_view(req)
        assert view is not None
        nodes, pending = view
        return [dataclasses.replace(n, free_cpu_m=0) for n in nodes], pending


@pytest.mark.asyncio
async def test_hand_backs_are_bounded(
    temporal_env: WorkflowEnvironment, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    client = temporal_env.client
    tenant = f"bd-{uuid.uuid4().hex[:8]}"
    fleet = [
        *one_node_fleet("sim-fickle"),
        # Capacity unknown (its worker cannot see nodes): the scheduler treats it as
        # open; its fleet entry declares 8-CPU nodes.
        ClusterSpec(
            "sim-blind",
            (NodeGroup("n", 1, Pod(cpu=8000, memory=16 * GI)),),
            reports_capacity=False,
        ),
    ]
    monkeypatch.setattr(action_mod, "MAX_HANDBACKS", 2)
    fickle = FickleSim(fleet[0], startup_s=0.05)
    blind = SimBackend(fleet[1], startup_s=0.05)
    stop = asyncio.Event()
    tasks = [
        asyncio.create_task(
            run_control_plane_worker(
                client, database_url=f"sqlite:///{tmp_path / 'leases.db'}", fleet=fleet, stop=stop
            )
        ),
        asyncio.create_task(
            run_cluster_worker(client, "sim-fickle", fickle, tenants=[tenant], stop=stop)
        ),
        asyncio.create_task(
            run_cluster_worker(
                client,
                "sim-blind",
                blind,
                tenants=[tenant],
                stop=stop,
                shapes=[g.shape for g in fleet[1].node_groups],
            )
        ),
    ]
    try:
        await hw.ensure_scheduler(client, tenant, fleet)
        await hw.upsert_queue(client, tenant, QueueSpec("q", clusters=("sim-fickle",)).to_dict())
        await hw.upsert_queue(client, tenant, QueueSpec("blind", clusters=("sim-blind",)).to_dict())
        await until(lambda: _is(free_cpu(client, tenant, "sim-fickle"), 4000), "first report")

        # Room that keeps going: two hand-backs, then the third ends it.
        h = await hw.submit(client, submit_request(tenant, "fickle-1", "1", duration_s=0.5))
        res = await asyncio.wait_for(hw.wait_result(h), 90)
        assert (res.state, res.reason) == ("failed", "CapacityChanged"), res
        assert "handed back 2 times before, the limit" in res.message, res
        st = await state_of(client, tenant, "fickle-1")
        assert [a.outcome for a in st.attempts] == ["CapacityChanged"] * 3, st.attempts
        assert fickle.created_count == 0

        # Unknown capacity and a pod larger than every declared node shape: the same
        # cluster would be chosen again, so it is not handed back; it ends, saying why.
        big = dataclasses.replace(
            submit_request(tenant, "huge-1", "100", duration_s=0.5), queue="blind"
        )
        res = await asyncio.wait_for(hw.wait_result(await hw.submit(client, big)), 60)
        assert (res.state, res.reason) == ("failed", "Unschedulable"), res
        assert "larger than every node shape" in res.message, res
        assert blind.created_count == 0
    finally:
        stop.set()
        await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 60)


class WedgedSim(SimBackend):
    """Creates the pods, then its worker wedges: no event, no heartbeat ever follows."""

    async def create_pods(
        self, req: DispatchRequest, *, dispatch: str = "", adopt_only: bool = False
    ) -> list[str]:
        names = await super().create_pods(req, dispatch=dispatch, adopt_only=adopt_only)
        if req.action_id == "wedged-1":
            await asyncio.Event().wait()
        return names


@pytest.mark.asyncio
async def test_a_dispatch_whose_worker_wedged_after_creating_is_deleted_then_handed_back(
    temporal_env: WorkflowEnvironment, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    client = temporal_env.client
    tenant = f"wd-{uuid.uuid4().hex[:8]}"
    fleet = one_node_fleet("sim-wedged")
    monkeypatch.setattr(shared.HEALTH, "cluster_silent_s", 4.0)
    backend = WedgedSim(fleet[0], startup_s=0.05)
    stop = asyncio.Event()
    tasks = [
        asyncio.create_task(
            run_control_plane_worker(
                client,
                database_url=f"sqlite:///{tmp_path / 'leases.db'}",
                fleet=fleet,
                stop=stop,
                cluster_silent_s=4.0,
            )
        ),
        asyncio.create_task(
            run_cluster_worker(
                client, "sim-wedged", backend, tenants=[tenant], stop=stop, resync_s=1.0
            )
        ),
    ]
    try:
        await hw.ensure_scheduler(client, tenant, fleet)
        await hw.upsert_queue(client, tenant, QueueSpec("q").to_dict())
        await until(lambda: _is(free_cpu(client, tenant, "sim-wedged"), 4000), "first report")
        h = await hw.submit(client, submit_request(tenant, "wedged-1", "1", duration_s=600))
        await until(lambda: _when(_pods(backend, "wedged-1"), bool), "its pod created")
        # Nothing reaches the workflow: 4 s later it cancels; the wedged attempt never
        # answers, so its heartbeat timeout (30 s) ends it; its pods are deleted (the
        # worker's delete activity), and only then is the admission handed back.
        st = await until(
            lambda: _when(state_of(client, tenant, "wedged-1"), lambda s: len(s.attempts) > 1),
            "the hand-back",
            timeout=90,
        )
        assert st.attempts[0].outcome == "CapacityChanged", st.attempts
        assert backend.pods("wedged-1") == {}, "the first attempt's pods are gone"
        await hw.cancel(client, tenant, "wedged-1")
        assert (await asyncio.wait_for(hw.wait_result(h), 60)).state == "cancelled"
    finally:
        stop.set()
        await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 60)


# --- two tenants on one Kubernetes cluster ---------------------------------------------


def _bound_cpu_by_node(kube: FakeKube) -> dict[str, int]:
    """CPU (millicores) the pods bound to each node request, every pod counted (any
    tenant's, any namespace's), finished ones not."""
    from .fake_kube import _requests

    used: dict[str, int] = {}
    for p in kube.live("pods"):
        node = (p.get("spec") or {}).get("nodeName")
        if node and (p.get("status") or {}).get("phase") not in ("Succeeded", "Failed"):
            used[node] = used.get(node, 0) + _requests(p)[0]
    return used


def _unschedulable(kube: FakeKube) -> list[str]:
    """Pods the in-cluster scheduler found no room for (a pending pod for capacity)."""
    out = []
    for p in kube.live("pods"):
        for cond in (p.get("status") or {}).get("conditions") or []:
            if cond.get("type") == "PodScheduled" and cond.get("reason") == "Unschedulable":
                out.append(str((p.get("metadata") or {}).get("name")))
    return out


async def _finish_running_pods(kube: FakeKube, stop: asyncio.Event, after_s: float) -> None:
    """The kubelet's end of each pod: a pod Running for ``after_s`` succeeds."""
    seen: dict[str, float] = {}
    while not stop.is_set():
        now = time.monotonic()
        for p in kube.live("pods"):
            meta = p.get("metadata") or {}
            name, ns = str(meta.get("name")), str(meta.get("namespace"))
            if (p.get("status") or {}).get("phase") != "Running" or ns != NS:
                continue
            if now - seen.setdefault(name, now) >= after_s:
                async with kube.patch(
                    f"/api/v1/namespaces/{ns}/pods/{name}", json={"status": {"phase": "Succeeded"}}
                ) as resp:
                    assert resp.status == 200, await resp.text()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), 0.1)


@pytest.mark.asyncio
async def test_two_tenants_sharing_a_kubernetes_cluster_never_overcommit_a_node(
    temporal_env: WorkflowEnvironment, kube: FakeKube, tmp_path: Path
) -> None:
    """One 4-CPU node, one cluster worker serving two tenants (each its own scheduler),
    six 2-CPU actions per tenant submitted at once, the fake API server playing
    kube-scheduler and kubelet: every node's bound requests are audited every 50 ms and
    never exceed what it has, no pod is ever left Unschedulable, and every action ends
    succeeded, each once."""
    client = temporal_env.client
    tenants = [f"ta-{uuid.uuid4().hex[:6]}", f"tb-{uuid.uuid4().hex[:6]}"]
    peak: dict[str, int] = {}
    unschedulable: set[str] = set()

    async def audit(stop: asyncio.Event) -> None:
        while not stop.is_set():
            for node, cpu in _bound_cpu_by_node(kube).items():
                peak[node] = max(peak.get(node, 0), cpu)
            unschedulable.update(_unschedulable(kube))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 0.05)

    def extra(stop: asyncio.Event) -> list[Awaitable[Any]]:
        # kube-scheduler, the kubelet's end of each pod (1 s after it runs), the audit.
        return [kube.run_scheduler(stop), _finish_running_pods(kube, stop, 1.0), audit(stop)]

    plane = kube_plane(
        client, kube, tmp_path, "k8s-shared", tenants, extra, refuse_other_tenants=True
    )
    async with plane:
        handles = []
        for i in range(6):
            for t in tenants:
                # The same ids for both tenants: pod names carry the tenant, so each
                # tenant's action of one id has pods of its own in the one namespace.
                handles.append(await hw.submit(client, submit_request(t, f"job-{i}", "2")))
        results = await asyncio.wait_for(asyncio.gather(*(hw.wait_result(h) for h in handles)), 240)
        assert [r.state for r in results] == ["succeeded"] * 12, results
        assert peak == {"n1": 4000}, peak  # full, and never over
        assert not unschedulable, unschedulable
        print(f"two tenants, 12 actions of 2 CPU on one 4-CPU node: peak {peak}")
