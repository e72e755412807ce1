from __future__ import annotations

import asyncio
import time
from collections import Counter

from goodput import schemas, subjects
from goodput.bus import Bus
from nats.js.api import ConsumerConfig, DeliverPolicy


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
    while True:
        counts = Counter(r.command_id for r in await action_results(bus, job))
        if command_ids <= set(counts) or time.monotonic() > deadline:
            return counts
        await asyncio.sleep(0.5)
