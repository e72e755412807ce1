"""Loading and running a user's policy script, time-limited; the API is :mod:`goodput.policy`.

The script runs in a thread of the controller with a time limit. Python cannot kill a
thread, so a script that never returns keeps its thread (a daemon) busy for good; until it
returns, further calls fail fast (and the built-in policy decides) rather than pile up more
threads. A script that fails to load, raises, overruns, or returns anything that does not pass
:func:`goodput.policy.validate` is reported in ``Decision.error`` and the built-in policy
decides instead.
"""

from __future__ import annotations

import importlib.util
import sys
import threading
import traceback
from pathlib import Path
from typing import TypeVar

import msgspec

from goodput import schemas
from goodput.policy import JobState, Plan, PolicyError, validate
from goodput.policy.plan import Decide

S = TypeVar("S", bound=msgspec.Struct)


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
