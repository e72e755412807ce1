"""`goodput bench control-plane` at its smallest: simulated ranks and replicators through a
real nats-server into the real sensor, controller and one replicator; every figure of its
JSON present and sane (none timed)."""

from __future__ import annotations

import json

import pytest

from goodput import subjects
from goodput.bus.store_sizing import INDEX_COPIES_PER_NODE, StoreScale, store_limits
from goodput.tools.bench.control_plane_fleet import shares
from goodput.tools.cli.main import main

FIGURES = {
    "nodes",
    "procs_per_node",
    "ranks",
    "p50_detect_s",
    "p99_detect_s",
    "missed",
    "false_positives",
    "kept_up",
    "window_s",
    "services",
    "nats_server_cpu_pct",
    "events_pending_at_start",
    "events_pending_at_end",
    "bus_in_msgs_per_s",
    "bus_out_msgs_per_s",
    "bus_in_bytes_per_s",
    "bus_out_bytes_per_s",
    "events_stored_per_s",
    "events_growth_bytes_per_day",
    "events_limit_bytes",
    "events_limit_holds_h",
    "events_formula_bytes_per_day",
    "publishers",
    "replicator",
}
REPLICATOR_FIGURES = {
    "node",
    "connection",
    "ready_s",
    "received_before_window_bytes",
    "index_copy_writes_per_s",
    "index_announcements_per_s",
    *(
        f"{kind}_{unit}_per_s"
        for kind in ("received", "persisted_events")
        for unit in ("bytes", "msgs")
    ),
}
PUBLISHER_FIGURES = {
    "heartbeats_per_s",
    "heartbeats_due_per_s",
    "heartbeats_kept_pct",
    "events_acked_per_s",
    "events_due_per_s",
    "events_kept_pct",
    "steps_acked",
    "host_reports_acked",
    "ckpt_events_acked",
    "events_failed",
    "cpu_pct",
    *(f"{role}_lag_{q}_s" for role in ("heartbeats", "events") for q in ("p50", "p99", "max")),
}


def test_a_small_fleet_is_measured_through_the_real_services(
    capsys: pytest.CaptureFixture[str],
) -> None:
    args = ["bench", "control-plane", "--nodes", "6", "--procs-per-node", "2", "--rounds", "3"]
    args += ["--step-s", "1", "--ckpt-every", "2", "--publishers", "2", "--json"]
    assert main(args) == 0
    report = json.loads(capsys.readouterr().out)
    [size] = report["sweep"]
    assert size.keys() >= FIGURES and size["publishers"].keys() == PUBLISHER_FIGURES
    assert size["ranks"] == 12 and size["missed"] == 0
    assert size["p50_detect_s"] is not None and size["p99_detect_s"] >= size["p50_detect_s"]
    for service in ("sensor", "controller", "replicator"):
        assert size["services"][service]["cpu_pct"] > 0
        assert size["services"][service]["rss_mb"] > 10  # an interpreter with the library
    assert len(size["events_pending_at_end"]) == 2  # the sensor's and controller's consumers
    publishers = size["publishers"]
    # the simulated ranks published what they were due to, and the bus stored it all (a
    # rank's beats in a window are counted to one beat: heartbeat_s / window, 5 % here)
    assert 90 <= publishers["heartbeats_kept_pct"] <= 110
    assert 90 <= publishers["events_kept_pct"] <= 110 and publishers["events_failed"] == 0
    assert publishers["cpu_pct"] > 0 and publishers["heartbeats_lag_p50_s"] is not None
    # a checkpoint every 2 steps: a CheckpointSaved at one, a CheckpointPersisted at the next,
    # by each of a node's 2 ranks, whose steps went in one rollup per node
    acked = [publishers[f"{kind}_acked"] for kind in ("steps", "host_reports", "ckpt_events")]
    assert 0.5 * 2 * acked[0] <= acked[2] <= 1.5 * 2 * acked[0] and acked[1] > 0
    assert sum(acked) == pytest.approx(publishers["events_acked_per_s"] * size["window_s"], 0.05)
    # the server saw at least what the publishers sent: heartbeats and events, and the acks
    published = publishers["heartbeats_per_s"] + publishers["events_acked_per_s"]
    assert size["bus_in_msgs_per_s"] >= 0.9 * published
    assert size["events_stored_per_s"] >= 0.9 * publishers["events_acked_per_s"]
    assert size["events_growth_bytes_per_day"] > 0
    replicator = size["replicator"]
    assert replicator.keys() == REPLICATOR_FIGURES
    assert replicator["node"] == "sim-5" and replicator["connection"] == "goodput-replicator"
    # it read the simulated nodes' index completely before the window: 5 nodes' address and
    # copies, each listing a node's 2 ranks' files
    assert replicator["received_before_window_bytes"] > 5 * INDEX_COPIES_PER_NODE * 300
    assert 0 < replicator["ready_s"] < 60
    # in the window, the index's changes (a node's new step on 3 tiers a second, ~300-byte
    # records), and none of the persisted events of the job's 12 ranks (a checkpoint every
    # 2 s, which the witness took)
    assert replicator["received_bytes_per_s"] > 3 * 300 * 0.5
    assert 6 * 0.5 <= replicator["index_copy_writes_per_s"] <= 6 * 1.5  # 3 puts, 3 deletes
    assert replicator["persisted_events_msgs_per_s"] > 0
    scale = StoreScale(nodes=6, ranks_per_node=2, step_s=1.0, checkpoint_s=2.0)
    assert size["events_limit_bytes"] == store_limits(scale).streams[subjects.EVENTS_STREAM]


def test_publishers_share_the_nodes_evenly_and_wholly() -> None:
    assert shares(10, 4) == [(0, 2), (2, 5), (5, 7), (7, 10)]
    assert shares(2, 4) == [(0, 1), (1, 2)]  # never a publisher without a node
