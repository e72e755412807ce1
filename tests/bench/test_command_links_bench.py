"""`goodput bench command-links` at its smallest: links through a real nats-server, both ways
of receiving trainer commands, every figure present; a consumer per link before, none now.

Run as the command it is (a process of its own): its spawned workers' multiprocessing
resource tracker then ends with it."""

from __future__ import annotations

import json

from tests.conftest import goodput_cli


def test_both_modes_reach_every_link_and_only_the_old_one_makes_consumers() -> None:
    result = goodput_cli("bench", "command-links", "--links", "12", "--processes", "2", "--json")
    rows = {row["mode"]: row for row in json.loads(result.stdout)}
    assert set(rows) == {"consumer", "core"}
    for row in rows.values():
        assert row["links"] == 12
        assert 0 <= row["connected_s"] <= row["ready_s"]  # seconds, to the hundredth
        assert row["server_cpu_s"] >= 0 and row["server_mem_mib"] > 0
    assert rows["consumer"]["consumers"] == 12
    assert rows["core"]["consumers"] == 0
