"""How every Headway component reaches Temporal: address, namespace, TLS (server CA,
client certificate and key, server name), API key, and which namespace each tenant
lives in.

One dataclass, :class:`ConnectionOptions`, built by :func:`load` from (first wins):

1. explicit values (CLI flags, SDK arguments),
2. ``HEADWAY_``-prefixed environment variables,
3. the ``TEMPORAL_`` environment variables of Temporal's own client configuration
   (``TEMPORAL_ADDRESS``, ``TEMPORAL_TLS_SERVER_CA_CERT_PATH``, ``TEMPORAL_API_KEY``, ...),
4. a Headway config file (``--config`` / ``HEADWAY_CONFIG``, YAML), its ``--profile`` /
   ``HEADWAY_PROFILE`` section over its top level,
5. the defaults (``localhost:7233``, namespace ``default``, no TLS).

The flag names are the ``temporal`` CLI's (``--tls``, ``--tls-ca-path``,
``--tls-cert-path``, ``--tls-key-path``, ``--tls-server-name``, ``--api-key``).

The tenant -> namespace mapping (``tenant-namespaces:`` in the file,
``HEADWAY_TENANT_NAMESPACES="a=ns-a b=ns-b"``) is configured once and read by the CLI,
the SDK and the workers alike: a tenant it names is always reached in its namespace, so
Temporal's authorization of that namespace decides who may touch the tenant.

Secrets never leave this module in text: ``repr`` and :meth:`ConnectionOptions.describe`
say "API key" but never print it, and errors name the setting, not its value.

Kept free of Temporal imports at module level (``headway --help`` stays fast).
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from temporalio.client import Client, Interceptor
    from temporalio.service import ConnectConfig, TLSConfig

__all__ = [
    "CONFIG_ENV",
    "DEFAULT_ADDRESS",
    "DEFAULT_NAMESPACE",
    "ENV",
    "PROFILE_ENV",
    "TENANT_NAMESPACES_ENV",
    "ConnectionOptions",
    "ConnectionSettingsError",
    "explain_failure",
    "load",
    "parse_tenant_namespaces",
]

DEFAULT_ADDRESS = "localhost:7233"
DEFAULT_NAMESPACE = "default"
CONFIG_ENV = "HEADWAY_CONFIG"
PROFILE_ENV = "HEADWAY_PROFILE"
TENANT_NAMESPACES_ENV = "HEADWAY_TENANT_NAMESPACES"

#: Each setting's environment variables, Headway's first, then Temporal's own
#: (the names of Temporal's client environment configuration).
ENV: dict[str, tuple[str, ...]] = {
    "address": ("HEADWAY_TEMPORAL_ADDRESS", "TEMPORAL_ADDRESS"),
    "namespace": ("HEADWAY_NAMESPACE", "TEMPORAL_NAMESPACE"),
    "tls": ("HEADWAY_TEMPORAL_TLS", "TEMPORAL_TLS"),
    "tls_ca_path": ("HEADWAY_TEMPORAL_TLS_CA_PATH", "TEMPORAL_TLS_SERVER_CA_CERT_PATH"),
    "tls_cert_path": ("HEADWAY_TEMPORAL_TLS_CERT_PATH", "TEMPORAL_TLS_CLIENT_CERT_PATH"),
    "tls_key_path": ("HEADWAY_TEMPORAL_TLS_KEY_PATH", "TEMPORAL_TLS_CLIENT_KEY_PATH"),
    "tls_server_name": ("HEADWAY_TEMPORAL_TLS_SERVER_NAME", "TEMPORAL_TLS_SERVER_NAME"),
    "api_key": ("HEADWAY_TEMPORAL_API_KEY", "TEMPORAL_API_KEY"),
}

#: The flag of each setting (errors name it the way the user typed it).
FLAGS: dict[str, str] = {
    "address": "--address",
    "namespace": "--namespace",
    "tls": "--tls",
    "tls_ca_path": "--tls-ca-path",
    "tls_cert_path": "--tls-cert-path",
    "tls_key_path": "--tls-key-path",
    "tls_server_name": "--tls-server-name",
    "api_key": "--api-key",
}

#: Keys of a config file (or of one of its profiles).
_FILE_KEYS = {name.replace("_", "-"): name for name in FLAGS} | {
    "api-key-file": "api_key_file",
    "tenant-namespaces": "tenant_namespaces",
}

_NAMESPACE = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9._]*[A-Za-z0-9])?")


class ConnectionSettingsError(ValueError):
    """A connection setting is wrong (the message names it and, unless secret, its value)."""


@dataclass(frozen=True)
class ConnectionOptions:
    """Where and how to reach Temporal. Immutable and hashable (a cache key)."""

    address: str = DEFAULT_ADDRESS
    namespace: str = DEFAULT_NAMESPACE
    #: None: TLS when any TLS file or an API key is given (Temporal's own default).
    tls: bool | None = None
    tls_ca_path: str | None = None
    tls_cert_path: str | None = None
    tls_key_path: str | None = None
    tls_server_name: str | None = None
    api_key: str | None = field(default=None, repr=False)
    #: (tenant, namespace) pairs: where each mapped tenant lives.
    tenant_namespaces: tuple[tuple[str, str], ...] = ()
    #: Whether ``namespace`` was given (flag, env) rather than defaulted.
    namespace_given: bool = field(default=False, compare=False)

    def __repr__(self) -> str:
        return f"ConnectionOptions({self.describe()})"

    # --- what it says -------------------------------------------------------------------

    @property
    def uses_tls(self) -> bool:
        if self.tls is not None:
            return self.tls
        return bool(self.tls_ca_path or self.tls_cert_path or self.tls_key_path or self.api_key)

    def describe(self) -> str:
        """``host:port (namespace ns, TLS, client certificate, API key)``: what it uses,
        never a secret."""
        parts = [f"namespace {self.namespace}"]
        if self.uses_tls:
            parts.append("TLS" + (f" as {self.tls_server_name}" if self.tls_server_name else ""))
        if self.tls_cert_path:
            parts.append("client certificate")
        if self.api_key:
            parts.append("API key")
        return f"{self.address} ({', '.join(parts)})"

    # --- tenants ------------------------------------------------------------------------

    @property
    def tenant_map(self) -> dict[str, str]:
        return dict(self.tenant_namespaces)

    def namespace_for(self, tenant: str) -> str:
        """The namespace ``tenant`` lives in: its mapping, else this connection's."""
        return self.tenant_map.get(tenant, self.namespace)

    def for_tenant(self, tenant: str) -> ConnectionOptions:
        """These options in ``tenant``'s namespace.

        Raises:
            ConnectionSettingsError: a namespace was given that is not the tenant's.
        """
        mapped = self.tenant_map.get(tenant)
        if mapped is None or mapped == self.namespace:
            return self
        if self.namespace_given:
            raise ConnectionSettingsError(
                f"--namespace: {self.namespace!r} is not tenant {tenant!r}'s namespace "
                f"(it lives in {mapped!r} per tenant-namespaces); drop --namespace or "
                "give the tenant's"
            )
        return dataclasses.replace(self, namespace=mapped)

    def tenants_of(self, tenants: Sequence[str]) -> dict[str, list[str]]:
        """``tenants`` grouped by their namespace, in order."""
        out: dict[str, list[str]] = {}
        for t in tenants:
            out.setdefault(self.namespace_for(t), []).append(t)
        return out

    # --- connecting ---------------------------------------------------------------------

    def tls_config(self) -> bool | TLSConfig:
        """What ``Client.connect(tls=...)`` takes; files are read now (an unreadable one
        is a :class:`ConnectionSettingsError` naming its flag)."""
        from temporalio.service import TLSConfig

        if not self.uses_tls:
            return False
        if bool(self.tls_cert_path) != bool(self.tls_key_path):
            given, missing = (
                ("--tls-cert-path", "--tls-key-path")
                if self.tls_cert_path
                else ("--tls-key-path", "--tls-cert-path")
            )
            raise ConnectionSettingsError(f"{given} is given but {missing} is not: give both")
        if not (self.tls_ca_path or self.tls_cert_path or self.tls_server_name):
            return True  # the system's roots, no client certificate
        return TLSConfig(
            server_root_ca_cert=_read("tls_ca_path", self.tls_ca_path),
            client_cert=_read("tls_cert_path", self.tls_cert_path),
            client_private_key=_read("tls_key_path", self.tls_key_path),
            domain=self.tls_server_name,
        )

    def connect_config(self) -> ConnectConfig:
        """A :class:`temporalio.service.ConnectConfig` (for ``ServiceClient.connect``)."""
        from temporalio.service import ConnectConfig

        return ConnectConfig(target_host=self.address, tls=self.tls_config(), api_key=self.api_key)

    async def connect(
        self,
        *,
        timeout_s: float | None = None,
        interceptors: Sequence[Interceptor] | None = None,
    ) -> Client:
        """A Temporal client with Headway's data converter and telemetry interceptors.

        Raises:
            ConnectionSettingsError: a setting is wrong before anything is sent.
            TimeoutError: no answer in ``timeout_s``.
            Exception: whatever the transport raised (:func:`explain_failure` makes a
                line of it).
        """
        from headway import protocol, telemetry
        from temporalio.client import Client

        tls = self.tls_config()
        coro = Client.connect(
            self.address,
            namespace=self.namespace,
            tls=tls,
            api_key=self.api_key,
            interceptors=list(interceptors)
            if interceptors is not None
            else telemetry.interceptors(),
            data_converter=protocol.data_converter(),
        )
        if timeout_s is None:
            return await coro
        return await asyncio.wait_for(coro, timeout_s)


