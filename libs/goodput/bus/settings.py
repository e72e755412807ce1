"""How to reach the bus, and the rule that a shared bus must be authenticated."""

from __future__ import annotations

import ipaddress
import os
import socket
import ssl
from collections.abc import Mapping
from pathlib import Path
from typing import Any
from urllib.parse import SplitResult, urlsplit

import msgspec

from goodput.bus.credentials import BusCredentialsError, BusSettingsError, check_signing_files


class InsecureBusError(BusSettingsError):
    """Refusal to talk to a non-loopback bus without authentication."""


#: the environment variable of each setting; services, CLI commands and the trainer shim all
#: read these (:func:`settings_from_env`), and the actuator hands them to the ranks
#: (:func:`settings_to_env`)
ENV_VARS: dict[str, str] = {
    "url": "GOODPUT_NATS_URL",
    "creds_file": "GOODPUT_NATS_CREDS",
    "nkey_seed_file": "GOODPUT_NATS_NKEY",
    "user": "GOODPUT_NATS_USER",
    "password": "GOODPUT_NATS_PASSWORD",
    "token": "GOODPUT_NATS_TOKEN",
    "tls_ca_file": "GOODPUT_NATS_TLS_CA",
    "tls_cert_file": "GOODPUT_NATS_TLS_CERT",
    "tls_key_file": "GOODPUT_NATS_TLS_KEY",
    "insecure": "GOODPUT_INSECURE",
    "replicas": "GOODPUT_NATS_REPLICAS",
}
#: the settings that name files (credentials, keys, certificates)
FILE_FIELDS = ("creds_file", "nkey_seed_file", "tls_ca_file", "tls_cert_file", "tls_key_file")
#: the settings that are secrets themselves, not paths to them
SECRET_FIELDS = ("password", "token")


#: the port of a server URL that names none (NATS's client port)
NATS_PORT = 4222


