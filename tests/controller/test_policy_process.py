"""The policy worker process: the engine's contract kept, a failing worker replaced, nothing
read from the pipe on trust, no worker outliving the controller. Real worker processes."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from goodput.supervisor.control.engine import Controller, ControllerSettings
from goodput_services.controller.policy_process import PolicyProcess
from tests.processes import kill

from .helpers import at, job, signal
from .test_policy_scripts import BAD_SCRIPTS

LIMIT_S = 1.0


def _script(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "policy.py"
    path.write_text(textwrap.dedent(body))
    return path


def _process(path: Path, load_timeout_s: float = 30.0) -> PolicyProcess:
    return PolicyProcess(path, timeout_s=LIMIT_S, load_timeout_s=load_timeout_s)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie is gone for our purposes: reaped by its parent soon
    stat = Path(f"/proc/{pid}/stat")
    return stat.exists() and stat.read_text().split(") ")[-1][0] != "Z"


@pytest.mark.parametrize("case", sorted(BAD_SCRIPTS))
def test_a_bad_script_in_the_worker_is_reported_as_in_process(tmp_path: Path, case: str) -> None:
    body, expected = BAD_SCRIPTS[case]
    path = _script(tmp_path, body)
    policy = _process(path)
    try:
        if policy.load_error:  # the controller refuses these at start; the engine falls back
            assert policy.load_error.startswith(f"policy script {path} failed to load: ")
        controller = Controller(settings=ControllerSettings(), script=policy)
        outcome = controller.handle(job(spares=1), signal("crash", "n1"), at(1))
        assert expected in outcome.decision.error
        assert outcome.decision.policy == "builtin (fallback from policy)"
        assert outcome.decision.rule == "in-process-restart" and len(outcome.commands) == 1
        assert policy.restarts == 0  # a script that raises or errs leaves its worker alone
    finally:
        policy.close()


def test_sys_exit_in_decide_is_an_answer_not_a_dead_worker(tmp_path: Path) -> None:
    path = _script(tmp_path, "import sys\n\ndef decide(signal, state):\n    sys.exit(4)\n")
    policy = _process(path)
    try:
        controller = Controller(settings=ControllerSettings(), script=policy)
        outcome = controller.handle(job(), signal("crash", "n1"), at(1))
        assert "it called sys.exit(4) at line 4" in outcome.decision.error
        assert policy.restarts == 0
    finally:
        policy.close()


def test_a_script_cannot_change_the_callers_state(tmp_path: Path) -> None:
    path = _script(
        tmp_path,
        """
        def decide(signal, state):
            state.nodes.clear()
            state.num_dp_replicas = 99
            return []
        """,
    )
    policy = _process(path)
    try:
        state = job()
        outcome = Controller(script=policy).handle(state, signal("crash", "n0"), at(1))
        assert outcome.decision.error == "" and outcome.state.active == state.active
    finally:
        policy.close()


def test_garbage_in_the_pipe_costs_one_decision(tmp_path: Path) -> None:
    """The script writes into the worker's answer pipe itself: its fd is the worker's last
    argument. The controller reads garbage, decides with the built-in policy, starts a new
    worker, and the next decision is the script's."""
    path = _script(
        tmp_path,
        """
        import os
        import sys

        def decide(signal, state):
            if signal.node == "n1":
                os.write(int(sys.argv[-1]), b"\\x00\\x00\\x00\\x03abc")
            return []
        """,
    )
    policy = _process(path)
    try:
        controller = Controller(script=policy)
        garbled = controller.handle(job(), signal("crash", "n1"), at(1))
        assert "policy script policy's worker answered garbage" in garbled.decision.error
        assert garbled.decision.policy == "builtin (fallback from policy)"
        clean = controller.handle(garbled.state, signal("crash", "n2"), at(2))
        assert (clean.decision.policy, clean.decision.error) == ("policy", "")
        assert policy.restarts == 1
    finally:
        policy.close()


