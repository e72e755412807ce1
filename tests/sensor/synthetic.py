"""Synthetic, seeded event sequences for the detector: a training job as the sensor sees it,
and the single events its tests build sequences of by hand."""

from __future__ import annotations

import heapq
import random
from dataclasses import dataclass, field

from goodput import schemas
from goodput.supervisor.detect.detector import NS, Detector
from goodput.supervisor.detect.thresholds import Thresholds

JOB = "job"
T0 = 1_700_000_000 * NS


def at(seconds: float) -> int:
    return T0 + int(seconds * NS)


@dataclass
class Run:
    """A synchronous data-parallel job: ``nodes`` × ``ranks_per_node`` ranks stepping together.

    Each rank's step time is ``step_s`` ± ``jitter``, with an occasional ``spike_factor`` spike;
    every ``checkpoint_every`` steps all ranks stall ``checkpoint_s`` in a (busy) save. Ranks in
    ``slow`` run ``slowdown``× slower from step ``slow_from``. Heartbeats every ``heartbeat_s``.
    """

    nodes: int = 4
    ranks_per_node: int = 2
    step_s: float = 1.0
    jitter: float = 0.10
    spike_probability: float = 0.02
    spike_factor: float = 2.0
    checkpoint_every: int = 50
    checkpoint_s: float = 8.0
    heartbeat_s: float = 1.0
    slow: set[int] = field(default_factory=set)
    slowdown: float = 1.5
    slow_from: int = 0
    seed: int = 0

    @property
    def world_size(self) -> int:
        return self.nodes * self.ranks_per_node

    def node_of(self, rank: int) -> str:
        return f"node{rank // self.ranks_per_node}"

    def events(self, steps: int) -> list[tuple[int, schemas.Event]]:
        rng = random.Random(self.seed)
        out: list[tuple[int, schemas.Event]] = []
        for rank in range(self.world_size):
            out.append(
                (
                    at(0),
                    schemas.RankStarted(
                        job=JOB,
                        node=self.node_of(rank),
                        rank=rank,
                        local_rank=rank % self.ranks_per_node,
                        world_size=self.world_size,
                        pid=1000 + rank,
                    ),
                )
            )
        clock = 0.0
        step_ends: list[tuple[float, float, int]] = []  # (start, end, step)
        for step in range(steps):
            start = clock
            if self.checkpoint_every and step and step % self.checkpoint_every == 0:
                busy_end = start + self.checkpoint_s
                step_ends.append((start, busy_end, -1))
                start = busy_end
            times = []
            for rank in range(self.world_size):
                t = self.step_s * rng.uniform(1 - self.jitter, 1 + self.jitter)
                if rng.random() < self.spike_probability:
                    t *= self.spike_factor
                if rank in self.slow and step >= self.slow_from:
                    t *= self.slowdown
                times.append(t)
            clock = start + max(times)
            for rank, t in enumerate(times):
                out.append(
                    (
                        at(clock),
                        schemas.StepDone(
                            job=JOB,
                            node=self.node_of(rank),
                            rank=rank,
                            step=step,
                            step_time_s=t,
                            tokens=1024,
                            loss=1.0,
                            world_size=self.world_size,
                        ),
                    )
                )
            step_ends.append((start, clock, step))
        out += self._heartbeats(step_ends, rng)
        out.sort(key=lambda item: item[0])
        return out

    def _heartbeats(
        self, step_ends: list[tuple[float, float, int]], rng: random.Random
    ) -> list[tuple[int, schemas.Event]]:
        out: list[tuple[int, schemas.Event]] = []
        end = step_ends[-1][1] if step_ends else 0.0
        for rank in range(self.world_size):
            phase = rng.uniform(0, self.heartbeat_s)
            t, index, last_step = phase, 0, -1
            while t < end:
                while index < len(step_ends) and step_ends[index][1] <= t:
                    last_step = max(last_step, step_ends[index][2])
                    index += 1
                busy = ""
                if (
                    index < len(step_ends)
                    and step_ends[index][2] == -1
                    and step_ends[index][0] <= t
                ):
                    busy = "checkpoint-save"
                out.append(
                    (
                        at(t),
                        schemas.Heartbeat(
                            job=JOB,
                            node=self.node_of(rank),
                            rank=rank,
                            pid=1000 + rank,
                            step=last_step,
                            busy=busy,
                        ),
                    )
                )
                t += self.heartbeat_s
        return out


