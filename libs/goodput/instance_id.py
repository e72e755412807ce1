"""Who a running service process is: an identity no other process shares.

A lease holder (the controller's leadership) must be told apart from every other candidate,
and neither a host name nor a pid does that: containers without their own host name share
one under host networking, and every container's first process is pid 1. An operator's
``--instance`` label (a pod name, say) names a replica for people and may be repeated by a
template, so it is never trusted to be unique either. The identity is the label (or the host
name), the pid, and a random part drawn when the process starts.
"""

from __future__ import annotations

import os
import secrets
import socket

#: random bytes per identity: 2**48 values, so two processes never draw the same
RANDOM_BYTES = 6


def instance_id(label: str = "") -> str:
    """``<label or host>-<pid>-<12 hex>``, fresh at every call (a process calls it once)."""
    return f"{label or socket.gethostname()}-{os.getpid()}-{secrets.token_hex(RANDOM_BYTES)}"
