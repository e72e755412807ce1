"""`goodput bench ckpt --sharded` on a tiny state: real rank processes, every figure reported.

No timing is asserted (the machine is shared); what must hold is that every method saved
and restored the same state bit for bit (goodput's restored save overlapped with a training
step, FSDP2's all-gathers and the optimizer's update included), the replacement node really
pulled its part from the peer, the surviving node read its part from its shared memory in the
restore as the shim makes it and not in the volumes-only one, and the report carries every
figure with its range, ratio and aim.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from goodput.tools.bench.ckpt_sharded import FIGURES, summarize
from goodput.tools.cli.main import main
from tests.conftest import goodput_cli

pytestmark = pytest.mark.slow


def test_sharded_bench_runs_and_restores_bit_for_bit(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["bench", "ckpt", "--sharded", "--nodes", "2", "--procs-per-node", "2"]
    code = main([*args, "--size-gb", "0.002", "--saves", "2", "--dir", str(tmp_path), "--json"])
    assert code == 0
    assert list(tmp_path.iterdir()) == [], "the benchmark cleans up after itself"
    report = json.loads(capsys.readouterr().out)
    assert (report["nodes"], report["procs_per_node"], report["repeats"]) == (2, 2, 2)
    assert len(report["saves"]) == 2 and len(report["restores"]) == 2
    summary = report["summary"]
    assert summary["consistent"] == {"goodput": True, "goodput_volumes": True, "dcp": True}
    assert summary["replacement_pulled_bytes"] > 0  # the new node's part came from the peer
    for restore in report["restores"]:
        # node 0's two ranks read their part (about half the state) from its shared memory
        assert restore["goodput_memory_bytes"] >= report["state_bytes"] // 3
        assert restore["goodput_volumes_memory_bytes"] == 0
        assert restore["goodput_volumes_pulled_bytes"] == restore["goodput_pulled_bytes"]
    for figure in FIGURES:
        row = summary[figure]
        for method in ("goodput_s", "dcp_s"):
            spread = row[method]
            assert 0 < spread["min"] <= spread["median"] <= spread["max"]
        assert row["ratio"]["median"] > 0 and isinstance(row["met"], bool)


def test_summary_takes_ratios_per_repeat_and_judges_the_median() -> None:
    saves = [
        {"goodput_stall_s": 1.0, "dcp_stall_s": 4.0, "goodput_durable_s": 2.0},
        {"goodput_stall_s": 3.0, "dcp_stall_s": 4.0, "goodput_durable_s": 1.0},
        {"goodput_stall_s": 1.0, "dcp_stall_s": 1.0, "goodput_durable_s": 1.0},
    ]
    for save, dcp_durable in zip(saves, (1.0, 2.0, 4.0), strict=True):
        save.update(dcp_durable_s=dcp_durable, goodput_blocking_durable_s=dcp_durable)
        save["goodput_blocking_stall_s"] = save["dcp_stall_s"]
    restore: dict[str, float | bool] = {"dcp_consistent": True, "dcp_restore_s": 1.0}
    for kind, seconds in (("goodput", 2.0), ("goodput_volumes", 0.5)):
        restore.update({f"{kind}_consistent": True, f"{kind}_pulled_bytes": 7})
        restore.update({f"{kind}_pull_s": seconds / 2, f"{kind}_restore_s": seconds})
        restore[f"{kind}_memory_bytes"] = 5 if kind == "goodput" else 0
    summary = summarize({"saves": saves, "restores": [restore], "state_bytes": 1})
    assert summary["stall"]["ratio"] == {"median": 0.75, "min": 0.25, "max": 1.0}
    assert not summary["stall"]["met"]  # 0.75 > 1/2
    assert summary["stall_blocking"]["ratio"]["median"] == 1.0
    assert summary["durable"]["ratio"]["median"] == 0.5 and summary["durable"]["met"]
    assert summary["durable_blocking"]["ratio"]["median"] == 1.0
    assert summary["durable_blocking"]["met"]  # at most DCP's
    assert summary["restore"]["ratio"]["median"] == 2.0 and not summary["restore"]["met"]
    assert summary["restore_volumes"]["ratio"]["median"] == 0.5
    assert summary["restore_volumes"]["met"]
    assert summary["replacement_pulled_bytes"] == 7
    assert summary["replacement_pull_s"] == {"median": 0.625, "min": 0.25, "max": 1.0}
    assert summary["memory_bytes"]["median"] == 5


def test_one_node_is_refused_in_one_line(tmp_path: Path) -> None:
    result = goodput_cli(
        "bench", "ckpt", "--sharded", "--nodes", "1", "--dir", str(tmp_path), check=False
    )
    assert result.returncode == 1
    assert result.stderr.strip() == (
        "goodput bench ckpt --sharded: needs --nodes 2 or more (a node is replaced)"
    )
