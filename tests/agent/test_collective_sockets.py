"""The collectives' interface a node agent names for its ranks: which interface holds the
announced address, which variables the user's own setting leaves to the agent, what a rank
started by a real agent gets, and the agent refusing a loopback address with a remote bus."""

from __future__ import annotations

import contextlib
import json
import sys
from pathlib import Path

from goodput import schemas, subjects
from goodput.bus import Bus, BusSettings
from goodput.bus.embedded import EmbeddedNats
from goodput.launch.collective_sockets import (
    VARIABLES,
    host_interfaces,
    interface_holding,
    socket_env,
)
from goodput.supervisor.agent.host import host_address
from goodput.supervisor.agent.node import NodeAgent
from tests.agent.test_node_agent import JOB, _running, _until
from tests.conftest import goodput_cli

INTERFACES = {
    "lo": ["127.0.0.1", "::1"],
    "eth0": ["10.0.0.7", "fe80::1"],
    "ib0": ["192.168.5.3", "2001:db8::5"],
}


def test_the_interface_holding_the_address_is_found_in_either_family() -> None:
    assert interface_holding("10.0.0.7", INTERFACES) == "eth0"
    assert interface_holding("192.168.5.3", INTERFACES) == "ib0"
    # IPv6 compared as addresses, not as text
    assert interface_holding("2001:0db8:0000:0000:0000:0000:0000:0005", INTERFACES) == "ib0"
    assert interface_holding("127.0.0.1", INTERFACES) == "lo"


def test_no_interface_for_an_address_no_interface_holds_or_a_name() -> None:
    assert interface_holding("10.0.0.8", INTERFACES) is None
    assert interface_holding("node-3.cluster", INTERFACES) is None
    assert interface_holding("", INTERFACES) is None
    assert interface_holding("10.0.0.7", {"eth0": ["not an address"]}) is None


def test_the_users_setting_wins_and_an_empty_one_counts_as_unset() -> None:
    assert socket_env("eth0", {}) == dict.fromkeys(VARIABLES, "eth0")
    assert socket_env("eth0", {"NCCL_SOCKET_IFNAME": "=ib0"}) == {"GLOO_SOCKET_IFNAME": "eth0"}
    assert socket_env("eth0", {"GLOO_SOCKET_IFNAME": " ", "NCCL_SOCKET_IFNAME": "ib"}) == {
        "GLOO_SOCKET_IFNAME": "eth0"
    }
    assert socket_env("eth0", dict.fromkeys(VARIABLES, "bond0")) == {}
    # none found: torch's own choice stays
    assert socket_env(None, {}) == {}


def test_this_hosts_interfaces_hold_loopback_and_the_address_toward_the_world() -> None:
    interfaces = host_interfaces()
    assert interface_holding("127.0.0.1", interfaces) is not None
    address = host_address()
    if address != "127.0.0.1":  # a host with a route: its address is on one of them
        assert interface_holding(address, interfaces) is not None


def test_ipv6_addresses_are_read_from_proc_net_if_inet6(tmp_path: Path) -> None:
    table = tmp_path / "if_inet6"
    table.write_text(
        "20010db8000000000000000000000005 03 40 00 80     ib0\n"
        "00000000000000000000000000000001 01 80 10 80       lo\n"
        "malformed line\n"
    )
    interfaces = host_interfaces(table)
    assert "2001:db8::5" in interfaces["ib0"] and "::1" in interfaces["lo"]


async def test_a_rank_gets_the_agents_interface_under_its_own_environment(
    bus: Bus, nats_server: EmbeddedNats, tmp_path: Path
) -> None:
    """The job's own setting (the launch's environment) wins over the agent's interface."""
    agent = NodeAgent(
        job=JOB,
        node="n0",
        address="127.0.0.1",
        gpus=[],
        bus_settings=BusSettings(url=nats_server.url),
        state_dir=tmp_path / "n0",
        host_env=socket_env("lo", {}),
    )
    seen = tmp_path / "env.json"
    dump = f"import json, os; json.dump(dict(os.environ), open({str(seen)!r}, 'w'))"
    async with _running(agent, bus):
        launch = schemas.LaunchRanks(
            job=JOB,
            node="n0",
            run_id="run-1",
            attempt=1,
            argv=[sys.executable, "-c", dump],
            ranks=[schemas.RankLaunch(rank=0, local_rank=0, env={"NCCL_SOCKET_IFNAME": "ib0"})],
        )
        await bus.send_command(subjects.node_target(subjects.AGENT, "n0"), launch)
        await _until(lambda: _read_json(seen), lambda env: "NCCL_SOCKET_IFNAME" in env)
    env = json.loads(seen.read_text())
    assert (env["GLOO_SOCKET_IFNAME"], env["NCCL_SOCKET_IFNAME"]) == ("lo", "ib0")


async def _read_json(path: Path) -> dict | None:
    with contextlib.suppress(OSError, ValueError):
        return json.loads(path.read_text())
    return None


def test_an_agent_refuses_a_loopback_address_while_the_bus_is_on_another_host(
    tmp_path: Path,
) -> None:
    refused = goodput_cli(
        *("agent", "--node", "n0", "--state-dir", str(tmp_path), "--address", "127.0.0.1"),
        *("--nats-url", "nats://10.255.0.1:4222", "--nats-user", "u", "--nats-password", "p"),
        check=False,
        timeout=60,
    )
    assert refused.returncode == 2, refused.stderr
    assert refused.stderr.strip().count("\n") == 0
    assert "loopback address 127.0.0.1" in refused.stderr and "10.255.0.1" in refused.stderr
