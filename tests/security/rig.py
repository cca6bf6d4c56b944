"""The secure-connection rig: a Temporal dev server (with extra namespaces) behind nginx
terminating TLS for gRPC (Debian's package, installed with apt-get when missing: the
tests run as root on the CI image; if that fails, the test fails saying so).

Three ways in, as real deployments have them:

- ``tls``: server-authenticated TLS only (a certificate made here, for ``localhost``);
- ``mtls``: mutual TLS, ``ssl_verify_client on`` against the rig's CA;
- ``apikey``: TLS plus an ``authorization: Bearer <key>`` header, each key granted some
  namespaces (the ``temporal-namespace`` header every call carries), as Temporal Cloud's
  namespace-scoped API keys: a wrong key is UNAUTHENTICATED, a namespace the key is not
  granted PERMISSION_DENIED.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest
from headway.cli._common import free_port
from headway.cli.server import server_argv

__all__ = ["Pki", "Proxy", "TemporalServer", "make_pki", "nginx", "proxy", "temporal_server"]


def nginx() -> str:
    found = shutil.which("nginx") or (
        "/usr/sbin/nginx" if Path("/usr/sbin/nginx").exists() else None
    )
    if found:
        return found
    for cmd in (["apt-get", "update"], ["apt-get", "install", "-y", "nginx"]):
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=900, check=False)
        if r.returncode != 0:
            pytest.fail(f"nginx is missing and {' '.join(cmd)} failed: {r.stderr[-500:]}")
    found = shutil.which("nginx") or "/usr/sbin/nginx"
    if not Path(found).exists():
        pytest.fail("apt-get installed nginx, but no nginx is on PATH")
    return found


# --- certificates -----------------------------------------------------------------------


@dataclass(frozen=True)
class Pki:
    """The rig's CA, the server's certificate, a client's, and a rogue CA with a client
    certificate of its own (signed by nobody the server trusts)."""

    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path
    rogue_ca: Path
    rogue_cert: Path
    rogue_key: Path


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


def _ca(d: Path, name: str) -> None:
    _openssl(
        "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
        "-keyout", f"{name}.key", "-out", f"{name}.pem", "-subj", f"/CN={name}",
        cwd=d,
    )  # fmt: skip


def _signed(d: Path, name: str, ca: str, cn: str, ext: str) -> None:
    (d / f"{name}.ext").write_text(ext)
    _openssl(
        "req", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}.key",
        "-out", f"{name}.csr", "-subj", f"/CN={cn}",
        cwd=d,
    )  # fmt: skip
    _openssl(
        "x509", "-req", "-in", f"{name}.csr", "-CA", f"{ca}.pem", "-CAkey", f"{ca}.key",
        "-CAcreateserial", "-days", "2", "-out", f"{name}.pem", "-extfile", f"{name}.ext",
        cwd=d,
    )  # fmt: skip


def make_pki(d: Path) -> Pki:
    d.mkdir(parents=True, exist_ok=True)
    _ca(d, "ca")
    _ca(d, "rogue-ca")
    _signed(
        d,
        "server",
        "ca",
        "localhost",
        "subjectAltName=DNS:localhost,IP:127.0.0.1\nextendedKeyUsage=serverAuth\n",
    )
    _signed(d, "client", "ca", "headway-client", "extendedKeyUsage=clientAuth\n")
    _signed(d, "rogue", "rogue-ca", "intruder", "extendedKeyUsage=clientAuth\n")
    for key in d.glob("*.key"):
        key.chmod(0o600)
    return Pki(
        ca=d / "ca.pem",
        server_cert=d / "server.pem",
        server_key=d / "server.key",
        client_cert=d / "client.pem",
        client_key=d / "client.key",
        rogue_ca=d / "rogue-ca.pem",
        rogue_cert=d / "rogue.pem",
        rogue_key=d / "rogue.key",
    )


# --- the Temporal server ----------------------------------------------------------------


@dataclass
class TemporalServer:
    port: int
    proc: subprocess.Popen[bytes]
    log: Path

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"


def wait_for_port(port: int, proc: subprocess.Popen[bytes], log: Path, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"exited with {proc.returncode}:\n{log.read_text()[-2000:]}")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.5):
            return
        time.sleep(0.1)
    raise RuntimeError(f"nothing listens on {port} after {timeout_s}s:\n{log.read_text()[-2000:]}")


def _stop(proc: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=15)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=5)


@contextlib.contextmanager
def temporal_server(data_dir: Path, namespaces: Sequence[str] = ()) -> Iterator[TemporalServer]:
    """The dev server (plain, on 127.0.0.1 only) with ``namespaces`` created at start."""
    data_dir.mkdir(parents=True, exist_ok=True)
    for attempt in range(3):  # the dev server's own port race (see tests/faults/procs.py)
        port = free_port()
        argv = server_argv(data_dir, port=port, headless=True)
        for ns in namespaces:
            argv += ["--namespace", ns]
        log = data_dir / f"temporal-{attempt}.log"
        with log.open("wb") as out:
            proc = subprocess.Popen(
                argv, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )
        try:
            wait_for_port(port, proc, log, 90)
        except RuntimeError:
            _stop(proc)
            if attempt == 2:
                raise
            continue
        try:
            yield TemporalServer(port, proc, log)
        finally:
            _stop(proc)
        return


# --- the proxy --------------------------------------------------------------------------


@dataclass
class Proxy:
    mode: str
    port: int
    dir: Path

    @property
    def address(self) -> str:
        # By name: the server certificate is for localhost.
        return f"localhost:{self.port}"

    def access_log(self) -> str:
        return (self.dir / "access.log").read_text(errors="replace")


def _config(
    mode: str, d: Path, port: int, upstream: int, pki: Pki, keys: Mapping[str, Sequence[str]]
) -> str:
    temp = "\n".join(
        f"  {k}_temp_path {d / k};" for k in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi")
    )
    client = (
        f"    ssl_client_certificate {pki.ca};\n    ssl_verify_client on;\n"
        if mode == "mtls"
        else ""
    )
    # Key -> the namespaces it is granted ("*": all): "<key>|<namespace>" -> 1. A call
    # without a namespace header (GetSystemInfo) needs a valid key only.
    grants = [f'    "Bearer {k}" 1;' for k in keys]
    scoped = [
        f'    "~^Bearer {k}\\|{"" if ns == "*" else ns + "$"}" 1;'
        for k, nss in keys.items()
        for ns in nss
    ]
    auth = ""
    if mode == "apikey":
        auth = "    if ($key_ok = 0) { return 401; }\n    if ($ns_ok = 0) { return 403; }\n"
    # nginx answers a refusal as a gRPC status, as Temporal's own frontend does.
    return f"""
