"""Start writing a file's dirty page-cache pages to disk without waiting for them.

A restore writes bytes the ranks read right after, so it writes them through the page cache
(the read then finds them in memory) rather than with O_DIRECT. Left alone, the kernel writes
dirty pages back only after seconds, and the fsync before the file is published would then
do the whole write at once; starting the write-back of each range as it lands (Linux
``sync_file_range(SYNC_FILE_RANGE_WRITE)``) lets the disk work while the rest arrives, and
the fsync waits only for the last ranges. It guarantees nothing by itself: durability is
still the caller's fsync. Where the call does not exist (not Linux, not glibc) or the
filesystem or sandbox refuses it, it is skipped and the fsync does all the writing, as it
would have anyway.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import os

SYNC_FILE_RANGE_WRITE = 2  # <fcntl.h>: start write-out of dirty pages in the range, don't wait


def _load_sync_file_range():
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        function = ctypes.CDLL(name, use_errno=True).sync_file_range
    except (OSError, AttributeError):
        return None
    function.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
    function.restype = ctypes.c_int
    return function


_sync_file_range = _load_sync_file_range()


#: what a kernel, filesystem or sandbox answers when it does not do this: skip it then
UNSUPPORTED = frozenset({errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP, errno.ESPIPE})


def start_writeback(fd: int, offset: int, count: int) -> bool:
    """Queue ``count`` bytes of ``fd`` from ``offset`` for writing to disk; return at once.

    False where it cannot be done here (the caller may stop asking); any other error (EIO,
    EBADF) is raised, as the fsync that follows would raise it."""
    if _sync_file_range is None:
        return False
    if count <= 0:
        return True
    if _sync_file_range(fd, offset, count, SYNC_FILE_RANGE_WRITE) != 0:
        error = ctypes.get_errno()
        if error in UNSUPPORTED:
            return False
        raise OSError(error, os.strerror(error))
    return True
