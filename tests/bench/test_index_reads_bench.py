"""`goodput bench index-reads` at a small size: both readers measured in every repeat under
the same writers, the follower reading the index completely once and then only changes."""

from __future__ import annotations

import json

import pytest

from goodput.bus.store_sizing import INDEX_COPIES_PER_NODE
from goodput.tools.cli.main import main


def test_complete_reads_and_the_follower_are_measured_in_one_run(
    capsys: pytest.CaptureFixture[str],
) -> None:
    args = ["bench", "index-reads", "--nodes", "24,48", "--seconds", "2", "--repeats", "2"]
    assert main([*args, "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert [size["nodes"] for size in report["sweep"]] == [24, 48]
    for size in report["sweep"]:
        assert size["records"] == size["nodes"] * (1 + INDEX_COPIES_PER_NODE)  # address, copies
        assert size["follower_complete_reads"] == [1, 1]
        assert len(size["before_bytes_per_s"]) == len(size["after_bytes_per_s"]) == 2
        # a complete read a poll: a read's bytes every poll and read
        assert min(size["before_bytes_per_s"]) > size["complete_read_bytes"] / 5
        assert all(ratio > 1 for ratio in size["before_vs_after"])
