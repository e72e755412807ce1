"""A stop gathers first and acts once: every process of the stack in one ordered plan.

The plan is pure (records and the marker scan in, an order out); the session that started a
stack stops what it recorded, even when the file was damaged since.
"""

from __future__ import annotations

import sys
from pathlib import Path

from rich.console import Console

from goodput.bus.embedded import EmbeddedRecord, ServerRecord
from goodput.owned_process import ProcessIdentity, Stop, is_running, marked_processes
from goodput.state_dir import StateDir
from goodput.tools.cli.main import build_parser
from goodput.tools.stack.record import ServiceProcess, StackRecord
from goodput.tools.stack.session import StackSession
from goodput.tools.stack.stop import ACTUATOR_STOP_S, RANK_STOP_S, SERVICE_STOP_S, stop_plan
from tests.conftest import goodput_cli

PYTHON = sys.executable


def _identity(pid: int, *cmdline: str) -> ProcessIdentity:
    return ProcessIdentity(pid=pid, started=1.0, cmdline=cmdline)


def _service(name: str, pid: int) -> ServiceProcess:
    keeper = _identity(pid, PYTHON, "-m", "goodput.tools.stack.keeper", "--name", name, "--",
                       PYTHON, "-m", f"goodput_services.{name}")  # fmt: skip
    return ServiceProcess(name=name, node="", process=keeper, log=f"{name}.log")


def test_the_plan_stops_the_actuator_first_the_services_the_ranks_and_the_bus_last() -> None:
    stack = StackRecord(
        job="j",
        url="nats://127.0.0.1:1",
        embedded=True,
        nodes=[],
        services=[_service("sensor", 10), _service("actuator", 11)],
    )
    server = _identity(20, "/venv/bin/nats-server", "--jetstream")
    servers = EmbeddedRecord(
        servers=[ServerRecord(process=server, port=1, url="nats://127.0.0.1:1", store_dir="s")]
    )
    rank = _identity(30, PYTHON, "train.py")
    orphan_actuator = _identity(40, PYTHON, "-m", "goodput_services.actuator")
    orphan_service = _identity(41, PYTHON, "-m", "goodput_services.hostmon")
    orphan_server = _identity(42, "/venv/bin/nats-server")
    marked = [orphan_server, rank, orphan_service, orphan_actuator]

    plan = stop_plan(stack, servers, {30, 99}, marked)

    assert plan == [
        ("actuator", Stop(stack.services[1].process, ACTUATOR_STOP_S, group=True)),
        ("", Stop(orphan_actuator, ACTUATOR_STOP_S, group=True)),
        ("sensor", Stop(stack.services[0].process, SERVICE_STOP_S, group=True)),
        ("", Stop(orphan_service, SERVICE_STOP_S, group=True)),
        # a pid of a ranks file counts only if its process carries the marker: 99 does not
        ("", Stop(rank, RANK_STOP_S)),
        ("nats-server on nats://127.0.0.1:1", Stop(server, SERVICE_STOP_S)),
        ("", Stop(orphan_server, SERVICE_STOP_S, group=True)),
    ]


def test_without_records_the_plan_is_what_the_marker_finds() -> None:
    marked = [_identity(5, PYTHON, "-m", "goodput_services.sensor")]
    assert stop_plan(None, None, set(), marked) == [("", Stop(marked[0], SERVICE_STOP_S, True))]
    assert stop_plan(None, None, {5}, []) == []


def test_the_session_that_started_the_stack_stops_what_it_recorded(tmp_path: Path) -> None:
    """The record on disk is damaged after the start: the session stops from what it wrote,
    so nothing is unreadable and every process it started is stopped."""
    state = tmp_path / "stack"
    args = build_parser("up").parse_args(["up", "--state-dir", str(state), "--nodes", "0"])
    session = StackSession(state)
    try:
        stack, _ = session.start(args, "job-a", 0, Console(stderr=True))
        started = [s.process for s in stack.services]
        assert [s.name for s in stack.services] == ["sensor", "controller", "actuator"]
        path = StateDir(state).stack_record
        path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])

        report = session.stop()

        assert report.unreadable == [], report
        assert report.stopped >= len(started) + 1, report  # the keepers and the nats-server
        assert not [p for p in started if is_running(p)]
        assert marked_processes(state) == []
        assert not path.exists() and not StateDir(state).nats_record.exists()
    finally:  # whatever a failed assertion left running
        goodput_cli("down", "--state-dir", str(state), check=False)