def _read(name: str, path: str | None) -> bytes | None:
    if not path:
        return None
    try:
        return Path(path).expanduser().read_bytes()
    except OSError as exc:
        raise ConnectionSettingsError(
            f"{FLAGS[name]}: cannot read {path!r} ({exc.strerror or exc})"
        ) from None


# --- loading ----------------------------------------------------------------------------


def parse_tenant_namespaces(raw: str | Sequence[str], where: str) -> dict[str, str]:
    """``"a=ns-a b=ns-b"`` (or a list of ``a=ns-a``) as a mapping; an entry that is not
    ``tenant=namespace`` is an error naming ``where`` and the entry."""
    items = raw.replace(",", " ").split() if isinstance(raw, str) else list(raw)
    out: dict[str, str] = {}
    for item in items:
        tenant, sep, ns = item.partition("=")
        if not sep or not tenant.strip() or not _NAMESPACE.fullmatch(ns.strip()):
            raise ConnectionSettingsError(
                f"{where}: {item!r} is not tenant=namespace (e.g. team-a=team-a-prod)"
            )
        out[tenant.strip()] = ns.strip()
    return out


def _bool(name: str, value: Any, where: str) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("0", "false", "no", "off"):
        return False
    raise ConnectionSettingsError(f"{where}: {value!r} is not true or false")


