"""Loading and running a user's policy script in this process, time-limited; the API is :mod:`goodput.supervisor.policy`.

This is how the simulator (and any in-process use of the engine) runs a script; the controller
service runs it in a worker process instead (``goodput_services.controller.policy_process``),
where ``os._exit`` or a hang costs one decision, with :func:`load_script` and
:func:`describe_failure` from here. In this process the script is imported, and later called,
in daemon threads with a time limit: the caller's own work (a simulation) must not stop for a
script that never returns. Python cannot kill a thread, so such a script keeps its thread busy
for good: an import that overruns is a load error; a call that overruns makes further calls
fail fast (and the built-in policy decides) rather than pile up more threads. Whatever the
script raises in those threads is its own doing, ``SystemExit`` and ``KeyboardInterrupt``
included (a real Ctrl-C reaches the main thread), so every ``BaseException`` is caught and
described in one line. A script that fails to load, raises, overruns, or returns anything that
does not pass :func:`goodput.supervisor.policy.validate` is reported in ``Decision.error`` and
the built-in policy decides instead.
"""

from __future__ import annotations

import importlib.util
import sys
import threading
import traceback
from pathlib import Path
from typing import Generic, Protocol, TypedDict, TypeVar

import msgspec

from goodput import schemas
from goodput.supervisor.policy import JobState, Plan, PolicyError, validate
from goodput.supervisor.policy.plan import Decide

S = TypeVar("S", bound=msgspec.Struct)
T = TypeVar("T")


class _Outcome(TypedDict, Generic[T], total=False):
    """What a script's thread ended with: its value or what it raised (neither: still running)."""

    value: T
    error: BaseException


class PolicyScript(Protocol):
    """What the engine asks of a user's script, wherever it runs (this process or a worker)."""

    #: the script's file name without ``.py``: the ``Decision.policy`` it decides as
    name: str
    #: why the script did not load ("": it did), one line
    load_error: str

    def decide(self, signal: schemas.Signal, state: JobState) -> Plan:
        """The script's validated plan; raises :class:`PolicyError` on any problem."""
        ...


class ScriptPolicy:
    """A user's policy file, loaded once by path and run with a time limit."""

    def __init__(self, path: str | Path, timeout_s: float = 2.0, load_timeout_s: float = 20.0):
        self.path = Path(path)
        self.name = self.path.stem
        self.timeout_s = timeout_s
        self.load_error = ""
        self._decide: Decide | None = None
        self._running: threading.Thread | None = None
        outcome: _Outcome[Decide] = {}

        def load() -> None:
            try:
                outcome["value"] = load_script(self.path)
            except BaseException as exc:  # the script's own exit or interrupt, too
                outcome["error"] = exc

        thread = threading.Thread(target=load, name=f"policy-load-{self.name}", daemon=True)
        thread.start()
        thread.join(load_timeout_s)
        if thread.is_alive():
            problem = import_overran(load_timeout_s)
        elif "error" in outcome:
            problem = describe_failure(outcome["error"], self.path)
        else:
            self._decide = outcome["value"]
            return
        self.load_error = load_failure(self.path, problem)

    def decide(self, signal: schemas.Signal, state: JobState) -> Plan:
        """The script's validated plan; raises :class:`PolicyError` on any problem."""
        if self._decide is None:
            raise PolicyError(self.load_error)
        if self._running is not None and self._running.is_alive():
            raise PolicyError(
                f"policy script {self.name}: an earlier call is still running "
                f"(past its {self.timeout_s} s limit); not called again"
            )
        outcome: _Outcome[object] = {}
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
            raise PolicyError(call_overran(self.path, self.timeout_s))
        if "error" in outcome:
            raise PolicyError(call_failure(self.path, outcome["error"]))
        return validate(outcome.get("value"), state, default_rule="script")


class NotAPolicyScript(Exception):
    """The file is not a policy script; the message says why."""


def load_script(path: Path) -> Decide:
    """Import the script at ``path`` (its top level runs) and return its ``decide``.

    Raises :class:`NotAPolicyScript`, or whatever the script's import raised."""
    if not path.is_file():
        raise NotAPolicyScript("no such file")
    module_name = f"goodput_policy_{abs(hash(str(path.resolve())))}"
    spec = importlib.util.spec_from_file_location(module_name, path)
    if spec is None or spec.loader is None:
        raise NotAPolicyScript("not loadable as a Python module")
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[module_name]
        raise
    decide = getattr(module, "decide", None)
    if not callable(decide):
        raise NotAPolicyScript("it defines no function decide(signal, state)")
    return decide


def _copy(value: S) -> S:
    return msgspec.msgpack.decode(msgspec.msgpack.encode(value), type=type(value))


def load_failure(script: Path, problem: str) -> str:
    """The one line that refuses a script: its path and what went wrong."""
    return f"policy script {script} failed to load: {problem}"


def import_overran(limit_s: float) -> str:
    return f"its import did not finish within {limit_s:g} s (a loop at import?)"


def call_overran(script: Path, limit_s: float) -> str:
    return f"policy script {script.stem} did not return within {limit_s:g} s"


def call_failure(script: Path, exc: BaseException) -> str:
    """The one line recorded when ``decide`` raised ``exc``."""
    return f"policy script {script.stem} raised {describe_failure(exc, script)}"


def describe_failure(exc: BaseException, script: Path) -> str:
    """One line: what was raised, where in the script, and its message."""
    if isinstance(exc, NotAPolicyScript):
        return str(exc)
    where = [f for f in traceback.extract_tb(exc.__traceback__) if Path(f.filename) == script]
    line = f" at line {where[-1].lineno}" if where else ""
    if isinstance(exc, SyntaxError):
        line = f" at line {exc.lineno}"
    if isinstance(exc, SystemExit):
        return f"it called sys.exit({exc.code!r}){line}"
    message = " ".join((exc.msg if isinstance(exc, SyntaxError) else str(exc)).split())
    return f"{type(exc).__name__}{line}: {message}" if message else f"{type(exc).__name__}{line}"
