"""A numerical rollback's bound, the discarded newer checkpoints, and the volume's record of
the step known clean (what retention keeps for the rollback)."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from goodput.checkpoint.format import CLEAN_RECORD_NAME, read_clean_record
from goodput.checkpoint.format.layout import step_dir, step_dirs
from goodput.shim.rollback import bounded, discard_after, mark_clean


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


def test_a_rollback_lowers_the_clean_record_to_what_it_kept(tmp_path: Path) -> None:
    """A spike in the window that ended at the agreed step 30: the rollback restores 20, and
    the new attempt's steps up to 30 are not known clean until the replicas agree again."""
    for step in (10, 20, 30):
        step_dir(tmp_path, step).mkdir()
    mark_clean(tmp_path, 30)
    discard_after(tmp_path, 20)
    assert read_clean_record(tmp_path) == 20
    mark_clean(tmp_path, 15)
    discard_after(tmp_path, 20)  # a claim at or before the restored step stands
    assert read_clean_record(tmp_path) == 15
    discard_after(tmp_path, None)  # back to step 0: nothing on the volume is clean
    assert read_clean_record(tmp_path) is None


def test_a_volume_that_refuses_the_record_is_logged_not_fatal(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    (tmp_path / CLEAN_RECORD_NAME).mkdir()  # the rename over it fails
    with caplog.at_level(logging.WARNING):
        mark_clean(tmp_path, 30)
    assert "could not record step 30 as known clean" in caplog.text
    assert sorted(p.name for p in tmp_path.iterdir()) == [CLEAN_RECORD_NAME]  # no temp left
