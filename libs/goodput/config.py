"""Service configuration from a TOML file, ``GOODPUT_*`` environment variables and flags.

Precedence: flags > environment > file > defaults. Options a service does not know are an
error, not silently ignored, so a typo in a config file is caught at start-up.
"""

from __future__ import annotations

import argparse
import os
import tomllib
from pathlib import Path
from typing import Any, TypeVar

import msgspec

from goodput.bus.credentials import BusSettingsError
from goodput.bus.settings import BusSettings, settings_from_env
from goodput.config_aliases import apply_aliases
from goodput.subjects import DEFAULT_JOB, check_token

ENV_PREFIX = "GOODPUT_"

OptionsT = TypeVar("OptionsT", bound=msgspec.Struct)


class ServiceTables(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """Per-service option tables of a config file shared by every service (``[services.sensor]``
    …): each service merges its own over ``[options]``, so one file (a Kubernetes ConfigMap)
    can carry every service's options although each service rejects options it does not know."""

    sensor: dict[str, Any] = msgspec.field(default_factory=dict)
    controller: dict[str, Any] = msgspec.field(default_factory=dict)
    actuator: dict[str, Any] = msgspec.field(default_factory=dict)
    hostmon: dict[str, Any] = msgspec.field(default_factory=dict)
    replicator: dict[str, Any] = msgspec.field(default_factory=dict)


class ServiceConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    job: str = DEFAULT_JOB
    #: node this instance serves (per-node services: host monitor, checkpoint tier)
    node: str = ""
    instance: str = ""
    state_dir: str = msgspec.field(default_factory=lambda: str(default_state_dir()))
    log_level: str = "info"
    health_period_s: float = 1.0
    bus: BusSettings = msgspec.field(default_factory=BusSettings)
    #: service-specific options (thresholds, policy path, backend…)
    options: dict[str, Any] = msgspec.field(default_factory=dict)
    #: in a file: per-service tables, merged over ``options`` by the service they name
    services: ServiceTables = msgspec.field(default_factory=ServiceTables)


def default_state_dir() -> Path:
    """Where the stack keeps its state when ``--state-dir`` is not given: ``$GOODPUT_STATE_DIR``,
    else ``$XDG_STATE_HOME/goodput``, else ``~/.local/state/goodput``.

    Per user, not per folder: `goodput up` in one folder and `goodput status` in another talk
    about the same stack (a relative default silently started a second one).
    """
    explicit = os.environ.get(ENV_PREFIX + "STATE_DIR")
    if explicit:
        return Path(explicit).expanduser().resolve()
    base = os.environ.get("XDG_STATE_HOME") or Path.home() / ".local" / "state"
    return (Path(base).expanduser() / "goodput").resolve()


def add_state_dir_argument(parser: argparse.ArgumentParser, help_text: str) -> None:
    """``--state-dir`` as an absolute path, defaulting to :func:`default_state_dir`."""
    parser.add_argument(
        "--state-dir",
        type=lambda text: Path(text).expanduser().resolve(),
        default=str(default_state_dir()),
        help=f"{help_text} (default: %(default)s: $GOODPUT_STATE_DIR, else "
        "$XDG_STATE_HOME/goodput, else ~/.local/state/goodput)",
    )


def job_name(text: str) -> str:
    """argparse type of ``--job``: a subject token (:func:`goodput.subjects.check_token`)."""
    try:
        return check_token(text, "job name")
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc


def node_name(text: str) -> str:
    """argparse type of ``--node``: a subject token, as ``--job`` (:func:`job_name`)."""
    try:
        return check_token(text, "node name")
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc


def count_at_least(minimum: int):
    """argparse type: an integer ``>= minimum`` (``--nodes 0`` would wait forever)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be at least {minimum}, got {value}")
        return value

    parse.__name__ = f"integer >= {minimum}"
    return parse


def convert_options(
    options_type: type[OptionsT], options: dict[str, Any], service: str
) -> OptionsT:
    """The service's options struct from the merged file/``--set`` table, converted once.

    ``options_type`` rejects unknown fields; a typo, a wrong type or a value its
    ``__post_init__`` refuses stops the service with one line naming the field.
    """
    try:
        return msgspec.convert(options, options_type)
    except msgspec.ValidationError as exc:
        raise SystemExit(f"invalid {service} option: {exc}") from exc


def add_bus_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags every command that talks to the bus accepts."""
    group = parser.add_argument_group("bus")
    group.add_argument(
        "--nats-url",
        help="NATS server URL(s), comma-separated; default: the embedded server of --state-dir",
    )
    group.add_argument("--nats-creds", help="NATS credentials file (JWT + nkey seed)")
    group.add_argument("--nats-nkey", help="file holding an nkey seed")
    group.add_argument("--nats-user", help="NATS user name")
    group.add_argument(
        "--nats-password", help="NATS password (prefer GOODPUT_NATS_PASSWORD in the environment)"
    )
    group.add_argument("--nats-tls-ca", help="CA bundle to verify the NATS server's certificate")
    group.add_argument("--nats-tls-cert", help="client certificate for mutual TLS")
    group.add_argument("--nats-tls-key", help="client key for mutual TLS")
    group.add_argument(
        "--insecure",
        action="store_true",
        default=None,
        help="allow an unauthenticated NATS server that is not on loopback",
    )


def add_common_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", help="TOML file with service settings")
    parser.add_argument(
        "--job", type=job_name, help=f"job name (subject token); default: {DEFAULT_JOB!r}"
    )
    parser.add_argument(
        "--state-dir", help="directory for local state (embedded NATS store, logs, pids)"
    )
    parser.add_argument("--log-level", help="debug, info, warning or error")
    add_bus_arguments(parser)


#: the bus setting each flag of :func:`add_bus_arguments` sets
BUS_FLAGS = {
    "nats_url": "url",
    "nats_creds": "creds_file",
    "nats_nkey": "nkey_seed_file",
    "nats_user": "user",
    "nats_password": "password",
    "nats_tls_ca": "tls_ca_file",
    "nats_tls_cert": "tls_cert_file",
    "nats_tls_key": "tls_key_file",
}


def bus_settings_from_args(
    args: argparse.Namespace, base: BusSettings | None = None
) -> BusSettings:
    """Flags over ``GOODPUT_NATS_*`` variables (:func:`settings_from_env`) over ``base``."""
    settings = settings_from_env(base=base)
    flags: dict[str, Any] = {
        field: getattr(args, flag, None)
        for flag, field in BUS_FLAGS.items()
        if getattr(args, flag, None)
    }
    if getattr(args, "insecure", None):
        flags["insecure"] = True
    settings = msgspec.structs.replace(settings, **flags)
    settings.check_credentials()
    return settings


def parse_option(text: str) -> tuple[str, Any]:
    """``KEY=VALUE`` of ``--set``: VALUE as TOML when it parses, else as a string."""
    if "=" not in text:
        raise argparse.ArgumentTypeError(f"--set expects KEY=VALUE, got {text!r}")
    key, raw = text.split("=", 1)
    try:
        value: Any = tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        value = raw
    return key.strip(), value


def load_service_config(service: str, argv: list[str] | None = None) -> ServiceConfig:
    parser = argparse.ArgumentParser(
        prog=f"python -m goodput_services.{service}",
        description=f"goodput {service} service (normally started by `goodput up`).",
    )
    add_common_arguments(parser)
    parser.add_argument("--node", help="node this instance serves (per-node services)")
    parser.add_argument("--instance", help="instance name in health records")
    parser.add_argument(
        "--set",
        dest="options",
        action="append",
        type=parse_option,
        default=[],
        metavar="KEY=VALUE",
        help="service option (repeatable); VALUE is parsed as TOML when it can be",
    )
    args = parser.parse_args(argv)
    return config_from_args(args, service)


def merged(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """``over`` on ``base``, table by table: a nested table sets only the keys it names, so
    ``--set 'kubernetes={image=…}'`` or a ``[supervisor]`` threshold keeps the file's other
    keys of that table instead of silently dropping them."""
    result = dict(base)
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(result.get(key), dict):
            result[key] = merged(result[key], value)
        else:
            result[key] = value
    return result


def config_from_args(args: argparse.Namespace, service: str = "") -> ServiceConfig:
    """The settings of ``service``: its ``[services.<service>]`` table of the file (with the
    supervisor names of ``[supervisor]`` it holds, :mod:`goodput.config_aliases`) over the
    file's ``[options]``, then ``--set`` flags, each merged table by table (:func:`merged`)."""
    data: dict[str, Any] = {}
    config_path = getattr(args, "config", None) or os.environ.get(ENV_PREFIX + "CONFIG")
    if config_path:
        try:
            data = tomllib.loads(Path(config_path).read_text())
        except (OSError, tomllib.TOMLDecodeError) as exc:
            raise SystemExit(f"cannot read config file {config_path}: {exc}") from exc
    try:
        file_config = msgspec.convert(apply_aliases(data), ServiceConfig)
    except ValueError as exc:  # msgspec.ValidationError is one
        raise SystemExit(f"invalid config file {config_path}: {exc}") from exc
    env = os.environ

    def pick(name: str, current: Any) -> Any:
        flag = getattr(args, name, None)
        if flag not in (None, ""):
            return flag
        return env.get(ENV_PREFIX + name.upper(), current)

    options = merged(file_config.options, getattr(file_config.services, service, None) or {})
    options = merged(options, dict(getattr(args, "options", []) or []))
    try:
        bus = bus_settings_from_args(args, file_config.bus)
    except BusSettingsError as exc:
        raise SystemExit(str(exc)) from exc
    config = ServiceConfig(
        job=pick("job", file_config.job),
        node=pick("node", file_config.node),
        instance=pick("instance", file_config.instance),
        state_dir=pick("state_dir", file_config.state_dir),
        log_level=pick("log_level", file_config.log_level),
        health_period_s=float(file_config.health_period_s),
        bus=bus,
        options=options,
    )
    try:
        check_token(config.job, "job name")
        if config.node:
            check_token(config.node, "node name")
    except ValueError as exc:
        raise SystemExit(str(exc)) from exc
    return config
