"""What a host report says is wrong with its node, as one canonical tuple of fault names."""

from __future__ import annotations

from goodput import schemas


def host_faults(event: schemas.HostHealth) -> tuple[str, ...]:
    """The sorted, de-duplicated faults of a host report (empty when the host is healthy).

    GPU records are turned into names (``gpu1 xid 79``) so that a repeated report of the same
    fault compares equal and is not reported twice; an unhealthy report without faults is one.
    """
    faults = list(event.faults)
    for gpu in event.gpus:
        if not gpu.present:
            faults.append(f"gpu{gpu.index} missing")
        if gpu.xid_errors:
            faults.append(f"gpu{gpu.index} xid {','.join(map(str, gpu.xid_errors))}")
        if gpu.ecc_uncorrected:
            faults.append(f"gpu{gpu.index} uncorrected ecc {gpu.ecc_uncorrected}")
    if not event.healthy and not faults:
        faults.append(event.detail or "host reports unhealthy")
    return tuple(sorted(set(faults)))


def fault_change(
    event: schemas.HostHealth, previous: tuple[str, ...], current: tuple[str, ...]
) -> tuple[schemas.SignalKind, str, str] | None:
    """The signal (kind, severity, detail) a change of a node's faults calls for, if any.

    New faults degrade the host (once per new set); a host whose faults all cleared has
    returned; the same faults reported again say nothing new.
    """
    if not current:
        if not previous:
            return None
        return "node_returned", "info", f"{event.node} healthy again (was: {', '.join(previous)})"
    if not set(current) - set(previous):
        return None
    detail = f"{event.node}: {', '.join(current)}" + (f" ({event.detail})" if event.detail else "")
    return "degraded_host", "uncorrectable", detail
