"""The global commit of a checkpoint's parts over a real TCPStore: every node's leader gets the
same table once every part reported, or the one reason there is none; keys do not outlive it."""

from __future__ import annotations

import threading
from datetime import timedelta

import msgspec
import pytest
from torch.distributed import TCPStore

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
