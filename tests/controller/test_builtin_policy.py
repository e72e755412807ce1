"""Each rule of the built-in policy, through the controller as the service uses it."""

from __future__ import annotations

import msgspec

from goodput import schemas
from goodput.supervisor.control.engine import Controller
from goodput.supervisor.jobstate.folds import record_capabilities, record_step_time
from goodput.supervisor.policy.scripts import cold_restart, restart_whole_job

from .helpers import JOB, at, job, signal, with_standbys


def handle(state, sig, seconds: float = 1.0):
    outcome = Controller().handle(state, sig, at(seconds))
    assert outcome.decision is not None
    return outcome


def test_correctable_crash_restarts_in_place() -> None:
    outcome = handle(job(spares=1), signal("crash", "n2"))
    assert outcome.decision.rule == "in-process-restart"
    assert [type(c) for c in outcome.commands] == [schemas.RestartInProcess]
    assert outcome.decision.command_ids == [c.command_id for c in outcome.commands]
    assert outcome.commands[0].decision_id == outcome.decision.decision_id
    assert "crash on n2" in outcome.decision.reason and outcome.decision.error == ""
    assert outcome.state.active == job(spares=1).active


def test_a_hang_restarts_in_process_a_frozen_rank_cold() -> None:
    assert handle(job(), signal("hang", "n1")).decision.rule == "in-process-restart"
    frozen = handle(job(), signal("missed_heartbeat", "n1"))
    assert frozen.decision.rule == "in-job-restart"
    assert [type(c) for c in frozen.commands] == [schemas.Restart]
    assert "cannot be healed in process" in frozen.decision.reason


def test_a_failed_in_process_restart_is_decided_again_cold_saying_why() -> None:
    controller = Controller()
    warm = controller.handle(job(), signal("crash", "n1", observed_ts=at(0.5)), at(1.0))
    (command,) = warm.commands
    failed = schemas.ActionResult(
        job=JOB,
        command_id=command.command_id,
        action="restart_in_process",
        ok=False,
        detail="rank 0 did not rejoin within 30 s",
    )
    cold = controller.settle(warm.state, failed, at(40.0))
    assert cold.decision is not None and cold.decision.rule == "in-job-restart"
    assert [type(c) for c in cold.commands] == [schemas.Restart]
    assert "in-process restart failed: rank 0 did not rejoin" in cold.decision.reason
    # the next, unrelated crash is warm again: the failure belonged to the earlier signal
    later = controller.handle(cold.state, signal("crash", "n2", observed_ts=at(90.0)), at(100.0))
    assert later.decision is not None and later.decision.rule == "in-process-restart"


def test_uncorrectable_with_spare_hot_swaps() -> None:
    outcome = handle(job(spares=1), signal("degraded_host", "n3", "uncorrectable"))
    assert outcome.decision.rule == "hot-swap"
    (swap,) = outcome.commands
    assert (swap.failed_node, swap.spare_node) == ("n3", "s0")
    assert outcome.state.role_of("n3") == "failed" and "s0" in outcome.state.active


def test_uncorrectable_without_spare_scales_down() -> None:
    outcome = handle(job(active=6), signal("missed_heartbeat", "n1", "uncorrectable"))
    assert outcome.decision.rule == "scale-down"
    (scale,) = outcome.commands
    assert scale.num_dp_replicas == 2 and scale.drop_nodes == ["n1"]
    assert scale.nodes == ["n0", "n2", "n3", "n4"]
    assert outcome.state.spares == ["n5"]  # the leftover healthy node waits as a spare


def test_last_replica_lost_stops_with_a_reason() -> None:
    outcome = handle(job(active=2), signal("degraded_host", "n0", "uncorrectable"))
    assert outcome.decision.rule == "no-capacity"
    assert isinstance(outcome.commands[0], schemas.Stop)
    assert "not one whole replica" in outcome.commands[0].reason
    assert outcome.state.stopped
    after = Controller().handle(outcome.state, signal("crash", "n1"), at(2))
    assert after.decision.rule == "stopped" and after.commands == []


def test_returned_node_scales_back_up() -> None:
    down = handle(job(active=4), signal("degraded_host", "n1", "uncorrectable")).state
    assert down.num_dp_replicas == 1 and down.spares == ["n3"]
    up = handle(down, signal("node_returned", "n1", "info"), 5)
    assert up.decision.rule == "scale-up"
    assert up.commands[-1].num_dp_replicas == 2 and up.state.num_dp_replicas == 2
    assert [type(c) for c in up.commands] == [schemas.ReturnNode, schemas.ScaleTo]
    # a node the actuator does not know cannot join: it reports membership, not the controller
    again = handle(up.state, signal("node_returned", "x9", "info"), 6)
    assert again.decision.rule == "spare-kept" and again.state.spares == []


