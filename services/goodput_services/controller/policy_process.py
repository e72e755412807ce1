"""The user's policy script in a worker process: a crash, ``os._exit`` or a hang costs one decision.

Policies are operator code and the controller must outlive them. :class:`PolicyProcess` keeps
the contract of the engine's in-process ``ScriptPolicy`` (``PolicyScript``: ``name``,
``load_error``, ``decide`` raising ``PolicyError``), so the pure engine decides the same way
and falls back to the built-in policy with the reason in ``Decision.error``; what differs is
where the script runs. One persistent worker (``policy_worker``) imports the script at start
(the controller refuses a script that does not load within ``policy_load_timeout_s``, as
before) and answers each decide call over a pipe (``policy_wire``) within
``policy_timeout_s``. A worker that dies, overruns or answers garbage is killed — a process,
unlike a thread, can be — and a new one is started at once; it imports the script again (its
top level runs once per worker) while the controller goes on, and the next call waits for its
start and then its import (up to ``policy_load_timeout_s``). Calls are serialized (one
worker, one call at a time); the caller keeps them off its event loop.
"""

from __future__ import annotations

import logging
import os
import select
import subprocess
import sys
import threading
import time
from pathlib import Path

import msgspec

from goodput import schemas
from goodput.supervisor.control.script_policy import import_overran, load_failure
from goodput.supervisor.policy import JobState, Plan, PolicyError, validate
from goodput_services.controller import policy_wire
from goodput_services.controller.policy_wire import Answer, Call, Hello, Loaded

log = logging.getLogger(__name__)

#: a worker's error text is the script's to choose: kept to one line of this many characters
MAX_ERROR_CHARS = 500
#: the worker's own start (an interpreter and goodput's imports, before the script's): the
#: machine's load sets how long it takes, not the script, so it has its own generous limit
START_LIMIT_S = 30.0


class WorkerFailed(Exception):
    """The worker did not load the script; the message is the problem, in one line."""


class PolicyProcess:
    """A user's policy file run by a worker process, restarted whenever it fails."""

    def __init__(self, path: str | Path, *, timeout_s: float, load_timeout_s: float):
        self.path = Path(path)
        self.name = self.path.stem
        self.timeout_s = timeout_s
        self.load_timeout_s = load_timeout_s
        self.load_error = ""
        #: workers started again after one failed
        self.restarts = 0
        self._call_count = 0
        self._closed = False
        self._calling = threading.Lock()  # one call at a time
        self._swapping = threading.Lock()  # a worker replaced, or all stopped
        self._worker: Worker | None = None
        try:
            self._worker = Worker(self.path)
            self._worker.wait_loaded(load_timeout_s)
        except (WorkerFailed, OSError) as exc:
            self.close()
            self.load_error = load_failure(self.path, _one_line(str(exc)))

    def decide(self, signal: schemas.Signal, state: JobState) -> Plan:
        """The script's plan, validated here against ``state``; raises :class:`PolicyError`."""
        if self.load_error:
            raise PolicyError(self.load_error)
        with self._calling:
            self._call_count += 1
            answer = self._call(Call(call=self._call_count, signal=signal, state=state))
        if answer.error:
            raise PolicyError(_one_line(answer.error))
        plan = Plan(list(answer.commands), _one_line(answer.rule), _one_line(answer.reason))
        return validate(plan, state, default_rule="script")

    def close(self) -> None:
        """Stop the worker for good (the controller stops); a call in flight fails at once."""
        with self._swapping:
            self._closed = True
            worker = self._worker
        if worker is not None:
            worker.end()  # a call in flight sees the pipe close, fails and lets go
        with self._calling:  # the pipes are closed by their one user at a time
            if self._worker is not None:
                self._worker.kill()
                self._worker = None

    def _call(self, call: Call) -> Answer:
        """The worker's answer; a failed worker is replaced and the call raises PolicyError."""
        worker = self._worker
        try:
            if worker is None:
                if self._closed:
                    raise PolicyError(f"policy script {self.name}: the controller is stopping")
                worker = self._worker = Worker(self.path)
            if not worker.loaded:
                worker.wait_loaded(self.load_timeout_s)
            return worker.call(call, self.timeout_s)
        except WorkerFailed as exc:
            failure = f"policy script {self.name} failed to load in a new worker: {exc}"
        except OSError as exc:  # no process or pipe to be had
            failure = f"policy script {self.name}: its worker could not be used ({exc})"
        except _Overran:
            failure = f"policy script {self.name} did not return within {self.timeout_s:g} s"
        except _Ended as exc:
            failure = f"policy script {self.name} ended its worker process ({exc})"
        except _Garbage as exc:
            failure = f"policy script {self.name}'s worker answered garbage ({exc})"
        if not self._replace(worker):
            raise PolicyError(f"policy script {self.name}: the controller is stopping")
        log.warning("%s; a new worker is started", failure, extra={"policy": self.name})
        raise PolicyError(f"{failure}; a new worker is started")

    def _replace(self, failed: Worker | None) -> bool:
        """Kill ``failed`` and start another; False: closed, none is started."""
        if failed is not None:
            failed.kill()
        with self._swapping:
            self._worker = None
            if self._closed:
                return False
            self.restarts += 1
            try:
                self._worker = Worker(self.path)
            except OSError as exc:  # the next call tries again
                log.error("policy worker not started again: %s", exc)
            return True


