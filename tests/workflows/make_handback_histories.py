"""Record the hand-back histories (revision 5, issue #22):
``python -m tests.workflows.make_handback_histories``.

On a fresh dev server with the control plane and a real sim cluster worker whose reports
lag by 3 s: an action admitted on a view a cordon has just made stale, handed back by
the worker (``CapacityChanged``), which runs once the node is uncordoned; and one
admitted to a cluster whose worker has just stopped, handed back when nobody took the
dispatch, which runs once a worker returns. Writes ``action_handback_rev5.json`` and
``action_handback_dead_rev5.json`` to ``tests/workflows/histories/``; like
``make_histories``, never overwrite a history that was checked in.
"""

from __future__ import annotations

import asyncio
import tempfile
from pathlib import Path

from headway import protocol
from headway.activities.backends.sim import SimBackend
from headway.protocol import DemandRequest, SubmitRequest
from headway.scheduler import ClusterSpec, NodeGroup, Pod, QueueSpec
from headway.worker.cluster import run_cluster_worker
from headway.worker.control_plane import run_control_plane_worker
from headway.workflows import client as hw
from temporalio.client import Client
from temporalio.testing import WorkflowEnvironment

from .conftest import TEMPORAL

OUT = Path(__file__).parent / "histories"
GI = 2**30
CLUSTER = "sim-replay"
FLEET = [ClusterSpec(CLUSTER, (NodeGroup("n", 1, Pod(cpu=4000, memory=16 * GI)),))]


def request(action_id: str) -> SubmitRequest:
    return SubmitRequest(
        action_id=action_id,
        queue="q",
        tenant="replay",
        demand=DemandRequest(resources={"cpu": "1", "memory": "1Gi"}),
        duration_s=0.5,
    )


def worker(client: Client, backend: SimBackend, stop: asyncio.Event) -> asyncio.Task[None]:
    return asyncio.create_task(
        run_cluster_worker(
            client, CLUSTER, backend, tenants=["replay"], stop=stop, debounce_s=3.0, resync_s=1.0
        )
    )


async def attempts(client: Client, action_id: str) -> int:
    while True:
        try:
            st = await hw.action_state(client, "replay", action_id)
            if len(st.attempts) > 1:
                return len(st.attempts)
        except Exception:
            pass
        await asyncio.sleep(0.2)


async def main() -> None:
    # Registered with their kinds (HeadwayReasons is a keyword list: a hand-back adds
    # CapacityChanged to it while it waits).
    extra = [
        a
        for n, kind in protocol.SEARCH_ATTRIBUTES.items()
        for a in ("--search-attribute", f"{n}={kind}")
    ]
    env = await WorkflowEnvironment.start_local(
        dev_server_existing_path=str(TEMPORAL),
        dev_server_extra_args=extra
        + [a for kv in protocol.SERVER_DYNAMIC_CONFIG for a in ("--dynamic-config-value", kv)],
        data_converter=protocol.data_converter(),
    )
    client = env.client
    stop = asyncio.Event()
    control = asyncio.create_task(
        run_control_plane_worker(
            client,
            database_url=f"sqlite:///{Path(tempfile.mkdtemp()) / 'leases.db'}",
            fleet=FLEET,
            stop=stop,
            cluster_silent_s=4.0,
        )
    )
    backend = SimBackend(FLEET[0], startup_s=0.05)
    w_stop = asyncio.Event()
    w = worker(client, backend, w_stop)
    try:
        await hw.ensure_scheduler(client, "replay", FLEET)
        await hw.upsert_queue(client, "replay", QueueSpec("q").to_dict())
        await asyncio.sleep(2.0)  # the first report
        backend.cordon("n-0")  # heard 3 s from now: the admission comes first
        sub = await hw.submit(client, request("cordoned"))
        await attempts(client, "cordoned")
        backend.cordon("n-0", False)
        assert (await hw.wait_result(sub)).state == "succeeded"
        (OUT / "action_handback_rev5.json").write_text((await sub.fetch_history()).to_json())

        w_stop.set()
        await w
        sub = await hw.submit(client, request("nobody"))
        await attempts(client, "nobody")
        w_stop = asyncio.Event()
        w = worker(client, SimBackend(FLEET[0], startup_s=0.05), w_stop)
        assert (await hw.wait_result(sub)).state == "succeeded"
        (OUT / "action_handback_dead_rev5.json").write_text((await sub.fetch_history()).to_json())
    finally:
        w_stop.set()
        stop.set()
        await asyncio.gather(w, control, return_exceptions=True)
        await env.shutdown()


if __name__ == "__main__":
    asyncio.run(main())
