"""TLS, mutual TLS and API keys end to end, through nginx terminating TLS in front of the
dev server (``rig.py``): the control-plane worker, a cluster worker, the CLI and the SDK
all connect through it and one action runs; a wrong or missing credential fails in one
line naming what to fix; no secret shows in any output."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from headway.sdk import Client, Resources, Task
from waiting import eventually

from .conftest import FLEET, KEY_ALL, Rig, clean_env, components, headway

pytestmark = pytest.mark.integration

MODES = ["tls", "mtls", "apikey"]


def cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        headway(*args), capture_output=True, text=True, timeout=120, env=clean_env(env)
    )


@pytest.mark.parametrize("mode", MODES)
async def test_every_component_runs_an_action_through_the_proxy(
    rig: Rig, mode: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tenant = f"sec-{mode}"
    env = rig.env(mode)
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text(FLEET)
    common = ["--tenant", tenant]
    plane = [
        "worker", "control-plane", "--fleet", str(fleet),
        "--database-url", f"sqlite:///{tmp_path / 'headway.db'}",
    ]  # fmt: skip
    cluster = ["worker", "cluster", "--name", "c1", "--backend", "sim", "--fleet", str(fleet)]
    with components(
        [
            ("control-plane", headway(*common, *plane), clean_env(env)),
            ("cluster-c1", headway(*common, *cluster), clean_env(env)),
        ],
        tmp_path,
    ) as procs:
        for p in procs:
            eventually(
                lambda p=p: "worker ready" in p.text() or None,  # type: ignore[misc]
                f"{p.name} ready through the {mode} proxy",
                90,
                show=p.text,
            )
        # The CLI: create, list, submit (and wait for the action to succeed).
        made = cli(env, *common, "create", "queue", "secure", "--priority", "high")
        assert made.returncode == 0, made.stderr
        listed = cli(env, *common, "get", "queues", "-o", "json")
        assert listed.returncode == 0, listed.stderr
        assert {"default", "secure"} <= {q["name"] for q in json.loads(listed.stdout)}
        sub = cli(
            env, *common, "submit", "--queue", "secure", "--id", "cli-1",
            "--cpu", "1", "--duration", "0.2", "--wait",
        )  # fmt: skip
        assert sub.returncode == 0, sub.stdout + sub.stderr

        # The SDK, with the same settings from the environment.
        for k, v in env.items():
            monkeypatch.setenv(k, v)
        hw = await Client.connect(tenant=tenant)
        assert hw.temporal.service_client.config.target_host == rig.proxies[mode].address
        action = await hw.submit(Task("sdk", Resources(cpu=1), duration=0.2), queue="secure")
        result = await action.result()
        assert result.state == "succeeded", result

        outputs = [p.text() for p in procs] + [r.stdout + r.stderr for r in (made, listed, sub)]
    # Every call went through the proxy (its access log has them all, none refused).
    log = rig.proxies[mode].access_log()
    assert "StartWorkflowExecution" in log and "PollActivityTaskQueue" in log
    if mode == "apikey":
        for text in outputs:
            assert KEY_ALL not in text


# The failing credentials, each as the user sees it: one line on stderr, exit 1.
BAD = [
    pytest.param("tls", {"HEADWAY_TEMPORAL_TLS_CA_PATH": ""}, {"HEADWAY_TEMPORAL_TLS": "1"},
                 "not signed by a CA this host trusts", id="tls-without-the-servers-ca"),
    pytest.param("tls", {}, {"HEADWAY_TEMPORAL_TLS_CA_PATH": "ROGUE_CA"},
                 "is not signed by the CA of --tls-ca-path", id="tls-with-another-ca"),
    pytest.param("tls", {"HEADWAY_TEMPORAL_TLS_CA_PATH": ""}, {},
                 "does it require TLS?", id="plain-to-a-tls-port"),
    pytest.param("tls", {}, {"HEADWAY_TEMPORAL_TLS_CA_PATH": "/nonexistent/ca.pem"},
                 "--tls-ca-path: cannot read '/nonexistent/ca.pem'", id="ca-file-missing"),
    pytest.param("mtls", {"HEADWAY_TEMPORAL_TLS_CERT_PATH": "", "HEADWAY_TEMPORAL_TLS_KEY_PATH": ""},
                 {}, "requires a client certificate", id="mtls-without-a-client-certificate"),
    pytest.param("mtls", {}, {"HEADWAY_TEMPORAL_TLS_CERT_PATH": "ROGUE_CERT",
                              "HEADWAY_TEMPORAL_TLS_KEY_PATH": "ROGUE_KEY"},
                 "rejected the client certificate", id="mtls-with-an-untrusted-certificate"),
    pytest.param("mtls", {"HEADWAY_TEMPORAL_TLS_KEY_PATH": ""}, {},
                 "--tls-cert-path is given but --tls-key-path is not", id="mtls-cert-without-key"),
    pytest.param("apikey", {"HEADWAY_TEMPORAL_API_KEY": ""}, {},
                 "requires credentials", id="api-key-missing"),
    pytest.param("apikey", {}, {"HEADWAY_TEMPORAL_API_KEY": "hwk-wrong-0000"},
                 "rejected the API key", id="api-key-wrong"),
]  # fmt: skip


def _bad_env(rig: Rig, mode: str, drop: dict[str, str], add: dict[str, str]) -> dict[str, str]:
    env = {k: v for k, v in rig.env(mode).items() if k not in drop}
    subst = {
        "ROGUE_CA": str(rig.pki.rogue_ca),
        "ROGUE_CERT": str(rig.pki.rogue_cert),
        "ROGUE_KEY": str(rig.pki.rogue_key),
    }
    env.update({k: subst.get(v, v) for k, v in add.items()})
    return env


@pytest.mark.parametrize(("mode", "drop", "add", "says"), BAD)
def test_a_wrong_or_missing_credential_fails_in_one_line(
    rig: Rig, mode: str, drop: dict[str, str], add: dict[str, str], says: str
) -> None:
    res = cli(_bad_env(rig, mode, drop, add), "get", "queues")
    lines = res.stderr.strip().splitlines()
    print(f"[{mode}] $ headway get queues\n{res.stderr.strip()}")
    assert res.returncode in (1, 2), res
    assert len(lines) == 1, res.stderr
    assert says in lines[0]
    assert "Traceback" not in res.stderr and "hwk-wrong-0000" not in res.stderr


@pytest.mark.parametrize("kind", ["control-plane", "cluster"])
def test_a_worker_with_a_wrong_key_stops_at_once_in_one_line(
    rig: Rig, kind: str, tmp_path: Path
) -> None:
    """Refused credentials are not a server still starting: no two minutes of retries."""
    env = clean_env(_bad_env(rig, "apikey", {}, {"HEADWAY_TEMPORAL_API_KEY": "hwk-wrong-0000"}))
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text(FLEET)
    extra = (
        ["--name", "c1"]
        if kind == "cluster"
        else ["--database-url", f"sqlite:///{tmp_path / 'h.db'}"]
    )
    argv = headway("worker", kind, "--fleet", str(fleet), *extra)
    res = subprocess.run(argv, capture_output=True, text=True, timeout=60, env=env)
    print(f"$ headway worker {kind}\n{res.stderr.strip()}")
    assert res.returncode == 1
    errors = [ln for ln in res.stderr.splitlines() if ln.startswith("Error:")]
    assert errors == [
        f"Error: Temporal at {rig.proxies['apikey'].address} rejected the API key of --api-key"
        " / HEADWAY_TEMPORAL_API_KEY (Request unauthorized: invalid API key)"
    ]
    assert "Traceback" not in res.stderr and "hwk-wrong-0000" not in res.stdout + res.stderr


def test_the_sdk_says_what_is_wrong_in_one_line(rig: Rig) -> None:
    from headway.connection import ConnectionSettingsError

    async def go() -> None:
        await Client.connect(
            rig.proxies["apikey"].address, tls_ca_path=str(rig.pki.ca), api_key="hwk-wrong-0000"
        )

    import asyncio

    with pytest.raises(ConnectionSettingsError) as err:
        asyncio.run(go())
    assert "rejected the API key" in str(err.value)
    assert "hwk-wrong-0000" not in str(err.value) and "\n" not in str(err.value)


def test_flags_work_like_the_environment(rig: Rig) -> None:
    """The temporal CLI's flag names, given on the command line instead."""
    p = rig.proxies["apikey"]
    res = cli(
        {},
        "--address", p.address, "--tls-ca-path", str(rig.pki.ca), "--api-key", KEY_ALL,
        "--namespace", "hw-a", "--tenant", "nobody", "get", "queues",
    )  # fmt: skip
    # Through the proxy and the key accepted: the server answers, the tenant is empty.
    assert res.returncode == 0, res.stderr
    assert "No queues in tenant 'nobody'" in res.stdout
    assert KEY_ALL not in res.stdout + res.stderr
