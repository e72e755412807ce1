"""`goodput bench detect` picks its victims only from a settled job (issue #16: an IndexError).

The job's events are set by hand on a real, unstarted ``JobEvents`` (no bus needed to read them).
"""

from __future__ import annotations

import asyncio

import pytest

from goodput import schemas
from goodput.bus.job_events import JobEvents
from goodput.tools.bench.detect_waits import BenchError, stepping_on

JOB = "bench"


def status(ts: int, nodes: list[str], state: str = "running") -> schemas.JobStatus:
    return schemas.JobStatus(
        job=JOB,
        ts=ts,
        state=state,  # type: ignore[arg-type]
        attempt=1,
        world_size=len(nodes),
        procs_per_node=1,
        active_nodes=nodes,
        pids={node: [100 + i] for i, node in enumerate(nodes)},
        detail="why",
    )


def step(ts: int) -> schemas.StepDone:
    return schemas.StepDone(
        job=JOB, ts=ts, node="node-0", rank=0, step=ts, step_time_s=0.3, tokens=1, loss=1.0
    )


def exited(ts: int) -> schemas.RankExited:
    return schemas.RankExited(
        job=JOB, ts=ts, node="node-1", rank=1, pid=101, exit_code=None, signal=9
    )


def settled(events: list[schemas.Event]) -> schemas.JobStatus:
    log = JobEvents(None, JOB)  # type: ignore[arg-type]  # never started: events set by hand
    log.events = events
    return asyncio.run(stepping_on(log, 2, timeout_s=0))


def test_a_running_job_on_two_stepping_nodes_is_settled() -> None:
    current = status(10, ["node-0", "node-1"])
    assert settled([status(1, ["node-0", "node-1"]), step(5), current, step(11)]) is current


@pytest.mark.parametrize(
    "events",
    [
        # the job relaunches: ranks of the status read are exiting
        [status(1, ["node-0", "node-1"]), step(2), exited(3)],
        # no step since the relaunch yet
        [status(1, ["node-0", "node-1"]), step(2), status(4, ["node-0", "node-2"])],
        # false positives used up the spares: an eviction scaled the job down to one node
        [status(1, ["node-0", "node-1"]), status(5, ["node-0"]), step(6)],
    ],
)
def test_a_job_in_flux_or_on_one_node_is_an_error_in_one_line(events) -> None:
    with pytest.raises(BenchError, match="did not run on 2 stepping nodes") as caught:
        settled(events)
    assert "\n" not in str(caught.value)


def test_a_stopped_job_is_an_error_at_once() -> None:
    with pytest.raises(BenchError, match="the job is stopped"):
        settled([status(1, ["node-0", "node-1"], state="stopped")])
