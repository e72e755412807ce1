"""A sensor behind on its heartbeats still reads its events and never blames its own backlog.

The real sensor process, a real nats-server. The sensor is frozen (SIGSTOP: a loaded host
not scheduling it) for longer than the heartbeat timeout while its ranks keep beating and a
burst of beats far larger than it reads in a second piles up; meanwhile one node falls silent
and a rank's crash is reported. Once it runs again it must report the crash while still
reading the burst (before: the heartbeat callback took the whole burst before the event
consumer ran), report the silent node, and report no live rank: their beats were waiting
unread in its own queue (before: the poll judged them silent as of the wall clock).
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from itertools import cycle
from pathlib import Path

from goodput import schemas, subjects
from goodput.bus import Bus, BusSettings, EmbeddedNats
from goodput.bus.job_events import JobEvents

JOB = "beats"
LIVE_NODES = 64
PER_NODE = 8
SILENT = "node-silent"
#: beats published at once while the sensor is frozen (about 5-10 s of its reading)
BURST = 150_000
FROZEN_S = 4.0
THRESHOLDS = {"heartbeat_timeout_s": 2.0, "heartbeat_polling_period_s": 0.25}


def beat(node: str, rank: int) -> tuple[str, bytes]:
    message = schemas.Heartbeat(job=JOB, node=node, rank=rank, pid=1000 + rank, step=0)
    return subjects.heartbeat(JOB, node, rank), schemas.encode(message)


LIVE = [beat(f"node-{n}", n * PER_NODE + i) for n in range(LIVE_NODES) for i in range(PER_NODE)]
QUIET = [beat(SILENT, LIVE_NODES * PER_NODE + i) for i in range(PER_NODE)]


async def keep_beating(bus: Bus, silent_stops: asyncio.Event) -> None:
    """Every live rank beats every 0.5 s; the silent node's until ``silent_stops``."""
    while True:
        for subject, payload in LIVE + ([] if silent_stops.is_set() else QUIET):
            await bus.nc.publish(subject, payload)
        await asyncio.sleep(0.5)


async def test_a_sensor_behind_on_heartbeats_reads_events_and_blames_no_live_rank(
    tmp_path: Path, nats_server: EmbeddedNats
) -> None:
    bus = await Bus.connect(BusSettings(url=nats_server.url), name="test")
    await bus.provision()
    tap = await JobEvents(bus, JOB).start()
    command = [sys.executable, "-m", "goodput_services.sensor", "--nats-url", nats_server.url]
    sensor = subprocess.Popen(
        [*command, "--job", JOB, "--state-dir", str(tmp_path)],
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    silent_stops = asyncio.Event()
    beating = asyncio.create_task(keep_beating(bus, silent_stops))
    try:
        # the answer to a command says the sensor runs (its heartbeat feed starts with it)
        ready = schemas.SetThresholds(job=JOB, values=THRESHOLDS)
        await bus.send_command(subjects.SENSOR, ready)
        await tap.wait_for(
            lambda e: isinstance(e, schemas.ActionResult) and e.command_id == ready.command_id,
            60,
            "the sensor taking its thresholds",
        )
        await asyncio.sleep(2.0)  # every rank seen, its beats flowing

        sensor.send_signal(signal.SIGSTOP)
        silent_stops.set()
        crashed = LIVE_NODES * PER_NODE - 1
        await bus.emit(
            schemas.RankExited(
                job=JOB,
                node=f"node-{LIVE_NODES - 1}",
                rank=crashed,
                pid=1000 + crashed,
                exit_code=1,
            )
        )
        burst = cycle(LIVE)
        for _ in range(BURST):
            await bus.nc.publish(*next(burst))
        await bus.nc.flush()
        await asyncio.sleep(FROZEN_S)
        resumed = time.monotonic()
        sensor.send_signal(signal.SIGCONT)

        crash = await tap.wait_for(
            lambda e: isinstance(e, schemas.Signal) and e.signal == "crash", 60, "the crash signal"
        )
        crash_after_s = time.monotonic() - resumed
        lost = await tap.wait_for(
            lambda e: (
                isinstance(e, schemas.Signal)
                and e.signal == "missed_heartbeat"
                and e.node == SILENT
            ),
            60,
            "the silent node reported",
        )
        await asyncio.sleep(3.0)  # time for any wrong report to come
    finally:
        beating.cancel()
        sensor.send_signal(signal.SIGCONT)
        sensor.terminate()
        sensor.wait(60)
        await tap.stop()
        await bus.close()

    assert isinstance(crash, schemas.Signal) and crash.rank == crashed
    # the burst alone takes the sensor seconds to read; its event consumer ran meanwhile
    assert crash_after_s < 2.5, f"the crash was reported {crash_after_s:.1f} s after resuming"
    assert isinstance(lost, schemas.Signal) and lost.rank is None, lost.detail
    wrong = [
        (s.node, s.rank, s.detail)
        for s in tap.of(schemas.Signal)
        if s.signal == "missed_heartbeat" and s.node != SILENT
    ]
    assert not wrong, f"{len(wrong)} live rank(s) or node(s) reported silent: {wrong[:3]}"
