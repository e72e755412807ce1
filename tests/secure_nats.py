"""A real nats-server as a production bus is set up: mutual TLS from a throwaway CA and
credentials a client signs in with (a pytest fixture module, loaded by ``tests/conftest.py``).

``secure_nats`` runs each test that uses it twice, once per way of signing in:

- ``creds``: operator mode, the chain of trust ``nsc`` makes (operator → account → user JWTs,
  :mod:`tests.nats_auth`), the user's JWT and seed in a creds file, as on Kubernetes;
- ``nkey``: an nkey-only user listed in the server's configuration, its seed in a file (an
  operator-mode server lists no users, hence a server of its own).

Both servers listen on 127.0.0.1 only, require a client certificate of the CA (``verify``)
and run JetStream. :class:`SecureNats` gives the same access as settings, ``goodput`` flags
and the ``GOODPUT_NATS_*`` environment, and a credential the server does not know.
"""

from __future__ import annotations

import shutil
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import nkeys
import pytest

from goodput.bus import BusSettings
from goodput.bus.embedded import free_port, nats_server_binary
from goodput.bus.settings import settings_to_env
from tests.nats_auth import Operator, new_key
from tests.processes import stop

AUTH_KINDS = ("creds", "nkey")
#: a loaded two-core machine starts nats-server in well under this
SERVER_START_S = 20.0


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


@dataclass(frozen=True)
class Certificates:
    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path


def make_certificates(directory: Path) -> Certificates:
    """A CA (ECDSA P-256, one day), a server certificate for 127.0.0.1 and localhost, and a
    client certificate, both signed by it."""
    if shutil.which("openssl") is None:
        pytest.skip("openssl is needed to make the test certificates")
    directory.mkdir(parents=True)
    ec = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes")
    _openssl("req", "-x509", *ec, "-keyout", "ca.key", "-out", "ca.crt", "-days", "1",
             "-subj", "/CN=goodput test CA", cwd=directory)  # fmt: skip
    uses = {
        "server": "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n",
        "client": "extendedKeyUsage=clientAuth\n",
    }
    for name, extensions in uses.items():
        _openssl("req", *ec, "-keyout", f"{name}.key", "-out", f"{name}.csr",
                 "-subj", f"/CN=goodput test {name}", cwd=directory)  # fmt: skip
        (directory / f"{name}.ext").write_text(extensions)
        _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
                 "-CAcreateserial", "-out", f"{name}.crt", "-days", "1",
                 "-extfile", f"{name}.ext", cwd=directory)  # fmt: skip
    return Certificates(
        ca=directory / "ca.crt",
        server_cert=directory / "server.crt",
        server_key=directory / "server.key",
        client_cert=directory / "client.crt",
        client_key=directory / "client.key",
    )


@dataclass(frozen=True)
class SecureNats:
    """A running secure server and how to reach it."""

    #: "creds" or "nkey"
    auth: str
    url: str
    tls: Certificates
    #: the creds file or nkey seed file the server accepts
    credential: Path
    #: a credential of the same kind the server does not know (another operator's user,
    #: an nkey it does not list)
    stranger: Path
    log: Path

    def settings(self, credential: Path | None = None) -> BusSettings:
        """Bus settings with ``credential`` (default: the accepted one) and the client
        certificate."""
        field = "creds_file" if self.auth == "creds" else "nkey_seed_file"
        return BusSettings(
            url=self.url,
            tls_ca_file=str(self.tls.ca),
            tls_cert_file=str(self.tls.client_cert),
            tls_key_file=str(self.tls.client_key),
            **{field: str(credential or self.credential)},
        )

    def flags(self, credential: Path | None = None) -> list[str]:
        """The same, as ``goodput`` command-line flags."""
        settings = self.settings(credential)
        return [
            *("--nats-url", settings.url, "--nats-tls-ca", settings.tls_ca_file),
            *("--nats-tls-cert", settings.tls_cert_file, "--nats-tls-key", settings.tls_key_file),
            *(("--nats-creds", settings.creds_file) if settings.creds_file else ()),
            *(("--nats-nkey", settings.nkey_seed_file) if settings.nkey_seed_file else ()),
        ]

    def env(self, credential: Path | None = None) -> dict[str, str]:
        """The same, as the ``GOODPUT_NATS_*`` environment a rank reads."""
        return settings_to_env(self.settings(credential))


def _credentials(auth: str, directory: Path) -> tuple[str, Path, Path]:
    """The server's authentication lines, the accepted credential and a stranger's."""
    accepted, stranger = directory / f"goodput.{auth}", directory / f"stranger.{auth}"
    if auth == "creds":
        operator = Operator.create()
        accepted.write_text(operator.user_creds())
        stranger.write_text(Operator.create().user_creds("stranger"))
        lines = operator.server_config()
    else:
        user = new_key(nkeys.PREFIX_BYTE_USER)
        accepted.write_text(user.seed.decode() + "\n")
        stranger.write_text(new_key(nkeys.PREFIX_BYTE_USER).seed.decode() + "\n")
        lines = f"authorization {{ users: [ {{ nkey: {user.public_key.decode()} }} ] }}\n"
    for path in (accepted, stranger):
        path.chmod(0o600)
    return lines, accepted, stranger


def _wait_ready(server: subprocess.Popen, log: Path) -> None:
    deadline = time.monotonic() + SERVER_START_S
    while "Server is ready" not in log.read_text():
        if server.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"nats-server did not start:\n{log.read_text()[-2000:]}")
        time.sleep(0.05)


@pytest.fixture(params=AUTH_KINDS)
def secure_nats(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[SecureNats]:
    """A nats-server requiring mutual TLS and, per parameter, a creds file or an nkey seed."""
    auth: str = request.param
    directory = tmp_path / f"secure-nats-{auth}"
    tls = make_certificates(directory / "tls")
    lines, accepted, stranger = _credentials(auth, directory)
    port = free_port()
    config = directory / "nats.conf"
    config.write_text(
        f'listen: "127.0.0.1:{port}"\n'
        f'jetstream {{ store_dir: "{directory / "store"}" }}\n'
        f'tls {{ cert_file: "{tls.server_cert}", key_file: "{tls.server_key}", '
        f'ca_file: "{tls.ca}", verify: true, timeout: 2 }}\n' + lines
    )
    log = directory / "nats-server.log"
    with open(log, "wb") as out:
        server = subprocess.Popen([nats_server_binary(), "-c", str(config)], stderr=out)
    try:
        _wait_ready(server, log)
        yield SecureNats(
            auth=auth,
            url=f"tls://127.0.0.1:{port}",
            tls=tls,
            credential=accepted,
            stranger=stranger,
            log=log,
        )
    finally:
        stop(server, timeout_s=10)
