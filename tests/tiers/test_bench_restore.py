"""`goodput bench restore` end to end at a tiny size (real peer process, real fake-gcs-server)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from goodput.tools.bench import restore


@pytest.mark.slow
def test_bench_restore_reports_every_tier_and_dedup(tmp_path: Path, capsys) -> None:
    parser = argparse.ArgumentParser()
    restore.register(parser.add_subparsers())
    args = parser.parse_args(
        ["restore", "--json", "--size-gb", "0.008", "--files", "2", "--dir", str(tmp_path)]
    )
    assert args.func(args) == 0
    result = json.loads(capsys.readouterr().out)
    for field in ("local_s", "peer_s", "object_store_s", "replication_gbps", "loopback_gbps"):
        assert result[field] > 0
    for field in (
        "replication_cold_source_gbps",
        "loopback_to_disk_gbps",
        "loopback_to_disk_buffered_gbps",
    ):
        assert result[field] > 0
    assert result["streams"] >= 1
    assert result["size_gb"] == pytest.approx(0.008)
    assert result["dedup_bytes_ratio"] == {"peer_replication": 1.0, "object_store_backup": 1.0}
    assert result["peer_bytes_3_replicas"] == result["replica_bytes"]
    # the pipeline, before and after event-driven replication that hashes once
    assert result["persisted_to_peer_s"] > 0 and result["hash_cpu_s_per_gb"] >= 0
    before, after = (result["replication_pipeline"][m] for m in ("before", "after"))
    assert (before["owner_check"], before["peer_check"]) == ("hashed", "hashed")
    assert (after["owner_check"], after["peer_check"]) == ("sealed", "received")
    assert (before["hashes_per_byte"], after["hashes_per_byte"]) == (4.0, 2.0)
    assert after["hashed_bytes"]["owner_replicator"] == 0
    assert list(tmp_path.iterdir()) == []  # the work directory is cleaned up
