"""The channel between the actuator and a standby rank process it started (no torch here).

A standby's standard input is one end of a socket pair whose other end the actuator holds.
The standby writes :data:`READY` once the job's state is built, then reads one line: its
assignment, a :class:`~goodput.rank_env.RankEnv` as JSON — exactly what a rank started cold
finds in its environment. End of file instead (the actuator stopped it or went away) releases
it. Local, so an assignment costs no bus round trip, and owned by the one service that owns
rank processes.
"""

from __future__ import annotations

import os
import socket

import msgspec

from goodput.rank_env import RankEnv, RankEnvError

#: what a standby says once its state is built
READY = b"ready\n"
#: a RankEnv as JSON is far below this; a longer line is not an assignment
MAX_LINE = 64 * 1024


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
