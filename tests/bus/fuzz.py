"""Seeded malformed messages: every payload is checked to be rejected by the decoder it targets.

The kinds are what a broken or hostile publisher sends: random bytes, truncated msgpack and
JSON, wrong field types, unknown kinds and fields, newer schema versions, a missing job, an id
that cannot be recorded, deep nesting, the other family's messages, and payloads up to the
server's max payload.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from typing import Any

import msgspec

from goodput import schemas
from tests.bus.samples import sample_commands, sample_events

KINDS = (
    "random_bytes",
    "truncated_msgpack",
    "truncated_json",
    "wrong_type",
    "unknown_kind",
    "unknown_field",
    "newer_schema",
    "missing_job",
    "bad_command_id",
    "deep_nesting",
    "other_family",
)


def _wrong_value(value: Any, rng: random.Random) -> Any:
    if isinstance(value, str):
        return rng.choice([12345, [value], {"a": 1}, None, 1.5])
    if isinstance(value, bool | int | float):
        return rng.choice(["x", [1], {"a": 1}, "1e999"])
    return rng.choice(["x", 7, {"a": [1, 2]}])


def _deep(rng: random.Random) -> bytes:
    nested = b"\x91" * rng.randint(200, 50_000) + b"\xc0"
    enc = msgspec.msgpack.encode
    return b"\x82" + enc(rng.choice(["job", "zz"])) + nested + enc("kind") + enc("step_done")


class Fuzzer:
    """Malformed payloads for events (``family="event"``) or commands (``"command"``)."""

    def __init__(self, seed: int, max_payload: int):
        self.rng = random.Random(seed)
        self.max_payload = max_payload
        self.events = [msgspec.to_builtins(e) for e in sample_events()]
        self.commands = [msgspec.to_builtins(c) for c in sample_commands()]

    def payload(self, family: str) -> tuple[str, bytes]:
        """(kind, payload) that ``family``'s decoder rejects."""
        decode: Callable[[bytes], Any] = (
            schemas.decode_event if family == "event" else schemas.decode_command
        )
        while True:
            kind = self.rng.choice(KINDS)
            data = self._make(kind, family)
            try:
                decode(data)
            except schemas.SchemaError:
                return kind, data

    def huge(self) -> bytes:
        """A payload of the max size or just below it (random bytes or an oversized message)."""
        size = self.max_payload - self.rng.choice([0, 0, 1, self.rng.randint(2, 65_536)])
        if self.rng.random() < 0.5:
            return self.rng.randbytes(size)
        base = dict(self.rng.choice(self.events))
        base["blob"] = ""
        overhead = len(msgspec.msgpack.encode(base)) + 5
        base["blob"] = "x" * (size - overhead)
        data = msgspec.msgpack.encode(base)
        return data + b"\x00" * (size - len(data))

    def _make(self, kind: str, family: str) -> bytes:
        rng = self.rng
        pool = self.events if family == "event" else self.commands
        message = dict(rng.choice(pool))
        enc = msgspec.msgpack.encode
        if kind == "random_bytes":
            return rng.randbytes(rng.randint(0, 4096))
        if kind == "truncated_msgpack":
            data = enc(message)
            return data[: rng.randrange(len(data))]
        if kind == "truncated_json":
            data = json.dumps(message, default=repr).encode()
            return data[: rng.randrange(len(data))]
        if kind == "wrong_type":
            field = rng.choice([k for k in message if k != "kind"])
            message[field] = _wrong_value(message[field], rng)
        elif kind == "unknown_kind":
            message["kind"] = rng.choice(["", "zz", "step_done ", "STEP_DONE", "x" * 300])
        elif kind == "unknown_field":
            message[f"zz{rng.randint(0, 99)}"] = rng.choice([1, "x", [1], {"a": None}])
        elif kind == "newer_schema":
            message["schema"] = schemas.SCHEMA_VERSION + rng.randint(1, 10**6)
        elif kind == "missing_job":
            del message["job"]
        elif kind == "bad_command_id":
            message["command_id"] = rng.choice(["", "a b", "x.*", ">", "id\n", "é" * 3])
        elif kind == "deep_nesting":
            return _deep(rng)
        elif kind == "other_family":
            other = self.commands if family == "event" else self.events
            message = dict(rng.choice(other))
        return enc(message)
