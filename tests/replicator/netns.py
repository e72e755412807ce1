"""Hosts for one test: network namespaces joined by a veth pair, as two pods on a pod network.

Each namespace has its loopback and one interface with an address of a private range that
exists only inside these namespaces: no traffic leaves them, and the root namespace gets no
address or route. Needs root and iproute2; ``two_hosts`` skips, saying why, without them.
Every process started in a namespace is stopped, and the namespaces (their veth ends with
them) deleted, when the block ends, failed or not.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.processes import stop

#: the pair's subnet: inside the test's own namespaces only
SUBNET_PREFIX = "10.250.37."
PREFIX_LENGTH = 24


@dataclass
class Host:
    """One namespace: its name, its address on the pair, the processes started in it."""

    netns: str
    address: str
    processes: list[subprocess.Popen] = field(default_factory=list)

    def start(self, argv: list[str], log: Path, env: dict[str, str]) -> subprocess.Popen:
        """``argv`` inside this namespace (``ip netns exec`` execs it: the pid is its own)."""
        with open(log, "ab") as out:
            process = subprocess.Popen(
                ["ip", "netns", "exec", self.netns, *argv],
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
            )
        self.processes.append(process)
        return process

    def run(self, argv: list[str], env: dict[str, str], timeout_s: float):
        return subprocess.run(
            ["ip", "netns", "exec", self.netns, *argv],
            capture_output=True,
            text=True,
            env=env,
            timeout=timeout_s,
        )

    def stop_all(self) -> None:
        """Stop what was started here, the last started first."""
        for process in reversed(self.processes):
            stop(process, timeout_s=15)


def ip(*args: str) -> subprocess.CompletedProcess:
    """``ip *args`` (iproute2), its output captured; what it did is for the caller to judge."""
    return subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)


def must_ip(*args: str) -> None:
    """``ip *args``, raising with iproute2's words if it fails."""
    done = ip(*args)
    if done.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {done.stderr.strip()}")


def add_netns(name: str) -> None:
    """Create network namespace ``name``; skip the test, saying why, where that is refused."""
    made = ip("netns", "add", name)
    if made.returncode != 0:
        pytest.skip(f"network namespaces unavailable: {made.stderr.strip()}")


@contextlib.contextmanager
def two_hosts() -> Iterator[tuple[Host, Host]]:
    if os.geteuid() != 0:
        pytest.skip("network namespaces need root")
    if shutil.which("ip") is None:
        pytest.skip("network namespaces need iproute2's `ip`")
    tag = uuid.uuid4().hex[:8]
    hosts = (Host(f"gp-{tag}-a", SUBNET_PREFIX + "1"), Host(f"gp-{tag}-b", SUBNET_PREFIX + "2"))
    created: list[str] = []
    try:
        for host in hosts:
            add_netns(host.netns)
            created.append(host.netns)
        ends = [f"gp{tag}a", f"gp{tag}b"]  # interface names: 15 characters at most
        veth = ip(
            *("link", "add", ends[0], "netns", hosts[0].netns, "type", "veth"),
            *("peer", "name", ends[1], "netns", hosts[1].netns),
        )
        if veth.returncode != 0:
            pytest.skip(f"veth pairs unavailable: {veth.stderr.strip()}")
        for host, end in zip(hosts, ends, strict=True):
            must_ip("-n", host.netns, "link", "set", "lo", "up")
            must_ip("-n", host.netns, "addr", "add", f"{host.address}/{PREFIX_LENGTH}", "dev", end)
            must_ip("-n", host.netns, "link", "set", end, "up")
        yield hosts
    finally:
        for host in reversed(hosts):  # the bus, started first in the first host, last
            host.stop_all()
        for name in created:  # the veth ends go with their namespaces
            ip("netns", "del", name)
