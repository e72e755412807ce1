"""Cost of the detector at scale: synthetic heartbeats and step reports through one Detector.

For ``goodput bench`` (the control-plane benchmark): how many microseconds one heartbeat and
one step report cost, and how long a poll takes, for ``nodes × ranks_per_node`` ranks
heartbeating once a second. It measures the detection logic alone (no decoding, no bus).
"""

from __future__ import annotations

import time

import msgspec

from goodput import schemas
from goodput.supervisor.detect.detector import NS, Detector


class DetectorLoad(msgspec.Struct, kw_only=True):
    ranks: int
    seconds: int
    heartbeat_us: float
    step_us: float
    poll_ms_mean: float
    poll_ms_max: float
    signals: int


def measure_detector(
    nodes: int, ranks_per_node: int = 1, seconds: int = 10, polls_per_second: int = 2
) -> DetectorLoad:
    """Feed ``seconds`` of a healthy job (one heartbeat and one step per rank per second)."""
    ranks = nodes * ranks_per_node
    start = 1_700_000_000 * NS
    detector = Detector("load")
    beats = [
        schemas.Heartbeat(job="load", node=f"n{r // ranks_per_node}", rank=r, pid=r, step=0)
        for r in range(ranks)
    ]
    steps = [
        schemas.StepDone(
            job="load",
            node=f"n{r // ranks_per_node}",
            rank=r,
            step=0,
            step_time_s=1.0,
            tokens=1,
            loss=1.0,
            world_size=ranks,
        )
        for r in range(ranks)
    ]
    spacing = NS // max(ranks, 1)
    heartbeat_s = step_s = 0.0
    poll_times: list[float] = []
    signals = 0
    for second in range(seconds):
        base = start + second * NS
        began = time.perf_counter()
        for rank, beat in enumerate(beats):
            beat.step = second
            signals += len(detector.on_heartbeat(beat, base + rank * spacing))
        heartbeat_s += time.perf_counter() - began
        began = time.perf_counter()
        for rank, step in enumerate(steps):
            step.step = second
            step.step_time_s = 1.0 + (rank % 7) * 0.01
            signals += len(detector.on_step(step, base + rank * spacing))
        step_s += time.perf_counter() - began
        for poll in range(polls_per_second):
            began = time.perf_counter()
            signals += len(detector.poll(base + poll * NS // polls_per_second))
            poll_times.append(time.perf_counter() - began)
    events = max(ranks * seconds, 1)
    return DetectorLoad(
        ranks=ranks,
        seconds=seconds,
        heartbeat_us=heartbeat_s / events * 1e6,
        step_us=step_s / events * 1e6,
        poll_ms_mean=sum(poll_times) / max(len(poll_times), 1) * 1e3,
        poll_ms_max=max(poll_times, default=0.0) * 1e3,
        signals=signals,
    )
