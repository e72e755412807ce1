"""Each fault's implementation: resolve its target in the job, apply it, say what was done."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import signal
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import msgspec

from goodput import schemas, subjects
from goodput.bus.cluster import EmbeddedCluster
from goodput.bus.embedded import EmbeddedNats, EmbeddedNatsError, ServerRecord, read_record
from goodput.bus.routing import decode_event_on
from goodput.owned_process import is_running, stale_line, standing
from goodput.tools.chaos import spec as faults
from goodput.tools.chaos.storage import clear_volume, corrupt_newest_checkpoint, fill_volume
from goodput.tools.chaos.straggler import StragglerRecord, duty_cycle, stop_detached
from goodput.tools.chaos.targets import ChaosContext, ChaosError, RankTarget
from goodput.tools.stack.keeper import kept_service

#: how long to wait for a host monitor to say whether it applied an injected fault
HOSTMON_ANSWER_S = 5.0
MIB = 1 << 20


@dataclass
class FaultOutcome:
    kind: str
    target: str
    ok: bool
    detail: str
    #: the fault as applied, its random targets resolved (so it can be cleared later)
    applied: faults.FaultSpec

    def as_dict(self) -> dict:
        return {"fault": self.kind, "target": self.target, "ok": self.ok, "detail": self.detail}


async def fire(spec: faults.FaultSpec, ctx: ChaosContext) -> FaultOutcome:
    """Apply one fault; a fault that cannot be applied is an outcome with ``ok=False``."""
    try:
        return await _IMPLEMENTATIONS[type(spec)](spec, ctx)
    except (ChaosError, OSError, EmbeddedNatsError) as exc:
        return FaultOutcome(spec.kind, _describe_target(spec), False, str(exc), spec)


def _describe_target(spec: faults.FaultSpec) -> str:
    for name in ("rank", "node", "service"):
        value = getattr(spec, name, None)
        if value not in (None, ""):
            return f"{name} {value}"
    return "nats-server" if isinstance(spec, faults.RestartNats) else ""


def _rank_target(process: RankTarget) -> str:
    return f"rank {process.rank} on {process.node} (pid {process.pid})"


def _kill_process_group(pid: int) -> None:
    """SIGKILL a rank and its children (the actuator starts each rank in its own session)."""
    with contextlib.suppress(ProcessLookupError):
        if os.getpgid(pid) == pid:
            os.killpg(pid, signal.SIGKILL)
        else:
            os.kill(pid, signal.SIGKILL)


# ---- ranks -----------------------------------------------------------------------------------


async def kill_rank(spec: faults.KillRank, ctx: ChaosContext) -> FaultOutcome:
    process = await ctx.rank(spec.rank)
    os.kill(process.pid, signal.SIGKILL)
    applied = msgspec.structs.replace(spec, rank=process.rank)
    return FaultOutcome(spec.kind, _rank_target(process), True, "SIGKILL sent", applied)


def _slows_compute(spec: faults.SlowRank, process: RankTarget) -> bool:
    if spec.method == "compute" and not process.injectable:
        raise ChaosError(
            f"rank {process.rank} was started without GOODPUT_ENABLE_FAULT_INJECTION=1: its "
            "compute cannot be slowed (use --method sigstop)"
        )
    return spec.method == "compute" or (spec.method == "auto" and process.injectable)


async def _send_slow(ctx: ChaosContext, process: RankTarget, factor: float, duration_s: float):
    """Ask the rank's trainer shim to stretch its compute (factor 1: back to normal)."""
    command = schemas.InjectFault(
        job=ctx.job,
        node=process.node,
        fault="slow",
        detail=str(process.rank),
        factor=factor,
        duration_s=duration_s,
        clear=factor == 1.0,
        reason="goodput chaos slow-rank",
    )
    bus = await ctx.bus()
    await bus.send_command(subjects.TRAINER, command, retry_for_s=10)


