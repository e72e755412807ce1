"""The pipe between the controller and its policy worker: versioned messages in length-prefixed frames.

Both ends import it (``policy_process`` in the controller, ``policy_worker`` in the child). A
frame is a 4-byte big-endian length and one msgpack message. The worker says ``Hello`` (its
protocol version: a worker started after the code on disk changed may speak another) as soon
as it runs, ``Loaded`` once the script's import ended, then one ``Answer`` per ``Call``. The
worker runs operator code, which can write into the pipe as well as the worker can, so the
controller reads nothing from it on trust: a frame over :data:`MAX_ANSWER_BYTES`, bytes that
do not decode as the expected message, or bytes nobody asked for are garbage, and the plan in
an answer is validated again against the controller's own state.
"""

from __future__ import annotations

import os

import msgspec

from goodput import schemas
from goodput.supervisor.jobstate.model import AnyCommand, JobState

#: bumped whenever a message below changes shape
VERSION = 1
HEADER_BYTES = 4
#: an answer holds at most ``MAX_COMMANDS`` commands and two sentences: far below this
MAX_ANSWER_BYTES = 1 << 20


class _Message(msgspec.Struct, kw_only=True, forbid_unknown_fields=True, tag_field="kind"):
    pass


class Hello(_Message, tag="hello"):
    version: int


class Loaded(_Message, tag="loaded"):
    #: why the import failed, one line ("": ``decide`` is ready)
    error: str = ""


class Call(_Message, tag="call"):
    call: int
    signal: schemas.Signal
    state: JobState


class Answer(_Message, tag="answer"):
    call: int
    commands: list[AnyCommand] = msgspec.field(default_factory=list)
    rule: str = ""
    reason: str = ""
    #: the script raised, or its plan failed validation (then no commands), one line
    error: str = ""


FromWorker = Hello | Loaded | Answer

_from_worker = msgspec.msgpack.Decoder(FromWorker)
_calls = msgspec.msgpack.Decoder(Call)
_encoder = msgspec.msgpack.Encoder()


def frame(message: _Message) -> bytes:
    payload = _encoder.encode(message)
    return len(payload).to_bytes(HEADER_BYTES, "big") + payload


def decode_from_worker(payload: bytes) -> Hello | Loaded | Answer:
    """Raises ``msgspec.DecodeError`` (or ``ValidationError``) on anything else."""
    return _from_worker.decode(payload)


# ---- the worker's side: blocking, the controller bounds it -----------------------------------


def read_call(fd: int) -> Call | None:
    """The next call, or None when the controller closed the pipe (it stopped, or died)."""
    header = _read_exactly(fd, HEADER_BYTES)
    if header is None:
        return None
    payload = _read_exactly(fd, int.from_bytes(header, "big"))
    return None if payload is None else _calls.decode(payload)


def write_frame(fd: int, message: _Message) -> None:
    data = memoryview(frame(message))
    while data:
        data = data[os.write(fd, data) :]


def _read_exactly(fd: int, size: int) -> bytes | None:
    chunks, left = [], size
    while left:
        chunk = os.read(fd, min(left, 1 << 20))
        if not chunk:
            return None
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)
