"""The built-in policy and what the actuator's backend declares it can do (``JobStatus.
capabilities``): a rung the backend cannot run is skipped with the reason, never sent to be
refused. Pure functions: the controller's fold and decision, no bus."""

from __future__ import annotations

import itertools

import msgspec

from goodput import schemas
from goodput.supervisor.control.engine import Controller
from goodput.supervisor.jobstate.folds import observe_status
from goodput.supervisor.jobstate.model import JobState

from .helpers import JOB, at, job, signal, with_standbys

EVERYTHING = schemas.BackendCapabilities(
    backend="test",
    in_process_restart=True,
    standbys="all",
    gpu_reset=True,
    hot_swap=True,
    scale=True,
)


def declared(state: JobState, ready: list[str] | None = None, **lacks: object) -> JobState:
    """``state`` once a JobStatus declared ``EVERYTHING`` but ``lacks``, with a ready standby on
    each of ``ready``."""
    capabilities = msgspec.structs.replace(EVERYTHING, **lacks)
    return with_standbys(state, ready or [], capabilities=capabilities)


def decide(state: JobState, sig: schemas.Signal):
    outcome = Controller().handle(state, sig, at(1))
    assert outcome.decision is not None and outcome.decision.error == ""
    return outcome.decision, outcome.commands


def xid(node: str, code: int = 48) -> schemas.Signal:
    gpu = schemas.GpuHealth(index=0, uuid="GPU-0", xid_errors=[code])
    return signal(
        "degraded_host", node, "uncorrectable", host_faults=[f"gpu_xid:{code}"], gpus=[gpu]
    )


def test_the_declaration_is_folded_into_the_job_state_and_kept_by_a_silent_status() -> None:
    state = declared(job(), gpu_reset=False)
    assert state.backend is not None and state.backend.gpu_reset is False
    silent = schemas.JobStatus(
        job=JOB, state="running", attempt=2, world_size=48, procs_per_node=8,
        active_nodes=state.active,
    )  # fmt: skip
    assert observe_status(state, silent, at(2)).backend == state.backend


def test_a_backend_that_cannot_restart_in_process_gets_the_next_rung_with_the_reason() -> None:
    decision, commands = decide(declared(job(), in_process_restart=False), signal("crash", "n1"))
    assert decision.rule == "in-job-restart" and [type(c) for c in commands] == [schemas.Restart]
    assert "the test backend cannot restart ranks in process" in decision.reason
    warm = declared(job(), ["n0", "n1"], in_process_restart=False)
    decision, commands = decide(warm, signal("hang", "n1"))
    assert decision.rule == "standby-restart" and commands[0].standbys


def test_a_backend_that_cannot_reset_gpus_has_the_node_replaced() -> None:
    decision, commands = decide(declared(job(spares=1), gpu_reset=False), xid("n3"))
    assert decision.rule == "hot-swap" and isinstance(commands[0], schemas.HotSwap)
    assert "reset-correctable, but the test backend cannot reset GPUs" in decision.reason
    # one that can resets them (the rung above)
    assert decide(declared(job(spares=1)), xid("n3"))[0].rule == "gpu-reset"


def test_a_backend_that_cannot_hot_swap_scales_down_though_a_spare_is_free() -> None:
    decision, commands = decide(
        declared(job(spares=1), hot_swap=False), signal("degraded_host", "n3", "uncorrectable")
    )
    assert decision.rule == "scale-down" and isinstance(commands[0], schemas.ScaleTo)
    assert "a spare is free but the test backend cannot hot-swap nodes" in decision.reason


def test_a_backend_that_cannot_scale_stops_keeps_spares_and_tolerates_stragglers() -> None:
    fixed = declared(job(), scale=False)
    decision, commands = decide(fixed, signal("degraded_host", "n3", "uncorrectable"))
    assert decision.rule == "no-capacity" and isinstance(commands[0], schemas.Stop)
    assert "cannot change the job's size" in commands[0].reason
    decision, commands = decide(fixed, signal("straggler", "n3"))
    assert decision.rule == "straggler-tolerated" and commands == []
    assert "cannot change the job's size" in decision.reason
    shrunk = declared(job(active=4, spares=2), scale=False)
    shrunk = msgspec.structs.replace(shrunk, target_dp_replicas=3)
    decision, commands = decide(shrunk, signal("node_returned", "s0", "info"))
    assert decision.rule == "spare-kept" and commands == []


def test_standbys_a_backend_keeps_none_of_are_not_asked_for() -> None:
    state = declared(job(active=2, per_dp=1), ["n0", "n1"], standbys="none")
    decision, commands = decide(state, signal("missed_heartbeat", "n1"))
    assert decision.rule == "in-job-restart" and not commands[0].standbys


#: the capability each command (or its flag) needs from the backend
def needs(command: schemas.Command) -> set[str]:
    required = set()
    match command:
        case schemas.RestartInProcess():
            required.add("in_process_restart")
        case schemas.Restart(reset_gpus=reset) if reset:
            required.add("gpu_reset")
        case schemas.HotSwap():
            required.add("hot_swap")
        case schemas.ScaleTo():
            required.add("scale")
    if getattr(command, "standbys", False):
        required.add("standbys")
    return required


SIGNALS = [
    signal("crash", "n1"),
    signal("hang", "n1"),
    signal("missed_heartbeat", "n1"),
    signal("degraded_host", "n1", "uncorrectable"),
    xid("n1"),
    signal("straggler", "n1"),
    signal("node_returned", "s0", "info"),
    signal("job_down"),
]


#: every combination of capabilities a backend may lack
LACKING = [
    set(combo)
    for size in range(6)
    for combo in itertools.combinations(
        ["in_process_restart", "standbys", "gpu_reset", "hot_swap", "scale"], size
    )
]


def test_no_signal_gets_a_command_its_backend_declared_it_cannot_run() -> None:
    for lacking in LACKING:
        lacks = {name: ("none" if name == "standbys" else False) for name in lacking}
        for spares in (0, 1):
            state = declared(job(active=4, spares=spares), ["n0", "n1", "n2", "n3", "s0"], **lacks)
            state = msgspec.structs.replace(state, target_dp_replicas=3)
            for sig in SIGNALS:
                decision, commands = decide(state, sig)
                for command in commands:
                    assert not needs(command) & lacking, (lacking, decision.rule, decision.reason)
