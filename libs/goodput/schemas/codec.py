"""Bytes to messages and back (msgpack): one strict decoder per family, built from the
families' type tuples, so adding a struct to a tuple (a command: registering it) is the only
step to make it decodable."""

from __future__ import annotations

from typing import Any, Union

import msgspec

from goodput.schemas import commands
from goodput.schemas.agents import AgentRecord
from goodput.schemas.commands import Command, CommandClaim
from goodput.schemas.envelope import SCHEMA_VERSION, Message, SchemaError
from goodput.schemas.events import EVENT_TYPES, Event
from goodput.schemas.steps import StepDone

_encoder = msgspec.msgpack.Encoder()
# a Union built from the tuples, so adding a schema to a tuple is the only step
_event_decoder = msgspec.msgpack.Decoder(type=Union[EVENT_TYPES])  # noqa: UP007
_claim_decoder = msgspec.msgpack.Decoder(type=CommandClaim)
_agent_decoder = msgspec.msgpack.Decoder(type=AgentRecord)


class _CommandDecoders:
    """The command and any-message decoders of the command registry as it stands: built again
    when ``commands.register`` has added a type since (an identity check per decode)."""

    def __init__(self) -> None:
        self._types: tuple[type[Command], ...] | None = None

    def get(self) -> tuple[msgspec.msgpack.Decoder[Any], msgspec.msgpack.Decoder[Any]]:
        types = commands.COMMAND_TYPES
        if self._types is not types:
            self._command = msgspec.msgpack.Decoder(type=Union[types])  # noqa: UP007
            self._any = msgspec.msgpack.Decoder(type=Union[EVENT_TYPES + types])  # noqa: UP007
            self._types = types
        return self._command, self._any


_command_decoders = _CommandDecoders()
_step_decoder = msgspec.msgpack.Decoder(type=StepDone)


def encode(message: Message) -> bytes:
    return _encoder.encode(message)


def _decode(decoder: msgspec.msgpack.Decoder[Any], payload: bytes) -> Any:
    try:
        message = decoder.decode(payload)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise SchemaError(str(exc)) from exc
    except RecursionError as exc:  # msgspec skipping a deeply nested value it will reject anyway
        raise SchemaError("nested too deeply") from exc
    if message.schema > SCHEMA_VERSION:
        raise SchemaError(
            f"schema version {message.schema} is newer than this build understands "
            f"({SCHEMA_VERSION}); upgrade goodput"
        )
    return message


def decode_event(payload: bytes) -> Event:
    return _decode(_event_decoder, payload)


def decode_command(payload: bytes) -> Command:
    return _decode(_command_decoders.get()[0], payload)


def decode_claim(payload: bytes) -> CommandClaim:
    return _decode(_claim_decoder, payload)


def decode_agent(payload: bytes) -> AgentRecord:
    return _decode(_agent_decoder, payload)


def decode_step(payload: bytes) -> StepDone:
    """A rank's step report handed to its node's aggregator (``goodput.shim.step_rollup``)."""
    return _decode(_step_decoder, payload)


def decode_any(payload: bytes) -> Message:
    return _decode(_command_decoders.get()[1], payload)


def kind_of(struct_type: type[msgspec.Struct]) -> str:
    """The name ``struct_type`` is tagged with: a message's kind (or a chaos fault's).

    msgspec types a tag as ``str | int | None``; every tagged struct here is named by a str."""
    tag = struct_type.__struct_config__.tag
    if not isinstance(tag, str):
        raise TypeError(f"{struct_type.__name__} is not tagged with a name: {tag!r}")
    return tag