class BusSettings(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    url: str = f"nats://127.0.0.1:{NATS_PORT}"
    #: NATS credentials file (JWT + nkey seed), as issued by `nsc`
    creds_file: str = ""
    #: file holding an nkey seed (for nkey-only authentication)
    nkey_seed_file: str = ""
    user: str = ""
    password: str = ""
    token: str = ""
    tls_ca_file: str = ""
    tls_cert_file: str = ""
    tls_key_file: str = ""
    #: allow a non-loopback bus without authentication (explicit opt-in)
    insecure: bool = False
    #: copies of every stream and KV bucket (JetStream replicas); 0: :func:`stream_replicas`
    #: decides from the server (3 in a cluster of three or more, else one per server)
    replicas: int = 0

    @property
    def authenticated(self) -> bool:
        return bool(
            self.creds_file or self.nkey_seed_file or self.token or (self.user and self.password)
        )

    def check_security(self) -> None:
        """Refuse an unauthenticated bus that other hosts can reach, unless told to."""
        if self.insecure or self.authenticated:
            return
        non_loopback = [host for host in self.hosts() if not is_loopback(host)]
        if non_loopback:
            raise InsecureBusError(
                f"refusing to use the NATS server at {', '.join(non_loopback)} without "
                "authentication: anyone who can reach it could stop or corrupt the training job. "
                "Pass --nats-creds FILE (or --nats-nkey FILE / a user and password), ideally with "
                "--nats-tls-ca, or --insecure if this network is trusted."
            )

    def check_credentials(self) -> None:
        """Refuse credential paths that do not exist, and a creds file or nkey seed that
        cannot sign in (:mod:`goodput.bus.credentials`): one line, early."""
        for field in FILE_FIELDS:
            path = getattr(self, field)
            if path and not Path(path).is_file():
                raise BusCredentialsError(f"{field.replace('_', ' ')} {path!r} does not exist")
        check_signing_files(self.creds_file, self.nkey_seed_file)

    def describe(self) -> str:
        """How this connects, without secrets: for log lines."""
        tls = f", TLS CA {self.tls_ca_file}" if self.tls_ca_file else ""
        return f"{self.url} with {self.describe_auth()}{tls}"

    def describe_auth(self) -> str:
        """The credentials this signs in with, without secrets."""
        if self.creds_file:
            return f"creds file {self.creds_file}"
        if self.nkey_seed_file:
            return f"nkey seed {self.nkey_seed_file}"
        if self.user:
            return f"user {self.user!r}" + ("" if self.password else " without a password")
        if self.token:
            return "a token"
        return "no credentials"

    def _servers(self) -> list[SplitResult]:
        return [urlsplit(u.strip()) for u in self.url.split(",") if u.strip()]

    def hosts(self) -> list[str]:
        return [server.hostname or "" for server in self._servers()]

    def ports(self) -> frozenset[int]:
        """The servers' ports (``nats://a:4222,nats://b:4223``: both; none named: 4222)."""
        return frozenset(server.port or NATS_PORT for server in self._servers())

    def tls_context(self) -> ssl.SSLContext | None:
        """The client's TLS context; a CA or certificate file it cannot load is one line."""
        if not (self.tls_ca_file or self.tls_cert_file):
            return None
        try:
            context = ssl.create_default_context(cafile=self.tls_ca_file or None)
            if self.tls_cert_file:
                context.load_cert_chain(self.tls_cert_file, self.tls_key_file or None)
        except ssl.SSLError as exc:
            files = ", ".join(f for f in (self.tls_ca_file, self.tls_cert_file) if f)
            raise BusCredentialsError(f"cannot load the TLS files {files}: {exc}") from None
        return context

    def connect_options(self) -> dict[str, Any]:
        """Keyword arguments for :func:`nats.connect` carrying authentication and TLS."""
        options: dict[str, Any] = {"servers": [u.strip() for u in self.url.split(",")]}
        if self.creds_file:
            options["user_credentials"] = self.creds_file
        if self.nkey_seed_file:
            options["nkeys_seed"] = self.nkey_seed_file
        if self.user:
            options["user"] = self.user
            options["password"] = self.password
        if self.token:
            options["token"] = self.token
        tls = self.tls_context()
        if tls is not None:
            options["tls"] = tls
        return options


def is_loopback(host: str) -> bool:
    if host in ("localhost", ""):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        try:
            return all(
                ipaddress.ip_address(info[4][0]).is_loopback
                for info in socket.getaddrinfo(host, None)
            )
        except OSError:
            return False


def settings_from_env(
    env: Mapping[str, str] | None = None, base: BusSettings | None = None
) -> BusSettings:
    """``base`` (default: the defaults) with every ``GOODPUT_NATS_*`` variable set in ``env``.

    Empty variables count as unset. Files are not checked here (see :meth:`check_credentials`).
    """
    env = os.environ if env is None else env
    base = base or BusSettings()
    values: dict[str, Any] = {}
    for field, name in ENV_VARS.items():
        raw = env.get(name, "")
        if field == "insecure":
            values[field] = base.insecure or raw.strip().lower() in ("1", "true", "yes")
        elif field == "replicas" and raw:
            values[field] = parse_replicas(raw, name)
        elif raw:
            values[field] = raw
    return msgspec.structs.replace(base, **values)


def settings_to_env(settings: BusSettings) -> dict[str, str]:
    """The environment that makes :func:`settings_from_env` return ``settings`` in a child.

    Only what is set is included (the URL always), so the child's defaults stay defaults.
    """
    env = {ENV_VARS["url"]: settings.url}
    for field, name in ENV_VARS.items():
        value = getattr(settings, field)
        if field == "insecure":
            if value:
                env[name] = "1"
        elif field != "url" and value:
            env[name] = str(value)
    return env


#: the replica count JetStream asks for in a cluster: survives one server lost (Raft quorum)
CLUSTER_REPLICAS = 3
#: JetStream's own limit on a stream's replicas
MAX_REPLICAS = 5


def parse_replicas(raw: str, source: str) -> int:
    """A replica count from text (an environment variable): 0 (auto) to 5, else one clear line."""
    try:
        replicas = int(raw)
    except ValueError:
        replicas = -1
    if not 0 <= replicas <= MAX_REPLICAS:
        raise ValueError(f"{source}={raw!r}: expected 0 (auto) to {MAX_REPLICAS} replicas")
    return replicas


def stream_replicas(configured: int, *, clustered: bool) -> int:
    """How many copies each stream and bucket gets on a server that is (or is not) part of a
    cluster, as its INFO says.

    A configured count wins (the server refuses one its cluster cannot place: a clear error
    beats a silently weaker bus). Auto is R3 on a clustered server, because a Raft group of
    three loses no acknowledged write and keeps serving when any one server dies, and R1 on
    a server on its own. A cluster of two (R3 cannot be placed) must say ``replicas`` itself:
    counting its servers from INFO would race the routes still connecting at startup.
    """
    if configured:
        return configured
    return CLUSTER_REPLICAS if clustered else 1
