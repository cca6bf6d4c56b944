"""`headway submit`'s Kubernetes flags: each bad value fails before anything is sent,
naming the flag and the value (exit 2); good ones reach the request as ``kube``."""

from __future__ import annotations

from typing import Any

import pytest
from click.testing import CliRunner
from headway.cli._common import free_port
from headway.cli.main import cli
from headway.protocol import KubeOptions, SecretEnv, Toleration, Volume
from headway.sdk.client import Client as HeadwayClient

NOWHERE = f"127.0.0.1:{free_port()}"


def invoke(*args: str) -> Any:
    return CliRunner().invoke(cli, ["--address", NOWHERE, "submit", "--cpu", "1", *args])


@pytest.mark.parametrize(
    ("args", "named"),
    [
        pytest.param(["--env", "NOEQUALS"], "--env: 'NOEQUALS' is not KEY=VALUE", id="env-no-eq"),
        pytest.param(["--env", "1X=2"], "--env: '1X=2' names no valid variable", id="env-name"),
        pytest.param(["--env", "A=1", "--env", "A=2"], "sets 'A' twice", id="env-twice"),
        pytest.param(
            ["--env-from-secret", "Bad_Secret"],
            "--env-from-secret: 'Bad_Secret' names no valid Secret",
            id="secret-name",
        ),
        pytest.param(
            ["--env-from-secret", "creds:api-key"],
            "--env-from-secret: 'creds:api-key' has a key that is no variable name",
            id="secret-key",
        ),
        pytest.param(["--label", "team"], "--label: 'team' is not KEY=VALUE", id="label-no-eq"),
        pytest.param(
            ["--label", "team=a b"], "--label: 'team=a b' has a bad value", id="label-value"
        ),
        pytest.param(
            ["--label", "headway.io/action=x"],
            "uses Headway's own key prefix",
            id="label-reserved",
        ),
        pytest.param(
            ["--annotation", "-x=1"], "--annotation: '-x=1' has a bad key", id="annotation-key"
        ),
        pytest.param(
            ["--toleration", "nvidia.com/gpu:NoRun"],
            "--toleration: 'nvidia.com/gpu:NoRun' has effect 'NoRun'",
            id="toleration-effect",
        ),
        pytest.param(
            ["--node-selector", "zone"], "--node-selector: 'zone' is not KEY=VALUE", id="selector"
        ),
        pytest.param(
            ["--priority-class", "High"],
            "--priority-class: 'High' is not a valid name",
            id="priority-class",
        ),
        pytest.param(
            ["--service-account", "a_b"],
            "--service-account: 'a_b' is not a valid name",
            id="service-account",
        ),
        pytest.param(
            ["--volume", "nfs:share:/data"], "--volume: 'nfs:share:/data' has kind 'nfs'", id="kind"
        ),
        pytest.param(
            ["--volume", "pvc:data:relative"],
            "--volume: 'pvc:data:relative' needs an absolute mount path",
            id="relative-path",
        ),
        pytest.param(
            ["--volume", "pvc:data"], "--volume: 'pvc:data' is not pvc:NAME:/PATH", id="no-path"
        ),
        pytest.param(
            ["--volume", "pvc:a:/d", "--volume", "configmap:b:/d"],
            "--volume: '/d' is mounted twice",
            id="same-path",
        ),
        pytest.param(["--shm-size", "lots"], "--shm-size: 'lots'", id="shm-size"),
        pytest.param(["--shm-size", "0"], "--shm-size: '0' must be more than 0", id="shm-zero"),
        pytest.param(["--command", "'unclosed"], '--command: "\'unclosed" cannot', id="command"),
    ],
)
def test_bad_kubernetes_flags_fail_naming_flag_and_value_before_connecting(args, named):
    result = invoke(*args)
    assert result.exit_code == 2, result.output
    assert named in result.output
    assert "cannot reach" not in result.output
    assert "Traceback" not in result.output


def test_every_kubernetes_flag_reaches_the_request(monkeypatch):
    sent: list[Any] = []

    async def fake_submit(self: HeadwayClient, task: Any, **kw: Any) -> Any:
        sent.append(self.request(task, **kw))
        raise SystemExit(0)  # nothing is sent anywhere

    monkeypatch.setattr(HeadwayClient, "submit", fake_submit)
    monkeypatch.setattr(
        "headway.cli.submit.with_client", lambda cfg, go: __import__("asyncio").run(go(None))
    )
    result = invoke(
        "--image",
        "registry.example/train:1",
        "--command",
        "python -u",
        "--env",
        "LOG=debug",
        "--env-from-secret",
        "hf-token:HF_TOKEN",
        "--env-from-secret",
        "wandb",
        "--label",
        "team=nlp",
        "--annotation",
        "example.com/owner=ana@example.com",
        "--toleration",
        "nvidia.com/gpu:NoSchedule",
        "--toleration",
        "dedicated=ml:NoExecute",
        "--node-selector",
        "topology.kubernetes.io/zone=eu-west-1a",
        "--priority-class",
        "batch-low",
        "--service-account",
        "trainer",
        "--volume",
        "pvc:datasets:/data:ro",
        "--volume",
        "configmap:train-config:/etc/train",
        "--volume",
        "emptydir:/scratch",
        "--shm-size",
        "8Gi",
        "--",
        "train.py",
        "--lr",
        "3e-4",
    )
    assert result.exit_code == 0, result.output
    (req,) = sent
    assert req.image == "registry.example/train:1"
    assert req.command == ["python", "-u"]
    assert req.kube == KubeOptions(
        args=["train.py", "--lr", "3e-4"],
        env={"LOG": "debug"},
        env_from_secrets=[SecretEnv("hf-token", "HF_TOKEN"), SecretEnv("wandb")],
        labels={"team": "nlp"},
        annotations={"example.com/owner": "ana@example.com"},
        tolerations=[
            Toleration("nvidia.com/gpu", "Exists", "", "NoSchedule"),
            Toleration("dedicated", "Equal", "ml", "NoExecute"),
        ],
        node_selector={"topology.kubernetes.io/zone": "eu-west-1a"},
        priority_class="batch-low",
        service_account="trainer",
        volumes=[
            Volume("pvc", "datasets", "/data", True),
            Volume("configmap", "train-config", "/etc/train"),
            Volume("emptydir", "", "/scratch"),
        ],
        shm_size=8 * 2**30,
    )


def test_a_plain_submit_carries_no_kubernetes_options(monkeypatch):
    sent: list[Any] = []

    async def fake_submit(self: HeadwayClient, task: Any, **kw: Any) -> Any:
        sent.append(self.request(task, **kw))
        raise SystemExit(0)

    monkeypatch.setattr(HeadwayClient, "submit", fake_submit)
    monkeypatch.setattr(
        "headway.cli.submit.with_client", lambda cfg, go: __import__("asyncio").run(go(None))
    )
    assert invoke().exit_code == 0
    assert sent[0].kube is None and sent[0].command == []