def _from_env(env: Mapping[str, str]) -> tuple[dict[str, Any], dict[str, str]]:
    """Settings found in ``env`` and the variable each came from."""
    found: dict[str, Any] = {}
    source: dict[str, str] = {}
    for name, names in ENV.items():
        for var in names:
            value = env.get(var)
            if value:
                found[name] = _bool(name, value, var) if name == "tls" else value
                source[name] = var
                break
    return found, source


def _from_file(path: str, profile: str | None) -> dict[str, Any]:
    """The settings of a config file: its top level, then ``profiles.<profile>`` over it."""
    import yaml

    try:
        doc = yaml.safe_load(Path(path).expanduser().read_text()) or {}
    except OSError as exc:
        raise ConnectionSettingsError(
            f"--config: cannot read {path!r} ({exc.strerror or exc})"
        ) from None
    except yaml.YAMLError as exc:
        raise ConnectionSettingsError(
            f"--config: {path!r} is not YAML ({' '.join(str(exc).split())[:120]})"
        ) from None
    if not isinstance(doc, dict):
        raise ConnectionSettingsError(f"--config: {path!r} is not a mapping of settings")
    profiles = doc.pop("profiles", None) or {}
    out = _file_section(doc, f"{path}")
    if profile is not None:
        if not isinstance(profiles, dict) or profile not in profiles:
            names = ", ".join(sorted(profiles)) if isinstance(profiles, dict) else ""
            raise ConnectionSettingsError(
                f"--profile: {profile!r} is not a profile of {path} (profiles: {names or 'none'})"
            )
        out.update(_file_section(profiles[profile] or {}, f"{path} profile {profile}"))
    return out


