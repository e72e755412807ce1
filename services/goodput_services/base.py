"""What every goodput service shares: configuration, the bus, health records, graceful SIGTERM.

A service is one OS process. It connects to the bus (retrying until the server is up),
provisions streams idempotently, runs its loops, refreshes its health record (its own key,
``subjects.health_key``: one per replica) in the ``gp_services`` KV bucket every
``health_period_s``, and on SIGTERM stops its consumers, finishes the message in hand,
deletes its health record and exits 0. A loop that dies stops the service too, with exit
status 1 and the cause in the log: a supervisor (Kubernetes, systemd) must not read it as done.
A stop that has not finished within ``stop_deadline_s`` (a client library stuck closing a dead
connection, a hook that never returns) ends the process with exit status 1 and every thread's
stack in the log: on a bare host nothing else would ever kill it.
"""

from __future__ import annotations

import asyncio
import contextlib
import faulthandler
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Coroutine
from typing import Any, ClassVar

import msgspec

from goodput import schemas, subjects
from goodput.bus import Bus, BusSettingsError, BusUnavailableError, CommandRunner
from goodput.bus.client import service_connection_name
from goodput.bus.service_health import forget_replaced
from goodput.config import ServiceConfig, convert_options
from goodput.instance_id import instance_id
from goodput.launch.exit_reason import REFUSED_EXIT_CODE, report_exit
from goodput.prometheus_endpoint import SERVICE_PORT_OFFSETS
from goodput.telemetry import setup_metrics, setup_tracing

log = logging.getLogger(__name__)


class ServiceLoopDied(Exception):
    """One of the service's loops raised: the service stopped and must exit non-zero."""