class Worker:
    """One worker process and the controller's ends of its two pipes."""

    def __init__(self, path: Path):
        calls_in, self._calls = os.pipe()
        self._answers, answers_out = os.pipe()
        try:
            self.process = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "goodput_services.controller.policy_worker",
                    str(path),
                    str(calls_in),
                    str(answers_out),
                ],
                stdin=subprocess.DEVNULL,
                pass_fds=(calls_in, answers_out),
            )
        except OSError:
            os.close(self._calls)
            os.close(self._answers)
            raise
        finally:
            os.close(calls_in)
            os.close(answers_out)
        os.set_blocking(self._calls, False)
        self.loaded = False
        self._killed = False
        self._buffer = bytearray()

    def wait_loaded(self, limit_s: float) -> None:
        """Wait for the worker's start (:data:`START_LIMIT_S`), then for the script's import
        (``limit_s``). Raises :class:`WorkerFailed` with the problem."""
        try:
            hello = self._receive(time.monotonic() + START_LIMIT_S)
            if not isinstance(hello, Hello) or hello.version != policy_wire.VERSION:
                raise _Garbage(
                    f"{_shown(hello)} where protocol version {policy_wire.VERSION} was due"
                )
        except _Overran:
            raise WorkerFailed(f"its worker did not start within {START_LIMIT_S:g} s") from None
        except _Ended as exc:
            raise WorkerFailed(f"its worker ended before the import ({exc})") from None
        except _Garbage as exc:
            raise WorkerFailed(f"its worker answered garbage ({exc})") from None
        try:
            loaded = self._receive(time.monotonic() + limit_s)
            if not isinstance(loaded, Loaded):
                raise _Garbage(f"{_shown(loaded)} to the import")
        except _Overran:
            raise WorkerFailed(import_overran(limit_s)) from None
        except _Ended as exc:
            raise WorkerFailed(f"its import ended the worker process ({exc})") from None
        except _Garbage as exc:
            raise WorkerFailed(f"its worker answered garbage ({exc})") from None
        if loaded.error:
            raise WorkerFailed(_one_line(loaded.error))
        self.loaded = True

    def call(self, call: Call, limit_s: float) -> Answer:
        """The worker's answer to ``call`` within ``limit_s``; raises ``_Overran``, ``_Ended``
        or ``_Garbage``."""
        deadline = time.monotonic() + limit_s
        self._send(policy_wire.frame(call), deadline)
        answer = self._receive(deadline)
        if not isinstance(answer, Answer) or answer.call != call.call:
            raise _Garbage(f"{_shown(answer)} to call {call.call}")
        if self._buffer:
            raise _Garbage(f"{len(self._buffer)} bytes more than its answer")
        return answer

    def end(self) -> None:
        """SIGKILL the worker (safe from any thread: the pipes stay open)."""
        if self.process.poll() is None:
            self.process.kill()

    def kill(self) -> None:
        """SIGKILL and reap the worker; close the pipes (only by the thread using them)."""
        if self._killed:
            return
        self._killed = True
        self.end()
        try:
            self.process.wait(timeout=5)
        except subprocess.TimeoutExpired:  # stuck in the kernel: init reaps it once we exit
            log.error("policy worker %d did not end after SIGKILL", self.process.pid)
        for fd in (self._calls, self._answers):
            os.close(fd)

    # ---- the pipe --------------------------------------------------------------------------

    def _send(self, data: bytes, deadline: float) -> None:
        view = memoryview(data)
        while view:
            _wait(self._calls, select.POLLOUT, deadline)
            try:
                view = view[os.write(self._calls, view) :]
            except BlockingIOError:
                continue
            except BrokenPipeError:
                raise _Ended(self._exit_status()) from None

    def _receive(self, deadline: float) -> object:
        """The next message from the worker, whatever its kind."""
        header = policy_wire.HEADER_BYTES
        while True:
            if len(self._buffer) >= header:
                size = int.from_bytes(self._buffer[:header], "big")
                if size > policy_wire.MAX_ANSWER_BYTES:
                    raise _Garbage(f"a frame of {size} bytes")
                if len(self._buffer) >= header + size:
                    payload = bytes(self._buffer[header : header + size])
                    del self._buffer[: header + size]
                    try:
                        return policy_wire.decode_from_worker(payload)
                    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
                        raise _Garbage(_one_line(str(exc))) from None
            _wait(self._answers, select.POLLIN, deadline)
            chunk = os.read(self._answers, 1 << 16)
            if not chunk:
                raise _Ended(self._exit_status())
            self._buffer += chunk

    def _exit_status(self) -> str:
        try:
            code = self.process.wait(timeout=1)
        except subprocess.TimeoutExpired:
            return "it closed its pipe"
        return f"exit status {code}" if code >= 0 else f"killed by signal {-code}"


def _wait(fd: int, event: int, deadline: float) -> None:
    """Until ``fd`` is ready for ``event`` (or hung up: the read or write that follows says)."""
    poller = select.poll()
    poller.register(fd, event)
    while not poller.poll(max(0.0, (deadline - time.monotonic()) * 1000)):
        if time.monotonic() >= deadline:
            raise _Overran


class _Overran(Exception):
    """No answer by the deadline."""


class _Ended(Exception):
    """The worker's end of the pipe closed: it died; the message is its exit status."""


class _Garbage(Exception):
    """The worker sent something no worker of this protocol sends; the message says what."""


def _shown(message: object) -> str:
    return type(message).__name__


def _one_line(text: str) -> str:
    line = " ".join(text.split())
    return line if len(line) <= MAX_ERROR_CHARS else line[: MAX_ERROR_CHARS - 1] + "…"