def _file_section(section: Any, where: str) -> dict[str, Any]:
    if not isinstance(section, dict):
        raise ConnectionSettingsError(f"--config: {where} is not a mapping of settings")
    out: dict[str, Any] = {}
    for key, value in section.items():
        name = _FILE_KEYS.get(str(key))
        if name is None:
            raise ConnectionSettingsError(
                f"--config: {where}: {key!r} is not a setting (one of "
                f"{', '.join(sorted(_FILE_KEYS))})"
            )
        if name == "tls":
            out[name] = _bool(name, value, f"{where}: tls")
        elif name == "tenant_namespaces":
            if not isinstance(value, dict):
                raise ConnectionSettingsError(
                    f"--config: {where}: tenant-namespaces must map tenant: namespace"
                )
            out[name] = parse_tenant_namespaces(
                [f"{t}={n}" for t, n in value.items()], f"{where}: tenant-namespaces"
            )
        elif name == "api_key_file":
            out["api_key"] = _read_secret(str(value), f"{where}: api-key-file")
        else:
            out[name] = str(value)
    return out


def _read_secret(path: str, where: str) -> str:
    try:
        return Path(path).expanduser().read_text().strip()
    except OSError as exc:
        raise ConnectionSettingsError(
            f"--config: {where}: cannot read {path!r} ({exc.strerror or exc})"
        ) from None


def load(
    *,
    address: str | None = None,
    namespace: str | None = None,
    tls: bool | None = None,
    tls_ca_path: str | None = None,
    tls_cert_path: str | None = None,
    tls_key_path: str | None = None,
    tls_server_name: str | None = None,
    api_key: str | None = None,
    config: str | None = None,
    profile: str | None = None,
    tenant_namespaces: Mapping[str, str] | None = None,
    env: Mapping[str, str] | None = None,
) -> ConnectionOptions:
    """The options from explicit values, then the environment, then the config file.

    Raises:
        ConnectionSettingsError: a setting, the file or a profile is wrong (named).
    """
    env = os.environ if env is None else env
    explicit = {
        k: v
        for k, v in {
            "address": address,
            "namespace": namespace,
            "tls": tls,
            "tls_ca_path": tls_ca_path,
            "tls_cert_path": tls_cert_path,
            "tls_key_path": tls_key_path,
            "tls_server_name": tls_server_name,
            "api_key": api_key,
        }.items()
        if v is not None and v != ""
    }
    from_env, _ = _from_env(env)
    config = config or env.get(CONFIG_ENV) or None
    profile = profile or env.get(PROFILE_ENV) or None
    if profile is not None and config is None:
        raise ConnectionSettingsError(
            f"--profile: {profile!r} needs a config file (--config or {CONFIG_ENV})"
        )
    from_file = _from_file(config, profile) if config else {}
    merged: dict[str, Any] = {**from_file, **from_env, **explicit}
    mapping = dict(from_file.get("tenant_namespaces", {}))
    if env.get(TENANT_NAMESPACES_ENV):
        mapping.update(parse_tenant_namespaces(env[TENANT_NAMESPACES_ENV], TENANT_NAMESPACES_ENV))
    if tenant_namespaces:
        mapping.update(tenant_namespaces)
    merged.pop("tenant_namespaces", None)
    given = "namespace" in explicit or "namespace" in from_env
    opts = ConnectionOptions(
        **merged, tenant_namespaces=tuple(sorted(mapping.items())), namespace_given=given
    )
    _check(opts)
    return opts


