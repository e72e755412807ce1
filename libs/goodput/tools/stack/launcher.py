"""The supervisor stack's parts as separate OS processes: its bus, a service, their health.

A stack session (:mod:`.session`) starts the stack with these: the bus (the caller's, else the
embedded one), each service spawned under a keeper (:mod:`.keeper`) that restarts it if it
crashes, the flags and secrets handed on; `up`, `run`, the demo and the benchmarks then wait
here for the services' health.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path

from goodput.bus import Bus, BusSettings
from goodput.bus.client import TRANSIENT_ERRORS
from goodput.bus.cluster import cluster_size
from goodput.bus.embedded import RecordedBus
from goodput.config import parse_option
from goodput.launch.exit_reason import EXIT_REASON_ENV, read_exit_reason
from goodput.owned_process import is_running, spawned, stack_marker
from goodput.state_dir import StateDir
from goodput.tools.stack.health import Slot, services_health
from goodput.tools.stack.keeper import keeper_command, kept_service
from goodput.tools.stack.record import ServiceProcess

#: central services, one each
CENTRAL_SERVICES = ("sensor", "controller", "actuator")
#: per-node services, one per node
NODE_SERVICES = ("hostmon", "replicator")


def explicit_url(args: argparse.Namespace) -> str:
    """The bus the caller names (``--nats-url``, ``GOODPUT_NATS_URL``), or ""."""
    return args.nats_url or os.environ.get("GOODPUT_NATS_URL") or ""


def resolve_url(args: argparse.Namespace, state_dir: Path) -> tuple[str, bool]:
    """The bus URL: explicit flag/env, else the embedded server recorded in the state dir."""
    explicit = explicit_url(args)
    if explicit:
        return explicit, False
    found = RecordedBus.read(StateDir(state_dir))
    return (found.url if found.running else ""), True


def add_embedded_nats_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags of the commands that may start the embedded server."""
    parser.add_argument(
        "--nats-cluster",
        type=cluster_size,
        default=1,
        metavar="N",
        help="start N embedded nats-servers as one JetStream cluster on loopback (streams R3, "
        "any one server may die); default 1 server",
    )


def spawn_service(
    name: str,
    node: str,
    *,
    job: str,
    url: str,
    paths: StateDir,
    extra: list[str],
    secrets: dict[str, str] | None = None,
) -> ServiceProcess:
    """Start one service process under its keeper (:mod:`.keeper`), marked as the stack's;
    ``secrets`` go into its environment, never its command line (which every user of the host
    can read)."""
    log_path = paths.service_log(name, node)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    reason_path = exit_reason_path(log_path)
    reason_path.unlink(missing_ok=True)  # an earlier process's reason is not this one's
    service = [
        sys.executable,
        "-m",
        f"goodput_services.{name}",
        "--job",
        job,
        "--nats-url",
        url,
        "--state-dir",
        str(paths.root),
        *(["--node", node] if node else []),
        *extra,
    ]
    key = f"{name}@{node}" if node else name
    env = {
        **os.environ,
        **(secrets or {}),
        **stack_marker(paths.root),
        EXIT_REASON_ENV: str(reason_path),
    }
    with open(log_path, "ab") as log:
        process = subprocess.Popen(
            keeper_command(key, service),
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            env=env,
        )
    return ServiceProcess(name=name, node=node, process=spawned(process), log=str(log_path))


def add_service_set_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--service-set",
        action="append",
        default=[],
        metavar="SERVICE:KEY=VALUE",
        help='an option for one service, e.g. controller:policy="my_policy.py" or '
        "sensor:thresholds={heartbeat_timeout_s=3.0} (repeatable; VALUE is TOML)",
    )


def service_flags_from_args(items: list[str]) -> dict[str, list[str]]:
    """``SERVICE:KEY=VALUE`` items as per-service ``--set`` flags."""
    flags: dict[str, list[str]] = {}
    for item in items:
        service, sep, option = item.partition(":")
        if not sep or "=" not in option or service not in CENTRAL_SERVICES + NODE_SERVICES:
            raise SystemExit(
                f"--service-set {item!r}: expected SERVICE:KEY=VALUE with SERVICE one of "
                f"{', '.join(CENTRAL_SERVICES + NODE_SERVICES)}"
            )
        flags.setdefault(service, []).extend(["--set", option])
    return flags


