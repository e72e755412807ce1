"""One command's hold on a stack's state directory: its lock, its record, start, stop, undo.

`goodput up`, `run`, `down`, the demo and the benchmarks each hold a :class:`StackSession`
instead of passing the state directory from module to module: the session takes the lock
(:mod:`.lock`) and reads ``stack.json`` (:mod:`.record`) once per hold, and a session that
started the stack stops what it recorded without reading it again; a start checks the services
the record names in one call (:func:`goodput.owned_process.check_recorded`) and leaves
``nats.json`` to the bus (:func:`goodput.bus.cluster.stack_bus`); each writes the record once
per change. Spawning a service is :mod:`.launcher`'s, stopping processes :mod:`.stop`'s.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
from pathlib import Path

import msgspec
from rich.console import Console

from goodput.bus import BusSettings
from goodput.bus.cluster import stack_bus
from goodput.bus.embedded import EmbeddedNatsError
from goodput.checkpoint.format.job_key import stack_key_env
from goodput.checkpoint.tiers.peer.address import one_machine_env
from goodput.config import bus_settings_from_args
from goodput.owned_process import RecordUnreadable, check_recorded
from goodput.state_dir import StateDir
from goodput.subjects import check_token
from goodput.tools.stack.launcher import (
    CENTRAL_SERVICES,
    NODE_SERVICES,
    bus_flags,
    bus_secrets,
    explicit_url,
    provision,
    spawn_service,
)
from goodput.tools.stack.lock import stack_lock
from goodput.tools.stack.record import ServiceProcess, StackRecord, read_stack, write_stack
from goodput.tools.stack.stop import StopReport, stop_processes, undo_services


class StackSession:
    """The stack of one state directory, for one command: start what is missing, undo it,
    stop it all. Each holds the directory's lock and reads the record under it once."""

    def __init__(self, state_dir: Path) -> None:
        self.paths = StateDir(state_dir)
        #: the record as :meth:`start` found it (None: there was no stack), for :meth:`undo`
        self.before: StackRecord | None = None
        #: the record as this session last wrote it (None: it started nothing), for :meth:`stop`
        self.stack: StackRecord | None = None

    def hold(self) -> contextlib.AbstractContextManager[None]:
        """The lock, for a command that keeps it across start and wait (`up`: what it undoes
        on a failure is then what it started); taken again inside, it is simply held."""
        return stack_lock(self.paths.root)

    def start(
        self,
        args: argparse.Namespace,
        job: str,
        node_count: int,
        console: Console,
        service_flags: dict[str, list[str]] | None = None,
    ) -> tuple[StackRecord, BusSettings]:
        """Start what is missing of the stack (NATS, services); return its record and bus settings.

        ``service_flags`` adds command-line flags per service name (e.g. ``--set`` options). A
        recorded process that is gone or whose pid another process holds is said in one line,
        never signalled, and started again.
        """
        check_token(job, "job name")
        self.paths.root.mkdir(parents=True, exist_ok=True)
        with stack_lock(self.paths.root):
            before = self.before = read_stack(self.paths.root)
            recorded = {service.key: service for service in before.services} if before else {}
            checked = check_recorded({key: service.process for key, service in recorded.items()})
            explicit = explicit_url(args)
            try:
                bus = stack_bus(self.paths, *_embedded_shape(args), explicit_url=explicit)
            except EmbeddedNatsError as exc:
                raise SystemExit(str(exc)) from None
            settings = msgspec.structs.replace(bus_settings_from_args(args), url=bus.url)
            settings.check_security()
            asyncio.run(provision(settings))
            running = {key: s for key, s in recorded.items() if key in checked.running}
            nodes = [f"node-{i}" for i in range(node_count)]
            # the job's checkpoint key and the bus's password: services hand them on
            secrets = {**bus_secrets(settings), **stack_key_env(self.paths.root)}
            # every node runs here: its replicators reach each other on loopback, whatever the bus
            node_env = {"replicator": one_machine_env(os.environ)}
            services: list[ServiceProcess] = []
            for name, node in _wanted(nodes):
                key = f"{name}@{node}" if node else name
                if key in running:
                    services.append(running.pop(key))
                    continue
                services.append(
                    spawn_service(
                        name,
                        node,
                        job=job,
                        url=bus.url,
                        paths=self.paths,
                        extra=bus_flags(args) + (service_flags or {}).get(name, []),
                        secrets={**secrets, **node_env.get(name, {})},
                    )
                )
            started = [bus.started] if bus.started else []
            started += [s.key for s in services if s.key not in checked.running]
            stale = [*bus.stale, *checked.stale.values()]
            if stale:  # one line, however many
                console.print(f"stale record, not signalled: {'; '.join(stale)}", soft_wrap=True)
            # one line, whatever started: a failure after it must still fit in a few lines
            what = f"[green]started[/] {'; '.join(started)}" if started else "already running"
            console.print(f"stack state: {self.paths.root}: {what}", soft_wrap=True)
            # what an earlier `up` started and still runs stays recorded (a `run --nodes 1`
            # against a 2-node stack uses fewer nodes, it does not disown node-1's services):
            # `down` stops it
            services += running.values()
            nodes += [node for node in (before.nodes if before else []) if node not in nodes]
            stack = StackRecord(
                job=job, url=bus.url, embedded=not explicit, nodes=nodes, services=services
            )
            write_stack(self.paths.root, stack)
            self.stack = stack
            return stack, settings

    def undo(self) -> int:
        """Stop what :meth:`start` started: all of it, embedded server included, if there was
        no stack before; else the services that were not running then. How many processes
        were stopped."""
        if self.before is None:
            return self.stop().stopped
        with stack_lock(self.paths.root):
            current = read_stack(self.paths.root)
            if current is None:
                return 0
            stopped, self.stack = undo_services(self.before, current)
            write_stack(self.paths.root, self.stack)
            return stopped

    def stop(self) -> StopReport:
        """Stop every service, any rank left running, the embedded server, then whatever else
        still carries the stack's marker (what a lost or corrupt record no longer names).

        The actuator is asked first and given time: it lets running ranks save and exit. Every
        recorded process is checked before it is signalled. The lock is taken again: `run` and
        the demo let it go while they follow the job, so that `down` can stop them. A session
        that started the stack stops what it recorded then (what another command started
        since carries the stack's marker and is stopped with it); another (`goodput down`)
        reads the record. A directory that does not exist has nothing recorded and nothing to
        lock: only what is marked is stopped.
        """
        root = self.paths.root
        with stack_lock(root) if root.is_dir() else contextlib.nullcontext():
            report = StopReport()
            stack, self.stack = self.stack, None
            if stack is None:
                try:
                    stack = read_stack(root)
                except RecordUnreadable as exc:
                    report.unreadable.append(str(exc.code))
            return stop_processes(self.paths, stack, report)


def _embedded_shape(args: argparse.Namespace) -> tuple[int, int | None]:
    """``--nats-cluster`` and ``--nats-port`` (a command without them: one server, any port)."""
    return getattr(args, "nats_cluster", 1) or 1, getattr(args, "nats_port", None)


def _wanted(nodes: list[str]) -> list[tuple[str, str]]:
    """Every service of a stack of ``nodes``: (name, node), node "" for a central one."""
    return [(name, "") for name in CENTRAL_SERVICES] + [
        (name, node) for node in nodes for name in NODE_SERVICES
    ]