daemon off;
pid {d / "nginx.pid"};
error_log {d / "error.log"} info;
events {{ worker_connections 256; }}
http {{
{temp}
  log_format grpc '$remote_addr "$request" $status ns=$http_temporal_namespace';
  access_log {d / "access.log"} grpc;
  map $http_authorization $key_ok {{
    default 0;
{chr(10).join(grants)}
  }}
  map "$http_authorization|$http_temporal_namespace" $ns_scoped {{
    default 0;
{chr(10).join(scoped)}
  }}
  map $http_temporal_namespace $ns_ok {{
    default $ns_scoped;
    "" 1;
  }}
  server {{
    listen 127.0.0.1:{port} ssl http2;
    ssl_certificate {pki.server_cert};
    ssl_certificate_key {pki.server_key};
{client}
    error_page 401 = @unauthenticated;
    error_page 403 = @denied;
    error_page 495 = @badcert;
    error_page 496 = @nocert;
    location / {{
{auth}
      grpc_read_timeout 300s;
      grpc_send_timeout 300s;
      grpc_pass grpc://127.0.0.1:{upstream};
    }}
    location @unauthenticated {{
      internal;
      default_type application/grpc;
      add_header grpc-status 16 always;
      add_header grpc-message "Request unauthorized: invalid API key" always;
      return 204;
    }}
    location @denied {{
      internal;
      default_type application/grpc;
      add_header grpc-status 7 always;
      add_header grpc-message "Request unauthorized: API key not granted this namespace" always;
      return 204;
    }}
    location @badcert {{
      internal;
      default_type application/grpc;
      add_header grpc-status 16 always;
      add_header grpc-message "client certificate not trusted" always;
      return 204;
    }}
    location @nocert {{
      internal;
      default_type application/grpc;
      add_header grpc-status 16 always;
      add_header grpc-message "client certificate required" always;
      return 204;
    }}
  }}
}}
"""


@contextlib.contextmanager
def proxy(
    mode: str,
    d: Path,
    upstream: int,
    pki: Pki,
    keys: Mapping[str, Sequence[str]] | None = None,
) -> Iterator[Proxy]:
    """nginx in front of ``upstream`` in ``mode`` (tls, mtls or apikey)."""
    d.mkdir(parents=True, exist_ok=True)
    binary = nginx()
    for attempt in range(3):
        port = free_port()
        conf = d / "nginx.conf"
        conf.write_text(_config(mode, d, port, upstream, pki, keys or {}))
        log = d / "nginx.out"
        with log.open("wb") as out:
            proc = subprocess.Popen(
                [binary, "-c", str(conf), "-p", str(d)],
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        try:
            wait_for_port(port, proc, log, 30)
        except RuntimeError as exc:
            _stop(proc)
            if attempt == 2:
                err = (d / "error.log").read_text()[-2000:]
                raise RuntimeError(f"nginx: {exc}\n{err}") from None
            continue
        try:
            yield Proxy(mode, port, d)
        finally:
            _stop(proc)
        return