def test_straggler_is_evicted() -> None:
    slow = {"ratio": 3.0, "ts": at(1)}
    with_spare = handle(job(spares=1), signal("straggler", "n4", "info", **slow))
    assert with_spare.decision.rule == "evict-straggler-hot-swap"
    without = handle(job(), signal("straggler", "n4", "info", **slow))
    assert without.decision.rule == "evict-straggler-scale-down"
    alone = handle(job(active=2), signal("straggler", "n0", "info", **slow))
    assert alone.decision.rule == "straggler-tolerated" and alone.commands == []


def test_a_straggler_gets_the_cheapest_remedy_with_its_figures() -> None:
    """Tolerating costs its slowdown until the next expected restart (MTBF: a day at first), a
    hot swap one restart, a scale-down a restart plus a replica's share of that horizon."""
    mild = signal("straggler", "n4", "info", ratio=1.1, ts=at(1))
    # three replicas: dropping one costs a third of a day, 10 % slower costs 0.09 of it
    tolerated = handle(job(), mild)
    assert tolerated.decision.rule == "straggler-tolerated" and tolerated.commands == []
    assert "tolerate 130.9 min, hot-swap impossible, scale-down 485.0 min" in (
        tolerated.decision.reason
    )
    assert "restart 300 s, prior" in tolerated.decision.reason
    # a spare: the swap's restart (the job's measured downtimes, their median) is cheapest
    measured = msgspec.structs.replace(job(spares=1), restart_downtimes_s=[40.0, 60.0, 500.0])
    swapped = handle(measured, mild)
    assert swapped.decision.rule == "evict-straggler-hot-swap"
    assert "hot-swap 1.0 min" in swapped.decision.reason
    assert "restart 60 s, measured" in swapped.decision.reason
    # six replicas and 2× slower: half the horizon lost beats a sixth of it plus a restart
    wide = handle(job(active=12), signal("straggler", "n4", "info", ratio=2.0, ts=at(1)))
    assert wide.decision.rule == "evict-straggler-scale-down"


def test_a_restart_downtime_is_measured_from_the_command_to_the_next_step() -> None:
    controller = Controller()
    outcome = controller.handle(job(), signal("crash", "n1", ts=at(1)), at(1))
    (command,) = outcome.commands
    done = schemas.ActionResult(
        job=JOB, ts=at(3), command_id=command.command_id, action="restart_in_process", ok=True
    )
    # a step before the result is the old group's (a SIGTERM save): not the resume
    state = record_step_time(outcome.state, 2.0, at(2))
    state = record_step_time(controller.settle(state, done, at(3)).state, 2.0, at(21))
    assert state.restart_downtimes_s == [20.0] and state.resuming_since_ts == 0
    assert record_step_time(state, 2.0, at(30)).restart_downtimes_s == [20.0]


def test_repeat_offender_is_replaced() -> None:
    state, controller = job(spares=1), Controller()
    for second in (1, 2):
        state = controller.handle(state, signal("crash", "n2"), at(second * 1000)).state
    third = controller.handle(state, signal("crash", "n2"), at(3000))
    assert third.decision.rule == "repeat-offender"
    assert isinstance(third.commands[0], schemas.HotSwap)


def test_a_lost_node_after_earlier_faults_is_hot_swapped_not_a_repeat_offender() -> None:
    # a hang on n2, then n2 lost: its ranks' crash is seen before its host's fault
    state, controller = job(spares=1), Controller()
    state = controller.handle(state, signal("hang", "n2"), at(1000)).state
    state = controller.handle(state, signal("crash", "n2"), at(2000)).state
    lost = controller.handle(state, signal("degraded_host", "n2", "uncorrectable"), at(2001))
    assert lost.decision.rule == "hot-swap"
    assert isinstance(lost.commands[0], schemas.HotSwap)


def test_job_down_restarts_everything() -> None:
    outcome = handle(job(), signal("job_down", "", "uncorrectable"))
    assert outcome.decision.rule == "restart-job"


