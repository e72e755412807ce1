"""What a node reports as held: only copies whose every file verifies, never blocking."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import xxhash

from goodput.ckptfmt import FileEntry, build_manifest, step_dir, write_manifest
from goodput_services.replicator.holdings import verify_copy


def _checkpoint(root: Path, files: dict[str, bytes]) -> Path:
    directory = step_dir(root, 3)
    directory.mkdir(parents=True)
    for name, data in files.items():
        (directory / name).write_bytes(data)
    entries = [
        FileEntry(name=n, size=len(d), xxh3_128=xxhash.xxh3_128_hexdigest(d))
        for n, d in files.items()
    ]
    write_manifest(directory, build_manifest(3, entries))
    return directory


def test_a_verified_copy_lists_its_files(tmp_path: Path) -> None:
    directory = _checkpoint(tmp_path, {"a.bin": b"abc", "empty.bin": b""})
    files, problem = verify_copy(directory)
    assert problem == "" and [(f.name, f.size) for f in files] == [("a.bin", 3), ("empty.bin", 0)]


@pytest.mark.timeout(60)
def test_an_empty_file_replaced_by_a_fifo_is_a_problem_not_a_hang(tmp_path: Path) -> None:
    directory = _checkpoint(tmp_path, {"a.bin": b"abc", "empty.bin": b""})
    (directory / "empty.bin").unlink()
    os.mkfifo(directory / "empty.bin")
    files, problem = verify_copy(directory)
    assert files == [] and "empty.bin: not a regular file" in problem


def test_a_manifest_of_another_step_is_a_problem(tmp_path: Path) -> None:
    directory = _checkpoint(tmp_path, {"a.bin": b"abc"})
    os.rename(directory, step_dir(tmp_path, 4))
    files, problem = verify_copy(step_dir(tmp_path, 4))
    assert files == [] and "manifest says step 3" in problem
