"""One data file of a checkpoint directory, as its manifest seals it.

Its own module because two owners build on it: the manifest lists the entries, and a part of a
checkpoint sharded across nodes (``parts``) digests them into the commit table that the
manifest in turn carries.
"""

from __future__ import annotations

import msgspec


class FileEntry(msgspec.Struct, kw_only=True):
    """One data file. ``offset`` is where it sits in the checkpoint's byte stream."""

    name: str
    size: int
    xxh3_128: str
    offset: int = 0
    dp_rank: int = 0
