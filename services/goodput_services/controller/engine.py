"""The controller's logic: a signal and the job state in, a decision, commands and a new state out.

Pure apart from running the policy script (in a thread, with a time limit); time is passed
in. The service publishes the decision and the commands and stores the returned state; a
signal already handled (its id is in the state) yields nothing, so a standby controller or a
redelivered signal never acts twice. Decision and command ids are derived from the signal id,
so even a decision taken twice by two controllers carries the same command ids, which the
bus and the executors deduplicate.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import msgspec
import xxhash

from goodput import schemas
from goodput_services.controller import checkpoint_interval, crash_loop
from goodput_services.controller.builtin_policies import default_policy
from goodput_services.controller.policy import Plan, PolicyError, ScriptPolicy, validate
from goodput_services.controller.state import (
    FAILURE_KINDS,
    RESTARTING,
    DeferredSignal,
    JobState,
    apply_command,
    observe_signal,
)

BUILTIN = "builtin"


class ControllerSettings(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    policy_timeout_s: float = 2.0
    crash_loop: crash_loop.CrashLoopLimits = msgspec.field(
        default_factory=crash_loop.CrashLoopLimits
    )
    checkpoint_interval: checkpoint_interval.IntervalSettings = msgspec.field(
        default_factory=checkpoint_interval.IntervalSettings
    )


@dataclass
class Outcome:
    """What handling one signal produced; ``decision`` is None when there was nothing to do."""

    state: JobState
    decision: schemas.Decision | None = None
    commands: list[schemas.Command] = field(default_factory=list)


class Controller:
    """Decides remediations with a user's policy script, or the built-in policy."""

    def __init__(self, policy_path: str | None = None, settings: ControllerSettings | None = None):
        self.settings = settings or ControllerSettings()
        self.script = (
            ScriptPolicy(policy_path, timeout_s=self.settings.policy_timeout_s)
            if policy_path
            else None
        )

    @property
    def policy_name(self) -> str:
        return self.script.name if self.script else BUILTIN

    def handle(self, state: JobState, signal: schemas.Signal, now: int) -> Outcome:
        """Decide what to do about ``signal``; a signal handled before yields nothing."""
        if signal.signal_id in state.handled_signal_ids:
            return Outcome(state)
        return self._decide(observe_signal(state, signal, now), signal, now, retry=False)

    def due(self, state: JobState, now: int) -> list[Outcome]:
        """Decide the signals whose crash-loop back-off has been served by ``now``."""
        ready = [d for d in state.deferred if d.until_ts <= now]
        if not ready:
            return []
        state = msgspec.structs.replace(
            state, deferred=[d for d in state.deferred if d.until_ts > now]
        )
        outcomes = []
        for deferred in ready:
            outcome = self._decide(state, deferred.signal, now, retry=True)
            outcomes.append(outcome)
            state = outcome.state
        return outcomes

    def recommend_checkpoint_interval(self, state: JobState, now: int) -> Outcome:
        """A ``SetCheckpointInterval`` when Young's interval moved enough, as a decision."""
        command = checkpoint_interval.recommend(state, now, self.settings.checkpoint_interval)
        if command is None:
            return Outcome(state)
        decision_id = _id(state.job, "interval", str(now))
        command = msgspec.structs.replace(
            command,
            command_id=_id(decision_id, "0"),
            decision_id=decision_id,
            reason=command.rationale,
        )
        decision = schemas.Decision(
            job=state.job,
            ts=now,
            decision_id=decision_id,
            signal_id="",
            policy=BUILTIN,
            rule="checkpoint-interval",
            reason=command.rationale,
            command_ids=[command.command_id],
        )
        return Outcome(apply_command(state, command, now), decision, [command])

    # ---- internals ---------------------------------------------------------------------------

    def _decide(self, state: JobState, signal: schemas.Signal, now: int, *, retry: bool) -> Outcome:
        decision_id = _id(signal.signal_id, "retry" if retry else "first")
        policy, error = self.policy_name, ""
        plan = self._quick_answer(state, signal)
        if plan is None:
            plan, error = self._run_policy(signal, state)
            if error:
                policy = f"{BUILTIN} (fallback from {self.policy_name})"
        if signal.signal in FAILURE_KINDS and any(isinstance(c, RESTARTING) for c in plan.commands):
            plan, state = self._guard_crash_loop(plan, state, signal, now, retry=retry)
        commands = [
            msgspec.structs.replace(
                command,
                job=state.job,
                ts=now,
                command_id=_id(decision_id, str(index)),
                decision_id=decision_id,
                reason=command.reason or plan.reason,
            )
            for index, command in enumerate(plan.commands)
        ]
        for command in commands:
            state = apply_command(state, command, now, cause=signal.signal)
        decision = schemas.Decision(
            job=state.job,
            ts=now,
            decision_id=decision_id,
            signal_id=signal.signal_id,
            policy=policy,
            rule=plan.rule,
            reason=f"{signal.signal} on {signal.node or 'the job'}: {plan.reason}",
            command_ids=[c.command_id for c in commands],
            error=error,
        )
        return Outcome(state, decision, commands)

    def _quick_answer(self, state: JobState, signal: schemas.Signal) -> Plan | None:
        """Cases no policy is asked about: a stopped job, a signal about a node not in use."""
        if state.stopped:
            return Plan([], "stopped", f"the job was stopped ({state.stopped})")
        if signal.signal == "node_returned" or not signal.node:
            return None
        role = state.role_of(signal.node)
        if role == "active":
            return None
        if role is None:
            return Plan([], "unknown-node", f"{signal.node} is not a node of this job")
        return Plan([], f"{role}-node", f"{signal.node} is a {role} node, not in the job now")

    def _run_policy(self, signal: schemas.Signal, state: JobState) -> tuple[Plan, str]:
        if self.script is not None:
            try:
                return self.script.decide(signal, state), ""
            except PolicyError as exc:
                error = str(exc)
        else:
            error = ""
        return validate(default_policy(signal, state), state, default_rule=BUILTIN), error

    def _guard_crash_loop(
        self, plan: Plan, state: JobState, signal: schemas.Signal, now: int, *, retry: bool
    ) -> tuple[Plan, JobState]:
        verdict = crash_loop.judge(state, now, self.settings.crash_loop, retry=retry)
        state = msgspec.structs.replace(state, backoff_level=verdict.level)
        if verdict.action == "go":
            return plan, state
        if verdict.action == "defer":
            deferred = DeferredSignal(signal=signal, until_ts=verdict.until_ts)
            state = msgspec.structs.replace(state, deferred=[*state.deferred, deferred])
            return Plan([], "crash-loop-backoff", f"{verdict.reason} (then: {plan.rule})"), state
        stop = schemas.Stop(job=state.job, reason=verdict.reason)
        return Plan([stop], "crash-loop-give-up", verdict.reason), state


def _id(*parts: str) -> str:
    return xxhash.xxh3_128_hexdigest("|".join(parts).encode())
