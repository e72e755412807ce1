"""A numerical rollback's bound and the discarded newer checkpoints."""

from __future__ import annotations

from pathlib import Path

from goodput.checkpoint.format.layout import step_dir, step_dirs
from goodput.shim.rollback import bounded, discard_after


def test_the_bound_is_the_step_before_the_fault() -> None:
    assert bounded(30, None) == 30  # no rollback: the newest
    assert bounded(30, 25) == 24  # the restore looks at or before 24 (finds 20)
    assert bounded(10, 25) == 10
    assert bounded(None, 25) is None
    assert bounded(30, 0) is None  # the fault may have touched the very first step


def test_newer_checkpoints_are_discarded_older_kept(tmp_path: Path) -> None:
    for step in (10, 20, 30):
        step_dir(tmp_path, step).mkdir()
    assert sorted(discard_after(tmp_path, 20)) == [30]
    assert [s for s, _ in step_dirs(tmp_path)] == [20, 10]
    assert sorted(discard_after(tmp_path, None)) == [10, 20]
    assert step_dirs(tmp_path) == []
