"""Which failures of a first connection are refusals (one line, not retried): the decision
alone, on the errors nats-py and ssl raise (the live server: ``test_credentials.py``)."""

from __future__ import annotations

import ssl

import nats.errors
import pytest

from goodput.bus.connect_refusal import connect_refusal
from goodput.bus.settings import BusSettings

WITH_CERT = BusSettings(url="tls://bus:4222", tls_ca_file="ca.pem", tls_cert_file="c.pem")
WITHOUT_CERT = BusSettings(url="tls://bus:4222", tls_ca_file="ca.pem")
VERIFIES_CLIENTS = {"tls_required": True, "tls_verify": True}


@pytest.mark.parametrize(
    "lost", [ConnectionResetError("Connection lost"), BrokenPipeError(), ssl.SSLEOFError()]
)
def test_a_lost_handshake_without_the_certificate_the_server_verifies_is_a_refusal(
    lost: Exception,
) -> None:
    refused = connect_refusal(lost, WITHOUT_CERT, VERIFIES_CLIENTS)
    assert refused is not None and "requires a client certificate" in str(refused)
    assert "GOODPUT_NATS_TLS_CERT" in str(refused)


@pytest.mark.parametrize(
    ("settings", "info"),
    [
        (WITH_CERT, VERIFIES_CLIENTS),  # a server restarting mid-handshake
        (WITHOUT_CERT, {"tls_required": True}),  # a server that does not verify clients
        (WITHOUT_CERT, {}),  # no INFO read: nothing is known of the server
    ],
)
def test_a_lost_handshake_is_otherwise_retried(settings: BusSettings, info: dict) -> None:
    assert connect_refusal(ConnectionResetError(), settings, info) is None
    assert connect_refusal(ConnectionRefusedError(), settings, info) is None


def test_the_servers_authorization_error_is_a_refusal_naming_the_credential() -> None:
    refused = connect_refusal(
        nats.errors.Error("nats: 'Authorization Violation'"), WITH_CERT, VERIFIES_CLIENTS
    )
    assert str(refused).endswith("refused no credentials: Authorization Violation")
    assert connect_refusal(nats.errors.NoServersError(), WITH_CERT, {}) is None


def test_a_certificate_that_does_not_verify_is_a_refusal() -> None:
    refused = connect_refusal(ssl.SSLCertVerificationError("verify failed"), WITH_CERT, {})
    assert refused is not None and "TLS with the NATS server at tls://bus:4222 failed" in str(
        refused
    )
