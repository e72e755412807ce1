"""`goodput ckpt verify` on an object-store copy whose listing the store lacks (an index read
while a backup is still being written, a store other than the one the copy went to): a
problem of that copy, not a traceback that ends the whole verification."""

from __future__ import annotations

from pathlib import Path

from goodput.checkpoint.index.records import CopyRecord, FileRef
from goodput.checkpoint.tiers.object_store import DirectoryObjectStore
from goodput.tools.cli.ckpt import _verify_in_store


def test_a_missing_listing_is_a_problem_of_that_copy(tmp_path: Path) -> None:
    store = DirectoryObjectStore(tmp_path / "store")
    copy = CopyRecord(
        step=10,
        tier="object_store",
        holder="store",
        owner="node-a",
        root="job/node-a",
        files=[FileRef("data-0.bin", 4, "0" * 32)],
    )
    problems = _verify_in_store(store, copy, deep=False)
    assert problems[0].startswith("manifest: no listing ") and "in the store" in problems[0]
    assert problems[1].startswith("data-0.bin: blob ") and "missing" in problems[1]