async def slow_rank(spec: faults.SlowRank, ctx: ChaosContext) -> FaultOutcome:
    """In the foreground: returns when the straggler period is over."""
    process = await ctx.rank(spec.rank)
    applied = msgspec.structs.replace(spec, rank=process.rank)
    if not _slows_compute(spec, process):
        detail = await duty_cycle(process.pid, spec.factor, spec.duration_s, spec.period_s)
        return FaultOutcome(spec.kind, _rank_target(process), True, detail, applied)
    await _send_slow(ctx, process, spec.factor, spec.duration_s)
    try:
        await asyncio.sleep(spec.duration_s)
    finally:
        await _send_slow(ctx, process, 1.0, 0.0)
    detail = f"compute {spec.factor:g}× as long for {spec.duration_s:g} s (trainer shim)"
    return FaultOutcome(spec.kind, _rank_target(process), True, detail, applied)


async def clear_slow_rank(ctx: ChaosContext, rank: int) -> str:
    """End a slow-rank early, whichever way it slows the rank."""
    stopped = stop_detached(ctx.state_dir, ctx.job, rank)
    process = next((p for p in await ctx.ranks() if p.rank == rank), None)
    if process is None or not process.injectable:
        return stopped
    await _send_slow(ctx, process, 1.0, 0.0)
    return f"{stopped}; compute of rank {rank} back to normal"


