"""StateDir: the one owner of a state directory's layout. The paths are the ones existing state
directories already hold, so a user's directory from an earlier release keeps working."""

from __future__ import annotations

from pathlib import Path

import pytest

from goodput.bus.embedded import EmbeddedRecord, read_record, write_record
from goodput.checkpoint.format.layout import node_dir
from goodput.launch.rank_logs import rank_log_dir
from goodput.state_dir import StateDir
from goodput.tools.stack.record import StackRecord, read_stack, write_stack

ROOT = Path("/srv/stack")


def test_the_layout_is_the_one_existing_state_dirs_have() -> None:
    paths = StateDir(ROOT)
    expected = {
        "stack.json": paths.stack_record,
        "stack.lock": paths.lock,
        "logs": paths.logs,
        "logs/sensor.log": paths.service_log("sensor"),
        "logs/replicator-node-0.log": paths.service_log("replicator", "node-0"),
        "logs/standbys": paths.standby_logs,
        "logs/ranks/attempt-007": paths.rank_logs(7),
        "nats.json": paths.nats_record,
        "nats-store": paths.nats_store(),
        "nats-store-2": paths.nats_store(2),
        "nats-server.log": paths.nats_log(),
        "nats-server-0.log": paths.nats_log(0),
        "nodes/node-0": paths.node("node-0"),
        "object-store": paths.object_store,
        "ckpt.key": paths.ckpt_key,
        "agents/gpu-3": paths.agent("gpu-3").root,
        "daemons.json": paths.daemons_record,
        "logs/hostmon.exit-reason": paths.daemon_exit_reason("hostmon"),
        "ranks-train.json": paths.ranks_record("train"),
        "chaos/slow-rank-train-3.json": paths.slow_rank_record("train", 3),
        "logs/chaos-slow-rank-3.log": paths.slow_rank_log(3),
        "shared-checkpoints": paths.shared_checkpoints,
        "training-result.json": paths.training_result,
    }
    for spelled, asked in expected.items():
        assert asked == ROOT / spelled, spelled
    assert (
        paths.agent("gpu-3").service_log("replicator") == ROOT / "agents/gpu-3/logs/replicator.log"
    )


def test_every_node_directory_is_found(tmp_path: Path) -> None:
    paths = StateDir(tmp_path)
    assert paths.nodes() == []  # no nodes/ yet
    for node in ("n1", "n0"):
        paths.node(node).mkdir(parents=True)
    (tmp_path / "nodes" / "stray.txt").write_text("")  # not a node's directory
    assert paths.nodes() == [paths.node("n0"), paths.node("n1")]


def test_the_ranks_records_of_every_job_are_found(tmp_path: Path) -> None:
    paths = StateDir(tmp_path)
    for job in ("b", "a"):
        paths.ranks_record(job).write_text("{}")
    (tmp_path / "ranks.json").write_text("{}")  # not a job's
    assert paths.ranks_records() == [paths.ranks_record("a"), paths.ranks_record("b")]


@pytest.mark.parametrize("forged", ["../etc", "a/b", "..", "x.y", "*", "node 0"])
def test_names_from_outside_cannot_lead_out_of_the_directory(forged: str) -> None:
    """Node and job names arrive on the bus and in records: each is a token or refused."""
    paths = StateDir(ROOT)
    for ask in (
        paths.node,
        paths.agent,
        paths.ranks_record,
        lambda name: paths.slow_rank_record(name, 0),
        lambda name: paths.service_log("replicator", name),
        paths.service_log,
        paths.daemon_exit_reason,
    ):
        with pytest.raises(ValueError, match="invalid"):
            ask(forged)


def test_an_empty_name_is_no_name() -> None:
    """A service's log without a node is a central service's; an empty service, node or job
    is refused."""
    paths = StateDir(ROOT)
    assert paths.service_log("replicator", "") == paths.service_log("replicator")
    for ask in (paths.service_log, paths.node, paths.agent, paths.ranks_record):
        with pytest.raises(ValueError, match="invalid"):
            ask("")


def test_the_older_helpers_ask_it(tmp_path: Path) -> None:
    """The functions other modules call name the same paths as StateDir."""
    paths = StateDir(tmp_path)
    assert node_dir(tmp_path, "n1") == paths.node("n1")
    assert rank_log_dir(tmp_path, 2) == paths.rank_logs(2)
    with pytest.raises(ValueError, match="invalid node"):
        node_dir(tmp_path, "../n1")


def test_the_records_are_written_where_it_says(tmp_path: Path) -> None:
    paths = StateDir(tmp_path)
    write_stack(
        tmp_path, StackRecord(job="j", url="nats://x", embedded=True, nodes=[], services=[])
    )
    write_record(paths, EmbeddedRecord(servers=[]))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["nats.json", "stack.json"]
    assert read_stack(tmp_path) is not None and read_record(paths) is not None
    assert read_stack(paths.root) == read_stack(tmp_path)
