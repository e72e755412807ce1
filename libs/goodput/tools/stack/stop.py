"""Stopping the stack's processes (`goodput down`, the end of a `run` that started it, an `up`
undone), from the record its session (:mod:`.session`) holds.

A stop gathers first and acts once: the services of ``stack.json``, the embedded server(s) of
``nats.json`` and every process carrying the stack's marker (the ranks of the actuator's ranks
files among them, so a corrupt or lost record, or an orphan of a crashed `up`, leaves nothing
running) make one ordered plan (:func:`stop_plan`, pure), which one call stops
(:func:`goodput.owned_process.terminate_in_order`: each process checked against its identity
before any signal).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import msgspec

from goodput.bus.embedded import EmbeddedRecord, take_record
from goodput.checkpoint.format.layout import local_root
from goodput.checkpoint.format.shm_segments import sweep_dead
from goodput.owned_process import (
    ProcessIdentity,
    RecordUnreadable,
    Stop,
    check_recorded,
    marked_processes,
    stale_line,
    terminate,
    terminate_in_order,
)
from goodput.state_dir import StateDir
from goodput.supervisor.rank_pids import read_rank_pids
from goodput.tools.stack.record import StackRecord

#: the actuator lets ranks checkpoint before it exits (its own grace period, plus margin)
ACTUATOR_STOP_S = 75.0
#: any other service, an embedded server, or a process found by the stack's marker
SERVICE_STOP_S = 10.0
#: a rank the actuator's ranks file names, left running by an actuator that is gone
RANK_STOP_S = 5.0
#: the stages of a stop, in order: the actuator first (it lets running ranks save and exit),
#: the other services, the ranks left running, the bus last (a stopping service still has it)
ACTUATOR, SERVICE, RANK, BUS = range(4)


@dataclass
class StopReport:
    """What `down` did: processes stopped, recorded ones not signalled, unreadable records."""

    stopped: int = 0
    #: recorded processes whose pid another process holds now (never signalled)
    stale: list[str] = field(default_factory=list)
    unreadable: list[str] = field(default_factory=list)
    #: shared-memory segments of the stack's exited ranks, removed
    segments: int = 0


def stop_processes(paths: StateDir, stack: StackRecord | None, report: StopReport) -> StopReport:
    """Gather every process of the stack (the services ``stack`` records, the embedded
    server(s) ``nats.json`` records, every process carrying the stack's marker, the ranks of
    the actuator's ranks files among them), stop them in one ordered pass (:func:`stop_plan`),
    then remove the records and the stack's dead ranks' shared memory."""
    try:
        servers = take_record(paths)
    except RecordUnreadable as exc:
        servers = None
        report.unreadable.append(str(exc.code))
    ranks_files = paths.ranks_records()
    rank_pids: set[int] = set()
    for ranks_file in ranks_files:
        try:
            rank_pids.update(pid for pids in read_rank_pids(ranks_file).values() for pid in pids)
        except RecordUnreadable as exc:
            report.unreadable.append(str(exc.code))
    plan = stop_plan(stack, servers, rank_pids, marked_processes(paths.root))
    for (name, stop), found in zip(plan, terminate_in_order([s for _, s in plan]), strict=True):
        report.stopped += found == "running"
        if found == "replaced" and name:
            report.stale.append(stale_line(name, stop.identity, found))
    for ranks_file in ranks_files:
        ranks_file.unlink(missing_ok=True)
    paths.stack_record.unlink(missing_ok=True)
    # a killed rank's host buffer outlives it for its replacement to read; with the stack
    # stopped no engine will save on its volume again to sweep it
    for node in paths.nodes():
        for volume in node.glob(local_root("*")):
            report.segments += len(sweep_dead(volume))
    return report


def stop_plan(
    stack: StackRecord | None,
    servers: EmbeddedRecord | None,
    rank_pids: set[int],
    marked: list[ProcessIdentity],
) -> list[tuple[str, Stop]]:
    """Every process to stop, in order, each by the name a stale one is reported under ("":
    found by the marker, never stale). What a record names comes before what only the marker
    finds at the same stage; a process both name is found gone the second time. A pid of a
    ranks file counts only if its process carries the marker (it is in ``marked``)."""
    staged: list[tuple[int, str, Stop]] = []
    for service in stack.services if stack else []:
        actuator = service.name == "actuator"
        timeout_s = ACTUATOR_STOP_S if actuator else SERVICE_STOP_S
        stop = Stop(service.process, timeout_s, group=True)
        staged.append((ACTUATOR if actuator else SERVICE, service.key, stop))
    for name, process in (servers.processes if servers else {}).items():
        staged.append((BUS, name, Stop(process, SERVICE_STOP_S)))
    for identity in marked:
        if identity.pid in rank_pids:
            staged.append((RANK, "", Stop(identity, RANK_STOP_S)))
            continue
        stage = _role(identity)
        timeout_s = ACTUATOR_STOP_S if stage == ACTUATOR else SERVICE_STOP_S
        staged.append((stage, "", Stop(identity, timeout_s, group=True)))
    return [(name, stop) for _, name, stop in sorted(staged, key=lambda item: item[0])]


def _role(identity: ProcessIdentity) -> int:
    """The stage of a process found by the marker: the actuator (and its keeper), a
    nats-server, else a service (a keeper, or a rank no ranks file names)."""
    if any(part.endswith("goodput_services.actuator") for part in identity.cmdline):
        return ACTUATOR
    if identity.cmdline and Path(identity.cmdline[0]).name == "nats-server":
        return BUS
    return SERVICE


def undo_services(before: StackRecord, current: StackRecord) -> tuple[int, StackRecord]:
    """Stop the services of ``current`` that were not running in ``before`` (the record read
    before a start); how many processes were stopped, and the record of what is kept."""
    checked = check_recorded({p.key: p.process for p in before.services})
    extra = [p for p in current.services if p.key not in checked.running]
    stopped = sum(terminate(p.process, SERVICE_STOP_S, group=True) == "running" for p in extra)
    services = [p for p in current.services if p.key in checked.running]
    nodes = [node for node in current.nodes if any(p.node == node for p in services)]
    return stopped, msgspec.structs.replace(current, nodes=nodes, services=services)
