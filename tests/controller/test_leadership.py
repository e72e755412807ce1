"""One leader, always: controllers that share a host name and an ``--instance`` label.

Two real controller processes on this host (one host name) given the same ``--instance``, as
a template repeating one label would, against one real nats-server: exactly one leads, the
lease names it, and when it is killed the other takes over. Before each process had its own
identity (``goodput.instance_id``), both held the lease and both logged "leading".
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import msgspec
import pytest

from goodput import subjects
from goodput.bus import Bus, BusSettings, EmbeddedNats
from goodput.instance_id import instance_id
from tests.processes import kill, stop

pytestmark = pytest.mark.slow
JOB = "job-lead"
TTL_S = 2.0


def test_an_identity_is_unique_even_for_equal_hosts_pids_and_labels(monkeypatch) -> None:
    monkeypatch.setattr(socket, "gethostname", lambda: "pod")
    monkeypatch.setattr(os, "getpid", lambda: 1)
    first, second = instance_id(), instance_id()
    assert first.startswith("pod-1-") and second.startswith("pod-1-") and first != second
    labelled = instance_id("controller-0")
    assert labelled.startswith("controller-0-1-") and labelled != instance_id("controller-0")


class _Controller:
    """A real controller process labelled ``controller`` with its own log file."""

    def __init__(self, server: EmbeddedNats, state: Path, index: int):
        self.log = state / f"controller-{index}.log"
        self.process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "goodput_services.controller",
                "--job",
                JOB,
                "--nats-url",
                server.url,
                "--state-dir",
                str(state),
                "--instance",
                "controller",
                "--set",
                f"lease_ttl_s={TTL_S}",
            ],
            stdout=subprocess.DEVNULL,
            stderr=self.log.open("ab"),
        )

    def logged(self, message: str) -> list[dict]:
        lines = self.log.read_text().splitlines() if self.log.exists() else []
        records = [json.loads(line) for line in lines if line.startswith("{")]
        return [r for r in records if r.get("msg") == message]

    @property
    def leading(self) -> bool:
        return len(self.logged("leading")) > len(self.logged("no longer leading"))


async def _holder(bus: Bus) -> str:
    kv = await bus.kv(subjects.LEASES_BUCKET)
    entry = await kv.get(subjects.kv_key(JOB, "controller"))
    return msgspec.msgpack.decode(entry.value or b"")["holder"]


async def _until(condition, what: str, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.2)


async def test_two_controllers_with_one_host_and_label_have_one_leader(
    tmp_path: Path, nats_server: EmbeddedNats
) -> None:
    controllers = [_Controller(nats_server, tmp_path, index) for index in (0, 1)]
    bus = await Bus.connect(BusSettings(url=nats_server.url), name="test")
    try:
        await _until(lambda: any(c.leading for c in controllers), "a leader")
        # several lease periods after both are up: still exactly one leader, named by the lease
        await _until(lambda: all(c.logged("service started") for c in controllers), "both up")
        await asyncio.sleep(4 * TTL_S)
        # (a loop stalled past the TTL on a loaded machine may hand the lease over: still one)
        leaders = [c for c in controllers if c.leading]
        assert len(leaders) == 1, [c.logged("leading") for c in controllers]
        (leader,) = leaders
        (standby,) = [c for c in controllers if c is not leader]
        holder = await _holder(bus)
        assert holder == leader.logged("leading")[-1]["instance"]
        assert holder.startswith(f"controller-{leader.process.pid}-")

        kill(leader.process)
        await _until(lambda: standby.leading, "the standby to take over", timeout_s=30)
        assert await _holder(bus) == standby.logged("leading")[-1]["instance"] != holder
    finally:
        await bus.close()
        stop(*(controller.process for controller in controllers), timeout_s=90)
