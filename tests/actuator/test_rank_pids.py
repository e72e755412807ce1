"""``ranks-<job>.json``: one writer (the local backend) and one reader (`down`, chaos)."""

from __future__ import annotations

from pathlib import Path

import pytest

from goodput.owned_process import RecordUnreadable
from goodput.state_dir import StateDir
from goodput.supervisor.rank_pids import read_rank_pids, write_rank_pids


def test_what_is_written_is_read_back_and_no_record_is_no_pid(tmp_path: Path) -> None:
    path = StateDir(tmp_path).ranks_record("job-a")
    assert read_rank_pids(path) == {}
    write_rank_pids(path, {"node-0": [11, 12], "node-1": [13]})
    assert read_rank_pids(path) == {"node-0": [11, 12], "node-1": [13]}
    assert not path.with_suffix(".tmp").exists()


@pytest.mark.parametrize("content", [b'{"node-0": [1', b'{"node-0": ["x"]}', b"[1, 2]"])
def test_an_unreadable_record_is_one_line(tmp_path: Path, content: bytes) -> None:
    path = StateDir(tmp_path).ranks_record("job-a")
    path.write_bytes(content)
    with pytest.raises(RecordUnreadable) as unreadable:
        read_rank_pids(path)
    line = str(unreadable.value.code)
    assert line.startswith(f"the ranks file {path} is unreadable (") and "\n" not in line
