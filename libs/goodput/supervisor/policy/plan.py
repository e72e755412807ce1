"""What a policy returns, and the rules its answer must pass before any command is sent.

A policy is ``decide(signal, state) -> Plan | list[Command]``. Its commands are checked in order
against the state as the earlier ones leave it, with the membership rules the actuator executes
(:mod:`goodput.supervisor.membership`), so a plan cannot swap in the same spare twice, scale onto a node it
just dropped, or ask for anything the actuator would refuse as it stands.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TypeGuard

import msgspec

from goodput import schemas
from goodput.schemas import commands
from goodput.supervisor.jobstate.folds import with_pending
from goodput.supervisor.jobstate.model import JobState
from goodput.supervisor.membership import MembershipError

#: the commands a policy may issue: those that declare it (``Command.issuable``)
ALLOWED_COMMANDS = tuple(t for t in schemas.COMMAND_TYPES if t.issuable)
MAX_COMMANDS = 16


@dataclass
class Plan:
    """What a policy chose: the commands, the rule that chose them and why (for people)."""

    commands: list[schemas.Command] = field(default_factory=list)
    rule: str = ""
    reason: str = ""


Decide = Callable[[schemas.Signal, JobState], "Plan | Sequence[schemas.Command]"]


class PolicyError(Exception):
    """The policy could not produce a valid plan; the message says what went wrong."""


def validate(value: object, state: JobState, *, default_rule: str) -> Plan:
    """Check a policy's return value strictly against ``state``; raises :class:`PolicyError`.

    A ``HotSwap`` with no spare named gets the first free spare.
    """
    if isinstance(value, Plan):
        plan = value
        if not isinstance(plan.rule, str) or not isinstance(plan.reason, str):
            raise PolicyError("Plan.rule and Plan.reason must be strings")
        if not isinstance(plan.commands, list | tuple):
            raise PolicyError(f"Plan.commands must be a list, not {type(plan.commands).__name__}")
    elif isinstance(value, list | tuple):
        plan = Plan(commands=list(value))
    else:
        raise PolicyError(
            f"decide() must return a Plan or a list of commands, not {type(value).__name__}"
        )
    if len(plan.commands) > MAX_COMMANDS:
        raise PolicyError(f"{len(plan.commands)} commands; at most {MAX_COMMANDS} per decision")
    checked: list[schemas.Command] = []
    scratch = state
    for index, command in enumerate(plan.commands):
        try:
            command = _check(command, scratch)
        except PolicyError as exc:
            raise PolicyError(f"command {index}: {exc}") from None
        checked.append(command)
        scratch = with_pending(scratch, command, now=0)
    kinds = ", ".join(schemas.kind_of(type(c)) for c in checked) or "nothing"
    return Plan(
        commands=checked,
        rule=plan.rule or default_rule,
        reason=plan.reason or f"the policy chose {kinds}",
    )


def _issuable(command: object) -> TypeGuard[schemas.Command]:
    """A registered command type that declares a policy may issue it (read from the registry
    as it stands, not from ``ALLOWED_COMMANDS``, its import-time copy)."""
    return (
        isinstance(command, schemas.Command)
        and command.issuable
        and type(command) in commands.COMMAND_TYPES
    )


def _check(command: object, state: JobState) -> schemas.Command:
    if not _issuable(command):
        allowed = ", ".join(t.__name__ for t in commands.COMMAND_TYPES if t.issuable)
        raise PolicyError(
            f"{type(command).__name__} is not a command a policy may issue ({allowed})"
        )
    try:
        command = msgspec.convert(msgspec.to_builtins(command), type(command))
    except (msgspec.ValidationError, TypeError) as exc:
        raise PolicyError(f"malformed {type(command).__name__}: {exc}") from None
    if command.job != state.job:
        raise PolicyError(f"job {command.job!r} is not this job ({state.job!r})")
    match command:
        case schemas.Restart(nodes=nodes, reset_gpus=reset) if reset:
            _known(nodes, state)
            idle = [n for n in reset if state.role_of(n) != "active"]
            if idle:
                raise PolicyError(f"GPU reset on node(s) not in the job: {', '.join(idle)}")
        case schemas.Restart(nodes=nodes) | schemas.Stop(nodes=nodes):
            _known(nodes, state)
        case schemas.HotSwap() if not command.spare_node and state.spares:
            command = msgspec.structs.replace(command, spare_node=state.spares[0])
        case schemas.ScaleTo():
            _check_scale(command, state)
        case schemas.SetCheckpointInterval(every_steps=steps) if steps < 1:
            raise PolicyError(f"checkpoint interval of {steps} steps")
    try:
        state.membership().after(command)
    except MembershipError as exc:
        raise PolicyError(str(exc)) from None
    return command


def _known(nodes: Sequence[str], state: JobState) -> None:
    unknown = [n for n in nodes if state.node(n) is None]
    if unknown:
        raise PolicyError(f"unknown node(s) {', '.join(map(repr, unknown))}")


def _check_scale(command: schemas.ScaleTo, state: JobState) -> None:
    _known([*command.nodes, *command.drop_nodes], state)
    replicas, per_dp = command.num_dp_replicas, state.num_nodes_per_dp
    if replicas < 1:
        raise PolicyError(f"scale to {replicas} replicas")
    if len(set(command.nodes)) != len(command.nodes):
        raise PolicyError("a node is listed twice")
    if len(command.nodes) != replicas * per_dp:
        raise PolicyError(
            f"{replicas} replicas × {per_dp} nodes need {replicas * per_dp} nodes, "
            f"{len(command.nodes)} given"
        )
    unusable = [n for n in command.nodes if state.role_of(n) == "failed" or n in command.drop_nodes]
    if unusable:
        raise PolicyError(f"cannot run on failed or dropped node(s) {', '.join(unusable)}")
