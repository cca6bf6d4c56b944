"""A typo'd action id or queue is an error naming it, not an empty answer (CliRunner, the
server's side faked): ``why``, ``get actions --queue``; and what ``why`` says of an
action the scheduler no longer holds."""

from __future__ import annotations

from typing import Any

import pytest
from click.testing import CliRunner
from headway.cli._output import human_details
from headway.cli.main import cli
from headway.sdk.client import Client as HeadwayClient
from headway.workflows import client as hw
from headway.workflows.action import ActionResult

#: The scheduler's ``why`` of an action outside its window (ended, or never submitted).
OUTSIDE: dict[str, Any] = {
    "action_id": "a1",
    "state": None,
    "reason": None,
    "reasons": [],
    "message": "not in the scheduler's window: queued in the store behind the window, "
    "rejected, or already ended",
}


@pytest.fixture
def no_server(monkeypatch: pytest.MonkeyPatch) -> None:
    async def no_connect(cfg: Any) -> Any:
        return object()

    async def why(self: HeadwayClient, action_id: str) -> dict[str, Any]:
        return {**OUTSIDE, "action_id": action_id}

    monkeypatch.setattr("headway.cli._common.connect", no_connect)
    monkeypatch.setattr(HeadwayClient, "why", why)


def _details(action_id: str, result: ActionResult | None) -> hw.ActionDetails:
    return hw.ActionDetails(
        action_id=action_id,
        tenant="default",
        workflow_id=f"headway-action-default-{action_id}",
        run_id=None,
        state=result.state if result else "waiting",
        reason=result.reason if result else None,
        execution_status="completed" if result else "running",
        started_at=None,
        ended_at=None,
        result=result,
    )


def test_why_of_an_unknown_action_names_it_and_fails(
    no_server: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def details(client: Any, tenant: str, action_id: str) -> hw.ActionDetails:
        raise hw.ActionNotFoundError(tenant, action_id)

    monkeypatch.setattr(hw, "action_details", details)
    res = CliRunner().invoke(cli, ["why", "actoin-1"])
    assert res.exit_code == 1, res.output
    assert "action 'actoin-1' not found in tenant 'default'" in res.output
    assert "Traceback" not in res.output


@pytest.mark.parametrize(
    ("result", "state", "reason", "message"),
    [
        pytest.param(
            ActionResult("a1", "rejected", reason="Unschedulable", message="can never fit"),
            "rejected",
            "Unschedulable",
            "can never fit",
            id="rejected-says-why-in-its-own-words",
        ),
        pytest.param(
            ActionResult("a1", "succeeded", reason="Succeeded"),
            "succeeded",
            "Succeeded",
            "it ended succeeded",
            id="succeeded-says-it-ended",
        ),
    ],
)
def test_why_of_an_ended_action_gives_its_own_state(
    no_server: None,
    monkeypatch: pytest.MonkeyPatch,
    result: ActionResult,
    state: str,
    reason: str,
    message: str,
) -> None:
    async def details(client: Any, tenant: str, action_id: str) -> hw.ActionDetails:
        return _details(action_id, result)

    monkeypatch.setattr(hw, "action_details", details)
    res = CliRunner().invoke(cli, ["why", "a1"])
    assert res.exit_code == 0, res.output
    assert f"state: {state}\n" in res.output
    assert f"reason: {reason}\n" in res.output
    assert f"message: {message}\n" in res.output


def test_get_actions_of_an_unknown_queue_names_it_and_fails(
    no_server: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def none_listed(client: Any, tenant: str, **filters: Any) -> list[hw.ActionRow]:
        return []

    async def queues(client: Any, tenant: str) -> dict[str, dict[str, Any]]:
        return {"train": {}, "backfill": {}}

    monkeypatch.setattr(hw, "list_actions", none_listed)
    monkeypatch.setattr("headway.cli.queues.fetch_queues", queues)
    res = CliRunner().invoke(cli, ["get", "actions", "--queue", "trian"])
    assert res.exit_code == 1, res.output
    assert "--queue: queue 'trian' does not exist (queues: backfill, train)" in res.output
    # A queue that exists with nothing listed is an empty list, as before.
    res = CliRunner().invoke(cli, ["get", "actions", "--queue", "train"])
    assert res.exit_code == 0, res.output
    assert "No actions found." in res.output


def test_a_fit_forecast_in_why_details_reads_as_a_time() -> None:
    shown = human_details({"clusters": {"c1": {"fits_at": 1796325958.7, "free": {"gpu": 0}}}})
    assert shown == {"clusters": {"c1": {"fits_at": "2026-12-03T19:25:58Z", "free": {"gpu": 0}}}}
