"""Record the retry histories (revision 4, issue #23):
``python -m tests.workflows.make_retry_histories``.

On a fresh dev server with the control plane and a real sim cluster worker (as
``test_retries``): an action OOMKilled once and retried with more memory, which then
succeeds, and one whose pod never starts, requeued once at its ready timeout and then
failed ``NotReady``. Writes ``action_retry_oom_rev4.json`` and
``action_ready_timeout_rev4.json`` to ``tests/workflows/histories/``; like
``make_histories``, never overwrite a history that was checked in.
"""

from __future__ import annotations

import asyncio
import tempfile
from pathlib import Path

from headway import protocol
from headway.protocol import DemandRequest
from headway.workflows import client as hw
from temporalio.common import SearchAttributeKey
from temporalio.testing import WorkflowEnvironment

from .conftest import TEMPORAL
from .test_retries import _plane, queue, req

OUT = Path(__file__).parent / "histories"


async def main() -> None:
    env = await WorkflowEnvironment.start_local(
        dev_server_existing_path=str(TEMPORAL),
        search_attributes=[SearchAttributeKey.for_keyword(n) for n in protocol.SEARCH_ATTRIBUTES],
        dev_server_extra_args=[
            a for kv in protocol.SERVER_DYNAMIC_CONFIG for a in ("--dynamic-config-value", kv)
        ],
        data_converter=protocol.data_converter(),
    )
    try:
        async with _plane(env.client, Path(tempfile.mkdtemp()), "replay", cpu=8000) as p:
            await queue(p, "replay", retry={"oom": 1})
            sub = await hw.submit_action(p.client, req("replay", "oom", inject="oom-below:2Gi"))
            assert (await hw.wait_result(sub.handle)).state == "succeeded"
            history = await sub.handle.fetch_history()
            (OUT / "action_retry_oom_rev4.json").write_text(history.to_json())
        async with _plane(env.client, Path(tempfile.mkdtemp()), "replay2", cpu=1000) as p:
            policy = {"ready_timeout": 1, "not_ready": 1, "backoff": 0.5}
            await queue(p, "replay2", retry=policy)
            r = req("replay2", "never")
            r.demand = DemandRequest(resources={"cpu": "2", "memory": "1Gi"})
            sub = await hw.submit_action(p.client, r)
            assert (await hw.wait_result(sub.handle)).reason == "NotReady"
            history = await sub.handle.fetch_history()
            (OUT / "action_ready_timeout_rev4.json").write_text(history.to_json())
    finally:
        await env.shutdown()


if __name__ == "__main__":
    asyncio.run(main())
