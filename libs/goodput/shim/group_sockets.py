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

The group's sockets are the TCP connections its creation opened (:func:`opened_by`): ``run_job``
and the in-process rejoin create their groups through it. Other threads open sockets
meanwhile — the shim's bus link connects while the rendezvous waits, and once a cut of its
connection dropped the bus at the moment the rank had to answer its ``Rejoin`` — so the
connections to the bus's servers are spared. A group the user's script created itself is not
known here, and its gloo connections are not cut. Linux only (``/proc/self``); elsewhere no
socket is found and nothing is cut.
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


def tcp_ports() -> dict[int, tuple[int, int]]:
    """TCP sockets of this process's network namespace: inode -> (local port, remote port)."""
    found: dict[int, tuple[int, int]] = {}
    for table in ("/proc/self/net/tcp", "/proc/self/net/tcp6"):
        with contextlib.suppress(OSError), open(table) as rows:
            next(rows, None)  # the header
            for row in rows:
                fields = row.split()
                local, remote = (int(end.rsplit(":", 1)[1], 16) for end in fields[1:3])
                found[int(fields[9])] = (local, remote)
    return found


def opened_by(
    create: Callable[[], T], sparing: frozenset[int] = frozenset()
) -> tuple[T, frozenset[int]]:
    """``create()``'s result and the TCP connections opened while it ran and still open (a
    process group's to its peers and its store, when ``create`` forms one), but for those to a
    remote port in ``sparing`` (the bus's servers)."""
    before = socket_inodes().keys()
    result = create()
    opened = socket_inodes().keys() - before
    ports = tcp_ports()
    return result, frozenset(i for i in opened if i in ports and ports[i][1] not in sparing)


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
