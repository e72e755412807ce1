"""`goodput bench ckpt` end to end on a tiny state: it runs and reports every figure."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from goodput.cli.main import main

FIELDS = {"stall_s", "durable_s", "write_gbps", "restore_s", "restore_gbps", "peak_extra_mem_ratio"}


@pytest.mark.slow
def test_bench_ckpt_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(
        ["bench", "ckpt", "--size-gb", "0.02", "--saves", "2", "--dir", str(tmp_path), "--json"]
    )
    assert code == 0
    report = json.loads(capsys.readouterr().out)
    assert set(report["methods"]) == {"torch_save", "dcp_save", "dcp_async_save", "goodput"}
    for figures in report["methods"].values():
        assert set(figures) >= FIELDS
        assert all(figures[name] >= 0 for name in FIELDS)
    assert report["raw_write_gbps"] > 0 and report["raw_read_gbps"] > 0
    assert report["cache_drop"] in {"drop_caches", "fadvise_dontneed"}
    assert list(tmp_path.iterdir()) == [], "the benchmark cleans up after itself"
