"""Which one line a transport failure becomes (no server): each diagnosis, in the order
they are tried, from the text and gRPC status Temporal's client raises."""

from __future__ import annotations

import pytest
from headway.connection import ConnectionOptions, ConnectionSettingsError, explain_failure

PLAIN = ConnectionOptions(address="temporal.example:7233")
TLS = ConnectionOptions(address="temporal.example:7233", tls=True)
WITH_CA = ConnectionOptions(address="temporal.example:7233", tls_ca_path="/ca.pem")
WITH_CERT = ConnectionOptions(
    address="temporal.example:7233", tls_cert_path="/c.pem", tls_key_path="/k.pem"
)
WITH_KEY = ConnectionOptions(address="temporal.example:7233", api_key="hwk-secret-1234")


class _Status:
    def __init__(self, name: str) -> None:
        self.name = name


class _RPCError(Exception):
    """The shape of ``temporalio.service.RPCError`` that the explanations read."""

    def __init__(self, text: str, status: str | None = None, message: str | None = None) -> None:
        super().__init__(text)
        if status is not None:
            self.status = _Status(status)
        if message is not None:
            self.message = message


CASES = [
    pytest.param(
        PLAIN,
        _RPCError("denied", "PERMISSION_DENIED", "no access"),
        "refused namespace 'default' to these credentials (no access)",
        id="permission-denied-names-the-namespace",
    ),
    pytest.param(
        WITH_CERT,
        _RPCError("x", "UNAUTHENTICATED", "bad certificate chain"),
        "rejected the client certificate of --tls-cert-path /c.pem",
        id="unauthenticated-certificate-names-the-cert-path",
    ),
    pytest.param(
        PLAIN,
        _RPCError("x", "UNAUTHENTICATED", "client certificate needed"),
        "requires a client certificate (client certificate needed): give --tls-cert-path",
        id="unauthenticated-without-a-certificate-asks-for-one",
    ),
    pytest.param(
        WITH_KEY,
        _RPCError("401 Unauthorized"),
        "rejected the API key of --api-key / HEADWAY_TEMPORAL_API_KEY",
        id="unauthenticated-with-a-key-blames-the-key",
    ),
    pytest.param(
        PLAIN,
        _RPCError("Unauthenticated"),
        "requires credentials (no reason given): give --api-key",
        id="unauthenticated-without-credentials-asks-for-them",
    ),
    pytest.param(
        TLS,
        _RPCError("invalid peer certificate: UnknownIssuer"),
        "not signed by a CA this host trusts: give its CA with --tls-ca-path",
        id="unknown-issuer-without-a-ca-asks-for-one",
    ),
    pytest.param(
        WITH_CA,
        _RPCError("invalid peer certificate: UnknownIssuer"),
        "is not signed by the CA of --tls-ca-path /ca.pem",
        id="unknown-issuer-with-a-ca-names-it",
    ),
    pytest.param(
        TLS,
        _RPCError("invalid peer certificate: NotValidForName"),
        "does not name this host: set --tls-server-name",
        id="wrong-host-name-asks-for-a-server-name",
    ),
    pytest.param(
        TLS,
        _RPCError("received fatal alert: CertificateRequired"),
        "the server did not accept the client certificate",
        id="client-certificate-required",
    ),
    pytest.param(
        TLS,
        _RPCError("received corrupt message of type InvalidContentType"),
        "the server does not speak TLS there (drop --tls",
        id="tls-to-a-plain-server",
    ),
    pytest.param(
        WITH_KEY,
        _RPCError("received corrupt message of type InvalidContentType"),
        "does not speak TLS there (TLS is on because of --api-key: give --no-tls",
        id="tls-implied-by-an-api-key-to-a-plain-server-says-how-to-turn-it-off",
    ),
    pytest.param(
        PLAIN,
        _RPCError("h2 protocol error: connection reset"),
        "it closed the connection; does it require TLS?",
        id="plain-to-a-tls-server",
    ),
    pytest.param(
        TLS,
        _RPCError("h2 protocol error: connection reset"),
        "cannot reach Temporal at temporal.example:7233 (",
        id="a-reset-with-tls-is-not-blamed-on-tls",
    ),
    pytest.param(
        PLAIN,
        _RPCError("tcp connect error: Connection refused (os error 111)"),
        "cannot reach Temporal at temporal.example:7233 (connection refused)",
        id="connection-refused",
    ),
    pytest.param(
        PLAIN,
        _RPCError("dns error: failed to lookup address information"),
        "cannot reach Temporal at temporal.example:7233 (unknown host)",
        id="unknown-host",
    ),
    pytest.param(
        PLAIN,
        _RPCError("Namespace hw-x is not found.", "NOT_FOUND"),
        "namespace 'default' does not exist on Temporal at temporal.example:7233",
        id="missing-namespace",
    ),
    pytest.param(
        TLS,
        _RPCError("some ssl trouble"),
        "TLS to temporal.example:7233 failed: some ssl trouble",
        id="other-tls-trouble-quotes-it",
    ),
    pytest.param(
        PLAIN,
        _RPCError(""),
        "cannot reach Temporal at temporal.example:7233 (_RPCError)",
        id="no-text-names-the-exception-type",
    ),
    pytest.param(
        PLAIN,
        TimeoutError(),
        "cannot reach Temporal at temporal.example:7233: no answer",
        id="timeout",
    ),
    pytest.param(
        PLAIN,
        ConnectionSettingsError("--address: 'x' is not host:port"),
        "--address: 'x' is not host:port",
        id="a-settings-error-is-its-own-line",
    ),
]


@pytest.mark.parametrize(("opts", "exc", "expected"), CASES)
def test_a_failure_is_one_line_naming_what_to_fix(
    opts: ConnectionOptions, exc: BaseException, expected: str
) -> None:
    line = explain_failure(opts, exc)
    assert expected in line
    assert "\n" not in line


def test_the_api_key_is_masked_in_what_is_quoted() -> None:
    exc = _RPCError("ssl failure sending hwk-secret-1234 to the server")
    line = explain_failure(WITH_KEY, exc)
    assert "hwk-secret-1234" not in line
    assert "***" in line
