"""Signals as the detector emits them: an id derived from the facts, so duplicates collapse."""

from __future__ import annotations

import xxhash

from goodput import schemas


def make_signal(
    job: str,
    kind: schemas.SignalKind,
    node: str,
    rank: int | None,
    severity: str,
    detail: str,
    *,
    epoch: int,
    observed_ns: int,
    now: int,
) -> schemas.Signal:
    """One signal; the same facts give the same id, so two sensors on one stream publish one."""
    identity = f"{job}|{kind}|{node}|{rank}|{epoch}|{observed_ns}"
    return schemas.Signal(
        job=job,
        ts=now,
        signal_id=xxhash.xxh3_128_hexdigest(identity.encode()),
        signal=kind,
        node=node,
        rank=rank,
        severity=severity,  # type: ignore[arg-type]
        detail=detail,
        observed_ts=observed_ns,
    )
