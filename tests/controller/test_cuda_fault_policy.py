"""The built-in policy on a crash whose CUDA cause the rank's exit named (``Signal.rank_fault``):
that rank restarts cold, the survivors warm; an OOM of every rank restarts the job, blaming no
node however often it repeats."""

from __future__ import annotations

from goodput import schemas
from goodput.supervisor.control.engine import Controller

from .helpers import at, job, signal


def test_a_poisoned_context_restarts_that_rank_cold_and_the_survivors_in_process() -> None:
    outcome = Controller().handle(job(), signal("crash", "n2", rank_fault="cuda-context"), at(1))
    assert outcome.decision is not None and outcome.decision.rule == "in-process-restart"
    assert [type(c) for c in outcome.commands] == [schemas.RestartInProcess]
    assert "CUDA context poisoned: it left at once and restarts cold" in outcome.decision.reason


def test_one_nodes_oom_restarts_in_place_saying_so() -> None:
    outcome = Controller().handle(job(), signal("crash", "n2", rank_fault="cuda-oom"), at(1))
    assert outcome.decision is not None and outcome.decision.rule == "in-process-restart"
    assert "out of GPU memory after its warm retry" in outcome.decision.reason
    assert outcome.state.node("n2").failures == 1  # a node that runs out alone is suspect


def test_an_oom_of_every_rank_restarts_the_job_and_never_evicts_a_node() -> None:
    controller, state = Controller(), job(active=6, spares=1)
    rules = []
    for i in range(6):
        outcome = controller.handle(
            state, signal("crash", "", rank_fault="cuda-oom"), at(1 + 1000 * i)
        )
        state = outcome.state
        assert outcome.decision is not None
        rules.append(outcome.decision.rule)
        # restarts, until the crash-loop guard backs off or gives up: never a node dropped
        assert all(isinstance(c, schemas.Restart | schemas.Stop) for c in outcome.commands)
    assert rules[0] == "job-oom" and set(rules) <= {
        "job-oom",
        "crash-loop-backoff",
        "crash-loop-give-up",
    }
    assert state.active == [f"n{i}" for i in range(6)] and state.spares == ["s0"]
    assert all(n.failures == 0 for n in state.nodes)
    first = Controller().handle(job(), signal("crash", "", rank_fault="cuda-oom"), at(1))
    assert first.decision is not None and "no node blamed" in first.decision.reason
    assert [type(c) for c in first.commands] == [schemas.Restart]
