"""Where the node's shared-memory segments live and what they are called (torch-free).

A rank's host buffer is a file in ``/dev/shm`` (``checkpoint/engine/node_segments.py`` makes
and reads them) named after the checkpoint root its node's ranks share, so they find each
other's without talking. Its owner holds an ``flock`` on it for as long as it lives, and the
kernel drops that lock when the process dies, even on SIGKILL: a segment nobody holds is a
dead rank's. Such a segment is kept on purpose (the rank's replacement reads it), and swept by
the next engine that saves on the root — or, once the stack is stopped and nothing will save
there again, by `goodput down`, which is why this lives apart from torch.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
from pathlib import Path

import xxhash

log = logging.getLogger(__name__)

#: where the segments are made: a tmpfs every process of the host (or pod) shares
SEGMENT_DIR = Path("/dev/shm")
#: a name in /dev/shm may be anything: never follow a link, never block on a FIFO
OPEN_UNTRUSTED = os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK


def segment_prefix(root: Path) -> str:
    """The names of one root's segments begin with this: every rank of a node derives it
    from the volume they share, and distinct jobs and nodes on one host get distinct ones."""
    key = xxhash.xxh3_64_hexdigest(str(root.resolve()).encode())
    return f"goodput-ckpt-{key}-"


def segment_names(directory: Path, prefix: str) -> list[str]:
    """The names in ``directory`` of the segments whose names begin with ``prefix``."""
    try:
        return [name for name in os.listdir(directory) if name.startswith(prefix)]
    except OSError:
        return []


def sweep_dead(root: Path, directory: Path = SEGMENT_DIR) -> list[str]:
    """Unlink ``root``'s segments whose owner is gone (nobody holds their lock); returns them."""
    gone = []
    for name in segment_names(directory, segment_prefix(root)):
        path = directory / name
        try:
            fd = os.open(path, OPEN_UNTRUSTED)
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            continue  # its owner lives
        else:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
            gone.append(name)
        finally:
            os.close(fd)
    if gone:
        log.info("removed %d shared-memory segment(s) of exited ranks", len(gone))
    return gone
