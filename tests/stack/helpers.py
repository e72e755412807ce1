from __future__ import annotations

import asyncio
import contextlib
import time
from collections import Counter
from collections.abc import AsyncIterator

import nats.errors
from nats.js.api import ConsumerConfig, DeliverPolicy

from goodput import schemas, subjects
from goodput.bus import Bus, BusSettings
from goodput.bus.job_events import JobEvents
from goodput.tools.stack.record import read_stack
from tests.conftest import goodput_cli


def remediation(event: schemas.Event) -> bool:
    """A decision about a fault: the controller's checkpoint-interval tuning is a decision
    too, and may come between a fault and its remediation's decision."""
    return isinstance(event, schemas.Decision) and event.rule != "checkpoint-interval"


async def action_results(bus: Bus, job: str) -> list[schemas.ActionResult]:
    """Every ActionResult stored so far for ``job`` (a fresh ephemeral reader each call)."""
    subscription = await bus.js.pull_subscribe(
        subjects.event(job, "action_result"),
        stream=subjects.EVENTS_STREAM,
        config=ConsumerConfig(deliver_policy=DeliverPolicy.ALL),
    )
    results: list[schemas.ActionResult] = []
    try:
        while True:
            batch = await subscription.fetch(500, timeout=0.5)
            results += [schemas.decode_event(m.data) for m in batch]  # type: ignore[misc]
    except Exception:
        pass
    await subscription.unsubscribe()
    return results


async def wait_for_results(
    bus: Bus, job: str, command_ids: set[str], timeout_s: float = 30.0
) -> Counter[str]:
    deadline = time.monotonic() + timeout_s
    counts: Counter[str] = Counter()
    while True:
        # the reader's consumer is created by a JetStream API request, which times out while
        # the events stream elects a new leader (a cluster member restarted: on a loaded
        # machine that took longer than the request's 5 s): ask again until due
        with contextlib.suppress(nats.errors.TimeoutError):
            counts = Counter(r.command_id for r in await action_results(bus, job))
        if command_ids <= set(counts) or time.monotonic() > deadline:
            return counts
        await asyncio.sleep(0.5)


class EventTap(JobEvents):
    """A job's events for a test: :class:`JobEvents` plus the result of a command."""

    async def result_of(
        self, command: schemas.Command, timeout_s: float = 30.0
    ) -> schemas.ActionResult:
        return await self.wait_for(
            lambda e: isinstance(e, schemas.ActionResult) and e.command_id == command.command_id,
            timeout_s,
            f"action result of {type(command).__name__}",
        )


#: ``goodput up`` flags that turn straggler judgement off. Two ranks share this machine's two
#: cores with the rest of the suite, so one rank's compute time often runs 1.3-1.5x its peer's
#: for a few seconds (a real compute-time straggler by the sensor's rule), and an eviction
#: would pre-empt what a test is about; tests of straggler detection set their own thresholds.
NO_STRAGGLER_JUDGEMENT = ("--service-set", "sensor:thresholds={straggler_ratio=100.0}")


@contextlib.asynccontextmanager
async def job_on_stack(
    state_dir,
    job: str,
    nodes: int,
    start: schemas.StartJob,
    *up_flags: str,
    judge_stragglers: bool = False,
) -> AsyncIterator[tuple[Bus, EventTap]]:
    """`goodput up` with ``nodes`` nodes, ``start`` sent to the actuator, events tapped; torn
    down (job stopped, stack down) afterwards. Only a test of straggler detection has
    stragglers judged (see :data:`NO_STRAGGLER_JUDGEMENT`)."""
    goodput_cli(
        "up",
        "--state-dir",
        str(state_dir),
        "--job",
        job,
        "--nodes",
        str(nodes),
        "--wait",
        "30",
        *(() if judge_stragglers else NO_STRAGGLER_JUDGEMENT),
        *up_flags,
    )
    stack = read_stack(state_dir)
    assert stack is not None
    bus = await Bus.connect(BusSettings(url=stack.url), name="test")
    tap = await EventTap(bus, job).start()
    try:
        await bus.send_command(subjects.ACTUATOR, start)
        yield bus, tap
    finally:
        with contextlib.suppress(Exception):
            await bus.send_command(
                subjects.ACTUATOR, schemas.Stop(job=job, reason="test done"), retry_for_s=5
            )
        await tap.stop()
        await bus.close()
        goodput_cli("down", "--state-dir", str(state_dir), check=False)
