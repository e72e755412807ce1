"""Where events come from: an exported JSON-lines log, or the GP_EVENTS stream on the bus.

A log file is either goodput's own export (one ``msgspec.json.encode(event)`` object per
line, with the ``kind`` tag) or a resiliency-calculator log (``event_type`` field); the
first non-blank line decides which.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Union

import msgspec

from goodput import schemas, subjects
from goodput.accounting.resiliency import ResiliencyEvent
from goodput.bus import Bus
from goodput.bus.job_events import count_events, deliver_from

log = logging.getLogger(__name__)

#: seconds a replay waits for the next message before calling the bus stuck
REPLAY_IDLE_TIMEOUT_S = 10.0

_event_decoder = msgspec.json.Decoder(type=Union[schemas.EVENT_TYPES])  # type: ignore[valid-type]  # noqa: UP007
_resiliency_decoder = msgspec.json.Decoder(type=ResiliencyEvent)


class EventLogError(ValueError):
    """A log file that cannot be read as events."""


def _decode_ours(line: bytes) -> schemas.Event:
    event = _event_decoder.decode(line)
    if event.schema > schemas.SCHEMA_VERSION:
        raise msgspec.ValidationError(
            f"schema version {event.schema} is newer than this build understands"
        )
    return event


def detect_format(line: bytes) -> str:
    """``"events"`` or ``"resiliency"`` from one line of a log."""
    try:
        record = msgspec.json.decode(line)
    except msgspec.DecodeError as exc:
        raise EventLogError(f"not JSON lines: {exc}") from exc
    if isinstance(record, dict) and "kind" in record:
        return "events"
    if isinstance(record, dict) and "event_type" in record:
        return "resiliency"
    raise EventLogError(
        "neither goodput events (no 'kind' field) nor a resiliency-calculator log "
        "(no 'event_type' field)"
    )


def load_event_log(
    path: str | os.PathLike[str], *, strict: bool = True
) -> list[schemas.Event] | list[ResiliencyEvent]:
    """Read a JSON-lines event log, auto-detecting its format.

    With ``strict`` a line that does not decode raises :class:`EventLogError` naming the
    line; without, it is logged and skipped (a log cut short while being written ends in a
    partial line).
    """
    path = Path(path)
    try:
        lines = path.read_bytes().splitlines()
    except OSError as exc:
        raise EventLogError(f"cannot read {path}: {exc.strerror or exc}") from exc
    numbered = [(number, line) for number, line in enumerate(lines, 1) if line.strip()]
    if not numbered:
        raise EventLogError(f"{path} holds no events")
    try:
        kind = detect_format(numbered[0][1])
    except EventLogError as exc:
        raise EventLogError(f"{path}:{numbered[0][0]}: {exc}") from exc
    decode: Callable[[bytes], object] = (
        _decode_ours if kind == "events" else _resiliency_decoder.decode
    )
    decoded = []
    for number, line in numbered:
        try:
            decoded.append(decode(line))
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            if strict:
                raise EventLogError(f"{path}:{number}: {exc}") from exc
            log.warning("skipping %s:%d: %s", path, number, exc)
    return decoded  # type: ignore[return-value]


def write_event_log(path: str | os.PathLike[str], events: Iterable[schemas.Event]) -> int:
    """Write events as JSON lines (atomically: a reader never sees half a file); how many."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    count = 0
    with open(tmp, "wb") as out:
        for event in events:
            out.write(msgspec.json.encode(event) + b"\n")
            count += 1
        out.flush()
        os.fsync(out.fileno())
    os.replace(tmp, path)
    return count


async def replay_from_bus(
    bus: Bus,
    job: str,
    *,
    progress: Callable[[int, int], None] | None = None,
    idle_timeout_s: float = REPLAY_IDLE_TIMEOUT_S,
    all_runs: bool = False,
) -> list[schemas.Event]:
    """Every stored event of ``job``'s newest run (``all_runs``: of every run), oldest first,
    read with an ephemeral ordered consumer. An earlier run of the same job name is another
    job instance: its down time and steps are not this run's.

    Reads until the consumer reports nothing pending. An undecodable message is logged and
    skipped: a report should not die on one bad record. ``progress(done, total)`` is called
    as messages arrive.
    """
    subjects.check_token(job, "job name")
    total = await count_events(bus, job)
    if total == 0:
        return []
    subscription = await bus.js.subscribe(
        subjects.events_of(job),
        stream=subjects.EVENTS_STREAM,
        ordered_consumer=True,
        config=await deliver_from(bus, job, all_runs=all_runs),
    )
    events: list[schemas.Event] = []
    seen = 0
    try:
        while True:
            message = await subscription.next_msg(timeout=idle_timeout_s)
            seen += 1
            try:
                events.append(schemas.decode_event(message.data))
            except schemas.SchemaError as exc:
                log.warning("skipping undecodable event on %s: %s", message.subject, exc)
            if progress is not None:
                progress(seen, max(total, seen))
            if message.metadata.num_pending == 0:
                break
    finally:
        await subscription.unsubscribe()
    return events
