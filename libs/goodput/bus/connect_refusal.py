"""Which failures of a first connection are a refusal (say it, do not retry) and which are the
server not being there yet (retry).

A client without a certificate, on a server that verifies clients, fails its TLS 1.3 handshake
only after the client has sent its CONNECT: the server's alert ("certificate required") races
the reset that the client's late write draws, and about four tries in ten end in a bare
"connection lost", the same as a server restarting. The server's INFO, read before the TLS
upgrade, says whether it verifies clients (``tls_verify``): with that and no certificate, the
refusal is certain whatever the socket said.
"""

from __future__ import annotations

import ssl
from typing import Any

import nats.errors

from goodput.bus.credentials import BusCredentialsError
from goodput.bus.settings import ENV_VARS, BusSettings

#: a connection that dropped mid-handshake: a server restarting, unless the INFO says otherwise
_LOST = (ssl.SSLEOFError, ssl.SSLZeroReturnError, ssl.SSLSyscallError, ConnectionError)


def connect_refusal(
    exc: BaseException, settings: BusSettings, server_info: dict[str, Any]
) -> BusCredentialsError | None:
    """The one-line error when ``exc`` means the server refused these settings; ``None`` when
    retrying may succeed. ``server_info``: the INFO the server sent before failing (may be
    empty)."""
    if isinstance(exc, nats.errors.Error):
        # the server's -ERR during the handshake ('Authorization Violation', 'Authentication
        # Expired'…) reaches the client as a plain nats error
        if not isinstance(exc, nats.errors.AuthorizationError) and not any(
            word in str(exc).lower() for word in ("authorization", "authentication")
        ):
            return None
        reason = str(exc).removeprefix("nats: ").strip("'")
        return BusCredentialsError(
            f"the NATS server at {settings.url} refused {settings.describe_auth()}: {reason}"
        )
    if isinstance(exc, _LOST):
        if server_info.get("tls_verify") and not settings.tls_cert_file:
            return BusCredentialsError(
                f"the NATS server at {settings.url} requires a client certificate and none is "
                f"set ({ENV_VARS['tls_cert_file']})"
            )
        return None
    if isinstance(exc, ssl.SSLError):  # a refused certificate: no retry makes it verify
        return BusCredentialsError(f"TLS with the NATS server at {settings.url} failed: {exc}")
    return None
