"""What `goodput run`/`demo` report about a followed job, from the events alone (no bus), and
the status `goodput run` exits with."""

from __future__ import annotations

import pytest

from goodput import schemas
from goodput.launch.exit_reason import (
    RUN_CANNOT_CONTINUE_EXIT_CODE,
    RUN_EXIT_CODES,
    RUN_FAILED_EXIT_CODE,
    RUN_FINISHED_EXIT_CODE,
)
from goodput.supervisor.policy.builtin import NO_CAPACITY_RULE
from goodput.tools.stack.watch import JobWatcher, run_exit_code, summary


def status(attempt: int, state: str, world_size: int, detail: str = "") -> schemas.JobStatus:
    nodes = [f"node-{i}" for i in range(world_size)]
    return schemas.JobStatus(
        job="j",
        state=state,
        attempt=attempt,
        world_size=world_size,
        procs_per_node=1,
        active_nodes=nodes,
        detail=detail,
    )


def test_an_attempt_reported_mid_relaunch_still_counts_when_it_runs() -> None:
    # the order a CI run produced: a standby became ready while the scale-up's ranks were
    # being launched, so attempt 3 was first reported "restarting", then "running"
    watcher = JobWatcher(bus=None, job="j", total_steps=10)  # type: ignore[arg-type]
    for event in [
        status(1, "running", 2, "job started"),
        status(1, "running", 2, "standbys replenished"),
        status(2, "running", 1, "2 → 1 ranks"),
        status(3, "restarting", 2, "standby of node-0 ready"),
        status(3, "running", 2, "1 → 2 ranks"),
        status(3, "running", 2, "standbys replenished"),
        status(3, "finished", 2, "every rank exited 0"),
    ]:
        watcher._apply(event)
    report = summary(watcher)
    assert report["world_size_history"] == [2, 1, 2]
    assert report["restarts"] == 2 and report["state"] == "finished"


def test_a_launch_failure_is_not_overwritten_by_the_stop_that_follows_it() -> None:
    # the order a CI run produced: `run` judged the launch failed and stopped the job; the
    # controller's restart of the same exit and the stop's status came before it stopped
    # following, and the summary read "stopped"
    watcher = JobWatcher(bus=None, job="j", total_steps=10)  # type: ignore[arg-type]
    crash = schemas.RankExited(job="j", node="node-0", rank=0, pid=7, exit_code=3, attempt=1)
    watcher._apply(status(1, "running", 1, "job started"))
    watcher._apply(crash)
    assert watcher.ended.is_set() and watcher.state == "launch failed"
    watcher._apply(status(2, "restarting", 1, "in-job restart"))
    watcher._apply(status(2, "stopped", 1, "goodput run: launch failed: ..."))
    report = summary(watcher)
    assert report["state"] == "launch failed" and report["restarts"] == 0
    assert "exit code 3" in watcher.refusal


def _decision(rule: str, *, acting: bool = True) -> schemas.Decision:
    return schemas.Decision(
        job="train",
        signal_id="s",
        policy="builtin",
        rule=rule,
        reason="why",
        command_ids=["c"] if acting else [],
    )


@pytest.mark.parametrize(
    ("state", "decisions", "code"),
    [
        ("finished", [], RUN_FINISHED_EXIT_CODE),
        # the policy stopped the job for want of healthy nodes: a new allocation may go on
        ("stopped", [_decision("hot-swap"), _decision(NO_CAPACITY_RULE)], 75),
        # a decision that sent nothing after it does not change why the job stopped
        ("stopped", [_decision(NO_CAPACITY_RULE), _decision("spare-node", acting=False)], 75),
        ("stopped", [], RUN_FAILED_EXIT_CODE),  # a person's stop
        ("stopped", [_decision("crash-loop-give-up")], RUN_FAILED_EXIT_CODE),
        ("failed", [_decision(NO_CAPACITY_RULE)], RUN_FAILED_EXIT_CODE),
        ("launch failed", [], RUN_FAILED_EXIT_CODE),
        ("refused", [], RUN_FAILED_EXIT_CODE),
    ],
)
def test_goodput_run_exits_75_only_when_it_cannot_continue_on_the_nodes_it_has(
    state: str, decisions: list[schemas.Decision], code: int
) -> None:
    assert run_exit_code(state, decisions) == code
    assert code in RUN_EXIT_CODES
    assert RUN_CANNOT_CONTINUE_EXIT_CODE == 75  # sysexits' EX_TEMPFAIL, documented for Slurm
