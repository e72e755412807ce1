"""Which ranks an agent reports that the actuator gave up: those of a node that was cut off
while the job moved on, killed once it is back — and never a rank the job still runs."""

from __future__ import annotations

from goodput import schemas
from goodput_services.actuator.agent_backend import AgentRankEntry, stray_ranks


def _record(*ranks: schemas.AgentRank, node: str = "host-b") -> schemas.AgentRecord:
    return schemas.AgentRecord(
        job="j",
        node=node,
        address="10.0.0.2",
        pid=1,
        instance="i",
        started_ts=1,
        state_dir="/s",
        run_id="r",
        ranks=list(ranks),
    )


def _rank(rank: int, attempt: int, pid: int, running: bool = True) -> schemas.AgentRank:
    return schemas.AgentRank(rank=rank, local_rank=0, attempt=attempt, pid=pid, running=running)


def test_a_running_rank_of_an_attempt_given_up_is_a_stray() -> None:
    record = _record(_rank(1, 1, 500), _rank(0, 1, 400, running=False))
    assert stray_ranks(record, [], attempt=2) == [_rank(1, 1, 500)]


def test_ranks_the_backend_follows_are_never_strays() -> None:
    # a survivor of an in-process restart keeps its pid while its agent's attempt lags
    survivor = AgentRankEntry(node="host-b", rank=1, local_rank=0, attempt=3, pid=500)
    assert stray_ranks(_record(_rank(1, 2, 500)), [survivor], attempt=3) == []
    # launched, its pid not reported yet: matched by rank and attempt
    launched = AgentRankEntry(node="host-b", rank=1, local_rank=0, attempt=2)
    assert stray_ranks(_record(_rank(1, 2, 501)), [launched], attempt=3) == []
    # another process of that rank: the one followed is not this one
    other = AgentRankEntry(node="host-b", rank=1, local_rank=0, attempt=3, pid=777)
    assert stray_ranks(_record(_rank(1, 2, 500)), [other], attempt=3) == [_rank(1, 2, 500)]


def test_a_rank_of_the_current_attempt_is_left_alone() -> None:
    """Unknown but current (an actuator that lost its entries): not judged a stray."""
    assert stray_ranks(_record(_rank(1, 3, 500)), [], attempt=3) == []
