"""The Kubernetes cluster worker's configuration file (``--config``): what it sets, and
each bad value refused naming the file, the field and the value (exit 2)."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner
from headway.cli._common import free_port
from headway.cli.main import cli
from headway.worker.kube_config import load_kube_config, parse_kube_config

NOWHERE = f"127.0.0.1:{free_port()}"


def test_every_field_becomes_a_backend_setting():
    assert parse_kube_config(
        {
            "namespace": "headway",
            "queue_namespaces": {"train": "ml"},
            "gpu_node_label": "nvidia.com/gpu.product",
            "gpu_names": {"H100": "NVIDIA-H100-80GB-HBM3"},
            "delete_grace_seconds": 45,
            "image_pull_grace_seconds": 300,
        }
    ) == {
        "namespace": "headway",
        "queue_namespaces": {"train": "ml"},
        "gpu_node_label": "nvidia.com/gpu.product",
        "gpu_names": {"H100": "NVIDIA-H100-80GB-HBM3"},
        "delete_grace_s": 45,
        "image_pull_grace_s": 300.0,
    }
    assert parse_kube_config(None) == {}


@pytest.mark.parametrize(
    ("data", "named"),
    [
        pytest.param({"gpu_name": {}}, "gpu_name: {} is no field", id="unknown-field"),
        pytest.param({"namespace": "Head_way"}, "namespace: 'Head_way'", id="namespace"),
        pytest.param(
            {"queue_namespaces": {"train": "ML"}}, "queue_namespaces: 'train: ML'", id="queue-ns"
        ),
        pytest.param({"gpu_names": ["H100"]}, "gpu_names: ['H100'] must map", id="names-list"),
        pytest.param(
            {"gpu_names": {"H100": "NVIDIA H100"}}, "gpu_names: 'H100: NVIDIA H100'", id="value"
        ),
        pytest.param(
            {"gpu_names": {"H100": "X", "h100": "X"}}, "gpu_names: 'h100: X' maps", id="twice"
        ),
        pytest.param({"gpu_node_label": "a b"}, "gpu_node_label: 'a b'", id="label"),
        pytest.param(
            {"delete_grace_seconds": -1}, "delete_grace_seconds: -1 must be", id="negative-grace"
        ),
        pytest.param(
            {"image_pull_grace_seconds": "2m"},
            "image_pull_grace_seconds: '2m' must be a number",
            id="pull-grace-text",
        ),
        pytest.param(["namespace"], "is not a mapping", id="not-a-mapping"),
    ],
)
def test_a_bad_value_names_file_field_and_value(data, named):
    with pytest.raises(ValueError, match="^cfg.yaml: .*" + named.replace("[", r"\[")):
        parse_kube_config(data, "cfg.yaml")


def test_the_worker_refuses_a_bad_config_before_connecting(tmp_path: Path):
    bad = tmp_path / "cluster.yaml"
    bad.write_text("gpu_names: {H100: 'NVIDIA H100'}\n")
    result = CliRunner().invoke(
        cli,
        [
            "--address",
            NOWHERE,
            *("worker", "cluster", "--name", "gpu-h100", "--backend", "kubernetes"),
            *("--config", str(bad)),
        ],
    )
    assert result.exit_code == 2, result.output
    assert f"{bad}: gpu_names: 'H100: NVIDIA H100'" in result.output
    assert "Traceback" not in result.output
    with pytest.raises(ValueError, match="--config: cannot read"):
        load_kube_config(tmp_path / "missing.yaml")
    result = CliRunner().invoke(
        cli, ["--address", NOWHERE, "worker", "cluster", "--name", "gpu-h100", "--config", str(bad)]
    )
    assert result.exit_code == 2 and "--config does not apply to --backend sim" in result.output
