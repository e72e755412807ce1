"""Step reports: one rank's (``StepDone``), a node's rolled up (``StepsDone``), and the one
function that turns either into ``StepDone`` records (``expand_steps``).

Every rank reports every step; at 16,384 ranks and 1 s steps that was 16 k JetStream events a
second. A node's first local rank gathers its ranks' reports over a node-local socket
(``goodput.shim.step_rollup``) and publishes one ``StepsDone`` per step for the node: each
rank's report inside it, field for field (its ``ts`` too, so the calculator's spans are
exact). A rank that cannot reach its node's aggregator publishes its ``StepDone`` directly,
so both shapes are valid on the wire; every reader takes its steps through
``expand_steps`` and sees only ``StepDone`` records, whichever shape carried them.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Annotated

import msgspec

from goodput.schemas.envelope import EpochNs, Event, StepSeconds, Token

#: the most reports one rollup may carry: a node's ranks (at most 64) times the steps a slow
#: link lets pile up. A longer list is refused at decoding, never expanded into memory
MAX_ROLLED_UP = 4096


class StepDone(Event, tag="step", kw_only=True):
    node: Token
    rank: int
    step: int
    step_time_s: StepSeconds
    tokens: int
    loss: float
    world_size: int = 1
    #: time this rank computed, excluding waiting for peers in collectives (0: not measured).
    #: In synchronous training every rank's step_time_s is the same; this one tells who is slow.
    compute_time_s: StepSeconds = 0.0
    #: the rank's loop is the shim's own (``TrainerShim.run``): it can restart in process on a
    #: ``Rejoin``. A framework's loop (Lightning, the HF Trainer, a plain loop) cannot, and
    #: says so here rather than by refusing the command (schema 4)
    in_process_restart: bool = False


class RankStep(msgspec.Struct, array_like=True, frozen=True, forbid_unknown_fields=True):
    """One rank's ``StepDone`` inside a ``StepsDone``, without what the rollup says once (job,
    node, schema): an array on the wire, no field names, about 50 bytes."""

    rank: int
    step: int
    #: when the rank reported it (its ``StepDone.ts``), not when the rollup was sent
    ts: EpochNs
    step_time_s: StepSeconds
    compute_time_s: StepSeconds
    tokens: int
    loss: float
    world_size: int
    in_process_restart: bool


class StepsDone(Event, tag="steps", kw_only=True):
    """A node's step reports since its previous rollup (schema 16), published by the node's
    first local rank on ``gp.<job>.evt.steps.<rank>``: its own rank names the subject, so the
    controller's filter for rank 0's steps (rank 0 aggregates its node) stays one subject."""

    node: Token
    #: the aggregating rank (the node's local rank 0)
    rank: int
    steps: Annotated[list[RankStep], msgspec.Meta(max_length=MAX_ROLLED_UP)]


def rank_step(report: StepDone) -> RankStep:
    """``report`` as a rollup carries it."""
    return RankStep(
        rank=report.rank,
        step=report.step,
        ts=report.ts,
        step_time_s=report.step_time_s,
        compute_time_s=report.compute_time_s,
        tokens=report.tokens,
        loss=report.loss,
        world_size=report.world_size,
        in_process_restart=report.in_process_restart,
    )


def expand_steps(event: Event) -> tuple[Event, ...]:
    """The events ``event`` stands for: a rollup's ``StepDone`` records (equal, field for
    field, to those its ranks reported), any other event itself. Every reader of steps goes
    through this (or ``expand_all``), so none has to know the rollup's shape."""
    if type(event) is not StepsDone:
        return (event,)
    return tuple(
        StepDone(
            job=event.job,
            ts=entry.ts,
            schema=event.schema,
            node=event.node,
            rank=entry.rank,
            step=entry.step,
            step_time_s=entry.step_time_s,
            tokens=entry.tokens,
            loss=entry.loss,
            world_size=entry.world_size,
            compute_time_s=entry.compute_time_s,
            in_process_restart=entry.in_process_restart,
        )
        for entry in event.steps
    )


def expand_all(events: Iterable[Event]) -> Iterator[Event]:
    """``expand_steps`` over a stream of events, in order."""
    for event in events:
        yield from expand_steps(event)
