"""Pre-warmed standby ranks through the real actuator, bus and processes: a launch takes its
ranks from ready standbys, used ones are replenished once the job steps again, a standby
that dies is replaced and never waited on, and a script that cannot serve standbys gets none.

The standby here is a light script that speaks the real channel (goodput.launch.standby_channel)
without importing torch; tests/e2e/test_standby_job.py runs the example job's own standbys.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from pathlib import Path

import psutil

from goodput import schemas, subjects
from goodput.tools.chaos.targets import ChaosContext

from .test_local_backend import JOB, RANK_SCRIPT, _status, rig  # noqa: F401

# says ready, takes its assignment, then is a rank like RANK_SCRIPT's
STANDBY_SCRIPT = (
    "import os, time\n"
    "from goodput.launch.rank_env import RankEnv\n"
    "from goodput.launch.standby_channel import await_assignment\n"
    "if RankEnv.from_env().standby:\n"
    "    env = await_assignment()\n"
    "    os.environ.pop('GOODPUT_STANDBY')\n"
    "    os.environ.update(env.to_env())\n"
    "print('rank', os.environ['RANK'], 'of', os.environ['WORLD_SIZE'], 'on',\n"
    "      os.environ['GOODPUT_NODE'], 'attempt', os.environ['GOODPUT_ATTEMPT'], flush=True)\n"
    "time.sleep(600)\n"
)


def _start(script: str = STANDBY_SCRIPT, spares: int = 1) -> schemas.StartJob:
    return schemas.StartJob(
        job=JOB,
        argv=[sys.executable, "-c", script],
        nodes=2,
        procs_per_node=1,
        spares=spares,
        standbys=1,
    )


async def _stepped(bus) -> None:
    """The job trains: what the actuator waits for before it starts standbys."""
    await bus.emit(
        schemas.StepDone(job=JOB, node="node-0", rank=0, step=1, step_time_s=0.1, tokens=1, loss=0)
    )


async def _standbys_on(tap, nodes: set[str], after_ts: int = 0) -> schemas.JobStatus:
    return await tap.wait_for(
        lambda e: isinstance(e, schemas.JobStatus) and nodes <= set(e.standbys),
        timeout_s=90,
        what=f"ready standbys on {sorted(nodes)}",
        after_ts=after_ts,
    )


async def _logged(path: Path, line: str) -> str:
    for _ in range(600):
        text = path.read_text() if path.is_file() else ""
        if line in text:
            return text
        await asyncio.sleep(0.1)
    raise AssertionError(f"{line!r} not in {path}: {text!r}")


async def _exited(pid: int) -> None:
    """``pid`` has exited (a zombie its parent has yet to reap, or gone)."""
    for _ in range(100):
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return
        except psutil.NoSuchProcess:
            return
        await asyncio.sleep(0.1)
    raise AssertionError(f"pid {pid} still runs 10 s after SIGKILL")


def _newest_status(tap) -> schemas.JobStatus:
    return tap.of(schemas.JobStatus)[-1]


def _rank_pids(tap, attempt: int) -> dict[str, int]:
    return {e.node: e.pid for e in tap.of(schemas.RankStarted) if e.attempt == attempt}


async def test_a_restart_takes_ready_standbys_and_they_are_replenished(rig, tmp_path) -> None:  # noqa: F811
    bus, tap, _ = rig
    start = _start()
    await bus.send_command(subjects.ACTUATOR, start)
    first = await _status(tap, 1)
    # none is started while the ranks start up: only once the job steps
    assert not first.standbys
    await _stepped(bus)
    ready = await _standbys_on(tap, {"node-0", "node-1", "node-2"})
    standbys = {n: pids[0] for n, pids in _newest_status(tap).standbys.items()}
    assert set(standbys) == {"node-0", "node-1", "node-2"}
    # standbys are no ranks: the host monitors' count of rank pids leaves them out
    assert not set(standbys.values()) & {p for ps in ready.pids.values() for p in ps}

    os.kill(first.pids["node-1"][0], signal.SIGKILL)
    restart = schemas.Restart(job=JOB, reason="test", standbys=True)
    await bus.send_command(subjects.ACTUATOR, restart)
    assert (await tap.result_of(restart)).ok
    second = await _status(tap, 2)
    assert _rank_pids(tap, 2) == {"node-0": standbys["node-0"], "node-1": standbys["node-1"]}
    assert not {"node-0", "node-1"} & set(second.standbys)  # taken
    # the chaos tool finds the standby as the rank it now is (its environment predates that)
    chaos = ChaosContext.open(tmp_path, job=JOB, url=bus.settings.url)
    try:
        targets = {t.rank: (t.node, t.pid) for t in await chaos.ranks()}
    finally:
        await chaos.close()
    assert targets == {0: ("node-0", standbys["node-0"]), 1: ("node-1", standbys["node-1"])}
    # the assignment is the rank's environment
    await _logged(
        tmp_path / "logs" / "standbys" / "standby-node-1-002.log", "rank 1 of 2 on node-1 attempt 2"
    )

    await _stepped(bus)
    await _standbys_on(tap, {"node-0", "node-1", "node-2"}, after_ts=second.ts)
    fresh = _newest_status(tap).standbys
    assert fresh["node-2"] == [standbys["node-2"]]
    assert fresh["node-1"] != [standbys["node-1"]]

    # a hot swap takes the spare's standby for the spare's rank
    swap = schemas.HotSwap(job=JOB, failed_node="node-1", spare_node="node-2", standbys=True)
    await bus.send_command(subjects.ACTUATOR, swap)
    assert (await tap.result_of(swap)).ok
    await _status(tap, 3)
    assert _rank_pids(tap, 3)["node-2"] == standbys["node-2"]
    # the failed node keeps no standby
    await _stepped(bus)
    swapped = await _standbys_on(tap, {"node-0", "node-2"}, after_ts=second.ts + 1)
    await asyncio.sleep(0.5)
    assert "node-1" not in _newest_status(tap).standbys, swapped


async def test_a_dead_standby_is_never_waited_on_and_is_replaced(rig, tmp_path) -> None:  # noqa: F811
    bus, tap, _ = rig
    await bus.send_command(subjects.ACTUATOR, _start(spares=0))
    first = await _status(tap, 1)
    await _stepped(bus)
    await _standbys_on(tap, {"node-0", "node-1"})
    dead = _newest_status(tap).standbys["node-1"][0]
    os.kill(dead, signal.SIGKILL)
    os.kill(first.pids["node-1"][0], signal.SIGKILL)
    # dead, not dying: a loaded machine took long enough to end it that the restart handed
    # it the rank while it still held its channel (a death after the assignment is a rank's)
    await _exited(dead)
    restart = schemas.Restart(job=JOB, reason="test", standbys=True)
    await bus.send_command(subjects.ACTUATOR, restart)
    assert (await tap.result_of(restart)).ok
    await _status(tap, 2)
    pids = _rank_pids(tap, 2)
    assert pids["node-1"] != dead  # started cold
    log = await _logged(tmp_path / "actuator.log", "node-1")
    assert "no standby to take on node-1" in log or "died before its assignment" in log, log
    # and the dead standby is replaced once the job steps
    await _stepped(bus)
    await tap.wait_for(
        lambda e: (
            isinstance(e, schemas.JobStatus)
            and bool(e.standbys.get("node-1"))
            and dead not in e.standbys["node-1"]
        ),
        timeout_s=90,
        what="a new standby on node-1",
    )


async def test_a_script_that_does_not_serve_standbys_gets_none(rig, tmp_path: Path) -> None:  # noqa: F811
    bus, tap, _ = rig
    # RANK_SCRIPT reads RANK, which a standby does not have: it exits before it is ready
    await bus.send_command(subjects.ACTUATOR, _start(script=RANK_SCRIPT, spares=0))
    await _status(tap, 1)
    await _stepped(bus)
    log = tmp_path / "actuator.log"
    for _ in range(600):
        text = log.read_text()
        if text.count("no more standbys on") == 2:
            break
        await asyncio.sleep(0.1)
    else:
        raise AssertionError(f"no line saying the standbys are off: {log.read_text()}")
    assert "does the job use run_job?" in text
    await _stepped(bus)
    await asyncio.sleep(2.0)
    # not started again: a crash loop of standbys would cost the job CPU for nothing
    assert log.read_text().count("standby ") - text.count("standby ") == 0
    assert not _newest_status(tap).standbys


async def test_a_scale_up_waits_for_the_returned_nodes_standby(rig) -> None:  # noqa: F811
    bus, tap, _ = rig
    await bus.send_command(subjects.ACTUATOR, _start(spares=0))
    await _status(tap, 1)
    await _stepped(bus)
    await _standbys_on(tap, {"node-0", "node-1"})
    down = schemas.ScaleTo(job=JOB, num_dp_replicas=1, drop_nodes=["node-1"], standbys=True)
    await bus.send_command(subjects.ACTUATOR, down)
    assert (await tap.result_of(down)).ok
    smaller = await _status(tap, 2)
    # the job trains on node-0 alone: the dropped node's standby is stopped, node-0's replaced
    await _stepped(bus)
    await tap.wait_for(
        lambda e: isinstance(e, schemas.JobStatus) and set(e.standbys) == {"node-0"},
        timeout_s=90,
        what="a ready standby on node-0 only",
        after_ts=smaller.ts,
    )
    back = schemas.ReturnNode(job=JOB, node="node-1")
    await bus.send_command(subjects.ACTUATOR, back)
    assert (await tap.result_of(back)).ok
    # at once, as the policy does: the repaired node has no standby yet; the scale-up warms one
    # while the job trains on, and that standby becomes the node's rank (no cold start)
    up = schemas.ScaleTo(job=JOB, num_dp_replicas=2, nodes=["node-0", "node-1"], standbys=True)
    await bus.send_command(subjects.ACTUATOR, up)
    assert (await tap.result_of(up)).ok
    grown = await _status(tap, 3)
    assert grown.world_size == 2
    started = [e for e in tap.of(schemas.RankStarted) if e.attempt == 3 and e.node == "node-1"]
    standby_pids = {
        pid for status in tap.of(schemas.JobStatus) for pid in status.standbys.get("node-1", [])
    }
    assert [e.pid for e in started] and started[0].pid in standby_pids
