"""Crash-loop protection: immediate restarts, then back-offs, then giving up."""

from __future__ import annotations

from goodput import schemas
from goodput.supervisor.control.crash_loop import CrashLoopLimits
from goodput.supervisor.control.engine import Controller, ControllerSettings

from .helpers import at, job, signal


def test_restarts_back_off_then_give_up() -> None:
    limits = CrashLoopLimits(window_s=600, max_restarts=3, backoff_s=10, max_backoffs=2)
    controller = Controller(settings=ControllerSettings(crash_loop=limits))
    state = job()
    rules = []
    t = 0.0
    for _ in range(3):
        t += 20
        outcome = controller.handle(state, signal("crash", f"n{int(t) % 6}"), at(t))
        state = outcome.state
        rules.append(outcome.decision.rule)
    assert rules == ["in-process-restart"] * 3

    # the 4th failure inside the window waits 10 s, then is remediated
    deferred = controller.handle(state, signal("hang", "n1"), at(80))
    assert deferred.decision.rule == "crash-loop-backoff" and deferred.commands == []
    assert "backing off 10 s" in deferred.decision.reason
    state = deferred.state
    assert controller.due(state, at(85)) == []
    (retry,) = controller.due(state, at(90))
    assert retry.decision.rule == "in-process-restart" and len(retry.commands) == 1
    state = retry.state
    assert state.deferred == []

    # the next one waits twice as long
    second = controller.handle(state, signal("crash", "n2"), at(100))
    assert "backing off 20 s" in second.decision.reason
    (retry,) = controller.due(second.state, at(120))
    state = retry.state

    # still failing after 2 back-offs: stop the job and say why
    final = controller.handle(state, signal("crash", "n3"), at(130))
    assert final.decision.rule == "crash-loop-give-up"
    assert isinstance(final.commands[0], schemas.Stop)
    assert "crash loop" in final.commands[0].reason and "giving up" in final.state.stopped


def test_a_quiet_window_resets_the_back_off() -> None:
    limits = CrashLoopLimits(window_s=100, max_restarts=1, backoff_s=10, max_backoffs=1)
    controller = Controller(settings=ControllerSettings(crash_loop=limits))
    state = controller.handle(job(), signal("crash", "n0"), at(0)).state
    state = controller.handle(state, signal("crash", "n1"), at(10)).state
    (retry,) = controller.due(state, at(20))
    assert retry.state.backoff_level == 1
    later = controller.handle(retry.state, signal("crash", "n2"), at(500))
    assert later.decision.rule == "in-process-restart" and later.state.backoff_level == 0


def test_stragglers_and_scale_up_do_not_count_as_crash_loops() -> None:
    limits = CrashLoopLimits(window_s=600, max_restarts=1, backoff_s=10, max_backoffs=0)
    controller = Controller(settings=ControllerSettings(crash_loop=limits))
    state = job(active=6)
    state = controller.handle(state, signal("straggler", "n5", "info"), at(1)).state
    state = controller.handle(state, signal("node_returned", "n5", "info"), at(2)).state
    outcome = controller.handle(state, signal("crash", "n0"), at(3))
    assert outcome.decision.rule == "in-process-restart"
