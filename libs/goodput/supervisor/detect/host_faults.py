"""What a host report says is wrong with its node, as one canonical tuple of fault names."""

from __future__ import annotations

from goodput import schemas
from goodput.gpu_faults import needs_action, xid_verdict


def host_faults(event: schemas.HostHealth) -> tuple[str, ...]:
    """The sorted, de-duplicated faults of a host report (empty when the host is healthy).

    GPU records are turned into names (``gpu1 xid 79``) so that a repeated report of the same
    fault compares equal and is not reported twice; an unhealthy report without faults is one.
    Faults the GPU fault table says ask for nothing (a thermal slowdown, XID 45) are left out:
    they do not degrade the host (a slow GPU is the straggler detector's, by its steps).
    """
    faults = [f for f in event.faults if needs_action(f)]
    for gpu in event.gpus:
        if not gpu.present:
            faults.append(f"gpu{gpu.index} missing")
        xids = [x for x in gpu.xid_errors if xid_verdict(x).action != "none"]
        if xids:
            faults.append(f"gpu{gpu.index} xid {','.join(map(str, xids))}")
        if gpu.recovery_action not in ("", "none"):
            # the driver asking for a recovery is news even when the XIDs are not
            faults.append(f"gpu{gpu.index} recovery {gpu.recovery_action}")
        if gpu.ecc_uncorrected:
            faults.append(f"gpu{gpu.index} uncorrected ecc {gpu.ecc_uncorrected}")
    if not event.healthy and not faults and not event.faults:
        faults.append(event.detail or "host reports unhealthy")
    return tuple(sorted(set(faults)))


def fault_change(
    event: schemas.HostHealth, previous: tuple[str, ...], current: tuple[str, ...]
) -> tuple[schemas.SignalKind, schemas.Severity, str] | None:
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