def check_policy_options(service_flags: dict[str, list[str]]) -> None:
    """A controller policy script that does not exist stops `up`/`run` before anything starts
    (the controller would refuse it too, but only once the stack is half up)."""
    options = service_flags.get("controller", [])
    for key, value in (parse_option(item) for item in options[1::2]):
        if key == "policy" and value and not Path(str(value)).is_file():
            raise SystemExit(f"policy script {value} not found (controller:policy)")


def bus_flags(args: argparse.Namespace) -> list[str]:
    """Authentication flags handed on to the service processes."""
    pairs = [
        ("--nats-creds", args.nats_creds),
        ("--nats-nkey", args.nats_nkey),
        ("--nats-user", args.nats_user),
        ("--nats-tls-ca", args.nats_tls_ca),
        ("--nats-tls-cert", args.nats_tls_cert),
        ("--nats-tls-key", args.nats_tls_key),
    ]
    flags = [item for flag, value in pairs if value for item in (flag, value)]
    return flags + (["--insecure"] if args.insecure else [])


def bus_secrets(settings: BusSettings) -> dict[str, str]:
    """The password or token the services need, for their environment (not their flags)."""
    secrets = {"GOODPUT_NATS_PASSWORD": settings.password, "GOODPUT_NATS_TOKEN": settings.token}
    return {key: value for key, value in secrets.items() if value}


async def provision(settings: BusSettings) -> None:
    bus = await Bus.connect(settings, name="goodput-cli", initial_timeout_s=15)
    try:
        await bus.provision()
    finally:
        await bus.close()


class ServiceExited(SystemExit):
    """A service of the stack ended while it was awaited (its options refused, its policy
    script not loadable…): one line naming it and its reason. A ``SystemExit``, so a caller
    that does not catch it still ends with that one line (and runs its ``finally``)."""


class HealthUnknown(ServiceExited):
    """The stack's health could not be read from its bus before the deadline (every query
    timed out): one line, handled like a service that exited."""


async def wait_healthy(settings, job, services, timeout_s, console) -> list[dict]:
    """The services' health once all are healthy or ``timeout_s`` passed; raises
    :class:`ServiceExited` as soon as one of them is found gone."""
    deadline = time.monotonic() + timeout_s
    report: list[dict] | None = None
    unanswered = ""
    with console.status("waiting for services to report healthy…"):
        while True:
            check_running(services)
            try:
                report = await service_report(settings, job, services)
            # a busy server, or a cluster still electing its JetStream leader (503): the next
            # poll asks again, until the deadline
            except TRANSIENT_ERRORS as exc:
                unanswered = f"{type(exc).__name__}: {exc}"
            done = report is not None and all(s["healthy"] for s in report)
            if done or time.monotonic() > deadline:
                check_running(services)  # a service that said healthy, then left
                if report is None:
                    raise HealthUnknown(
                        f"the bus did not answer the health query within {timeout_s:g} s "
                        f"({unanswered})"
                    )
                return report
            await asyncio.sleep(0.5)


def check_running(services: list[ServiceProcess]) -> None:
    """Raise :class:`ServiceExited` with the first gone service's own reason."""
    gone = [s for s in services if not is_running(s.process)]
    if not gone:
        return
    first = gone[0]
    log = Path(first.log)
    reason = read_exit_reason(exit_reason_path(log), log) or "no reason given"
    more = f" ({len(gone)} services exited)" if len(gone) > 1 else ""
    raise ServiceExited(f"{first.key} exited: {reason}{more}; log {log}")


def exit_reason_path(log: Path) -> Path:
    """Where the service logging to ``log`` writes why it ended (beside its log)."""
    return log.with_suffix(".exit")


async def service_report(settings, job: str, services: list[ServiceProcess]) -> list[dict]:
    """One row per expected service and per replica on the bus
    (:func:`goodput.tools.stack.health.services_health`), on a connection of its own."""
    bus = await Bus.connect(settings, name="goodput-status", initial_timeout_s=5)
    try:
        report = await services_health(
            bus,
            job,
            time.time_ns(),
            expected=expected_slots(services),
            running_pids=running_pids(services),
        )
    finally:
        await bus.close()
    return report.entries


def expected_slots(services: list[ServiceProcess]) -> list[Slot]:
    return [Slot(service=process.name, node=process.node) for process in services]


def running_pids(services: list[ServiceProcess]) -> frozenset[int]:
    """The processes that run the recorded services now: each keeper's current child, found
    through the keeper's checked identity (a service being restarted has none)."""
    return frozenset(
        child.pid for process in services if (child := kept_service(process.process)) is not None
    )
