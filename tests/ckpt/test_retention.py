"""Local retention has one rule (``goodput.checkpoint.index.retention``), and the engine asks it with
what the node's replicator (safe steps) and ranks (the step known clean) published in the
volume: real files, a real CheckpointEngine."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

from goodput.checkpoint.engine import CheckpointEngine, list_checkpoints
from goodput.checkpoint.format import (
    CLEAN_RECORD_NAME,
    RETENTION_RECORD_NAME,
    CleanRecordError,
    RetentionRecord,
    RetentionRecordError,
    read_clean_record,
    read_retention_record,
    remove_clean_record,
    write_clean_record,
    write_retention_record,
)
from goodput.checkpoint.index.index import IndexSnapshot
from goodput.checkpoint.index.records import NodeAddressRecord
from goodput.checkpoint.index.retention import (
    RetentionDecision,
    attainable,
    clean_step,
    decide_retention,
)

from .helpers import make_state


def steps_on(root: Path) -> list[int]:
    return sorted(info.step for info in list_checkpoints(root))


def deletable_steps(*args, **kwargs) -> list[int]:
    return decide_retention(*args, **kwargs).delete


def test_the_plain_rule_keeps_the_newest_and_deletes_older_ones_complete_or_not() -> None:
    assert deletable_steps([1, 2, 3, 4, 5], [5, 4, 2, 1], 2, None) == [1, 2, 3]
    assert deletable_steps([1, 2, 3], [1, 2, 3], 5, None) == []
    assert deletable_steps([1, 2, 3], [3, 2], 0, None) == [1]  # keep < 1: every complete one
    assert deletable_steps([1, 2], [], 1, None) == []  # nothing complete: nothing goes


def test_the_guarded_rule_deletes_only_behind_a_newer_safe_step() -> None:
    # nothing reached a peer yet: nothing goes, however many are kept
    assert deletable_steps([1, 2, 3, 4, 5], [5, 4, 3, 2, 1], 1, safe=set()) == []
    # step 2 is the newest safe one: it stays (and everything newer), older ones go
    assert deletable_steps([1, 2, 3, 4, 5], [5, 4, 3, 2, 1], 1, safe={1, 2}) == [1]
    # a safe step newer than the kept ones does not widen the deletion beyond keep
    assert deletable_steps([1, 2, 3, 4, 5], [5, 4, 3, 2, 1], 3, safe={5}) == [1, 2]
    # a step safe elsewhere but not complete here does not count
    assert deletable_steps([1, 2, 3], [3, 1], 1, safe={2}) == []
    # the newest complete step is never deleted
    for keep in range(4):
        for safe in (None, set(), {1}, {3}, {1, 2, 3}):
            assert 3 not in deletable_steps([1, 2, 3], [3, 2, 1], keep, safe)


def test_the_known_clean_step_is_kept_whatever_its_age_and_only_it() -> None:
    # the newest complete checkpoint at or before the last step known clean
    assert clean_step([50, 45, 40, 25, 20], 49) == 45
    assert clean_step([50, 45, 40, 25, 20], 25) == 25
    assert clean_step([50, 45], 40) is None  # nothing that old is complete: nothing to keep
    assert clean_step([50, 45], None) is None  # no claim: nothing to keep
    present = [20, 25, 30, 35, 40, 45, 50]
    plain = decide_retention(present, present, 3, None, protected=None)
    assert plain == RetentionDecision([20, 25, 30, 35], {})
    decision = decide_retention(present, present, 3, None, protected=25)
    assert decision.delete == [20, 30, 35]  # one step more stays, never another
    assert list(decision.kept) == [25] and "known clean" in decision.kept[25]
    # a step the rule keeps anyway, or one not on the tier, changes nothing
    assert decide_retention(present, present, 3, None, protected=45) == plain
    assert decide_retention(present, present, 3, None, protected=27) == plain
    # under the guard: kept behind the newest safe step, each with its reason
    guarded = decide_retention(present, present, 2, {25, 30, 35, 40}, protected=25)
    assert guarded.delete == [20, 30, 35]
    assert "known clean" in guarded.kept[25] and "step 40" in guarded.kept[40]
    waiting = decide_retention(present, present, 1, set(), protected=25)
    assert waiting.delete == [] and "every required tier" in waiting.kept[25]


def test_a_guard_no_copy_can_meet_is_not_applied() -> None:
    """One node has no peer: under require=peer its volume would keep every checkpoint."""

    def index(*nodes: str) -> IndexSnapshot:
        records = {n: NodeAddressRecord(node=n, host="h", port=1, ts=0) for n in nodes}
        return IndexSnapshot(records, [])  # ts 0: every node long dead, still in the job

    require = ("peer", "object_store")
    assert attainable(require, index("node-0"), has_store=False) == ()
    assert attainable(require, index("node-0"), has_store=True) == ("object_store",)
    # a peer that is down is what the guard waits out: it still counts
    assert attainable(require, index("node-0", "node-1"), has_store=False) == ("peer",)


def test_a_checkpoint_not_yet_on_a_peer_is_never_deleted_by_the_engine(tmp_path: Path) -> None:
    """The done-when of issue 26: under require=peer the engine's retention keeps every
    checkpoint newer than the newest one the replicator has seen on a peer."""
    write_retention_record(tmp_path, ["peer"], [1], keep=1)
    with CheckpointEngine(tmp_path, keep_last=1, writer_threads=1) as engine:
        for step in range(1, 6):
            assert engine.save(make_state(step), step).wait(60).committed
        engine.wait_until_idle()
        assert steps_on(tmp_path) == [1, 2, 3, 4, 5]

        # steps 2..4 reached a peer: the engine deletes behind step 4, the newest safe one
        write_retention_record(tmp_path, ["peer"], [1, 2, 3, 4], keep=1)
        assert engine.save(make_state(6), 6).wait(60).committed
        engine.wait_until_idle()
        assert steps_on(tmp_path) == [4, 5, 6]


def test_without_a_record_the_engine_keeps_the_newest_only(tmp_path: Path) -> None:
    with CheckpointEngine(tmp_path, keep_last=1, writer_threads=1) as engine:
        for step in (1, 2, 3):
            assert engine.save(make_state(step), step).wait(60).committed
        engine.wait_until_idle()
    assert steps_on(tmp_path) == [3]


def test_the_engine_keeps_as_many_as_the_record_says_whatever_its_own_count(
    tmp_path: Path,
) -> None:
    """The replicator's ``keep_local`` is the volume's one keep count: the engine, told 1 and
    then 3, keeps as many, and deletes no further than the replicator would."""
    with CheckpointEngine(tmp_path, keep_last=2, writer_threads=1) as engine:
        for keep, steps, kept in ((1, (1, 2, 3), [3]), (3, (4, 5, 6, 7), [5, 6, 7])):
            write_retention_record(tmp_path, [], range(1, 8), keep=keep)
            for step in steps:
                assert engine.save(make_state(step), step).wait(60).committed
                engine.wait_until_idle()
            assert steps_on(tmp_path) == kept


def test_a_record_that_does_not_decode_keeps_everything(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    (tmp_path / RETENTION_RECORD_NAME).write_bytes(b'{"version": 1, "safe_steps": "x"}')
    with CheckpointEngine(tmp_path, keep_last=1, writer_threads=1) as engine:
        for step in (1, 2):
            assert engine.save(make_state(step), step).wait(60).committed
        engine.wait_until_idle()
        caplog.clear()
        assert engine.save(make_state(3), 3).wait(60).committed
        engine.wait_until_idle()
    assert steps_on(tmp_path) == [1, 2, 3]
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1, warnings  # one line per retention pass
    assert "retention deletes nothing" in warnings[0] and "safe_steps" in warnings[0]


def test_the_record_round_trips_and_refuses_what_it_cannot_trust(tmp_path: Path) -> None:
    assert read_retention_record(tmp_path) is None
    assert write_retention_record(tmp_path, ["peer"], [3, 7, 5], keep=2)
    assert not write_retention_record(tmp_path, ["peer"], [5, 7, 3], keep=2)  # unchanged
    record = read_retention_record(tmp_path)
    assert record is not None
    assert (record.require, record.safe_steps, record.keep) == (("peer",), (7, 5, 3), 2)
    assert os.listdir(tmp_path) == [RETENTION_RECORD_NAME]  # no temp file left
    path = tmp_path / RETENTION_RECORD_NAME
    path.write_bytes(b'{"version": 1, "require": [], "safe_steps": [4]}')  # an earlier release's
    assert read_retention_record(tmp_path) == RetentionRecord(
        version=1, require=(), safe_steps=(4,), keep=None
    )
    path.write_bytes(b'{"version": 1, "require": [], "safe_steps": [], "keep": 0}')
    with pytest.raises(RetentionRecordError, match="keep"):  # forged: would delete the newest
        read_retention_record(tmp_path)
    path.write_bytes(b'{"version": 2, "require": [], "safe_steps": []}')
    with pytest.raises(RetentionRecordError, match="version 2, this build reads 1"):
        read_retention_record(tmp_path)
    path.unlink()
    os.mkfifo(path)  # never blocks: anything but a regular file is refused
    with pytest.raises(RetentionRecordError):
        read_retention_record(tmp_path)


def test_the_engine_keeps_the_clean_checkpoint_a_rollback_needs(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The ranks agreed at step 3 and saved on: the engine keeps step 3 beside its newest
    one, and lets it go once a newer step is known clean. A clean record that cannot be
    trusted protects nothing extra and blocks no deletion."""
    with CheckpointEngine(tmp_path, keep_last=1, writer_threads=1) as engine:
        for step in (1, 2):
            assert engine.save(make_state(step), step).wait(60).committed
        engine.wait_until_idle()
        write_clean_record(tmp_path, 3)
        for step in (3, 4, 5):
            assert engine.save(make_state(step), step).wait(60).committed
            engine.wait_until_idle()
        assert steps_on(tmp_path) == [3, 5]
        write_clean_record(tmp_path, 5)
        assert engine.save(make_state(6), 6).wait(60).committed
        engine.wait_until_idle()
        assert steps_on(tmp_path) == [5, 6]

        (tmp_path / CLEAN_RECORD_NAME).write_bytes(b'{"version": 1, "step": 5, "keep": [1]}')
        caplog.clear()
        assert engine.save(make_state(7), 7).wait(60).committed
        engine.wait_until_idle()
        assert steps_on(tmp_path) == [7]
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "protects no known-clean checkpoint" in warnings[0], warnings


