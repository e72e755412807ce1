"""Stopping the stack's processes (`goodput down`, the end of a `run` that started it, an `up`
undone), from the record its session (:mod:`.session`) read under the lock.

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
    check_recorded,
    marked_identity,
    marked_processes,
    stale_line,
    terminate,
)
from goodput.state_dir import StateDir
from goodput.tools.stack.record import StackRecord

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


def stop_processes(paths: StateDir, stack: StackRecord | None, report: StopReport) -> StopReport:
    """Stop the recorded services (the actuator first, given time to let running ranks save),
    the ranks left running, the embedded server(s), then whatever else still carries the
    stack's marker; remove the record and the stack's dead ranks' shared memory."""
    for service in sorted(stack.services if stack else [], key=lambda s: s.name != "actuator"):
        timeout_s = ACTUATOR_STOP_S if service.name == "actuator" else SERVICE_STOP_S
        found = terminate(service.process, timeout_s, group=True)
        report.stopped += found == "running"
        if found == "replaced":
            report.stale.append(stale_line(service.key, service.process, found))
    for ranks_file in paths.ranks_records():
        for pid in _rank_pids(ranks_file, report):
            identity = marked_identity(pid, paths.root)  # a rank carries its actuator's marker
            if identity is not None:
                report.stopped += terminate(identity, timeout_s=5) == "running"
        ranks_file.unlink()
    try:
        report.stale += stop_recorded(paths)
    except RecordUnreadable as exc:
        report.unreadable.append(str(exc.code))
        paths.nats_record.unlink(missing_ok=True)
    for identity in sorted(marked_processes(paths.root), key=_stop_order):
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


def undo_services(before: StackRecord, current: StackRecord) -> tuple[int, StackRecord]:
    """Stop the services of ``current`` that were not running in ``before`` (the record read
    before a start); how many processes were stopped, and the record of what is kept."""
    checked = check_recorded({p.key: p.process for p in before.services})
    extra = [p for p in current.services if p.key not in checked.running]
    stopped = sum(terminate(p.process, SERVICE_STOP_S, group=True) == "running" for p in extra)
    services = [p for p in current.services if p.key in checked.running]
    nodes = [node for node in current.nodes if any(p.node == node for p in services)]
    return stopped, msgspec.structs.replace(current, nodes=nodes, services=services)
