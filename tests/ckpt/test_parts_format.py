"""The part format of a checkpoint sharded across nodes: what a part's manifest must agree on."""

from __future__ import annotations

import pytest

from goodput.checkpoint.format import FORMAT, KIND_SHARDED, FileEntry, Manifest, ManifestError
from goodput.checkpoint.format.manifest import encode_manifest, parse_manifest
from goodput.checkpoint.format.parts import (
    PartOf,
    check_part,
    parse_staged_part,
    staged_part_dir,
    staged_parts,
    summarize,
)


def _files(rank: int) -> list[FileEntry]:
    return [
        FileEntry(name=f"data-r{rank:05d}-000.bin", size=8, xxh3_128="a" * 32, dp_rank=rank),
        FileEntry(name=f"shards-r{rank:05d}.json", size=4, xxh3_128="b" * 32, dp_rank=rank),
    ]


def _table() -> list:
    return [
        summarize(0, [0, 1], _files(0) + _files(1)),
        summarize(1, [2, 3], _files(2) + _files(3)),
    ]


def test_a_part_round_trips_and_names_its_commit() -> None:
    part = PartOf(part=1, table=_table())
    manifest = Manifest(
        format=FORMAT, step=7, kind=KIND_SHARDED, files=_files(2) + _files(3), dp_world=4, part=part
    )
    parsed = parse_manifest(encode_manifest(manifest, None), key=None)
    assert parsed.part == part
    assert parsed.part.commit == PartOf(part=0, table=_table()).commit  # same in every part


def test_a_part_whose_files_differ_from_its_table_is_refused() -> None:
    files = _files(2) + _files(3)
    files[0] = FileEntry(name=files[0].name, size=9, xxh3_128="a" * 32, dp_rank=2)
    with pytest.raises(ManifestError, match="do not match the commit table"):
        check_part(PartOf(part=1, table=_table()), files, 4)


def test_a_table_must_cover_every_rank_once() -> None:
    table = _table()
    with pytest.raises(ManifestError, match="cover the 5 ranks"):
        check_part(PartOf(part=1, table=table), _files(2) + _files(3), 5)
    twice = [table[0], summarize(1, [1, 2, 3], _files(2) + _files(3))]
    with pytest.raises(ManifestError, match="exactly once"):
        check_part(PartOf(part=1, table=twice), _files(2) + _files(3), 4)


def test_a_part_holding_another_parts_rank_is_refused() -> None:
    files = _files(2) + _files(3) + _files(0)[:1]
    table = [summarize(0, [0, 1], _files(0) + _files(1)), summarize(1, [2, 3], files)]
    with pytest.raises(ManifestError, match=r"ranks \[0\] of other parts"):
        check_part(PartOf(part=1, table=table), files, 4)


def test_only_sharded_checkpoints_have_parts() -> None:
    manifest = Manifest(
        format=FORMAT, step=7, kind="engine", files=[], part=PartOf(part=0, table=_table())
    )
    with pytest.raises(ManifestError, match="only sharded"):
        parse_manifest(encode_manifest(manifest, None), key=None)


def test_staged_parts_are_named_apart_from_steps(tmp_path) -> None:
    staged = staged_part_dir(tmp_path, 12, 3)
    staged.mkdir()
    (tmp_path / "step-0000000012").mkdir()
    assert parse_staged_part(staged.name) == (12, 3)
    assert parse_staged_part("step-0000000012") is None
    assert staged_parts(tmp_path, 12) == {3: staged}
    assert staged_parts(tmp_path, 11) == {}
