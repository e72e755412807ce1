"""The stack knows its own processes: a stale record is never signalled, a corrupt one is one
line and `down` still stops everything, two `up`s at once leave one stack, a killed
controller comes back. Real `goodput` commands, real nats-server, real service processes;
`sleep` processes stand in for the unrelated processes that took a dead stack's pids.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import msgspec
import psutil

from goodput.bus.embedded import EmbeddedRecord, RecordedBus, ServerRecord, read_record
from goodput.owned_process import (
    ProcessIdentity,
    check_recorded,
    is_running,
    marked_processes,
    spawned,
    standing,
    terminate,
)
from goodput.state_dir import StateDir
from goodput.tools.stack.keeper import KEEPER_MODULE, keeper_command, kept_service
from goodput.tools.stack.record import ServiceProcess, StackRecord, read_stack, write_stack
from tests.conftest import goodput_cli, refused_in_one_line
from tests.processes import kill
from tests.stack.conftest import stack_status

JOB = "job-a"


def nats_servers_of(state_dir: Path) -> list[int]:
    """Live nats-servers whose store is under ``state_dir`` (found without the stack's marker)."""
    found = []
    for process in psutil.process_iter(["name", "cmdline"]):
        cmdline = process.info["cmdline"] or []
        if process.info["name"] == "nats-server" and any(str(state_dir) in a for a in cmdline):
            found.append(process.pid)
    return found


def reused(process: subprocess.Popen, cmdline: list[str]) -> ProcessIdentity:
    """A record of a process that held ``process``'s pid before it: same pid, started earlier."""
    return ProcessIdentity(
        pid=process.pid, started=spawned(process).started - 3600, cmdline=tuple(cmdline)
    )


def test_a_pid_held_by_another_process_is_never_signalled() -> None:
    sleeper = subprocess.Popen(["sleep", "300"])
    try:
        real = spawned(sleeper)
        assert standing(real) == "running"  # even while its exec is finishing
        while not psutil.Process(sleeper.pid).cmdline():  # its command line decides from now
            time.sleep(0.01)
        earlier = ProcessIdentity(pid=real.pid, started=real.started - 3600, cmdline=real.cmdline)
        other = ProcessIdentity(pid=real.pid, started=real.started, cmdline=("nats-server",))
        for stale in (earlier, other):
            assert standing(stale) == "replaced"
            assert terminate(stale, timeout_s=1) == "replaced"
        assert sleeper.poll() is None, "a stale identity must not be signalled"
        assert terminate(real, timeout_s=5) == "running"
        assert standing(real) == "gone"  # stopped (and reaped: it was this process's child)
    finally:
        kill(sleeper)


def test_the_records_processes_are_checked_in_one_call_each_stale_one_in_one_line() -> None:
    """What a stack session does before it starts anything: the embedded server and the
    services, checked together; the bus counts as running only by its own servers' check."""
    sleeper = subprocess.Popen(["sleep", "300"])
    gone = subprocess.Popen(["true"])
    gone.wait()
    try:
        server = ServerRecord(
            process=spawned(sleeper), port=1, url="nats://127.0.0.1:1", store_dir="s"
        )
        servers = EmbeddedRecord(servers=[server])
        took_pid = reused(sleeper, ["sensor"])
        ended = ProcessIdentity(pid=gone.pid, started=0.0, cmdline=("actuator",))
        checked = check_recorded({**servers.processes, "sensor": took_pid, "actuator": ended})
        assert checked.running == {"nats-server on nats://127.0.0.1:1"}
        assert list(checked.stale.values()) == [
            f"sensor: pid {sleeper.pid} (sensor) is held by another process now",
            f"actuator: pid {gone.pid} (actuator) is gone",
        ]
        assert RecordedBus(servers, checked).running
        assert RecordedBus(servers, checked).stale == []  # a running bus has no stale server
        assert not RecordedBus(servers, check_recorded({"sensor": spawned(sleeper)})).running
        assert not RecordedBus(None, checked).running
        lost = EmbeddedRecord(servers=[msgspec.structs.replace(server, process=ended)])
        assert RecordedBus(lost, check_recorded(lost.processes)).stale == [
            f"nats-server on nats://127.0.0.1:1: pid {gone.pid} (actuator) is gone"
        ]
        assert sleeper.poll() is None, "checking is never signalling"
    finally:
        kill(sleeper)


def test_a_stale_record_is_never_signalled_and_up_starts_the_stack_again(tmp_path: Path) -> None:
    state = tmp_path / "stack"
    state.mkdir()
    sleepers = [subprocess.Popen(["sleep", "300"]) for _ in range(3)]
    gone = subprocess.Popen(["true"])
    gone.wait()
    command = [sys.executable, "-m", "goodput_services.sensor", "--state-dir", str(state)]
    services = [
        ServiceProcess(
            name=name,
            node="",
            process=reused(sleeper, keeper_command(name, command)),
            log=str(StateDir(state).service_log(name)),
        )
        for name, sleeper in (("sensor", sleepers[0]), ("controller", sleepers[1]))
    ]
    services.append(
        ServiceProcess(
            name="actuator",
            node="",
            process=ProcessIdentity(pid=gone.pid, started=0.0, cmdline=tuple(command)),
            log=str(StateDir(state).service_log("actuator")),
        )
    )
    url = "nats://127.0.0.1:1"
    write_stack(
        state, StackRecord(job=JOB, url=url, embedded=True, nodes=["node-0"], services=services)
    )
    server = ServerRecord(
        process=reused(sleepers[2], ["nats-server"]), port=1, url=url, store_dir=str(state)
    )
    StateDir(state).nats_record.write_bytes(msgspec.json.encode(EmbeddedRecord(servers=[server])))
    try:
        up = goodput_cli("up", "--state-dir", str(state), "--job", JOB, "--wait", "60")
        assert "stale record, not signalled" in up.stderr, up.stderr
        assert "sensor: pid" in up.stderr and "is held by another process now" in up.stderr
        assert all(s.poll() is None for s in sleepers), "a process that took a pid was signalled"
        record = read_stack(state)
        assert record is not None and len(record.services) == 5
        assert all(is_running(s.process) for s in record.services)
        assert not {s.pid for s in record.services} & {s.pid for s in sleepers}
        status = stack_status(state)
        assert all(s["healthy"] for s in status["services"]), status
        assert goodput_cli("down", "--state-dir", str(state)).returncode == 0
        assert all(s.poll() is None for s in sleepers)
        assert marked_processes(state) == [] and nats_servers_of(state) == []
    finally:
        goodput_cli("down", "--state-dir", str(state), check=False)
        kill(*sleepers)


def test_down_never_signals_a_process_that_took_a_recorded_pid(tmp_path: Path) -> None:
    state = tmp_path / "stack"
    state.mkdir()
    sleepers = [subprocess.Popen(["sleep", "300"]) for _ in range(2)]
    try:
        command = [sys.executable, "-m", "goodput_services.sensor"]
        sensor = ServiceProcess(
            name="sensor",
            node="",
            process=reused(sleepers[0], keeper_command("sensor", command)),
            log=str(state / "sensor.log"),
        )
        url = "nats://127.0.0.1:1"
        write_stack(
            state, StackRecord(job=JOB, url=url, embedded=True, nodes=[], services=[sensor])
        )
        server = ServerRecord(
            process=reused(sleepers[1], ["nats-server"]), port=1, url=url, store_dir=str(state)
        )
        StateDir(state).nats_record.write_bytes(
            msgspec.json.encode(EmbeddedRecord(servers=[server]))
        )
        down = goodput_cli("down", "--state-dir", str(state))
        assert all(s.poll() is None for s in sleepers), "down signalled a process it did not start"
        assert "stale record, not signalled: sensor: pid" in down.stderr, down.stderr
        assert "nats-server on nats://127.0.0.1:1" in down.stderr
        assert "stopped 0 process(es)" in down.stderr
    finally:
        kill(*sleepers)


def test_a_corrupt_record_is_one_line_and_down_still_stops_everything(stack: Path) -> None:
    record = read_stack(stack)
    servers = read_record(StateDir(stack))
    assert record is not None and servers is not None
    keepers = [s.process for s in record.services]
    owned = [*keepers, *(kept_service(k) for k in keepers), servers.servers[0].process]
    assert all(p is not None and is_running(p) for p in owned)
    path = StateDir(stack).stack_record
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])

    up = goodput_cli("up", "--state-dir", str(stack), "--job", JOB, check=False)
    refused_in_one_line(up, "stack.json is unreadable", "goodput down")

    down = goodput_cli("down", "--state-dir", str(stack))
    assert "Traceback" not in down.stderr, down.stderr
    assert not [p for p in owned if p is not None and is_running(p)], down.stderr
    assert marked_processes(stack) == [] and nats_servers_of(stack) == []