def test_signals_about_nodes_not_in_use_do_nothing() -> None:
    state = handle(job(spares=1), signal("degraded_host", "n3", "uncorrectable")).state
    late = handle(state, signal("missed_heartbeat", "n3", "uncorrectable"), 2)
    assert late.decision.rule == "failed-node" and late.commands == []
    stranger = handle(state, signal("crash", "zz"), 3)
    assert stranger.decision.rule == "unknown-node"
    sick_spare = handle(job(spares=1), signal("degraded_host", "s0", "uncorrectable"), 4)
    assert sick_spare.commands == [] and sick_spare.state.role_of("s0") == "failed"


def test_a_signal_is_handled_once_and_ids_are_stable() -> None:
    sig = signal("crash", "n2")
    first = handle(job(), sig)
    assert Controller().handle(first.state, sig, at(2)).decision is None
    # a standby controller deciding from the same stored state issues the same command ids
    twin = Controller().handle(job(), sig, at(1))
    assert [c.command_id for c in twin.commands] == [c.command_id for c in first.commands]
    assert all(c.job == JOB for c in first.commands)


def test_standbys_replace_lost_ranks_and_restart_the_group_when_in_process_cannot() -> None:
    state = with_standbys(job(active=2, per_dp=1, spares=1), ["n0", "n1", "s0"])
    assert state.standbys == {"n0": 1, "n1": 1, "s0": 1}
    warm = handle(state, signal("crash", "n1"))
    assert warm.decision.rule == "in-process-restart"
    assert warm.commands[0].standbys and "from n1's standby" in warm.decision.reason
    frozen = handle(state, signal("missed_heartbeat", "n1"))
    assert frozen.decision.rule == "standby-restart"
    (restart,) = frozen.commands
    assert isinstance(restart, schemas.Restart) and restart.standbys
    # one standby per node, 8 ranks per node: the reason says how many start warm
    assert "2 of 16 rank(s) from ready standbys" in frozen.decision.reason
    swap = handle(state, signal("degraded_host", "n1", "uncorrectable"))
    assert swap.decision.rule == "hot-swap" and swap.commands[0].standbys


def test_without_a_ready_standby_the_ladder_stays_cold() -> None:
    state = with_standbys(job(active=2, per_dp=1), ["n0"])
    warm = handle(state, signal("crash", "n1"))
    assert not warm.commands[0].standbys and "the lost ones cold" in warm.decision.reason
    frozen = handle(job(active=2, per_dp=1), signal("missed_heartbeat", "n1"))
    assert frozen.decision.rule == "in-job-restart" and not frozen.commands[0].standbys


def test_the_cold_policy_and_the_baseline_never_take_standbys() -> None:
    state = with_standbys(job(active=2, per_dp=1, spares=1), ["n0", "n1", "s0"])
    for kind, severity in (("crash", "correctable"), ("degraded_host", "uncorrectable")):
        for policy in (cold_restart.decide, restart_whole_job.decide):
            plan = policy(signal(kind, "n1", severity), state)
            assert not any(getattr(c, "standbys", False) for c in plan.commands)
            assert "standby" not in plan.reason


def _declaring(state, in_process_restart: bool):
    """``state`` once rank 0's step report declared whether its loop restarts in process."""
    step = schemas.StepDone(
        job=JOB,
        node="n0",
        rank=0,
        step=3,
        step_time_s=0.5,
        tokens=0,
        loss=1.0,
        in_process_restart=in_process_restart,
    )
    return record_capabilities(state, step)


def test_a_job_whose_ranks_cannot_restart_in_process_is_sent_its_first_supported_rung() -> None:
    # a framework's loop (Lightning, the HF Trainer) declares it cannot: the crash goes to
    # the next rung at once, with no RestartInProcess to be refused and no refusal to wait for
    framework = _declaring(job(), False)
    assert framework.in_process_restart is False
    crash = handle(framework, signal("crash", "n1"))
    assert crash.decision.rule == "in-job-restart"
    assert [type(c) for c in crash.commands] == [schemas.Restart]
    assert "cannot restart in process: their loop is not the shim's" in crash.decision.reason
    ready = with_standbys(framework, ["n0", "n1"])
    assert handle(ready, signal("hang", "n1")).decision.rule == "standby-restart"
    # the shim's own loop declares it can; a job that reported no step yet is tried warm
    assert handle(_declaring(job(), True), signal("crash", "n1")).decision.rule == (
        "in-process-restart"
    )
    assert job().in_process_restart is None
