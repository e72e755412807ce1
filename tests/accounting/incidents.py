"""Hand-built event logs of a 2-rank job (nodes n0, n1) meeting faults, each remedied.

Steps take ``STEP_S`` on rank 0; a checkpoint is persisted every ``CKPT_EVERY`` steps. An
incident at ``t`` stops training: the fault at ``t``, its signal ``DETECT_S`` later, the
decision ``DECIDE_S`` after that, both ranks up again ``UP_S`` after the fault, the newest
checkpoint restored ``RESTORE_S`` later, and training resumes from it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from goodput import schemas

JOB = "labels"
BASE = 1_750_000_000 * 10**9
STEP_S = 0.5
CKPT_EVERY = 10
DETECT_S = 2.0
DECIDE_S = 0.5
UP_S = 8.0
RESTORE_S = 1.0


def at(seconds: float) -> int:
    return BASE + round(seconds * 1e9)


@dataclass(frozen=True)
class Incident:
    """A fault at ``t_s`` (the signal's fields) and the rule the controller answered with."""

    t_s: float
    signal: dict[str, Any]
    rule: str
    #: the rank whose process died with it (none: no exit)
    exits: list[int] = field(default_factory=list)


def _started(t: float, rank: int) -> schemas.RankStarted:
    return schemas.RankStarted(
        job=JOB, ts=at(t), node=f"n{rank}", rank=rank, local_rank=0, world_size=2, pid=100 + rank
    )


def incident_log(incidents: list[Incident], end_s: float) -> list[schemas.Event]:
    """The job from 0 to ``end_s`` with ``incidents`` (ascending, apart by more than ``UP_S``
    plus ``RESTORE_S``)."""
    events: list[schemas.Event] = [_started(0, 0), _started(0, 1)]
    t, step, saved = 1.0, 0, 0
    for number, incident in enumerate([*incidents, None]):
        until = incident.t_s if incident is not None else end_s
        while t + STEP_S <= until:
            t += STEP_S
            step += 1
            events.append(
                schemas.StepDone(
                    job=JOB,
                    ts=at(t),
                    node="n0",
                    rank=0,
                    step=step,
                    step_time_s=STEP_S,
                    tokens=1,
                    loss=1.0,
                    world_size=2,
                )
            )
            if step % CKPT_EVERY == 0:
                saved = step
                events.append(
                    schemas.CheckpointPersisted(
                        job=JOB,
                        ts=at(t),
                        node="n0",
                        rank=0,
                        step=step,
                        path="/c",
                        bytes=1,
                        duration_s=0.1,
                    )
                )
        if incident is None:
            break
        fault = incident.t_s
        signal = schemas.Signal(
            job=JOB,
            ts=at(fault + DETECT_S),
            signal_id=f"sig-{number}",
            observed_ts=at(fault),
            **incident.signal,
        )
        events += [
            schemas.RankExited(
                job=JOB, ts=at(fault), node=f"n{r}", rank=r, pid=100 + r, exit_code=1
            )
            for r in incident.exits
        ]
        events += [
            signal,
            schemas.Decision(
                job=JOB,
                ts=at(fault + DETECT_S + DECIDE_S),
                signal_id=signal.signal_id,
                policy="builtin",
                rule=incident.rule,
                reason=f"because of {incident.signal['signal']}",
                command_ids=[f"cmd-{number}"],
            ),
            _started(fault + UP_S, 0),
            _started(fault + UP_S, 1),
            schemas.CheckpointRestored(
                job=JOB,
                ts=at(fault + UP_S + RESTORE_S),
                node="n0",
                rank=0,
                step=saved,
                tier="local",
                duration_s=RESTORE_S,
            ),
        ]
        t, step = fault + UP_S + RESTORE_S, saved
    return events


#: a crash remedied in process, a node lost replaced by a spare, a NaN rolled back
THREE = [
    Incident(20.0, {"signal": "crash", "node": "n1", "rank": 1}, "in-process-restart", [1]),
    Incident(
        50.0,
        {"signal": "missed_heartbeat", "node": "n1", "severity": "uncorrectable"},
        "hot-swap",
    ),
    Incident(
        80.0,
        {"signal": "nonfinite", "node": "n0", "rank": 0, "first_bad_step": 90},
        "numerical-rollback",
    ),
]
