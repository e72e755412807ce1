"""Remediation policies: the interface, loading a user's script, and strict validation.

A policy is a Python file defining::

    def decide(signal: goodput.schemas.Signal, state: JobState) -> Plan | list[Command]

It returns the commands to issue, chosen from :data:`ALLOWED_COMMANDS` and built with
``job=state.job`` (ids, timestamps and the decision link are filled in by the controller).
Returning a :class:`Plan` adds the rule name and a sentence saying why, which end up in the
published ``Decision``; a bare list is reported as rule ``"script"``. Returning ``[]`` means
"do nothing". A script may call the built-in policy (``builtin_policies.default_policy``) and
change only what it wants. It gets copies of the signal and the state: changing them changes
nothing.

The script runs in a thread of the controller with a time limit. Python cannot kill a
thread, so a script that never returns keeps its thread (a daemon) busy for good; until it
returns, further calls fail fast (and the built-in policy decides) rather than pile up more
threads. A script that fails to load, raises, overruns, or returns anything invalid is
reported in ``Decision.error`` and the built-in policy decides instead.
"""

from __future__ import annotations

import importlib.util
import sys
import threading
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

import msgspec

from goodput import schemas
from goodput_services.controller.state import JobState, apply_command

ALLOWED_COMMANDS = (
    schemas.Restart,
    schemas.HotSwap,
    schemas.ScaleTo,
    schemas.Stop,
    schemas.CheckpointNow,
    schemas.SetCheckpointInterval,
)
MAX_COMMANDS = 16
S = TypeVar("S", bound=msgspec.Struct)


@dataclass
class Plan:
    """What a policy chose: the commands, the rule that chose them and why (for people)."""

    commands: list[schemas.Command] = field(default_factory=list)
    rule: str = ""
    reason: str = ""


Decide = Callable[[schemas.Signal, JobState], "Plan | Sequence[schemas.Command]"]


class PolicyError(Exception):
    """The policy could not produce a valid plan; the message says what went wrong."""


class ScriptPolicy:
    """A user's policy file, loaded once by path and run with a time limit."""

    def __init__(self, path: str | Path, timeout_s: float = 2.0):
        self.path = Path(path)
        self.name = self.path.stem
        self.timeout_s = timeout_s
        self.load_error = ""
        self._decide: Decide | None = None
        self._running: threading.Thread | None = None
        try:
            self._decide = _load(self.path)
        except Exception as exc:
            self.load_error = f"policy script {self.path} failed to load: {_describe(exc)}"

    def decide(self, signal: schemas.Signal, state: JobState) -> Plan:
        """The script's validated plan; raises :class:`PolicyError` on any problem."""
        if self._decide is None:
            raise PolicyError(self.load_error)
        if self._running is not None and self._running.is_alive():
            raise PolicyError(
                f"policy script {self.name}: an earlier call is still running "
                f"(past its {self.timeout_s} s limit); not called again"
            )
        outcome: dict[str, object] = {}
        decide = self._decide

        def call() -> None:
            try:
                outcome["value"] = decide(_copy(signal), _copy(state))
            except BaseException as exc:
                outcome["error"] = exc

        thread = threading.Thread(target=call, name=f"policy-{self.name}", daemon=True)
        self._running = thread
        thread.start()
        thread.join(self.timeout_s)
        if thread.is_alive():
            raise PolicyError(f"policy script {self.name} did not return within {self.timeout_s} s")
        if "error" in outcome:
            raise PolicyError(
                f"policy script {self.name} raised {_describe(outcome['error'])}"  # type: ignore[arg-type]
            )
        return validate(outcome.get("value"), state, default_rule="script")


def _load(path: Path) -> Decide:
    if not path.is_file():
        raise FileNotFoundError(f"no such file: {path}")
    module_name = f"goodput_policy_{abs(hash(str(path.resolve())))}"
    spec = importlib.util.spec_from_file_location(module_name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {path} as a Python module")
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[module_name]
        raise
    decide = getattr(module, "decide", None)
    if not callable(decide):
        raise AttributeError(f"{path} defines no function decide(signal, state)")
    return decide


def _copy(value: S) -> S:
    return msgspec.msgpack.decode(msgspec.msgpack.encode(value), type=type(value))


def _describe(exc: BaseException) -> str:
    where = traceback.extract_tb(exc.__traceback__)
    line = f" at line {where[-1].lineno}" if where else ""
    if isinstance(exc, SyntaxError):
        line = f" at line {exc.lineno}"
    return f"{type(exc).__name__}{line}: {exc}"


def validate(value: object, state: JobState, *, default_rule: str) -> Plan:
    """Check a policy's return value strictly against ``state``; raises :class:`PolicyError`.

    Commands are checked in order against the state as the earlier ones leave it, so a plan
    cannot swap in the same spare twice or scale onto a node it just dropped. A ``HotSwap``
    with no spare named gets the first free spare.
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
        scratch = apply_command(scratch, command, now=0)
    kinds = ", ".join(schemas.kind_of(type(c)) for c in checked) or "nothing"
    return Plan(
        commands=checked,
        rule=plan.rule or default_rule,
        reason=plan.reason or f"the policy chose {kinds}",
    )


def _check(command: object, state: JobState) -> schemas.Command:
    if not isinstance(command, ALLOWED_COMMANDS):
        allowed = ", ".join(c.__name__ for c in ALLOWED_COMMANDS)
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
        case schemas.Restart(nodes=nodes) | schemas.Stop(nodes=nodes):
            _known(nodes, state)
        case schemas.HotSwap():
            if state.role_of(command.failed_node) != "active":
                raise PolicyError(f"hot swap of {command.failed_node!r}, which is not active")
            if not command.spare_node:
                if not state.spares:
                    raise PolicyError("hot swap without a spare, and none is free")
                command = msgspec.structs.replace(command, spare_node=state.spares[0])
            elif state.role_of(command.spare_node) != "spare":
                raise PolicyError(f"{command.spare_node!r} is not a free spare")
        case schemas.ScaleTo():
            _check_scale(command, state)
        case schemas.SetCheckpointInterval(every_steps=steps) if steps < 1:
            raise PolicyError(f"checkpoint interval of {steps} steps")
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
