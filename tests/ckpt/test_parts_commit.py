"""The global commit of a checkpoint's parts over a real TCPStore: every node's leader gets the
same table once every part reported, or the one reason there is none; keys do not outlive it;
an engine whose part gets no table leaves nothing on its volume."""

from __future__ import annotations

import os
import threading
from datetime import timedelta
from pathlib import Path

import msgspec
import pytest
import torch
import torch.distributed as dist
from torch.distributed import TCPStore
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Shard, distribute_tensor

from goodput.checkpoint.engine import CheckpointEngine
from goodput.checkpoint.engine.events import CheckpointFailed
from goodput.checkpoint.engine.parts_commit import (
    CommitTable,
    PartCommitError,
    PartLayout,
    PartReport,
    commit_part,
    decide_table,
)
from goodput.checkpoint.format import FileEntry
from goodput.checkpoint.format.parts import PartOf, PartSummary, summarize
from tests.examples.launch import free_port

NODES, PER_NODE = 3, 2


def _summary(part: int) -> PartSummary:
    ranks = [part * PER_NODE + i for i in range(PER_NODE)]
    files = [
        FileEntry(name=f"shards-r{rank:05d}.json", size=4, xxh3_128="b" * 32, dp_rank=rank)
        for rank in ranks
    ]
    return summarize(part, ranks, files)


def _layout(part: int, store: TCPStore, timeout_s: float = 20.0) -> PartLayout:
    return PartLayout(
        part=part,
        parts=NODES,
        rank=part * PER_NODE,
        world=NODES * PER_NODE,
        local_rank=0,
        local_world=PER_NODE,
        namespace="job-a/attempt-1",
        store=store,
        timeout_s=timeout_s,
    )


@pytest.fixture
def server() -> TCPStore:
    return TCPStore(
        "127.0.0.1", free_port(), is_master=True, wait_for_workers=False, timeout=timedelta(60)
    )


def _client(server: TCPStore) -> TCPStore:
    return TCPStore("127.0.0.1", server.port, is_master=False, timeout=timedelta(seconds=60))


def _commit_all(
    server: TCPStore, parts: list[int], digest: dict[int, str] | None = None, timeout_s=20.0
) -> dict[int, PartOf | Exception]:
    """Each listed part's leader on its own thread and store client, as on its own node."""
    out: dict[int, PartOf | Exception] = {}

    def leader(part: int) -> None:
        try:
            layout = _layout(part, _client(server), timeout_s)
            layout_digest = (digest or {}).get(part, "d0")
            out[part] = commit_part(layout, layout.store, 7, _summary(part), layout_digest)
        except Exception as exc:  # the outcome under test
            out[part] = exc

    threads = [threading.Thread(target=leader, args=(part,)) for part in parts]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    return out


def test_every_leader_gets_the_same_table_and_the_keys_are_gone(server: TCPStore) -> None:
    out = _commit_all(server, list(range(NODES)))
    commits = {part: result.commit for part, result in out.items() if isinstance(result, PartOf)}
    assert sorted(commits) == [0, 1, 2] and len(set(commits.values())) == 1
    assert out[1].part == 1 and out[1].table == [_summary(part) for part in range(NODES)]
    assert server.num_keys() <= 1  # what is left is the store's own bookkeeping, no part key


def test_a_part_that_never_reports_fails_every_leader_with_the_reason(server: TCPStore) -> None:
    out = _commit_all(server, [0, 1], timeout_s=1.0)
    for part in (0, 1):
        assert isinstance(out[part], PartCommitError)
        assert "parts [2] did not report within 1 s" in str(out[part])


def test_parts_that_planned_different_layouts_are_not_one_checkpoint(server: TCPStore) -> None:
    out = _commit_all(server, list(range(NODES)), digest={2: "other"})
    assert all("different state layouts" in str(result) for result in out.values())


def test_a_table_that_does_not_hold_this_part_as_written_is_refused(server: TCPStore) -> None:
    """A forged or stale table in the store: the leader will not rename its part under it."""
    layout = _layout(1, _client(server))
    table = [_summary(0), _summary(0), _summary(2)]
    prefix = "goodput/parts/job-a/attempt-1/step-0000000007"
    server.set(f"{prefix}/table", msgspec.json.encode(CommitTable(table=table)))
    with pytest.raises(PartCommitError, match="does not hold part 1 as written"):
        commit_part(layout, layout.store, 7, _summary(1), "d0")


def test_decide_table_names_what_is_wrong() -> None:
    reports = {p: PartReport(layout_digest="d", summary=_summary(p)) for p in range(NODES)}
    assert decide_table(reports, NODES, NODES * PER_NODE) == [_summary(p) for p in range(3)]
    assert decide_table(reports, NODES, 7) == (
        "the parts' ranks do not cover the 7 ranks exactly once"
    )
    swapped = {**reports, 1: reports[2]}
    assert decide_table(swapped, NODES, 6) == "a part reported under another part's index"
    assert decide_table({0: reports[0]}, NODES, 6) == "parts [1, 2] did not report"


def test_a_layout_whose_ranks_are_not_numbered_node_by_node_is_refused() -> None:
    with pytest.raises(ValueError, match="not local rank 1 of node 0"):
        PartLayout(part=0, parts=2, rank=3, world=4, local_rank=1, local_world=2, namespace="j")
    with pytest.raises(ValueError, match="5 ranks are not 2 nodes x 2"):
        PartLayout(part=0, parts=2, rank=0, world=5, local_rank=0, local_world=2, namespace="j")


def test_a_part_without_its_table_leaves_nothing_and_says_why(
    server: TCPStore, tmp_path: Path
) -> None:
    """The engine's side: part 0 of 2 is durable but part 1 never reports; the save fails
    with the coordinator's reason and the node's root holds no step and no temporary."""
    dist.init_process_group(
        "gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1
    )
    try:
        mesh = init_device_mesh("cpu", (1,))
        weight = distribute_tensor(torch.arange(8.0).reshape(4, 2), mesh, [Shard(0)])
        layout = PartLayout(
            part=0,
            parts=2,
            rank=0,
            world=2,
            local_rank=0,
            local_world=1,
            namespace="job-a/attempt-1",
            store=_client(server),
            timeout_s=1.0,
        )
        events: list[object] = []
        root = tmp_path / "node-0"
        with CheckpointEngine(root, parts=layout, listener=events.append) as engine:
            result = engine.save({"w": weight, "step": 3}, 3).wait(120)
    finally:
        dist.destroy_process_group()
    assert result.status == "failed" and "parts [1] did not report within 1 s" in result.error
    failed = [e for e in events if isinstance(e, CheckpointFailed)]
    assert len(failed) == 1 and "parts [1] did not report" in failed[0].error
    assert os.listdir(root) == []
