"""User policy scripts: the example, and every way a script can go wrong (→ error + built-in)."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

import goodput.supervisor.policy.scripts
from goodput import schemas
from goodput.supervisor.control.engine import Controller, ControllerSettings

from .helpers import at, job, signal

EXAMPLES = Path(goodput.supervisor.policy.scripts.__file__).parent


def write(tmp_path: Path, body: str, name: str = "policy.py") -> str:
    path = tmp_path / name
    path.write_text(textwrap.dedent(body))
    return str(path)


def test_example_prefer_scale_down_scales_down_despite_a_spare() -> None:
    controller = Controller(str(EXAMPLES / "prefer_scale_down.py"))
    outcome = controller.handle(
        job(spares=1), signal("degraded_host", "n1", "uncorrectable"), at(1)
    )
    assert outcome.decision.policy == "prefer_scale_down" and outcome.decision.error == ""
    assert outcome.decision.rule == "prefer-scale-down (scale-down)"
    (scale,) = outcome.commands
    assert scale.drop_nodes == ["n1"] and scale.num_dp_replicas == 2
    assert outcome.state.spares == ["n5", "s0"]
    # the rest is the built-in policy: a returned node grows the job back
    back = controller.handle(outcome.state, signal("node_returned", "n1", "info"), at(2))
    assert back.decision.rule == "scale-up" and back.state.num_dp_replicas == 3


def test_a_script_returning_a_plain_list(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        """
        from goodput import schemas

        def decide(signal, state):
            return [schemas.CheckpointNow(job=state.job), schemas.Restart(job=state.job)]
        """,
    )
    outcome = Controller(path).handle(job(), signal("crash", "n0"), at(1))
    assert outcome.decision.rule == "script" and outcome.decision.error == ""
    assert [c.command_id for c in outcome.commands] == outcome.decision.command_ids
    assert "checkpoint_now, restart" in outcome.decision.reason


def test_a_script_cannot_change_the_controllers_state(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        """
        def decide(signal, state):
            state.nodes.clear()
            state.num_dp_replicas = 99
            return []
        """,
    )
    state = job()
    outcome = Controller(path).handle(state, signal("crash", "n0"), at(1))
    assert outcome.state.active == state.active and outcome.state.num_dp_replicas == 3


BAD_SCRIPTS = {
    "raises": (
        """
        def decide(signal, state):
            return {}["missing"]
        """,
        "raised KeyError at line 3",
    ),
    "garbage": (
        """
        def decide(signal, state):
            return "restart everything please"
        """,
        "must return a Plan or a list of commands, not str",
    ),
    "not a command": (
        """
        def decide(signal, state):
            return [{"kind": "restart"}]
        """,
        "dict is not a command a policy may issue",
    ),
    "unknown node": (
        """
        from goodput import schemas

        def decide(signal, state):
            return [schemas.HotSwap(job=state.job, failed_node="nope", spare_node="s0")]
        """,
        "unknown node 'nope'",
    ),
    "impossible scale": (
        """
        from goodput import schemas

        def decide(signal, state):
            return [schemas.ScaleTo(job=state.job, num_dp_replicas=5, nodes=state.active)]
        """,
        "5 replicas × 2 nodes need 10 nodes, 6 given",
    ),
    "wrong field type": (
        """
        from goodput import schemas

        def decide(signal, state):
            return [schemas.Restart(job=state.job, nodes="n0")]
        """,
        "malformed Restart",
    ),
    "other job": (
        """
        from goodput import schemas

        def decide(signal, state):
            return [schemas.Restart(job="someone-else")]
        """,
        "is not this job",
    ),
    "forbidden command": (
        """
        from goodput import schemas

        def decide(signal, state):
            return [schemas.InjectFault(job=state.job, node="n0", fault="xid")]
        """,
        "InjectFault is not a command a policy may issue",
    ),
    "syntax error": (
        """
        def decide(signal, state)
            return []
        """,
        "failed to load: SyntaxError at line 2",
    ),
    "no decide": (
        """
        def choose(signal, state):
            return []
        """,
        "defines no function decide",
    ),
    "import error": (
        """
        import goodput_no_such_module

        def decide(signal, state):
            return []
        """,
        "ModuleNotFoundError",
    ),
}


@pytest.mark.parametrize("case", sorted(BAD_SCRIPTS))
def test_a_bad_script_is_reported_and_the_builtin_decides(tmp_path: Path, case: str) -> None:
    body, expected = BAD_SCRIPTS[case]
    controller = Controller(write(tmp_path, body))
    outcome = controller.handle(job(spares=1), signal("crash", "n1"), at(1))
    assert expected in outcome.decision.error
    assert outcome.decision.policy == "builtin (fallback from policy)"
    assert outcome.decision.rule == "in-process-restart" and len(outcome.commands) == 1


def test_a_missing_script_file(tmp_path: Path) -> None:
    outcome = Controller(str(tmp_path / "gone.py")).handle(job(), signal("crash", "n1"), at(1))
    assert (
        "no such file" in outcome.decision.error and outcome.decision.rule == "in-process-restart"
    )


def test_a_script_that_overruns_its_time_limit(tmp_path: Path) -> None:
    release = tmp_path / "release"
    path = write(
        tmp_path,
        f"""
        import time
        from pathlib import Path

        def decide(signal, state):
            deadline = time.monotonic() + 30
            while not Path({str(release)!r}).exists() and time.monotonic() < deadline:
                time.sleep(0.01)
            return []
        """,
    )
    controller = Controller(path, ControllerSettings(policy_timeout_s=0.2))
    first = controller.handle(job(), signal("crash", "n1"), at(1))
    assert "did not return within 0.2 s" in first.decision.error
    assert first.decision.rule == "in-process-restart"
    # the runaway call still holds its thread: the next call does not pile up another
    second = controller.handle(first.state, signal("hang", "n2"), at(2))
    assert "still running" in second.decision.error
    release.touch()  # let the thread end


def test_example_restart_whole_job_waits_for_a_lost_node_then_restarts_everything() -> None:
    """The baseline the demo compares against: no spare, no resize, no straggler handling."""
    controller = Controller(str(EXAMPLES / "restart_whole_job.py"))
    state = job(active=2, spares=1, per_dp=1)
    crash = controller.handle(state, signal("crash", "n1"), at(1))
    assert crash.decision.rule == "baseline-restart-job"
    assert [type(c) for c in crash.commands] == [schemas.Restart]
    straggler = controller.handle(crash.state, signal("straggler", "n0"), at(2))
    assert straggler.decision.rule == "baseline-ignore-straggler" and not straggler.commands
    # a lost node: the spare is not used, every later fault waits for the repair
    lost = controller.handle(straggler.state, signal("degraded_host", "n1", "uncorrectable"), at(3))
    assert lost.decision.rule == "baseline-wait-for-repair" and not lost.commands
    assert lost.state.node("n1").down and lost.state.spares == ["s0"]
    survivor = controller.handle(lost.state, signal("crash", "n0"), at(4))
    assert survivor.decision.rule == "baseline-wait-for-repair"
    back = controller.handle(survivor.state, signal("node_returned", "n1", "info"), at(5))
    assert back.decision.rule == "baseline-restart-job" and not back.state.node("n1").down
    assert [type(c) for c in back.commands] == [schemas.Restart]
    assert back.state.active == ["n0", "n1"]
