"""What a node reports as held: only copies whose every file verifies, never blocking."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
import xxhash

from goodput.checkpoint.format import (
    FileEntry,
    build_manifest,
    hash_totals,
    local_root,
    peer_root,
    read_manifest,
    step_dir,
    write_manifest,
)
from goodput_services.replicator.holdings import DiskHoldings, verify_copy


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


def test_the_cheap_check_catches_a_torn_file_but_not_rot(tmp_path: Path) -> None:
    directory = _checkpoint(tmp_path, {"a.bin": b"abcdef"})
    (directory / "a.bin").write_bytes(b"abcdeX")  # same size: only hashing tells
    assert verify_copy(directory, read_data=False)[1] == ""
    assert "xxh3_128 mismatch" in verify_copy(directory)[1]
    (directory / "a.bin").write_bytes(b"abc")
    assert "size 3 != 6" in verify_copy(directory, read_data=False)[1]


def test_how_the_scan_checks_each_copy(tmp_path: Path) -> None:
    """Start-up pass: hashed; then own copies: sealed; a copy the peer server verified on
    receive: received; any other peer copy: hashed; and the scrub hashes again."""
    node_dir, job = tmp_path / "node-a", "job"
    received: dict[Path, str] = {}
    holdings = DiskHoldings(node_dir, job, "node-a", 3600.0, received=received)
    _checkpoint(node_dir / local_root(job), {"a.bin": b"one"})
    assert [how for _, how in holdings.scan().checked] == ["hashed"]

    own = step_dir(node_dir / local_root(job), 3)
    shutil.rmtree(own)
    _checkpoint(node_dir / local_root(job), {"a.bin": b"two"})
    trusted = _checkpoint(node_dir / peer_root(job, "node-b"), {"b.bin": b"three"})
    received[trusted] = read_manifest(trusted).manifest_xxh3_128
    _checkpoint(node_dir / peer_root(job, "node-c"), {"c.bin": b"four"})
    checks = {(r.tier, r.owner): how for r, how in holdings.scan().checked}
    assert checks == {
        ("local", "node-a"): "sealed",
        ("peer", "node-b"): "received",
        ("peer", "node-c"): "hashed",
    }
    assert received == {}  # used up

    holdings.scrub_interval_s = 0.0
    before = hash_totals().bytes
    assert holdings.scan().checked == []  # a scrub re-hashes; nothing new to report
    assert hash_totals().bytes - before == len(b"two") + len(b"three") + len(b"four")
