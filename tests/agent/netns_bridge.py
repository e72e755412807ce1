"""Hosts on one network for a test: network namespaces on a bridge, as machines on a switch.

The bridge lives in a namespace of its own (the hub): the root namespace's bridge filtering
(``br_netfilter``, a Docker host's FORWARD policy) never sees the hosts' traffic. Each host
namespace has its loopback and one end of a veth pair whose other end is a port of the bridge;
the root namespace has one more such pair, so the test and the services it starts there reach
every host. The addresses are of a private /24 that exists only on these links (no route
leaves them). Needs root and iproute2; ``bridged_hosts`` skips, saying why, without them.
Every process started in a host namespace is stopped, and the namespaces and the root's link
deleted, when the block ends, failed or not.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from tests.replicator.netns import Host, add_netns, ip, must_ip

#: the hosts' subnet (tests/replicator/netns.py's pair uses 10.250.37.0/24)
SUBNET_PREFIX = "10.250.41."
PREFIX_LENGTH = 24
#: the root namespace's address on the bridge
ROOT_ADDRESS = SUBNET_PREFIX + "254"


@dataclass
class Network:
    hosts: dict[str, Host]
    #: each host's own end of its pair: its interface on the network
    interfaces: dict[str, str]
    #: the hub end of each host's pair (set down: the host is cut off)
    ports: dict[str, str]
    hub: str

    def cut(self, name: str, down: bool = True) -> None:
        """Cut host ``name`` off the network (its link down), or connect it again."""
        must_ip("-n", self.hub, "link", "set", self.ports[name], "down" if down else "up")

    def pids(self, name: str) -> list[int]:
        """Every process in host ``name``'s namespace (what runs on that machine)."""
        done = ip("netns", "pids", self.hosts[name].netns)
        return [int(p) for p in done.stdout.split()]


@contextlib.contextmanager
def bridged_hosts(names: list[str]) -> Iterator[Network]:
    if os.geteuid() != 0:
        pytest.skip("network namespaces need root")
    if shutil.which("ip") is None:
        pytest.skip("network namespaces need iproute2's `ip`")
    tag = uuid.uuid4().hex[:6]
    hub = f"gp-{tag}-hub"
    hosts = {
        name: Host(f"gp-{tag}-{i}", SUBNET_PREFIX + str(i + 1)) for i, name in enumerate(names)
    }
    ports = {name: f"gp{tag}h{i}" for i, name in enumerate(names)}  # 15 characters at most
    interfaces = {name: f"gp{tag}e{i}" for i, name in enumerate(names)}
    root_end, root_port = f"gp{tag}r", f"gp{tag}hr"
    created: list[str] = []
    try:
        for netns in (hub, *(h.netns for h in hosts.values())):
            add_netns(netns)
            created.append(netns)
        bridge = ip("-n", hub, "link", "add", "br0", "type", "bridge")
        if bridge.returncode != 0:
            pytest.skip(f"bridges unavailable: {bridge.stderr.strip()}")
        must_ip("-n", hub, "link", "set", "br0", "up")
        for name, host in hosts.items():
            end = interfaces[name]
            veth = ip(
                *("link", "add", end, "netns", host.netns, "type", "veth"),
                *("peer", "name", ports[name], "netns", hub),
            )
            if veth.returncode != 0:
                pytest.skip(f"veth pairs unavailable: {veth.stderr.strip()}")
            must_ip("-n", hub, "link", "set", ports[name], "master", "br0", "up")
            must_ip("-n", host.netns, "link", "set", "lo", "up")
            must_ip("-n", host.netns, "addr", "add", f"{host.address}/{PREFIX_LENGTH}", "dev", end)
            must_ip("-n", host.netns, "link", "set", end, "up")
        must_ip("link", "add", root_end, "type", "veth", "peer", "name", root_port, "netns", hub)
        must_ip("-n", hub, "link", "set", root_port, "master", "br0", "up")
        must_ip("addr", "add", f"{ROOT_ADDRESS}/{PREFIX_LENGTH}", "dev", root_end)
        must_ip("link", "set", root_end, "up")
        yield Network(hosts=hosts, interfaces=interfaces, ports=ports, hub=hub)
    finally:
        for host in hosts.values():
            host.stop_all()
            for pid in (int(p) for p in ip("netns", "pids", host.netns).stdout.split()):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, 9)  # a rank or daemon its agent left: nothing outlives the test
        ip("link", "del", root_end)  # its hub end goes with it
        for name in created:  # the host pairs go with their namespaces
            ip("netns", "del", name)