def test_two_concurrent_ups_leave_one_stack_and_no_orphan(tmp_path: Path) -> None:
    state = tmp_path / "stack"
    up = [sys.executable, "-m", "goodput.tools.cli.main", "up", "--state-dir", str(state)]
    up += ["--job", JOB, "--wait", "60"]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    ups = [subprocess.Popen(up, stderr=subprocess.PIPE, text=True, env=env) for _ in range(2)]
    try:
        errors = [process.communicate(timeout=240)[1] for process in ups]
        assert [p.returncode for p in ups] == [0, 0], errors
        assert len(nats_servers_of(state)) == 1, errors
        assert any("is in use by goodput up (pid" in error for error in errors), errors
        keepers = [p for p in marked_processes(state) if KEEPER_MODULE in p.cmdline]
        assert len(keepers) == 5, errors
        record = read_stack(state)
        assert record is not None
        assert {s.process for s in record.services} == set(keepers)
    finally:
        kill(*ups)
        goodput_cli("down", "--state-dir", str(state), check=False)
    assert nats_servers_of(state) == [] and marked_processes(state) == []


def test_a_killed_controller_is_started_again_by_its_keeper(stack: Path) -> None:
    record = read_stack(stack)
    assert record is not None
    controller = next(s for s in record.services if s.name == "controller")
    before = kept_service(controller.process)
    assert before is not None
    os.kill(before.pid, signal.SIGKILL)
    deadline = time.monotonic() + 60
    while True:
        entry = next(s for s in stack_status(stack)["services"] if s["name"] == "controller")
        if (entry["healthy"] and entry["pid"] != before.pid) or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert entry["healthy"] and entry["pid"] != before.pid, entry
    after = kept_service(controller.process)
    assert after is not None and after.pid == entry["pid"]
    log = Path(controller.log).read_text()
    assert "keeper: controller exited (killed by SIGKILL)" in log
