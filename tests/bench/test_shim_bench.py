"""`goodput bench shim` on the CPU: two real gloo ranks, every mode measured in one run.

The figures themselves are the machine's (docs/BENCHMARKS.md); what is pinned is the run's
shape: every mode timed in every repeat against the plain loop of the same repeat, and the
shim's stop vote pipelined — a ballot launched at every step of every block (the warm-up
block and each repeat), none by the blocking vote's mode, which votes the old way."""

from __future__ import annotations

import json

import pytest

from goodput.tools.bench.shim_loop import MODES
from goodput.tools.cli.main import main


def test_every_mode_is_measured_against_the_plain_loop_of_the_same_run(
    capsys: pytest.CaptureFixture[str],
) -> None:
    args = ["bench", "shim", "--steps", "4", "--repeats", "2", "--width", "32", "--depth", "1"]
    assert main([*args, "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["ranks"] == 2 and report["device"] == "cpu"
    assert set(report["modes"]) == set(MODES)
    assert report["modes"]["plain"]["overhead_ms"] == {"min": 0.0, "median": 0.0, "max": 0.0}
    for name in MODES:
        assert report["modes"][name]["step_ms"]["min"] > 0
    blocks = 1 + 2  # the warm-up and the repeats
    for name in ("shim", "shim_save", "shim_save_blocking", "shim_numerics"):
        assert report["votes"][name]["launched"] == blocks * 4
        assert 0 <= report["votes"][name]["waited"] <= blocks * 4
    assert report["votes"]["vote_blocking"]["launched"] == 0
    # the numerics monitor compared the replicas once a block, and they agreed
    assert report["fingerprints_agreed"] == blocks