async def slow_rank_detached(spec: faults.SlowRank, ctx: ChaosContext) -> FaultOutcome:
    """Slow the rank and return: its shim ends the slowdown after ``duration_s`` by itself, or
    a background duty-cycle process recorded in ``<state-dir>/chaos/`` does."""
    process = await ctx.rank(spec.rank)
    if _slows_compute(spec, process):
        await _send_slow(ctx, process, spec.factor, spec.duration_s)
        return FaultOutcome(
            spec.kind,
            _rank_target(process),
            True,
            f"compute {spec.factor:g}× as long for {spec.duration_s:g} s (trainer shim; stop "
            f"early with `goodput chaos slow-rank --rank {process.rank} --clear`)",
            msgspec.structs.replace(spec, rank=process.rank),
        )
    path = ctx.paths.slow_rank_record(ctx.job, process.rank)
    if path.exists():
        stop_detached(ctx.state_dir, ctx.job, process.rank)
    path.parent.mkdir(parents=True, exist_ok=True)
    argv = [
        sys.executable,
        "-m",
        "goodput.tools.chaos.straggler",
        *("--state-dir", str(ctx.state_dir), "--job", ctx.job),
        *("--rank", str(process.rank), "--pid", str(process.pid)),
        *("--factor", str(spec.factor), "--duration", str(spec.duration_s)),
        *("--period", str(spec.period_s)),
    ]
    log_path = ctx.paths.slow_rank_log(process.rank)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as log:
        worker = subprocess.Popen(
            argv,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    record = StragglerRecord(
        worker_pid=worker.pid,
        target_pid=process.pid,
        job=ctx.job,
        rank=process.rank,
        factor=spec.factor,
        until_epoch_s=time.time() + spec.duration_s,
    )
    path.write_bytes(msgspec.json.encode(record))
    applied = msgspec.structs.replace(spec, rank=process.rank)
    return FaultOutcome(
        spec.kind,
        _rank_target(process),
        True,
        f"running at 1/{spec.factor:g} speed for {spec.duration_s:g} s in the background "
        f"(worker pid {worker.pid}; stop early with `goodput chaos slow-rank --rank "
        f"{process.rank} --clear`)",
        applied,
    )


async def hang_rank(spec: faults.HangRank, ctx: ChaosContext) -> FaultOutcome:
    process = await ctx.rank(spec.rank)
    command = schemas.InjectFault(
        job=ctx.job,
        node=process.node,
        fault="hang",
        detail=str(process.rank),
        clear=spec.clear,
        reason="goodput chaos hang-rank",
    )
    bus = await ctx.bus()
    await bus.send_command(subjects.TRAINER, command, retry_for_s=10)
    detail = (
        f"{'un-hang' if spec.clear else 'hang'} command {command.command_id} sent to the trainer"
    )
    if not process.injectable:
        detail += (
            "; WARNING: this rank was started without GOODPUT_ENABLE_FAULT_INJECTION=1, "
            "its shim will refuse it"
        )
    applied = msgspec.structs.replace(spec, rank=process.rank)
    return FaultOutcome(spec.kind, _rank_target(process), True, detail, applied)


def _not_injectable(processes: list[RankTarget]) -> str:
    """A warning for the ranks whose shim will refuse an injected fault ("" for none)."""
    refusing = [str(p.rank) for p in processes if not p.injectable]
    if not refusing:
        return ""
    return (
        f"; WARNING: rank(s) {', '.join(refusing)} were started without "
        "GOODPUT_ENABLE_FAULT_INJECTION=1, their shim will refuse it"
    )


async def _numerical(ctx: ChaosContext, command: schemas.InjectFault) -> str:
    """Send a numerical fault to the trainer; the shims it targets apply it at their next
    step boundary (``goodput.shim.injected_faults``)."""
    bus = await ctx.bus()
    await bus.send_command(subjects.TRAINER, command, retry_for_s=10)
    return f"{command.fault} command {command.command_id} sent to the trainer"


async def _rank_numerical(
    spec: faults.NanLoss | faults.LossSpike, ctx: ChaosContext, fault: str, factor: float = 1.0
) -> FaultOutcome:
    """A numerical fault of one rank's next loss ("nan", "loss-spike")."""
    process = await ctx.rank(spec.rank)
    command = schemas.InjectFault(
        job=ctx.job,
        node=process.node,
        fault=fault,
        detail=str(process.rank),
        factor=factor,
        reason=f"goodput chaos {spec.kind}",
    )
    detail = await _numerical(ctx, command) + (f" (loss × {factor:g})" if factor > 1 else "")
    applied = msgspec.structs.replace(spec, rank=process.rank)
    return FaultOutcome(
        spec.kind, _rank_target(process), True, detail + _not_injectable([process]), applied
    )


async def nan_loss(spec: faults.NanLoss, ctx: ChaosContext) -> FaultOutcome:
    return await _rank_numerical(spec, ctx, "nan")


async def loss_spike(spec: faults.LossSpike, ctx: ChaosContext) -> FaultOutcome:
    return await _rank_numerical(spec, ctx, "loss-spike", spec.factor)


async def sdc(spec: faults.Sdc, ctx: ChaosContext) -> FaultOutcome:
    """Every rank of the node flips the same bit: one replica where a node holds one."""
    node = await ctx.node(spec.node)
    ranks = await ctx.ranks(node)
    if not ranks:
        raise ChaosError(f"no live rank on {node}: nothing to corrupt")
    command = schemas.InjectFault(job=ctx.job, node=node, fault="sdc", reason="goodput chaos sdc")
    detail = await _numerical(ctx, command) + (
        f"; ranks {', '.join(str(p.rank) for p in ranks)} flip the top mantissa bit of element "
        "0 of their first parameter after their next optimizer step"
    )
    applied = msgspec.structs.replace(spec, node=node)
    return FaultOutcome(spec.kind, node, True, detail + _not_injectable(ranks), applied)


# ---- nodes -----------------------------------------------------------------------------------


async def inject_host_fault(
    ctx: ChaosContext, node: str, fault: str, detail: str, clear: bool
) -> tuple[bool, str]:
    """Send InjectFault to the node's host monitor and wait briefly for its answer."""
    bus = await ctx.bus()
    command = schemas.InjectFault(
        job=ctx.job, node=node, fault=fault, detail=detail, clear=clear, reason="goodput chaos"
    )
    target = subjects.node_target(subjects.HOST_MONITOR, node)
    answer: asyncio.Future[schemas.ActionResult] = asyncio.get_running_loop().create_future()

    async def on_result(msg) -> None:
        with contextlib.suppress(schemas.SchemaError):
            event = decode_event_on(msg.subject, msg.data)
            if (
                isinstance(event, schemas.ActionResult)
                and event.command_id == command.command_id
                and not answer.done()
            ):
                answer.set_result(event)

    subscription = await bus.nc.subscribe(subjects.event(ctx.job, "action_result"), cb=on_result)
    try:
        await bus.send_command(target, command, retry_for_s=10)
        result = await asyncio.wait_for(answer, HOSTMON_ANSWER_S)
    except TimeoutError:
        return True, (
            f"queued for {target}; no answer within {HOSTMON_ANSWER_S:g} s "
            "(is its host monitor running?)"
        )
    finally:
        await subscription.unsubscribe()
    return result.ok, f"{target}: {result.detail}"


async def fail_node(spec: faults.FailNode, ctx: ChaosContext) -> FaultOutcome:
    node = await ctx.node(spec.node)
    applied = msgspec.structs.replace(spec, node=node)
    if spec.clear:
        ok, answer = await inject_host_fault(ctx, node, "node_down", "", clear=True)
        return FaultOutcome(spec.kind, node, ok, answer, applied)
    # the host's fault first (its report is on the bus once the host monitor answers), then
    # its ranks die: the other order races, and a rank's exit seen alone starts a restart on
    # the failing node that the node's loss then overrides
    ok, answer = await inject_host_fault(ctx, node, "node_down", "goodput chaos", clear=False)
    ranks = await ctx.ranks(node)
    for process in ranks:
        _kill_process_group(process.pid)
    # none left is common under a fast supervisor: the host's fault was reported first, and
    # the ranks of a lost node may be stopped for its replacement before they are looked for
    killed = ", ".join(f"rank {p.rank} (pid {p.pid})" for p in ranks) or (
        f"no live rank left on {node} (already exited or stopped)"
    )
    return FaultOutcome(spec.kind, node, ok, f"SIGKILL: {killed}; {answer}", applied)


async def gpu_xid(spec: faults.GpuXid, ctx: ChaosContext) -> FaultOutcome:
    node = await ctx.node(spec.node)
    ok, answer = await inject_host_fault(ctx, node, "gpu_xid", str(spec.xid), spec.clear)
    return FaultOutcome(spec.kind, node, ok, answer, msgspec.structs.replace(spec, node=node))


async def host_fault(spec: faults.HostFault, ctx: ChaosContext) -> FaultOutcome:
    node = await ctx.node(spec.node)
    ok, answer = await inject_host_fault(ctx, node, spec.fault, spec.detail, spec.clear)
    return FaultOutcome(spec.kind, node, ok, answer, msgspec.structs.replace(spec, node=node))


async def fill_disk(spec: faults.FillDisk, ctx: ChaosContext) -> FaultOutcome:
    node = await ctx.node(spec.node)
    volume = ctx.volume(node)
    applied = msgspec.structs.replace(spec, node=node)
    if spec.clear:
        freed = await asyncio.to_thread(clear_volume, volume)
        return FaultOutcome(
            spec.kind, node, True, f"ballast removed from {volume} ({freed / MIB:.1f} MiB)", applied
        )
    result = await asyncio.to_thread(fill_volume, volume, int(spec.free_mib * MIB))
    return FaultOutcome(
        spec.kind,
        node,
        True,
        f"ballast {result.ballast} grew by {result.added_bytes / MIB:.1f} MiB; "
        f"{result.free_bytes / MIB:.2f} MiB free",
        applied,
    )


async def corrupt_checkpoint(spec: faults.CorruptCheckpoint, ctx: ChaosContext) -> FaultOutcome:
    node = await ctx.node(spec.node)
    try:
        done = await asyncio.to_thread(corrupt_newest_checkpoint, ctx.volume(node), spec.step)
    except FileNotFoundError as exc:
        raise ChaosError(str(exc)) from exc
    return FaultOutcome(
        spec.kind,
        node,
        True,
        f"step {done.step}: byte {done.offset} of {done.file.name} flipped "
        f"0x{done.old:02x} → 0x{done.new:02x}",
        msgspec.structs.replace(spec, node=node, step=done.step),
    )


# ---- the stack -------------------------------------------------------------------------------


async def kill_service(spec: faults.KillService, ctx: ChaosContext) -> FaultOutcome:
    if ctx.stack is None:
        raise ChaosError(f"no {ctx.paths.stack_record}: the stack was not started there")
    matches = [
        s
        for s in ctx.stack.services
        if s.name == spec.service and (not spec.node or s.node == spec.node)
    ]
    if len(matches) != 1:
        known = ", ".join(s.key for s in ctx.stack.services)
        why = "no" if not matches else "more than one"
        raise ChaosError(
            f"{why} service {spec.service!r}{' on ' + spec.node if spec.node else ''} "
            f"(give --node for per-node services); the stack has: {known}"
        )
    service = matches[0]
    keeper = standing(service.process)
    if keeper != "running":
        raise ChaosError(
            stale_line(f"{service.key} is not running: its keeper", service.process, keeper)
        )
    process = kept_service(service.process)
    if process is None or f"goodput_services.{service.name}" not in process.cmdline:
        raise ChaosError(f"{service.key} is not running now (its keeper is between restarts)")
    if is_running(process):  # the keeper's child, checked just before the signal
        os.kill(process.pid, signal.SIGKILL)
    detail = f"SIGKILL sent to pid {process.pid} (its keeper starts it again)"
    return FaultOutcome(spec.kind, service.key, True, detail, spec)


async def restart_nats(spec: faults.RestartNats, ctx: ChaosContext) -> FaultOutcome:
    recorded = read_record(ctx.paths)
    if recorded is None:
        raise ChaosError(f"no embedded nats-server recorded ({ctx.paths.nats_record})")
    record = recorded.server(spec.member)
    if recorded.cluster_ports:
        cluster = EmbeddedCluster.from_record(ctx.paths)
        server = cluster.members[spec.member]
        start: Callable[[], ServerRecord] = functools.partial(cluster.restart, spec.member)
    else:
        server = EmbeddedNats(ctx.paths, port=record.port, detach=True)
        start = server.start
    if Path(record.store_dir).resolve() != server.store_dir.resolve():
        raise ChaosError(f"the recorded store {record.store_dir} is not under {ctx.state_dir}")
    found = standing(record.process)
    if found == "replaced":
        raise ChaosError(stale_line("the recorded nats-server", record.process, found))
    if found == "running":
        os.kill(record.pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while is_running(record.process):
            if time.monotonic() > deadline:
                raise ChaosError(f"nats-server pid {record.pid} survived SIGKILL")
            await asyncio.sleep(0.02)
    await asyncio.sleep(spec.down_s)
    started = await asyncio.to_thread(start)
    return FaultOutcome(
        spec.kind,
        "nats-server",
        True,
        f"pid {record.pid} killed; restarted as pid {started.pid} on {started.url} "
        f"after {spec.down_s:g} s down",
        spec,
    )


Implementation = Callable[[faults.FaultSpec, ChaosContext], Awaitable[FaultOutcome]]
F = TypeVar("F", bound=faults.FaultSpec)


def _entry(
    spec_type: type[F], apply: Callable[[F, ChaosContext], Awaitable[FaultOutcome]]
) -> tuple[type[faults.FaultSpec], Implementation]:
    """One row of the table: ``apply`` is checked to take ``spec_type`` here, and is handed
    only a ``spec_type`` when called."""

    def implementation(spec: faults.FaultSpec, ctx: ChaosContext) -> Awaitable[FaultOutcome]:
        if not isinstance(spec, spec_type):
            raise TypeError(f"the {schemas.kind_of(spec_type)} action got a {spec.kind}")
        return apply(spec, ctx)

    return spec_type, implementation


_IMPLEMENTATIONS: dict[type[faults.FaultSpec], Implementation] = dict(
    [
        _entry(faults.KillRank, kill_rank),
        _entry(faults.FailNode, fail_node),
        _entry(faults.GpuXid, gpu_xid),
        _entry(faults.HostFault, host_fault),
        _entry(faults.SlowRank, slow_rank),
        _entry(faults.HangRank, hang_rank),
        _entry(faults.NanLoss, nan_loss),
        _entry(faults.LossSpike, loss_spike),
        _entry(faults.Sdc, sdc),
        _entry(faults.FillDisk, fill_disk),
        _entry(faults.CorruptCheckpoint, corrupt_checkpoint),
        _entry(faults.KillService, kill_service),
        _entry(faults.RestartNats, restart_nats),
    ]
)
