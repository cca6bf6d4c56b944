"""Regenerate the checked-in histories: ``python -m tests.workflows.make_histories [SUFFIX]``.

Runs a small scenario on a fresh dev server (one action succeeds, one is cancelled while
waiting, with a queue update in between; then a backlog of bulk-loaded leases, whose
workflows do not exist, drains through the scheduler in bites) and writes the action and scheduler histories
to ``tests/workflows/histories/`` as ``<name><SUFFIX>.json``. Record new ones (a new
suffix) for a deliberate, patched change; never overwrite the old ones, which stand for
workflows still running on the old code.
"""

from __future__ import annotations

import asyncio
import sys
import tempfile
from pathlib import Path

from headway import protocol
from headway.protocol import DemandRequest, SubmitRequest
from headway.store import LeaseStore
from headway.worker.control_plane import build_control_plane_worker
from headway.workflows import client as hw
from headway.workflows.action import SEARCH_ATTRIBUTE_KEYS
from headway.workflows.scheduler import BITE
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from .conftest import TEMPORAL, FakeCluster, fleet

OUT = Path(__file__).parent / "histories"


async def main(suffix: str = "") -> None:
    env = await WorkflowEnvironment.start_local(
        dev_server_existing_path=str(TEMPORAL),
        search_attributes=SEARCH_ATTRIBUTE_KEYS,
        dev_server_extra_args=[
            a for kv in protocol.SERVER_DYNAMIC_CONFIG for a in ("--dynamic-config-value", kv)
        ],
        data_converter=protocol.data_converter(),
    )
    tmp = tempfile.mkdtemp()
    store = LeaseStore(f"sqlite:///{tmp}/h.db")
    client = env.client
    fl = fleet()
    cluster = FakeCluster("c1", client)
    try:
        async with (
            build_control_plane_worker(client, store, fl),
            Worker(
                client,
                task_queue=protocol.cluster_task_queue("c1"),
                activities=[cluster.run_action, cluster.delete_action],
            ),
        ):
            tenant = "replay"
            await hw.upsert_queue(client, tenant, {"name": "default"}, fl)
            d = DemandRequest(resources={"cpu": "1", "memory": "1Gi"})
            ok = await hw.submit(client, SubmitRequest("ok", "default", d, tenant, duration_s=0.2))
            await hw.wait_result(ok)
            await hw.update_queue(client, tenant, "default", {"action_concurrency": 0})
            w = await hw.submit(client, SubmitRequest("wait", "default", d, tenant))
            await asyncio.sleep(1.0)
            await w.cancel()
            await hw.wait_result(w)
            # A backlog bigger than two bites: refills by a regular sync activity.
            await hw.update_queue(client, tenant, "default", {"action_concurrency": None})
            n = 2 * BITE + 50
            store.put_many(
                tenant,
                (
                    (
                        f"b{i}",
                        "default",
                        f"gone-b{i}",
                        {
                            "id": f"b{i}",
                            "queue": "default",
                            "pods": [{"cpu": 100, "memory": 2**20}],
                            "kind": "single",
                        },
                        float(i),
                    )
                    for i in range(n)
                ),
            )
            await hw.nudge_scheduler(client, tenant, ["default"])
            for _ in range(300):
                if store.lease_count(tenant) == 0:
                    break
                await asyncio.sleep(0.1)
            await asyncio.sleep(1.0)
            sched = client.get_workflow_handle(protocol.scheduler_workflow_id(tenant))
            OUT.mkdir(exist_ok=True)
            for name, h in (("action_ok", ok), ("action_cancelled", w), ("scheduler", sched)):
                hist = await h.fetch_history()
                (OUT / f"{name}{suffix}.json").write_text(hist.to_json())
                print(name, len(hist.events), "events")
    finally:
        store.close()
        await env.shutdown()


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:2]))
