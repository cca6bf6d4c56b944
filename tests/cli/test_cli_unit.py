"""The CLI without a server: flags are checked before anything is sent, and each bad
value fails naming the flag and the value, with a non-zero exit."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner
from headway.cli._common import free_port, load_fleet
from headway.cli._specs import queue_from_entry, queue_to_entry
from headway.cli.main import cli

# Nothing listens here, so a command that got as far as connecting would say
# "cannot reach Temporal" instead of naming the bad flag.
NOWHERE = f"127.0.0.1:{free_port()}"


def invoke(*args: str):
    return CliRunner().invoke(cli, ["--address", NOWHERE, *args])


def test_help_lists_verb_noun_commands():
    result = invoke("--help")
    assert result.exit_code == 0
    for command in ("server", "worker", "up", "create", "update", "get", "submit", "why"):
        assert command in result.output
    result = invoke("create", "--help")
    assert "queue" in result.output


@pytest.mark.parametrize(
    ("flag", "value", "named"),
    [
        ("--priority", "urgent", "priority: 'urgent'"),
        ("--algorithm", "fifo", "algorithm: 'fifo'"),
        ("--status", "paused", "status: 'paused'"),
        ("--run-concurrency", "-3", "--run-concurrency: -3 must be >= 0"),
        ("--depth", "-5", "--depth: -5 must be >= 0"),
        ("--depth", "lots", "--depth: 'lots'"),
        ("--max-cpu", "fast", "--max-cpu: 'fast'"),
        ("--max-memory", "12Qi", "--max-memory: '12Qi'"),
        ("--max-gpu", "H200:x", "--max-gpu: 'H200:x'"),
    ],
)
def test_create_queue_rejects_bad_flags_before_connecting(flag, value, named):
    result = invoke("create", "queue", "q1", flag, value)
    assert result.exit_code != 0
    assert named in result.output
    assert "cannot reach" not in result.output


def test_update_queue_rejects_bad_flags_before_connecting():
    result = invoke("update", "queue", "q1", "--max-gpu", "eight")
    assert result.exit_code != 0
    assert "--max-gpu: 'eight'" in result.output
    result = invoke("update", "queue", "q1", "--cluster", "a", "--clear-cluster")
    assert result.exit_code != 0
    assert "contradict" in result.output


def test_update_org_rejects_bad_flags_before_connecting():
    result = invoke("update", "org", "--max-concurrent-runs", "many")
    assert result.exit_code != 0
    assert "--max-concurrent-runs: 'many'" in result.output
    result = invoke("update", "org", "--max-actions-per-run", "-2")
    assert result.exit_code == 2
    assert "--max-actions-per-run: -2 must be >= 0" in result.output
    result = invoke("update", "org", "--submit-rate", "fast")
    assert result.exit_code != 0
    assert "--submit-rate: 'fast'" in result.output


@pytest.mark.parametrize(
    ("command", "flags", "named"),
    [
        pytest.param(
            "create", ["--submit-rate", "fast"], "--submit-rate: 'fast'", id="not-a-number"
        ),
        pytest.param(
            "create", ["--submit-rate", "0"], "--submit-rate: '0' must be more", id="zero"
        ),
        pytest.param(
            "update",
            ["--submit-rate", "5", "--submit-burst", "0.5"],
            "--submit-burst: '0.5' must be at least 1",
            id="burst-below-one",
        ),
        pytest.param(
            "create",
            ["--submit-burst", "10"],
            "--submit-burst needs --submit-rate",
            id="a-burst-without-a-rate",
        ),
    ],
)
def test_a_queues_submit_rate_flags_are_checked_before_connecting(command, flags, named):
    result = invoke(command, "queue", "q1", *flags)
    assert result.exit_code == 2, result.output
    assert named in result.output
    assert "cannot reach" not in result.output


@pytest.mark.parametrize(
    ("flag", "value", "named"),
    [
        ("--cpu", "two", "--cpu: 'two'"),
        ("--memory", "8 gigs", "--memory: '8 gigs'"),
        ("--gpu", "H100-8", "--gpu: 'H100-8'"),
    ],
)
def test_submit_rejects_bad_resources_before_connecting(flag, value, named):
    result = invoke("submit", "--queue", "q", flag, value)
    assert result.exit_code != 0
    assert named in result.output
    assert "cannot reach" not in result.output


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (["--id", "bad id"], "--id: 'bad id' is not a valid id"),
        (["--id", "x" * 201], "--id: 'xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx...' is 201 characters"),
        (["--run", "r/1"], "--run: 'r/1' is not a valid id"),
        (["--queue", "Bad_Q"], "--queue: 'Bad_Q' is not a valid name"),
        (["--tenant", "t:1"], "--tenant: 't:1' is not a valid name"),
    ],
)
def test_submit_rejects_bad_names_before_connecting(args, named):
    result = invoke("submit", "--cpu", "1", *args)
    assert result.exit_code == 2, result.output
    assert named in result.output
    assert "cannot reach" not in result.output and "Traceback" not in result.output


def test_unreachable_server_is_a_clear_error():
    result = invoke("submit", "--queue", "q", "--cpu", "1")
    assert result.exit_code != 0
    assert f"cannot reach Temporal at {NOWHERE}" in result.output


def test_server_start_refuses_a_taken_port(tmp_path: Path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        result = invoke(
            "server",
            "start",
            "--data-dir",
            str(tmp_path),
            "--port",
            str(port),
            "--ui-port",
            str(free_port()),
        )
    assert result.exit_code != 0
    assert f"port {port} (--port) is already in use" in result.output
    assert not (tmp_path / "temporal.db").exists()


def test_up_refuses_a_taken_ui_port(tmp_path: Path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        ui = s.getsockname()[1]
        result = invoke(
            "up", "--data-dir", str(tmp_path), "--port", str(free_port()), "--ui-port", str(ui)
        )
    assert result.exit_code != 0
    assert f"port {ui} (--ui-port) is already in use" in result.output


def test_bundled_fleet_has_two_gpu_types_and_a_cpu_cluster():
    fleet = load_fleet(None)
    gpu_types = {g.shape.gpu_type for c in fleet.clusters for g in c.node_groups if g.shape.gpu}
    assert gpu_types == {"H100", "H200"}
    assert all(g.shape.gpu == 8 for c in fleet.clusters for g in c.node_groups if g.shape.gpu)
    assert any(all(g.shape.gpu == 0 for g in c.node_groups) for c in fleet.clusters)


def test_fleet_errors_name_file_field_and_value(tmp_path: Path):
    bad = tmp_path / "fleet.yaml"
    bad.write_text(
        "clusters:\n  - name: a\n    node_groups:\n"
        "      - {name: g, count: 1, shape: {cpu: lots}}\n"
    )
    result = invoke("worker", "cluster", "--name", "a", "--fleet", str(bad))
    assert result.exit_code != 0
    assert str(bad) in result.output
    assert "clusters[0].node_groups[0].shape.cpu: 'lots'" in result.output


def test_queue_entry_round_trips():
    entry = {
        "name": "gpu-fast",
        "priority": "high",
        "algorithm": "strict",
        "run_concurrency": 10,
        "action_concurrency": 200,
        "per_run_concurrency": None,
        "depth": 10000,
        "submit_rate": {"per_second": 20.0, "burst": 50.0},
        "max_queued_time": 3600,
        "max_resources": {"cpu": "500m", "memory": "4Ti", "gpu": "H200:16"},
        "clusters": ["gpu-h200"],
        "status": "active",
        "retry": {
            "oom": 2,
            "oom_factor": 1.5,
            "oom_max_memory": "64Gi",
            "lost": 3,
            "failed": 1,
            "backoff": 30,
            "ready_timeout": 600,
            "not_ready": 2,
        },
    }
    spec = queue_from_entry(entry)
    assert queue_to_entry(spec) == entry
    assert spec.max_resources is not None and spec.max_resources.cpu == 500


def test_backend_options_must_match_the_backend():
    result = invoke("worker", "cluster", "--name", "cpu", "--backend", "sim", "--kubeconfig", "x")
    assert result.exit_code != 0
    assert "--kubeconfig does not apply to --backend sim" in result.output


def test_console_script_exits_with_the_commands_code():
    """The entry point leaves through os._exit (sdk-python issue 300): codes survive it."""
    script = Path(sys.executable).parent / "headway"
    ok = subprocess.run([str(script), "--version"], capture_output=True, text=True)
    assert ok.returncode == 0 and "headway, version" in ok.stdout
    bad = subprocess.run(
        [str(script), "--address", NOWHERE, "submit", "--cpu", "lots"],
        capture_output=True,
        text=True,
    )
    assert bad.returncode == 2 and "--cpu: 'lots'" in bad.stderr
    down = subprocess.run(
        [str(script), "--address", NOWHERE, "submit", "--cpu", "1"], capture_output=True, text=True
    )
    assert down.returncode == 1 and "cannot reach Temporal" in down.stderr


@pytest.mark.parametrize(
    ("option", "value", "named"),
    [
        pytest.param("--admit-wait", "-1", "-1", id="negative-admit-wait"),
        pytest.param("--admit-wait", "soon", "'soon'", id="admit-wait-not-a-number"),
        pytest.param("--contended-rate", "-5", "-5", id="negative-contended-rate"),
        pytest.param("--contended-rate", "fast", "'fast'", id="contended-rate-not-a-number"),
        pytest.param("--cluster-silent", "0", "'0'", id="cluster-silent-of-no-time"),
        pytest.param("--cluster-silent", "soon", "'soon'", id="cluster-silent-not-a-duration"),
    ],
)
def test_control_plane_worker_rejects_a_bad_setting_before_connecting(option, value, named):
    result = invoke("worker", "control-plane", option, value)
    assert result.exit_code != 0
    assert option in result.output and named in result.output
    assert "cannot reach" not in result.output


def test_a_kubernetes_worker_without_a_kubeconfig_fails_in_one_line(tmp_path: Path):
    missing = tmp_path / "no-kubeconfig"
    result = invoke(
        "worker", "cluster", "--name", "gpu-h100", "--backend", "kubernetes",
        "--kubeconfig", str(missing),
    )  # fmt: skip
    assert result.exit_code == 1, result.output
    assert (
        f"--backend kubernetes: no usable Kubernetes configuration in --kubeconfig {missing}"
        in (result.output)
    )
    assert "Traceback" not in result.output and "cannot reach" not in result.output


@pytest.mark.parametrize(
    ("flag", "env", "address", "want"),
    [
        pytest.param(None, None, "127.0.0.1:7233", "http://localhost:8233", id="derived-port+1000"),
        pytest.param(None, "http://ui:9000/", "127.0.0.1:7233", "http://ui:9000", id="env"),
        pytest.param(
            "http://x:1234", "http://ui:9000", "127.0.0.1:7233", "http://x:1234", id="flag-wins"
        ),
    ],
)
def test_web_ui_links_follow_ui_url_then_env_then_the_address(
    monkeypatch: pytest.MonkeyPatch, flag: str | None, env: str | None, address: str, want: str
) -> None:
    from headway.cli._common import Settings, ui_url, workflow_url

    monkeypatch.delenv("HEADWAY_UI_URL", raising=False)
    if env:
        monkeypatch.setenv("HEADWAY_UI_URL", env)
    cfg = Settings(address=address, ui_url=flag)
    assert ui_url(cfg) == want
    assert workflow_url(cfg, "w1") == f"{want}/namespaces/default/workflows/w1"


def test_a_ui_url_that_is_not_http_is_a_usage_error() -> None:
    res = CliRunner().invoke(cli, ["--ui-url", "localhost:8233", "get", "queues"])
    assert res.exit_code == 2
    assert "--ui-url: 'localhost:8233' is not an http(s) URL" in res.output


def test_up_on_another_ui_port_says_how_links_find_it() -> None:
    from headway.cli._common import ui_hint

    assert ui_hint(7233, 8233) is None
    hint = ui_hint(7233, 9000)
    assert hint is not None and "--ui-url http://localhost:9000" in hint


def test_a_cluster_worker_for_a_cluster_the_fleet_lacks_is_a_bad_value():
    result = invoke("worker", "cluster", "--name", "gpu-h1000", "--backend", "sim")
    assert result.exit_code == 2, result.output
    assert "--name: 'gpu-h1000' is not a cluster of the fleet (one of gpu-h100" in result.output
    assert "cannot reach" not in result.output
