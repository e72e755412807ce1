"""The pure resharding plan: which saved shards, which bytes, which files."""

from __future__ import annotations

import pytest

from goodput.checkpoint.engine.reshard import (
    Box,
    PieceRead,
    ReshardError,
    Segment,
    file_segments,
    intersect,
    plan_reads,
)


def rows(start: int, count: int, cols: int) -> Box:
    return Box((start, 0), (count, cols))


def test_intersect_of_boxes() -> None:
    assert intersect(rows(0, 4, 3), rows(2, 4, 3)) == rows(2, 2, 3)
    assert intersect(rows(0, 2, 3), rows(2, 2, 3)) is None
    assert intersect(Box((0, 1), (4, 2)), Box((1, 0), (2, 2))) == Box((1, 1), (2, 1))
    assert intersect(Box((), ()), Box((), ())) == Box((), ())  # a 0-d tensor's one element
    with pytest.raises(ReshardError):
        intersect(Box((0,), (2,)), rows(0, 2, 2))


def test_two_saved_row_shards_to_three_reads_only_the_rows_needed() -> None:
    # 7 rows of 10 float32 (40 bytes a row) saved on 2 ranks (4 + 3 rows), restored on 3
    # ranks (3 + 3 + 1); with 40-byte blocks each read is exactly the rows needed
    saved = [rows(0, 4, 10), rows(4, 3, 10)]
    middle = plan_reads(rows(3, 3, 10), saved, itemsize=4, block_bytes=40)
    assert middle == [
        PieceRead(0, rows(3, 1, 10), 120, 160, 3),
        PieceRead(1, rows(4, 2, 10), 0, 80, 0),
    ]
    assert middle[0].element_offset(saved[0], 4) == 0
    last = plan_reads(rows(6, 1, 10), saved, itemsize=4, block_bytes=40)
    assert last == [PieceRead(1, rows(6, 1, 10), 80, 120, 2)]


def test_reads_widen_to_digest_blocks_and_stop_at_the_shard_end() -> None:
    saved = [rows(0, 4, 10), rows(4, 3, 10)]
    # blocks of 64 bytes: row 3 of shard 0 is bytes 120..160, blocks 1..2 (64..160)
    [first, second] = plan_reads(rows(3, 2, 10), saved, itemsize=4, block_bytes=64)
    assert (first.byte_lo, first.byte_hi, first.first_block) == (64, 160, 1)
    assert first.element_offset(saved[0], 4) == (120 - 64) // 4
    assert (second.byte_lo, second.byte_hi) == (0, 64)


def test_column_shards_read_the_span_between_first_and_last_element() -> None:
    # saved as Shard(1): columns 0..5 and 5..10 of 4 rows; the target wants column 4..6
    saved = [Box((0, 0), (4, 5)), Box((0, 5), (4, 5))]
    reads = plan_reads(Box((0, 4), (4, 2)), saved, itemsize=1, block_bytes=1)
    assert [(r.piece, r.overlap, r.byte_lo, r.byte_hi) for r in reads] == [
        (0, Box((0, 4), (4, 1)), 4, 20),  # element (0,4) .. (3,4) of a 4x5 shard
        (1, Box((0, 5), (4, 1)), 0, 16),
    ]
    assert reads[1].element_offset(saved[1], 1) == 0


def test_the_whole_tensor_from_every_shard_and_a_scalar() -> None:
    saved = [rows(0, 4, 10), rows(4, 3, 10)]
    reads = plan_reads(rows(0, 7, 10), saved, itemsize=2, block_bytes=1 << 20)
    assert [(r.piece, r.byte_lo, r.byte_hi) for r in reads] == [(0, 0, 80), (1, 0, 60)]
    [scalar] = plan_reads(Box((), ()), [Box((), ())], itemsize=8, block_bytes=4096)
    assert (scalar.byte_lo, scalar.byte_hi) == (0, 8)


def test_missing_or_doubled_shards_are_refused() -> None:
    with pytest.raises(ReshardError, match="cover 40 of the 70"):
        plan_reads(rows(0, 7, 10), [rows(0, 4, 10)], itemsize=4, block_bytes=40)
    with pytest.raises(ReshardError, match="both hold"):
        plan_reads(rows(0, 7, 10), [rows(0, 4, 10), rows(3, 4, 10)], itemsize=4, block_bytes=40)
    with pytest.raises(ReshardError, match="multiple"):
        plan_reads(rows(0, 1, 1), [rows(0, 1, 1)], itemsize=8, block_bytes=12)


def test_replicas_of_one_shard_are_read_once() -> None:
    # HSDP: two replicas each saved rows 0..4 and 4..7; the first copy of each is read
    saved = [rows(0, 4, 10), rows(4, 3, 10), rows(0, 4, 10), rows(4, 3, 10)]
    reads = plan_reads(rows(2, 4, 10), saved, itemsize=4, block_bytes=40)
    assert [(r.piece, r.overlap) for r in reads] == [(0, rows(2, 2, 10)), (1, rows(4, 2, 10))]


def test_a_large_overlap_is_read_in_bounded_pieces() -> None:
    # 7 rows of 10 float32 (40 bytes a row), at most 100 bytes a read: 2 rows each
    reads = plan_reads(
        rows(0, 7, 10), [rows(0, 7, 10)], itemsize=4, block_bytes=40, max_read_bytes=100
    )
    assert [(r.overlap, r.byte_lo, r.byte_hi) for r in reads] == [
        (rows(0, 2, 10), 0, 80),
        (rows(2, 2, 10), 80, 160),
        (rows(4, 2, 10), 160, 240),
        (rows(6, 1, 10), 240, 280),
    ]
    # a 1-d shard is cut by elements; a read may share an edge block with its neighbour
    [a, b] = plan_reads(
        Box((0,), (50,)), [Box((0,), (50,))], itemsize=4, block_bytes=64, max_read_bytes=100
    )
    assert (a.overlap, a.byte_lo, a.byte_hi) == (Box((0,), (25,)), 0, 128)
    assert (b.overlap, b.byte_lo, b.byte_hi, b.element_offset(Box((0,), (50,)), 4)) == (
        Box((25,), (25,)),
        64,
        200,
        9,
    )


def test_an_empty_target_needs_nothing() -> None:
    assert plan_reads(rows(7, 0, 10), [rows(0, 7, 10)], itemsize=4, block_bytes=40) == []


def test_file_segments_cross_file_boundaries() -> None:
    files = [("b.bin", 4096, 4096), ("a.bin", 0, 4096), ("c.bin", 8192, 100)]
    assert file_segments(4000, 8200, files) == [
        Segment("a.bin", 4000, 96, 0),
        Segment("b.bin", 0, 4096, 96),
        Segment("c.bin", 0, 8, 4192),
    ]
    assert file_segments(10, 20, files) == [Segment("a.bin", 10, 10, 0)]
    with pytest.raises(ReshardError, match="no data file"):
        file_segments(8000, 8400, files)
    with pytest.raises(ReshardError, match="no data file"):
        file_segments(10, 20, [("b.bin", 4096, 4096)])
