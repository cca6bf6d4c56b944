"""What a loaded server answers an update-with-start that did take (the workflow exists)
is retried by ``submit_action``: the same submission, idempotent by id, finds it. Any
other error is raised at once. No server: the one try is replaced."""

from __future__ import annotations

import asyncio
from typing import Any, cast

import pytest
from headway.protocol import DemandRequest, SubmitRequest
from headway.workflows import client as hw
from temporalio.client import WorkflowUpdateRPCTimeoutOrCancelledError
from temporalio.service import RPCError, RPCStatusCode


def _req() -> SubmitRequest:
    return SubmitRequest(action_id="a1", queue="q", demand=DemandRequest(resources={"cpu": 1}))


@pytest.mark.parametrize(
    ("error", "retried"),
    [
        pytest.param(
            RPCError("Workflow was not started: StartDeduped", RPCStatusCode.UNKNOWN, b""),
            True,
            id="a start deduplicated against its own first try",
        ),
        pytest.param(
            RPCError(
                "Unable to perform workflow execution update due to Workflow Task in failed state.",
                RPCStatusCode.FAILED_PRECONDITION,
                b"",
            ),
            True,
            id="the new workflow's first task timed out on a loaded worker",
        ),
        pytest.param(
            RPCError("workflow update was aborted", RPCStatusCode.UNAVAILABLE, b""),
            True,
            id="the server aborted the update",
        ),
        pytest.param(
            RPCError("Workflow is busy.", RPCStatusCode.RESOURCE_EXHAUSTED, b""),
            True,
            id="the server sheds load",
        ),
        pytest.param(
            WorkflowUpdateRPCTimeoutOrCancelledError(),
            True,
            id="the answer did not come back in the RPC's time",
        ),
        pytest.param(
            RPCError("Namespace not found", RPCStatusCode.NOT_FOUND, b""),
            False,
            id="a real error is raised at once",
        ),
    ],
)
async def test_transient_answers_to_a_submission_are_retried(
    monkeypatch: pytest.MonkeyPatch, error: Exception, retried: bool
) -> None:
    tries: list[SubmitRequest] = []

    done = cast(hw.Submission, object())

    async def once(client: Any, req: SubmitRequest) -> hw.Submission:
        tries.append(req)
        if len(tries) == 1:
            raise error
        return done

    monkeypatch.setattr(hw, "_submit_once", once)
    monkeypatch.setattr(asyncio, "sleep", _no_sleep)
    if retried:
        assert await hw.submit_action(None, _req()) is done  # type: ignore[arg-type]
        assert [r.action_id for r in tries] == ["a1", "a1"]  # the same submission again
    else:
        with pytest.raises(type(error)):
            await hw.submit_action(None, _req())  # type: ignore[arg-type]
        assert len(tries) == 1


async def _no_sleep(_s: float) -> None:
    return None
