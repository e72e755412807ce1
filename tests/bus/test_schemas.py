"""Strict decoding: a payload is a whole, valid message of the expected family, or an error."""

from __future__ import annotations

import msgspec
import pytest

from goodput import schemas
from tests.bus.samples import sample_commands, sample_events


@pytest.mark.parametrize(
    "message", sample_events() + sample_commands(), ids=lambda m: type(m).__name__
)
def test_every_message_round_trips_in_memory(message: schemas.Message) -> None:
    assert schemas.decode_any(schemas.encode(message)) == message


def test_samples_cover_every_schema() -> None:
    covered = {type(m) for m in sample_events() + sample_commands()}
    assert covered == set(schemas.EVENT_TYPES) | set(schemas.COMMAND_TYPES)


def test_every_message_carries_job_ts_and_schema() -> None:
    for message in sample_events() + sample_commands():
        raw = msgspec.msgpack.decode(schemas.encode(message))
        assert raw["job"] == "job-a"
        assert raw["schema"] == schemas.SCHEMA_VERSION
        assert raw["ts"] > 1_600_000_000 * 10**9


def test_timestamps_are_strictly_increasing() -> None:
    stamps = [schemas.now_ns() for _ in range(1000)]
    assert stamps == sorted(set(stamps))


def _raw(message: schemas.Message) -> dict:
    return msgspec.msgpack.decode(schemas.encode(message))


@pytest.mark.parametrize(
    ("mutate", "expected"),
    [
        (lambda raw: raw.update(unexpected=1), "unknown field"),
        (lambda raw: raw.pop("step"), "missing required field"),
        (lambda raw: raw.update(step="seven"), "Expected `int`"),
        (lambda raw: raw.update(kind="no_such_kind"), "Invalid value"),
        (lambda raw: raw.pop("kind"), "missing required field `kind`"),
        (lambda raw: raw.update(schema=schemas.SCHEMA_VERSION + 1), "newer than this build"),
    ],
)
def test_malformed_events_raise_a_typed_error(mutate, expected: str) -> None:
    raw = _raw(
        schemas.StepDone(job="j", node="n", rank=0, step=1, step_time_s=1.0, tokens=1, loss=1.0)
    )
    mutate(raw)
    with pytest.raises(schemas.SchemaError, match=expected):
        schemas.decode_event(msgspec.msgpack.encode(raw))


@pytest.mark.parametrize("payload", [b"", b"\xc1", b"not msgpack at all", b"\x93\x01\x02\x03"])
def test_garbage_raises_a_typed_error(payload: bytes) -> None:
    with pytest.raises(schemas.SchemaError):
        schemas.decode_any(payload)


def test_an_event_is_not_a_command() -> None:
    event = schemas.Signal(job="j", signal="crash", node="n")
    with pytest.raises(schemas.SchemaError):
        schemas.decode_command(schemas.encode(event))


def _step(**fields: object) -> bytes:
    step = schemas.StepDone(
        job="j", ts=1, node="n", rank=0, step=1, step_time_s=1.0, tokens=1, loss=1.0
    )
    return msgspec.msgpack.encode({**_raw(step), **fields})


@pytest.mark.parametrize(
    "fields",
    [
        {"ts": -1},
        {"ts": 2**63},
        {"step_time_s": -0.5},
        {"step_time_s": float("inf")},
        {"step_time_s": float("nan")},
        {"compute_time_s": -1.0},
        # a step longer than a day is a broken clock, not a measurement
        {"step_time_s": 1e8},
        {"compute_time_s": schemas.MAX_STEP_TIME_S * 1.001},
    ],
    ids=str,
)
def test_out_of_range_times_are_rejected(fields: dict[str, object]) -> None:
    with pytest.raises(schemas.SchemaError, match=next(iter(fields))):
        schemas.decode_event(_step(**fields))


def test_every_legitimate_time_is_admitted() -> None:
    edge = schemas.decode_event(_step(ts=2**63 - 1, step_time_s=schemas.MAX_STEP_TIME_S))
    assert edge.ts == 2**63 - 1
    assert schemas.decode_event(_step(ts=0, step_time_s=0.0)).ts == 0
    for message in sample_events() + sample_commands():  # what the services publish
        assert schemas.decode_any(schemas.encode(message)) == message


def test_a_rank_exit_reports_an_exit_code_or_a_signal_never_both() -> None:
    fields = {"job": "j", "node": "n", "rank": 0, "pid": 1}
    exited = schemas.RankExited.from_returncode(3, **fields)
    assert (exited.exit_code, exited.signal) == (3, None)
    killed = schemas.RankExited.from_returncode(-9, **fields)
    assert (killed.exit_code, killed.signal) == (None, 9)


def test_a_restore_names_a_part_with_its_count_or_neither() -> None:
    """``RestoreToNode.part``: the node's part of a checkpoint sharded across nodes; a part
    without the count, or past it, is refused at decoding, never acted on."""
    whole = schemas.RestoreToNode(job="j", node="n0")
    assert (whole.part, whole.parts) == (None, None)
    raw = msgspec.msgpack.decode(schemas.encode(whole))
    for bad in ({"part": 1}, {"parts": 2}, {"part": 2, "parts": 2}, {"part": -1, "parts": 2}):
        with pytest.raises(schemas.SchemaError):
            schemas.decode_command(msgspec.msgpack.encode({**raw, **bad}))