def test_os_exit_at_import_is_a_load_error_in_one_line(tmp_path: Path) -> None:
    path = _script(tmp_path, "import os\nos._exit(7)\n")
    policy = _process(path)
    assert policy.load_error == (
        f"policy script {path} failed to load: its import ended the worker process (exit status 7)"
    )


def test_a_new_worker_that_cannot_load_costs_one_decision_and_the_next_loads(
    tmp_path: Path,
) -> None:
    """The script on disk changed under the controller: broken, then mended."""
    good = "import os\n\ndef decide(signal, state):\n    if signal.node == 'n1':\n"
    good += "        os._exit(1)\n    return []\n"
    path = _script(tmp_path, good)
    policy = _process(path, load_timeout_s=5.0)
    try:
        controller = Controller(script=policy)
        state = job()
        died = controller.handle(state, signal("crash", "n1"), at(1))
        assert "ended its worker process (exit status 1)" in died.decision.error
        path.write_text("def decide(signal, state)\n")
        broken = controller.handle(state, signal("crash", "n2"), at(2))
        assert "failed to load in a new worker: SyntaxError at line 1" in broken.decision.error
        path.write_text(good)
        mended = controller.handle(state, signal("crash", "n3"), at(3))
        assert (mended.decision.policy, mended.decision.error) == ("policy", "")
        assert policy.restarts == 2
    finally:
        policy.close()


def test_close_ends_the_worker_even_in_a_call(tmp_path: Path) -> None:
    path = _script(tmp_path, "import time\n\ndef decide(signal, state):\n    time.sleep(600)\n")
    policy = PolicyProcess(path, timeout_s=600, load_timeout_s=30)
    worker = policy._worker
    assert worker is not None and _alive(worker.process.pid)
    errors: list[str] = []

    def call() -> None:
        try:
            policy.decide(signal("crash", "n1"), job())
        except Exception as exc:
            errors.append(str(exc))

    caller = threading.Thread(target=call)
    caller.start()
    time.sleep(0.5)
    started = time.monotonic()
    policy.close()
    caller.join(10)
    assert not caller.is_alive() and time.monotonic() - started < 5
    assert errors == ["policy script policy: the controller is stopping"]
    assert not _alive(worker.process.pid) and policy.restarts == 0


def test_a_worker_does_not_outlive_its_controller(tmp_path: Path) -> None:
    """The controller SIGKILLed while its worker is stuck in decide: the worker exits too."""
    path = _script(tmp_path, "import time\n\ndef decide(signal, state):\n    time.sleep(600)\n")
    parent = subprocess.Popen(
        [
            sys.executable,
            "-c",
            textwrap.dedent(
                f"""
                import threading, time
                from goodput_services.controller.policy_process import PolicyProcess
                from tests.controller.helpers import job, signal
                policy = PolicyProcess({str(path)!r}, timeout_s=600, load_timeout_s=30)
                print(policy._worker.process.pid, flush=True)
                threading.Thread(target=policy.decide, args=(signal("crash"), job())).start()
                time.sleep(600)
                """
            ),
        ],
        stdout=subprocess.PIPE,
        text=True,
        cwd=Path(__file__).parents[2],
    )
    try:
        assert parent.stdout is not None
        worker = int(parent.stdout.readline())
        time.sleep(0.5)  # the call is in the worker
        assert _alive(worker)
    finally:
        kill(parent)
    deadline = time.monotonic() + 10
    while _alive(worker) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _alive(worker)


def test_the_latency_measure_times_both_ways(tmp_path: Path) -> None:
    from goodput_services.controller.policy_latency import SCRIPT, measure

    script = _script(tmp_path, SCRIPT)
    result = measure(16, 5, script)
    assert result["nodes"] == 16 and result["state_kib"] > 0
    assert 0 < result["worker_p50_ms"] <= result["worker_p95_ms"]
    assert 0 < result["in_process_p50_ms"] <= result["in_process_p95_ms"]
    assert result["worker_start_ms"] > 0
