"""The checkpoint digest (xxh3_128), counted: every byte this process hashes is tallied.

Hashing 100 GB costs minutes of CPU and disk, so how often a checkpoint is hashed matters;
the tally makes it observable (the replicator logs it, ``goodput bench restore`` reads it)
without each caller keeping its own count. CPU time is the hashing thread's own, so
concurrent hashers add up instead of overlapping.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

import xxhash


@dataclass(frozen=True)
class HashTotals:
    """What this process hashed so far: bytes, and CPU seconds spent hashing them (the hash
    function, and reading files that are read only to be hashed)."""

    bytes: int = 0
    cpu_s: float = 0.0


class _Tally:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._bytes = 0
        self._cpu_s = 0.0

    def add(self, nbytes: int, cpu_s: float) -> None:
        with self._lock:
            self._bytes += nbytes
            self._cpu_s += cpu_s

    def totals(self) -> HashTotals:
        with self._lock:
            return HashTotals(self._bytes, self._cpu_s)


_TALLY = _Tally()


def add_read_cpu(cpu_s: float) -> None:
    """CPU spent reading a file only to hash it (``hash_file``): part of what hashing costs."""
    _TALLY.add(0, cpu_s)


def hash_totals() -> HashTotals:
    """Everything this process hashed with :class:`Xxh3` since it started."""
    return _TALLY.totals()


class Xxh3:
    """An xxh3_128 hasher (``update``, ``hexdigest``) whose input is tallied."""

    __slots__ = ("_hasher",)

    def __init__(self) -> None:
        self._hasher = xxhash.xxh3_128()

    def update(self, data: bytes | bytearray | memoryview) -> None:
        started = time.thread_time()
        self._hasher.update(data)
        nbytes = data.nbytes if isinstance(data, memoryview) else len(data)
        _TALLY.add(nbytes, time.thread_time() - started)

    def hexdigest(self) -> str:
        return self._hasher.hexdigest()