def _check(opts: ConnectionOptions) -> None:
    host, sep, port = opts.address.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ConnectionSettingsError(f"--address: {opts.address!r} is not host:port")
    if not _NAMESPACE.fullmatch(opts.namespace):
        raise ConnectionSettingsError(f"--namespace: {opts.namespace!r} is not a namespace name")
    if opts.tls is False and (opts.tls_ca_path or opts.tls_cert_path):
        raise ConnectionSettingsError(
            "--tls: TLS is turned off but TLS files are given (--tls-ca-path/--tls-cert-path)"
        )


# --- failures as one line ---------------------------------------------------------------


def explain_failure(opts: ConnectionOptions, exc: BaseException) -> str:
    """What went wrong reaching ``opts``, in one line naming the setting to fix (the
    transport's own text spans a screen, and may quote what was sent)."""
    if isinstance(exc, ConnectionSettingsError):
        return str(exc)
    if isinstance(exc, TimeoutError):
        return f"cannot reach Temporal at {opts.address}: no answer"
    failure = _Failure.of(opts, exc)
    # First match wins: credentials before TLS before the network, the most specific
    # diagnosis first (a refused certificate also mentions "certificate").
    for explain in _EXPLANATIONS:
        line = explain(failure)
        if line is not None:
            return line
    text = failure.text
    if "tls" in failure.low or "ssl" in failure.low or "certificate" in failure.low:
        return f"TLS to {opts.address} failed: {text[:160]}"
    first = text or type(exc).__name__
    return f"cannot reach Temporal at {opts.address} ({first[:160]})"


@dataclass(frozen=True)
class _Failure:
    """A failure to reach Temporal as the explanations below read it."""

    opts: ConnectionOptions
    exc: BaseException
    #: The failure's text on one line, the API key masked.
    text: str
    #: ``text`` in lower case, for matching.
    low: str
    #: The gRPC status's name (``PERMISSION_DENIED``, ...), or "".
    status_name: str

    @classmethod
    def of(cls, opts: ConnectionOptions, exc: BaseException) -> _Failure:
        text = " ".join(str(exc).split())
        if opts.api_key:
            text = text.replace(opts.api_key, "***")
        status = getattr(exc, "status", None)
        status_name = getattr(status, "name", "") or ""
        return cls(opts, exc, text, text.lower(), status_name)

    @property
    def where(self) -> str:
        return f"Temporal at {self.opts.address}"

    def says(self, *needles: str) -> bool:
        return any(n in self.low for n in needles)


def _permission_denied(f: _Failure) -> str | None:
    if f.status_name != "PERMISSION_DENIED" and not f.says("permission denied", "permissiondenied"):
        return None
    return (
        f"{f.where} refused namespace {f.opts.namespace!r} to these credentials "
        f"({_server_message(f.exc, f.text)}): the API key or certificate is not granted it"
    )


def _unauthenticated(f: _Failure) -> str | None:
    if f.status_name != "UNAUTHENTICATED" and not f.says("unauthenticated", "401 unauthorized"):
        return None
    opts, where = f.opts, f.where
    said = _server_message(f.exc, f.text)
    if "certificate" in said.lower():
        if opts.tls_cert_path:
            return (
                f"{where} rejected the client certificate of --tls-cert-path "
                f"{opts.tls_cert_path} ({said})"
            )
        return (
            f"{where} requires a client certificate ({said}): give --tls-cert-path and "
            "--tls-key-path (env HEADWAY_TEMPORAL_TLS_CERT_PATH, _KEY_PATH)"
        )
    if opts.api_key:
        return f"{where} rejected the API key of --api-key / HEADWAY_TEMPORAL_API_KEY ({said})"
    return (
        f"{where} requires credentials ({said}): give --api-key (env "
        "HEADWAY_TEMPORAL_API_KEY) or a client certificate (--tls-cert-path, --tls-key-path)"
    )


