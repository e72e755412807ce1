"""Where events come from: an exported JSON-lines log, or the GP_EVENTS stream on the bus.

A log file is either goodput's own export (one ``msgspec.json.encode(event)`` object per
line, with the ``kind`` tag) or a resiliency-calculator log (``event_type`` field); the
first non-blank line decides which.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any, BinaryIO, Union

import msgspec

from goodput import schemas, subjects
from goodput.bus import Bus
from goodput.bus.job_events import check_history, count_events, deliver_from
from goodput.bus.routing import decode_event_on
from goodput.measure.accounting.resiliency import ResiliencyEvent

log = logging.getLogger(__name__)

#: seconds a replay waits for the next message before calling the bus stuck
REPLAY_IDLE_TIMEOUT_S = 10.0

_event_decoder = msgspec.json.Decoder(type=Union[schemas.EVENT_TYPES])  # noqa: UP007
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


def iter_event_log(
    path: str | os.PathLike[str], *, strict: bool = True
) -> Iterator[schemas.Event] | Iterator[ResiliencyEvent]:
    """The events of a JSON-lines log, one line at a time, auto-detecting its format.

    Streaming (one decoder, one pass, no copy of the file in memory) is what lets a report
    read millions of lines. With ``strict`` a line that does not decode raises
    :class:`EventLogError` naming the file and line; without, it is logged and skipped (a log
    cut short while being written ends in a partial line).
    """
    path = Path(path)
    try:
        handle = open(path, "rb")  # noqa: SIM115 (closed by the generator below)
    except OSError as exc:
        raise EventLogError(f"cannot read {path}: {exc.strerror or exc}") from exc
    return _decode_lines(path, handle, strict)


def _decode_lines(path: Path, handle: BinaryIO, strict: bool) -> Iterator[Any]:
    decode: Callable[[bytes], object] | None = None
    with handle:
        try:
            for number, line in enumerate(handle, 1):
                if not line.strip():
                    continue
                if decode is None:
                    try:
                        kind = detect_format(line)
                    except EventLogError as exc:
                        raise EventLogError(f"{path}:{number}: {exc}") from exc
                    decode = _decode_ours if kind == "events" else _resiliency_decoder.decode
                try:
                    yield decode(line)
                except (msgspec.DecodeError, msgspec.ValidationError) as exc:
                    if strict:
                        raise EventLogError(f"{path}:{number}: {exc}") from exc
                    log.warning("skipping %s:%d: %s", path, number, exc)
        except OSError as exc:
            raise EventLogError(f"cannot read {path}: {exc.strerror or exc}") from exc
    if decode is None:
        raise EventLogError(f"{path} holds no events")


def load_event_log(
    path: str | os.PathLike[str], *, strict: bool = True
) -> list[schemas.Event] | list[ResiliencyEvent]:
    """Every event of a JSON-lines log (:func:`iter_event_log`, as a list)."""
    return list(iter_event_log(path, strict=strict))  # type: ignore[return-value]  # one format: the first line's


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
    as messages arrive. A newest run whose start rolled off the stream raises
    :class:`~goodput.bus.job_events.HistoryRolledOffError` (its figures would be wrong); with
    ``all_runs``, events gone from the stream's head are one logged line.
    """
    subjects.check_token(job, "job name")
    total = await count_events(bus, job)
    if total == 0:
        return []
    warning = await check_history(bus, job, all_runs=all_runs)
    if warning:
        log.warning(warning)
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
                events.append(decode_event_on(message.subject, message.data))
            except schemas.SchemaError as exc:
                log.warning("skipping undecodable event on %s: %s", message.subject, exc)
            if progress is not None:
                progress(seen, max(total, seen))
            if message.metadata.num_pending == 0:
                break
    finally:
        await subscription.unsubscribe()
    return events
