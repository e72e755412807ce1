"""The channel between the actuator and a standby rank it started (no torch here).

Two flavours of one protocol — the standby says it is ready once the job's state is built,
then receives one assignment, a :class:`~goodput.launch.rank_env.RankEnv` as JSON: exactly what a
rank started cold finds in its environment:

- **local** (a process the actuator started): the standby's standard input is one end of a
  socket pair whose other end the actuator holds. The standby writes :data:`READY`, then
  reads one line; end of file instead (the actuator stopped it or went away) releases it.
  Local, so an assignment costs no bus round trip.
- **bus** (a pod: no socket can be handed to it): the pod's environment names a NATS subject
  (:data:`SUBJECT_ENV`). The standby serves requests on it, then writes :data:`READY_FILE`
  (its pod's readiness probe checks the file, so the actuator learns it from the pod watch);
  the assignment is a request, answered :data:`ACCEPTED` once taken. No responder means no
  ready standby. A pod standby is released by deleting its pod.
"""

from __future__ import annotations

import asyncio
import os
import socket
from pathlib import Path
from typing import TYPE_CHECKING

import msgspec

from goodput.launch.rank_env import RankEnv, RankEnvError

if TYPE_CHECKING:
    from nats.aio.client import Client as NatsClient

#: what a standby says once its state is built
READY = b"ready\n"
#: a RankEnv as JSON is far below this; a longer line is not an assignment
MAX_LINE = 64 * 1024
#: set in a pod standby's environment: the NATS subject its assignment comes on
SUBJECT_ENV = "GOODPUT_STANDBY_SUBJECT"
#: where a pod standby says it is ready (memory-backed /dev/shm: always writable in a rank pod)
READY_FILE = Path("/dev/shm/goodput-standby-ready")
#: a pod standby's answer to the assignment it took
ACCEPTED = b"accepted"


class StandbyReleased(Exception):
    """The actuator closed the channel: this standby will not be assigned (exit quietly)."""


def encode_assignment(env: RankEnv) -> bytes:
    return msgspec.json.encode(env) + b"\n"


def decode_assignment(line: bytes) -> RankEnv:
    """The RankEnv of an assignment line; raises :class:`RankEnvError` naming what is wrong."""
    try:
        return msgspec.json.decode(line, type=RankEnv)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise RankEnvError(f"not a standby assignment: {exc}") from None


def await_assignment(fd: int = 0) -> RankEnv:
    """In the standby: say ready on ``fd`` (its standard input, a socket), block until the
    assignment comes and return it. Raises :class:`StandbyReleased` on end of file."""
    channel = socket.socket(fileno=os.dup(fd))
    try:
        channel.sendall(READY)
        line = b""
        while not line.endswith(b"\n"):
            chunk = channel.recv(4096)
            if not chunk:
                raise StandbyReleased("the actuator closed the channel")
            line += chunk
            if len(line) > MAX_LINE:
                raise RankEnvError(f"standby assignment longer than {MAX_LINE} bytes")
    finally:
        channel.close()
    return decode_assignment(line)


def receive_assignment() -> RankEnv:
    """In the standby: its assignment through the channel its environment names (the bus
    when :data:`SUBJECT_ENV` is set, else the socket pair on standard input)."""
    subject = os.environ.get(SUBJECT_ENV, "")
    if subject:
        return asyncio.run(await_assignment_on_bus(subject))
    return await_assignment()


async def await_assignment_on_bus(subject: str, ready_file: Path = READY_FILE) -> RankEnv:
    """In a pod standby: serve ``subject``, say ready in ``ready_file`` and return the first
    assignment that decodes (answered :data:`ACCEPTED`; anything else is answered with why)."""
    from goodput.bus import Bus  # the bus flavour only: a local standby needs no NATS client
    from goodput.bus.settings import settings_from_env

    bus = await Bus.connect(settings_from_env(os.environ), name=f"standby {subject}")
    assigned: asyncio.Future[RankEnv] = asyncio.get_running_loop().create_future()

    async def on_request(msg) -> None:
        if assigned.done():
            await msg.respond(b"already assigned")
            return
        try:
            env = decode_assignment(msg.data)
        except RankEnvError as exc:
            await msg.respond(str(exc).encode())
            return
        await msg.respond(ACCEPTED)
        assigned.set_result(env)

    try:
        await bus.nc.subscribe(subject, cb=on_request)
        await bus.nc.flush()
        ready_file.write_bytes(READY)
        return await assigned
    finally:
        await bus.close()


async def assign_on_bus(nc: NatsClient, subject: str, env: RankEnv, timeout_s: float) -> str:
    """In the actuator: hand ``env`` to the pod standby serving ``subject``; "" when it took
    it, else why not (no responder: it is not ready or gone; a refusal; no answer in time)."""
    import nats.errors

    try:
        reply = await nc.request(subject, encode_assignment(env), timeout=timeout_s)
    except (nats.errors.Error, OSError) as exc:  # no responders, timeout, connection closed
        return f"no answer from the standby ({type(exc).__name__})"
    if reply.data == ACCEPTED:
        return ""
    return f"the standby refused: {reply.data.decode(errors='replace')}"