def test_the_clean_record_round_trips_and_refuses_what_it_cannot_trust(tmp_path: Path) -> None:
    assert read_clean_record(tmp_path) is None
    write_clean_record(tmp_path, 40)
    write_clean_record(tmp_path, 50)  # replaced whole
    assert read_clean_record(tmp_path) == 50
    assert os.listdir(tmp_path) == [CLEAN_RECORD_NAME]  # no temp file left
    path = tmp_path / CLEAN_RECORD_NAME
    for forged, why in (
        (b'{"version": 2, "step": 5}', "version 2, this build reads 1"),
        (b'{"version": 1, "step": -5}', "Expected `int` >= 0"),
        (b'{"version": 1, "step": "5"}', "Expected `int`"),
        (b'{"version": 1}', "missing required field `step`"),
        (b'{"version": 1, "step": 5, "also": 1}', "unknown field `also`"),
        (b"\x00" * 5000, "larger than 4096 bytes"),
    ):
        path.write_bytes(forged)
        with pytest.raises(CleanRecordError, match=why):
            read_clean_record(tmp_path)
    path.unlink()
    os.mkfifo(path)  # never blocks: anything but a regular file is refused
    with pytest.raises(CleanRecordError):
        read_clean_record(tmp_path)
    remove_clean_record(tmp_path)
    remove_clean_record(tmp_path)  # gone already is fine
    assert read_clean_record(tmp_path) is None


def test_the_engine_still_imports_no_bus() -> None:
    """The ranks ask the retention rule in-process; it must not pull nats into them."""
    code = "import sys, goodput.checkpoint.engine; sys.exit([m for m in sys.modules if 'nats' in m] or None)"
    subprocess.run([sys.executable, "-c", code], check=True)
