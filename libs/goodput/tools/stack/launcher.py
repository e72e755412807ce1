"""The supervisor stack as separate OS processes: start what is missing, wait for its health.

Used by `goodput up/down/run/status` (:mod:`goodput.tools.cli.stack`), the demo, the benchmarks
and the chaos tool. The stack's record (``stack.json``, :mod:`.record`) lives in its state
directory; starting holds its lock (:mod:`.lock`); stopping is :mod:`.stop`. Each service runs
under a keeper (:mod:`.keeper`) that restarts it if it crashes.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path

import msgspec
from rich.console import Console

from goodput.bus import Bus, BusSettings
from goodput.bus.client import TRANSIENT_ERRORS
from goodput.bus.cluster import StackBus, cluster_refusal, cluster_size, stack_bus
from goodput.bus.embedded import EmbeddedNatsError, read_record
from goodput.checkpoint.format.job_key import stack_key_env
from goodput.checkpoint.tiers.peer.address import one_machine_env
from goodput.config import bus_settings_from_args, parse_option
from goodput.launch.exit_reason import EXIT_REASON_ENV, read_exit_reason
from goodput.owned_process import (
    is_running,
    spawned,
    stack_marker,
    stale_line,
    standing,
)
from goodput.state_dir import StateDir
from goodput.subjects import check_token
from goodput.tools.stack.health import Slot, services_health
from goodput.tools.stack.keeper import keeper_command, kept_service
from goodput.tools.stack.lock import stack_lock
from goodput.tools.stack.record import (
    ServiceProcess,
    StackRecord,
    read_stack,
    write_stack,
)

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
    record = read_record(StateDir(state_dir))
    if record is not None and record.running():
        return record.url, True
    return "", True


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
    state_dir: Path,
    extra: list[str],
    secrets: dict[str, str] | None = None,
) -> ServiceProcess:
    """Start one service process under its keeper (:mod:`.keeper`), marked as the stack's;
    ``secrets`` go into its environment, never its command line (which every user of the host
    can read)."""
    log_path = StateDir(state_dir).service_log(name, node)
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
        str(state_dir),
        *(["--node", node] if node else []),
        *extra,
    ]
    key = f"{name}@{node}" if node else name
    env = {
        **os.environ,
        **(secrets or {}),
        **stack_marker(state_dir),
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


def start_stack(
    args: argparse.Namespace,
    state_dir: Path,
    job: str,
    node_count: int,
    console: Console,
    service_flags: dict[str, list[str]] | None = None,
) -> tuple[StackRecord, BusSettings]:
    """Start what is missing of the stack (NATS, services); return its record and bus settings.

    ``service_flags`` adds command-line flags per service name (e.g. ``--set`` options). A
    recorded process that is gone or whose pid another process holds is said in one line,
    never signalled, and started again. Holds the state directory's lock.
    """
    check_token(job, "job name")
    state_dir.mkdir(parents=True, exist_ok=True)
    with stack_lock(state_dir):
        return _start_stack(args, state_dir, job, node_count, console, service_flags)


def _start_stack(
    args: argparse.Namespace,
    state_dir: Path,
    job: str,
    node_count: int,
    console: Console,
    service_flags: dict[str, list[str]] | None,
) -> tuple[StackRecord, BusSettings]:
    nodes = [f"node-{i}" for i in range(node_count)]
    bus = _stack_bus(args, StateDir(state_dir))
    url, embedded = bus.url, not explicit_url(args)
    started = [bus.started] if bus.started else []  # what this call started, in one line
    stale = bus.stale  # recorded processes that are not running any more
    settings = msgspec.structs.replace(bus_settings_from_args(args), url=url)
    settings.check_security()
    asyncio.run(_provision(settings))

    previous = read_stack(state_dir)
    running: dict[str, ServiceProcess] = {}
    for recorded_service in previous.services if previous else []:
        found = standing(recorded_service.process)
        if found == "running":
            running[recorded_service.key] = recorded_service
        else:
            stale.append(stale_line(recorded_service.key, recorded_service.process, found))
    wanted = [(name, "") for name in CENTRAL_SERVICES] + [
        (name, node) for node in nodes for name in NODE_SERVICES
    ]
    alive_before = set(running)
    bus_flags = _bus_flags(args)
    ckpt_key = stack_key_env(state_dir)  # the job's checkpoint key: services hand it on
    # every node runs here: its replicators reach each other on loopback, whatever the bus
    node_env = {"replicator": one_machine_env(os.environ)}
    services: list[ServiceProcess] = []
    for name, node in wanted:
        key = f"{name}@{node}" if node else name
        if key in running:
            services.append(running.pop(key))
            continue
        extra = bus_flags + (service_flags or {}).get(name, [])
        services.append(
            spawn_service(
                name,
                node,
                job=job,
                url=url,
                state_dir=state_dir,
                extra=extra,
                secrets={**_bus_secrets(settings), **ckpt_key, **node_env.get(name, {})},
            )
        )
    started += [s.key for s in services if s.key not in alive_before]
    if stale:  # one line, however many
        console.print(f"stale record, not signalled: {'; '.join(stale)}", soft_wrap=True)
    # one line, whatever started: a failure after it must still fit in a few lines
    what = f"[green]started[/] {'; '.join(started)}" if started else "already running"
    console.print(f"stack state: {state_dir}: {what}", soft_wrap=True)
    # what an earlier `up` started and still runs stays recorded (a `run --nodes 1` against a
    # 2-node stack uses fewer nodes, it does not disown node-1's services): `down` stops it
    services += running.values()
    recorded_nodes = previous.nodes if previous else []
    nodes += [node for node in recorded_nodes if node not in nodes]
    stack = StackRecord(job=job, url=url, embedded=embedded, nodes=nodes, services=services)
    write_stack(state_dir, stack)
    return stack, settings


def _stack_bus(args: argparse.Namespace, paths: StateDir) -> StackBus:
    """The caller's bus, else the stack's embedded one (started if it is not running); a
    ``--nats-cluster`` that cannot be honoured is refused in one line."""
    size = getattr(args, "nats_cluster", 1) or 1
    explicit = explicit_url(args)
    if explicit:
        if refusal := cluster_refusal(size, explicit_url=True, running=None):
            raise SystemExit(refusal)
        return StackBus(explicit)
    try:
        return stack_bus(paths, size, port=getattr(args, "nats_port", None))
    except EmbeddedNatsError as exc:
        raise SystemExit(str(exc)) from None


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


def _bus_flags(args: argparse.Namespace) -> list[str]:
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


def _bus_secrets(settings: BusSettings) -> dict[str, str]:
    """The password or token the services need, for their environment (not their flags)."""
    secrets = {"GOODPUT_NATS_PASSWORD": settings.password, "GOODPUT_NATS_TOKEN": settings.token}
    return {key: value for key, value in secrets.items() if value}


async def _provision(settings) -> None:
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
