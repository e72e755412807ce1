"""Bad disks and bad bytes: every case is a clear error or a fallback, never a bad restore."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import xxhash

from goodput.checkpoint.engine import (
    CheckpointEngine,
    ManifestError,
    NoCheckpointError,
    list_checkpoints,
    read_manifest,
    verify_files,
)
from goodput.checkpoint.engine.events import (
    CheckpointFailed,
    CheckpointRestored,
    CheckpointRestoreFailed,
)
from goodput.checkpoint.format import FileEntry, build_manifest, step_dir, write_manifest
from tests.conftest import tmpfs_mount

from .helpers import assert_bit_exact, make_state


def _two_checkpoints(root: Path, events: list[object] | None = None) -> CheckpointEngine:
    engine = CheckpointEngine(
        root, min_file_bytes=4096, listener=None if events is None else events.append
    )
    engine.save(make_state(1, scale=4), 1).wait()
    engine.save(make_state(2, scale=4), 2).wait()
    return engine


def _newest(root: Path) -> Path:
    return root / "step-0000000002"


def _assert_fell_back_to_step_1(engine: CheckpointEngine) -> None:
    step, restored = engine.restore()
    assert step == 1
    assert_bit_exact(make_state(1, scale=4), restored)


def test_flipped_byte_in_a_shard_falls_back(tmp_path: Path) -> None:
    events: list[object] = []
    engine = _two_checkpoints(tmp_path, events)
    shard = _newest(tmp_path) / read_manifest(_newest(tmp_path)).files[-1].name
    with open(shard, "r+b") as handle:
        handle.seek(100)
        byte = handle.read(1)
        handle.seek(100)
        handle.write(bytes([byte[0] ^ 0x01]))
    problems = verify_files(_newest(tmp_path))
    assert [p.reason for p in problems] == ["xxh3_128 mismatch"]
    _assert_fell_back_to_step_1(engine)
    restored = next(e for e in events if isinstance(e, CheckpointRestored))
    assert [f.step for f in restored.fallbacks] == [2]
    assert "xxh3_128 mismatch" in restored.fallbacks[0].reason
    engine.close()


def test_deleted_shard_falls_back(tmp_path: Path) -> None:
    engine = _two_checkpoints(tmp_path)
    name = read_manifest(_newest(tmp_path)).files[0].name
    (_newest(tmp_path) / name).unlink()
    assert [p.reason for p in verify_files(_newest(tmp_path))] == ["missing"]
    assert not list_checkpoints(tmp_path)[0].complete
    assert engine.latest_complete_step() == 1
    _assert_fell_back_to_step_1(engine)
    engine.close()


def test_truncated_shard_falls_back(tmp_path: Path) -> None:
    engine = _two_checkpoints(tmp_path)
    shard = _newest(tmp_path) / read_manifest(_newest(tmp_path)).files[0].name
    os.truncate(shard, shard.stat().st_size - 10)
    _assert_fell_back_to_step_1(engine)
    engine.close()


def test_truncated_manifest_falls_back(tmp_path: Path) -> None:
    engine = _two_checkpoints(tmp_path)
    manifest = _newest(tmp_path) / "manifest.json"
    os.truncate(manifest, manifest.stat().st_size // 2)
    with pytest.raises(ManifestError, match="invalid or truncated"):
        read_manifest(_newest(tmp_path))
    _assert_fell_back_to_step_1(engine)
    engine.close()


def test_edited_manifest_fails_its_own_checksum(tmp_path: Path) -> None:
    engine = _two_checkpoints(tmp_path)
    manifest = _newest(tmp_path) / "manifest.json"
    manifest.write_text(manifest.read_text().replace('"step": 2', '"step": 3', 1))
    with pytest.raises(ManifestError, match="checksum mismatch"):
        read_manifest(manifest)
    _assert_fell_back_to_step_1(engine)
    engine.close()


@pytest.mark.timeout(60)
def test_shard_replaced_by_a_fifo_falls_back_without_hanging(tmp_path: Path) -> None:
    """Opening a named pipe blocks until a writer comes: restore must treat it as damage."""
    engine = _two_checkpoints(tmp_path)
    shard = _newest(tmp_path) / read_manifest(_newest(tmp_path)).files[-1].name
    shard.unlink()
    os.mkfifo(shard)
    assert [p.reason for p in verify_files(_newest(tmp_path))] == ["not a regular file"]
    assert not list_checkpoints(tmp_path)[0].complete
    _assert_fell_back_to_step_1(engine)
    engine.close()


@pytest.mark.timeout(60)
def test_manifest_replaced_by_a_fifo_falls_back_without_hanging(tmp_path: Path) -> None:
    engine = _two_checkpoints(tmp_path)
    manifest = _newest(tmp_path) / "manifest.json"
    manifest.unlink()
    os.mkfifo(manifest)
    with pytest.raises(ManifestError, match="not a regular file"):
        read_manifest(_newest(tmp_path))
    _assert_fell_back_to_step_1(engine)
    engine.close()


@pytest.mark.timeout(60)
def test_verify_reports_an_empty_file_replaced_by_a_fifo(tmp_path: Path) -> None:
    """Same size as an empty file, so only the file type tells: verify must not block on it."""
    directory = step_dir(tmp_path, 5)
    directory.mkdir()
    (directory / "data.bin").write_bytes(b"abc")
    os.mkfifo(directory / "empty.bin")
    entries = [
        FileEntry(name="data.bin", size=3, xxh3_128=xxhash.xxh3_128_hexdigest(b"abc")),
        FileEntry(name="empty.bin", size=0, xxh3_128=xxhash.xxh3_128_hexdigest(b"")),
    ]
    write_manifest(directory, build_manifest(5, entries))
    assert [str(p) for p in verify_files(directory)] == ["empty.bin: not a regular file"]


def test_nothing_intact_is_a_clear_error(tmp_path: Path) -> None:
    events: list[object] = []
    engine = CheckpointEngine(tmp_path, listener=events.append)
    engine.save(make_state(1), 1).wait()
    (tmp_path / "step-0000000001" / "manifest.json").write_text("{")
    with pytest.raises(NoCheckpointError, match=r"step 1: .*invalid or truncated"):
        engine.restore()
    assert any(isinstance(e, CheckpointRestoreFailed) for e in events)
    engine.close()
    with pytest.raises(NoCheckpointError, match="no intact checkpoint"):
        CheckpointEngine(tmp_path / "empty").restore()


def test_directory_without_manifest_is_not_a_checkpoint(tmp_path: Path) -> None:
    engine = _two_checkpoints(tmp_path)
    (tmp_path / "step-0000000003").mkdir()
    (tmp_path / ".tmp-step-0000000004").mkdir()
    assert engine.latest_complete_step() == 2
    step, _ = engine.restore()
    assert step == 2
    engine.close()


@pytest.fixture
def small_tmpfs(tmp_path: Path) -> Iterator[Path]:
    """A real 4 MiB filesystem (tmpfs); skipped only where mounting is not permitted."""
    with tmpfs_mount(tmp_path / "mnt", "4m") as mountpoint:
        yield mountpoint


def test_full_disk_fails_the_save_and_keeps_the_previous_checkpoint(small_tmpfs: Path) -> None:
    events: list[object] = []
    small = {"w": make_state(1)["model"]["layer0.weight"]}
    big = {"w": make_state(2, scale=200)["model"]["layer0.weight"]}  # ~1.6 MB
    big["more"] = [big["w"] * k for k in range(3)]  # ~6.5 MB in all: more than the disk
    with CheckpointEngine(small_tmpfs, listener=events.append) as engine:
        assert engine.save(small, 1).wait().ok
        result = engine.save(big, 2).wait()
        assert result.status == "failed" and "No space left" in (result.error or "")
        assert any(isinstance(e, CheckpointFailed) and e.step == 2 for e in events)
        assert sorted(os.listdir(small_tmpfs)) == ["step-0000000001"], "temp dir cleaned up"
        step, restored = engine.restore()
        assert step == 1
        assert_bit_exact(small, restored)
        assert engine.save(small, 3).wait().ok, "saving works again once there is room"


def test_read_only_directory_fails_saves_but_restores(small_tmpfs: Path) -> None:
    events: list[object] = []
    state = make_state(1)
    with CheckpointEngine(small_tmpfs, listener=events.append) as engine:
        assert engine.save(state, 1).wait().ok
    subprocess.run(["mount", "-o", "remount,ro", str(small_tmpfs)], check=True)
    with CheckpointEngine(small_tmpfs, listener=events.append) as engine:
        result = engine.save(state, 2).wait()
        assert result.status == "failed" and "Read-only file system" in (result.error or "")
        step, restored = engine.restore()
    assert step == 1
    assert_bit_exact(state, restored)
    assert any(isinstance(e, CheckpointFailed) for e in events)
