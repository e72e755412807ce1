"""The checkpoint engine's events as the rank's bus events (``goodput.schemas``): what the
shim publishes about its saves and restores."""

from __future__ import annotations

from typing import TypedDict

from goodput import schemas
from goodput.checkpoint.engine import events as ckpt_events
from goodput.schemas.tiers import RestoreSource


class _RankFields(TypedDict):
    """Who reports: the fields every report shares, typed so each ``**common`` is checked."""

    job: str
    node: str
    rank: int


def checkpoint_report(
    event: ckpt_events.CheckpointEvent, job: str, node: str, rank: int, volume: RestoreSource
) -> schemas.Event | None:
    """The bus event for one engine event of this rank (None: not reported); ``volume``: the
    tier the engine saves to and restores from (the node's own volume, or torch-save's shared
    directory), which a restore is reported as read from."""
    common = _RankFields(job=job, node=node, rank=rank)
    match event:
        case ckpt_events.CheckpointSaved():
            return schemas.CheckpointSaved(
                **common, step=event.step, stall_s=event.stall_s, bytes=event.bytes
            )
        case ckpt_events.CheckpointPersisted():
            return schemas.CheckpointPersisted(
                **common,
                step=event.step,
                path=event.path,
                bytes=event.bytes,
                duration_s=event.duration_s,
            )
        case ckpt_events.CheckpointFailed():
            return schemas.CheckpointFailed(**common, step=event.step, error=event.error)
        case ckpt_events.CheckpointDropped():
            return schemas.CheckpointDropped(
                **common, step=event.step, superseded_by=event.superseded_by
            )
        case ckpt_events.CheckpointRestored():
            fallbacks = [f"step {f.step}: {f.reason}" for f in event.fallbacks]
            return restored_report(
                job,
                node,
                rank,
                event.step,
                volume,
                event.duration_s,
                event.bytes,
                fallbacks,
                pinned_bytes=event.pinned_bytes,
            )
    return None


def restored_report(
    job: str,
    node: str,
    rank: int,
    step: int,
    tier: RestoreSource,
    duration_s: float,
    nbytes: int,
    fallbacks: list[str] | None = None,
    *,
    pinned_bytes: int = 0,
) -> schemas.CheckpointRestored:
    """``step`` was restored from ``tier`` ("host": the engine's buffer, after an in-process
    restart), its GPU copies through ``pinned_bytes`` of page-locked staging."""
    return schemas.CheckpointRestored(
        job=job,
        node=node,
        rank=rank,
        step=step,
        tier=tier,
        duration_s=duration_s,
        bytes=nbytes,
        fallbacks=fallbacks or [],
        pinned_bytes=pinned_bytes,
    )
