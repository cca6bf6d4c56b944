"""The rig of the secure-connection tests (``rig.py``), once per session: the dev server
with namespaces ``hw-a`` and ``hw-b``, and nginx in front of it three ways."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import pytest

from .rig import Pki, Proxy, TemporalServer, make_pki, proxy, temporal_server

NAMESPACES = ("hw-a", "hw-b")
#: Namespace-scoped API keys (as the proxy grants them).
KEY_ALL = "hwk-all-2f9c61d0a7e34b5f"
KEY_A = "hwk-a-81be4e0c99d14c27"
KEY_B = "hwk-b-5a03f7de12ab4e68"

FLEET = """\
clusters:
  - name: c1
    node_groups:
      - {name: n, count: 2, shape: {cpu: 8, memory: 32Gi}}
queues:
  - name: default
"""


@dataclass
class Rig:
    pki: Pki
    server: TemporalServer
    proxies: dict[str, Proxy]
    dir: Path

    def env(self, mode: str, key: str = KEY_ALL) -> dict[str, str]:
        """The connection settings of ``mode``, as environment variables."""
        p = self.proxies[mode]
        env = {
            "HEADWAY_TEMPORAL_ADDRESS": p.address,
            "HEADWAY_TEMPORAL_TLS_CA_PATH": str(self.pki.ca),
        }
        if mode == "mtls":
            env["HEADWAY_TEMPORAL_TLS_CERT_PATH"] = str(self.pki.client_cert)
            env["HEADWAY_TEMPORAL_TLS_KEY_PATH"] = str(self.pki.client_key)
        if mode == "apikey":
            env["HEADWAY_TEMPORAL_API_KEY"] = key
        return env


@pytest.fixture(scope="session")
def rig(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Rig]:
    d = tmp_path_factory.mktemp("secure")
    pki = make_pki(d / "pki")
    keys = {KEY_ALL: ["*"], KEY_A: ["hw-a"], KEY_B: ["hw-b"]}
    with contextlib.ExitStack() as stack:
        server = stack.enter_context(temporal_server(d / "temporal", NAMESPACES))
        proxies = {
            mode: stack.enter_context(proxy(mode, d / f"proxy-{mode}", server.port, pki, keys))
            for mode in ("tls", "mtls", "apikey")
        }
        yield Rig(pki, server, proxies, d)


def clean_env(extra: Mapping[str, str]) -> dict[str, str]:
    """This process's environment without any connection setting, plus ``extra``."""
    from headway.cli._stack import local_env

    return {**local_env(), "PYTHONUNBUFFERED": "1", **extra}


def headway(*args: str) -> list[str]:
    return [sys.executable, "-m", "headway.cli", *args]


@dataclass
class Component:
    """A long-running ``headway`` process, its output in a file."""

    name: str
    proc: subprocess.Popen[bytes]
    log: Path

    def text(self) -> str:
        return self.log.read_text(errors="replace")


@contextlib.contextmanager
def components(
    specs: list[tuple[str, list[str], dict[str, str]]], d: Path
) -> Iterator[list[Component]]:
    """Start each ``(name, argv, env)``; stop them all on the way out."""
    started: list[Component] = []
    try:
        for name, argv, env in specs:
            log = d / f"{name}.log"
            with log.open("wb") as out:
                proc = subprocess.Popen(
                    argv,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    env=env,
                    start_new_session=True,
                )
            started.append(Component(name, proc, log))
        yield started
    finally:
        for c in reversed(started):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(c.proc.pid, 15)
        for c in started:
            try:
                c.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(c.proc.pid, 9)
                c.proc.wait(timeout=5)
