"""Stopping the stack (`goodput down`, the end of a `run` that started it, an `up` undone).

Every recorded process is checked against its recorded identity before any signal
(:mod:`goodput.owned_process`); then whatever still carries the stack's marker is stopped too,
so a corrupt or lost record, or an orphan of a crashed `up`, leaves nothing running.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import msgspec

from goodput.bus.embedded import stop_recorded
from goodput.checkpoint.format.layout import local_root
from goodput.checkpoint.format.shm_segments import sweep_dead
from goodput.owned_process import (
    ProcessIdentity,
    RecordUnreadable,
    is_running,
    marked_identity,
    marked_processes,
    stale_line,
    terminate,
)
from goodput.state_dir import StateDir
from goodput.tools.stack.lock import stack_lock
from goodput.tools.stack.record import StackRecord, read_stack, write_stack

#: the actuator lets ranks checkpoint before it exits (its own grace period, plus margin)
ACTUATOR_STOP_S = 75.0
#: any other service, or a process found by the stack's marker
SERVICE_STOP_S = 10.0


@dataclass
class StopReport:
    """What `down` did: processes stopped, recorded ones not signalled, unreadable records."""

    stopped: int = 0
    #: recorded processes whose pid another process holds now (never signalled)
    stale: list[str] = field(default_factory=list)
    unreadable: list[str] = field(default_factory=list)
    #: shared-memory segments of the stack's exited ranks, removed
    segments: int = 0


def stop_stack(state_dir: Path) -> StopReport:
    """Stop every service, any rank left running, the embedded server, then whatever else
    still carries the stack's marker (what a lost or corrupt record no longer names).

    The actuator is asked first and given time: it lets running ranks save and exit. Every
    recorded process is checked before it is signalled. Holds the state directory's lock.
    """
    if not state_dir.is_dir():  # nothing recorded, nothing to lock: only what is marked
        return _stop_stack(state_dir)
    with stack_lock(state_dir):
        return _stop_stack(state_dir)


def _stop_stack(state_dir: Path) -> StopReport:
    paths = StateDir(state_dir)
    report = StopReport()
    try:
        stack = read_stack(state_dir)
    except RecordUnreadable as exc:
        stack = None
        report.unreadable.append(str(exc.code))
    for service in sorted(stack.services if stack else [], key=lambda s: s.name != "actuator"):
        timeout_s = ACTUATOR_STOP_S if service.name == "actuator" else SERVICE_STOP_S
        found = terminate(service.process, timeout_s, group=True)
        report.stopped += found == "running"
        if found == "replaced":
            report.stale.append(stale_line(service.key, service.process, found))
    for ranks_file in paths.ranks_records():
        for pid in _rank_pids(ranks_file, report):
            identity = marked_identity(pid, state_dir)  # a rank carries its actuator's marker
            if identity is not None:
                report.stopped += terminate(identity, timeout_s=5) == "running"
        ranks_file.unlink()
    try:
        report.stale += stop_recorded(paths)
    except RecordUnreadable as exc:
        report.unreadable.append(str(exc.code))
        paths.nats_record.unlink(missing_ok=True)
    for identity in sorted(marked_processes(state_dir), key=_stop_order):
        timeout_s = ACTUATOR_STOP_S if _stop_order(identity) == 0 else SERVICE_STOP_S
        report.stopped += terminate(identity, timeout_s, group=True) == "running"
    paths.stack_record.unlink(missing_ok=True)
    # a killed rank's host buffer outlives it for its replacement to read; with the stack
    # stopped no engine will save on its volume again to sweep it
    for node in paths.nodes():
        for volume in node.glob(local_root("*")):
            report.segments += len(sweep_dead(volume))
    return report


def _rank_pids(ranks_file: Path, report: StopReport) -> list[int]:
    try:
        pids = msgspec.json.decode(ranks_file.read_bytes(), type=dict[str, list[int]])
    except msgspec.DecodeError as exc:
        report.unreadable.append(f"the ranks file {ranks_file} is unreadable ({exc})")
        return []
    return [pid for node_pids in pids.values() for pid in node_pids]


def _stop_order(identity: ProcessIdentity) -> int:
    """Found by the marker: the actuator (and its keeper) first, the nats-server(s) last."""
    if any(part.endswith("goodput_services.actuator") for part in identity.cmdline):
        return 0
    if identity.cmdline and Path(identity.cmdline[0]).name == "nats-server":
        return 2
    return 1


def undo_start(state_dir: Path, before: StackRecord | None) -> int:
    """Stop what was started since ``before`` (the stack record read before starting): all of
    it, embedded server included, if there was no stack; else the services it did not list
    alive. How many processes were stopped. Holds the state directory's lock."""
    with stack_lock(state_dir):
        if before is None:
            return _stop_stack(state_dir).stopped
        return _undo_services(state_dir, before)


def _undo_services(state_dir: Path, before: StackRecord) -> int:
    current = read_stack(state_dir)
    if current is None:
        return 0
    kept = {p.key for p in before.services if is_running(p.process)}
    extra = [p for p in current.services if p.key not in kept]
    stopped = sum(terminate(p.process, SERVICE_STOP_S, group=True) == "running" for p in extra)
    services = [p for p in current.services if p.key in kept]
    nodes = [node for node in current.nodes if any(p.node == node for p in services)]
    write_stack(state_dir, msgspec.structs.replace(current, nodes=nodes, services=services))
    return stopped
