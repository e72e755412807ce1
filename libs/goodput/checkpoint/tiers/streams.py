"""Moving a checkpoint's files several at a time, largest first: a push to a peer and a
restore onto a volume share this one rule.

With one stream, each file's transfer waits for the previous file's hashing, write and fsync;
with two, one file's fsync overlaps the next one's transfer. Largest first, so the streams
end together rather than one carrying the biggest file alone at the end.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import TypeVar

#: files moved at once (connections per peer); more did not help on 2 cores (BENCHMARKS.md)
STREAMS = 2

Entry = TypeVar("Entry")
Result = TypeVar("Result")


async def largest_first(
    entries: Sequence[Entry],
    size: Callable[[Entry], int],
    move: Callable[[Entry, int], Awaitable[Result]],
    streams: int = STREAMS,
) -> list[Result]:
    """``move(entry, stream)`` for every entry on up to ``streams`` concurrent streams
    (numbered from 0), largest first; the results in the order of ``entries``.

    If a move fails, the other streams finish the file they are on and take no more, and the
    first error is raised: the caller commits nothing."""
    pending = sorted(range(len(entries)), key=lambda i: size(entries[i]), reverse=True)
    results: dict[int, Result] = {}
    failures: list[BaseException] = []

    async def drain(stream: int) -> None:
        while pending and not failures:
            index = pending.pop(0)
            try:
                results[index] = await move(entries[index], stream)
            except Exception as exc:
                failures.append(exc)

    await asyncio.gather(*(drain(s) for s in range(max(1, min(streams, len(entries))))))
    if failures:
        raise failures[0]
    return [results[i] for i in range(len(entries))]
