"""A process group's TCP connections, and cutting them: what aborts a gloo group.

``ProcessGroup.abort()`` is a no-op on gloo (only NCCL overrides it; checked in torch 2.13),
and a gloo collective blocked on a *live* peer never fails by itself. With four ranks in a ring
and one killed, the dead rank's two neighbours fail at once, but the third survivor waits on a
neighbour that is itself stuck: freeing its group joins a worker thread still blocked on the
third survivor. They wait on each other until the group's timeout (minutes): a warm restart
turned cold. Measured on four gloo ranks (DDP, one killed in its backward pass): the third
survivor failed after 8 s, or not within 40 s, in each of three runs; with its peers'
connections cut, every survivor failed within 0.5 s.

Cutting is ``shutdown(2)`` on the group's connected sockets, never ``close``: the descriptors
stay gloo's, every read on them returns end of file and every send fails, exactly as when a
peer process dies, so each collective waiting on this rank fails now on every peer. Listening
sockets are left alone (gloo's listener thread aborts the process when ``accept`` fails).

The group's sockets are those its creation opened (:func:`opened_by`): ``run_job`` and the
in-process rejoin create their groups through it. A group the user's script created itself is
not known here, and its gloo connections are not cut. Linux only (``/proc/self/fd``); elsewhere
no socket is found and nothing is cut.
"""

from __future__ import annotations

import contextlib
import os
import socket
from collections.abc import Callable, Iterable
from typing import TypeVar

T = TypeVar("T")

_FDS = "/proc/self/fd"


def socket_inodes() -> dict[int, int]:
    """This process's open sockets: inode -> a descriptor of it (none off Linux)."""
    found: dict[int, int] = {}
    with contextlib.suppress(OSError):
        for name in os.listdir(_FDS):
            with contextlib.suppress(OSError):
                target = os.readlink(f"{_FDS}/{name}")
                if target.startswith("socket:["):
                    found[int(target[8:-1])] = int(name)
    return found


def opened_by(create: Callable[[], T]) -> tuple[T, frozenset[int]]:
    """``create()``'s result and the sockets it opened and left open (a process group's
    connections to its peers and to its store, when ``create`` forms one)."""
    before = socket_inodes().keys()
    result = create()
    return result, frozenset(socket_inodes().keys() - before)


def cut(inodes: Iterable[int]) -> int:
    """Shut down every still-open, connected socket of ``inodes``; returns how many. A
    descriptor is checked against its inode after it is duplicated, so a number that was
    closed and reused meanwhile is never touched."""
    wanted = set(inodes)
    done = 0
    for inode, fd in socket_inodes().items():
        if inode not in wanted:
            continue
        with contextlib.suppress(OSError):
            duplicate = os.dup(fd)
            try:
                if os.fstat(duplicate).st_ino == inode and _shut_down(duplicate):
                    done += 1
            finally:
                os.close(duplicate)
    return done


def _shut_down(fd: int) -> bool:
    view = socket.socket(fileno=fd)
    try:
        if view.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN):
            return False
        view.shutdown(socket.SHUT_RDWR)
        return True
    except OSError:  # not connected (any more)
        return False
    finally:
        view.detach()  # the caller closes its duplicate; gloo keeps its own descriptor
