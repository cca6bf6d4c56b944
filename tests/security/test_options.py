"""How the connection options are resolved (no server): which source wins, the config
file and its profiles, the tenant -> namespace mapping, and the one-line errors of bad
settings."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner
from headway.cli._stack import local_env
from headway.cli.main import cli
from headway.connection import ConnectionOptions, ConnectionSettingsError, load

FILE = """\
address: file-host:7233
tls-ca-path: /file/ca.pem
tenant-namespaces: {team-a: ns-a}
profiles:
  other:
    address: profile-host:7233
    api-key-file: KEYFILE
"""


@pytest.fixture
def config(tmp_path: Path) -> Path:
    key = tmp_path / "key"
    key.write_text("hwk-from-file\n")
    path = tmp_path / "headway.yaml"
    path.write_text(FILE.replace("KEYFILE", str(key)))
    return path


PRECEDENCE = [
    pytest.param({}, {}, None, "localhost:7233", id="nothing-set-is-the-default"),
    pytest.param({}, {"TEMPORAL_ADDRESS": "t:1"}, None, "t:1", id="temporal-env-over-default"),
    pytest.param(
        {}, {"TEMPORAL_ADDRESS": "t:1", "HEADWAY_TEMPORAL_ADDRESS": "h:2"}, None, "h:2",
        id="headway-env-over-temporal-env",
    ),
    pytest.param({"address": "f:3"}, {"HEADWAY_TEMPORAL_ADDRESS": "h:2"}, None, "f:3",
                 id="flag-over-env"),
    pytest.param({}, {}, "file", "file-host:7233", id="file-over-default"),
    pytest.param({}, {"TEMPORAL_ADDRESS": "t:1"}, "file", "t:1", id="env-over-file"),
    pytest.param({"profile": "other"}, {}, "file", "profile-host:7233",
                 id="profile-over-file-top-level"),
]  # fmt: skip


@pytest.mark.parametrize(("given", "env", "use_file", "address"), PRECEDENCE)
def test_the_first_source_that_sets_a_value_wins(
    given: dict[str, str], env: dict[str, str], use_file: str | None, address: str, config: Path
) -> None:
    opts = load(
        address=given.get("address"),
        profile=given.get("profile"),
        config=str(config) if use_file else None,
        env=env,
    )
    assert opts.address == address


def test_the_file_gives_tls_a_key_file_and_the_mapping(config: Path) -> None:
    opts = load(config=str(config), profile="other", env={})
    assert opts.uses_tls and opts.tls_ca_path == "/file/ca.pem"
    assert opts.api_key == "hwk-from-file"
    assert opts.namespace_for("team-a") == "ns-a" and opts.namespace_for("x") == "default"
    assert "hwk-from-file" not in repr(opts)


def test_the_env_mapping_adds_to_the_files(config: Path) -> None:
    opts = load(config=str(config), env={"HEADWAY_TENANT_NAMESPACES": "team-b=ns-b,x=ns-x"})
    assert opts.tenant_map == {"team-a": "ns-a", "team-b": "ns-b", "x": "ns-x"}


def test_a_tenant_is_reached_in_its_namespace() -> None:
    base = load(tenant_namespaces={"team-a": "ns-a"}, env={})
    assert base.for_tenant("team-a").namespace == "ns-a"
    assert base.for_tenant("other").namespace == "default"
    given = load(namespace="ns-z", tenant_namespaces={"team-a": "ns-a"}, env={})
    with pytest.raises(ConnectionSettingsError, match="--namespace: 'ns-z' is not tenant"):
        given.for_tenant("team-a")


BAD = [
    pytest.param({"address": "nohost"}, {}, "--address: 'nohost' is not host:port",
                 id="address-without-port"),
    pytest.param({}, {"HEADWAY_TEMPORAL_TLS": "maybe"}, "HEADWAY_TEMPORAL_TLS: 'maybe' is not true",
                 id="tls-not-a-boolean"),
    pytest.param({"profile": "p"}, {}, "--profile: 'p' needs a config file",
                 id="profile-without-a-file"),
    pytest.param({"config": "/nonexistent.yaml"}, {}, "--config: cannot read '/nonexistent.yaml'",
                 id="config-file-missing"),
    pytest.param({}, {"HEADWAY_TENANT_NAMESPACES": "team-a"},
                 "HEADWAY_TENANT_NAMESPACES: 'team-a' is not tenant=namespace",
                 id="mapping-entry-without-namespace"),
    pytest.param({"tls": False, "tls_ca_path": "/ca.pem"}, {}, "--tls: TLS is turned off",
                 id="tls-off-with-tls-files"),
]  # fmt: skip


@pytest.mark.parametrize(("given", "env", "says"), BAD)
def test_a_bad_setting_is_named(given: dict[str, object], env: dict[str, str], says: str) -> None:
    with pytest.raises(ConnectionSettingsError) as err:
        load(**given, env=env)  # type: ignore[arg-type]
    assert says in str(err.value)


def test_an_unknown_file_key_is_named(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("adress: h:1\n")
    with pytest.raises(ConnectionSettingsError, match="'adress' is not a setting"):
        load(config=str(path), env={})


def test_the_cli_says_a_bad_setting_in_one_usage_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HEADWAY_TENANT_NAMESPACES", "team-a")
    res = CliRunner().invoke(cli, ["get", "queues"])
    assert res.exit_code == 2
    assert "HEADWAY_TENANT_NAMESPACES: 'team-a' is not tenant=namespace" in res.output
    assert res.exception is None or isinstance(res.exception, SystemExit)


def test_up_gives_its_children_none_of_the_shells_connection_settings(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for var in ("HEADWAY_TEMPORAL_API_KEY", "TEMPORAL_TLS", "HEADWAY_CONFIG", "PATH"):
        monkeypatch.setenv(var, "x")
    env = local_env()
    assert "PATH" in env
    assert not {"HEADWAY_TEMPORAL_API_KEY", "TEMPORAL_TLS", "HEADWAY_CONFIG"} & set(env)


def test_tls_files_are_read_when_connecting(tmp_path: Path) -> None:
    ca = tmp_path / "ca.pem"
    ca.write_bytes(b"PEM")
    tls = ConnectionOptions("h:1", tls_ca_path=str(ca), tls_server_name="srv").tls_config()
    assert not isinstance(tls, bool)
    assert tls.server_root_ca_cert == b"PEM" and tls.domain == "srv"
    assert ConnectionOptions("h:1").tls_config() is False
    assert ConnectionOptions("h:1", api_key="k").tls_config() is True