class Service:
    """Subclass, set ``name``, override :meth:`loops` and (if it takes commands) :meth:`execute`."""

    name: ClassVar[str] = "service"
    #: subject token of the commands this service executes (``None``: takes no commands); a
    #: service of one node (the replicator, the host monitor) sets its own per instance
    command_target: str | None = None
    #: the struct ``config.options`` is converted to once, at start-up, as ``self.options``
    #: (unknown fields rejected); ``None``: the service reads ``config.options`` itself
    options_type: ClassVar[type[msgspec.Struct] | None] = None

    def __init__(self, config: ServiceConfig):
        self.config = config
        if self.options_type is not None:
            self.options: Any = convert_options(self.options_type, config.options, self.name)
        self.job = config.job
        #: unique to this process (lease holder, health record), whatever ``--instance`` says
        self.instance = instance_id(config.instance)
        self.started_ts = schemas.now_ns()
        self.bus: Bus | None = None
        self.commands: CommandRunner | None = None
        self._stopping = asyncio.Event()
        #: set by :func:`run_service`: the process ends if a stop overruns its deadline (a
        #: service run inside another program, e.g. a test, leaves that to its host)
        self.exit_when_stop_hangs = False
        self._stop_watchdog: threading.Timer | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def serve_node(self, role: str, executor: str) -> str:
        """For a service of one node (the replicator, the host monitor): its node, from
        ``--node`` (refused in one line without it), with its command target there."""
        node = self.config.node
        if not node:
            raise SystemExit(f"the {role} serves one node: pass --node NAME")
        self.command_target = subjects.node_target(executor, node)
        return node

    # ---- to override -----------------------------------------------------------------------

    def loops(self) -> list[Coroutine[Any, Any, None]]:
        """The service's own long-running work, besides health and commands."""
        return []

    def command_fence(self, command: schemas.Command) -> str:
        """What this executor's state is now, as far as ``command`` acts on it: a command
        begun by a predecessor that died is run again only if it is unchanged (see
        :mod:`goodput.bus.commands`). "": no fence, the service's commands are idempotent."""
        return ""

    async def execute(self, command: schemas.Command) -> tuple[bool, str]:
        return False, f"{self.name} does not execute {schemas.kind_of(type(command))}"

    def health(self) -> tuple[bool, str]:
        """(healthy, detail) for the health record."""
        return True, ""

    async def on_stop(self) -> None:
        """Release what the service holds (called once, on SIGTERM or shutdown)."""

    @property
    def stop_deadline_s(self) -> float:
        """How long a stop may take, from the first request, before the process exits anyway."""
        return 20.0

    # ---- machinery ---------------------------------------------------------------------------

    @property
    def stopping(self) -> asyncio.Event:
        return self._stopping

    def request_stop(self) -> None:
        self._stopping.set()
        if self.commands is not None:
            self.commands.stop()
        if self.exit_when_stop_hangs and self._stop_watchdog is None:
            with contextlib.suppress(RuntimeError):
                self._loop = asyncio.get_running_loop()
            # a thread, not the event loop: the loop may be the thing that is stuck
            self._stop_watchdog = threading.Timer(self.stop_deadline_s, self._stop_overran)
            self._stop_watchdog.daemon = True
            self._stop_watchdog.start()

    def _stop_overran(self) -> None:
        log.error(
            "service did not stop within %.0f s of the stop request: exiting; the threads' and "
            "the pending tasks' stacks follow",
            self.stop_deadline_s,
        )
        faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
        # read from this thread while the loop may run: good enough for a process about to die
        with contextlib.suppress(Exception):
            for task in asyncio.all_tasks(self._loop) if self._loop else ():
                task.print_stack(file=sys.stderr)
        sys.stderr.flush()
        os._exit(1)

    async def start_bus(self) -> Bus:
        """Connect and provision; settings that cannot work, or a bus that stays away, stop
        the service with one line (no traceback: the cause is the operator's to fix)."""
        try:
            self.bus = await Bus.connect(self.config.bus, name=service_connection_name(self.name))
        except (BusSettingsError, BusUnavailableError) as exc:
            raise SystemExit(f"{self.name}: cannot use the bus: {exc}") from None
        await self.bus.provision()
        return self.bus

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.request_stop)
        bus = await self.start_bus()
        tasks = [asyncio.create_task(self._health_loop(), name="health")]
        if self.command_target is not None:
            self.commands = CommandRunner(
                bus,
                job=self.job,
                target=self.command_target,
                service=self.name,
                execute=self.execute,
                fence=self.command_fence,
            )
            tasks.append(asyncio.create_task(self.commands.run(), name="commands"))
        # a coroutine object has the qualified name of its function (Coroutine, the abstract
        # type loops() promises, does not say so)
        tasks += [
            asyncio.create_task(coro, name=getattr(coro, "__qualname__", None))
            for coro in self.loops()
        ]
        log.info("service started", extra={"instance": self.instance, "bus": self.config.bus.url})
        stop_wait = asyncio.create_task(self._stopping.wait())
        done, _ = await asyncio.wait([stop_wait, *tasks], return_when=asyncio.FIRST_COMPLETED)
        # a loop that raised, or returned although no stop was asked for, ends the service
        stop_asked = self._stopping.is_set()
        died = [
            task
            for task in done
            if task is not stop_wait
            and not task.cancelled()
            and (task.exception() is not None or not stop_asked)
        ]
        for task in died:
            log.error("a service loop died: %s", task.get_name(), exc_info=task.exception())
        self.request_stop()
        stop_wait.cancel()
        await self._shutdown(tasks)
        if self._stop_watchdog is not None:
            self._stop_watchdog.cancel()
        if died:
            first, cause = died[0], died[0].exception()
            why = repr(cause) if cause is not None else "it returned before any stop request"
            raise ServiceLoopDied(f"service loop {first.get_name()} died: {why}") from cause

    async def _shutdown(self, tasks: list[asyncio.Task[None]]) -> None:
        # command runners stop at the next fetch; give in-flight handling a moment to finish
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.gather(*tasks[1:], return_exceptions=True), timeout=3)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await self.on_stop()
        await self._withdraw_health()
        assert self.bus is not None
        await self.bus.close()
        log.info("service stopped")

    async def _health_loop(self) -> None:
        forgot_replaced = False
        while not self._stopping.is_set():
            healthy, detail = self.health()
            record = await self._publish_health(healthy=healthy, detail=detail)
            if record is not None and not forgot_replaced:
                forgot_replaced = await self._forget_replaced(record)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stopping.wait(), self.config.health_period_s)

    async def _forget_replaced(self, own: schemas.ServiceHealth) -> bool:
        """Once, when this replica's record is written: delete the records of the replicas
        it replaced (keys would pile up with every restart; readers drop them meanwhile)."""
        assert self.bus is not None
        try:
            forgotten = await forget_replaced(self.bus, own, time.time_ns())
        except Exception as exc:  # the bus being down must not kill the service
            log.debug("replaced health records not deleted: %r", exc)
            return False
        if forgotten:
            log.info("deleted %d health record(s) of replaced replicas", forgotten)
        return True

    @property
    def health_key(self) -> str:
        """This process's own record: replicas of one service never overwrite each other."""
        return subjects.health_key(self.job, self.name, self.config.node, self.instance)

    async def _withdraw_health(self) -> None:
        """A replica stopped on request takes its record with it: a node drained from the pool,
        a scaled-down replica is no failure, and its record would read as one forever. A
        replica that dies leaves its record, which goes stale: that is the failure to show."""
        assert self.bus is not None
        try:
            kv = await self.bus.kv(subjects.SERVICES_BUCKET)
            await asyncio.wait_for(kv.delete(self.health_key), timeout=2)
        except Exception as exc:  # the bus being down: the record goes stale instead
            log.debug("health record not withdrawn: %r", exc)

    async def _publish_health(self, *, healthy: bool, detail: str) -> schemas.ServiceHealth | None:
        """Write this replica's record; the record, or None if the bus did not take it."""
        assert self.bus is not None
        record = schemas.ServiceHealth(
            job=self.job,
            service=self.name,
            node=self.config.node,
            instance=self.instance,
            pid=os.getpid(),
            healthy=healthy,
            started_ts=self.started_ts,
            period_s=self.config.health_period_s,
            detail=detail,
        )
        try:
            kv = await self.bus.kv(subjects.SERVICES_BUCKET)
            await asyncio.wait_for(kv.put(self.health_key, schemas.encode(record)), timeout=2)
        except Exception as exc:  # the bus being down must not kill the service
            log.debug("health record not written: %r", exc)
            return None
        return record