def feed(
    detector: Detector,
    events: list[tuple[int, schemas.Event]],
    until: int | None = None,
    poll_s: float | None = None,
) -> list[schemas.Signal]:
    """Feed events in time order, polling every ``poll_s`` (the polling period) up to ``until``."""
    period = int((poll_s or detector.thresholds.heartbeat_polling_period_s) * NS)
    queue = [(ts, 1, i) for i, (ts, _) in enumerate(events)]
    end = until if until is not None else (events[-1][0] if events else T0)
    start = events[0][0] if events else T0
    queue += [(ts, 0, -1) for ts in range(start, end + 1, period)]
    heapq.heapify(queue)
    signals: list[schemas.Signal] = []
    while queue:
        ts, kind, index = heapq.heappop(queue)
        if kind == 0:
            signals += detector.poll(ts)
        else:
            signals += detector.on_event(events[index][1], ts)
    return signals


def straggler_due(events: list[tuple[int, schemas.Event]], rank: int, slow_from: int) -> int:
    """The latest a rank slowed from step ``slow_from`` may be flagged: ``hold_s`` after a whole
    window of slow steps, at the next judged step (a step is judged up to 3 steps late)."""
    thresholds = Thresholds()
    steps = sorted(
        (e.step, ts) for ts, e in events if isinstance(e, schemas.StepDone) and e.rank == rank
    )
    window_slow = dict(steps)[slow_from + thresholds.straggler_window - 1]
    held = [ts for _, ts in steps if ts >= window_slow + thresholds.straggler_hold_s * NS]
    return held[min(3, len(held) - 1)]


def started(rank: int, node: str, attempt: int = 0, world_size: int = 4) -> schemas.RankStarted:
    return schemas.RankStarted(
        job=JOB,
        node=node,
        rank=rank,
        local_rank=rank % 2,
        world_size=world_size,
        pid=100 + rank,
        attempt=attempt,
    )


def heartbeat(rank: int, node: str, step: int, busy: str = "") -> schemas.Heartbeat:
    return schemas.Heartbeat(job=JOB, node=node, rank=rank, pid=100 + rank, step=step, busy=busy)


def step_done(rank: int, node: str, step: int, world_size: int = 2) -> schemas.StepDone:
    """A rank's report of a 1 s step (no compute time measured)."""
    return schemas.StepDone(
        job=JOB,
        node=node,
        rank=rank,
        step=step,
        step_time_s=1.0,
        tokens=1,
        loss=1.0,
        world_size=world_size,
    )


def exited(rank: int, node: str, code: int | None, reason: str = "", attempt: int = 0):
    return schemas.RankExited(
        job=JOB,
        node=node,
        rank=rank,
        pid=100 + rank,
        exit_code=code,
        expected_reason=reason,
        attempt=attempt,
    )


def host(node: str, **fields) -> schemas.HostHealth:
    return schemas.HostHealth(job=JOB, node=node, gpu_available=True, **{"healthy": True, **fields})


def steady(ranks: dict[int, str], seconds: float, *, step_s: float = 1.0, start: float = 0.0):
    """Every rank heartbeats each second and steps every ``step_s``: a healthy job."""
    events = [(at(start), started(r, n, world_size=len(ranks))) for r, n in ranks.items()]
    t = start
    while t < start + seconds:
        t += 1.0
        step = int((t - start) / step_s)
        events += [(at(t), heartbeat(r, n, step)) for r, n in ranks.items()]
    return events


#: the ranks of a 2-node, 2-ranks-per-node job, by node
FOUR = {0: "node0", 1: "node0", 2: "node1", 3: "node1"}
#: the ranks of a 2-node, 1-rank-per-node job
TWO = {0: "node-0", 1: "node-1"}
