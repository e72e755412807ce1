"""The host monitor service process (one per node): GPU and host health, fault injection.

It probes every ``probe_interval_s`` and publishes a :class:`~goodput.schemas.HostHealth`
every ``health_interval_s`` — and at once when the set of faults or a GPU's recovery action
(the driver's) changes (a fault appearing or clearing must not wait for the next period: the
sensor acts on it). The node's expected
rank processes come from the actuator's job status in KV (``gp_state``, ``<job>.job_status``).

``ResetGpu`` (sent by the actuator once it stopped the job's ranks) resets GPUs with
nvidia-smi and answers with a ``GpuReset`` event. A command for an attempt older than the
job status's, one while a rank the job status lists on the node still runs (the local
backend), or one while NVML sees any process on a GPU to reset (every backend: "GPU 3 is
still held by pid 1234") is ignored with a log line: a newer attempt's ranks may be on the GPU.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass
from pathlib import Path

import nats.errors
import nats.js.errors

from goodput import schemas, subjects
from goodput.bus import BusUnavailableError
from goodput.bus.client import BUS_ERRORS
from goodput.checkpoint.format import node_volume
from goodput.config import ServiceConfig
from goodput.telemetry import tracer
from goodput_services.base import Service
from goodput_services.hostmon.gpu import GpuProbe, GpuSample, load_nvml
from goodput_services.hostmon.gpu_reset import ResetResult, held_refusal, reset_gpus
from goodput_services.hostmon.host import (
    DiskSample,
    HostLimits,
    MemorySample,
    count_alive,
    process_names,
    sample_disk,
    sample_memory,
)
from goodput_services.hostmon.injected import InjectedFaults, InjectionError
from goodput_services.hostmon.options import HostMonitorOptions

log = logging.getLogger(__name__)

#: job states in which the node's ranks are expected to be running: the live ones but
#: "restarting", between two attempts' ranks
RUNNING_STATES: frozenset[schemas.JobStateName] = schemas.LIVE_JOB_STATES - {"restarting"}


@dataclass
class HostSample:
    gpu: GpuSample
    disk: DiskSample
    memory: MemorySample
    ranks_alive: int


class HostMonitorService(Service):
    name = "hostmon"
    options_type = HostMonitorOptions
    options: HostMonitorOptions

    def __init__(self, config: ServiceConfig):
        super().__init__(config)
        self.node = self.serve_node("host monitor", subjects.HOST_MONITOR)
        self.volume = (
            Path(self.options.volume)
            if self.options.volume
            else node_volume(Path(config.state_dir), self.node, self.job)
        )
        self.limits = HostLimits(
            disk_min_free_bytes=self.options.disk_min_free_bytes,
            disk_min_free_fraction=self.options.disk_min_free_fraction,
            memory_min_available_fraction=self.options.memory_min_available_fraction,
        )
        self.gpu = GpuProbe(
            load_nvml(self.options.nvml_module),
            max_temperature_c=self.options.gpu_max_temperature_c,
            xid_healthy_interval_s=self.options.xid_healthy_interval_s,
        )
        self.injected = InjectedFaults()
        self._wake = asyncio.Event()
        self._job_status: schemas.JobStatus | None = None
        self._last_faults: list[str] | None = None
        #: the GPUs' recovery actions last published: the driver asking for a recovery is a
        #: change the sensor acts on, even when no fault name changed
        self._last_recovery: list[str] | None = None
        self._tracer = tracer("goodput.hostmon")

    def loops(self):
        return [self._monitor_loop()]

    # ---- commands ----------------------------------------------------------------------------

    async def execute(self, command: schemas.Command) -> tuple[bool, str]:
        if isinstance(command, schemas.ResetGpu):
            return await self._reset(command)
        if not isinstance(command, schemas.InjectFault):
            return await super().execute(command)
        if not self.options.enable_fault_injection:
            return False, (
                "fault injection disabled: start the host monitor with "
                "--set enable_fault_injection=true"
            )
        if command.node != self.node:
            return False, f"fault addressed to {command.node}, this host monitor serves {self.node}"
        try:
            change = self.injected.apply(command.fault, command.detail, command.clear)
        except InjectionError as exc:
            return False, str(exc)
        log.warning("fault injection: %s", change, extra={"command_id": command.command_id})
        # the fault is on the bus before the answer: a caller that then kills the node's ranks
        # (chaos ``fail-node``) has the sensor see the cause before its effect
        report = await self.report()
        if await self._publish(report, traced=True):
            self._last_faults = report.faults
        return True, change

    async def _reset(self, command: schemas.ResetGpu) -> tuple[bool, str]:
        """Reset the GPUs the command names, unless a rank may still use them."""
        if command.node != self.node:
            return False, f"reset addressed to {command.node}, this host monitor serves {self.node}"
        refusal = await self._reset_refusal(command)
        if refusal:
            return await self._ignore(command, command.gpus, refusal)
        known = await asyncio.to_thread(self.gpu.indexes)
        indexes = list(command.gpus) or known
        unknown = sorted(set(indexes) - set(known))
        if not known or unknown:
            what = f"GPU {', '.join(map(str, unknown))}" if unknown else "GPU"
            result = ResetResult(
                "failed", f"NVML sees no {what} on {self.node} to reset ({len(known)} GPUs)", 0.0
            )
        else:
            # the job status lists no pids on Kubernetes (and cannot see a stray process): the
            # driver knows who still holds each GPU
            holders = await asyncio.to_thread(self.gpu.holders, indexes)
            pids = sorted({pid for found in holders.values() for pid in found or []})
            names = await asyncio.to_thread(process_names, pids)
            refusal = held_refusal(holders, names)
            if refusal:
                return await self._ignore(command, indexes, refusal)
            log.warning("resetting GPU(s) %s", indexes, extra={"command_id": command.command_id})
            result = await reset_gpus(
                self.options.nvidia_smi, indexes, self.options.gpu_reset_timeout_s
            )
        if result.outcome == "succeeded":
            self.gpu.forget(indexes)
            cleared = self.injected.clear_gpu()
            if cleared:
                result.detail += f"; injected {', '.join(cleared)} cleared"
            self._wake.set()  # publish the cleared faults now
        log.log(
            logging.INFO if result.outcome == "succeeded" else logging.ERROR,
            "GPU reset %s in %.2f s: %s",
            result.outcome,
            result.duration_s,
            result.detail,
            extra={"command_id": command.command_id},
        )
        await self._emit_reset(command, indexes, result.outcome, result.detail, result.duration_s)
        return result.outcome == "succeeded", f"GPU reset {result.outcome}: {result.detail}"

    async def _ignore(
        self, command: schemas.ResetGpu, gpus: list[int], refusal: str
    ) -> tuple[bool, str]:
        log.warning("GPU reset ignored: %s", refusal, extra={"command_id": command.command_id})
        await self._emit_reset(command, gpus, "ignored", refusal, 0.0)
        return False, refusal

    async def _reset_refusal(self, command: schemas.ResetGpu) -> str:
        """Why the reset must not run now ("" when it may)."""
        status = await self._read_job_status()
        if status is None:
            return ""
        if command.run_id and status.run_id and command.run_id != status.run_id:
            return f"reset for run {command.run_id} is stale: run {status.run_id} is the job's now"
        if status.attempt > command.attempt:
            return (
                f"reset for attempt {command.attempt} is stale: the job is at attempt "
                f"{status.attempt}, whose ranks may use the GPU"
            )
        pids = list(status.pids.get(self.node, []))
        alive = await asyncio.to_thread(count_alive, pids, status.ts)
        if alive:
            return f"{alive} rank(s) of attempt {status.attempt} still run on {self.node}"
        return ""

    async def _emit_reset(
        self,
        command: schemas.ResetGpu,
        gpus: list[int],
        outcome: schemas.GpuResetOutcome,
        detail: str,
        duration_s: float,
    ) -> None:
        assert self.bus is not None
        await self.bus.emit(
            schemas.GpuReset(
                job=self.job,
                node=self.node,
                command_id=command.command_id,
                gpus=gpus,
                attempt=command.attempt,
                outcome=outcome,
                duration_s=duration_s,
                detail=detail,
            )
        )

    def health(self) -> tuple[bool, str]:
        faults = self._last_faults or []
        return True, f"host faults: {', '.join(faults)}" if faults else "host healthy"

    async def on_stop(self) -> None:
        await asyncio.to_thread(self.gpu.close)

    # ---- monitoring --------------------------------------------------------------------------

    async def _monitor_loop(self) -> None:
        loop = asyncio.get_running_loop()
        next_periodic = 0.0
        probe_s = min(self.options.probe_interval_s, self.options.health_interval_s)
        while not self.stopping.is_set():
            try:
                report = await self.report()
            except Exception:  # a probe failing once must not end the monitoring
                log.exception("host probe failed")
                await asyncio.sleep(probe_s)
                continue
            recovery = [gpu.recovery_action for gpu in report.gpus]
            changed = report.faults != self._last_faults or recovery != self._last_recovery
            if changed or loop.time() >= next_periodic:
                if changed and self._last_faults is not None:
                    log.warning("host faults now: %s", report.faults or "none")
                if await self._publish(report, traced=changed):
                    self._last_faults, self._last_recovery = report.faults, recovery
                    next_periodic = loop.time() + self.options.health_interval_s
            self._wake.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wait_wake_or_stop(), probe_s)

    async def _wait_wake_or_stop(self) -> None:
        stop = asyncio.ensure_future(self.stopping.wait())
        wake = asyncio.ensure_future(self._wake.wait())
        try:
            await asyncio.wait([stop, wake], return_when=asyncio.FIRST_COMPLETED)
        finally:
            stop.cancel()
            wake.cancel()

    async def report(self) -> schemas.HostHealth:
        """Probe everything once and compose the node's health report."""
        status = await self._read_job_status()
        pids: list[int] = []
        expected = 0
        if status is not None and status.state in RUNNING_STATES:
            pids = list(status.pids.get(self.node, []))
            expected = len(pids)
        status_ts = status.ts if status is not None else 0
        sample = await asyncio.to_thread(self._probe, pids, status_ts)
        faults = set(sample.gpu.faults)
        if sample.disk.full:
            faults.add("disk_full")
        if sample.memory.pressure:
            faults.add("memory_pressure")
        faults.update(self.injected.faults())
        details = [sample.gpu.detail] if sample.gpu.detail else []
        if self.injected:
            details.append(f"injected: {', '.join(self.injected.faults())}")
        return schemas.HostHealth(
            job=self.job,
            node=self.node,
            healthy=not faults,
            gpu_available=sample.gpu.available,
            gpus=sample.gpu.gpus,
            disk_free_bytes=sample.disk.free_bytes,
            disk_total_bytes=sample.disk.total_bytes,
            mem_available_bytes=sample.memory.available_bytes,
            mem_total_bytes=sample.memory.total_bytes,
            ranks_alive=sample.ranks_alive if expected else 0,
            ranks_expected=expected,
            attempt=status.attempt if status is not None else 0,
            faults=sorted(faults),
            detail="; ".join(details),
        )

    def _probe(self, pids: list[int], status_ts: int) -> HostSample:
        """The blocking part (NVML, statfs, /proc), run off the event loop."""
        return HostSample(
            gpu=self.gpu.sample(),
            disk=sample_disk(self.volume, self.limits),
            memory=sample_memory(self.limits),
            ranks_alive=count_alive(pids, status_ts),
        )

    async def _read_job_status(self) -> schemas.JobStatus | None:
        """The actuator's newest job status; the last one known while the bus is away."""
        assert self.bus is not None
        try:
            kv = await self.bus.kv(subjects.STATE_BUCKET)
            entry = await asyncio.wait_for(
                kv.get(subjects.kv_key(self.job, "job_status")), timeout=2
            )
        except nats.js.errors.KeyNotFoundError:
            self._job_status = None
            return None
        except BUS_ERRORS as exc:
            log.debug("job status not readable: %r", exc)
            return self._job_status
        try:
            status = schemas.decode_event(entry.value or b"")
        except schemas.SchemaError as exc:
            log.warning("undecodable job status in KV: %s", exc)
            return self._job_status
        if isinstance(status, schemas.JobStatus):
            self._job_status = status
        return self._job_status

    async def _publish(self, report: schemas.HostHealth, *, traced: bool = False) -> bool:
        """Publish ``report``; a change of faults is a span (the sensor's signal links to it)."""
        assert self.bus is not None
        span = (
            self._tracer.start_as_current_span(
                "hostmon faults changed",
                attributes={"goodput.node": self.node, "goodput.faults": report.faults},
            )
            if traced
            else contextlib.nullcontext()
        )
        try:
            with span:
                await self.bus.emit(
                    report, retry_for_s=max(5 * self.options.health_interval_s, 5.0)
                )
        except BusUnavailableError as exc:
            log.warning("host health not published: %s", exc)
            return False
        return True


SERVICE = HostMonitorService
