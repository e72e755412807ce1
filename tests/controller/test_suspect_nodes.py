"""A launch the actuator refused because an active node never confirmed a pod's deletion (it
reports the node in ``JobStatus.suspect_nodes``) is decided again: the node is replaced."""

from __future__ import annotations

from goodput import schemas
from goodput.supervisor.control.engine import Controller
from goodput.supervisor.jobstate.folds import observe_status

from .helpers import JOB, at, job, signal, status_of


def _status(state, suspect: list[str], **changes) -> schemas.JobStatus:
    return status_of(state, state="restarting", suspect_nodes=suspect, **changes)


def _refused_restart(active: int, spares: int, suspect: list[str]):
    """The decision taken once the Restart of a frozen rank on n1 was refused."""
    controller = Controller()
    first = controller.handle(job(active, spares), signal("missed_heartbeat", "n1"), at(1))
    (restart,) = first.commands
    assert first.decision.rule == "in-job-restart"
    state = observe_status(first.state, _status(first.state, suspect), at(2))
    result = schemas.ActionResult(
        job=JOB,
        command_id=restart.command_id,
        action="restart",
        ok=False,
        detail=f"no pod placed: {suspect[0]} never confirmed the deletion of pod-x",
    )
    return controller.settle(state, result, at(3))


def test_a_single_suspect_node_is_hot_swapped_for_a_free_spare() -> None:
    outcome = _refused_restart(6, 1, ["n3"])
    assert outcome.decision.rule == "replace-suspect"
    assert "restart refused (no pod placed: n3" in outcome.decision.reason
    (swap,) = outcome.commands
    assert isinstance(swap, schemas.HotSwap)
    assert (swap.failed_node, swap.spare_node) == ("n3", "s0")
    assert outcome.state.role_of("n3") == "failed" and outcome.state.role_of("s0") == "active"


def test_with_no_spare_the_job_scales_to_whole_replicas_without_it() -> None:
    outcome = _refused_restart(6, 0, ["n3"])
    (scale,) = outcome.commands
    assert isinstance(scale, schemas.ScaleTo) and outcome.decision.rule == "replace-suspect"
    assert (scale.nodes, scale.drop_nodes, scale.num_dp_replicas) == (
        ["n0", "n1", "n2", "n4"],
        ["n3"],
        2,
    )


def test_several_suspect_nodes_take_the_free_spares_places_in_one_scale() -> None:
    outcome = _refused_restart(6, 1, ["n1", "n4"])
    (scale,) = outcome.commands
    assert isinstance(scale, schemas.ScaleTo)
    # n1's place goes to the spare, n4's to nobody: 5 nodes, 2 whole replicas of 2
    assert (scale.nodes, scale.drop_nodes) == (["n0", "s0", "n2", "n3"], ["n1", "n4"])


def test_no_whole_replica_left_stops_the_job_saying_why() -> None:
    outcome = _refused_restart(2, 0, ["n0", "n1"])
    (stop,) = outcome.commands
    assert isinstance(stop, schemas.Stop) and "not one whole replica left" in stop.reason


def test_a_suspect_spare_is_not_swapped_in_and_a_confirmed_node_is_no_longer_suspect() -> None:
    state = job(6, 2)
    state = observe_status(state, _status(state, ["n2", "s0"]), at(1))
    outcome = Controller().handle(state, signal("crash", "n5"), at(2))
    (swap,) = outcome.commands
    assert (swap.failed_node, swap.spare_node) == ("n2", "s1")
    # the next report no longer names them: they confirmed, the ladder is the usual one
    state = observe_status(state, _status(state, []), at(3))
    assert not any(n.suspect for n in state.nodes)
    outcome = Controller().handle(state, signal("crash", "n5", observed_ts=at(3)), at(4))
    assert outcome.decision.rule == "in-process-restart"
