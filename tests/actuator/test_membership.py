"""Membership rules of the actuator (pure)."""

from __future__ import annotations

import pytest

from goodput import schemas
from goodput.supervisor.membership import Membership, MembershipError


def test_hot_swap_takes_the_first_spare_into_the_failed_nodes_place() -> None:
    membership, chosen = Membership.initial(2, 1, 1).hot_swap("node-0")
    assert chosen == "node-2"
    assert (membership.active, membership.spares, membership.failed) == (
        ["node-2", "node-1"],
        [],
        ["node-0"],
    )


def test_hot_swap_to_a_repaired_node_the_controller_kept_as_a_spare() -> None:
    # node-0 was swapped out, came back (the controller kept it as a spare, sending nothing),
    # then node-1 is lost: the controller swaps node-0 in
    membership, _ = Membership.initial(2, 1, 1).hot_swap("node-0")
    membership, chosen = membership.hot_swap("node-1", "node-0")
    assert chosen == "node-0"
    assert (membership.active, membership.spares, membership.failed) == (
        ["node-2", "node-0"],
        [],
        ["node-1"],
    )


@pytest.mark.parametrize(
    ("failed", "spare", "why"),
    [
        ("node-9", "", "unknown node"),
        ("node-2", "", "not active"),
        ("node-0", "node-1", "is not a spare"),  # an active node
        ("node-0", "node-0", "is not a spare"),
    ],
)
def test_hot_swap_refuses_what_cannot_be(failed: str, spare: str, why: str) -> None:
    with pytest.raises(MembershipError, match=why):
        Membership.initial(2, 1, 1).hot_swap(failed, spare)


def test_hot_swap_without_a_spare_says_so() -> None:
    with pytest.raises(MembershipError, match="no spare"):
        Membership.initial(2, 0, 1).hot_swap("node-0")


def test_the_nodes_a_command_newly_counts_failed_are_the_ones_whose_addresses_leave() -> None:
    membership = Membership.initial(3, 1, 1)
    assert membership.newly_failed(schemas.HotSwap(job="j", failed_node="node-0")) == ["node-0"]
    swapped = membership.after(schemas.HotSwap(job="j", failed_node="node-0"))
    drop = schemas.ScaleTo(job="j", num_dp_replicas=1, drop_nodes=["node-1", "node-0"])
    assert swapped.newly_failed(drop) == ["node-1"], "node-0 counted failed already"
    # nodes left out of a scale become spares, not failed; a returned node is no loss
    assert (
        membership.newly_failed(schemas.ScaleTo(job="j", num_dp_replicas=1, nodes=["node-0"])) == []
    )
    assert swapped.newly_failed(schemas.ReturnNode(job="j", node="node-0")) == []
    # a command the actuator would refuse withdraws nothing
    assert membership.newly_failed(schemas.HotSwap(job="j", failed_node="node-9")) == []
