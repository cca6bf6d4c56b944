"""The SDK fast path: payload walks skipped only where they are the identity."""

from __future__ import annotations

import dataclasses
import functools
import uuid
from collections.abc import Iterator, Sequence
from datetime import timedelta
from typing import Any

import pytest
import temporalio.bridge.worker as bridge_worker
from headway import protocol
from headway.worker import sdk_fastpath
from temporalio import activity, workflow
from temporalio.api.common.v1 import Payload
from temporalio.client import Client
from temporalio.converter import PayloadCodec
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import UnsandboxedWorkflowRunner, Worker


@activity.defn(name="fastpath.echo")
async def echo(x: str) -> str:
    return x + "!"


@workflow.defn(name="FastpathWorkflow")
class EchoWorkflow:
    @workflow.run
    async def run(self, x: str) -> str:
        y: str = await workflow.execute_activity(
            "fastpath.echo", x, start_to_close_timeout=timedelta(seconds=10)
        )
        return y


class TaggingCodec(PayloadCodec):
    """Wraps each payload in an outer one (metadata ``encoding: tag``), counting calls."""

    def __init__(self) -> None:
        self.encoded = 0
        self.decoded = 0

    async def encode(self, payloads: Sequence[Payload]) -> list[Payload]:
        self.encoded += len(payloads)
        return [
            Payload(metadata={"encoding": b"binary/tag"}, data=p.SerializeToString())
            for p in payloads
        ]

    async def decode(self, payloads: Sequence[Payload]) -> list[Payload]:
        out = []
        for p in payloads:
            assert p.metadata["encoding"] == b"binary/tag", p.metadata
            self.decoded += 1
            inner = Payload()
            inner.ParseFromString(p.data)
            out.append(inner)
        return out


@pytest.fixture
def walks(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """Names of the SDK's payload walks that actually ran (fast path installed)."""
    calls: list[str] = []
    sdk_fastpath.uninstall()
    for name in ("decode_activation", "encode_completion"):
        orig = getattr(bridge_worker, name)

        # wraps: the fast path checks the signature it wraps (through ``__wrapped__``).
        @functools.wraps(orig)
        async def spy(*args: Any, _orig: Any = orig, _name: str = name, **kw: Any) -> Any:
            calls.append(_name)
            return await _orig(*args, **kw)

        monkeypatch.setattr(bridge_worker, name, spy)
    assert sdk_fastpath.install()
    yield calls
    sdk_fastpath.uninstall()
    monkeypatch.undo()
    sdk_fastpath.install()


async def _run(client: Client) -> str:
    tq = f"fastpath-{uuid.uuid4().hex[:8]}"
    async with Worker(
        client,
        task_queue=tq,
        workflows=[EchoWorkflow],
        activities=[echo],
        workflow_runner=UnsandboxedWorkflowRunner(),
    ):
        out: str = await client.execute_workflow(
            EchoWorkflow.run, "hi", id=f"fastpath-{uuid.uuid4().hex}", task_queue=tq
        )
        return out


async def test_no_codec_skips_every_walk(client: Client, walks: list[str]) -> None:
    assert await _run(client) == "hi!"
    assert walks == []


async def test_a_codec_still_sees_every_payload(env: WorkflowEnvironment, walks: list[str]) -> None:
    codec = TaggingCodec()
    conv = dataclasses.replace(protocol.data_converter(), payload_codec=codec)
    config = env.client.config()
    config["data_converter"] = conv
    client = Client(**config)
    assert await _run(client) == "hi!"
    # The walks ran (activations and completions), and the codec both wrapped what
    # went out and unwrapped what came back: workflow input and result, activity input
    # and result.
    assert "decode_activation" in walks and "encode_completion" in walks
    assert codec.encoded >= 4 and codec.decoded >= 4


def test_install_is_idempotent_and_reversible() -> None:
    assert sdk_fastpath.install() and sdk_fastpath.install()
    assert sdk_fastpath.installed()
    sdk_fastpath.uninstall()
    assert not sdk_fastpath.installed()
    assert sdk_fastpath.install() and sdk_fastpath.installed()


def test_switched_off_by_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    sdk_fastpath.uninstall()
    monkeypatch.setenv("HEADWAY_SDK_FASTPATH", "0")
    try:
        assert not sdk_fastpath.install()
        assert not sdk_fastpath.installed()
    finally:
        monkeypatch.delenv("HEADWAY_SDK_FASTPATH")
        assert sdk_fastpath.install()
