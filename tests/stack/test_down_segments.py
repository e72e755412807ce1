"""`goodput down` sweeps the shared-memory segments its stack's killed ranks left: a killed
rank's host buffer outlives it for its replacement, and once the stack is stopped no engine
saves on that volume again to sweep it (a demo and the suite left 68 MB in /dev/shm)."""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
from pathlib import Path

import pytest

from goodput.checkpoint.format.layout import node_volume
from goodput.checkpoint.format.shm_segments import SEGMENT_DIR, segment_prefix
from goodput.tools.stack.session import StackSession
from tests.processes import kill

#: holds an flock on the segment named in argv[1] (as a live rank does) until killed
HOLDER = (
    "import fcntl, os, sys, time; fd = os.open(sys.argv[1], os.O_RDONLY); "
    "fcntl.flock(fd, fcntl.LOCK_EX); print('held', flush=True); time.sleep(300)"
)


@pytest.fixture
def segments(tmp_path: Path):
    """Two segments of a stack's node-0 volume: a dead rank's and a live one's."""
    if not SEGMENT_DIR.is_dir():
        pytest.skip(f"no {SEGMENT_DIR} here")
    volume = node_volume(tmp_path / "state", "node-0", "job-a")
    volume.mkdir(parents=True)
    prefix = segment_prefix(volume)
    dead, live = SEGMENT_DIR / f"{prefix}1-0", SEGMENT_DIR / f"{prefix}2-0"
    for path in (dead, live):
        path.write_bytes(b"\0" * 4096)
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(live)], stdout=subprocess.PIPE, text=True
    )
    assert holder.stdout is not None and holder.stdout.readline() == "held\n"
    yield tmp_path / "state", dead, live
    kill(holder)
    for path in (dead, live):
        path.unlink(missing_ok=True)


def test_down_removes_the_segments_of_exited_ranks_and_keeps_a_live_one(segments) -> None:
    state_dir, dead, live = segments
    report = StackSession(state_dir).stop()
    assert report.segments == 1
    assert not dead.exists()
    assert live.exists(), "a segment whose owner holds its lock is never removed"
    fd = os.open(live, os.O_RDONLY)
    try:  # still held by its owner
        with pytest.raises(BlockingIOError):
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    finally:
        os.close(fd)
