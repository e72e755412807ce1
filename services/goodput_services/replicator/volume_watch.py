"""What wakes the replicator's sync before its next poll: a new checkpoint in its own volume.

The node's ranks and its replicator share the volume, and every writer commits a checkpoint
by renaming its directory, the manifest written last, into the volume's root
(``engine/commit.publish_step``, the DCP writer, a sharded part once its commit table is
in). So a look at the root every ``WATCH_S`` — one ``stat``, and a listing only when the
root changed — tells a new commit without the bus: what a wake-up costs is the node's own,
whatever the fleet's size. (It used to be a subscription to every rank's
``CheckpointPersisted`` of the job: N x P messages a checkpoint into every replicator.)
Copies received from peers wake the sync through the peer server's commit instead, and
whatever a look misses, the sync's own poll finds.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Callable
from pathlib import Path

from goodput.checkpoint.format import MANIFEST_NAME, parse_step_dir

#: how often the volume's root is looked at: a new checkpoint is indexed within about this
WATCH_S = 0.2
#: a root that changed less than this before a look is listed again at the next one: a
#: directory's mtime ticks coarsely (a kernel tick; a second or more on some filesystems),
#: so a second change within one tick would leave the same mtime behind
SETTLE_NS = 2_000_000_000

#: step directory name -> its manifest's (inode, mtime_ns): committed, or committed anew
Commits = dict[str, tuple[int, int]]

log = logging.getLogger(__name__)


def committed(root: Path) -> Commits:
    """The step directories in ``root`` whose manifest is present (hidden names, being
    written or deleted, are no step directory)."""
    try:
        names = os.listdir(root)
    except OSError:
        return {}
    found: Commits = {}
    for name in names:
        if parse_step_dir(name) is None:
            continue
        try:
            stat = (root / name / MANIFEST_NAME).stat()
        except OSError:
            continue
        found[name] = (stat.st_ino, stat.st_mtime_ns)
    return found


def arrived(before: Commits, after: Commits) -> list[str]:
    """The step directories committed since ``before`` (new, or replaced by a new save)."""
    return sorted(name for name, manifest in after.items() if before.get(name) != manifest)


def settled(mtime_ns: int, now_ns: int) -> bool:
    """Whether a root last changed at ``mtime_ns`` can be trusted to show its next change."""
    return now_ns - mtime_ns >= SETTLE_NS


class VolumeWatch:
    """The volume's commits as last seen, and the root's mark that says nothing changed."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self._mark: tuple[int, int] | None = None
        self._commits: Commits = {}

    def start(self) -> None:
        """What is there already is the sync's start-up pass's, not news."""
        self._commits = committed(self.root)

    def look(self, now_ns: int) -> list[str]:
        """The step directories committed since the last look (wall clock ``now_ns``)."""
        try:
            stat = os.stat(self.root)
        except OSError:  # not made yet: nothing to list
            self._mark = None
            return []
        mark = (stat.st_ino, stat.st_mtime_ns)
        if mark == self._mark:
            return []
        self._mark = mark if settled(stat.st_mtime_ns, now_ns) else None
        commits = committed(self.root)
        new = arrived(self._commits, commits)
        self._commits = commits
        return new


async def watch_volume(
    root: Path,
    wake: asyncio.Event,
    stopping: asyncio.Event,
    period_s: float = WATCH_S,
    clock: Callable[[], int] = time.time_ns,
) -> None:
    """Set ``wake`` whenever a checkpoint is committed in ``root``, until ``stopping``."""
    watch = VolumeWatch(root)
    await asyncio.to_thread(watch.start)
    while not stopping.is_set():
        new = await asyncio.to_thread(watch.look, clock())
        if new:
            log.debug("committed in the volume: %s", ", ".join(new))
            wake.set()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stopping.wait(), period_s)
