"""The controller's logic: a signal and the job state in, a decision, commands and a new state out.

Pure apart from running the policy script, where the caller chooses: in this process (threads
with a time limit, :class:`ScriptPolicy`: the simulator) or anywhere keeping its contract
(:class:`PolicyScript`; the controller service's worker process); time is passed in. The
service publishes the decision and the commands and stores the returned state; a signal
already handled (its id is in the state) yields nothing, so a standby controller or a
redelivered signal never acts twice. Decision and command ids are derived from the signal id,
so even a decision taken twice by two controllers carries the same command ids, which the
bus and the executors deduplicate.

Every decision ends in an executed action or a recorded refusal: the actuator answers each
command with an ActionResult (:meth:`Controller.settle`); a refused remediation is recorded,
its prediction dropped, and the signal decided once more on what the actuator reported. One
fault gets one remediation: a correctable failure observed before a restart was issued is
covered by it (every remediation relaunches the whole worker group): the same incident.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import msgspec
import xxhash

from goodput import schemas
from goodput.supervisor.control import checkpoint_interval, crash_loop
from goodput.supervisor.control.script_policy import PolicyScript, ScriptPolicy
from goodput.supervisor.jobstate.folds import (
    FAILURE_KINDS,
    apply_command,
    expire_pending,
    observe_result,
    observe_signal,
)
from goodput.supervisor.jobstate.model import DeferredSignal, Remediation
from goodput.supervisor.policy import JobState, Plan, PolicyError, default_policy, validate

BUILTIN = "builtin"


class ControllerSettings(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    policy_timeout_s: float = 2.0
    #: the policy script's import must finish in this long, or the controller refuses it
    policy_load_timeout_s: float = 20.0
    #: a command the actuator has not answered in this long is taken as refused
    pending_timeout_s: float = 600.0
    crash_loop: crash_loop.CrashLoopLimits = msgspec.field(
        default_factory=crash_loop.CrashLoopLimits
    )
    checkpoint_interval: checkpoint_interval.IntervalSettings = msgspec.field(
        default_factory=checkpoint_interval.IntervalSettings
    )

    def __post_init__(self) -> None:
        for name in ("policy_timeout_s", "policy_load_timeout_s"):
            if not 0 < getattr(self, name) < float("inf"):
                raise ValueError(f"{name} must be a positive number of seconds")


@dataclass
class Outcome:
    """What handling one signal produced; ``decision`` is None when there was nothing to do."""

    state: JobState
    decision: schemas.Decision | None = None
    commands: list[schemas.Command] = field(default_factory=list)


class Controller:
    """Decides remediations with a user's policy script, or the built-in policy."""

    def __init__(
        self,
        policy_path: str | None = None,
        settings: ControllerSettings | None = None,
        *,
        script: PolicyScript | None = None,
    ):
        """``policy_path`` is run in this process; a ``script`` given instead runs as it runs."""
        self.settings = settings or ControllerSettings()
        self.script: PolicyScript | None = script
        if script is None and policy_path:
            self.script = ScriptPolicy(
                policy_path,
                timeout_s=self.settings.policy_timeout_s,
                load_timeout_s=self.settings.policy_load_timeout_s,
            )

    @property
    def policy_name(self) -> str:
        return self.script.name if self.script else BUILTIN

    def handle(self, state: JobState, signal: schemas.Signal, now: int) -> Outcome:
        """Decide what to do about ``signal``; a signal handled before yields nothing."""
        if signal.signal_id in state.handled_signal_ids:
            return Outcome(state)
        return self._decide(observe_signal(state, signal, now), signal, now, tag="first")

    def settle(self, state: JobState, result: schemas.ActionResult, now: int) -> Outcome:
        """Fold the actuator's answer; a refused remediation's signal is decided once more.

        Ranks started again (or restarted in process) checkpoint at the job's launch interval:
        a relaunch that succeeded gets the tuned interval sent once more."""
        pending = next(
            (p for p in state.pending if p.command.command_id == result.command_id), None
        )
        state = observe_result(state, result, now)
        if result.ok and pending is not None and pending.command.restarts_group:
            return self._resend_interval(state, result, now)
        if (
            pending is None
            or result.ok
            or pending.signal is None
            or pending.redecided
            or not pending.command.restarts_group
        ):
            return Outcome(state)
        return self._decide(
            state,
            pending.signal,
            now,
            tag=f"after-refusal|{result.command_id}",
            note=f"{result.action} refused ({result.detail}); decided again: ",
        )

    def due(self, state: JobState, now: int) -> list[Outcome]:
        """Decide the signals whose crash-loop back-off has been served by ``now``.

        Commands the actuator left unanswered past ``pending_timeout_s`` become refusals.
        """
        expired = expire_pending(state, now, self.settings.pending_timeout_s)
        ready = [d for d in expired.deferred if d.until_ts <= now]
        if not ready:
            return [Outcome(expired)] if expired is not state else []
        state = expired
        state = msgspec.structs.replace(
            state, deferred=[d for d in state.deferred if d.until_ts > now]
        )
        outcomes = []
        for deferred in ready:
            outcome = self._decide(state, deferred.signal, now, tag="retry")
            outcomes.append(outcome)
            state = outcome.state
        return outcomes

    def recommend_checkpoint_interval(self, state: JobState, now: int) -> Outcome:
        """A ``SetCheckpointInterval`` when Young's interval moved enough, as a decision."""
        command = checkpoint_interval.recommend(state, now, self.settings.checkpoint_interval)
        if command is None:
            return Outcome(state)
        return self._interval_decided(state, command, _id(state.job, "interval", str(now)), now)

    # ---- internals ---------------------------------------------------------------------------

    def _resend_interval(self, state: JobState, result: schemas.ActionResult, now: int) -> Outcome:
        every = state.checkpoint_interval_steps
        if not self.settings.checkpoint_interval.enabled or every <= 0:
            return Outcome(state)
        decision_id = _id(result.command_id, "interval")
        reason = (
            f"{result.action} started ranks again at the launch interval: every {every} steps "
            "once more"
        )
        command = schemas.SetCheckpointInterval(
            job=state.job, ts=now, every_steps=every, rationale=reason
        )
        return self._interval_decided(state, command, decision_id, now)

    def _interval_decided(
        self,
        state: JobState,
        command: schemas.SetCheckpointInterval,
        decision_id: str,
        now: int,
    ) -> Outcome:
        """``command`` as the one command of a ``checkpoint-interval`` decision, its rationale
        the decision's reason."""
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

    def _decide(
        self, state: JobState, signal: schemas.Signal, now: int, *, tag: str, note: str = ""
    ) -> Outcome:
        decision_id = _id(signal.signal_id, tag)
        retry, redecided = tag == "retry", bool(note)
        policy, error = self.policy_name, ""
        returning = self._return_node(state, signal, now, decision_id)
        if returning is not None:
            # the actuator owns membership: a repaired node is a spare once it says so
            state = apply_command(state, returning, now)
        plan = self._quick_answer(state, signal, now)
        if plan is None:
            plan, error = self._run_policy(signal, state)
            if error:
                policy = f"{BUILTIN} (fallback from {self.policy_name})"
        if signal.signal in FAILURE_KINDS and any(c.restarts_group for c in plan.commands):
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
            state = apply_command(state, command, now, signal=signal, redecided=redecided)
        if returning is not None:
            commands.insert(0, returning)
            note = f"{signal.node} returned to the spare pool; {note}"
        decision = schemas.Decision(
            job=state.job,
            ts=now,
            decision_id=decision_id,
            signal_id=signal.signal_id,
            policy=policy,
            rule=plan.rule,
            reason=f"{signal.signal} on {signal.node or 'the job'}: {note}{plan.reason}",
            command_ids=[c.command_id for c in commands],
            error=error,
        )
        return Outcome(state, decision, commands)

    @staticmethod
    def _return_node(
        state: JobState, signal: schemas.Signal, now: int, decision_id: str
    ) -> schemas.ReturnNode | None:
        """A ``ReturnNode`` for a repaired node the actuator still counts as failed."""
        if signal.signal != "node_returned" or state.role_of(signal.node) != "failed":
            return None
        return schemas.ReturnNode(
            job=state.job,
            ts=now,
            command_id=_id(decision_id, "return"),
            decision_id=decision_id,
            node=signal.node,
            reason=f"{signal.node} repaired: {signal.detail}",
        )

    def _quick_answer(self, state: JobState, signal: schemas.Signal, now: int) -> Plan | None:
        """Cases no policy is asked about: a stopped job, a signal about a node not in use, a
        failure the restart under way already covers."""
        if state.stopped:
            return Plan([], "stopped", f"the job was stopped ({state.stopped})")
        covering = _covering_restart(state, signal)
        if covering is not None:
            return Plan(
                [],
                "same-incident",
                f"observed before the {covering.action} issued "
                f"{(now - covering.ts) / 1e9:.1f} s ago, which relaunches every rank",
            )
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


def _covering_restart(state: JobState, signal: schemas.Signal) -> Remediation | None:
    """The latest restart that already remedies ``signal``, if any.

    Only a correctable failure (or the whole job down) observed before that restart was issued
    is covered: a failure observed later may be the new attempt's own, even while the restart's
    result is still on its way. An uncorrectable node fault needs the node replaced whatever
    restarted. Signals without an observation time are never covered.
    """
    correctable = signal.severity == "correctable" or signal.signal == "job_down"
    if signal.signal not in FAILURE_KINDS or not correctable or not signal.observed_ts:
        return None
    if not state.restarts:
        return None
    latest = state.restarts[-1]
    return latest if signal.observed_ts <= latest.ts else None


def _id(*parts: str) -> str:
    return xxhash.xxh3_128_hexdigest("|".join(parts).encode())