def run_service(service_class: type[Service], argv: list[str] | None = None) -> int:
    """Entry point of ``python -m goodput_services.<name>``.

    Whatever ends the service on its own — a refused option or config file, a policy script
    the controller will not load, a loop that died — leaves one line saying why as its last
    output (:func:`goodput.launch.exit_reason.report_exit`), for `goodput up` to show. A
    refusal exits with ``REFUSED_EXIT_CODE`` (not restarted by `up`'s keeper), a crash with 1.
    """
    from goodput.config import load_service_config
    from goodput.logs import setup_logging

    started = time.monotonic()
    try:
        config = load_service_config(service_class.name, argv)
        setup_logging(config.log_level, service=service_class.name, job=config.job)
        # a fatal signal (a crash in native code: SIGSEGV, SIGBUS, SIGABRT...) leaves the
        # threads' stacks in the log; without it the process vanishes without a line
        faulthandler.enable(file=sys.stderr, all_threads=True)
        setup_tracing(f"goodput-{service_class.name}")
        setup_metrics(
            f"goodput-{service_class.name}",
            port_offset=SERVICE_PORT_OFFSETS.get(service_class.name, 0),
        )
        service = service_class(config)  # options refused here raise SystemExit(one line)
    except SystemExit as exc:
        if not isinstance(exc.code, str):
            raise  # argparse's usage error (code 2) has printed its own line
        report_exit(exc.code)
        return REFUSED_EXIT_CODE
    service.exit_when_stop_hangs = True
    try:
        asyncio.run(service.run())
    except SystemExit as exc:  # a refusal raised once running (e.g. by a loop)
        if not isinstance(exc.code, str):
            raise
        report_exit(exc.code)
        return REFUSED_EXIT_CODE
    except ServiceLoopDied as exc:
        uptime = {"uptime_s": round(time.monotonic() - started, 3)}
        log.error("service failed: %s", exc, extra=uptime)
        report_exit(f"{service_class.name} failed: {exc}")
        return 1
    except Exception as exc:
        uptime = {"uptime_s": round(time.monotonic() - started, 3)}
        log.exception("service failed", extra=uptime)
        report_exit(f"{service_class.name} failed: {exc!r}")
        return 1
    return 0
