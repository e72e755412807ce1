"""Signals as the detector emits them: an id derived from the facts, so duplicates collapse."""

from __future__ import annotations

import xxhash

from goodput import schemas


def make_signal(
    job: str,
    kind: schemas.SignalKind,
    node: str,
    rank: int | None,
    severity: schemas.Severity,
    detail: str,
    *,
    epoch: int,
    observed_ns: int,
    now: int,
    host: schemas.HostHealth | None = None,
) -> schemas.Signal:
    """One signal; the same facts give the same id, so two sensors on one stream publish one.

    A signal about a ``host`` report carries its fault names and unhealthy GPUs as evidence.
    """
    identity = f"{job}|{kind}|{node}|{rank}|{epoch}|{observed_ns}"
    return schemas.Signal(
        job=job,
        ts=now,
        signal_id=xxhash.xxh3_128_hexdigest(identity.encode()),
        signal=kind,
        node=node,
        rank=rank,
        severity=severity,
        detail=detail,
        observed_ts=observed_ns,
        host_faults=list(host.faults) if host is not None else [],
        gpus=[
            g
            for g in host.gpus
            if g.xid_errors
            or g.ecc_uncorrected
            or not g.present
            or g.recovery_action not in ("", "none")
        ]
        if host is not None
        else [],
    )
