"""The policy worker: a child of the controller that imports the user's script and answers calls.

``python -m goodput_services.controller.policy_worker SCRIPT CALLS_FD ANSWERS_FD``, started by
``policy_process``. Whatever the script does in here — raise, ``sys.exit``, ``os._exit``,
loop for ever, corrupt the interpreter — costs the controller one decision, never itself.
What the script raises (any ``BaseException``) is described in one line and answered;
nothing is printed by the worker itself, so the controller's own last line stays its own.
The worker ignores SIGINT (a Ctrl-C to the stack's process group is the controller's to
handle; the controller stops it) and exits once the controller is gone: its pipe closes, and
a script that never returns is caught by a watcher thread noticing the new parent.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from pathlib import Path

import msgspec

from goodput.supervisor.control.script_policy import call_failure, describe_failure, load_script
from goodput.supervisor.policy import Plan, PolicyError, validate
from goodput.supervisor.policy.plan import Decide
from goodput_services.controller.policy_wire import (
    VERSION,
    Answer,
    Call,
    Hello,
    Loaded,
    read_call,
    write_frame,
)

#: how often the watcher looks whether the controller is still this process's parent
PARENT_CHECK_S = 1.0


def main(argv: list[str]) -> int:
    script, calls, answers = Path(argv[0]), int(argv[1]), int(argv[2])
    for fd in (calls, answers):  # a process the script starts must not hold the pipe open
        os.set_inheritable(fd, False)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _exit_when_orphaned(os.getppid())
    write_frame(answers, Hello(version=VERSION))
    try:
        decide = load_script(script)
    except BaseException as exc:  # the script's own exit or interrupt, too
        write_frame(answers, Loaded(error=describe_failure(exc, script)))
        return 0
    write_frame(answers, Loaded())
    while (call := read_call(calls)) is not None:
        answer = _answer(decide, script, call)
        try:
            write_frame(answers, answer)
        except (msgspec.EncodeError, TypeError, OverflowError) as exc:
            problem = f"policy script {script.stem}'s plan could not be sent: {exc}"
            write_frame(answers, Answer(call=call.call, error=problem))
    return 0


def _answer(decide: Decide, script: Path, call: Call) -> Answer:
    try:
        value = decide(call.signal, call.state)
    except BaseException as exc:
        return Answer(call=call.call, error=call_failure(script, exc))
    try:
        plan: Plan = validate(value, call.state, default_rule="script")
    except PolicyError as exc:
        return Answer(call=call.call, error=str(exc))
    except Exception as exc:  # a returned object that breaks the checks themselves
        return Answer(call=call.call, error=f"the plan could not be checked: {exc!r}")
    return Answer(call=call.call, commands=plan.commands, rule=plan.rule, reason=plan.reason)


def _exit_when_orphaned(parent: int) -> None:
    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(PARENT_CHECK_S)
        os._exit(0)

    threading.Thread(target=watch, name="policy-worker-parent", daemon=True).start()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
