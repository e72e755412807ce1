"""A hand-built event log with known answers for every badput category.

Times are seconds after ``BASE``. The job runs on 2 ranks, crashes, is restarted from the
step-5 checkpoint, slows down behind a straggler, is scaled down to 1 rank to evict it and
stops. The timeline (every second of the 82 is accounted for exactly once):

====================  ==========================================  =====================
 seconds               what happens                                 category
====================  ==========================================  =====================
  0 – 10               ranks start, first step begins at 10         program_startup 10
 10 – 20               steps 1–5, 2 s each                          productive 10
 20 – 21               checkpoint of step 5 blocks training         checkpoint_save 1
 21 – 27               steps 6, 7, 8 (later re-run)                 wasted_progress 6
 27 – 28               rank 1 crashes mid-step at 28                wasted_progress 1
 28 – 31               sensor signals the crash at 31               failure_detection 3
 31 – 33               controller decides at 33                     decision 2
 33 – 40               ranks restart (last one up at 40)            restart_reprovision 7
 40 – 41, 44 – 45      startup around the restore                   program_startup 2
 41 – 44               restore of step 5 (3 s)                      checkpoint_restore 3
 45 – 55               steps 6–10 again, 2 s each                   productive 10
 55 – 63               steps 11, 12 take 4 s (straggler flagged)    straggler 4, productive 4
 63 – 68               steps 13 (2 s, recovered) and 14 (3 s:       straggler 1, productive 4
                       slow again, flag or not)
 68 – 69               controller decides to scale down at 69       decision 1
 69 – 72               restart on 1 rank                            restart_reprovision 3
 72 – 73, 74 – 75      startup around the restore                   program_startup 2
 73 – 74               restore of step 14 (1 s)                     checkpoint_restore 1
 75 – 80               steps 15, 16 on 1 of 2 ranks (2 s, 3 s:      scaled_down_idle 2.5,
                       two steps scatter too much to call one slow) productive 2.5
 80 – 82               stopped, nothing runs                        job_down 2
====================  ==========================================  =====================
"""

from __future__ import annotations

from goodput import schemas

JOB = "scenario"
BASE = 1_700_000_000 * 10**9

EXPECTED_BADPUT = {
    "checkpoint_save": 1.0,
    "wasted_progress": 7.0,
    "numerical_rollback": 0.0,  # the crash's rollback is no numerical one
    "failure_detection": 3.0,
    "decision": 3.0,
    "restart_reprovision": 10.0,
    "checkpoint_restore": 4.0,
    "program_startup": 14.0,
    "straggler_slowdown": 5.0,
    "scaled_down_idle": 2.5,
    "job_down": 2.0,
}
EXPECTED_PRODUCTIVE = 30.5
EXPECTED_TOTAL = 82.0


def at(seconds: float) -> int:
    return BASE + round(seconds * 1e9)


def started(t: float, rank: int, world_size: int) -> schemas.RankStarted:
    return schemas.RankStarted(
        job=JOB,
        ts=at(t),
        node=f"n{rank}",
        rank=rank,
        local_rank=0,
        world_size=world_size,
        pid=100 + rank,
    )


def step(t: float, number: int, seconds: float, world_size: int) -> list[schemas.StepDone]:
    return [
        schemas.StepDone(
            job=JOB,
            ts=at(t) + rank,  # the other rank reports a nanosecond later
            node=f"n{rank}",
            rank=rank,
            step=number,
            step_time_s=seconds,
            tokens=1024,
            loss=2.0,
            world_size=world_size,
        )
        for rank in range(world_size)
    ]


def scenario_events() -> list[schemas.Event]:
    crash = schemas.Signal(
        job=JOB,
        ts=at(31),
        signal_id="sig-crash",
        signal="crash",
        node="n1",
        rank=1,
        observed_ts=at(28),
    )
    straggler = schemas.Signal(
        job=JOB,
        ts=at(56),
        signal_id="sig-straggler",
        signal="straggler",
        node="n1",
        severity="info",
        observed_ts=at(55),
    )
    events: list[schemas.Event] = [started(0, 0, 2), started(0, 1, 2)]
    for number, t in enumerate((12, 14, 16, 18, 20), start=1):
        events += step(t, number, 2.0, 2)
    events += [
        schemas.CheckpointSaved(
            job=JOB, ts=at(21), node="n0", rank=0, step=5, stall_s=1.0, bytes=1
        ),
        schemas.CheckpointSaved(
            job=JOB, ts=at(21), node="n1", rank=1, step=5, stall_s=0.5, bytes=1
        ),
        schemas.CheckpointPersisted(
            job=JOB, ts=at(22), node="n0", rank=0, step=5, path="/c/5", bytes=1, duration_s=1.0
        ),
    ]
    events += step(23, 6, 2.0, 2) + step(25, 7, 2.0, 2) + step(27, 8, 2.0, 2)
    events += [
        schemas.RankExited(job=JOB, ts=at(28), node="n1", rank=1, pid=101, exit_code=1),
        crash,
        schemas.Decision(
            job=JOB,
            ts=at(33),
            signal_id=crash.signal_id,
            policy="default",
            rule="crash->restart",
            reason="rank crashed",
            command_ids=["restart-1"],
        ),
        schemas.ActionResult(job=JOB, ts=at(34), command_id="restart-1", action="restart", ok=True),
        schemas.RankExited(
            job=JOB, ts=at(34), node="n0", rank=0, pid=100, exit_code=0, expected_reason="restart"
        ),
        started(38, 0, 2),
        started(40, 1, 2),
        schemas.CheckpointRestored(
            job=JOB, ts=at(44), node="n0", rank=0, step=5, tier="local", duration_s=3.0
        ),
    ]
    events += step(47, 6, 2.0, 2)
    for number, t in zip(range(7, 11), (49, 51, 53, 55), strict=True):
        events += step(t, number, 2.0, 2)
    events.append(straggler)
    events += step(59, 11, 4.0, 2) + step(63, 12, 4.0, 2) + step(65, 13, 2.0, 2)
    events += step(68, 14, 3.0, 2)
    events += [
        schemas.CheckpointSaved(
            job=JOB, ts=at(68), node="n0", rank=0, step=14, stall_s=0.0, bytes=1
        ),
        schemas.CheckpointPersisted(
            job=JOB, ts=at(68.5), node="n0", rank=0, step=14, path="/c/14", bytes=1, duration_s=0.5
        ),
        schemas.Decision(
            job=JOB,
            ts=at(69),
            signal_id=straggler.signal_id,
            policy="default",
            rule="straggler->scale_down",
            reason="evict the slow node",
            command_ids=["scale-1"],
        ),
        schemas.RankExited(
            job=JOB,
            ts=at(70),
            node="n0",
            rank=0,
            pid=100,
            exit_code=0,
            expected_reason="scale_down",
        ),
        schemas.RankExited(
            job=JOB,
            ts=at(70),
            node="n1",
            rank=1,
            pid=101,
            exit_code=0,
            expected_reason="scale_down",
        ),
        started(72, 0, 1),
        schemas.CheckpointRestored(
            job=JOB, ts=at(74), node="n0", rank=0, step=14, tier="peer", duration_s=1.0
        ),
    ]
    events += step(77, 15, 2.0, 1) + step(80, 16, 3.0, 1)
    events.append(
        schemas.RankExited(
            job=JOB, ts=at(82), node="n0", rank=0, pid=100, exit_code=0, expected_reason="stop"
        )
    )
    return events