def _server_certificate(f: _Failure) -> str | None:
    """The server's certificate is not trusted, or does not name the host."""
    opts = f.opts
    if f.says("unknownissuer", "unknown issuer") and not opts.tls_ca_path:
        return (
            f"TLS to {opts.address}: the server's certificate is not signed by a CA this "
            "host trusts: give its CA with --tls-ca-path (env HEADWAY_TEMPORAL_TLS_CA_PATH)"
        )
    for needle, gist in (
        ("unknownissuer", f"is not signed by the CA of --tls-ca-path {opts.tls_ca_path}"),
        ("unknown issuer", f"is not signed by the CA of --tls-ca-path {opts.tls_ca_path}"),
        ("certificate verify failed", "is not signed by the CA of --tls-ca-path"),
        ("notvalidforname", "does not name this host: set --tls-server-name"),
        ("not valid for name", "does not name this host: set --tls-server-name"),
        ("certificate is not valid", "is not valid for this host: set --tls-server-name"),
    ):
        if needle in f.low:
            return f"TLS to {opts.address}: the server's certificate {gist}"
    return None


def _client_certificate(f: _Failure) -> str | None:
    if not f.says(
        "certificate required",
        "certificaterequired",
        "handshake failure",
        "bad certificate",
        "badcertificate",
        "no required ssl certificate",
        "400 bad request",
    ):
        return None
    return (
        f"TLS to {f.opts.address}: the server did not accept the client certificate "
        "(give a valid --tls-cert-path and --tls-key-path)"
    )


def _tls_mismatch(f: _Failure) -> str | None:
    """TLS on one side only: spoken to a plain server, or left off for a TLS one."""
    address = f.opts.address
    if f.opts.uses_tls and f.says("invalidcontenttype", "corrupt message", "wrong version number"):
        return (
            f"TLS to {address} failed: the server does not speak TLS there ({_tls_off(f.opts)}, "
            "or point --address at its TLS port)"
        )
    if not f.opts.uses_tls and f.says(
        "connection reset",
        "broken pipe",
        "h2 protocol",
        "frame with invalid size",
        "operation was canceled",
    ):
        return (
            f"cannot talk to Temporal at {address}: it closed the connection; does it "
            "require TLS? (--tls, --tls-ca-path)"
        )
    return None


def _tls_off(opts: ConnectionOptions) -> str:
    """How to turn TLS off: it was asked for, or implied by a setting that needs it."""
    if opts.tls:
        return "drop --tls"
    implied = [
        flag
        for flag, value in (
            ("--api-key", opts.api_key),
            ("--tls-ca-path", opts.tls_ca_path),
            ("--tls-cert-path", opts.tls_cert_path),
            ("--tls-key-path", opts.tls_key_path),
        )
        if value
    ]
    return f"TLS is on because of {', '.join(implied)}: give --no-tls"


def _unreachable(f: _Failure) -> str | None:
    for needle, gist in (
        ("connection refused", "connection refused"),
        ("dns error", "unknown host"),
        ("failed to lookup", "unknown host"),
        ("name or service not known", "unknown host"),
        ("timed out", "timed out"),
        ("invalid uri", "not a host:port address"),
        ("invalid authority", "not a host:port address"),
    ):
        if needle in f.low:
            return f"cannot reach Temporal at {f.opts.address} ({gist})"
    return None


def _missing_namespace(f: _Failure) -> str | None:
    if "namespace" not in f.low or not ("not found" in f.low or f.status_name == "NOT_FOUND"):
        return None
    return (
        f"namespace {f.opts.namespace!r} does not exist on Temporal at {f.opts.address} "
        "(--namespace, or the tenant's entry in tenant-namespaces)"
    )


_EXPLANATIONS: tuple[Callable[[_Failure], str | None], ...] = (
    _permission_denied,
    _unauthenticated,
    _server_certificate,
    _client_certificate,
    _tls_mismatch,
    _unreachable,
    _missing_namespace,
)


def _server_message(exc: BaseException, text: str) -> str:
    """The server's own message in a failure (short; it names no secret)."""
    said = getattr(exc, "message", None)
    if not isinstance(said, str) or not said:
        found = re.search(r'message: "([^"]*)"', text)
        said = found.group(1) if found else ""
    said = " ".join(said.split())
    return (said[:117] + "...") if len(said) > 120 else said or "no reason given"
