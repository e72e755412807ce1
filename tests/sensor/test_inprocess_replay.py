"""One hang, one remediation: the full demo's event order around an in-process restart,
replayed through the pure detector (issue 28 item 3).

In the demo, rank 0 (node-0) hung inside step 178 while rank 1 (node-1) finished step 177 and
waited for it in the next collective. The hang was decided ``in-process-restart``; rank 0,
woken by its Rejoin, answered ``RankRejoined`` at once, but rank 1 answered only after its
blocked collective failed (when rank 0 aborted the old group). In between, rank 1's own hang
deadline came due, the laggard rule found rank 0 — reset by its rejoin, "no progress past
step 0 for 0.1 s (timeout 300.0 s)" — and a second restart followed.
"""

from __future__ import annotations

from goodput import schemas
from goodput.supervisor.detect.detector import NS, Detector

from .synthetic import JOB, at

NODES = {0: "node-0", 1: "node-1"}
STEP_S = 0.1
HEARTBEAT_S = 0.5
POLL_S = 0.5

Timed = tuple[int, schemas.Event]


def _beat(rank: int, step: int, busy: str = "") -> schemas.Heartbeat:
    return schemas.Heartbeat(
        job=JOB, node=NODES[rank], rank=rank, pid=100 + rank, step=step, busy=busy
    )


def _done(rank: int, step: int) -> schemas.StepDone:
    return schemas.StepDone(
        job=JOB,
        node=NODES[rank],
        rank=rank,
        step=step,
        step_time_s=STEP_S,
        tokens=1,
        loss=1.0,
        world_size=2,
        compute_time_s=STEP_S / 2,
    )


def _training(first: int, last: int, t0: float) -> list[Timed]:
    """Both ranks step every 0.1 s from ``first`` to ``last`` and heartbeat every 0.5 s."""
    events: list[Timed] = []
    for i, step in enumerate(range(first, last + 1)):
        events += [(at(t0 + (i + 1) * STEP_S + 0.01 * r), _done(r, step)) for r in NODES]
    for b in range(1, int((last - first + 1) * STEP_S / HEARTBEAT_S) + 1):
        step = first + int(b * HEARTBEAT_S / STEP_S) - 1
        events += [(at(t0 + b * HEARTBEAT_S + 0.02 * r), _beat(r, step)) for r in NODES]
    return events


def _beats(step: int, start: float, end: float, busy: str = "") -> list[Timed]:
    count = int((end - start) / HEARTBEAT_S)
    return [
        (at(start + b * HEARTBEAT_S + 0.02 * r), _beat(r, step, busy))
        for b in range(count)
        for r in NODES
    ]


class Replay:
    """Feeds events in time order and polls every 0.5 s, as the sensor does."""

    def __init__(self) -> None:
        self.detector = Detector(JOB)
        self.signals: list[schemas.Signal] = []
        self._next_poll = at(POLL_S)

    def run(self, events: list[Timed], until: int, stop_at_signal: bool = False) -> int:
        """Up to ``until`` (or the first signal): the time reached."""
        for ts, event in sorted([*events, (until, None)], key=lambda item: item[0]):
            while self._next_poll <= ts:
                now, self._next_poll = self._next_poll, self._next_poll + int(POLL_S * NS)
                self.signals += self.detector.poll(now)
                if stop_at_signal and self.signals:
                    return now
            if event is not None:
                self.signals += self.detector.on_event(event, ts)
        return until


def _first_start() -> list[Timed]:
    """Both ranks of attempt 1 started at time 0."""
    return [
        (
            at(0),
            schemas.RankStarted(
                job=JOB, node=NODES[r], rank=r, local_rank=0, world_size=2, pid=100 + r, attempt=1
            ),
        )
        for r in NODES
    ]


def test_the_demos_hang_and_in_process_restart_give_one_hang_signal() -> None:
    replay = Replay()
    events = _first_start()
    events += _training(1, 176, 1.0)
    hung = 1.0 + 177 * STEP_S
    # rank 0 hangs inside step 178, rank 1 finished step 177 (its report a little slower, so
    # its own hang deadline comes after rank 0's) and waits; both heartbeat on naming 177
    events += [(at(hung), _done(0, 177)), (at(hung + 0.8), _done(1, 177))]
    signalled = replay.run(
        events + _beats(177, hung, hung + 120), at(hung + 120), stop_at_signal=True
    )
    assert [(s.signal, s.node, s.rank) for s in replay.signals] == [("hang", "node-0", 0)]
    # the in-process restart as the actuator and trainers carried it out: rank 0 rejoins
    # 0.2 s after the signal, rank 1 1.5 s later (its collective fails only when rank 0 aborts
    # the old group); both heartbeat "restarting" until the new group restored step 175
    s = (signalled - at(0)) / NS
    restart: list[Timed] = [
        (
            at(s + 0.2 + 1.5 * r),
            schemas.RankRejoined(job=JOB, node=NODES[r], rank=r, pid=100 + r, attempt=2),
        )
        for r in NODES
    ]
    restart += _beats(177, s, s + 0.5) + _beats(177, s + 0.5, s + 4.0, busy="restarting")
    restart.append(
        (
            at(s + 1.8),
            schemas.JobStatus(
                job=JOB,
                state="running",
                attempt=2,
                world_size=2,
                procs_per_node=1,
                active_nodes=list(NODES.values()),
            ),
        )
    )
    restart += [
        (
            at(s + 4.0),
            schemas.CheckpointRestored(
                job=JOB, node=NODES[r], rank=r, step=175, tier="host", duration_s=0.3
            ),
        )
        for r in NODES
    ]
    restart += _training(176, 576, s + 4.0)
    replay.run(restart, at(s + 4.0 + 40.0))
    assert [(s.signal, s.node, s.rank) for s in replay.signals] == [("hang", "node-0", 0)], [
        s.detail for s in replay.signals
    ]


def test_a_waiting_ranks_deadline_does_not_run_on_through_a_restart() -> None:
    """The same order with rank 1's rejoin much later (slow to leave its collective): no
    signal until then, and a real hang after the restart is still found."""
    replay = Replay()
    events = _first_start()
    events += _training(1, 50, 1.0)
    hung = 1.0 + 51 * STEP_S
    events += [(at(hung), _done(0, 51)), (at(hung + 0.8), _done(1, 51))]
    signalled = replay.run(events + _beats(51, hung, hung + 120), at(hung + 120), True)
    s = (signalled - at(0)) / NS
    restart: list[Timed] = [
        (
            at(s + 0.2 + 20 * r),
            schemas.RankRejoined(job=JOB, node=NODES[r], rank=r, pid=100 + r, attempt=2),
        )
        for r in NODES
    ]
    restart += _beats(51, s, s + 0.5) + _beats(51, s + 0.5, s + 22, busy="restarting")
    restart += _training(51, 100, s + 22)
    # then rank 1 hangs inside step 101: rank 0 finished it and waits
    hung2 = s + 22 + 50 * STEP_S
    restart += [(at(hung2 + 0.1), _done(0, 101))]
    restart += _beats(101, hung2 + 0.1, hung2 + 50)
    replay.run(restart, at(hung2 + 50))
    assert [(s.signal, s.rank) for s in replay.signals] == [("hang", 0), ("hang", 1)], [
        s.detail for s in replay.signals
    ]
    assert replay.signals[1].observed_ts >= at(hung2)
